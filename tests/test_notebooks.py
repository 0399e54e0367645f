"""The notebooks run: their code cells are executed in order, as Jupyter would."""

import importlib.metadata
import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import matplotlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
QUICKSTART = ROOT / "notebooks" / "fcclplus_quickstart.ipynb"
REPO_URL = "https://example.invalid/fedjax_het.git"  # never reached: the fake `run` below clones


def _code_cells(path, *, skip_tag=None):
  cells = json.loads(path.read_text())["cells"]
  return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
          and skip_tag not in c.get("metadata", {}).get("tags", [])]


def _run(path, monkeypatch, skip_tag=None):
  matplotlib.use("Agg")  # plt.show() is a no-op
  monkeypatch.chdir(path.parent)
  namespace = {"__name__": "__main__"}
  for index, source in enumerate(_code_cells(path, skip_tag=skip_tag)):
    try:
      exec(compile(source, f"{path.name}[cell {index}]", "exec"), namespace)  # pylint: disable=exec-used
    except Exception as error:  # pragma: no cover - the message is the point
      raise AssertionError(f"{path.name}: code cell {index} failed:\n{source}") from error
  return namespace


def test_there_is_a_notebook_and_it_is_valid_nbformat_4():
  assert NOTEBOOKS, "notebooks/ holds no .ipynb"
  for path in NOTEBOOKS:
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    assert any(c["cell_type"] == "code" for c in notebook["cells"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_cells_outside_training_run(path, monkeypatch):
  namespace = _run(path, monkeypatch, skip_tag="training")
  if "fccm" in namespace:  # the quick-start's loss section computed real numbers
    assert namespace["fccm"].shape == (4,)
    assert bool((namespace["fisl"] >= 0).all())


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_end_to_end(path, monkeypatch, tmp_path):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path / "cache"))
  namespace = _run(path, monkeypatch)
  if "workdir" in namespace:
    assert (namespace["workdir"] / "results.md").exists()
    assert (namespace["workdir"] / "accuracy.png").exists()


# --- The quick-start's set-up cell (Colab GPU/TPU and local), exercised without network. ---


def _setup_cell_source(path=QUICKSTART):
  cells = [c for c in json.loads(path.read_text())["cells"]
           if "setup" in c.get("metadata", {}).get("tags", [])]
  assert len(cells) == 1 and cells[0]["cell_type"] == "code", "one code cell tagged `setup`"
  return "".join(cells[0]["source"])


def _exec_setup_cell(name="notebook_setup_cell"):
  """Runs the cell's source; under "__main__" (as in Jupyter) it also calls setup()."""
  namespace = {"__name__": name}
  exec(compile(_setup_cell_source(), f"{QUICKSTART.name}[setup]", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


class _FakeRun:
  """Records commands instead of running them; `git clone` leaves a minimal checkout behind."""

  def __init__(self):
    self.commands, self.constraints = [], []

  def __call__(self, command, check=False, **kwargs):
    del check, kwargs
    command = [str(a) for a in command]
    self.commands.append(command)
    if command[:2] == ["git", "clone"]:
      target = pathlib.Path(command[-1])
      (target / ".git").mkdir(parents=True)
      (target / "fedjax_het").mkdir()
      (target / "fedjax_het" / "__init__.py").write_text("")
      shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    if "-c" in command:  # read while it exists: the cell removes its constraints file afterwards
      self.constraints.append(pathlib.Path(command[command.index("-c") + 1]).read_text())
    return subprocess.CompletedProcess(command, 0)

  def clones(self):
    return [c for c in self.commands if c[:2] == ["git", "clone"]]

  def pip_installs(self):
    return [c for c in self.commands if c[1:4] == ["-m", "pip", "install"]]


def _editable_target(command):
  return pathlib.Path(re.sub(r"\[[^\]]*\]$", "", command[command.index("-e") + 1]))


def _requirement_names(command):
  """Names of the requirements on a pip command line (options and their values skipped)."""
  names, args = [], iter(command[4:])
  for arg in args:
    if arg in ("-c", "-e", "-r", "--constraint", "--editable", "--requirement"):
      next(args)
    elif not arg.startswith("-"):
      names.append(re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", arg).group(0)).lower())
  return names


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
  """A kernel where fedjax_het is not imported yet and sys.path changes are undone."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.delitem(sys.modules, "fedjax_het", raising=False)
  monkeypatch.chdir(tmp_path)  # like Colab's /content: not inside a checkout
  return tmp_path


def test_setup_cell_clones_once_and_installs_that_folder_keeping_the_installed_jax(
    fresh_kernel, monkeypatch, capsys):
  assert importlib.util.find_spec("jax") is not None  # as on Colab's GPU and TPU runtimes
  checkout = fresh_kernel / "content" / "fedjax_het"
  monkeypatch.setenv("FEDJAX_HET_REPO_URL", REPO_URL)
  monkeypatch.setenv("FEDJAX_HET_CHECKOUT", str(checkout))
  run = _FakeRun()
  monkeypatch.setattr(subprocess, "run", run)

  namespace = _exec_setup_cell("__main__")
  assert namespace["REPO"] == checkout
  [clone] = run.clones()
  assert clone[-2:] == [REPO_URL, str(checkout)]
  installs = run.pip_installs()
  editable = [c for c in installs if "-e" in c]
  assert len(editable) == 1
  assert _editable_target(editable[0]) == pathlib.Path(clone[-1])  # the bug: /content[viz] vs the clone
  assert "--no-deps" in editable[0]
  names = {n for c in installs for n in _requirement_names(c)}
  assert not names & {"jax", "jaxlib"}, installs
  assert {"flax", "optax", "orbax-checkpoint", "chex", "matplotlib"} <= names  # the rest, explicitly
  assert run.constraints and f"jax=={importlib.metadata.version('jax')}" in run.constraints[0].split()
  assert sys.path[0] == str(checkout)  # importable in this kernel without a restart
  assert str(jax.devices()) in capsys.readouterr().out
  assert importlib.util.find_spec("fedjax_het").origin == str(checkout / "fedjax_het" / "__init__.py")

  rerun = _FakeRun()  # re-running the cell: no clone, no pip
  monkeypatch.setattr(subprocess, "run", rerun)
  assert _exec_setup_cell("__main__")["REPO"] == checkout
  assert not rerun.clones()
  assert rerun.commands == []


def test_setup_cell_without_jax_installs_the_clone_with_its_dependencies(fresh_kernel, monkeypatch):
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "jax" else find_spec(name, *a))
  checkout = fresh_kernel / "fedjax_het"
  run = _FakeRun()
  namespace = _exec_setup_cell()
  assert namespace["setup"](REPO_URL, checkout, run=run) == checkout
  [clone] = run.clones()
  [install] = run.pip_installs()
  assert _editable_target(install) == pathlib.Path(clone[-1]) == checkout
  assert install[install.index("-e") + 1].endswith("[viz]")
  assert "--no-deps" not in install

  rerun = _FakeRun()
  namespace["setup"](REPO_URL, checkout, run=rerun)
  assert rerun.commands == []


def test_setup_cell_needs_a_url_only_to_clone(fresh_kernel):
  with pytest.raises(ValueError, match="REPO_URL"):
    _exec_setup_cell()["setup"]("", fresh_kernel / "fedjax_het", run=_FakeRun())


def test_setup_cell_run_locally_finds_this_checkout_and_installs_nothing(monkeypatch):
  monkeypatch.chdir(QUICKSTART.parent)
  namespace = _exec_setup_cell()
  checkout = namespace["find_checkout"](pathlib.Path.cwd())
  assert checkout == ROOT
  run = _FakeRun()
  assert namespace["setup"](REPO_URL, checkout, run=run) == ROOT
  assert run.commands == []

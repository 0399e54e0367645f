"""The notebooks run: their code cells are executed in order, as Jupyter would."""

import importlib.metadata
import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import matplotlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
QUICKSTART = ROOT / "notebooks" / "fcclplus_quickstart.ipynb"


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


# --- The set-up cell (Colab GPU/TPU and local), exercised without network. ---


def _setup_cell_source(path):
  cells = [c for c in json.loads(path.read_text())["cells"]
           if "setup" in c.get("metadata", {}).get("tags", [])]
  assert len(cells) == 1 and cells[0]["cell_type"] == "code", "one code cell tagged `setup`"
  return "".join(cells[0]["source"])


def _exec_setup_cell(path=QUICKSTART):
  namespace = {"__name__": "__main__"}
  exec(compile(_setup_cell_source(path), f"{path.name}[setup]", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


class _FakeRun:
  """Records the commands instead of running them."""

  def __init__(self):
    self.commands = []

  def __call__(self, command, check=False, **kwargs):
    del check, kwargs
    self.commands.append([str(a) for a in command])
    return subprocess.CompletedProcess(command, 0)


def _without_fedjax_het(monkeypatch):
  """find_spec as on a fresh Colab runtime: fedjax_het not installed, everything else as here."""
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "fedjax_het" else find_spec(name, *a))


def test_every_notebook_has_the_same_short_set_up_cell():
  sources = {_setup_cell_source(path) for path in NOTEBOOKS}
  assert len(sources) == 1
  code = [line for line in sources.pop().splitlines() if line.strip() and not line.startswith("#")]
  assert len(code) <= 8, code
  assert sum("pip" in line for line in code) == 1


def test_set_up_cell_installs_nothing_where_fedjax_het_imports(monkeypatch, capsys):
  run = _FakeRun()
  monkeypatch.setattr(subprocess, "run", run)
  monkeypatch.delenv("FEDJAX_HET_REPO_URL", raising=False)
  _exec_setup_cell()
  assert run.commands == []
  assert str(jax.devices()) in capsys.readouterr().out


def test_set_up_cell_installs_from_the_url_keeping_the_runtime_jax(monkeypatch):
  url = "https://example.invalid/owner/fedjax_het"
  run = _FakeRun()
  monkeypatch.setattr(subprocess, "run", run)
  monkeypatch.setenv("FEDJAX_HET_REPO_URL", url)
  _without_fedjax_het(monkeypatch)
  _exec_setup_cell()
  assert run.commands == [[sys.executable, "-m", "pip", "install", "-q",
                           f"fedjax_het[viz] @ git+{url}",
                           f"jax=={importlib.metadata.version('jax')}"]]


def test_set_up_cell_without_jax_lets_pip_choose_it(monkeypatch):
  run = _FakeRun()
  monkeypatch.setattr(subprocess, "run", run)
  monkeypatch.setenv("FEDJAX_HET_REPO_URL", "https://example.invalid/fedjax_het")
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
      None if name in ("fedjax_het", "jax") else find_spec(name, *a)))
  _exec_setup_cell()
  [command] = run.commands
  assert not any(arg.startswith("jax==") for arg in command)


def test_set_up_cell_without_a_url_says_which_to_set(monkeypatch):
  run = _FakeRun()
  monkeypatch.setattr(subprocess, "run", run)
  monkeypatch.delenv("FEDJAX_HET_REPO_URL", raising=False)
  _without_fedjax_het(monkeypatch)
  with pytest.raises(SystemExit, match="REPO_URL"):
    _exec_setup_cell()
  assert run.commands == []


def test_notebook_code_reads_configs_and_studies_from_the_package():
  """A pip-installed fedjax_het (Colab) has no checkout: no code cell reads a repository path."""
  for path in NOTEBOOKS:
    for source in _code_cells(path):
      assert "experiments" not in source and "load_module" not in source, (path.name, source)

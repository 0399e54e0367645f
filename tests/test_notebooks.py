"""The notebooks run: their code cells are executed in order, as Jupyter would."""

import json
import pathlib

import matplotlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


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

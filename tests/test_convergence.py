"""The convergence study (fedjax_het/reports/convergence.py, experiments/convergence.py)."""

import json
import pathlib

import numpy as np
import pytest

from fedjax_het.config import load_module
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import convergence, tables

REPO = pathlib.Path(__file__).resolve().parents[1]
DOMAINS = ("amazon", "dslr", "webcam")


def _write(results_dir, row, seed, curve, rounds=40):
  """A finished mid-scale Office31 cell whose AVG accuracies per round are `curve(kind, r)`."""
  table = tables.get_table("fcclplus_office31")
  cell = cells_lib.plan(table, "mid", [seed], [row])[0]
  path = cell.directory(results_dir)
  path.mkdir(parents=True, exist_ok=True)
  records = [{"round": r, **{f"eval/{k}/mean": curve(k, r) for k in ("inter", "intra")}}
             for r in range(1, rounds + 1)]
  (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
  last = {k: {d: curve(k, rounds) for d in DOMAINS} for k in ("inter", "intra")}
  for k in last:
    last[k]["AVG"] = curve(k, rounds)
  (path / "results.json").write_text(json.dumps(last))
  (path / "metadata.json").write_text(json.dumps({"sources": {}}))
  (path / "cell.json").write_text(json.dumps({"status": "finished", "seconds": 60.0,
                                              "device_kind": "cpu (test)", "commit": "c" * 40}))


def _base(kind, r, seed):
  return 20.0 + 0.1 * r + seed + (50.0 if kind == "intra" else 0.0)


def _gap(kind, r, seed):
  # inter: above zero on every seed from round 11 (seed 2 crosses last); intra: seed 1 ends
  # at or below zero, so the gap never opens.
  if kind == "inter":
    return 0.2 * (r - 10) + (0.5 if seed != 2 else 0.0) if r > 10 or seed != 2 else -0.3
  return 1.0 if seed != 1 else 0.0


@pytest.fixture
def results(tmp_path):
  for seed in range(3):
    _write(tmp_path, "solo", seed, lambda k, r, s=seed: _base(k, r, s))
    _write(tmp_path, "fcclplus", seed, lambda k, r, s=seed: _base(k, r, s) + _gap(k, r, s))
  return tmp_path


def test_the_gap_is_paired_by_seed_and_opens_where_every_seed_stays_above_zero(results):
  text, numbers = convergence.render(tables.get_table("fcclplus_office31"), "mid", results)
  study = numbers["settings"]["office31"]
  inter, intra = study["inter"], study["intra"]
  assert inter["rounds"] == list(range(1, 41)) and inter["paired_seeds"] == [0, 1, 2]
  for r in (1, 10, 25, 40):
    base = [_base("inter", r, s) for s in range(3)]
    gaps = [_gap("inter", r, s) for s in range(3)]
    assert inter["base"][r]["mean"] == pytest.approx(np.mean(base))
    assert inter["base"][r]["std"] == pytest.approx(np.std(base, ddof=1))
    assert inter["gap"][r]["mean"] == pytest.approx(np.mean(gaps))
    assert inter["gap"][r]["std"] == pytest.approx(np.std(gaps, ddof=1))
  # Seed 2's inter gap is -0.3 up to round 10 and 0.2 (r - 10) after: positive from round 11.
  assert inter["opens"] == 11
  assert intra["opens"] is None  # seed 1 ends at zero
  assert "- inter: the gap is above zero on every paired seed from round 11 to round 40" in text
  assert "- intra: the gap is not above zero on every paired seed at round 40" in text
  # The paper's numbers beside: Table VIII Office31 BASE 27.72, FCCL+ 37.21, Δ +9.49.
  assert "the paper after 40 rounds: 27.72 and 37.21, Δ +9.49" in text
  row40 = next(line for line in text.splitlines() if line.startswith("| 40 |"))
  assert row40.split(" | ")[1] == f"{np.mean([_base('inter', 40, s) for s in range(3)]):.2f} ± 1.00"


def test_a_setting_with_base_cells_only_renders_base_and_no_gap(tmp_path):
  """BASE finished, the method not yet: BASE's column filled, the method's and the gap's '–'."""
  _write(tmp_path, "solo", 0, lambda k, r: _base(k, r, 0))
  text, numbers = convergence.render(tables.get_table("fcclplus_office31"), "mid", tmp_path)
  inter = numbers["settings"]["office31"]["inter"]
  assert inter["paired_seeds"] == [] and inter["opens"] is None
  assert inter["method"][40] == {"mean": None, "std": None, "n": 0}
  row40 = next(line for line in text.splitlines() if line.startswith("| 40 |"))
  assert row40 == f"| 40 | {_base('inter', 40, 0):.2f} | – | {_base('intra', 40, 0):.2f} | – | – | – |"
  assert "- inter: no gap yet (no seed has both rows finished)" in text
  assert convergence.figure([tables.get_table("fcclplus_office31")], "mid", tmp_path,
                            tmp_path / "curves.png")


def test_gap_opens_edge_cases():
  assert convergence.gap_opens({}, [1, 2]) is None
  assert convergence.gap_opens({0: {1: 1.0, 2: 1.0}}, [1, 2]) == 1
  assert convergence.gap_opens({0: {1: 1.0, 2: -1.0}}, [1, 2]) is None
  assert convergence.gap_opens({0: {1: -1.0, 2: 1.0, 3: 0.5}, 1: {1: 2.0, 2: 0.1, 3: 0.2}},
                               [1, 2, 3]) == 2


def test_the_command_writes_the_study_the_figure_and_the_block(results, tmp_path):
  script = load_module(REPO / "experiments" / "convergence.py")
  doc = tmp_path / "results.md"
  doc.write_text("# Results\n\nbefore\n")
  assert script.main(["--tables=fcclplus_office31", "--scale=mid", f"--results-dir={results}",
                      f"--doc={doc}"]) == 0
  study = json.loads((results / "convergence" / "mid" / "study.json").read_text())
  assert study["fcclplus_office31"]["settings"]["office31"]["inter"]["opens"] == 11
  assert (results / "convergence" / "mid" / "curves.png").stat().st_size > 0
  text = doc.read_text()
  assert text.startswith("# Results\n\nbefore\n\n<!-- convergence:mid -->\n")
  rendered, _ = convergence.render_all([tables.get_table("fcclplus_office31")], "mid", results)
  assert convergence.block(text, "mid") == rendered
  # Rewriting keeps everything else and replaces the block.
  again = convergence.rewrite(text + "after\n", "mid", "new\n")
  assert again.endswith("<!-- convergence:mid -->\nnew\n<!-- /convergence -->\nafter\n")


def test_docs_results_md_holds_the_study_of_what_results_holds():
  text = (REPO / "docs" / "results.md").read_text()
  content = convergence.block(text, "mid")
  if content is None:
    pytest.skip("docs/results.md has no mid-scale convergence block")
  rendered, _ = convergence.render_all(
      [tables.get_table(t) for t in convergence.STUDY_TABLES], "mid", REPO / "results")
  assert content == rendered


def test_base_after_the_papers_50_epochs_is_set_beside_the_method_at_the_last_round(results):
  # BASE at mid scale trains 20 local epochs a round: the paper's 50 epochs end in round 3.
  for seed in range(3):
    cell = cells_lib.plan(tables.get_table("fcclplus_office31"), "mid", [seed], ["solo"])[0]
    (cell.directory(results) / "run.json").write_text(json.dumps(
        {"config": {"local.epochs": 20}}))
  text, numbers = convergence.render(tables.get_table("fcclplus_office31"), "mid", results)
  inter = numbers["settings"]["office31"]["inter"]
  assert inter["base_at_paper_budget"]["round"] == 3
  gaps = [_base("inter", 40, s) + _gap("inter", 40, s) - _base("inter", 3, s) for s in range(3)]
  assert inter["base_at_paper_budget"]["gap"]["mean"] == pytest.approx(np.mean(gaps))
  line = next(x for x in text.splitlines() if x.startswith("- BASE (solo) after the paper's"))
  assert line.startswith("- BASE (solo) after the paper's 50 private epochs (round 3 here): inter "
                         f"{np.mean([_base('inter', 3, s) for s in range(3)]):.2f} ± 1.00, FCCL+ "
                         f"at round 40 minus it +{np.mean(gaps):.2f} ± {np.std(gaps, ddof=1):.2f}")

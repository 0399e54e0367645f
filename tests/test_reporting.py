"""Progress output (no training) and the results table layouts."""

import logging
import types

import pytest

from fedjax_het import experiment, reporting


def test_progress_logs_one_line_per_round_when_not_a_terminal(monkeypatch, caplog):
  clock = iter([0.0, 10.0, 20.0, 50.0])  # start, then rounds 1, 2, 3 (compiled beforehand)
  monkeypatch.setattr(reporting.time, "perf_counter", lambda: next(clock))
  monkeypatch.setattr(reporting.sys.stderr, "isatty", lambda: False, raising=False)
  with caplog.at_level(logging.INFO):
    progress = reporting.Progress(5, enabled=True)
    progress.update(1, "")
    progress.update(2, "intra 50.0")
    progress.update(3, "")
    progress.close()
  lines = [r.getMessage() for r in caplog.records]
  assert "round 1/5  (10.0 s/round, ETA 0.7 min)" in lines[0]
  assert "round 2/5 intra 50.0 (10.0 s/round, ETA 0.5 min)" in lines[1]
  assert "round 3/5  (30.0 s/round, ETA 1.0 min)" in lines[2]


def test_progress_on_a_terminal_is_a_tqdm_bar_with_the_accuracy(monkeypatch):
  import io
  err = io.StringIO()
  err.isatty = lambda: True
  monkeypatch.setattr(reporting.sys, "stderr", err)
  progress = reporting.Progress(4, enabled=True, start=1)
  progress.update(2, "intra 12.5 inter 9.0")
  progress.close()
  out = err.getvalue()
  assert "2/4" in out and "intra 12.5 inter 9.0" in out


def test_progress_disabled_writes_nothing(monkeypatch, caplog):
  import io
  err = io.StringIO()
  monkeypatch.setattr(reporting.sys, "stderr", err)
  with caplog.at_level(logging.INFO):
    reporting.Progress(3, enabled=False).update(1, "x")
  assert err.getvalue() == "" and not caplog.records


def test_results_table_domain_and_single_domain_layouts():
  records = [{"round": r, "eval/intra/a": 10.0 * r, "eval/inter/a": 1.0 * r,
              "eval/intra/b": 20.0, "eval/inter/b": 2.0} for r in (1, 2, 3)]
  table, numbers = reporting.results_table(records, ["a", "b"], last_rounds=2, method="m")
  assert numbers["intra"] == {"a": 25.0, "b": 20.0, "AVG": 22.5}
  assert numbers["inter"]["AVG"] == pytest.approx(2.25)
  assert table.splitlines()[2].startswith("| inter → | 2.50 | 2.00 | 2.25 |")
  single = [{"round": 1, "eval/accuracy/a": 40.0, "eval/accuracy/b": 60.0}]
  table, numbers = reporting.results_table(single, ["a", "b"], last_rounds=3, method="m",
                                           kinds=("accuracy",))
  assert numbers["accuracy"] == {"a": 40.0, "b": 60.0, "AVG": 50.0}
  assert table.splitlines() == ["| m | a | b | AVG |", "|---|---|---|---|",
                                "| accuracy | 40.00 | 60.00 | 50.00 |"]


def test_results_table_with_many_participants_shows_avg_min_max():
  names = [f"c{i}" for i in range(12)]
  records = [{"round": 1, **{f"eval/accuracy/{n}": float(i) for i, n in enumerate(names)}}]
  table, numbers = reporting.results_table(records, names, last_rounds=1, method="fedavg",
                                           kinds=("accuracy",))
  assert table.splitlines() == ["| fedavg (12 participants) | AVG | min | max |",
                                "|---|---|---|---|", "| accuracy | 5.50 | 0.00 | 11.00 |"]
  assert numbers["accuracy"]["c11"] == 11.0 and len(numbers["accuracy"]) == 13


def test_the_progress_line_leaves_out_an_accuracy_without_a_number():
  # HtFL's scenario has one domain, so its inter-domain mean is NaN (no other domain to test on).
  stand_in = types.SimpleNamespace(accuracy_kinds=("inter", "intra"))
  text = experiment.Experiment.progress_text
  assert text(stand_in, {"eval/inter/mean": float("nan"), "eval/intra/mean": 45.24}) == (
      "intra 45.2")
  assert text(stand_in, {"eval/inter/mean": None, "eval/intra/mean": 45.26}) == "intra 45.3"
  assert text(stand_in, {"eval/inter/mean": 19.44, "eval/intra/mean": 44.1}) == (
      "inter 19.4 intra 44.1")
  assert text(stand_in, {"train/loss": 1.0}) == ""


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_the_results_table_has_no_row_for_an_accuracy_without_a_number(missing):
  # metrics.jsonl stores the NaN inter-domain accuracy of a one-domain scenario as null.
  records = [{"round": r, "eval/inter/a": missing, "eval/inter/b": missing,
              "eval/intra/a": 40.0 + r, "eval/intra/b": 60.0 + r} for r in (1, 2, 3)]
  table, numbers = reporting.results_table(records, ["a", "b"], last_rounds=2, method="m")
  assert "inter" not in numbers and "inter →" not in table
  assert numbers["intra"] == {"a": 42.5, "b": 62.5, "AVG": 52.5}
  assert numbers["rounds"] == [2, 3]

"""The partitioned-dataset report (fedjax_het.reports.partitioned): final accuracy, rounds and
bytes to target over seeds, on hand-made runs."""

import math

import pytest

from fedjax_het.reports import common
from fedjax_het.reports import partitioned as pt
from fedjax_het.reports import tables

UP, DOWN = 100.0, 50.0  # bytes per round of the hand-made runs


def _run(reach_round, num_rounds=20, *, final=None, kind="accuracy", up=UP, down=DOWN):
  """A hand-made cell: accuracy 50% until `reach_round` (None: never), then 94.5%."""
  records = []
  for r in range(1, num_rounds + 1):
    acc = 94.5 if reach_round is not None and r >= reach_round else 50.0
    records.append({"round": r, f"eval/{kind}/mean": acc, "train/server/bytes_up": up,
                    "train/server/bytes_down": down})
  last = [rec[f"eval/{kind}/mean"] for rec in records[-3:]]
  avg = final if final is not None else sum(last) / len(last)
  return {"results": {kind: {"c0": avg, "AVG": avg}, "rounds": [18, 19, 20],
                      "rounds_to_target": {"94": reach_round, "95": None}},
          "records": records}


def test_rounds_to_target_and_reduction_are_the_hand_computed_numbers():
  cells = {"fedavg": {0: _run(10)}, "fedfusion_conv": {0: _run(4)}}
  summary = pt.summarize(cells, targets=(94.0,))
  assert summary["kind"] == "accuracy" and summary["targets"] == ["94"]
  assert summary["reference"] == "fedavg"
  assert summary["rounds"]["fedavg"]["94"]["mean"] == 10.0
  assert summary["rounds"]["fedfusion_conv"]["94"]["mean"] == 4.0
  cut = summary["rounds_reduction"]["fedfusion_conv"]["94"]
  assert cut == {"percent": pytest.approx(60.0), "bound": "exact"}  # 1 - 4/10
  assert summary["rounds_reduction"]["fedavg"]["94"]["percent"] == pytest.approx(0.0)
  # Bytes: 150 per round, 1500 vs 600 up to the target, 3000 over the whole run.
  assert summary["bytes_per_round"]["fedavg"] == {"up": UP, "down": DOWN, "total": 150.0,
                                                  "constant": True}
  assert summary["bytes"]["fedavg"]["94"]["mean"] == 1500.0
  assert summary["bytes"]["fedfusion_conv"]["94"]["mean"] == 600.0
  assert summary["bytes"]["fedfusion_conv"]["all"]["mean"] == 3000.0
  assert summary["bytes_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(60.0)
  assert pt.format_reduction(cut) == "60.0%"
  assert pt.format_reduction(cut, 66.0) == "60.0% (paper 66.0%)"


def test_bytes_to_target_follow_the_per_round_bytes_of_each_row():
  cells = {"fedavg": {0: _run(10)}, "fedfusion_conv": {0: _run(5, up=200.0, down=200.0)}}
  summary = pt.summarize(cells, targets=(94.0,))
  # Half the rounds, but 400 instead of 150 bytes per round: 2000 vs 1500 bytes.
  assert summary["rounds_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(50.0)
  assert summary["bytes"]["fedfusion_conv"]["94"]["mean"] == 2000.0
  assert summary["bytes_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(
      100.0 * (1 - 2000.0 / 1500.0))


def test_mean_and_sample_std_over_seeds():
  cells = {"fedavg": {0: _run(10, final=95.0), 1: _run(12, final=97.0)},
           "fedfusion_conv": {0: _run(4, final=96.0), 1: _run(6, final=96.0)}}
  summary = pt.summarize(cells, targets=(94.0,))
  final = summary["final"]["fedavg"]
  assert final["mean"] == pytest.approx(96.0)
  assert final["std"] == pytest.approx(math.sqrt(2.0))  # ddof=1 (ddof=0 would give 1.0)
  assert final["per_seed"] == {0: 95.0, 1: 97.0} and final["n"] == 2
  rounds = summary["rounds"]["fedavg"]["94"]
  assert rounds["mean"] == pytest.approx(11.0) and rounds["std"] == pytest.approx(math.sqrt(2))
  assert rounds["per_seed"] == {0: 10.0, 1: 12.0} and rounds["bound"] == "exact"
  # The reduction from the means over seeds: 1 - 5 / 11.
  assert summary["rounds_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(
      100.0 * (1 - 5.0 / 11.0))
  assert pt.format_censored(rounds) == "11.0 ± 1.4"
  assert pt.format_censored(summary["rounds"]["fedfusion_conv"]["94"], 34) == \
      "5.0 ± 1.4 (paper 34.0)"


def test_a_seed_that_never_reaches_the_target_is_censored():
  cells = {"fedavg": {0: _run(10), 1: _run(None)},             # 10, > 20
           "fedmmd": {0: _run(4), 1: _run(6)},                 # 4, 6
           "fedfusion_conv": {0: _run(None), 1: _run(8)},      # > 20, 8
           "fedfusion_multi": {0: _run(None), 1: _run(None)}}  # never
  summary = pt.summarize(cells, targets=(94.0,))
  fedavg = summary["rounds"]["fedavg"]["94"]
  assert fedavg == {"mean": 15.0, "std": None, "n": 2, "reached": 1, "bound": "lower",
                    "per_seed": {0: 10.0, 1: None}}
  assert pt.format_censored(fedavg) == "> 15.0 (1/2 reached)"
  assert pt.format_censored(summary["rounds"]["fedfusion_multi"]["94"]) == "> 20.0 (0/2 reached)"
  cuts = summary["rounds_reduction"]
  # FedAvg censored: FedMMD's true reduction is larger than 1 - 5/15.
  assert cuts["fedmmd"]["94"] == {"percent": pytest.approx(100 * (1 - 5 / 15)),
                                  "bound": "at_least"}
  assert pt.format_reduction(cuts["fedmmd"]["94"]) == "> 66.7%"
  assert cuts["fedfusion_conv"]["94"] == {"percent": None, "bound": "undetermined"}
  assert pt.format_reduction(cuts["fedfusion_conv"]["94"]) == "n/a (both censored)"
  # Bytes of a censored seed: its whole run; the same bound.
  assert summary["bytes"]["fedavg"]["94"]["mean"] == pytest.approx((1500.0 + 3000.0) / 2)
  assert summary["bytes"]["fedavg"]["94"]["bound"] == "lower"
  # A censored row against an exact reference: an upper bound.
  against = pt.summarize({"fedavg": {0: _run(10)}, "fedmmd": {0: _run(None)}}, targets=(94.0,))
  assert against["rounds_reduction"]["fedmmd"]["94"] == {"percent": pytest.approx(-100.0),
                                                         "bound": "at_most"}
  assert pt.format_reduction(against["rounds_reduction"]["fedmmd"]["94"]) == "< -100.0%"


def test_first_round_reaching_agrees_with_the_trainers_rule():
  from fedjax_het import experiment as experiment_lib  # pylint: disable=g-import-not-at-top
  records = _run(7, kind="intra")["records"]
  records[2].pop("eval/intra/mean")  # an unevaluated round
  assert pt.first_round_reaching(records, "intra", 94.0) == 7
  assert pt.first_round_reaching(records, "intra", 99.0) is None
  for target in (50.0, 94.0, 94.5, 99.0):
    assert pt.first_round_reaching(records, "intra", target) == experiment_lib.rounds_to_target(
        records, ("inter", "intra"), target)
  assert pt.headline_kind({"inter": {}, "intra": {}}) == experiment_lib.headline_kind(("inter", "intra"))
  assert pt.headline_kind({"accuracy": {}}) == experiment_lib.headline_kind(("accuracy",))


def test_render_setting_of_fedfusion_table2_with_the_papers_numbers():
  table = tables.get_table("fedfusion_table2")
  setting = table.settings[0]
  cells = {"fedavg": {0: _run(10, final=95.0)}, "fedfusion_conv": {0: _run(4, final=96.5)}}
  text, numbers = pt.render_setting(table, setting, cells, show_diff=False)
  assert "| FedAvg | 1 | 95.00 (paper 95.20) |" in text
  assert "| FedFusion+Conv | 1 | 96.50 (paper 95.79) |" in text
  assert "| FedFusion+Single | 0 | – (paper 95.25) |" in text
  assert ("| method | n | rounds to 94% | reduce (94%) | rounds to 95% | reduce (95%) |"
          in text)
  assert ("| FedAvg | 1 | 10.0 (paper 100.0) | (ref) | > 20.0 (0/1 reached) (paper 256.0) | "
          "(ref) |") in text
  assert "| FedFusion+Conv | 1 | 4.0 (paper 34.0) | 60.0% (paper 66.0%) |" in text
  assert "| FedFusion+Multi | 0 | – (paper 78.0) | – (paper 22.0%) |" in text
  assert "each run: its last 3 evaluated rounds" not in text
  assert "each run: the mean of its last 3 evaluated rounds" in text
  assert numbers["summary"]["final"]["fedavg"]["mean"] == 95.0
  shown, _ = pt.render_setting(table, setting, cells, show_diff=True)
  assert "| FedFusion+Conv | 1 | 96.50 (paper 95.79) | +0.71 |" in shown
  # Without FedAvg: no reduction values; a row never evaluated: "–".
  alone, _ = pt.render_setting(table, setting, {"fedfusion_conv": cells["fedfusion_conv"]},
                               show_diff=False)
  assert "| FedFusion+Conv | 1 | 4.0 (paper 34.0) | – (paper 66.0%) |" in alone
  # Seed by seed against FedAvg: one paired seed, no verdict; without FedAvg no section.
  assert "| FedFusion+Conv | 0 | +1.50 | 1 seed |" in text
  assert numbers["seed_by_seed"]["rows"]["fedfusion_conv"]["final"]["verdict"] == "too_few"
  assert "seed by seed" not in alone


def test_final_accuracy_seed_by_seed_against_fedavg():
  table = tables.get_table("fedfusion_table2")
  setting = table.settings[0]
  cells = {"fedavg": {0: _run(10, final=90.0), 1: _run(10, final=92.0), 2: _run(10, final=91.0)},
           "fedfusion_single": {0: _run(10, final=91.0), 1: _run(10, final=93.5),
                                2: _run(10, final=91.25)},
           "fedfusion_multi": {0: _run(10, final=89.0), 2: _run(10, final=91.0)},
           "fedfusion_conv": {0: _run(10, final=89.0), 1: _run(10, final=93.0)}}
  text, numbers = pt.render_setting(table, setting, cells, show_diff=False)
  assert ("Final accuracy seed by seed against FedAvg; FedFusion+Conv, local models against "
          "FedAvg, local models; FedFusion+Conv, the code's even / odd digits, local models "
          "against FedAvg, the code's even / odd digits, local models; FedFusion+Conv, the "
          "code's even / odd digits and augmentation, local models against FedAvg, the code's "
          "even / odd digits and augmentation, local models (each seed draws the same data for "
          "a row and its reference)") in text
  assert "| method | seeds | final accuracy Δ per seed | verdict |" in text
  assert "| FedFusion+Single | 0, 1, 2 | +1.00, +1.50, +0.25 | above FedAvg on every seed |" \
      in text
  # Multi: -1 on seed 0, a tie on seed 2 (no sign).
  assert "| FedFusion+Multi | 0, 2 | -1.00, 0.00 | below or equal to FedAvg on every seed |" \
      in text
  assert "| FedFusion+Conv | 0, 1 | -1.00, +1.00 | changes sign |" in text
  rows = numbers["seed_by_seed"]["rows"]
  assert rows["fedfusion_multi"]["final"]["per_seed"] == {0: -1.0, 2: 0.0}
  assert [rows[r]["final"]["verdict"] for r in ("fedfusion_single", "fedfusion_multi",
                                                 "fedfusion_conv")] == [
      "above", "below_or_equal", "changes"]
  assert rows["fedfusion_conv_identity"]["final"]["verdict"] == "too_few"  # a row without cells


def test_a_diagnosis_row_is_read_against_its_own_reference_row():
  """FedFusion+Conv's local models against FedAvg's local models, not the global FedAvg:
  reduction 1 - 15/10 by hand, differences conv_local - fedavg_local per seed."""
  table = tables.get_table("fedfusion_table2")
  setting = table.settings[0]
  assert {r.key: r.reference for r in setting.rows if r.reference} == {
      "fedfusion_conv_local": "fedavg_local", "fedfusion_conv_code_data": "fedavg_code_data",
      "fedfusion_conv_code_data_aug": "fedavg_code_data_aug"}
  cells = {"fedavg": {0: _run(5, final=90.0), 1: _run(5, final=92.0)},
           "fedavg_local": {0: _run(10, final=93.0), 1: _run(10, final=94.0)},
           "fedfusion_conv_local": {0: _run(15, final=91.0), 1: _run(15, final=93.5)}}
  text, numbers = pt.render_setting(table, setting, cells, show_diff=False)
  summary = numbers["summary"]
  assert summary["references"]["fedfusion_conv_local"] == "fedavg_local"
  assert summary["references"]["fedavg_local"] == "fedavg"
  assert summary["references"]["fedfusion_conv_code_data"] == "fedavg_code_data"  # no cells
  assert summary["rounds_reduction"]["fedfusion_conv_local"]["94"]["percent"] == \
      pytest.approx(-50.0)  # 1 - 15 / 10
  assert summary["rounds_reduction"]["fedavg_local"]["94"]["percent"] == pytest.approx(-100.0)
  rows = numbers["seed_by_seed"]["rows"]
  assert rows["fedfusion_conv_local"]["final"]["per_seed"] == {0: -2.0, 1: -0.5}
  assert rows["fedavg_local"]["final"]["per_seed"] == {0: 3.0, 1: 2.0}
  assert numbers["seed_by_seed"]["references"]["fedfusion_conv_code_data"] == "fedavg_code_data"
  assert ("| FedFusion+Conv, local models (not the paper's) | 0, 1 | -2.00, -0.50 | "
          "below FedAvg, local models on every seed |") in text
  assert ("| FedAvg, local models (not the paper's) | 0, 1 | +3.00, +2.00 | "
          "above FedAvg on every seed |") in text
  # Without the FedAvg row, the local rows are still read against each other.
  del cells["fedavg"]
  text, numbers = pt.render_setting(table, setting, cells, show_diff=False)
  rows = numbers["seed_by_seed"]["rows"]
  assert rows["fedfusion_conv_local"]["final"]["per_seed"] == {0: -2.0, 1: -0.5}
  assert rows["fedavg_local"]["final"]["verdict"] == "too_few"
  assert ("| FedFusion+Conv, local models (not the paper's) | 0, 1 | -2.00, -0.50 | "
          "below FedAvg, local models on every seed |") in text
  assert "| FedFusion+Conv, local models (not the paper's) | 2 | 15.0 ± 0.0 | -50.0% |" in text
  assert "FedFusion+Conv, local models against FedAvg, local models" in text
  assert "FedFusion+Conv, local models: against FedAvg, local models" in text


def test_figure_has_a_line_per_row_and_the_targets():
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  cells = {"fedavg": {0: _run(10), 1: _run(12)}, "fedfusion_conv": {0: _run(4)}}
  curves = {m: {"accuracy": common.mean_curves([c["records"] for c in s.values()], "accuracy")}
            for m, s in cells.items()}
  fig = common.curves_figure(plt, curves, title="t", kinds=("accuracy",),
                             labels={m: tables.TWO_STREAM_LABELS[m] for m in curves},
                             titles={"accuracy": "acc"}, targets=(94.0, 95.0))
  (ax,) = fig.axes
  assert ax.get_title() == "acc"
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert legend == ["FedAvg", "FedFusion+Conv", "target 94%", "target 95%"]
  plt.close(fig)

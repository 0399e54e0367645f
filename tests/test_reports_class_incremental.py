"""The class-incremental report (fedjax_het.reports.class_incremental) on hand-made inputs."""

import math

import numpy as np
import pytest

from fedjax_het.errors import ConfigError
from fedjax_het.reports import class_incremental as ci
from fedjax_het.reports import tables


def test_forgetting_and_average_incremental_accuracy_by_hand():
  nan = float("nan")
  per_task = np.array([[0.90, nan, nan],
                       [0.95, 0.80, nan],
                       [0.50, 0.40, 0.70]])
  # Old task 0: best before the last task max(0.90, 0.95) = 0.95, now 0.50 -> 0.45 lost;
  # old task 1: best 0.80, now 0.40 -> 0.40 lost; the average over old tasks: 0.425.
  assert ci.forgetting(per_task) == pytest.approx(0.425)
  # Avg.: the mean over tasks of the accuracy on all classes seen so far.
  assert ci.average_incremental_accuracy([0.9, 0.7, 0.5]) == pytest.approx(0.7)
  with pytest.raises(ValueError, match="forgetting needs an old task"):
    ci.forgetting(per_task[:1])


def test_one_runs_table_from_the_task_end_class_counts():
  records = [{"round": 1, "task": 0},
             {"round": 2, "task": 0, "eval/class_correct": [8, 6, 0, 0],
              "eval/class_total": [10, 10, 10, 10]},
             {"round": 4, "task": 1, "eval/class_correct": [5, 3, 9, 7],
              "eval/class_total": [10, 10, 10, 10]}]
  text, numbers = ci.run_table(records, 2, 2, "GLFC")
  # After task 0: 14/20 on classes 0-1. After task 1: task 0 8/20 = 0.4, task 1 16/20 = 0.8,
  # all seen 24/40 = 0.6. Avg. (0.7 + 0.6) / 2 = 0.65; forgetting 0.7 - 0.4 = 0.3.
  assert numbers["seen_accuracy"] == pytest.approx([0.7, 0.6])
  assert numbers["per_task_accuracy"] == [[pytest.approx(0.7), None],
                                          [pytest.approx(0.4), pytest.approx(0.8)]]
  assert numbers["average_incremental_accuracy"] == pytest.approx(0.65)
  assert numbers["forgetting"] == pytest.approx(0.3)
  assert numbers["rounds"] == [2, 4]
  assert text.splitlines()[:3] == ["| Methods | 2 | 4 | Avg. |", "|---|---:|---:|---:|",
                                   "| GLFC | 70.0 | 60.0 | 65.0 |"]
  assert text.endswith("Average forgetting: 30.0 (percentage points).")
  assert ci.run_table(records[:1], 2, 2, "GLFC") == ("(no task finished)", {"tasks_done": 0})


def _numbers(method, seen, forgetting):
  """A run's results.json numbers (fractions), 5 classes per task."""
  return {"method": method, "classes_per_task": 5, "seen_accuracy": list(seen),
          "average_incremental_accuracy": sum(seen) / len(seen), "forgetting": forgetting}


RESULTS = {
    "fedavg_cil": {0: _numbers("FedAvg (fine-tuning)", [0.80, 0.40], 0.50),
                   1: _numbers("FedAvg (fine-tuning)", [0.60, 0.50], 0.30)},
    "glfc": {0: _numbers("GLFC", [0.90, 0.70], 0.10),
             1: _numbers("GLFC", [0.90, 0.60], 0.20)},
}


def test_table_cells_are_mean_and_sample_std_over_seeds():
  summary = ci.summarize(RESULTS, num_tasks=2, classes_per_task=5)
  assert summary["columns"] == [5, 10]
  fedavg = summary["rows"]["fedavg_cil"]
  # By hand: seeds (0.80, 0.60) -> mean 0.70, sample std |0.80 - 0.60| / sqrt(2).
  assert fedavg["seen_accuracy"][0]["mean"] == pytest.approx(0.70)
  assert fedavg["seen_accuracy"][0]["std"] == pytest.approx(0.20 / math.sqrt(2))
  assert fedavg["average_incremental_accuracy"]["mean"] == pytest.approx(0.575)
  assert fedavg["average_incremental_accuracy"]["std"] == pytest.approx(0.05 / math.sqrt(2))
  assert fedavg["forgetting"]["mean"] == pytest.approx(0.40)
  assert fedavg["forgetting"]["std"] == pytest.approx(0.20 / math.sqrt(2))
  paper = {"glfc": {"seen": (88.0, 70.0), "avg": 79.0}, "other": {"seen": (1.0, 2.0), "avg": 1.5}}
  rows = [("fedavg_cil", "FedAvg (fine-tuning)"), ("glfc", "GLFC (Ours)"), ("other", "Other")]
  assert ci.markdown_table(summary, rows, paper, show_diff=True).splitlines() == [
      "| method | n | 5 | 10 | Avg. | Forgetting | Avg. − paper |",
      "|---|---|---:|---:|---:|---:|---:|",
      "| FedAvg (fine-tuning) | 2 | 70.0 ± 14.1 | 45.0 ± 7.1 | 57.5 ± 3.5 | 40.0 ± 14.1 |  |",
      "| GLFC (Ours) | 2 | 90.0 ± 0.0 | 65.0 ± 7.1 | 77.5 ± 3.5 | 15.0 ± 7.1 | -1.5 |",
      "| ↳ paper |  | 88.0 | 70.0 | 79.0 | – |  |",
      "| Other | 0 | – | – | – | – |  |",
      "| ↳ paper |  | 1.0 | 2.0 | 1.5 | – |  |"]


def test_one_seed_shows_the_mean_alone_and_other_layouts_are_refused():
  one = ci.summarize({"glfc": {3: _numbers("GLFC", [0.5, 0.25], None)}}, num_tasks=2,
                     classes_per_task=5)
  lines = ci.markdown_table(one, [("glfc", "GLFC")], {}, show_diff=False).splitlines()
  assert lines[2:] == ["| GLFC | 1 | 50.0 | 25.0 | 37.5 | – |"]
  results = {"glfc": {0: _numbers("GLFC", [0.9, 0.7], 0.1),
                      1: _numbers("GLFC", [0.9, 0.7, 0.6], 0.1)}}
  with pytest.raises(ConfigError, match=r"glfc seed 1: its results cover 3 task\(s\) of 5 "
                     r"classes, not the table's 2 tasks of 5 classes"):
    ci.summarize(results, num_tasks=2, classes_per_task=5)


def test_render_setting_of_glfc_table1_without_runs_shows_the_paper():
  table = tables.get_table("glfc_table1")
  text, numbers = ci.render_setting(table, table.settings[0], {}, show_diff=False)
  assert "(10 tasks of 10 classes)" in text
  assert "| method | n | 10 | 20 | 30 | 40 | 50 | 60 | 70 | 80 | 90 | 100 | Avg. | Forgetting |" \
      in text
  assert ("| ↳ paper (GLFC Table 1) |  | 90.0 | 82.3 | 77.0 | 72.3 | 65.0 | 66.3 | 59.7 | 56.3 "
          "| 50.3 | 50.0 | 66.9 | – |") in text
  assert "| FedAvg (fine-tuning) | 0 |" in text
  assert numbers["summary"]["rows_done"] == []


def test_seed_by_seed_against_glfc_in_percentage_points():
  table = tables.get_table("glfc_table1")
  cells = {row: {seed: {"results": numbers} for seed, numbers in per_seed.items()}
           for row, per_seed in RESULTS.items()}
  text, numbers = ci.render_setting(table, table.settings[0], cells, show_diff=False)
  # Avg.: FedAvg 60.0, 55.0 against GLFC 80.0, 75.0; forgetting 50, 30 against 10, 20.
  assert ("| FedAvg (fine-tuning) | 0, 1 | -20.00, -20.00 | below GLFC on every seed | "
          "+40.00, +10.00 | above GLFC on every seed |") in text
  assert "| iCaRL + FL | – | – | 0 seeds | – | 0 seeds |" in text
  assert "GLFC (Ours) |" not in text.split("Seed by seed against GLFC")[1]
  comparison = numbers["seed_by_seed"]
  assert comparison["reference"] == "glfc"
  assert comparison["rows"]["fedavg_cil"]["avg"]["per_seed"] == {
      0: pytest.approx(-20.0), 1: pytest.approx(-20.0)}
  # Without a GLFC run there is nothing to pair with.
  alone = {"fedavg_cil": cells["fedavg_cil"]}
  text, numbers = ci.render_setting(table, table.settings[0], alone, show_diff=False)
  assert "Seed by seed" not in text and "seed_by_seed" not in numbers

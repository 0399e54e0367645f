"""The class-incremental benchmark runner (experiments/cil_benchmark.py): GLFC Table 1 of runs."""

import json
import math
import pathlib

import ml_collections
import pytest

from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError
from tests.test_cil_train import tiny_cil_config
from tests.test_train import cli  # experiments/train.py defines absl flags: load it once

REPO = pathlib.Path(__file__).resolve().parents[1]
runner = load_module(REPO / "experiments" / "cil_benchmark.py")
runner.train_cli = cli  # the --configs names resolve through its expand_config_name


def _numbers(method, seen, forgetting):
  """A run's results.json numbers (fractions), 5 classes per task."""
  return {"method": method, "classes_per_task": 5, "seen_accuracy": list(seen),
          "average_incremental_accuracy": sum(seen) / len(seen), "forgetting": forgetting}


# Two configs, two seeds, two tasks of 5 classes.
RESULTS = {
    "cifar100_fedavg_cil_quick": {0: _numbers("FedAvg (fine-tuning)", [0.80, 0.40], 0.50),
                                  1: _numbers("FedAvg (fine-tuning)", [0.60, 0.50], 0.30)},
    "cifar100_glfc_quick": {0: _numbers("GLFC", [0.90, 0.70], 0.10),
                            1: _numbers("GLFC", [0.90, 0.60], 0.20)},
}


def test_table_cells_are_mean_and_sample_std_over_seeds():
  summary = runner.summarize(RESULTS, num_tasks=2, classes_per_task=5)
  assert summary["columns"] == [5, 10]
  fedavg = summary["rows"]["cifar100_fedavg_cil_quick"]
  # By hand: seeds (0.80, 0.60) -> mean 0.70, sample std |0.80 - 0.60| / sqrt(2).
  assert fedavg["seen_accuracy"][0]["mean"] == pytest.approx(0.70)
  assert fedavg["seen_accuracy"][0]["std"] == pytest.approx(0.20 / math.sqrt(2))
  assert fedavg["average_incremental_accuracy"]["mean"] == pytest.approx(0.575)
  assert fedavg["average_incremental_accuracy"]["std"] == pytest.approx(0.05 / math.sqrt(2))
  assert fedavg["forgetting"]["mean"] == pytest.approx(0.40)
  assert fedavg["forgetting"]["std"] == pytest.approx(0.20 / math.sqrt(2))
  assert runner.markdown_table(summary).splitlines() == [
      "| Methods | 5 | 10 | Avg. | Forgetting |",
      "|---|---:|---:|---:|---:|",
      "| FedAvg (fine-tuning) | 70.0 ± 14.1 | 45.0 ± 7.1 | 57.5 ± 3.5 | 40.0 ± 14.1 |",
      "| GLFC | 90.0 ± 0.0 | 65.0 ± 7.1 | 77.5 ± 3.5 | 15.0 ± 7.1 |"]


def test_one_seed_shows_the_mean_alone_and_equal_labels_name_their_configs():
  results = {"a": {3: _numbers("GLFC", [0.5, 0.25], None)},
             "b": {3: _numbers("GLFC", [0.75, 0.5], 0.25)}}
  lines = runner.markdown_table(runner.summarize(results, num_tasks=2,
                                                 classes_per_task=5)).splitlines()
  assert lines[2:] == ["| GLFC [a] | 50.0 | 25.0 | 37.5 | – |",
                       "| GLFC [b] | 75.0 | 50.0 | 62.5 | 25.0 |"]


def test_results_with_another_layout_are_refused():
  results = {"glfc": {0: _numbers("GLFC", [0.9, 0.7], 0.1),
                      1: _numbers("GLFC", [0.9, 0.7, 0.6], 0.1)}}
  with pytest.raises(ConfigError, match=r"glfc seed 1: its results cover 3 task\(s\) of 5 "
                     r"classes, not the table's 2 tasks of 5 classes"):
    runner.summarize(results, num_tasks=2, classes_per_task=5)


def test_mismatched_layouts_and_other_scenarios_are_refused_naming_the_configs(tmp_path):
  four_tasks = tiny_cil_config()
  four_tasks.scenario.num_tasks = 4
  with pytest.raises(ConfigError, match=r"task layouts differ.*two: 2 tasks of 2 classes, "
                     r"four: 4 tasks of 1 classes"):
    runner.check_layouts({"two": tiny_cil_config(), "four": four_tasks})
  # The same classes per task in fewer tasks: the columns would not align either.
  three = tiny_cil_config()
  three.scenario.num_classes = 6
  three.scenario.num_tasks = 3
  with pytest.raises(ConfigError, match=r"two: 2 tasks of 2 classes, three: 3 tasks of 2"):
    runner.check_layouts({"two": tiny_cil_config(), "three": three})
  digits = ml_collections.ConfigDict({"name": "d", "scenario": {"name": "digits"}})
  with pytest.raises(ConfigError, match=r"not class-incremental .*: d1 \(scenario.name="
                     r"'digits'\)"):
    runner.check_layouts({"ok": tiny_cil_config(), "d1": digits})
  # Refused before anything trains.
  with pytest.raises(ConfigError, match="four: 4 tasks"):
    runner.run_cil_benchmark({"two": tiny_cil_config(), "four": four_tasks}, [0],
                             workdir=tmp_path / "w", echo=lambda _: None)
  assert not (tmp_path / "w").exists()


def test_cli_names_the_configs_it_refuses(capsys, tmp_path):
  argv = [f"--workdir={tmp_path}", "--seeds=0"]
  assert runner.main(argv + ["--configs=cifar100_fedavg_cil_quick,digits_fedavg_quick"]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: --configs: not class-incremental") and len(err.splitlines()) == 1
  assert "digits_fedavg_quick (scenario.name='digits')" in err
  assert runner.main(argv + ["--configs=nosuchscenario_x"]) == 1
  assert "known scenarios" in capsys.readouterr().err
  assert runner.main(argv + ["--configs=cifar100_nosuchvariant"]) == 1
  assert "'cifar100_nosuchvariant': cifar100 config: expected one of" in capsys.readouterr().err
  assert runner.main(argv + ["--configs=cifar100_glfc_quick", "--seeds=0,x"]) == 1
  assert "--seeds must be comma-separated integers" in capsys.readouterr().err
  assert runner.main(argv + ["--configs=cifar100_glfc_quick", "--set", "cil.round_per_task=1"]) == 1
  assert "did you mean 'cil.rounds_per_task'" in capsys.readouterr().err
  assert list(tmp_path.iterdir()) == []
  with pytest.raises(SystemExit):  # no --quick: the config names say which variant
    runner.build_parser().parse_args(["--quick"])


def _tiny(method):
  config = tiny_cil_config(method)
  config.name = f"tiny_{method}"
  config.cil.rounds_per_task = 1   # 2 rounds in all
  if method == "glfc":             # as tests/test_cil_glfc.py's tiny GLFC config
    config.local.lr = 0.5
    config.glfc.memory_size = 8
    # Without the proxy server: its prototype reconstructions at the task transition took
    # ~95 s of the run on a 2-core CPU; the table does not depend on how the old model is made.
    config.glfc.old_model = "previous_task_global"
  return config


def test_end_to_end_tables_each_runs_own_results_then_reuses_them(tmp_path, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path / "data_cache"))
  configs = {"tiny_fedavg_cil": _tiny("fedavg_cil"), "tiny_glfc": _tiny("glfc")}
  lines = []
  out = runner.run_cil_benchmark(configs, [0], workdir=tmp_path / "bench",
                                 overrides=["logging.plots=False"], echo=lines.append)
  assert out["statuses"] == {"tiny_fedavg_cil": {0: "trained"}, "tiny_glfc": {0: "trained"}}
  assert out["complete"] and (out["num_tasks"], out["classes_per_task"]) == (2, 2)
  saved = json.loads((tmp_path / "bench" / "results.json").read_text())
  table_md = (tmp_path / "bench" / "table.md").read_text()
  assert "| Methods | 2 | 4 | Avg. | Forgetting |" in table_md
  assert "Partial" not in table_md
  for name, prefix in {"tiny_fedavg_cil": "FedAvg", "tiny_glfc": "GLFC"}.items():
    own = json.loads((tmp_path / "bench" / name / "seed0" / "results.json").read_text())
    label = own["method"]  # the trainer's label of the method: the row's label
    assert label.startswith(prefix) and own["rounds_done"] == 2
    entry = saved["methods"][name]
    assert entry["seeds"]["0"]["seen_accuracy"] == own["seen_accuracy"]
    assert entry["seeds"]["0"]["average_incremental_accuracy"] == (
        own["average_incremental_accuracy"])
    assert entry["seeds"]["0"]["forgetting"] == own["forgetting"]
    assert entry["mean"]["seen_accuracy"] == own["seen_accuracy"]  # one seed: the mean is it
    assert entry["std"]["average_incremental_accuracy"] is None
    row = " | ".join([label] + [f"{100 * a:.1f}" for a in own["seen_accuracy"]]
                     + [f"{100 * own['average_incremental_accuracy']:.1f}",
                        f"{100 * own['forgetting']:.1f}"])
    assert f"| {row} |" in table_md
  assert (tmp_path / "bench" / "accuracy.png").stat().st_size > 0

  # Rerun: the trainer's own resume finds both runs finished and trains nothing.
  metrics = {n: (tmp_path / "bench" / n / "seed0" / "metrics.jsonl").read_bytes()
             for n in configs}
  again = runner.run_cil_benchmark(configs, [0], workdir=tmp_path / "bench",
                                   overrides=["logging.plots=False"], echo=lines.append)
  assert again["statuses"] == {"tiny_fedavg_cil": {0: "reused"}, "tiny_glfc": {0: "reused"}}
  assert {n: (tmp_path / "bench" / n / "seed0" / "metrics.jsonl").read_bytes()
          for n in configs} == metrics
  for name in configs:
    assert again["methods"][name]["mean"] == out["methods"][name]["mean"]
    assert again["methods"][name]["seeds"]["0"]["status"] == "reused"
  assert (tmp_path / "bench" / "table.md").read_text() == table_md

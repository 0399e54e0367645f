"""benchmarks/round_cost.py: the per-round record it reads from a run's metrics.jsonl."""

import json

import pytest

from tests import benchmark_scripts

round_cost = benchmark_scripts.load("round_cost")


def test_reads_round_seconds_and_evaluation_means_and_takes_the_median_after_round_one(
    tmp_path):
  rows = [{"round": 1, "time/round_secs": 30.004, "eval/accuracy/mean": 11.111,
           "eval/accuracy/min": 1.0, "train/loss": 2.0},
          {"round": 2, "time/round_secs": 6.0, "eval/accuracy/mean": 40.0},
          {"round": 3, "time/round_secs": 9.0},
          {"round": 4, "time/round_secs": 7.5, "eval/intra/mean": 50.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  got = round_cost.read_rounds(tmp_path)
  assert got["round_secs"] == {"1": 30.0, "2": 6.0, "3": 9.0, "4": 7.5}
  assert got["eval"] == {"1": {"eval/accuracy/mean": 11.11}, "2": {"eval/accuracy/mean": 40.0},
                         "4": {"eval/intra/mean": 50.0}}
  assert round_cost.steady_round(got["round_secs"]) == 7.5  # median of 6, 9, 7.5
  assert round_cost.steady_round({"1": 5.0}) is None


def test_reads_the_wall_seconds_of_each_round_from_the_progress_lines():
  log = ("I1129 02:03:34.566611 1403 reporting.py:263] round 1/4 accuracy 30.7 (9.2 s/round, "
         "ETA 0.5 min)\nI1129 02:03:44 1403 reporting.py:263] round 2/4 inter 73.5 intra 73.5 "
         "(95 s/round, ETA 0.3 min)\nsomething else (1.0 s/round)\n")
  assert round_cost.read_wall_seconds(log) == {"1": 9.2, "2": 95.0}


def test_records_the_named_metrics_of_every_round(tmp_path):
  rows = [{"round": 1, "time/round_secs": 3.0, "proxy/gradients": 60, "glfc/signals": 10},
          {"round": 2, "time/round_secs": 2.0, "proxy/gradients": 0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  got = round_cost.read_rounds(tmp_path, ("proxy/gradients", "glfc/signals"))
  assert got["metrics"] == {"1": {"proxy/gradients": 60, "glfc/signals": 10},
                            "2": {"proxy/gradients": 0}}
  assert "metrics" not in round_cost.read_rounds(tmp_path)


def test_a_config_spec_carries_its_overrides_as_trainer_flags():
  assert round_cost.parse_spec("cifar100_glfc_mid") == ("cifar100_glfc_mid", [])
  assert round_cost.parse_spec(
      "cifar100_glfc_mid:glfc.proxy.reconstruction_steps=20:glfc.old_model=x") == (
          "cifar100_glfc_mid", ["--config.glfc.proxy.reconstruction_steps=20",
                                "--config.glfc.old_model=x"])
  with pytest.raises(ValueError, match="field=value"):
    round_cost.parse_spec("cifar100_glfc_mid:glfc.proxy.reconstruction_steps")

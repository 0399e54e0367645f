"""benchmarks/speed_table.py: the speed table from first_round.py's and
pytorch_reference.py's reports, its ratios checked by hand."""

import json

import pytest

from tests import benchmark_scripts


speed_table = benchmark_scripts.load("speed_table")


def _engine_row(config, overrides, backend="cpu", **secs):
  row = {"config": config, "overrides": overrides, "backend": backend, "init_secs": 2.0,
         "trace_lower_secs": 10.0, "compile_secs": 60.0, "first_round_secs": 30.0,
         "start_to_round1_end_secs": 110.0, "steady_round_secs": 20.0, "memory_gib": 3.5}
  row.update(secs)
  return row


def _reports(config="digits_fcclplus_quick", overrides=(), backend="cpu", num_rounds=5):
  overrides = list(overrides)
  first_round = {"cold": _engine_row(config, overrides, backend),
                 "warm": _engine_row(config, overrides, backend, init_secs=1.0,
                                     trace_lower_secs=1.0, compile_secs=15.0,
                                     start_to_round1_end_secs=50.0, steady_round_secs=21.0)}
  pytorch = {"config": config, "overrides": overrides, "num_rounds": num_rounds,
             "torch": {"authors": {"first_round_secs": 55.0, "steady_round_secs": 50.0,
                                   "end_to_end_secs": 260.0},
                       "tuned": {"first_round_secs": 45.0, "steady_round_secs": 40.0, "end_to_end_secs": 205.0,
                                 "peak_memory_gib": 7.0}}}
  return first_round, pytorch


def test_ratios_by_hand():
  first_round, pytorch = _reports()
  table = speed_table.build_table(first_round, pytorch, num_rounds=5)
  engine = table["engine"]
  # cold: 2 + 10 + 60 + 30 + 4 * 20 = 182; warm: 1 + 1 + 15 + 30 + 4 * 21 = 131.
  assert engine["end_to_end_cold_secs"] == pytest.approx(182.0)
  assert engine["end_to_end_warm_secs"] == pytest.approx(131.0)
  assert engine["compile_warm_secs"] == 15.0 and engine["start_to_round1_end_warm_secs"] == 50.0
  authors = table["torch"]["authors"]["engine_vs_pytorch_speedup"]
  assert authors["steady_state"] == pytest.approx(2.5)
  assert authors["end_to_end_cold"] == pytest.approx(260.0 / 182.0)
  assert authors["end_to_end_warm"] == pytest.approx(260.0 / 131.0)
  assert table["torch"]["tuned"]["engine_vs_pytorch_speedup"]["steady_state"] == pytest.approx(2.0)
  assert "goals_met" not in table  # the goals are set for the full config on a GPU
  text = speed_table.markdown(table)
  assert "| steady-state round | 20.00 s | 21.00 s | 50.00 s | 40.00 s | <= 4 s |" in text
  assert "| engine speedup, end to end (cold / warm) |  |  | 1.43x / 1.98x | 1.13x / 1.56x |" in text
  assert "set for digits_fcclplus on one GPU" in text


def test_rounds_per_call_divides_the_steady_call():
  first_round, pytorch = _reports(num_rounds=6)
  first_round["cold"]["steady_round_secs"] = 60.0  # one call of 3 rounds
  table = speed_table.build_table(first_round, pytorch, num_rounds=6, rounds_per_call=3)
  assert table["engine"]["steady_round_secs"] == pytest.approx(20.0)
  # 2 calls: 2 + 10 + 60 + 30 + 1 * 60.
  assert table["engine"]["end_to_end_cold_secs"] == pytest.approx(162.0)


def test_goals_met_for_the_full_config_on_a_gpu():
  first_round, pytorch = _reports("digits_fcclplus", backend="gpu", num_rounds=40)
  first_round["cold"].update(start_to_round1_end_secs=55.0, steady_round_secs=5.0)
  first_round["warm"].update(start_to_round1_end_secs=25.0, steady_round_secs=5.0)
  pytorch["torch"]["tuned"]["steady_round_secs"] = 26.0
  table = speed_table.build_table(first_round, pytorch, num_rounds=40)
  assert table["goals_met"] == {"start_to_round1_end_cold_secs": True,
                                "start_to_round1_end_warm_secs": False,
                                "steady_round_secs": False,
                                "end_to_end_40_rounds_secs": False,  # 2 + 10 + 60 + 30 + 39 * 5 = 297
                                "tuned_steady_state_speedup": True}  # 26 / 5 = 5.2
  assert "goals met: " in speed_table.markdown(table)
  assert "(set for" not in speed_table.markdown(table)


def test_halves_of_different_configs_are_refused():
  first_round, pytorch = _reports()
  pytorch["overrides"] = ["local.epochs=1"]
  with pytest.raises(ValueError, match="both halves must time the same config"):
    speed_table.build_table(first_round, pytorch, num_rounds=5)
  first_round, pytorch = _reports()
  pytorch["machine"] = {"torch_device": "cuda"}  # an engine on the CPU beside torch on a GPU
  with pytest.raises(ValueError, match="same kind of device"):
    speed_table.build_table(first_round, pytorch, num_rounds=5)
  pytorch["machine"] = {"torch_device": "cpu"}
  assert speed_table.build_table(first_round, pytorch, num_rounds=5)["backend"] == "cpu"
  first_round, pytorch = _reports(num_rounds=40)
  with pytest.raises(ValueError, match="num_rounds"):
    speed_table.build_table(first_round, pytorch, num_rounds=5)


def test_main_builds_the_table_from_files(tmp_path):
  first_round, pytorch = _reports()
  (tmp_path / "fr.json").write_text(json.dumps(first_round))
  (tmp_path / "pt.json").write_text(json.dumps(pytorch))
  report = speed_table.main(["--first-round", str(tmp_path / "fr.json"),
                             "--pytorch", str(tmp_path / "pt.json"),
                             "--out", str(tmp_path / "table.json")])
  saved = json.loads((tmp_path / "table.json").read_text())
  assert saved["table"]["num_rounds"] == 5  # digits_fcclplus_quick's num_rounds, from the config
  assert saved["markdown"] == report["markdown"]
  assert saved["first_round"] == first_round and saved["pytorch_reference"] == pytorch


@pytest.mark.slow
def test_one_command_runs_both_halves(tmp_path):
  """The whole run on a tiny FCCL+ config: first_round.py cold and warm, then the torch loops."""
  pytest.importorskip("torch", reason="torch is not installed (pip install '.[bench]')")
  tiny = ["scenario.private_sizes.mnist=12", "scenario.private_sizes.usps=9",
          "scenario.private_sizes.svhn=20", "scenario.private_sizes.syn=16",
          "scenario.public_size=24", "collaborative.batch_size=16", "local.batch_size=8",
          "local.epochs=1", "num_rounds=2"]
  report = speed_table.main(["--config=digits_fcclplus_quick", *[f"--set={s}" for s in tiny],
                             "--rounds", "1", "--flavours=tuned",
                             "--out", str(tmp_path / "table.json")])
  table = report["table"]
  assert table["num_rounds"] == 2 and list(table["torch"]) == ["tuned"]
  assert report["first_round"]["warm"]["trace_cache"] == "hit"  # the warm process used the cache
  assert report["pytorch_reference"]["sizes"]["private_sizes"] == [12, 9, 20, 16]
  speedup = table["torch"]["tuned"]["engine_vs_pytorch_speedup"]["steady_state"]
  assert speedup == pytest.approx(table["torch"]["tuned"]["steady_round_secs"]
                                  / table["engine"]["steady_round_secs"])

"""benchmarks/first_round.py's CPU-time accounting and round fingerprint, and
benchmarks/xla_cpu_options.py, which compares option sets by them."""

import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import benchmark_scripts


first_round = benchmark_scripts.load("first_round")
xla_cpu_options = benchmark_scripts.load("xla_cpu_options")


def _state(weight=1.0, seed=0):
  return {"params": {"w": jnp.full((3, 2), weight, jnp.float32), "b": jnp.zeros(2)},
          "round": jnp.int32(4), "key": jax.random.key(seed)}


def test_state_sha256_is_equal_for_equal_bits_and_differs_for_one_ulp_or_another_key():
  reference = first_round.state_sha256(_state())
  assert first_round.state_sha256(_state()) == reference
  one_ulp = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
  assert first_round.state_sha256(_state(weight=one_ulp)) != reference
  assert first_round.state_sha256(_state(seed=1)) != reference


def test_cpu_clock_books_cpu_time_not_wall_time_to_each_phase():
  clock = first_round._CpuClock()  # pylint: disable=protected-access
  time.sleep(0.3)
  clock.lap("sleeping")
  start = time.process_time()
  while time.process_time() - start < 0.3:  # 0.3 s of this process's CPU time
    pass
  clock.lap("spinning")
  assert clock.secs["spinning"] >= 0.3 > clock.secs["sleeping"]
  assert clock.secs["import"] > 0  # the process's CPU time before the clock started
  assert sum(clock.secs.values()) == pytest.approx(time.process_time(), abs=0.05)


def test_an_option_set_runs_first_round_cold_with_its_flags_added(monkeypatch, tmp_path):
  calls = []

  def fake_run(command, check, env):
    calls.append((command, env["XLA_FLAGS"]))
    out = pathlib.Path(command[command.index("--out") + 1])
    out.write_text(json.dumps({"cold": {"compile_secs": 50.0, "first_round_secs": 40.0,
                                        "round1_state_sha256": "ab", "steady_round_secs": 30.0,
                                        "stablehlo_lines": 9}}))

  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY")
  monkeypatch.setattr(xla_cpu_options.subprocess, "run", fake_run)
  row = xla_cpu_options.run_option_set("digits_fcclplus_quick", "--xla_backend_optimization_level=1",
                                       2, ["num_rounds=3"])
  (command, flags), = calls
  assert flags == ("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY "
                   "--xla_backend_optimization_level=1")
  assert "--skip-warm" in command and command[command.index("--rounds") + 1] == "2"
  assert command[command.index("--set") + 1] == "num_rounds=3"
  assert row == {"flags": "--xla_backend_optimization_level=1", "compile_secs": 50.0,
                 "first_round_secs": 40.0, "steady_round_secs": 30.0,
                 "round1_state_sha256": "ab"}  # the kept figures only


def test_each_row_says_whether_it_keeps_the_default_sets_bits(monkeypatch, tmp_path):
  hashes = {"": "same", "--xla_backend_optimization_level=1": "other"}
  monkeypatch.setattr(xla_cpu_options, "run_option_set",
                      lambda config, flags, rounds, overrides: {"flags": flags,
                                                                "round1_state_sha256": hashes.get(
                                                                    flags, "same")})
  out = tmp_path / "options.json"
  monkeypatch.setattr(sys, "argv", ["xla_cpu_options.py", "--options",
                                    "default,backend_optimization_level_1,"
                                    "copy_insertion_region_analysis", "--out", str(out)])
  xla_cpu_options.main()
  rows = json.loads(out.read_text())["rows"]
  assert "same_bits_as_default" not in rows["default"]
  assert rows["backend_optimization_level_1"]["same_bits_as_default"] is False
  assert rows["copy_insertion_region_analysis"]["same_bits_as_default"] is True


def test_an_unknown_option_set_is_refused_with_the_allowed_names(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["xla_cpu_options.py", "--options", "default,fastest"])
  with pytest.raises(SystemExit):
    xla_cpu_options.main()
  error = capsys.readouterr().err
  assert "--options: unknown option sets ['fastest']" in error and "opt_preset_fast_compile" in error

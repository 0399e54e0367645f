"""A run that survives: one process per workdir, strict JSON records, divergence stopped, a bad
latest checkpoint survived."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import chex
import pytest

from fedjax_het import reporting
from fedjax_het import workdir as workdir_lib
from fedjax_het.config import validate_config
from fedjax_het.errors import ConfigError, DivergedError, WorkdirError
from fedjax_het.train import train_and_evaluate
from tests.test_train import copy_run, solo_config

REPO = pathlib.Path(__file__).resolve().parents[1]


_HOLDER = """
import sys, time
sys.path.insert(0, {repo!r})
from fedjax_het import workdir as workdir_lib
with workdir_lib.WorkdirLock(__import__("pathlib").Path({workdir!r})):
  print("locked", flush=True)
  time.sleep(120)
"""


def test_a_second_process_is_refused_naming_the_holder_and_a_killed_holder_frees_it(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", _HOLDER.format(repo=str(REPO),
                                                                  workdir=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirError, match=rf"is in use by PID {holder.pid} on .* since "):
      with workdir_lib.WorkdirLock(tmp_path):
        pass
    with pytest.raises(WorkdirError, match="is in use by PID"):  # the trainer takes it too
      train_and_evaluate(solo_config(), tmp_path)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "run.json").exists()
  finally:
    holder.kill()
    holder.wait()
  with workdir_lib.WorkdirLock(tmp_path) as lock:  # the kernel released the dead holder's lock
    assert f"PID {os.getpid()}" in lock.path.read_text()


def test_the_lock_is_exclusive_within_a_process_and_released_on_exit(tmp_path):
  with workdir_lib.WorkdirLock(tmp_path):
    with pytest.raises(WorkdirError, match="in use"):
      workdir_lib.WorkdirLock(tmp_path).__enter__()
  with workdir_lib.WorkdirLock(tmp_path):
    pass


def test_non_finite_values_are_written_as_null_and_named(tmp_path):
  writer = reporting.MetricsWriter(tmp_path)
  writer.write({"round": 1, "train/loss": math.nan, "eval/accuracy/mean": 10.0,
                "train/gc": -math.inf})
  line = (tmp_path / "metrics.jsonl").read_text()
  assert "NaN" not in line and "Infinity" not in line
  assert json.loads(line) == {"round": 1, "train/loss": None, "eval/accuracy/mean": 10.0,
                              "train/gc": None, "nonfinite": ["train/gc", "train/loss"]}
  assert reporting.strict_json({"a": [1.0, math.inf]}) == '{"a": [1.0, null]}'


@pytest.mark.parametrize("lr", [math.inf, math.nan, -1.0])
def test_non_finite_hyper_parameters_are_refused(lr):
  config = solo_config()
  config.local.lr = lr
  with pytest.raises(ConfigError, match="config.local.lr"):
    validate_config(config)


def test_divergence_stops_the_run_naming_the_round_and_keeps_the_last_finite_checkpoint(
    tmp_path):
  config = solo_config()
  config.local.lr = 1e38
  with pytest.raises(DivergedError, match=r"train/local/\w+/\w+ is (nan|inf) in round 1 .*the "
                                          r"last finite checkpoint is round 0"):
    train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records[-1]["round"] == 1 and records[-1]["nonfinite"]
  assert workdir_lib.read_metadata(tmp_path) and not (tmp_path / "results.json").exists()
  from fedjax_het import checkpointing  # pylint: disable=import-outside-toplevel
  assert checkpointing.Checkpointer(tmp_path / "checkpoints").rounds() == [0]
  config.on_nonfinite = "warn"   # an output-only field: the same workdir trains on
  out = train_and_evaluate(config, tmp_path)
  assert out["rounds_done"] == 3


def _scramble(step_dir: pathlib.Path) -> None:
  for path in step_dir.rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"\x00garbage" * 4)


@pytest.mark.slow  # about 16 s on 2 cores; the digest test below falls back the same way
def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
  config = solo_config()
  full = train_and_evaluate(config, tmp_path / "full")
  train_and_evaluate(config, tmp_path / "split", max_rounds=2)
  _scramble(tmp_path / "split" / "checkpoints" / "2")
  time.sleep(0.1)
  resumed = train_and_evaluate(config, tmp_path / "split")
  assert "the checkpoint of round 2" in caplog.text and "cannot be restored" in caplog.text
  chex.assert_trees_all_equal(resumed["state"], full["state"])
  assert ((tmp_path / "split" / "results.json").read_text()
          == (tmp_path / "full" / "results.json").read_text())


@pytest.mark.slow  # stacks two seeds (about 25 s on 2 cores); the single run's test is above
def test_divergence_of_stacked_seeds_names_the_seed(tmp_path):
  config = solo_config()
  config.local.lr = 1e38
  config.seeds = (0, 1)
  with pytest.raises(DivergedError, match=r"^seed 0: train/local/.* in round 1 "):
    train_and_evaluate(config, tmp_path)


@pytest.mark.parametrize("args,expected", [
    (["--config=digits_solo_quick", "--config.num_round=3"], 'Did you mean "num_rounds"'),
    (["--config=digits_solo_quick", "--config.num_rounds=abc"], "--config.num_rounds=abc"),
    (["--config=digits_solo_quick", "--config.local.lr=abc"],
     "could not convert string to float: 'abc' (run with --verbose"),  # the closing quote
    (["--config=fedjax_het/configs/digits.py:nosuch"], "got 'nosuch'"),
    (["--config=fedjax_het/configs/nofile.py"], "no config file 'fedjax_het/configs/nofile.py'"),
    (["--config=digits_solo_quick", "--num_rounds=3"], "prefix: --config.num_rounds=..."),
    (["--config=digits_solo_quick", "--config.scenario.private_sizes.mnist=-5"],
     "config.scenario.private_sizes.mnist must be an integer >= 1"),
])
def test_flag_and_config_file_mistakes_are_one_line(args, expected, tmp_path):
  out = subprocess.run([sys.executable, "experiments/train.py", *args,
                        f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items()
                                         if k != "FEDJAX_HET_TRACEBACK"})
  assert out.returncode == 1
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flag", ["--help", "--helpshort", "--helpfull"])
def test_asking_for_the_usage_is_a_success(flag):
  out = subprocess.run([sys.executable, "experiments/train.py", flag], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert "--config" in out.stdout + out.stderr


@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_sigterm_and_ctrl_c_stop_the_run_with_one_line_and_a_rerun_resumes(tmp_path):
  """SIGTERM after round 1, then the same command resumes and Ctrl-C (SIGINT) stops it
  again: each stop is exit 130 and one line naming the round and the checkpoint."""
  from fedjax_het import checkpointing  # pylint: disable=import-outside-toplevel
  # The second run reads the first one's compiled programs from the cache.
  args = [sys.executable, "experiments/train.py", "--config=digits_solo_quick",
          f"--workdir={tmp_path / 'run'}", "--config.num_rounds=40", "--config.local.epochs=1",
          "--config.models.architectures=('simple_cnn',)", "--config.scenario.test_size=30",
          "--config.scenario.public_size=64",
          f"--config.compilation_cache_dir={tmp_path / 'cache'}", "--config.logging.plots=False"]
  env = {k: v for k, v in os.environ.items() if k not in ("FEDJAX_HET_TRACEBACK",
                                                          "FEDJAX_HET_DATA_DIR")}
  stopped_at = 0
  for stop_signal in (signal.SIGTERM, signal.SIGINT):
    child = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
    resumed = False
    for line in child.stderr:
      resumed |= f"resumed from the checkpoint of round {stopped_at}" in line
      if f"round {stopped_at + 1}/40" in line:
        break
    child.send_signal(stop_signal)
    rest = child.stderr.read()
    assert child.wait(timeout=120) == 130
    stops = [re.match(r"stopped at round (\d+); rerun the same command to resume from the "
                      r"checkpoint of round (\d+) in ", line) for line in rest.splitlines()]
    stops = [m for m in stops if m]
    assert len(stops) == 1 and "Traceback" not in rest, rest
    assert resumed == (stopped_at > 0)
    stopped_at = checkpointing.Checkpointer(tmp_path / "run" / "checkpoints").latest_round()
    assert stopped_at == int(stops[0].group(2)) >= 1


# -- the checkpoint is the run's source of truth ---------------------------------------------


@pytest.fixture(name="full_run", scope="module")
def _full_run(tmp_path_factory):
  """An uninterrupted 3-round tiny SOLO run: the reference of the resumes below."""
  workdir = tmp_path_factory.mktemp("full")
  return workdir, train_and_evaluate(solo_config(), workdir)


@pytest.fixture(name="two_rounds", scope="module")
def _two_rounds(tmp_path_factory):
  """The same run stopped after round 2 (`max_rounds=2`): the tests below resume a copy of it
  (`copy_run`)."""
  workdir = tmp_path_factory.mktemp("two_rounds")
  train_and_evaluate(solo_config(), workdir, max_rounds=2)
  return workdir


@pytest.mark.parametrize("damage", ["cut_first_line", pytest.param("deleted",
                                                                    marks=pytest.mark.slow)])
def test_damaged_or_missing_metrics_are_rebuilt_from_the_checkpoint(tmp_path, caplog, full_run,
                                                                   two_rounds, damage):
  reference, _ = full_run
  config = solo_config()
  copy_run(two_rounds, tmp_path)
  metrics = tmp_path / "metrics.jsonl"
  if damage == "deleted":
    metrics.unlink()
  else:  # round 1's line cut in half: round 2's line after it still parses
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0][:len(lines[0]) // 2] + "\n" + lines[1] + "\n")
  train_and_evaluate(config, tmp_path)
  assert "rebuilt from the 2 records of the checkpoint of round 2" in caplog.text
  assert ((tmp_path / "results.json").read_text()
          == (reference / "results.json").read_text())
  got, want = (reporting.MetricsWriter(w, enabled=False).read() for w in (tmp_path, reference))
  assert [r["round"] for r in got] == [1, 2, 3]
  for record in got + want:
    record.pop("time/round_secs")
  assert got == want


def test_the_run_identity_is_checked_against_the_checkpoint_without_run_json(tmp_path):
  train_and_evaluate(solo_config(), tmp_path, max_rounds=1)
  (tmp_path / "run.json").unlink()
  before = sorted(p.name for p in tmp_path.iterdir())
  with pytest.raises(WorkdirError, match=r"(?s)different config or data.*config\.seed: 0 -> 1"):
    train_and_evaluate(solo_config(seed=1), tmp_path)
  assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_results_without_checkpoints_are_kept_unless_overwrite(tmp_path, full_run):
  reference, _ = full_run
  config = solo_config()
  copy_run(reference, tmp_path)  # a finished run
  (tmp_path / "results.json").write_text('{"kept": 1}\n')
  for path in sorted((tmp_path / "checkpoints").rglob("*"), reverse=True):
    path.rmdir() if path.is_dir() else path.unlink()
  with pytest.raises(WorkdirError, match="holds results.json and metrics.jsonl of a run but no "
                                         "checkpoint.*--config.overwrite=True"):
    train_and_evaluate(config, tmp_path)
  assert (tmp_path / "results.json").read_text() == '{"kept": 1}\n'
  config.overwrite = True  # an output-only field
  train_and_evaluate(config, tmp_path)
  assert ((tmp_path / "results.json").read_text()
          == (reference / "results.json").read_text())
  assert [r["round"] for r in reporting.MetricsWriter(tmp_path).read()] == [1, 2, 3]


def test_a_run_cannot_be_shortened_below_its_checkpoint(tmp_path, two_rounds):
  copy_run(two_rounds, tmp_path)
  with pytest.raises(WorkdirError, match="checkpoint of round 2, beyond the 1 rounds"):
    train_and_evaluate(solo_config(num_rounds=1, resume_allow_changes="num_rounds"),
                       tmp_path)


def test_a_checkpoint_of_one_unnamed_item_restores_without_a_record(tmp_path):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from fedjax_het import checkpointing  # pylint: disable=import-outside-toplevel
  manager = ocp.CheckpointManager(tmp_path.absolute())
  manager.save(3, args=ocp.args.StandardSave({"w": np.arange(4.0, dtype=np.float32)}))
  manager.wait_until_finished()
  manager.close()
  checkpointer = checkpointing.Checkpointer(tmp_path)
  like = {"w": np.zeros(4, np.float32)}
  np.testing.assert_array_equal(checkpointer.restore(3, like)["w"], np.arange(4.0))
  assert checkpointer.run_record(3) is None
  checkpointer.save(4, {"w": np.ones(4, np.float32)}, {"identity": {"a": 1}, "records": []})
  checkpointer.close()
  checkpointer = checkpointing.Checkpointer(tmp_path)
  assert checkpointer.rounds() == [3, 4]
  record = checkpointer.run_record(4)
  assert record.pop(checkpointing.RUN_DIGEST_KEY) == checkpointing.run_digest(record)
  assert record.pop(checkpointing.DIGEST_KEY) == checkpointing.state_digest(
      {"w": np.ones(4, np.float32)})
  assert record == {"identity": {"a": 1}, "records": []}
  np.testing.assert_array_equal(checkpointer.restore(4, like)["w"], np.ones(4))
  assert workdir_lib.checkpoint_identity(checkpointer) == ({"a": 1}, 4)
  checkpointer.close()


def test_os_errors_are_one_line_naming_the_path():
  import errno  # pylint: disable=import-outside-toplevel
  from fedjax_het.errors import os_error_line  # pylint: disable=import-outside-toplevel
  full = OSError(errno.ENOSPC, "No space left on device", "/runs/a/metrics.jsonl")
  assert os_error_line(full) == (
      "no space left on the device writing '/runs/a/metrics.jsonl'; free some space and rerun "
      "the same command to resume from the latest checkpoint.")
  denied = PermissionError(errno.EACCES, "Permission denied", "/ro/w")
  assert os_error_line(denied) == (
      "cannot use '/ro/w': Permission denied; pass a --workdir you can write to.")


@pytest.mark.parametrize("size", [0, -5])
def test_private_sizes_below_one_are_refused(size):
  config = solo_config()
  config.scenario.private_sizes.mnist = size
  with pytest.raises(ConfigError, match=r"config.scenario.private_sizes.mnist must be an "
                                        r"integer >= 1 .*got -?\d"):
    validate_config(config)


def test_a_run_without_public_data_trains_without_its_diagnostics(tmp_path):
  out = train_and_evaluate(solo_config(**{"scenario.public_size": 0}), tmp_path)
  assert out["rounds_done"] == 3 and not (tmp_path / "cross_correlation.npz").exists()


def test_changed_bytes_in_a_checkpoint_are_caught_by_its_digest(tmp_path, caplog, full_run,
                                                                two_rounds):
  reference, want = full_run
  config = solo_config()
  copy_run(two_rounds, tmp_path)
  # Flip bits inside the largest array file of round 2: orbax itself reads it without error.
  files = [p for p in (tmp_path / "checkpoints" / "2" / "state").rglob("*") if p.is_file()]
  target = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  for offset in (len(data) // 2, len(data) // 2 + 1, 2 * len(data) // 3):
    data[offset] ^= 0x40
  target.write_bytes(bytes(data))
  resumed = train_and_evaluate(config, tmp_path)
  assert "do not match their SHA-256" in caplog.text and "round 2" in caplog.text
  chex.assert_trees_all_equal(resumed["state"], want["state"])
  assert ((tmp_path / "results.json").read_text()
          == (reference / "results.json").read_text())

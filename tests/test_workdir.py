"""A workdir resumes only the run it holds; bad sizes and workdirs fail in the first seconds."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError, UserError, WorkdirError
from fedjax_het.experiment import Experiment
from fedjax_het.train import train_and_evaluate
from tests.test_train import REPO, tiny_config  # noqa: F401  (its autouse fixture too)
from tests.test_train import TINY_DATA_FLAGS
from tests.test_train import _shared_cache  # noqa: F401  pylint: disable=unused-import


def _snapshot(workdir):
  """Bytes of every file a refused resume must leave alone."""
  return {p.relative_to(workdir): p.read_bytes() for p in sorted(workdir.rglob("*"))
          if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 2-round tiny run (no real data directory: synthetic domains).

  Module-scoped; the tests below that use it run in file order and only the
  last one (the num_rounds extension) changes it.
  """
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    workdir = tmp_path_factory.mktemp("finished")
    config = tiny_config(num_rounds=2)
    result = train_and_evaluate(config, workdir)
  return config, workdir, result


@pytest.mark.parametrize("field, value", [("seed", 1), ("models.width", 0.25),
                                          ("local.lr", 0.5)])
def test_resume_with_a_changed_config_is_refused_and_writes_nothing(finished_run, field, value):
  config, workdir, _ = finished_run
  before = _snapshot(workdir)
  changed = tiny_config(**{"num_rounds": 2, field: value})
  with pytest.raises(WorkdirError) as error:
    train_and_evaluate(changed, workdir)
  message = str(error.value)
  old = workdir_lib.flatten_config(config)[field]
  assert f"config.{field}: {old!r} -> {value!r}" in message
  assert "--workdir" in message and "resume_allow_changes" in message
  assert _snapshot(workdir) == before


def test_resume_with_different_data_is_refused(finished_run, monkeypatch):
  config, workdir, _ = finished_run
  before = _snapshot(workdir)
  build = experiment_lib.build_scenario

  def one_pixel_changed(cfg):
    scenario = build(cfg)
    images = scenario.train[0].images.copy()
    images[0, 0, 0, 0] ^= 1
    train = (dataclasses.replace(scenario.train[0], images=images),) + scenario.train[1:]
    return dataclasses.replace(scenario, train=train)

  monkeypatch.setattr(experiment_lib, "build_scenario", one_pixel_changed)
  with pytest.raises(WorkdirError, match="the data differ .*same sources, different contents"):
    train_and_evaluate(config, workdir)
  assert _snapshot(workdir) == before


def test_neutral_fields_resume_and_named_fields_extend_the_run(finished_run, tmp_path):
  config, workdir, result = finished_run
  # Output-only fields may change: the finished run is resumed, nothing retrained.
  same = train_and_evaluate(tiny_config(**{"num_rounds": 2, "logging.plots": True,
                                           "eval.last_rounds": 1}), workdir)
  assert [r["round"] for r in same["records"]] == [1, 2]
  assert same["records"][-1] == result["records"][-1]
  # Extending a run needs the explicit flag; with it rounds 3-4 train on top of round 2.
  longer = tiny_config(num_rounds=4)
  with pytest.raises(WorkdirError, match=r"config.num_rounds: 2 -> 4"):
    train_and_evaluate(longer, workdir)
  longer.resume_allow_changes = "num_rounds"
  extended = train_and_evaluate(longer, workdir)
  assert [r["round"] for r in extended["records"]] == [1, 2, 3, 4]
  assert json.loads((workdir / "run.json").read_text())["config"]["num_rounds"] == 4


def test_a_restored_state_lowers_to_the_program_of_a_fresh_one(tmp_path):
  """A resume must hit the persistent compilation cache: same lowered text, same cache key."""
  from fedjax_het import checkpointing  # pylint: disable=g-import-not-at-top
  experiment = Experiment(tiny_config())
  state = experiment.init_state()
  saver = checkpointing.Checkpointer(tmp_path / "checkpoints")
  saver.save(0, state)
  saver.close()
  restored = experiment.restore_state(checkpointing.Checkpointer(tmp_path / "checkpoints"), 0)
  fresh = experiment.run_rounds.lower(state, experiment.data).as_text()
  assert experiment.run_rounds.lower(restored, experiment.data).as_text() == fresh


def test_differences_cover_prefixes_and_absent_fields():
  old = {"config": {"a.b": 1, "a.c": 2, "d": 3}, "data": {"fingerprint": "x", "sources": {}}}
  new = {"config": {"a.b": 5, "a.c": 2, "e": 4}, "data": {"fingerprint": "x", "sources": {}}}
  assert workdir_lib.differences(old, new, ()) == [
      "config.a.b: 1 -> 5", "config.d: 3 -> '<absent>'", "config.e: '<absent>' -> 4"]
  assert workdir_lib.differences(old, new, ("a", "d", "e")) == []
  assert workdir_lib.differences(old, new, ("a.b.c", "ab", "d", "e")) == ["config.a.b: 1 -> 5"]


def test_fields_added_since_a_record_are_differences_only_at_values_that_change_it():
  data = {"fingerprint": "x", "sources": {}}
  old = {"config": {"local.lr": 0.1}, "data": data}

  def lines(**fields):
    return workdir_lib.differences(old, {"config": {"local.lr": 0.1, **fields}, "data": data}, ())

  assert lines(**{"fedfusion.conv_init": "torch", "local.momentum": 0.0,
                  "local.min_lr": 1e-4, "fcclplus.pretrain_epochs": 5}) == []
  assert lines(**{"fedfusion.conv_init": "identity"}) == [
      "config.fedfusion.conv_init: '<absent>' -> 'identity'"]
  assert lines(**{"local.momentum": 0.9}) == ["config.local.momentum: '<absent>' -> 0.9"]
  assert lines(**{"not.a.known.field": 1}) == ["config.not.a.known.field: '<absent>' -> 1"]
  # A recorded value is compared as before, even for those fields.
  recorded = {"config": {"local.momentum": 0.0}, "data": data}
  assert workdir_lib.differences(recorded, {"config": {"local.momentum": 0.5}, "data": data},
                                 ()) == ["config.local.momentum: 0.0 -> 0.5"]


def test_a_changed_source_with_the_same_synthetic_stand_in_is_the_same_run(tmp_path):
  def record(source, provenance):
    return {"config": {"scenario.sources.svhn": source},
            "data": {"fingerprint": "x", "sources": {"svhn": provenance}}}

  tfds = record("tfds", "synthetic(seed=0; substituted for 'tfds')")
  assert workdir_lib.differences(
      tfds, record("real", "synthetic(seed=0; substituted for 'real')"), ()) == []
  for provenance in ("synthetic(seed=1; substituted for 'real')", "npz:/d/digits.npz[svhn]"):
    assert workdir_lib.differences(tfds, record("real", provenance), ()) == [
        "config.scenario.sources.svhn: 'tfds' -> 'real'"]
  # The runner's check of a finished cell reads the bundle's keys instead of the data:
  # the stand-in without a digits.npz holding svhn, the real domain with one.
  from fedjax_het.data import scenarios  # pylint: disable=import-outside-toplevel
  check = lambda source, **kw: scenarios.is_synthetic_stand_in(  # noqa: E731
      "svhn", source, data_dir=tmp_path, **kw)
  assert check("real", synthetic_fallback=True) and check("synthetic", synthetic_fallback=False)
  assert check("real", synthetic_fallback=False) is None and check("tfds",
                                                                   synthetic_fallback=True) is None
  np.savez(tmp_path / "digits.npz", **{f"svhn_{s}_{k}": np.zeros((1, 32, 32, 3) if k == "x"
                                                                  else (1,), np.uint8)
                                       for s in ("train", "test") for k in "xy"})
  assert check("real", synthetic_fallback=True) is False


def test_a_workdir_that_is_a_file_is_named(tmp_path):
  path = tmp_path / "results"
  path.write_text("not a directory")
  with pytest.raises(WorkdirError, match="exists and is not a directory"):
    train_and_evaluate(tiny_config(), path)


def test_a_batch_larger_than_every_client_fails_before_compiling():
  with pytest.raises(ConfigError, match=r"config.local.batch_size must be at most the largest "
                     r"participant's data \(40 rows\), got 100000"):
    Experiment(tiny_config(**{"local.batch_size": 100000}))


def test_clients_smaller_than_a_batch_or_the_classes_are_named(caplog):
  config = tiny_config()
  config.scenario.private_sizes.mnist = 3
  with caplog.at_level(logging.WARNING):
    Experiment(config)
  text = caplog.text
  assert "fewer rows than config.local.batch_size=16" in text and "mnist (3)" in text
  assert "fewer rows than the 10 classes" in text
  assert "config.scenario.private_sizes.mnist" in text


def test_user_errors_are_value_errors_where_they_were():
  assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, UserError)
  assert issubclass(resources.RoundTooLargeError, MemoryError)


def test_cli_prints_one_line_for_a_user_error_and_a_traceback_when_verbose(tmp_path):
  # tiny_config's data sizes: the synthetic data are generated in seconds.
  args = [sys.executable, "experiments/train.py", "--config=digits_fcclplus_quick",
          "--config.local.batch_size=100000", "--config.compilation_cache_dir=",
          *TINY_DATA_FLAGS, f"--workdir={tmp_path / 'run'}"]
  env = {k: v for k, v in os.environ.items() if k != "FEDJAX_HET_DATA_DIR"}
  quiet = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
  assert quiet.returncode == 1
  assert "Traceback" not in quiet.stderr
  last = quiet.stderr.strip().splitlines()[-1]
  assert last.startswith("error: config.local.batch_size must be at most"), quiet.stderr[-2000:]
  assert not (tmp_path / "run").exists()  # refused before the workdir was made
  loud = subprocess.run(args + ["--verbose"], cwd=REPO, capture_output=True, text=True,
                        timeout=600, env=env)
  assert loud.returncode != 0 and "Traceback" in loud.stderr and "ConfigError" in loud.stderr


def test_data_fingerprint_sees_one_pixel_and_one_label():
  experiment_free = tiny_config()
  scenario = experiment_lib.build_scenario(experiment_free)
  base = workdir_lib.data_fingerprint(scenario)
  assert workdir_lib.data_fingerprint(experiment_lib.build_scenario(experiment_free)) == base
  labels = scenario.train[1].labels.copy()
  labels[0] = (labels[0] + 1) % 10
  train = list(scenario.train)
  train[1] = dataclasses.replace(train[1], labels=labels)
  changed = dataclasses.replace(scenario, train=tuple(train))
  assert workdir_lib.data_fingerprint(changed) != base
  assert np.array_equal(scenario.train[1].labels[1:], labels[1:])


def test_atomic_writes_leave_no_temporary_and_metrics_survive_a_cut_line(tmp_path):
  from fedjax_het import reporting  # pylint: disable=g-import-not-at-top
  path = tmp_path / "x.json"
  workdir_lib.write_atomic(path, "old")
  workdir_lib.write_atomic(path, "new")
  assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
  workdir_lib.savez_atomic(tmp_path / "m.npz", round_1=np.arange(3))
  with np.load(tmp_path / "m.npz") as stored:
    np.testing.assert_array_equal(stored["round_1"], np.arange(3))
  writer = reporting.MetricsWriter(tmp_path)
  writer.write({"round": 1, "a": 1.0})
  writer.write({"round": 2, "a": 2.0})
  with writer.path.open("a") as f:
    f.write('{"round": 3, "a": 3.')  # a kill in the middle of appending round 3
  assert writer.truncate_after(2) == [{"round": 1, "a": 1.0}, {"round": 2, "a": 2.0}]
  assert writer.read() == [{"round": 1, "a": 1.0}, {"round": 2, "a": 2.0}]
  writer.path.write_text('{"round": 1, "a": 1.\n{"round": 2, "a": 2.0}\n')
  with pytest.raises(json.JSONDecodeError):  # damage before the last line is not hidden
    writer.read()


def test_a_failed_atomic_write_names_its_path_and_leaves_no_temporary(tmp_path, monkeypatch):
  import errno  # pylint: disable=import-outside-toplevel

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError) as error:
    workdir_lib.write_atomic(tmp_path / "config.json", "{}")
  assert error.value.errno == errno.ENOSPC
  assert error.value.filename == str(tmp_path / "config.json")
  assert list(tmp_path.iterdir()) == []  # no 0-byte .config.json.tmp


def test_overwrite_on_a_workdir_with_checkpoints_is_refused(finished_run):
  _, workdir, _ = finished_run
  before = _snapshot(workdir)
  with pytest.raises(WorkdirError, match=r"holds the checkpoints of a run \(the latest is round "
                                         r"\d+\); --config.overwrite=True replaces only .*never "
                                         r"checkpoints: rerun without it"):
    train_and_evaluate(tiny_config(num_rounds=2, overwrite=True), workdir)
  assert _snapshot(workdir) == before

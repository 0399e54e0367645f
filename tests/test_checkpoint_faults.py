"""A checkpoint's run item (identity and records) under its digest, and the fallback that moves
unreadable checkpoints aside instead of deleting them."""

from __future__ import annotations

import json
import logging
import pathlib
import re

import chex
import pytest

from fedjax_het import checkpointing, reporting
from fedjax_het.errors import WorkdirError
from fedjax_het.train import train_and_evaluate
from tests.test_train import copy_run, solo_config
from tests.test_train import _shared_cache  # noqa: F401  pylint: disable=unused-import


@pytest.fixture(name="full_run", scope="module")
def _full_run(tmp_path_factory):
  """An uninterrupted 3-round tiny SOLO run: the reference of the resumes below."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    workdir = tmp_path_factory.mktemp("full")
    return workdir, train_and_evaluate(solo_config(), workdir)


@pytest.fixture(name="two_rounds", scope="module")
def _two_rounds(tmp_path_factory):
  """The same run stopped after round 2 (`max_rounds=2`): the tests below damage a copy of it
  (`copy_run`) and resume it."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    workdir = tmp_path_factory.mktemp("two_rounds")
    train_and_evaluate(solo_config(), workdir, max_rounds=2)
    return workdir


def _run_item(workdir: pathlib.Path, round_index: int) -> pathlib.Path:
  return workdir / "checkpoints" / str(round_index) / "run" / "metadata"


def _flip_digit_after(path: pathlib.Path, marker: str) -> tuple[str, str]:
  """Flips the lowest bit of one digit of the number after `marker` in `path` (a digit stays
  a digit, so the JSON stays valid): the first after the decimal point, else the last;
  (the number before, after)."""
  text = path.read_text()
  match = re.compile(re.escape(marker) + r"(-?[0-9.e+-]+)").search(text)
  assert match, marker
  number = match.group(1)
  digit = number.index(".") + 1 if "." in number else len(number) - 1
  end = match.start(1) + digit
  flipped = text[:end] + chr(ord(text[end]) ^ 1) + text[end + 1:]
  path.write_text(flipped)
  json.loads(flipped)  # still valid JSON
  return number, flipped[match.start(1):match.end(1)]


def _metrics(workdir):
  records = reporting.MetricsWriter(workdir, enabled=False).read()
  for record in records:
    record.pop("time/round_secs")
  return records


def _assert_same_run(workdir, reference, want):
  assert ((workdir / "results.json").read_text()
          == (reference / "results.json").read_text())
  assert _metrics(workdir) == _metrics(reference)
  chex.assert_trees_all_equal(want, train_and_evaluate(solo_config(), workdir)["state"])


def test_a_flipped_digit_in_a_record_of_the_checkpoint_is_caught_and_not_trusted(
    tmp_path, caplog, full_run, two_rounds):
  reference, want = full_run
  copy_run(two_rounds, tmp_path)
  before, after = _flip_digit_after(_run_item(tmp_path, 2), '"round": 1, "train/local/ce/mnist": ')
  assert before != after
  caplog.set_level(logging.WARNING)
  train_and_evaluate(solo_config(), tmp_path)
  assert "the checkpoint of round 2" in caplog.text and "run item" in caplog.text
  assert "not the checkpoint's record" not in caplog.text  # metrics.jsonl was right
  moved = tmp_path / "checkpoints" / "unreadable" / "2"
  assert moved.is_dir() and str(moved) in caplog.text
  _assert_same_run(tmp_path, reference, want["state"])


def test_a_flipped_seed_in_the_identity_of_the_checkpoint_falls_back_to_the_one_before(
    tmp_path, caplog, full_run, two_rounds):
  reference, want = full_run
  copy_run(two_rounds, tmp_path)
  assert _flip_digit_after(_run_item(tmp_path, 2), '"seed": ') == ("0", "1")
  caplog.set_level(logging.WARNING)
  train_and_evaluate(solo_config(), tmp_path)  # the unchanged command resumes
  assert "the checkpoint of round 2" in caplog.text and "run item" in caplog.text
  assert (tmp_path / "checkpoints" / "unreadable" / "2").is_dir()
  _assert_same_run(tmp_path, reference, want["state"])


def test_the_run_item_digest_covers_identity_records_and_the_state_digest(tmp_path):
  import numpy as np  # pylint: disable=import-outside-toplevel
  checkpointer = checkpointing.Checkpointer(tmp_path)
  state = {"w": np.arange(3.0, dtype=np.float32)}
  checkpointer.save(1, state, {"identity": {"seed": 0}, "records": [{"round": 1, "a": 0.5}]})
  checkpointer.close()
  document = json.loads((tmp_path / "1" / "run" / "metadata").read_text())
  assert document[checkpointing.RUN_DIGEST_KEY] == checkpointing.run_digest(document)
  for key, value in (("identity", {"seed": 1}), ("records", [{"round": 1, "a": 0.25}]),
                     (checkpointing.DIGEST_KEY, "0" * 64)):
    changed = dict(document, **{key: value})
    (tmp_path / "1" / "run" / "metadata").write_text(json.dumps(changed))
    with pytest.raises(checkpointing.CorruptCheckpointError, match="run item"):
      checkpointing.Checkpointer(tmp_path).run_record(1)


def test_an_unreadable_checkpoint_is_moved_aside_never_deleted(tmp_path, caplog, full_run,
                                                                two_rounds):
  reference, want = full_run
  copy_run(two_rounds, tmp_path)
  (_run_item(tmp_path, 2)).write_text("{")
  caplog.set_level(logging.WARNING)
  train_and_evaluate(solo_config(), tmp_path)
  moved = tmp_path / "checkpoints" / "unreadable" / "2"
  assert (moved / "run" / "metadata").read_text() == "{"
  assert (f"the checkpoint of round 2 in {tmp_path} cannot be restored" in caplog.text
          and f"moved to {moved}" in caplog.text
          and "resumes from the checkpoint of round 1" in caplog.text), caplog.text
  _assert_same_run(tmp_path, reference, want["state"])


def test_when_no_checkpoint_can_be_restored_none_is_moved_or_deleted(tmp_path, caplog,
                                                                     two_rounds):
  copy_run(two_rounds, tmp_path)
  for round_index in (1, 2):
    _run_item(tmp_path, round_index).write_text("{")
  before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "checkpoints").rglob("*"))
  caplog.set_level(logging.WARNING)
  with pytest.raises(WorkdirError, match=r"no checkpoint in .* can be restored \(round 2: .*; "
                                         r"round 1: .*\); none was moved or deleted"):
    train_and_evaluate(solo_config(), tmp_path)
  assert "the checkpoint before it" not in caplog.text
  assert sorted(p.relative_to(tmp_path)
                for p in (tmp_path / "checkpoints").rglob("*")) == before


def test_records_without_a_digest_never_replace_a_metrics_file_that_reads_cleanly(
    tmp_path, caplog, full_run, two_rounds):
  """A run item written without its digest (an older checkpoint) is unverified: a record that
  differs there does not overwrite metrics.jsonl, which reads cleanly and holds its rounds."""
  reference, want = full_run
  copy_run(two_rounds, tmp_path)
  item = _run_item(tmp_path, 2)
  document = json.loads(item.read_text())
  document.pop("run_sha256", None)
  item.write_text(json.dumps(document))
  _flip_digit_after(item, '"round": 1, "train/local/ce/mnist": ')
  caplog.set_level(logging.WARNING)
  train_and_evaluate(solo_config(), tmp_path)
  assert "carry no digest" in caplog.text and "metrics.jsonl is kept" in caplog.text
  _assert_same_run(tmp_path, reference, want["state"])


# -- a checkpoint write that fails: one error, no record past the last checkpoint ------------


def fail_checkpoint_writes(monkeypatch, round_index, make_error):
  """Makes orbax's background write of the checkpoint of `round_index` fail with
  `make_error(<its folder>)` once its data are written (where a real full disk fails it)."""
  from orbax.checkpoint._src.checkpointers import async_checkpointer  # pylint: disable=import-outside-toplevel
  from orbax.checkpoint._src.futures import future  # pylint: disable=import-outside-toplevel
  real = async_checkpointer._background_wait_for_commit_futures  # pylint: disable=protected-access

  def failing(directory, commit_futures, on_commit_callback, **kwargs):
    if pathlib.Path(str(directory)).name.split(".")[0] != str(round_index):
      return real(directory, commit_futures, on_commit_callback, **kwargs)
    future.ChainedFuture(commit_futures, cb=lambda: None).result(timeout=kwargs["timeout_secs"])
    raise make_error(pathlib.Path(str(directory)))

  monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", failing)


def resource_exhausted(directory):
  """Orbax's error of a write that found the disk full (as tensorstore words it)."""
  data = f"{directory}.orbax-checkpoint-tmp/state/ocdbt.process_0/d/1dd1af7b"
  return ValueError(f'RESOURCE_EXHAUSTED: Error writing "params/0.0" in OCDBT database at local '
                    f'file "{directory}.orbax-checkpoint-tmp/state/ocdbt.process_0/": Failed '
                    f'writing: "{data}": Failed to write 78082 bytes to file 5: No space left '
                    "on device [os_error_code='28']")


def test_a_full_disk_in_a_checkpoint_write_stops_with_one_error_and_no_record_past_it(
    tmp_path, full_run):
  """Simulated: orbax's background write of round 2 raises the ValueError a full disk gives
  (a real one: tests/test_stops.py, where a private tmpfs can be mounted)."""
  from fedjax_het.errors import StorageError  # pylint: disable=import-outside-toplevel
  reference, want = full_run
  # The fault has a patch of its own: freeing the space undoes it alone, and the environment
  # of `_shared_cache` (no FEDJAX_HET_DATA_DIR: the synthetic data of the full run) stays.
  with pytest.MonkeyPatch.context() as disk, pytest.raises(StorageError) as error:
    fail_checkpoint_writes(disk, 2, resource_exhausted)
    train_and_evaluate(solo_config(), tmp_path)
  path = f"{tmp_path / 'checkpoints' / '2'}.orbax-checkpoint-tmp/state/ocdbt.process_0/d/1dd1af7b"
  # The failure is seen after round 3 trains (before its record is written) or, when the
  # write was still under way then, when round 3's checkpoint waits for it.
  assert re.fullmatch(
      re.escape(f"no space left on the device writing {path!r} (the checkpoint of round 2); "
                "training stopped at round ") + r"(2|3)" + re.escape(
          "; metrics.jsonl is cut back to round 1, the latest checkpoint: free some space and "
          "rerun the same command to resume from it (") + r"(round 2 is|rounds 2-3 are)"
      + re.escape(" trained again)."), str(error.value)), str(error.value)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0", "1"]
  assert [r["round"] for r in _metrics(tmp_path)] == [1]
  assert not (tmp_path / "results.json").exists()
  # Space freed (the fault's patch is undone): the same command resumes and ends as the full run.
  train_and_evaluate(solo_config(), tmp_path)
  _assert_same_run(tmp_path, reference, want["state"])


_UNRAISABLE = """
import gc
import fedjax_het.checkpointing

class Callback:
  def __init__(self, text):
    self.text = text

  def __del__(self):
    raise RuntimeError(self.text)

Callback("Event loop is closed")
gc.collect()
Callback("something else")
gc.collect()
"""


def test_the_closed_event_loop_of_an_abandoned_read_prints_no_traceback():
  """Tensorstore reads that finish after orbax gave up on a damaged checkpoint raise "Event
  loop is closed" in a callback, printed as an unraisable exception (dozens per damaged
  manifest.ocdbt); those are left out, any other unraisable exception is printed. (In a
  process of its own: pytest replaces sys.unraisablehook during a test.)"""
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  env = {k: v for k, v in os.environ.items() if k != "FEDJAX_HET_TRACEBACK"}
  out = subprocess.run([sys.executable, "-c", _UNRAISABLE], capture_output=True, text=True,
                       timeout=300, env=env, cwd=pathlib.Path(__file__).resolve().parents[1])
  assert out.returncode == 0, out.stderr
  assert "Event loop is closed" not in out.stderr, out.stderr
  assert "RuntimeError: something else" in out.stderr


def test_a_damaged_manifest_falls_back_with_one_warning_and_no_traceback(
    tmp_path, capfd, caplog, full_run, two_rounds):
  reference, want = full_run
  copy_run(two_rounds, tmp_path)
  manifest = tmp_path / "checkpoints" / "2" / "state" / "manifest.ocdbt"
  data = bytearray(manifest.read_bytes())
  for offset in (40, 60):
    data[offset] ^= 0x55
  manifest.write_bytes(bytes(data))
  capfd.readouterr()
  caplog.set_level(logging.WARNING)
  train_and_evaluate(solo_config(), tmp_path)
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err[:3000]
  warnings = [r for r in caplog.records if "cannot be restored" in r.getMessage()]
  assert len(warnings) == 1 and "round 2" in warnings[0].getMessage()
  _assert_same_run(tmp_path, reference, want["state"])


def test_a_full_disk_that_names_no_file_names_the_checkpoint_folder(tmp_path, monkeypatch):
  """Orbax writes the run item and its metadata with Python's own writes: on a full disk they
  raise OSError(ENOSPC) naming no file, and closing the manager raises it again (its metadata
  store); the one error names the checkpoint's folder and the write's round."""
  import errno  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from fedjax_het.errors import StorageError  # pylint: disable=import-outside-toplevel
  full = lambda *_: OSError(errno.ENOSPC, "No space left on device")  # noqa: E731
  fail_checkpoint_writes(monkeypatch, 2, full)
  close = ocp.CheckpointManager.close

  def failing_close(self):
    close(self)
    raise full()

  monkeypatch.setattr(ocp.CheckpointManager, "close", failing_close)
  with pytest.raises(StorageError) as error:
    train_and_evaluate(solo_config(), tmp_path)
  assert str(error.value).startswith(
      f"no space left on the device writing {str(tmp_path / 'checkpoints' / '2')!r} (the "
      "checkpoint of round 2); training stopped at round ")
  assert [r["round"] for r in _metrics(tmp_path)] == [1]

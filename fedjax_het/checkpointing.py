"""Checkpoints of the whole training state and the run's record (thin wrapper over orbax).

The state (every participant's variables, the method's teachers and optimiser
states, the round counter and the run key) is saved after every
`checkpoint.every` rounds; `train_and_evaluate` restores the latest checkpoint
of a workdir automatically, so a killed run continues where it stopped and ends
with the same numbers as an uninterrupted one.

Each checkpoint `<directory>/<round>/` holds two orbax items: `state` (the
arrays) and `run`, a JSON document with the run's identity (the config and data
fingerprint that `run.json` also holds) and every metrics record up to that
round. The checkpoint is the run's source of truth: a resume checks its identity
against the checkpoint, and `metrics.jsonl`, `results.json` and the tables are
views that the trainer rebuilds from the checkpoint's records when they are
missing or damaged. The `run` item also holds the SHA-256 of the state's arrays
(`state_sha256`) and the SHA-256 of the `run` item itself (`run_sha256`, over its
identity, records and state digest): a checkpoint whose bytes changed on disk, in the
arrays or in the run item (a flipped digit that keeps the JSON valid included), fails
to read (`CorruptCheckpointError`) instead of resuming from other numbers or
overwriting `metrics.jsonl` with a changed record; the trainer falls back to the
checkpoint before it and moves the unreadable one to `<directory>/unreadable/<round>/`
(`move_aside`). A run item written without `run_sha256` reads as unverified
(`verified`). A checkpoint written as one unnamed item (`<round>/default/`, no record)
still restores; its run is then checked against `run.json`.

Writes: the checkpoint's folders are made in the calling thread (a folder that cannot be
written fails `save` at once, instead of leaving orbax's background threads waiting for
it), the arrays are written in the background, and `check` raises the error of a
background write that failed (a full disk: orbax's `ValueError: RESOURCE_EXHAUSTED`) as
`CheckpointWriteError`, which names the path and the round; the unfinished folder of a
failed write is removed. Orbax's own error log lines (with their tracebacks) are left out
of the log unless FEDJAX_HET_TRACEBACK is set: the trainer reports the error in one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedjax_het.errors import StorageError, storage_error, wants_traceback


def _drop_orbax_info(record: logging.LogRecord) -> bool:
  """Orbax logs several INFO lines per save through absl; keep its warnings only. Its error
  lines (a failed write or read, each with a traceback) repeat an error that reaches the
  trainer, which reports it in one line: kept only with FEDJAX_HET_TRACEBACK."""
  if "orbax" not in record.pathname:
    return True
  if record.levelno >= logging.ERROR:
    return wants_traceback()
  return record.levelno >= logging.WARNING


logging.getLogger("absl").addFilter(_drop_orbax_info)


def _drop_abandoned_writes(record: logging.LogRecord) -> bool:
  """asyncio logs "Task exception was never retrieved", with a traceback, for each write of a
  checkpoint that orbax abandoned after one of them failed (a full disk): the failure is
  reported in one line; kept only with FEDJAX_HET_TRACEBACK."""
  error = record.exc_info[1] if record.exc_info else None
  return error is None or storage_error(error) is None or wants_traceback()


logging.getLogger("asyncio").addFilter(_drop_abandoned_writes)


def _quiet_closed_loop(previous: Any) -> Any:
  """A `sys.unraisablehook` that drops "Event loop is closed" raised by a tensorstore read
  completing after orbax gave up on a damaged checkpoint (its event loop already closed):
  harmless, and printed as dozens of tracebacks around the one warning line otherwise."""

  def hook(unraisable: Any) -> None:
    value = unraisable.exc_value
    if (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
        and not wants_traceback()):
      return
    previous(unraisable)

  hook.fedjax_het_quiet_closed_loop = True
  return hook


if not getattr(sys.unraisablehook, "fedjax_het_quiet_closed_loop", False):
  sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)


#: The key of the state's SHA-256 in a checkpoint's `run` document.
DIGEST_KEY = "state_sha256"
#: The key of the run document's own SHA-256 (over every other key) in that document.
RUN_DIGEST_KEY = "run_sha256"
#: The folder, inside the checkpoints folder, that unreadable checkpoints are moved to.
UNREADABLE = "unreadable"
#: Orbax's name for the folder of a checkpoint being written: `<round>.orbax-checkpoint-tmp...`.
_UNFINISHED = ".orbax-checkpoint-tmp"


class CorruptCheckpointError(ValueError):
  """A checkpoint's arrays or run item differ from the SHA-256 saved with them."""


class CheckpointWriteError(StorageError):
  """A checkpoint could not be written (a full disk, a folder that cannot be written); `round`
  is the checkpoint's round."""

  def __init__(self, message: str, *, round_index: int, path: str | None = None,
               error_number: int | None = None):
    super().__init__(message, path=path, error_number=error_number)
    self.round = round_index


def run_digest(document: Mapping[str, Any]) -> str:
  """SHA-256 of a run document without its `run_sha256` (sorted keys, compact JSON)."""
  body = {k: v for k, v in document.items() if k != RUN_DIGEST_KEY}
  text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
  return hashlib.sha256(text.encode()).hexdigest()


def state_digest(state: Any) -> str | None:
  """SHA-256 over every array of `state` (tree order, dtype, shape and bytes; typed PRNG keys
  by their key data); None when an array is not fully addressable (a multi-process run)."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(state):
    if isinstance(leaf, jax.Array):
      if not leaf.is_fully_addressable:
        return None
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    array = np.ascontiguousarray(jax.device_get(leaf))
    digest.update(f"{array.dtype}:{array.shape};".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


class Checkpointer:
  """Saves and restores training states and run records under `<directory>/<round>/`."""

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 2):
    self.directory = pathlib.Path(directory).absolute()
    # The checkpoint's folders are made in the calling thread: where they cannot be made,
    # `save` raises at once (made in the background, orbax's writer threads would wait for
    # them until its 300 s signal timeout and keep the process from exiting).
    synchronous_folders = ({"async_options": ocp.AsyncOptions(
        create_directories_asynchronously=False)}
        if "create_directories_asynchronously" in {
            f.name for f in dataclasses.fields(ocp.AsyncOptions)} else {})  # where orbax has it
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True,
        **synchronous_folders)
    handlers = {"state": ocp.StandardCheckpointHandler(), "run": ocp.JsonCheckpointHandler()}
    for attempt in range(3):
      try:
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=handlers)
        break
      except FileNotFoundError:
        # A step directory vanished while the manager listed them: an earlier manager of this
        # process (a run that crashed before closing it) was still removing old checkpoints in
        # its background thread. List again once it is gone.
        if attempt == 2:
          raise
        time.sleep(0.5)
    self._pending: int | None = None  # the round of a write under way (or failed, unseen)
    self._last: int | None = None     # the round of the latest write started

  def latest_round(self) -> int | None:
    """The round of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def rounds(self) -> list[int]:
    """The rounds of the complete checkpoints kept, oldest first."""
    return sorted(self._manager.all_steps())

  def committed_rounds(self) -> list[int]:
    """The rounds whose checkpoint folder is on disk under its final name, oldest first (a
    write is committed when orbax renames its folder to the round's number)."""
    if not self.directory.is_dir():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir()
                  if p.name.isdigit() and p.is_dir())

  def delete(self, round_index: int) -> None:
    """Removes the checkpoint of `round_index`."""
    self._manager.delete(round_index)

  def move_aside(self, round_index: int) -> pathlib.Path:
    """Moves the checkpoint of `round_index` to `<directory>/unreadable/<round>/` (with a
    suffix `.2`, `.3`, ... when that exists) and returns where it went."""
    target = self.directory / UNREADABLE / str(round_index)
    suffix = 1
    while target.exists():
      suffix += 1
      target = self.directory / UNREADABLE / f"{round_index}.{suffix}"
    target.parent.mkdir(exist_ok=True)
    os.replace(self.directory / str(round_index), target)
    self._manager.reload()
    return target

  def reload(self) -> None:
    """Lists the checkpoints on disk again (after another process moved some aside)."""
    self._manager.reload()

  def remove_unfinished(self) -> list[str]:
    """Removes the folders of checkpoint writes that never finished (orbax's
    `<round>.orbax-checkpoint-tmp...`, left by a kill or a failed write); their names.
    Called once the workdir's lock is held (another process's write under way is never
    touched)."""
    if not self.directory.is_dir():
      return []
    removed = []
    for path in sorted(self.directory.iterdir()):
      if _UNFINISHED in path.name and path.name.split(".")[0].isdigit():
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed

  def save(self, round_index: int, state: Any, run: Mapping[str, Any] | None = None) -> None:
    """Saves `state` as round `round_index` (the arrays in the background), with the JSON
    document `run` (the run's identity and records: `{"identity": ..., "records": [...]}`),
    the state's SHA-256 (`state_digest`; in one process) and the document's own SHA-256
    (`run_digest`), both of which `restore` and `run_record` check.

    Raises `CheckpointWriteError` when the write before it failed in the background (it is
    waited for first, as orbax does) or this one cannot start (its folder cannot be made);
    the unfinished folder is then removed."""
    if self._pending is not None:
      self.wait()
    document = json.loads(json.dumps(dict(run or {})))  # as it reads back: lists, str keys
    digest = state_digest(state)
    if digest is not None:
      document[DIGEST_KEY] = digest
    document[RUN_DIGEST_KEY] = run_digest(document)
    self._pending = self._last = round_index
    try:
      self._manager.save(round_index, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), run=ocp.args.JsonSave(document)))
    except Exception as error:  # pylint: disable=broad-except
      self._failed(error)

  def check(self) -> None:
    """Raises `CheckpointWriteError` when a background write has failed; returns at once
    while one is still under way (or none failed)."""
    if self._pending is not None and not self._manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    """Waits for the write under way; `CheckpointWriteError` when it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as error:  # pylint: disable=broad-except
      self._failed(error)
    self._pending = None

  def _failed(self, error: Exception) -> None:
    """Removes the unfinished folder of the failed write and raises `CheckpointWriteError`
    (the error itself when it is not about storage: a bug keeps its traceback)."""
    round_index, self._pending = self._pending, None
    for path in self.directory.glob(f"{round_index}{_UNFINISHED}*"):
      shutil.rmtree(path, ignore_errors=True)
    found = storage_error(error)
    if found is None:
      raise error
    reason = found.reason
    if found.path is None:  # the error names no file: name the checkpoint's folder
      folder = str(self.directory / str(round_index))
      reason = storage_error(OSError(found.error_number, os.strerror(found.error_number),
                                     folder)).reason
    raise CheckpointWriteError(
        f"{reason} (the checkpoint of round {round_index})", round_index=round_index,
        path=found.path or str(self.directory / str(round_index)),
        error_number=found.error_number) from error

  def _unnamed(self, round_index: int) -> pathlib.Path | None:
    """The item folder of a checkpoint written as one unnamed item, else None."""
    folder = self.directory / str(round_index) / "default"
    return folder if folder.is_dir() else None

  def restore(self, round_index: int, like: Any) -> Any:
    """Restores round `round_index` with the structure, dtypes and shardings of `like`.

    Raises `CorruptCheckpointError` when the restored arrays, or the run item that holds
    their SHA-256, do not match the SHA-256 saved with them (bytes of the checkpoint changed
    on disk: orbax reads them without noticing).
    """
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
    unnamed = self._unnamed(round_index)
    if unnamed is not None:
      return ocp.StandardCheckpointer().restore(unnamed, abstract)
    state = self._manager.restore(round_index, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract)))["state"]
    expected = (self.run_record(round_index) or {}).get(DIGEST_KEY)
    if expected is not None:
      got = state_digest(state)
      if got is not None and got != expected:
        raise CorruptCheckpointError(f"the arrays of the checkpoint of round {round_index} do "
                                     f"not match their SHA-256 ({got[:12]} != {expected[:12]})")
    return state

  def run_record(self, round_index: int) -> dict[str, Any] | None:
    """The `run` document saved with round `round_index`; None for a checkpoint without one.

    Raises `CorruptCheckpointError` when the document does not match its `run_sha256`
    (orbax's or the JSON decoder's error when it cannot be read at all). A document written
    without `run_sha256` is returned as it is (`verified` tells)."""
    if self._unnamed(round_index) is not None:
      return None
    document = dict(self._manager.restore(round_index, args=ocp.args.Composite(
        run=ocp.args.JsonRestore()))["run"])
    expected = document.get(RUN_DIGEST_KEY)
    if expected is not None and run_digest(document) != expected:
      raise CorruptCheckpointError(
          f"the run item of the checkpoint of round {round_index} (its identity and records) "
          f"does not match its SHA-256 ({run_digest(document)[:12]} != {str(expected)[:12]})")
    return document

  @staticmethod
  def verified(document: Mapping[str, Any] | None) -> bool:
    """Whether a `run_record` document was checked against its own SHA-256."""
    return document is not None and RUN_DIGEST_KEY in document

  def close(self) -> None:
    """Waits for the write under way (`CheckpointWriteError` when it failed) and releases
    resources. A `KeyboardInterrupt` meanwhile (a second stop signal) leaves the write
    under way as it is: the process is about to end, and the next start removes it."""
    try:
      self.wait()
    except KeyboardInterrupt:
      raise
    except BaseException:
      try:
        self._manager.close()
      except Exception:  # pylint: disable=broad-except (the failed write's error is reported)
        pass
      raise
    try:
      self._manager.close()  # writes what orbax keeps beside the checkpoints (a full disk...)
    except Exception as error:  # pylint: disable=broad-except
      self._pending = self._last
      self._failed(error)

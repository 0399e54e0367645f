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
missing or damaged. The `run` item also holds the SHA-256 of the state's arrays:
a checkpoint whose bytes changed on disk fails to restore (and the trainer
falls back to the checkpoint before it) instead of resuming from other numbers. A checkpoint written as one unnamed item (`<round>/default/`,
no record) still restores; its run is then checked against `run.json`.
"""

from __future__ import annotations

import hashlib
import logging
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def _drop_orbax_info(record: logging.LogRecord) -> bool:
  """Orbax logs several INFO lines per save through absl; keep its warnings only."""
  return record.levelno >= logging.WARNING or "orbax" not in record.pathname


logging.getLogger("absl").addFilter(_drop_orbax_info)


#: The key of the state's SHA-256 in a checkpoint's `run` document.
DIGEST_KEY = "state_sha256"


class CorruptCheckpointError(ValueError):
  """A checkpoint's arrays differ from the SHA-256 saved with them."""


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
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True)
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

  def latest_round(self) -> int | None:
    """The round of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def rounds(self) -> list[int]:
    """The rounds of the complete checkpoints kept, oldest first."""
    return sorted(self._manager.all_steps())

  def delete(self, round_index: int) -> None:
    """Removes the checkpoint of `round_index` (e.g. one that cannot be restored)."""
    self._manager.delete(round_index)

  def save(self, round_index: int, state: Any, run: Mapping[str, Any] | None = None) -> None:
    """Saves `state` as round `round_index` (asynchronously), with the JSON document `run`
    (the run's identity and records: `{"identity": ..., "records": [...]}`) and the state's
    SHA-256 (`state_digest`; in one process) that `restore` checks."""
    document = dict(run or {})
    digest = state_digest(state)
    if digest is not None:
      document[DIGEST_KEY] = digest
    self._manager.save(round_index, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), run=ocp.args.JsonSave(document)))

  def _unnamed(self, round_index: int) -> pathlib.Path | None:
    """The item folder of a checkpoint written as one unnamed item, else None."""
    folder = self.directory / str(round_index) / "default"
    return folder if folder.is_dir() else None

  def restore(self, round_index: int, like: Any) -> Any:
    """Restores round `round_index` with the structure, dtypes and shardings of `like`.

    Raises `CorruptCheckpointError` when the restored arrays do not match the SHA-256 saved
    with them (bytes of the checkpoint changed on disk: orbax reads them without noticing).
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

    Raises (orbax's or the JSON decoder's error) when the document cannot be read."""
    if self._unnamed(round_index) is not None:
      return None
    return dict(self._manager.restore(round_index, args=ocp.args.Composite(
        run=ocp.args.JsonRestore()))["run"])

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    self._manager.wait_until_finished()
    self._manager.close()

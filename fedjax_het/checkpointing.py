"""Checkpoints of the whole training state (thin wrapper over orbax).

The state (every participant's variables, the method's teachers and optimiser
states, the round counter and the run key) is saved after every
`checkpoint.every` rounds; `train_and_evaluate` restores the latest checkpoint
of a workdir automatically, so a killed run continues where it stopped and ends
with the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any

import jax
import orbax.checkpoint as ocp


def _drop_orbax_info(record: logging.LogRecord) -> bool:
  """Orbax logs several INFO lines per save through absl; keep its warnings only."""
  return record.levelno >= logging.WARNING or "orbax" not in record.pathname


logging.getLogger("absl").addFilter(_drop_orbax_info)


class Checkpointer:
  """Saves and restores training states under `<directory>/<round>/`."""

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 2):
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True)
    for attempt in range(3):
      try:
        self._manager = ocp.CheckpointManager(pathlib.Path(directory).absolute(),
                                              options=options)
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

  def save(self, round_index: int, state: Any) -> None:
    """Saves `state` as round `round_index` (asynchronously)."""
    self._manager.save(round_index, args=ocp.args.StandardSave(state))

  def restore(self, round_index: int, like: Any) -> Any:
    """Restores round `round_index` with the structure, dtypes and shardings of `like`."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
    return self._manager.restore(round_index, args=ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    """Waits for pending saves and releases resources."""
    self._manager.wait_until_finished()
    self._manager.close()

"""Training cells: one cell with its cell.json kept (`train_recorded`), or a row's fresh seeds
as one vmapped program (`seed_group`, `train_stacked`; `fedjax_het.seed_stack`)."""

from __future__ import annotations

import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError, RoundTooLargeError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import progress
from fedjax_het.grid import provenance


def train_cell(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Any:
  """Trains (or resumes) one cell with the one trainer."""
  from fedjax_het.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  return train_and_evaluate(config, workdir)


def train_recorded(config: ml_collections.ConfigDict, cell_dir: pathlib.Path,
                   meta: Mapping[str, Any],
                   train: Callable[[ml_collections.ConfigDict, pathlib.Path], Any] | None = None
                   ) -> str:
  """Trains one cell and keeps its cell.json: "running" while it trains (its seconds updated
  every `provenance.HEARTBEAT_SECS`, with the PID and host that say whether it still runs),
  then "finished" (or "stopped" when the trainer returned before the last round). Returns
  the status."""
  tick = time.perf_counter()
  provenance.update_cell_record(cell_dir, meta, status="running", new_invocation=True,
                                extra={**provenance.code_state([cell_dir]), "pid": os.getpid(),
                                       "host": socket.gethostname()})
  stop = threading.Event()

  def heartbeat() -> None:
    while not stop.wait(provenance.HEARTBEAT_SECS):
      try:
        provenance.update_cell_record(cell_dir, meta, status="running",
                                      seconds=time.perf_counter() - tick)
      except OSError:  # a full disk: the next beat, or the end, records the time
        pass

  beat = threading.Thread(target=heartbeat, name="cell_heartbeat", daemon=True)
  beat.start()
  try:
    (train or train_cell)(config, cell_dir)
  except BaseException as error:
    stop.set()
    beat.join()
    provenance.update_cell_record(
        cell_dir, meta, seconds=time.perf_counter() - tick,
        status="interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
    raise
  stop.set()
  beat.join()
  provenance.update_cell_record(cell_dir, meta, status="running", extra=provenance.device_info())
  status = "finished" if progress.is_finished(cell_dir, config) else "stopped"
  provenance.update_cell_record(cell_dir, meta, status=status,
                                seconds=time.perf_counter() - tick)
  return status


def seed_group(cell: cells_lib.Cell, later: Sequence[cells_lib.Cell],
               configs: Mapping[cells_lib.Cell, Any], results_dir: pathlib.Path,
               has_twin: Callable[[cells_lib.Cell], bool] = lambda cell: False
               ) -> list[cells_lib.Cell]:
  """`cell` and the later fresh cells of its table, setting and row whose configs differ from
  its own only by the seed and that have no finished twin to copy (empty when `cell` itself
  is not fresh or has one)."""
  if not progress.is_fresh(cell.directory(results_dir)) or has_twin(cell):
    return []

  def without_seed(config):
    flat = workdir_lib.flatten_config(config)
    for name in ("seed", "name"):  # a cell's name carries its seed
      flat.pop(name, None)
    return flat

  key = (cell.table.id, cell.setting.key, cell.row.key, cell.scale)
  mine = without_seed(configs[cell])
  return [cell] + [c for c in later
                   if (c.table.id, c.setting.key, c.row.key, c.scale) == key
                   and c.seed != cell.seed and progress.is_fresh(c.directory(results_dir))
                   and without_seed(configs[c]) == mine and not has_twin(c)]


def train_stacked(group: Sequence[cells_lib.Cell], configs: Mapping[cells_lib.Cell, Any],
                  results_dir: pathlib.Path, overrides: Sequence[str], custom: bool,
                  statuses: dict[str, str], label: str, echo: Callable[[str], None]) -> bool:
  """Trains `group` (one row's seeds) as one vmapped program, keeping each cell's cell.json;
  False (nothing trained) when the seeds' data differ in shape."""
  from fedjax_het.train import train_lanes  # pylint: disable=g-import-not-at-top
  dirs = [c.directory(results_dir) for c in group]
  metas = [provenance.cell_meta(c, arguments.significant_overrides(overrides, configs[c]), custom)
           for c in group]
  seeds = ", ".join(str(c.seed) for c in group)
  echo(f"{label}: training seeds {seeds} of {group[0].row.key} as one program "
       f"({cell_configs.expected_rounds(configs[group[0]])} rounds each)")
  code = provenance.code_state(dirs)
  started, tick = provenance.now(), time.perf_counter()
  try:
    train_lanes([configs[c] for c in group], dirs, leaner_convs_for_seeds=False)
  except ConfigError as error:
    if "config.seeds" not in str(error):
      raise
    echo(f"{label}: {error} Training the seeds one by one.")
    return False
  except RoundTooLargeError as error:  # raised before anything trains
    echo(f"{label}: the seeds as one program do not fit ({str(error).split(';')[0]}). "
         "Training the seeds one by one.")
    return False
  except BaseException:
    for cell_dir, meta in zip(dirs, metas):
      if cell_dir.exists():
        provenance.update_cell_record(cell_dir, meta, seconds=time.perf_counter() - tick,
                                      status="failed", new_invocation=True,
                                      extra={"start": started, **code})
    raise
  seconds = time.perf_counter() - tick
  for cell, cell_dir, meta in zip(group, dirs, metas):
    provenance.update_cell_record(cell_dir, meta, status="running", new_invocation=True,
                                  extra={"start": started, **code, **provenance.device_info(),
                                         "stacked_seeds": [c.seed for c in group]})
    status = "finished" if progress.is_finished(cell_dir, configs[cell]) else "stopped"
    provenance.update_cell_record(cell_dir, meta, status=status, seconds=seconds)
    statuses[cell.label] = "trained"
    echo(f"  {cell.label}: trained with seeds {seeds} ({seconds:.1f} s for all), "
         f"{progress.summary_line(cell, cell_dir)}")
  return True

"""Twins: one run shared by every table that holds the same cell (a fresh cell whose run
another table holds finished is copied from it instead of trained)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import ml_collections

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import WorkdirError
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import progress
from fedjax_het.grid import provenance
from fedjax_het.reports import tables as tables_lib


def _recipe(setting: tables_lib.Setting, row: tables_lib.Row, scale: str) -> tuple[Any, ...]:
  """What `cell_configs.cell_config` builds a cell's config from, besides the seed and the overrides."""
  return (row.config or setting.config, row.config_variant(scale), row.fields(scale))


def find_twin(cell: cells_lib.Cell, config: ml_collections.ConfigDict,
              results_dir: pathlib.Path) -> pathlib.Path | None:
  """The directory of a finished cell of another table (or setting) that is the same run as
  `cell`: the same config file, variant at the cell's scale, row fields and seed, and a
  recorded config equal to `config` (`progress.is_finished`, so the --set overrides must agree
  too), whose code a commit pins (not `provenance.unpinned`). None when there is none. E.g. the
  BASE row of FCCL Tables 1/2 on Digits is the BASE row of FCCL+ Table VIII/IX on Digits; the
  quick cells of GLFC's T = 5 and 20 layouts are Table 1's."""
  own = cell.directory(results_dir)
  recipe = _recipe(cell.setting, cell.row, cell.scale)
  for table in tables_lib.TABLES.values():
    for setting in table.settings:
      for row in setting.rows:
        if _recipe(setting, row, cell.scale) != recipe:
          continue
        path = tables_lib.cell_dir(results_dir, table, setting, row, cell.seed, cell.scale)
        if path == own or not path.is_dir() or provenance.unpinned(
            progress.read_json(path / provenance.CELL_FILE) or {}):
          continue
        try:
          if progress.is_finished(path, config):
            return path
        except WorkdirError:  # the same recipe trained under other --set overrides
          continue
  return None


def copy_twin(twin: pathlib.Path, cell_dir: pathlib.Path, meta: Mapping[str, Any],
              results_dir: pathlib.Path) -> dict[str, Any]:
  """Copies a finished twin's files (not its checkpoints) into `cell_dir`. cell.json keeps
  the twin's invocations (the device, commit and wall time of the run that produced the
  numbers), adds this copy as an invocation of 0 s, and names the original run's directory
  (relative to results_dir) as `copy_of`. The copy is made beside `cell_dir` and renamed onto
  it (a fresh cell's directory holds nothing to keep), so a kill leaves no half copy."""
  staging = cell_dir.parent / f".{cell_dir.name}.copying"
  shutil.rmtree(staging, ignore_errors=True)
  shutil.copytree(twin, staging, ignore=shutil.ignore_patterns(
      "checkpoints", workdir_lib.LOCK_FILE, provenance.CELL_FILE))
  record = progress.read_json(twin / provenance.CELL_FILE) or {}
  source = record.get("copy_of") or twin.relative_to(results_dir).as_posix()
  record.update(meta)
  record["copy_of"] = source
  record["invocations"] = [*record.get("invocations", []),
                           {"start": provenance.now(), "status": "finished", "seconds": 0.0,
                            "copy_of": source}]
  record["status"] = "finished"
  workdir_lib.write_atomic(staging / provenance.CELL_FILE,
                           json.dumps(record, indent=2, ensure_ascii=False) + "\n")
  shutil.rmtree(cell_dir, ignore_errors=True)
  os.replace(staging, cell_dir)
  return record

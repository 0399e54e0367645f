"""How far a cell's directory is: the rounds its metrics.jsonl records, whether it holds a
finished run of a given config (the grid skips it), whether it is fresh, and its one-line
summary."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import ml_collections

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import WorkdirError
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import document

def read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def rounds_done(cell_dir: pathlib.Path) -> int:
  """The last round metrics.jsonl records (0 without one)."""
  return max((int(r["round"]) for r in document.read_records(cell_dir)), default=0)


def _stand_ins(config: ml_collections.ConfigDict,
               recorded: Mapping[str, Any]) -> dict[str, str]:
  """The recorded data sources of the digit domains that `config` gives the synthetic
  stand-in as well (read off the bundle's keys, `data.is_synthetic_stand_in`): a changed
  `scenario.sources.<domain>` with the same stand-in on both sides is the same cell."""
  sources = config.get("scenario", {}).get("sources")
  if not sources:
    return {}
  from fedjax_het.data import scenarios  # pylint: disable=g-import-not-at-top (numpy-heavy)
  recorded_sources = recorded.get("data", {}).get("sources", {})
  data_dir = config.scenario.get("data_dir") or None
  fallback = bool(config.scenario.get("synthetic_fallback", False))
  return {domain: recorded_sources[domain] for domain, source in sources.items()
          if str(recorded_sources.get(domain, "")).startswith("synthetic(")
          and scenarios.is_synthetic_stand_in(domain, source, data_dir=data_dir,
                                             synthetic_fallback=fallback)}


def is_finished(cell_dir: pathlib.Path, config: ml_collections.ConfigDict) -> bool:
  """True for a cell whose run completed `cell_configs.expected_rounds(config)` rounds
  (results.json written).

  Raises WorkdirError when it finished with a different config (the data are
  not fingerprinted again here; the trainers check them on a resume).
  """
  if not (cell_dir / "results.json").exists():
    return False
  if rounds_done(cell_dir) < cell_configs.expected_rounds(config):
    return False
  recorded = read_json(cell_dir / workdir_lib.RUN_FILE)
  if recorded is not None:
    # Compare the configs only: the same (absent) fingerprint on both sides.
    lines = workdir_lib.differences(
        {"config": recorded.get("config", {}),
         "data": {"sources": recorded.get("data", {}).get("sources", {})}},
        {"config": workdir_lib.flatten_config(config),
         "data": {"fingerprint": None, "sources": _stand_ins(config, recorded)}},
        workdir_lib.allowed_changes(config))
    if lines:
      listing = "\n  ".join(lines)
      raise WorkdirError(
          f"cell {str(cell_dir)!r} holds a finished run with a different config:\n  {listing}\n"
          "Delete that directory to retrain the cell, or pass another --results-dir.")
  return True


def cell_status(cell_dir: pathlib.Path, config: ml_collections.ConfigDict) -> str:
  """"finished", "partial (round r of N)", "different config" or "-" (not started)."""
  try:
    if is_finished(cell_dir, config):
      return "finished"
  except WorkdirError:
    return "different config"
  done = rounds_done(cell_dir)
  if done or (cell_dir / "checkpoints").is_dir():
    return f"partial (round {done} of {cell_configs.expected_rounds(config)})"
  return "-"

def is_fresh(cell_dir: pathlib.Path) -> bool:
  """Whether the cell has neither checkpoints nor a recorded round (nothing to resume)."""
  return not (cell_dir / "checkpoints").is_dir() and rounds_done(cell_dir) == 0


def summary_line(cell: cells_lib.Cell, cell_dir: pathlib.Path) -> str:
  """The cell's results in one line: its average accuracies and rounds to the targets (the
  average incremental accuracy of a class-incremental cell)."""
  results = read_json(cell_dir / "results.json") or {}
  if cell.table.family == "class_incremental":
    avg = results.get("average_incremental_accuracy")
    return "Avg. (no task finished)" if avg is None else f"Avg. {100 * avg:.1f}"
  shown = [f"{k} {results[k]['AVG']:.2f}" for k in ("inter", "intra", "accuracy")
           if "AVG" in results.get(k, {})]
  reached = ", ".join(f"{k}%: {'not reached' if r is None else f'round {r}'}"
                      for k, r in results.get("rounds_to_target", {}).items())
  return ("AVG " + " ".join(shown) if shown else "(no evaluation)") + (
      f", {reached}" if reached else "")

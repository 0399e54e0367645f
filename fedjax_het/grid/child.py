"""Training in a child process stopped at a deadline (`python -m fedjax_het.grid.child <spec>`).

With a deadline, each cell (or a row's stacked seeds) trains in a child process; the
running one is stopped at the deadline (SIGTERM, then SIGKILL): its checkpoints stay, it
is recorded "interrupted", and the next invocation resumes it.
"""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from fedjax_het.errors import UserError
from fedjax_het.grid import arguments
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import progress
from fedjax_het.grid import provenance
from fedjax_het.grid import training

#: The exit status of a child whose seeds cannot train as one program (nothing trained).
NOT_STACKED = 4


def main(spec_path: str) -> int:
  """`python -m fedjax_het.grid.child <spec>`: trains the pickled cell of a deadline run, or (a
  spec with "group") a row's fresh seeds as one program; NOT_STACKED when they cannot be."""
  spec = pickle.loads(pathlib.Path(spec_path).read_bytes())
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                      datefmt="%H:%M:%S")
  from fedjax_het.runtime import xla_cpu  # pylint: disable=g-import-not-at-top
  first = spec["configs"][spec["group"][0]] if "group" in spec else spec["config"]
  xla_cpu.set_xla_cpu_scheduler(first.xla_cpu_scheduler)
  try:
    if "group" in spec:
      stacked = training.train_stacked(
          spec["group"], spec["configs"], pathlib.Path(spec["results_dir"]), spec["overrides"],
          spec["custom"], {}, spec["label"], lambda line: print(line, flush=True))
      return 0 if stacked else NOT_STACKED
    training.train_recorded(spec["config"], pathlib.Path(spec["cell_dir"]), spec["meta"])
  except UserError as error:
    pathlib.Path(spec_path + ".error").write_text(str(error))
    return 3
  return 0


def _run_child(spec: Mapping[str, Any], timeout: float) -> tuple[int | None, str | None, float]:
  """Runs `python -m fedjax_het.grid.child` on the pickled `spec` for at most `timeout` seconds:
  (its exit status, None when the deadline stopped it; its UserError's message or None;
  its seconds)."""
  with tempfile.TemporaryDirectory(prefix="fedjax_het_cell_") as tmp:
    path = pathlib.Path(tmp) / "cell.pkl"
    path.write_bytes(pickle.dumps(dict(spec)))
    tick = time.perf_counter()
    # The child imports this package from the same checkout, wherever the command started.
    python_path = os.pathsep.join(
        p for p in (str(cells_lib.REPO), os.environ.get("PYTHONPATH", "")) if p)
    child = subprocess.Popen([sys.executable, "-m", "fedjax_het.grid.child", str(path)],
                             env={**os.environ, "PYTHONPATH": python_path})
    try:
      code = child.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
      child.send_signal(signal.SIGTERM)
      try:
        child.wait(timeout=15)
      except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
      return None, None, time.perf_counter() - tick
    error = pathlib.Path(str(path) + ".error")
    return code, error.read_text() if error.exists() else None, time.perf_counter() - tick


def train_in_child(config: ml_collections.ConfigDict, cell_dir: pathlib.Path,
                   meta: Mapping[str, Any], *, timeout: float, echo: Callable[[str], None]
                   ) -> str:
  """Trains the cell in a child process stopped after `timeout` seconds; its status."""
  code, error, seconds = _run_child({"config": config, "cell_dir": str(cell_dir),
                                     "meta": dict(meta)}, timeout)
  if code is None:
    echo(f"{meta['label']}: stopped at the deadline after {seconds:.1f} s "
         "(its checkpoints stay; rerun to resume)")
    provenance.update_cell_record(cell_dir, meta, status="interrupted", seconds=seconds)
    return "interrupted"
  if error is not None:
    provenance.update_cell_record(cell_dir, meta, status="failed", seconds=seconds)
    raise UserError(f"{meta['label']}: {error}")
  if code != 0:
    provenance.update_cell_record(cell_dir, meta, status="failed", seconds=seconds)
    raise RuntimeError(f"{meta['label']}: its training process exited with status {code} "
                       "(its output is above)")
  record = progress.read_json(cell_dir / provenance.CELL_FILE) or {}
  return str(record.get("status", "stopped"))


def train_stacked_in_child(group: Sequence[cells_lib.Cell],
                           configs: Mapping[cells_lib.Cell, Any], results_dir: pathlib.Path,
                           overrides: Sequence[str], custom: bool, statuses: dict[str, str],
                           label: str, *, timeout: float, echo: Callable[[str], None]) -> str:
  """`training.train_stacked` in a child process stopped after `timeout` seconds: "trained",
  "interrupted" (each seed's checkpoints stay; the next invocation resumes the seeds one by
  one) or "not stacked" (nothing trained: the seeds train one by one)."""
  code, error, seconds = _run_child(
      {"group": list(group), "configs": {c: configs[c] for c in group},
       "results_dir": str(results_dir), "overrides": list(overrides), "custom": custom,
       "label": label}, timeout)
  metas = [provenance.cell_meta(c, arguments.significant_overrides(overrides, configs[c]), custom)
           for c in group]
  if code == NOT_STACKED:
    return "not stacked"
  if code is None:
    echo(f"{label}: seeds {', '.join(str(c.seed) for c in group)} stopped at the deadline "
         f"after {seconds:.1f} s (their checkpoints stay; rerun to resume)")
    for cell, meta in zip(group, metas):
      if cell.directory(results_dir).exists():
        provenance.update_cell_record(cell.directory(results_dir), meta, status="interrupted")
      statuses[cell.label] = "interrupted"
    return "interrupted"
  if error is not None or code != 0:
    raise (UserError(f"{label}: {error}") if error is not None else RuntimeError(
        f"{label}: its training process exited with status {code} (its output is above)"))
  for cell in group:
    statuses[cell.label] = "trained"
  return "trained"


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))

"""Run artefacts: metrics.jsonl, optional TensorBoard, a progress bar; the results table is
`fedjax_het.reports.common.results_table` (re-exported here for the trainers)."""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any

import tqdm

from fedjax_het import workdir as workdir_lib
from fedjax_het.reports import common


class MetricsWriter:
  """Appends one JSON record per round to `metrics.jsonl` (and TensorBoard if asked).

  Records carry a "round" key (1-based: the number of rounds completed). On
  resume, `truncate_after(r)` drops records of rounds > r written by an
  interrupted run after its last checkpoint.
  """

  def __init__(self, workdir: pathlib.Path, *, tensorboard: bool):
    self.path = workdir / "metrics.jsonl"
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        self._tb = SummaryWriter(str(workdir / "tensorboard"))
      except ImportError:
        logging.warning("config.logging.tensorboard=True but tensorboardX is not installed "
                        "(pip install 'fedjax_het[tensorboard]'): no TensorBoard output.")

  def read(self) -> list[dict[str, Any]]:
    """The records; a last line cut short by a kill mid-append is dropped."""
    return common.read_records(self.path)

  def truncate_after(self, round_number: int) -> list[dict[str, Any]]:
    """Keeps the records of rounds <= round_number (rewritten atomically)."""
    kept = [r for r in self.read() if r["round"] <= round_number]
    workdir_lib.write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept

  def write(self, record: Mapping[str, Any]) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for name, value in record.items():
        if name != "round" and isinstance(value, (int, float)) and math.isfinite(value):
          self._tb.add_scalar(name, value, record["round"])
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


class Progress:
  """The run's progress: a `tqdm` bar on a terminal, one log line per round otherwise.

  The bar shows the accuracy in its postfix; its rate and ETA count rounds only
  (the trainer compiles the round before the first update, so the first
  round's time is not inflated by compilation). When stderr is not a TTY (CI
  logs, `nohup`) the bar is off and each update is a plain `logging.info` line.
  """

  def __init__(self, total: int, *, enabled: bool, start: int = 0):
    self.total, self.enabled = total, enabled
    self._bar = None
    self._done = start
    self._tick = time.perf_counter()
    if enabled and sys.stderr.isatty():
      self._bar = tqdm.tqdm(total=total, initial=start, unit="round", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0.3)

  def update(self, done: int, text: str) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.set_postfix_str(text, refresh=False)
      self._bar.update(done - self._bar.n)
    else:
      now = time.perf_counter()
      rate = (now - self._tick) / max(done - self._done, 1)
      self._tick, self._done = now, done
      logging.info("round %d/%d %s (%.1f s/round, ETA %.1f min)", done, self.total, text, rate,
                   rate * (self.total - done) / 60)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


# One run's per-participant table (results.md): the reports' (fedjax_het.reports).
results_table = common.results_table

"""Run artefacts: metrics.jsonl, optional TensorBoard, a progress bar, the results table."""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from fedjax_het import workdir as workdir_lib


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
    if not self.path.exists():
      return []
    lines = [line for line in self.path.read_text().splitlines() if line.strip()]
    records = []
    for index, line in enumerate(lines):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        if index < len(lines) - 1:
          raise
    return records

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


KIND_LABELS = {"inter": "inter →", "intra": "intra ↩", "accuracy": "accuracy"}


MAX_TABLE_COLUMNS = 10  # more participants than this: the table shows AVG / min / max only


def results_table(records: Sequence[Mapping[str, Any]], client_names: Sequence[str], *,
                  last_rounds: int, method: str,
                  kinds: Sequence[str] = ("inter", "intra")) -> tuple[str, dict[str, Any]]:
  """Accuracy per participant and AVG, each the mean over the last evaluated rounds.

  With kinds ("inter", "intra") this is the FCCL+ Table VIII/IX layout
  (multi-domain scenarios); ("accuracy",) is one row of test accuracy (a
  single-domain partition). With more than `MAX_TABLE_COLUMNS` participants
  the markdown table shows AVG, min and max over participants (the dict keeps
  every participant).

  Returns:
    (markdown table, the same numbers as a dict).
  """
  evaluated = [r for r in records if f"eval/{kinds[0]}/{client_names[0]}" in r][-last_rounds:]
  if not evaluated:
    return "(no evaluated rounds)", {}
  numbers: dict[str, Any] = {"method": method, "rounds": [r["round"] for r in evaluated]}
  wide = len(client_names) > MAX_TABLE_COLUMNS
  columns = ["AVG", "min", "max"] if wide else [*client_names, "AVG"]
  lines = [f"| {method}{f' ({len(client_names)} participants)' if wide else ''} | "
           + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
  for kind in kinds:
    values = [float(np.mean([r[f"eval/{kind}/{c}"] for r in evaluated])) for c in client_names]
    average = float(np.mean(values))
    numbers[kind] = dict(zip(client_names, values), AVG=average)
    shown = [average, min(values), max(values)] if wide else [*values, average]
    lines.append(f"| {KIND_LABELS.get(kind, kind)} | " + " | ".join(f"{v:.2f}" for v in shown)
                 + " |")
  return "\n".join(lines), numbers

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
        logging.info("tensorboardX not installed (pip install 'fedjax_het[tensorboard]'): "
                     "no TensorBoard output.")

  def read(self) -> list[dict[str, Any]]:
    if not self.path.exists():
      return []
    return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

  def truncate_after(self, round_number: int) -> list[dict[str, Any]]:
    kept = [r for r in self.read() if r["round"] <= round_number]
    self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
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
  """A one-line progress bar on stderr (a plain line per update when not a TTY).

  The rate (and ETA) leaves out the first update once there are later ones:
  the first call of the jitted round includes its compilation.
  """

  def __init__(self, total: int, *, enabled: bool, start: int = 0):
    self.total, self.enabled, self._start = total, enabled, start
    self._t0 = time.perf_counter()
    self._first: tuple[int, float] | None = None  # (rounds done, time) at the first update
    self._tty = sys.stderr.isatty()

  def update(self, done: int, text: str) -> None:
    if not self.enabled:
      return
    now = time.perf_counter()
    if self._first is None or done <= self._first[0]:
      self._first = (done, now)
      rate = (now - self._t0) / max(done - self._start, 1)
    else:
      rate = (now - self._first[1]) / (done - self._first[0])
    eta = rate * (self.total - done)
    width = 20
    filled = int(width * done / self.total)
    line = (f"round {done}/{self.total} [{'#' * filled}{'.' * (width - filled)}] {text} "
            f"| {rate:.1f} s/round, ETA {eta / 60:.1f} min")
    if self._tty:
      sys.stderr.write("\r" + line + ("\n" if done == self.total else ""))
    else:
      sys.stderr.write(line + "\n")
    sys.stderr.flush()


def results_table(records: Sequence[Mapping[str, Any]], client_names: Sequence[str], *,
                  last_rounds: int, method: str) -> tuple[str, dict[str, Any]]:
  """FCCL+ Table VIII/IX layout: inter and intra accuracy per participant and AVG.

  Each number is the mean over the last `last_rounds` evaluated rounds.

  Returns:
    (markdown table, the same numbers as a dict).
  """
  evaluated = [r for r in records if f"eval/intra/{client_names[0]}" in r][-last_rounds:]
  if not evaluated:
    return "(no evaluated rounds)", {}
  numbers: dict[str, Any] = {"method": method, "rounds": [r["round"] for r in evaluated]}
  lines = [f"| {method} | " + " | ".join(client_names) + " | AVG |",
           "|---" * (len(client_names) + 2) + "|"]
  for kind, arrow in (("inter", "→"), ("intra", "↩")):
    values = [float(np.mean([r[f"eval/{kind}/{c}"] for r in evaluated])) for c in client_names]
    average = float(np.mean(values))
    numbers[kind] = dict(zip(client_names, values), AVG=average)
    lines.append(f"| {kind} {arrow} | " + " | ".join(f"{v:.2f}" for v in values)
                 + f" | {average:.2f} |")
  return "\n".join(lines), numbers

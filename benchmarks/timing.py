"""The timing rule every benchmark here shares (imported as `timing` by the scripts)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def median_seconds(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
  """(median, all) wall seconds of `repeats` calls of `fn`, each waited for on the device."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), times

"""What every benchmark here shares (imported as `timing` by the scripts): the timing rule, and
the header of a result file.

A result file is `benchmarks/results/<script>__<config>__<device>.json` (the latest only), and
`write_result` starts it with a header naming the commit, the date, the device and the jax
version it was measured with (`result_header`).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

REPO = pathlib.Path(__file__).resolve().parents[1]


def median_seconds(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
  """(median, all) wall seconds of `repeats` calls of `fn`, each waited for on the device."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


def git_commit() -> str | None:
  """The commit checked out in this repository, or None outside a git checkout."""
  try:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return (done.stdout.strip() or None) if done.returncode == 0 else None


def cpu_description() -> str:
  """'<cores>-core <model name>' from /proc/cpuinfo, or '<cores>-core <machine> CPU'."""
  cores = os.cpu_count()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return f"{cores}-core {line.partition(':')[2].strip()}"
  except OSError:
    pass
  return f"{cores}-core {os.uname().machine} CPU"


def _backend_started() -> bool:
  from fedjax_het.runtime import xla_cpu  # pylint: disable=import-outside-toplevel
  return xla_cpu.backend_started()


def _gpu_names() -> list[str]:
  """The GPUs `nvidia-smi` lists (no JAX backend started), or [] without one."""
  try:
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return []
  return [line.strip() for line in done.stdout.splitlines() if line.strip()] \
      if done.returncode == 0 else []


def _counted(names: list[str]) -> str:
  return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"


def device_description() -> str:
  """The device of this process's measurements, in words.

  With a JAX backend started: its devices ('NVIDIA H200', '2 x NVIDIA H100 80GB HBM3') or, on
  the CPU, `cpu_description()`. Without one (a script whose measurements ran in child
  processes) it starts none: the GPUs `nvidia-smi` lists, else the CPU.
  """
  if _backend_started():
    devices = jax.devices()
    if devices[0].platform == "cpu":
      return cpu_description()
    return _counted([d.device_kind for d in devices])
  gpus = _gpu_names()
  return _counted(gpus) if gpus else cpu_description()


def process_info() -> dict[str, Any]:
  """What a measurement depends on in this process (starts JAX's backend): "backend",
  "devices", "device_kind", "jax", "python", "cpu_count", "XLA_FLAGS", "GLIBC_TUNABLES"."""
  devices = jax.devices()
  return {"backend": jax.default_backend(), "devices": [str(d) for d in devices],
          "device_kind": devices[0].device_kind, "jax": jax.__version__,
          "python": platform.python_version(), "cpu_count": os.cpu_count(),
          "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
          "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", "")}


def result_header(device: str | None = None) -> dict[str, Any]:
  """{"commit", "date", "device", "jax"} of a result measured now (`device_description()`
  unless `device` is given; None where a field is unknown)."""
  return {"commit": git_commit(), "date": datetime.date.today().isoformat(),
          "device": device if device is not None else device_description(),
          "jax": jax.__version__}


def write_result(path: str | os.PathLike, report: Mapping[str, Any], *,
                 device: str | None = None, indent: int = 1) -> dict[str, Any]:
  """Writes `report` as JSON to `path` after a "header" (`result_header(device)`, in place of
  any header `report` has), creating the folder; returns what it wrote."""
  result = {"header": result_header(device)}
  result.update((key, value) for key, value in report.items() if key != "header")
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=indent) + "\n")
  return result

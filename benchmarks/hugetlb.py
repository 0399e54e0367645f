"""Micro-benchmark: a jitted call on XLA:CPU with and without `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`.

XLA:CPU allocates a program's temporary buffers at every call; glibc serves a large allocation
with a fresh `mmap`, whose pages fault in one by one as the program first touches them. With
`glibc.malloc.hugetlb=1` glibc asks for transparent huge pages for such mappings (`madvise`),
so a 2 MiB page faults in at once. The tunable is read when the process starts, so each setting
runs in processes of its own: `--alternations` pairs of child processes, without and with the
variable, in turn (the order swapped every other pair), each timing the median of `--calls`
calls of one jitted function per `--sizes` entry n: an n × n float32 temporary (`tanh` of an
outer product) times a vector, so the temporary is n² × 4 bytes (16, 64, 256 MiB).

Usage:
  python benchmarks/hugetlb.py [--sizes 2048,4096,8192 --alternations 5 --calls 30] \
      --out benchmarks/results/hugetlb__jit_temp_buffer__<device>.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

TUNABLE = "glibc.malloc.hugetlb=1"


def _worker(sizes: list[int], calls: int) -> dict:
  """Times each size's jitted call in this process; returns {n: {...}}."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  @jax.jit
  def temp_then_matvec(x, y, v):
    return jnp.tanh(jnp.outer(x, y)) @ v

  out = {}
  for n in sizes:
    x, y, v = jnp.ones(n), jnp.full(n, 0.5), jnp.ones(n)
    compiled = temp_then_matvec.lower(x, y, v).compile()
    for _ in range(3):
      compiled(x, y, v).block_until_ready()
    times = []
    for _ in range(calls):
      start = time.perf_counter()
      compiled(x, y, v).block_until_ready()
      times.append(time.perf_counter() - start)
    memory = compiled.memory_analysis()
    out[str(n)] = {"temp_mib": memory.temp_size_in_bytes / 2**20 if memory else None,
                   "median_ms": statistics.median(times) * 1e3}
  return out


def _run_child(sizes: list[int], calls: int, hugetlb: bool) -> dict:
  env = dict(os.environ)
  env.pop("GLIBC_TUNABLES", None)
  if hugetlb:
    env["GLIBC_TUNABLES"] = TUNABLE
  done = subprocess.run(
      [sys.executable, __file__, "--worker", "--sizes", ",".join(map(str, sizes)),
       "--calls", str(calls)], env=env, capture_output=True, text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def _read(path: str) -> str | None:
  try:
    return pathlib.Path(path).read_text().strip()
  except OSError:
    return None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="2048,4096,8192")
  parser.add_argument("--alternations", type=int, default=5)
  parser.add_argument("--calls", type=int, default=30)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  if args.worker:
    print(json.dumps(_worker(sizes, args.calls)))
    return

  runs = []
  load_start = os.getloadavg()
  for pair in range(args.alternations):
    order = (False, True) if pair % 2 == 0 else (True, False)
    for hugetlb in order:
      result = _run_child(sizes, args.calls, hugetlb)
      runs.append({"pair": pair, "hugetlb": hugetlb, "result": result})
      print(f"pair {pair} hugetlb={int(hugetlb)}: " + ", ".join(
          f"n={n} {r['median_ms']:.1f} ms" for n, r in result.items()), flush=True)
  load_end = os.getloadavg()

  summary = {}
  for n in map(str, sizes):
    off = [r["result"][n]["median_ms"] for r in runs if not r["hugetlb"]]
    on = [r["result"][n]["median_ms"] for r in runs if r["hugetlb"]]
    pair_ratios = [b / a for a, b in zip(off, on)]
    summary[n] = {
        "temp_mib": runs[0]["result"][n]["temp_mib"],
        "median_ms_without": statistics.median(off), "median_ms_with": statistics.median(on),
        "range_ms_without": [min(off), max(off)], "range_ms_with": [min(on), max(on)],
        "ratio_with_to_without": statistics.median(on) / statistics.median(off),
        "pair_ratios": pair_ratios,
        # Every run with the tunable faster than every run without it.
        "runs_agree": max(on) < min(off)}
    print(f"n={n} ({summary[n]['temp_mib']:.0f} MiB temporary): "
          f"{summary[n]['median_ms_without']:.1f} ms without, "
          f"{summary[n]['median_ms_with']:.1f} ms with {TUNABLE} "
          f"(ratio {summary[n]['ratio_with_to_without']:.2f}; runs agree: "
          f"{summary[n]['runs_agree']})")

  report = {
      "config": {"sizes": sizes, "alternations": args.alternations, "calls": args.calls,
                 "function": "jnp.tanh(jnp.outer(x, y)) @ v, float32, jitted"},
      "summary": summary, "runs": runs,
      "machine": {"glibc": platform.libc_ver(), "cpu_count": os.cpu_count(),
                  "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
                  "load_average_start": load_start, "load_average_end": load_end},
  }
  if args.out:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import timing  # pylint: disable=import-outside-toplevel
    timing.write_result(args.out, report)
    print("wrote", args.out)


if __name__ == "__main__":
  main()

"""Wall time of test modules in one pytest process against two pytest-xdist workers.

The default suite compiles many small XLA programs. XLA:CPU compiles one program on one core
and runs it on all of them, so on a 2-core CPU one pytest process leaves a core idle for much of
a compile-bound test. `pytest -n 2` (pytest-xdist) runs two worker processes, each taking the
next test when it finishes one (`--dist worksteal`), sharing one persistent compilation cache
(`tests/conftest.py` names it in `JAX_COMPILATION_CACHE_DIR`, which the workers inherit).

Each alternation runs the same modules once in each mode, the order swapped every other pair,
each as a fresh `python -m pytest -q -p no:cacheprovider` child (so both start with empty
caches). The result records the wall time, the pass count and the load average around each run:
the machine should be otherwise idle.

Usage:
  python benchmarks/pytest_workers.py [--modules tests/test_fedavg.py,...] [--alternations 2] \
      --out benchmarks/results/pytest_workers__<modules>__<device>.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import timing  # benchmarks/, beside this script

DEFAULT_MODULES = ("tests/test_checkpoint_faults.py,tests/test_fedavg.py,"
                   "tests/test_losses_properties.py,tests/test_engine.py,tests/test_workdir.py")
MODES = {"one_process": [], "two_workers": ["-n", "2", "--dist", "worksteal"]}


def _run(modules: list[str], mode: str) -> dict:
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             *MODES[mode], *modules]
  load_before = os.getloadavg()[0]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
  passed = re.search(r"(\d+) passed", tail)
  failed = re.search(r"(\d+) failed", tail)
  return {"mode": mode, "wall_s": wall, "returncode": done.returncode,
          "passed": int(passed.group(1)) if passed else 0,
          "failed": int(failed.group(1)) if failed else 0, "summary": tail,
          "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--modules", default=DEFAULT_MODULES)
  parser.add_argument("--alternations", type=int, default=2)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  modules = args.modules.split(",")

  runs = []
  for pair in range(args.alternations):
    order = ("one_process", "two_workers") if pair % 2 == 0 else ("two_workers", "one_process")
    for mode in order:
      run = _run(modules, mode)
      run["pair"] = pair
      runs.append(run)
      print(f"pair {pair} {mode}: {run['wall_s']:.1f} s, {run['summary']}", flush=True)

  walls = {mode: [r["wall_s"] for r in runs if r["mode"] == mode] for mode in MODES}
  pair_ratios = [one / two for one, two in zip(walls["one_process"], walls["two_workers"])]
  summary = {
      "median_wall_s": {mode: statistics.median(w) for mode, w in walls.items()},
      "speedup_two_workers": statistics.median(walls["one_process"])
                             / statistics.median(walls["two_workers"]),
      "pair_speedups": pair_ratios,
      "same_passed": len({r["passed"] for r in runs}) == 1 and all(
          r["returncode"] == 0 for r in runs),
  }
  print(f"one process {summary['median_wall_s']['one_process']:.1f} s, two workers "
        f"{summary['median_wall_s']['two_workers']:.1f} s: "
        f"{summary['speedup_two_workers']:.2f}x")
  report = {
      "config": {"modules": modules, "alternations": args.alternations,
                 "modes": {mode: " ".join(["python -m pytest -q -p no:cacheprovider", *flags])
                           for mode, flags in MODES.items()},
                 "glibc_tunables": os.environ.get("GLIBC_TUNABLES")},
      "summary": summary, "runs": runs, "machine": {"cpu_count": os.cpu_count()},
  }
  if args.out:
    timing.write_result(args.out, report)
    print("wrote", args.out)


if __name__ == "__main__":
  main()

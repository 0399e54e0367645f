"""Seeds as a vmapped axis: the time per seed of one seed against several on one axis.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/seed_axis.py \
        --config=digits_fcclplus_quick --seeds=0,1,2 --rounds=2 \
        --out benchmarks/results/seed_axis__digits_fcclplus_quick__<device>.json

For 1 seed (the run's own programs, `seed_stack.SingleRun`) and for all `--seeds` on one axis
(`seed_stack.SeedStack`), side by side in one process: the compile of the round as the trainer
compiles it (no persistent cache; with its memory policy, so an "auto" CPU run whose round
does not fit in memory compiles again with leaner convolutions, and the JSON names the
convolutions each used), then `--rounds` rounds, each timed; the steady round is the median
of the rounds after the first. The figures per seed divide by the
number of seeds. The JSON is written after each measurement.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import timing  # noqa: E402  pylint: disable=wrong-import-position


def measure(configs, rounds: int, workdir: pathlib.Path) -> dict:
  """Compile and round times of the configs' lanes as one program (the trainer's memory policy:
  leaner convolutions when the round does not fit, `train.compile_within_memory`)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from fedjax_het import reporting, seed_stack  # pylint: disable=import-outside-toplevel
  from fedjax_het.train import build_experiment, compile_within_memory  # pylint: disable=import-outside-toplevel
  tick = time.perf_counter()
  experiments = [build_experiment(c) for c in configs]
  run = (seed_stack.SeedStack(experiments) if len(experiments) > 1
         else seed_stack.SingleRun(experiments[0]))
  state = run.init_state()
  jax.block_until_ready(state)
  setup = time.perf_counter() - tick
  tick = time.perf_counter()
  workdirs = [workdir / f"seed_{c.seed}" for c in configs]
  for w in workdirs:
    w.mkdir(parents=True, exist_ok=True)
  writer = reporting.create_run_writer(configs, workdirs, primary=True)
  run, compiled = compile_within_memory(run, state, configs[0], writer, with_diagnostics=False)
  compile_secs = time.perf_counter() - tick
  times = []
  for _ in range(rounds):
    tick = time.perf_counter()
    state, _ = compiled(state, run.data)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - tick)
  steady = float(np.median(times[1:])) if len(times) > 1 else times[0]
  n = len(configs)
  return {"seeds": n, "conv_impl": run.experiment.conv_impl,
          "public_conv_impl": run.experiment.public_conv_impl, "setup_secs": setup,
          "compile_secs": compile_secs, "round_secs": times,
          "steady_round_secs": steady, "steady_round_secs_per_seed": steady / n,
          "compile_plus_rounds_secs_per_seed": (compile_secs + sum(times)) / n}


def main() -> None:
  parser = argparse.ArgumentParser(prog="benchmarks/seed_axis.py", description=__doc__.split(
      "\n\n")[0])
  parser.add_argument("--config", default="digits_fcclplus_quick",
                      help="<scenario>_<variant> as experiments/train.py takes it")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  from fedjax_het import configs as configs_lib  # pylint: disable=import-outside-toplevel
  from fedjax_het import seed_stack  # pylint: disable=import-outside-toplevel
  from fedjax_het.config import load_module  # pylint: disable=import-outside-toplevel
  path, variant = configs_lib.resolve_name(args.config)
  config = load_module(path).get_config(variant)
  config.compilation_cache_dir = ""
  config.logging.progress = False
  config.seeds = tuple(int(s) for s in args.seeds.split(","))
  configs = seed_stack.seed_configs(config)
  report = {"config": args.config, "rounds": args.rounds, "measurements": []}
  for lanes in (configs[:1], configs):
    with tempfile.TemporaryDirectory() as workdir:
      report["measurements"].append(measure(lanes, args.rounds, pathlib.Path(workdir)))
    one, *more = report["measurements"]
    if more:
      report["per_seed_speedup_steady"] = (one["steady_round_secs_per_seed"]
                                           / more[0]["steady_round_secs_per_seed"])
      report["per_seed_speedup_compile_plus_rounds"] = (
          one["compile_plus_rounds_secs_per_seed"]
          / more[0]["compile_plus_rounds_secs_per_seed"])
    timing.write_result(args.out, report)
    print(report["measurements"][-1], flush=True)


if __name__ == "__main__":
  main()

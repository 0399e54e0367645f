"""A FCCL+ round's time from its phases: one public step and one local epoch, timed apart.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/fcclplus_phases.py \
        --config=digits_fcclplus --conv-impls custom_vjp,im2col \
        --out benchmarks/results/fcclplus_phases__digits_fcclplus__<device>.json

A full-size FCCL+ round on a 2-core CPU takes hours, too long to time whole
in one sitting. Its cost is two phases repeated a fixed number of times
(FCCL+ Alg. 1): `public_steps` collaborative steps (FCCM + FISL of every
participant on one public batch: ceil(public_size / batch) per public epoch),
then `local.epochs` epochs of every participant's local training (CE + FNTD).
The script builds the method's own phases (`fcclplus.make_phases`, the
functions the round composes) for the config, compiles

  * `collaborative_step` on one prepared public batch, and
  * `local_update` with `local.epochs = 1` (one epoch of every group, the
    padded layout the round uses),

times each (`--repeats`, median, after a first compiling call), and reports

    estimated_round_secs = public_steps * public_step_secs
                           + local.epochs * local_epoch_secs,

the round's time without the few elementwise updates between phases, with
XLA's memory estimate of each program (a program estimated above 90% of the
available memory is compiled but not run, the row lists it under "skipped"
and has no estimate; the other phase is still timed). `--conv-impls` measures each
convolution implementation in turn (the same data and initial state). The
public step runs on the state after `init`; its cost does not depend on the
values.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import timing  # noqa: E402
from first_round import load_config, memory_gib  # noqa: E402


def measure(config, conv_impl: str, repeats: int, scenario=None) -> tuple[dict, object]:
  """One conv_impl: compile and time the two phases; returns (row, scenario for reuse)."""
  import jax  # noqa: PLC0415

  from fedjax_het.algorithms import fcclplus  # noqa: PLC0415
  from fedjax_het.engine import public, rounds  # noqa: PLC0415
  from fedjax_het.experiment import Experiment  # noqa: PLC0415
  from fedjax_het.runtime.resources import available_memory_bytes  # noqa: PLC0415

  epochs = int(config.local.epochs)
  one_epoch = config.copy_and_resolve_references()
  one_epoch.local.epochs = 1
  tick = time.perf_counter()
  experiment = Experiment(one_epoch, conv_impl=conv_impl, scenario=scenario)
  row = {"conv_impl": conv_impl, "data_secs": time.perf_counter() - tick}
  phases = fcclplus.make_phases(one_epoch, experiment.setup)
  state = rounds.method_state(jax.block_until_ready(experiment.init_state()))
  spec = public.make_spec(config.collaborative, experiment.setup.public_mean,
                          experiment.setup.public_std)
  num_public = int(experiment.data.public.shape[0])
  batch = min(spec.batch_size, max(num_public, 2))
  row["public_steps"] = spec.epochs * math.ceil(num_public / batch)
  row["local_epochs"] = epochs
  key = jax.random.key(0)
  images = jax.jit(spec.prepare)(key, experiment.data.public[:batch])
  round_index = jax.numpy.zeros((), jax.numpy.int32)
  programs = {
      "public_step": (jax.jit(phases.collaborative_step), (state, images, key, round_index)),
      "local_epoch": (jax.jit(phases.local_update),
                      (state, experiment.data.groups, key, round_index)),
  }
  for name, (fn, args) in programs.items():
    tick = time.perf_counter()
    compiled = fn.lower(*args).compile()
    row[f"{name}_compile_secs"] = time.perf_counter() - tick
    row[f"{name}_memory_gib"] = memory_gib(compiled)
    available = available_memory_bytes(jax.devices()[0])
    if (available and row[f"{name}_memory_gib"] is not None
        and row[f"{name}_memory_gib"] * 2.0 ** 30 > 0.9 * available):
      row.setdefault("skipped", []).append(
          f"{name} needs about {row[f'{name}_memory_gib']:.1f} GiB, over 90% of the "
          f"{available / 2.0 ** 30:.1f} GiB available")
      print(f"[{conv_impl}] {row['skipped'][-1]}", flush=True)
      continue
    # The first call also loads the program: it is timed alone; the median of `repeats` more
    # calls (timing.py's rule) is the phase's time, or the first call's when repeats = 0.
    run = functools.partial(compiled, *args)
    first, _ = timing.median_seconds(run, 1)
    median, timed = timing.median_seconds(run, repeats) if repeats else (first, [])
    row[f"{name}_first_secs"], row[f"{name}_secs"] = first, median
    row[f"{name}_all"] = [first, *timed]
    print(f"[{conv_impl}] {name}: compile {row[f'{name}_compile_secs']:.1f} s, "
          f"{row[f'{name}_secs']:.2f} s, {row[f'{name}_memory_gib']:.2f} GiB", flush=True)
    del compiled
  if "skipped" not in row:
    row["estimated_round_secs"] = (row["public_steps"] * row["public_step_secs"]
                                   + epochs * row["local_epoch_secs"])
  return row, experiment.scenario


def main(argv: list[str] | None = None) -> dict:
  from fedjax_het.runtime import xla_cpu  # noqa: PLC0415 (starts no JAX backend)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--conv-impls", default="custom_vjp,im2col",
                      help="comma-separated, from models.CONV_IMPLS")
  parser.add_argument("--repeats", type=int, default=1,
                      help="timed calls per phase after the first (0: time the first call)")
  parser.add_argument("--xla-cpu-scheduler", default="auto", choices=xla_cpu.SCHEDULERS)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  scheduler = xla_cpu.set_xla_cpu_scheduler(args.xla_cpu_scheduler)  # before JAX starts
  import jax  # noqa: PLC0415

  from fedjax_het.models.layers import CONV_IMPLS  # noqa: PLC0415
  impls = [c for c in args.conv_impls.split(",") if c]
  unknown = sorted(set(impls) - set(CONV_IMPLS))
  if unknown:
    parser.error(f"--conv-impls: unknown {unknown}; valid: {CONV_IMPLS}")
  config = load_config(args.config, args.set)
  config.logging.progress = False
  config.logging.tensorboard = False
  if config.algorithm != "fcclplus":
    parser.error(f"--config: {args.config} runs {config.algorithm!r}; this script times "
                 "FCCL+'s phases (a *_fcclplus* config)")
  report = {"config": args.config, "overrides": args.set, "repeats": args.repeats,
            "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                        "jax": jax.__version__, "backend": jax.default_backend(),
                        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", "")},
            "rows": []}
  if jax.default_backend() == "cpu":
    report["machine"]["xla_cpu_scheduler"] = scheduler
  scenario = None
  for impl in impls:
    row, scenario = measure(config, impl, args.repeats, scenario)
    row["substituted"] = list(scenario.substituted)
    report["rows"].append(row)
    if args.out:
      timing.write_result(args.out, report, indent=2)
    if "skipped" not in row:
      print(f"[{impl}] estimated round {row['estimated_round_secs']:.1f} s = "
            f"{row['public_steps']} x {row['public_step_secs']:.2f} s + "
            f"{row['local_epochs']} x {row['local_epoch_secs']:.2f} s", flush=True)
  print(json.dumps(report, indent=2))
  return report


if __name__ == "__main__":
  main()

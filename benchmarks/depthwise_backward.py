"""The im2col depthwise convolution's hand-written backward pass against autodiff's, side by side.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/depthwise_backward.py \
        --width 0.125 --batch 64 --round digits_fcclplus_quick \
        --out benchmarks/results/depthwise_backward__digits_fcclplus_quick__<device>.json

`conv_impl="im2col"` (the CPU default) computes a depthwise convolution as the
sum over the kernel's taps of each window slice of the padded input times its
tap. Autodiff of that sum keeps every window slice for the backward pass, kh *
kw copies of the activation, and XLA:CPU materialises each of them as a kernel
of its own (BatchNorm and activation recomputed in each); its input gradient
is a sum of padded products. `fedjax_het.models.layers._depthwise_taps` keeps
only the input and computes the input gradient as a sum of taps over the
padded output gradient. Both are the same function to float32 rounding.

In one process, for each backbone with depthwise convolutions (MobileNetV2,
EfficientNet-B0), one local Adam step of cross-entropy (as `arch_steps.py`
times it: `--steps` steps in one `lax.scan`) is compiled with each backward
pass and the two are timed alternately (`--repeats` calls each, medians):
`speedup` = autodiff's step time / the hand-written one's. With `--round
CONFIG`, the same for one whole round of that config (`Experiment.
compile_rounds`, persistent and trace caches off so that each variant is traced),
with XLA's memory estimate of each and the largest difference between the two
states after one round.

`conv_impl="custom_vjp"` (the memory-lean convolutions a CPU run falls back to
when im2col does not fit) computes depthwise convolutions with the same sum of
taps; before, they were the stock depthwise convolution, a grouped
convolution. With `--public-step CONFIG`, one FCCL+ collaborative step of that
config (the phase the full Digits config runs with "custom_vjp" on a CPU) is
compiled with each and timed alternately (`--public-repeats`), with XLA's
memory estimates: `speedup` = stock time / sum-of-taps time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from fedjax_het.runtime import xla_cpu  # noqa: E402 (starts no JAX backend)
import timing  # noqa: E402 (benchmarks/timing.py; imports jax, starts no backend)

DEPTHWISE_BACKBONES = ("mobilenet_v2", "efficientnet_b0")
VARIANTS = ("custom", "autodiff")


@contextlib.contextmanager
def _traced_under(patch):
  """Enters `patch` (a `unittest.mock.patch`) with JAX's tracing caches cleared on entry and
  exit: the models' jitted apply functions would otherwise reuse a jaxpr traced without it."""
  import jax  # noqa: PLC0415
  jax.clear_caches()
  try:
    with patch:
      yield
  finally:
    jax.clear_caches()


def depthwise_backward(variant: str):
  """Within the block, models traced use the hand-written ("custom") or autodiff's backward."""
  from fedjax_het.models import layers  # noqa: PLC0415
  if variant == "custom":
    return _traced_under(contextlib.nullcontext())
  autodiff = lambda x, kernel, strides, pads: layers._depthwise_taps_fwd(  # noqa: E731 pylint: disable=protected-access
      x, kernel, strides, pads)[0]
  return _traced_under(mock.patch.object(layers, "_depthwise_taps", autodiff))


def custom_vjp_depthwise(variant: str):
  """Within the block, `conv_impl="custom_vjp"` computes a depthwise convolution as the sum of
  taps ("taps", the library's) or as the stock grouped convolution ("stock")."""
  from fedjax_het.models import layers  # noqa: PLC0415
  if variant == "taps":
    return _traced_under(contextlib.nullcontext())
  return _traced_under(mock.patch.dict(
      layers._CONV_FUNCTIONS,  # pylint: disable=protected-access
      {"custom_vjp": layers._conv_custom_vjp}))  # pylint: disable=protected-access


def _alternate(runs: dict, repeats: int) -> dict:
  """{variant: [seconds]}: `repeats` calls of each, alternating which goes first."""
  import jax  # noqa: PLC0415
  times = {variant: [] for variant in runs}
  order = tuple(runs)
  for r in range(repeats):
    for variant in (order if r % 2 == 0 else order[::-1]):
      start = time.perf_counter()
      jax.block_until_ready(runs[variant]())
      times[variant].append(time.perf_counter() - start)
  return times


def time_steps(name: str, *, batch: int, steps: int, width: float, repeats: int) -> dict:
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import optax  # noqa: PLC0415

  import arch_steps  # noqa: PLC0415
  from fedjax_het import models  # noqa: PLC0415

  images, labels = arch_steps._data(jax.random.key(1), steps, batch)  # pylint: disable=protected-access
  rngs = jax.random.split(jax.random.key(2), steps)
  optimizer = optax.adam(1e-3)
  runs, row = {}, {"backbone": name}
  for variant in VARIANTS:
    with depthwise_backward(variant):
      model = models.get_model(name, 10, width=width, conv_impl="im2col")
      variables = models.init_variables(model, jax.random.key(0))
      step = arch_steps._train_step(model, optimizer, jnp.float32)  # pylint: disable=protected-access

      def run(params, batch_stats, step=step):
        carry = (params, batch_stats, optimizer.init(params))
        (params, _, _), values = jax.lax.scan(step, carry, (images, labels, rngs))
        return params, values

      start = time.perf_counter()
      compiled = jax.jit(run).lower(variables["params"], variables["batch_stats"]).compile()
      row[f"{variant}_compile_secs"] = time.perf_counter() - start
      jax.block_until_ready(compiled(variables["params"], variables["batch_stats"]))
      runs[variant] = (lambda c=compiled, v=variables: c(v["params"], v["batch_stats"]))
  times = _alternate(runs, repeats)
  for variant in VARIANTS:
    row[f"{variant}_step_ms"] = 1e3 * statistics.median(times[variant]) / steps
  row["speedup"] = row["autodiff_step_ms"] / row["custom_step_ms"]
  return row


def time_round(name: str, *, repeats: int) -> dict:
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from first_round import load_config, memory_gib  # noqa: PLC0415
  from fedjax_het.experiment import Experiment  # noqa: PLC0415

  config = load_config(name, ["compilation_cache_dir=", "trace_cache=off"])
  runs, states, row = {}, {}, {"config": name}
  for variant in VARIANTS:
    with depthwise_backward(variant):
      experiment = Experiment(config)
      state = jax.block_until_ready(experiment.init_state())
      start = time.perf_counter()
      compiled = experiment.compile_rounds(state)
      row[f"{variant}_compile_secs"] = time.perf_counter() - start
    row[f"{variant}_memory_gib"] = memory_gib(compiled)
    states[variant] = jax.block_until_ready(compiled(state, experiment.data)[0])
    runs[variant] = (lambda c=compiled, s=state, d=experiment.data: c(s, d)[0])
  times = _alternate(runs, repeats)
  for variant in VARIANTS:
    row[f"{variant}_round_secs"] = statistics.median(times[variant])
    row[f"{variant}_round_all"] = times[variant]
  row["speedup"] = row["autodiff_round_secs"] / row["custom_round_secs"]
  diffs = jax.tree_util.tree_map(
      lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
      if np.issubdtype(np.asarray(a).dtype, np.floating) and np.asarray(a).size else 0.0,
      states["custom"], states["autodiff"])
  row["max_abs_state_diff"] = max(jax.tree_util.tree_leaves(diffs))
  return row


def time_public_step(name: str, *, repeats: int) -> dict:
  """One FCCL+ collaborative step of config `name` with custom_vjp convolutions, both ways."""
  import jax  # noqa: PLC0415

  from first_round import load_config, memory_gib  # noqa: PLC0415
  from fedjax_het.algorithms import fcclplus  # noqa: PLC0415
  from fedjax_het.engine import public, rounds  # noqa: PLC0415
  from fedjax_het.experiment import Experiment  # noqa: PLC0415

  config = load_config(name)
  runs, row = {}, {"config": name, "conv_impl": "custom_vjp"}
  for variant in ("taps", "stock"):
    with custom_vjp_depthwise(variant):
      experiment = Experiment(config, conv_impl="custom_vjp")
      phases = fcclplus.make_phases(config, experiment.setup)
      state = rounds.method_state(jax.block_until_ready(experiment.init_state()))
      spec = public.make_spec(config.collaborative, experiment.setup.public_mean,
                              experiment.setup.public_std)
      images = jax.jit(spec.prepare)(jax.random.key(0),
                                     experiment.data.public[:spec.batch_size])
      args = (state, images, jax.random.key(1), jax.numpy.zeros((), jax.numpy.int32))
      start = time.perf_counter()
      compiled = jax.jit(phases.collaborative_step).lower(*args).compile()
      row[f"{variant}_compile_secs"] = time.perf_counter() - start
      row[f"{variant}_memory_gib"] = memory_gib(compiled)
      start = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      row[f"{variant}_first_secs"] = time.perf_counter() - start
      runs[variant] = (lambda c=compiled, a=args: c(*a))
  times = _alternate(runs, repeats)
  for variant in runs:
    row[f"{variant}_step_secs"] = statistics.median(times[variant])
    row[f"{variant}_step_all"] = times[variant]
  row["speedup"] = row["stock_step_secs"] / row["taps_step_secs"]
  return row


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--backbones", default=",".join(DEPTHWISE_BACKBONES))
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--width", type=float, default=0.125)
  parser.add_argument("--repeats", type=int, default=4)
  parser.add_argument("--round", default="", help="also time one round of this config")
  parser.add_argument("--round-repeats", type=int, default=4)
  parser.add_argument("--public-step", default="",
                      help="also time one FCCL+ public step of this config, custom_vjp convs")
  parser.add_argument("--public-repeats", type=int, default=2)
  parser.add_argument("--xla-cpu-scheduler", default="auto", choices=xla_cpu.SCHEDULERS,
                      help="as config.xla_cpu_scheduler (auto: the memory-minimising one)")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  xla_cpu.set_xla_cpu_scheduler(args.xla_cpu_scheduler)

  result = {**timing.process_info(),
            "batch": args.batch, "steps": args.steps, "width": args.width,
            "repeats": args.repeats, "steps_rows": []}
  for name in filter(None, args.backbones.split(",")):
    row = time_steps(name, batch=args.batch, steps=args.steps, width=args.width,
                     repeats=args.repeats)
    print(json.dumps(row), flush=True)
    result["steps_rows"].append(row)
  if args.round:
    result["round"] = time_round(args.round, repeats=args.round_repeats)
    print(json.dumps(result["round"]), flush=True)
  if args.public_step:
    result["public_step"] = time_public_step(args.public_step, repeats=args.public_repeats)
    print(json.dumps(result["public_step"]), flush=True)
  if args.out:
    timing.write_result(args.out, result)
  return result


if __name__ == "__main__":
  main()

"""Do independent participants' local phases overlap on one GPU when each runs on its own stream?

    python benchmarks/gpu_streams.py --backbones efficientnet_b0,mobilenet_v2 \
        --out benchmarks/results/gpu_streams__digits_backbones__<device>.json

The local phase of a heterogeneous round trains each participant's backbone on
its own data, and the participants never meet there; on a GPU their kernels
still run one after another on the device's compute stream, so the phase costs
the sum of the participants' loops. XLA:GPU runs a called computation on a
stream of its own when the call carries a stream annotation
(`jax.experimental.compute_on.compute_on("gpu_stream:N")` around a jitted
function). For the backbones given, each a `--steps`-step Adam loop at batch
`--batch` in a `lax.scan` (as `gpu_compile.py` builds them), this script
compiles and times, in one process:

  * `in_turn`: one program calling the loops one after the other;
  * `streams`: one program calling each loop on its own stream (`gpu_stream:1`,
    `gpu_stream:2`, ...);
  * each loop alone (`alone`), for the sum and the maximum of its parts.

Per variant: compile seconds, first run, the median of `--repeats` runs, and
for `streams` the largest absolute difference of its outputs from `in_turn`'s
(the same computation compiled in another program: equal up to float
rounding). On a CPU the annotation is ignored and both variants run in turn
(the script runs there as its test).
Writes the JSON after every variant.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import optax
from jax.experimental.compute_on import compute_on

import gpu_compile  # benchmarks/, beside this script
import timing  # benchmarks/, beside this script
from fedjax_het import models
from fedjax_het.runtime import resources


def _on_stream(fn, stream: int):
  """`fn` on GPU stream `stream`: `compute_on` as a context (jax <= 0.10) or as a wrapper
  with the outputs' memory space (jax >= 0.11)."""
  try:
    return compute_on(f"gpu_stream:{stream}")(fn)
  except TypeError:
    return compute_on(fn, compute_type=f"gpu_stream:{stream}",
                      out_memory_spaces=jax.memory.Space.Device)


def _timed(compiled, args, repeats: int) -> tuple[object, dict]:
  """(the outputs of the first call, its time and the median of `repeats` more calls)."""
  tick = time.perf_counter()
  out = jax.block_until_ready(compiled(*args))
  first = time.perf_counter() - tick
  median, times = timing.median_seconds(functools.partial(compiled, *args), repeats)
  return out, {"first_run_secs": first, "run_secs": median, "run_secs_all": times}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--backbones", default="efficientnet_b0,mobilenet_v2")
  parser.add_argument("--impl", default="auto", help="models.conv_impl (auto: the device's)")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--width", type=float, default=1.0)
  parser.add_argument("--skip-alone", action="store_true", help="skip the one-loop programs")
  parser.add_argument("--only", default="", help="in_turn and/or streams (default: both)")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  backbones = [b for b in args.backbones.split(",") if b]
  impl = resources.resolve_conv_impl(args.impl)
  report = {**timing.process_info(),
            "backbones": backbones, "batch": args.batch, "steps": args.steps,
            "width": args.width, "impl": impl, "variants": {}}

  def save():
    if args.out:
      timing.write_result(args.out, report)

  loops, inputs = [], []
  for index, backbone in enumerate(backbones):
    model = models.get_model(backbone, 10, width=args.width, conv_impl=impl)
    variables = models.init_variables(model, jax.random.key(index))
    loops.append(gpu_compile.train_scan(model, optax.adam(1e-3)))
    ki, kl, kr = jax.random.split(jax.random.key(100 + index), 3)
    inputs.append((variables["params"], variables["batch_stats"],
                   jax.random.normal(ki, (args.steps, args.batch, 32, 32, 3), jnp.float32),
                   jax.random.randint(kl, (args.steps, args.batch), 0, 10),
                   jax.random.split(kr, args.steps)))
  jax.block_until_ready(inputs)

  def in_turn(all_inputs):
    return [loop(*xs) for loop, xs in zip(loops, all_inputs)]

  def streams(all_inputs):
    return [_on_stream(loop, i + 1)(*xs) for i, (loop, xs) in enumerate(zip(loops, all_inputs))]

  # {name: (function, its arguments)}
  variants = {"in_turn": (in_turn, (inputs,)), "streams": (streams, (inputs,))}
  if args.only:
    variants = {name: variants[name] for name in args.only.split(",")}
  if not args.skip_alone:
    for backbone, loop, xs in zip(backbones, loops, inputs):
      variants[f"alone[{backbone}]"] = (loop, xs)
  outputs = {}
  for name, (fn, call_args) in variants.items():
    row = {}
    try:
      tick = time.perf_counter()
      compiled = jax.jit(fn).lower(*call_args).compile()
      row["compile_secs"] = time.perf_counter() - tick
      outputs[name], timings = _timed(compiled, call_args, args.repeats)
      row.update(timings)
    except Exception as error:  # pylint: disable=broad-except  (a stream the runtime refuses)
      row["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
    if name == "streams" and "streams" in outputs and "in_turn" in outputs:
      diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), outputs["in_turn"],
                           outputs["streams"])
      row["max_abs_diff_from_in_turn"] = max(jax.tree.leaves(diffs))
    report["variants"][name] = row
    print(name, {k: v for k, v in row.items() if k != "run_secs_all"}, flush=True)
    save()
  alone = [report["variants"].get(f"alone[{b}]", {}).get("run_secs") for b in backbones]
  if all(t is not None for t in alone):
    report["alone_sum_secs"], report["alone_max_secs"] = sum(alone), max(alone)
  if "run_secs" in report["variants"].get("streams", {}):
    report["streams_over_in_turn"] = (report["variants"]["streams"]["run_secs"]
                                      / report["variants"]["in_turn"]["run_secs"])
  save()
  print({k: v for k, v in report.items() if k != "variants"}, flush=True)


if __name__ == "__main__":
  main()

"""What one backbone's training step costs to compile, to start and to run, per convolution impl.

    python benchmarks/gpu_compile.py --rows efficientnet_b0:xla,efficientnet_b0:gemm_taps \
        --out /tmp/gpu_compile.json

For each `backbone:impl` row (a convolution implementation of `models.CONV_IMPLS`), in this
process (so under this process's `XLA_FLAGS`): `--steps` Adam steps of
cross-entropy at batch `--batch` inside one jitted `lax.scan`, as the engine's
local phase runs them, on random 32x32 images (the costs depend only on the
shapes). Reported per row:

  * `trace_lower_secs`, `compile_secs`: tracing and lowering, then XLA's
    compile (on a GPU this includes autotuning every cuDNN convolution and
    GEMM fusion on the device);
  * `first_run_secs`: the first execution (on a GPU it also loads the
    kernels and builds the cuDNN execution plans);
  * `step_ms`: the median over `--repeats` further calls, per step;
  * `hlo`: counts in the optimised program (`compiled.as_text()`): cuDNN
    convolutions, cuBLAS GEMMs, Triton GEMM fusions, all fusions; and the
    lowered program's `stablehlo.convolution` ops;
  * with `--compile-profile`, `compile_profile`: the compile under the JAX
    profiler (`compile_profile.py`): its top events, which name XLA's passes
    and autotuners (the profiler adds seconds to `compile_secs` of that row).

`XLA_FLAGS` and the device are recorded, so rows of several processes with
different flags (`gpu_session.py` runs them) compare side by side. Writes the
JSON after every row.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import timing  # benchmarks/, beside this script
from fedjax_het import models

#: Markers counted in the optimised HLO text (name -> regular expression).
HLO_MARKERS = {
    "cudnn_convolutions": r'custom_call_target="__cudnn\$conv',
    "cublas_gemms": r'custom_call_target="__cublas\$(?:gemm|lt\$matmul)',
    "triton_gemm_fusions": r'"kind":"__triton_gemm"',
    "fusions": r"\bfusion\(",
}


def hlo_counts(compiled_text: str, lowered_text: str) -> dict[str, int]:
  """Counts of `HLO_MARKERS` in the optimised HLO and of convolutions in the StableHLO."""
  counts = {name: len(re.findall(pattern, compiled_text)) for name, pattern in HLO_MARKERS.items()}
  counts["stablehlo_convolutions"] = lowered_text.count("stablehlo.convolution")
  return counts


def train_scan(model, optimizer):
  """jit(params, batch_stats, images, labels, rngs) -> (params, losses): one Adam step a batch."""

  def loss(params, batch_stats, images, labels, rng):
    _, logits, new_vars = models.apply_model(
        model, {"params": params, "batch_stats": batch_stats}, images, train=True, rng=rng)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.mean(ce), new_vars["batch_stats"]

  def step(carry, inputs):
    params, batch_stats, opt_state = carry
    (value, batch_stats), grads = jax.value_and_grad(loss, has_aux=True)(
        params, batch_stats, *inputs)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), batch_stats, opt_state), value

  @jax.jit
  def run(params, batch_stats, images, labels, rngs):
    carry = (params, batch_stats, optimizer.init(params))
    (params, batch_stats, _), values = jax.lax.scan(step, carry, (images, labels, rngs))
    return params, batch_stats, values

  return run


def measure(backbone: str, impl: str, *, batch: int, steps: int, repeats: int, width: float,
            compile_profile: bool = False) -> dict:
  """One row: compile, first run and steady step of `backbone` with convolutions `impl`."""
  row = {"backbone": backbone, "impl": impl, "batch": batch, "steps": steps, "width": width}
  model = models.get_model(backbone, 10, width=width, conv_impl=impl)
  variables = models.init_variables(model, jax.random.key(0))
  run = train_scan(model, optax.adam(1e-3))
  ki, kl, kr = jax.random.split(jax.random.key(1), 3)
  args = (variables["params"], variables["batch_stats"],
          jax.random.normal(ki, (steps, batch, 32, 32, 3), jnp.float32),
          jax.random.randint(kl, (steps, batch), 0, 10), jax.random.split(kr, steps))
  jax.block_until_ready(args)
  tick = time.perf_counter()
  lowered = run.lower(*args)
  row["trace_lower_secs"] = time.perf_counter() - tick
  tick = time.perf_counter()
  compiled = None
  if compile_profile:
    import compile_profile as profiling  # noqa: PLC0415 (benchmarks/, beside this script)
    try:
      compiled, row["compile_profile"] = profiling.profile_compile(lowered.compile, top=30)
    except Exception as error:  # pylint: disable=broad-except  (a profiler that cannot start)
      row["compile_profile"] = {"error": f"{type(error).__name__}: {error}"}
      tick = time.perf_counter()
  if compiled is None:
    compiled = lowered.compile()
  row["compile_secs"] = time.perf_counter() - tick
  row["hlo"] = hlo_counts(compiled.as_text(), lowered.as_text())
  tick = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  row["first_run_secs"] = time.perf_counter() - tick
  times = []
  for _ in range(repeats):
    tick = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - tick)
  row["step_ms"] = 1e3 * statistics.median(times) / steps
  row["step_ms_all"] = [1e3 * t / steps for t in times]
  return row


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", default="efficientnet_b0:xla,efficientnet_b0:gemm_taps",
                      help="comma-separated backbone:impl pairs, measured in this order")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--width", type=float, default=1.0)
  parser.add_argument("--compile-profile", action="store_true")
  parser.add_argument("--label", default="", help="a name for this process's settings")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  report = {"label": args.label, **timing.process_info(), "rows": []}
  for item in filter(None, args.rows.split(",")):
    backbone, _, impl = item.partition(":")
    row = measure(backbone, impl or "xla", batch=args.batch, steps=args.steps,
                  repeats=args.repeats, width=args.width, compile_profile=args.compile_profile)
    report["rows"].append(row)
    print(json.dumps({k: v for k, v in row.items() if k != "compile_profile"}), flush=True)
    if args.out:
      timing.write_result(args.out, report)


if __name__ == "__main__":
  main()

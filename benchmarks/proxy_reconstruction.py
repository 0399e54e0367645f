"""GLFC's proxy reconstructions: the whole pool against the used gradients only, side by side.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/proxy_reconstruction.py \
        --out benchmarks/results/proxy_reconstruction__glfc_mid_pool__<device>.json

When any sampled client shares prototype gradients, GLFC's proxy server reconstructs them by
L-BFGS gradient matching (`fedjax_het.cil.proxy.server_update`). Its pool has a slot for every
class of every sampled client (GLFC Table 1 at mid scale: 10 clients x 6 slots = 60), and
`glfc.proxy.reconstruction_chunk = 0` reconstructs every slot in one vmapped program whether a
slot holds a gradient or not; `k > 0` reconstructs the used slots only, k at a time
(`gradient_inversion.reconstruct_used`). `glfc.proxy.encoder_conv_impl` chooses how the LeNet
encoder's convolutions are computed, whose second-order gradient the reconstruction takes
every iteration.

In one process, for the mid pool (60 slots, the 100-class CIFAR-100 encoder, 32x32x3 dummies,
`--steps` L-BFGS iterations at the mid config's fixed step 1.0, the last 20 iterates kept), each
variant (`pool` or `chunk<k>`, by convolution) is compiled once and timed with `--used` of the
slots holding a gradient, the variants alternating (`--repeats` calls each, medians).
`per_gradient_iteration_ms` divides by the used slots and the steps; `seconds_at_2000_steps`
scales the median to the 2000 iterations of the mid config (a reconstruction's cost is linear in
its iterations: one scan step each).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import timing  # noqa: E402 (benchmarks/timing.py; imports jax, starts no backend)

#: The mid pool: GLFC Table 1's 10 clients a round x 6 class slots; CIFAR-100's 100 classes.
POOL, NUM_CLASSES, KEEP_LAST, MID_STEPS = 60, 100, 20, 2000


def _variants(spec: str) -> list[tuple[str, int, str]]:
  """"pool:xla,chunk6:im2col" -> [(name, chunk, conv_impl)]; pool is chunk 0."""
  out = []
  for item in spec.split(","):
    mode, _, impl = item.partition(":")
    chunk = 0 if mode == "pool" else int(mode.removeprefix("chunk"))
    out.append((f"{mode}:{impl}", chunk, impl))
  return out


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default="pool:xla,pool:im2col,chunk6:im2col")
  parser.add_argument("--used", default="6,18,30,60",
                      help="slots of the 60 that hold a gradient, comma-separated")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)

  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from fedjax_het import models  # noqa: PLC0415
  from fedjax_het.cil import gradient_inversion as gi  # noqa: PLC0415
  from fedjax_het.cil import proxy as proxy_lib  # noqa: PLC0415

  used_counts = [int(u) for u in args.used.split(",")]
  key = jax.random.key(0)
  images = jax.random.uniform(jax.random.key(1), (POOL, 32, 32, 3))
  labels = jnp.arange(POOL, dtype=jnp.int32) % NUM_CLASSES
  options = dict(steps=args.steps, keep_last=KEEP_LAST, learning_rate=1.0, linesearch="none")
  calls, report_variants = {}, {}
  for name, chunk, impl in _variants(args.variants):
    encoder = proxy_lib.make_encoder(NUM_CLASSES, conv_impl=impl)
    variables = models.init_variables(encoder, key, input_shape=(1, 32, 32, 3))
    pool = jax.jit(jax.vmap(lambda x, y, e=encoder, v=variables: gi.prototype_gradient(
        e, v, x, y)))(images, labels)
    if chunk:
      run = jax.jit(lambda use, e=encoder, v=variables, g=pool, c=chunk: gi.reconstruct_used(
          e, v, g, labels, use, key, chunk=c, **options))
    else:
      run = jax.jit(lambda use, e=encoder, v=variables, g=pool: gi.reconstruct_batch(
          e, v, g, labels, key, **options))
    start = time.perf_counter()
    jax.block_until_ready(run(jnp.ones((POOL,), bool)))
    report_variants[name] = {"chunk": chunk, "encoder_conv_impl": impl,
                             "compile_and_first_call_secs": round(time.perf_counter() - start, 2)}
    calls[name] = run
  times = {(name, u): [] for name in calls for u in used_counts}
  for _ in range(args.repeats):
    for u in used_counts:
      use = jnp.arange(POOL) < u
      for name, run in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(run(use))
        times[(name, u)].append(time.perf_counter() - start)
  rows = []
  for (name, u), secs in times.items():
    median = statistics.median(secs)
    rows.append({"variant": name, "used": u, "median_secs": round(median, 3),
                 "all_secs": [round(t, 3) for t in secs],
                 "per_gradient_iteration_ms": round(1e3 * median / u / args.steps, 3),
                 "seconds_at_2000_steps": round(median * MID_STEPS / args.steps, 1)})
  base = {u: next(r["median_secs"] for r in rows if r["variant"] == "pool:xla" and r["used"] == u)
          for u in used_counts} if "pool:xla" in calls else {}
  for row in rows:
    if base:
      row["speedup_vs_pool_xla"] = round(base[row["used"]] / row["median_secs"], 2)
  report = {"command": "python benchmarks/proxy_reconstruction.py " + " ".join(
      sys.argv[1:] if argv is None else argv),
            "pool_slots": POOL, "num_classes": NUM_CLASSES, "steps": args.steps,
            "keep_last": KEEP_LAST, "repeats": args.repeats, "process": timing.process_info(),
            "variants": report_variants, "rows": rows}
  for row in rows:
    print(f"{row['variant']:>14} used {row['used']:2d}: {row['median_secs']:7.2f} s "
          f"({row['per_gradient_iteration_ms']:.2f} ms a gradient-iteration; "
          f"{row['seconds_at_2000_steps']:.0f} s at 2000 steps)"
          + (f", {row['speedup_vs_pool_xla']}x pool:xla" if base else ""), flush=True)
  return timing.write_result(args.out, report)


if __name__ == "__main__":
  main()

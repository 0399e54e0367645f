"""Training-step speed of each backbone: float32 vs bfloat16, and a cohort vs one big batch.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/arch_steps.py \
        --out benchmarks/results/arch_steps__digits_backbones__<device>.json

Two questions the round benchmarks cannot answer on their own, measured side by
side in one process:

1. "steps": where a full-size FCCL+ Digits round spends its time. For each
   Digits backbone at full width (ResNet10, ResNet12, EfficientNet-B0,
   MobileNetV2) one local Adam step of cross-entropy at the paper's batch (256),
   timed as the engine runs it (`--steps` steps inside one `lax.scan`), in
   float32 and with a bfloat16 forward/backward (parameters cast to bfloat16
   inside the step, float32 master weights, optimiser state, BatchNorm
   statistics and loss). Reported: milliseconds per step, `bf16_speedup`
   (= float32 time / bfloat16 time).
2. "cohort": the ceiling of vmapping clients (FedAvg at scale). With
   the FedAvg CIFAR CNN at batch 50, one step of K clients vmapped (K different
   models, grouped convolutions) against one model at batch 50 * K (the same
   images through one set of weights: the most any formulation of K clients can
   hope for) and against K sequential batch-50 steps (what a Python loop over
   clients runs). `vmap_speedup` = K x t(batch 50) / t(vmap K) is what the
   engine gets over the loop per step; `ceiling_speedup` = K x t(batch 50) /
   t(batch 50 K) bounds it.

Random images and labels (the timing depends only on the shapes). Compilation
is excluded (one warm-up call each); times are medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import optax

from fedjax_het import models
from fedjax_het.runtime.resources import resolve_conv_impl
import timing
from timing import median_seconds

REPO = pathlib.Path(__file__).resolve().parents[1]
DIGITS_BACKBONES = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _median(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # warm-up: compile + first run
  return median_seconds(fn, repeats)[0]


def _loss_fn(model, compute_dtype):
  """Cross-entropy of a train-mode forward, computed in `compute_dtype`, loss in float32."""

  def loss(params, batch_stats, images, labels, rng):
    cast = lambda t: jax.tree_util.tree_map(lambda a: a.astype(compute_dtype), t)
    features, logits, new_vars = models.apply_model(
        model, {"params": cast(params), "batch_stats": batch_stats},
        images.astype(compute_dtype), train=True, rng=rng)
    del features
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.mean(ce), new_vars["batch_stats"]

  return loss


def _train_step(model, optimizer, compute_dtype):
  loss = _loss_fn(model, compute_dtype)

  def step(carry, inputs):
    params, batch_stats, opt_state = carry
    images, labels, rng = inputs
    (value, batch_stats), grads = jax.value_and_grad(loss, has_aux=True)(
        params, batch_stats, images, labels, rng)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), batch_stats, opt_state), value

  return step


def _data(key, n, batch):
  ki, kl = jax.random.split(key)
  images = jax.random.normal(ki, (n, batch, 32, 32, 3), jnp.float32)
  labels = jax.random.randint(kl, (n, batch), 0, 10)
  return images, labels


def time_scan_steps(name: str, batch: int, steps: int, dtype: str, repeats: int,
                    width: float = 1.0) -> float:
  """Seconds per step of `steps` Adam steps of `name` inside one jitted `lax.scan`."""
  model = models.get_model(name, 10, width=width, conv_impl=resolve_conv_impl("auto"))
  variables = models.init_variables(model, jax.random.key(0))
  optimizer = optax.adam(1e-3)
  step = _train_step(model, optimizer, DTYPES[dtype])
  images, labels = _data(jax.random.key(1), steps, batch)
  rngs = jax.random.split(jax.random.key(2), steps)

  @jax.jit
  def run(params, batch_stats):
    carry = (params, batch_stats, optimizer.init(params))
    (params, _, _), values = jax.lax.scan(step, carry, (images, labels, rngs))
    return params, values

  seconds = _median(lambda: run(variables["params"], variables["batch_stats"]), repeats)
  return seconds / steps


def time_cohort(cohort: int, batch: int, steps: int, repeats: int) -> dict:
  """One FedAvg-CNN step: K vmapped clients vs one model at K*batch vs one at batch."""
  model = models.get_model("fedavg_cifar_cnn", 10, conv_impl=resolve_conv_impl("auto"))
  optimizer = optax.sgd(0.05)
  step = _train_step(model, optimizer, jnp.float32)
  keys = jax.random.split(jax.random.key(0), cohort)
  stacked = jax.vmap(lambda k: models.init_variables(model, k))(keys)
  single = models.init_variables(model, jax.random.key(0))

  def scan_run(variables, images, labels):
    carry = (variables["params"], variables["batch_stats"], optimizer.init(variables["params"]))
    rngs = jax.random.split(jax.random.key(3), images.shape[0])
    (params, _, _), _ = jax.lax.scan(step, carry, (images, labels, rngs))
    return params

  images, labels = _data(jax.random.key(1), steps, batch * cohort)
  k_images = images.reshape(steps, cohort, batch, 32, 32, 3).swapaxes(0, 1)
  k_labels = labels.reshape(steps, cohort, batch).swapaxes(0, 1)
  vmapped = jax.jit(jax.vmap(scan_run))
  one = jax.jit(scan_run)
  t_vmap = _median(lambda: vmapped(stacked, k_images, k_labels), repeats) / steps
  t_big = _median(lambda: one(single, images, labels), repeats) / steps
  t_small = _median(lambda: one(single, images[:, :batch], labels[:, :batch]), repeats) / steps
  return {"cohort": cohort, "batch": batch,
          "vmap_step_ms": 1e3 * t_vmap, "big_batch_step_ms": 1e3 * t_big,
          "one_client_step_ms": 1e3 * t_small,
          "vmap_speedup": cohort * t_small / t_vmap,
          "ceiling_speedup": cohort * t_small / t_big}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="")
  parser.add_argument("--backbones", default=",".join(DIGITS_BACKBONES))
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--width", type=float, default=1.0)
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--cohorts", default="10,100")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  result = {**timing.process_info(),
            "batch": args.batch, "steps": args.steps, "width": args.width,
            "steps_rows": [], "cohort_rows": []}
  for name in filter(None, args.backbones.split(",")):
    row = {"backbone": name}
    for dtype in filter(None, args.dtypes.split(",")):
      start = time.perf_counter()
      row[f"{dtype}_step_ms"] = 1e3 * time_scan_steps(name, args.batch, args.steps, dtype,
                                                      args.repeats, args.width)
      row[f"{dtype}_wall_secs"] = time.perf_counter() - start
    if "float32_step_ms" in row and "bfloat16_step_ms" in row:
      row["bf16_speedup"] = row["float32_step_ms"] / row["bfloat16_step_ms"]
    print(json.dumps(row), flush=True)
    result["steps_rows"].append(row)
  for cohort in (int(k) for k in args.cohorts.split(",") if k):
    row = time_cohort(cohort, 50, 5, args.repeats)
    print(json.dumps(row), flush=True)
    result["cohort_rows"].append(row)
  if args.out:
    timing.write_result(args.out, result)


if __name__ == "__main__":
  main()

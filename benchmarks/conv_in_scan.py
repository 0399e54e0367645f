"""Micro-benchmark: conv implementations inside `lax.scan`, alone and vmapped.

Measures, in one process and side by side, the training throughput of a
small zoo CNN for every `conv_impl` ("xla", "im2col", "custom_vjp") in three
formulations:

  * loop:  a jitted single SGD step called from Python `--steps` times;
  * scan:  one jitted `lax.scan` over `--steps` SGD steps (a local epoch);
  * vmap:  the same scan, `jax.vmap`ped over `--clients` stacked clients.

On XLA:CPU the stock convolution's gradients run about 22-37x slower inside loop
bodies (jax-ml/jax#12868: non-canonical layouts in loop bodies); "im2col" and "custom_vjp" are
the two fixes. Throughput is reported as client-steps per second (median of
`--repeats` timed runs after compiling ahead of time and one warm-up run),
with ratios to "xla". Because the stock conv is so slow inside loops on
XLA:CPU, its scan/vmap formulations run `--xla-scan-steps` steps instead of
`--steps` (per-step throughput does not depend on the scan length).

Usage:
  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/conv_in_scan.py \
      [--model resnet10 --width 0.25 --batch 64 --steps 20 --clients 4] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models

import timing  # benchmarks/timing.py, beside this script


def _make_epoch(model, lr):
  """Returns (step, epoch): one SGD step and a scan over a stack of batches."""

  def loss_fn(params, batch_stats, images, labels):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=jax.random.key(0))
    log_probs = jax.nn.log_softmax(logits)
    loss = -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))
    return loss, new_variables["batch_stats"]

  def step(variables, batch):
    images, labels = batch
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        variables["params"], variables["batch_stats"], images, labels)
    params = jax.tree_util.tree_map(lambda p, g: p - lr * g, variables["params"], grads)
    return {"params": params, "batch_stats": batch_stats}, loss

  def epoch(variables, images, labels):
    return jax.lax.scan(step, variables, (images, labels))

  return step, epoch


def _measure(fn, args, repeats):
  """(compile seconds, median seconds per call) of jitted `fn` on `args`."""
  start = time.perf_counter()
  compiled = fn.lower(*args).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))  # first run: page faults, caches
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return compile_s, statistics.median(times)


def run(args) -> dict:
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.normal(size=(args.steps, args.batch, 32, 32, 3)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 10, size=(args.steps, args.batch)), jnp.int32)
  results, compile_seconds, steps_used = {}, {}, {}
  for impl in args.impls:
    model = models.get_model(args.model, 10, width=args.width, conv_impl=impl)
    variables = models.init_variables(model, jax.random.key(0))
    stacked = jax.vmap(lambda k, m=model: models.init_variables(m, k))(
        jax.random.split(jax.random.key(1), args.clients))
    step, epoch = _make_epoch(model, args.lr)
    jit_step = jax.jit(step)
    # The stock conv is so slow inside scan on XLA:CPU that its loop
    # formulations run over fewer steps (throughput per step is unaffected).
    n = args.steps if impl != "xla" else min(args.steps, args.xla_scan_steps)
    k_images = jnp.broadcast_to(images[None, :n], (args.clients, n) + images.shape[1:])
    k_labels = jnp.broadcast_to(labels[None, :n], (args.clients, n) + labels.shape[1:])
    row, row_compile, row_steps = {}, {}, {}
    for formulation in args.formulations:
      if formulation == "loop":
        compile_s, _ = _measure(jit_step, (variables, (images[0], labels[0])), 1)

        def loop(v):
          for t in range(args.steps):
            v, _ = jit_step(v, (images[t], labels[t]))
          return v

        loop(variables)
        times = []
        for _ in range(args.repeats):
          start = time.perf_counter()
          jax.block_until_ready(loop(variables))
          times.append(time.perf_counter() - start)
        seconds, client_steps = statistics.median(times), args.steps
      elif formulation == "scan":
        compile_s, seconds = _measure(jax.jit(epoch), (variables, images[:n], labels[:n]),
                                      args.repeats)
        client_steps = n
      else:
        compile_s, seconds = _measure(jax.jit(jax.vmap(epoch)), (stacked, k_images, k_labels),
                                      args.repeats)
        client_steps = n * args.clients
      row[formulation] = client_steps / seconds
      row_compile[formulation] = compile_s
      row_steps[formulation] = client_steps
      print(f"  {impl:>10s} {formulation:>5s}: {row[formulation]:8.2f} client-steps/s "
            f"(compile {compile_s:.1f} s, {client_steps} client-steps per call)", flush=True)
    results[impl], compile_seconds[impl], steps_used[impl] = row, row_compile, row_steps
  ratios = {impl: {f: results[impl][f] / results["xla"][f] for f in results[impl]}
            for impl in results} if "xla" in results else {}
  return {"config": vars(args), "client_steps_per_second": results, "ratio_to_xla": ratios,
          "compile_seconds": compile_seconds, "client_steps_per_call": steps_used,
          **timing.process_info()}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="resnet10", choices=models.MODEL_NAMES)
  parser.add_argument("--width", type=float, default=0.25)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--clients", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--lr", type=float, default=0.01)
  parser.add_argument("--xla-scan-steps", type=int, default=4,
                      help="steps of the scan/vmap formulations for conv_impl='xla'")
  parser.add_argument("--impls", nargs="+", default=list(models.CONV_IMPLS),
                      choices=models.CONV_IMPLS)
  parser.add_argument("--formulations", nargs="+", default=["loop", "scan", "vmap"],
                      choices=["loop", "scan", "vmap"])
  parser.add_argument("--out", default=None, help="write the results as JSON here")
  args = parser.parse_args(argv)
  print(f"{args.model} width {args.width}, batch {args.batch}, {args.steps} SGD steps, "
        f"{args.clients} clients for vmap; backend {jax.default_backend()}", flush=True)
  report = run(args)
  print("\nclient-steps/s (ratio to xla)")
  for impl, row in report["client_steps_per_second"].items():
    cells = "  ".join(f"{f}: {v:8.2f} ({report['ratio_to_xla'].get(impl, {}).get(f, 1):5.2f}x)"
                      for f, v in row.items())
    print(f"  {impl:>10s}  {cells}")
  if args.out:
    timing.write_result(args.out, report, indent=2)
  else:
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main(sys.argv[1:])

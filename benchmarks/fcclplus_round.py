"""Speed of one FCCL+ Digits round: the engine vs a Python loop over clients, and scaling.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/fcclplus_round.py \
        --out benchmarks/results/fcclplus_round__digits_fcclplus_quick__<device>.json

Measured side by side in one process (the machines are shared and noisy, so only
ratios are meaningful):

1. engine vs loop: client-steps per second of one FCCL+ round on the quick
   heterogeneous Digits setting (ResNet10/ResNet12/EfficientNet-B0/MobileNetV2
   at width 1/8). "engine" = the library's round: one jitted function, clients
   vmapped within each architecture group, local epochs and public batches as
   `lax.scan`. "loop" = the same math as PyTorch-style code would run it: per
   public batch a jitted forward per client, the targets, then a jitted
   FCCM + omega*FISL step per client; per local batch a jitted CE + FNTD step
   per client, all driven by Python loops, with the stock XLA convolution (the
   fastest choice for per-client jitted steps, benchmarks/conv_in_scan.py;
   `--loop-conv-impl` changes it). A client-step is one optimiser step of one
   client (public or local). Compilation is excluded (one warm-up round).
2. scaling: round time of the engine for K = 4, 16, 64 homogeneous clients
   (same per-client data), reported as seconds per round and per client-step.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import losses
from fedjax_het.algorithms import common
from fedjax_het.config import load_module
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import optim
from fedjax_het.experiment import Experiment
import timing
from timing import median_seconds

REPO = pathlib.Path(__file__).resolve().parents[1]


def _digits_config(variant: str):
  c = load_module(REPO / "fedjax_het/configs/digits.py").get_config(variant)
  c.logging.progress = False
  c.logging.tensorboard = False
  c.compilation_cache_dir = ""
  return c


def client_steps(experiment) -> int:
  """Optimiser steps of all clients in one round (public batches + local batches)."""
  c = experiment.config
  public_batches = c.collaborative.epochs * -(-len(experiment.scenario.public)
                                              // c.collaborative.batch_size)
  local = sum(c.local.epochs * -(-len(s.labels) // c.local.batch_size)
              for s in experiment.scenario.train)
  return public_batches * experiment.setup.num_participants + local


def engine_round(experiment, repeats):
  state = experiment.init_state()
  round_fn = jax.jit(experiment.round_fn)
  state, _ = round_fn(state, experiment.data)  # compile
  holder = {"state": state}

  def one():
    holder["state"], metrics = round_fn(holder["state"], experiment.data)
    return holder["state"]

  return median_seconds(one, repeats)


def loop_round(experiment, repeats):
  """The same FCCL+ round as Python loops over clients, batches and jitted steps.

  `experiment` fixes the models (and their conv_impl), data and initial state.
  """
  c, setup = experiment.config, experiment.setup
  lam, omega, mu, tau = (c.fcclplus.off_diagonal_weight, c.fcclplus.fisl_weight,
                         c.fcclplus.fisl_temperature, c.fcclplus.fntd_temperature)
  col_tx = optim.make_optimizer("adam")
  loc_tx = optim.make_optimizer("adam", weight_decay=c.local.weight_decay)
  public_prepare = jax.jit(lambda k, x: normalizer(setup.public_mean, setup.public_std)(
      x.astype(jnp.float32) / 255.0))
  private_prepare = normalizer(setup.private_mean, setup.private_std)
  clients = []  # (group, forward, variables, teacher, images, labels)
  state = experiment.init_state()
  for group in experiment.groups:
    for slot, participant in enumerate(group.clients):
      take = lambda t: jax.tree_util.tree_map(lambda v: v[slot], t)
      split = experiment.scenario.train[participant]
      clients.append({"group": group, "vars": take(state["groups"][group.name]["variables"]),
                      "teacher": take(state["groups"][group.name]["teacher"]),
                      "images": jnp.asarray(split.images), "labels": jnp.asarray(split.labels)})

  steps = {}
  for group in experiment.groups:
    forward = common.forward_fn(group, train=True)

    def fwd(params, stats, images, key, forward=forward):
      h, z, _ = forward(params, stats, images, key)
      return z, losses.instance_similarity_matrix(features=h, temperature=mu)

    def col_step(params, stats, images, key, z_bar, s_bar, lr, forward=forward):
      def loss(p):
        h, z, new_stats = forward(p, stats, images, key)
        s = losses.instance_similarity_matrix(features=h, temperature=mu)
        return (losses.cross_correlation_loss(logits=z, target_logits=z_bar,
                                              off_diagonal_weight=lam)
                + omega * losses.instance_similarity_loss(similarity=s, target_similarity=s_bar),
                new_stats)
      grads, new_stats = jax.grad(loss, has_aux=True)(params)
      new_params, _ = optim.apply_updates(col_tx, params, grads, col_tx.init(params), lr)
      return new_params, new_stats

    def local_step(params, stats, opt_state, x, y, mask, teacher, key, lr, forward=forward):
      def loss(p):
        _, z, new_stats = forward(p, stats, x, key, mask)
        _, zt, _ = forward(teacher["params"], teacher["batch_stats"], x, key, mask)
        return (losses.softmax_cross_entropy(logits=z, labels=y, mask=mask)
                + losses.non_target_distillation_loss(student_logits=z, teacher_logits=zt,
                                                      labels=y, temperature=tau, mask=mask),
                new_stats)
      grads, new_stats = jax.grad(loss, has_aux=True)(params)
      new_params, opt_state = optim.apply_updates(loc_tx, params, grads, opt_state, lr)
      return new_params, new_stats, opt_state

    steps[group.name] = (jax.jit(fwd), jax.jit(col_step), jax.jit(local_step))

  public = experiment.data.public
  b0, bl = c.collaborative.batch_size, c.local.batch_size
  rng = np.random.default_rng(0)

  def one_round():
    key = jax.random.key(0)
    order = rng.permutation(len(public))
    for start in range(0, len(public), b0):
      rows = order[start:start + b0]
      rows = np.concatenate([rows, order[:b0 - len(rows)]])
      images = public_prepare(key, public[rows])
      outs = [steps[cl["group"].name][0](cl["vars"]["params"], cl["vars"]["batch_stats"],
                                         images, key) for cl in clients]
      z_bar = jnp.mean(jnp.stack([o[0] for o in outs]), 0)
      s_bar = jnp.mean(jnp.stack([o[1] for o in outs]), 0)
      for cl in clients:
        params, stats = steps[cl["group"].name][1](cl["vars"]["params"], cl["vars"]["batch_stats"],
                                                   images, key, z_bar, s_bar, 1e-3)
        cl["vars"] = {"params": params, "batch_stats": stats}
    for cl in clients:
      params, stats = cl["vars"]["params"], cl["vars"]["batch_stats"]
      opt_state = loc_tx.init(params)
      n = len(cl["labels"])
      for _ in range(c.local.epochs):
        perm = rng.permutation(n)
        for start in range(0, n, bl):
          rows = perm[start:start + bl]
          mask = np.arange(bl) < len(rows)
          rows = np.pad(rows, (0, bl - len(rows)))
          x = private_prepare(cl["images"][rows])
          params, stats, opt_state = steps[cl["group"].name][2](
              params, stats, opt_state, x, cl["labels"][rows], jnp.asarray(mask), cl["teacher"],
              key, 1e-3)
      cl["vars"] = {"params": params, "batch_stats": stats}
    return [cl["vars"]["params"] for cl in clients]

  one_round()  # compile every step function
  return median_seconds(one_round, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="4,16,64", help="client counts for the scaling run")
  parser.add_argument("--scaling-arch", default="resnet10")
  parser.add_argument("--width", type=float, default=0.125)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="", help="write the results as JSON here")
  parser.add_argument("--skip-loop", action="store_true")
  parser.add_argument("--loop-conv-impl", default="xla",
                      help="convolution implementation of the Python-loop baseline")
  args = parser.parse_args()
  report = {**timing.process_info(), "repeats": args.repeats}

  config = _digits_config("fcclplus_quick")
  config.models.width = args.width
  experiment = Experiment(config)
  n_steps = client_steps(experiment)
  engine_s, engine_all = engine_round(experiment, args.repeats)
  report["heterogeneous_round"] = {
      "setting": "digits_fcclplus_quick (4 architectures)", "conv_impl": experiment.conv_impl,
      "client_steps": n_steps, "engine_secs": engine_s, "engine_all": engine_all,
      "engine_client_steps_per_sec": n_steps / engine_s}
  print(f"[heterogeneous] {n_steps} client-steps/round; engine {engine_s:.2f} s "
        f"({n_steps / engine_s:.1f} client-steps/s)", flush=True)
  if not args.skip_loop:
    loop_config = _digits_config("fcclplus_quick")
    loop_config.models.width = args.width
    loop_config.models.conv_impl = args.loop_conv_impl
    loop_s, loop_all = loop_round(Experiment(loop_config), args.repeats)
    report["heterogeneous_round"].update({
        "loop_conv_impl": args.loop_conv_impl, "loop_secs": loop_s, "loop_all": loop_all,
        "loop_client_steps_per_sec": n_steps / loop_s,
        "engine_speedup_over_loop": loop_s / engine_s})
    print(f"[heterogeneous] loop {loop_s:.2f} s ({n_steps / loop_s:.1f} client-steps/s); "
          f"engine / loop speed ratio {loop_s / engine_s:.2f}x", flush=True)

  scaling = []
  for k in [int(v) for v in args.clients.split(",")]:
    c = _digits_config("fcclplus_homogeneous_quick")
    c.models.architectures = (args.scaling_arch,) * k
    c.models.width = args.width
    c.scenario.domains = tuple(("mnist", "usps", "svhn", "syn")[i % 4] for i in range(k))
    c.scenario.private_sizes.update({"mnist": 64, "usps": 64, "svhn": 64, "syn": 64})
    c.scenario.public_size = 256
    c.local.epochs = 1
    c.local.batch_size = 32
    exp = Experiment(c)
    n = client_steps(exp)
    secs, all_secs = engine_round(exp, args.repeats)
    scaling.append({"clients": k, "client_steps": n, "round_secs": secs, "all": all_secs,
                    "client_steps_per_sec": n / secs})
    print(f"[scaling] K={k:3d}: {secs:.2f} s/round, {n / secs:.1f} client-steps/s", flush=True)
  base = scaling[0]
  for row in scaling:
    row["time_ratio_vs_first"] = row["round_secs"] / base["round_secs"]
    row["per_client_time_ratio_vs_first"] = ((row["round_secs"] / row["clients"])
                                             / (base["round_secs"] / base["clients"]))
  report["scaling"] = {"arch": args.scaling_arch, "width": args.width, "rows": scaling}
  print(json.dumps(report, indent=2))
  if args.out:
    timing.write_result(args.out, report, indent=2)


if __name__ == "__main__":
  main()

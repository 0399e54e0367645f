"""Speed of one FedAvg round at scale: the engine vs a fedjax-style Python loop, by cohort size.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/fedavg_scale.py \
        --out benchmarks/results/fedavg_scale__cifar10_fedavg__<device>.json

Setting: `fedjax_het/configs/cifar10.py:fedavg` (100 clients, Dirichlet(0.5), the FedAvg
CIFAR CNN, batch 50, local SGD), with a cohort of 10, 50 and 100 clients per round. On a
CPU the defaults shrink the per-client work (`--train-size 10000`: 100 images per client,
`--epochs 1`) so that a round takes seconds; `--train-size 0 --epochs 5` is the paper
setting (use it on a GPU). Without the CIFAR-10 bundle the synthetic digit stand-in is used
(the timing depends only on the shapes).

Measured side by side in one process (only ratios are meaningful on shared machines):
1. "engine": the library's round, one jitted program: the cohort's data gathered, every
   client's local epochs one loop over exactly its own steps, the cohort one after
   another (`fedavg.client_loop="map"`, the CPU default) or vmapped ("vmap", the GPU/TPU
   default), then the weighted average and the server step.
2. "loop": the same math as fedjax's default backend or a PyTorch loop runs it: for each
   sampled client, for each batch, a jitted SGD step (stock XLA convolutions, the fastest
   choice for a per-client jitted step on CPU); then a jitted weighted average.
Both train the same cohort from the same server model on the same batches sizes.
Reported: seconds per round, client-steps per second, `engine_speedup` = loop / engine,
and the per-client-step time of each cohort relative to the smallest.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_het import losses, models
from fedjax_het.config import load_module
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort
from fedjax_het.engine.clients import slot_active
from fedjax_het.experiment import Experiment
import timing
from timing import median_seconds

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(cohort_size: int, train_size: int, epochs: int, conv_impl: str,
            client_loop: str = "auto", partition: str = "dirichlet"):
  c = load_module(REPO / "fedjax_het/configs/cifar10.py").get_config("fedavg")
  c.fedavg.clients_per_round = cohort_size
  c.scenario.train_size = train_size
  c.scenario.test_size = 500
  c.local.epochs = epochs
  c.models.conv_impl = conv_impl
  c.fedavg.client_loop = client_loop
  c.scenario.partition = partition
  c.logging.progress = False
  c.logging.tensorboard = False
  c.compilation_cache_dir = ""
  return c


def client_steps(experiment, slots) -> int:
  c = experiment.config
  sizes = np.asarray(experiment.data.groups[experiment.groups[0].name].sizes)[slots]
  return int(sum(c.local.epochs * math.ceil(n / c.local.batch_size) for n in sizes))


def engine_round(experiment, repeats):
  """Round 0 from the initial state, repeated (the same cohort as the loop trains)."""
  state = experiment.init_state()
  round_fn = jax.jit(experiment.round_fn)
  jax.block_until_ready(round_fn(state, experiment.data))  # compile + warm-up
  return median_seconds(lambda: round_fn(state, experiment.data)[0], repeats)


def loop_round(experiment, slots, repeats):
  """FedAvg as a Python loop over clients and batches of a jitted per-client SGD step."""
  c, group = experiment.config, experiment.groups[0]
  data = jax.device_get(experiment.data.groups[group.name])
  preprocess = normalizer(experiment.setup.private_mean, experiment.setup.private_std)
  tx = optax.sgd(float(c.local.lr))
  batch = int(c.local.batch_size)
  server = experiment.init_state()["server"]  # the unstacked global model

  @jax.jit
  def step(variables, opt_state, images, labels):
    def loss(params):
      _, logits, new = models.apply_model(group.model, {"params": params,
                                                        "batch_stats": variables["batch_stats"]},
                                          preprocess(images), train=True)
      return losses.softmax_cross_entropy(logits=logits, labels=labels), new["batch_stats"]
    grads, stats = jax.grad(loss, has_aux=True)(variables["params"])
    updates, opt_state = tx.update(grads, opt_state, variables["params"])
    return {"params": optax.apply_updates(variables["params"], updates),
            "batch_stats": stats}, opt_state

  average = jax.jit(aggregation.weighted_mean)
  rng = np.random.default_rng(0)

  def one():
    trained = []
    for slot in slots:
      n = int(data.sizes[slot])
      variables, opt_state = server, tx.init(server["params"])
      for _ in range(int(c.local.epochs)):
        order = rng.permutation(n)
        for start in range(0, n, batch):
          rows = order[start:start + batch]
          variables, opt_state = step(variables, opt_state, data.images[slot][rows],
                                      data.labels[slot][rows])
      trained.append(variables)
    stacked = jax.tree_util.tree_map(lambda *v: jnp.stack(v), *trained)
    return average(stacked, jnp.asarray(data.sizes[np.asarray(slots)], jnp.float32))

  one()  # compile every batch shape once
  return median_seconds(one, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cohorts", default="10,50,100")
  parser.add_argument("--train-size", type=int, default=10000,
                      help="training images over the 100 clients (0: all 50000)")
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--loop-conv-impl", default="xla")
  parser.add_argument("--engine-conv-impl", default="auto")
  parser.add_argument("--client-loop", default="auto", help="fedavg.client_loop of the engine")
  parser.add_argument("--partition", default="dirichlet",
                      help="scenario.partition: dirichlet (alpha 0.5, unequal client sizes: "
                      "a vmapped cohort runs as many steps as its largest client) or iid")
  parser.add_argument("--skip-loop", action="store_true")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  report = {**timing.process_info(),
            "repeats": args.repeats, "train_size": args.train_size, "epochs": args.epochs,
            "setting": "cifar10_fedavg: 100 clients, fedavg_cifar_cnn, batch 50",
            "partition": args.partition,
            "rows": []}
  for size in [int(v) for v in args.cohorts.split(",")]:
    experiment = Experiment(_config(size, args.train_size, args.epochs, args.engine_conv_impl,
                                    args.client_loop, args.partition))
    active = jnp.asarray(slot_active(experiment.groups[0]))
    key = jax.random.fold_in(jax.random.wrap_key_data(experiment.init_state()["rng"]), 0)
    slots = np.asarray(cohort.sample_cohort(jax.random.split(key)[0], active, size))
    steps = client_steps(experiment, slots)
    engine_s, engine_all = engine_round(experiment, args.repeats)
    row = {"cohort": size, "client_steps": steps, "engine_conv_impl": experiment.conv_impl,
           "engine_client_loop": args.client_loop,
           "engine_secs": engine_s, "engine_all": engine_all,
           "engine_client_steps_per_sec": steps / engine_s,
           "substituted": list(experiment.scenario.substituted)}
    print(f"[cohort {size:3d}] {steps} client-steps; engine {engine_s:.2f} s "
          f"({steps / engine_s:.1f} client-steps/s)", flush=True)
    if not args.skip_loop:
      loop_exp = Experiment(_config(size, args.train_size, args.epochs, args.loop_conv_impl,
                                    partition=args.partition))
      loop_s, loop_all = loop_round(loop_exp, slots, args.repeats)
      row.update({"loop_conv_impl": args.loop_conv_impl, "loop_secs": loop_s,
                  "loop_all": loop_all, "loop_client_steps_per_sec": steps / loop_s,
                  "engine_speedup": loop_s / engine_s})
      print(f"[cohort {size:3d}] loop {loop_s:.2f} s ({steps / loop_s:.1f} client-steps/s); "
            f"engine_speedup {loop_s / engine_s:.2f}x", flush=True)
    report["rows"].append(row)
  base = report["rows"][0]
  for row in report["rows"]:
    row["per_client_step_time_vs_smallest"] = ((row["engine_secs"] / row["client_steps"])
                                               / (base["engine_secs"] / base["client_steps"]))
  print(json.dumps(report, indent=2))
  if args.out:
    timing.write_result(args.out, report, indent=2)


if __name__ == "__main__":
  main()

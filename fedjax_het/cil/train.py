"""`train_class_incremental(config, workdir)`: federated class-incremental learning (FCIL).

The trainer of GLFC's protocol [GLFC Sec. 5] on a fixed-shape task stream
(`fedjax_het.data.incremental`). This step implements the lower-bound
baseline of GLFC Table 1, "fedavg_cil": FedAvg on the task stream (plain
fine-tuning; no exemplars, no distillation), "glfc" (`cil.glfc`): GLFC
(per-client exemplar memories, entropy-based task-transition detection,
0.5 * L_GC + 0.5 * L_RD, and the proxy server that picks the old model from
reconstructed prototypes, `cil.proxy`), and
"icarl_fl" (`cil.icarl`): GLFC Table 1's "iCaRL + FL" baseline (iCaRL's
exemplars, distillation and nearest-mean-of-exemplars classifier on every
client, FedAvg of the models).
`config.method` selects the method; `config.glfc` exists only for "glfc",
`config.icarl` only for "icarl_fl".

Local learning rate (`local.lr_schedule`, `epoch_learning_rates`):
"glfc_code" (default) is the GLFC code's step decay within a task (lr / 5,
/ 25, / 125 from the in-task epochs 100, 150, 180 of 200 to the end of the
round; at 0.5, 0.75, 0.9 of a task's local epochs in other settings), the
rates every method's local training reads; "constant" keeps `local.lr`
throughout.

The whole stream compiles ONCE:

  * the classifier has all C classes from the start; unseen classes are
    masked (`cil.masking`): the local loss is a softmax cross-entropy over the
    seen classes only (`mask_logits`: unseen logits are a finite -1e9 and get
    exactly zero gradient) and predictions are restricted to the seen classes;
  * the stream's stacked arrays (T, K_max, n_max) and the image pool live on
    the device; round r trains task t = r // rounds_per_task, picked with
    dynamic indexing inside the jitted round;
  * each round samples `cil.clients_per_round` of the clients that have joined
    by task t (with the round's key: a resumed run samples the same), gathers
    their images from the pool into (M, n_max, 32, 32, 3), trains them with
    `engine.local` (fresh local optimiser each round), and averages the
    trained models weighted by data size (parameters and BatchNorm statistics
    alike; the new global model IS the average).

NOTE on the local loss: GLFC's classifier loss is a sigmoid BCE over the seen
classes; the FedAvg baseline here uses the standard softmax cross-entropy
restricted to the seen classes ("fine-tuning" of class-incremental
literature). Weight decay (if any) still shrinks the unseen head columns
(their gradient is zero, their decay is not); with GLFC's 1e-5 this is
negligible.

Rounds run through `engine.rounds` (`make_round_fn` / `make_run_rounds`: a
`lax.scan` of `cil.rounds_per_call` rounds, round counter and run key in the
state). Evaluation after the last round of every task (and every `eval.every`
rounds): the global model on the whole test set, predictions restricted to
the classes seen so far, per-class correct / total / predicted counts.

Artefacts in `workdir` (as `fedjax_het.train`): run.json (the resume guard),
config.json, metadata.json, metrics.jsonl (train/loss per round; at evaluated
rounds eval/accuracy/seen, eval/accuracy/task_<j>, and at task ends the
per-class counts eval/class_correct, eval/class_total), checkpoints/ (orbax;
every `checkpoint.every` rounds and at every task end; rerunning the same
command resumes from the latest and ends bit-identical to an uninterrupted
run), results.md (GLFC Table 1 layout plus forgetting), results.json,
accuracy.png (accuracy vs classes seen).

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import platform
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import losses, models, reporting
from fedjax_het import validation as v
from fedjax_het import workdir as workdir_lib
from fedjax_het.cil import glfc as glfc_lib, icarl as icarl_lib, masking
from fedjax_het.data import incremental
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local, rounds, xla_cpu
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import GroupData, client_keys
from fedjax_het.engine.optim import OPTIMIZERS, make_optimizer
from fedjax_het.reports import class_incremental as cil_report

SCENARIO = "class_incremental"
METHODS = ("fedavg_cil", "glfc", "icarl_fl")
CLIENT_LOOPS = ("auto", "vmap", "map")
CONV_IMPLS = ("auto", "xla", "im2col", "custom_vjp", "gemm_taps")
#: `local.lr_schedule`: the learning rate over the local epochs of a round (`epoch_learning_rates`).
LR_SCHEDULES = ("constant", "glfc_code")
#: The GLFC code's step decays: (fraction of a task's local epochs, divisor of the base lr).
GLFC_CODE_LR_STEPS = ((0.5, 5.0), (0.75, 25.0), (0.9, 125.0))
METHOD_LABELS = {"fedavg_cil": "FedAvg (fine-tuning)",
                 "glfc": "GLFC",
                 "icarl_fl": "iCaRL + FL"}


def method_label(config: ml_collections.ConfigDict) -> str:
  """The method's row label in the Table 1 layout (GLFC without its proxy is marked)."""
  label = METHOD_LABELS.get(config.method, config.method)
  if config.method == "glfc" and config.glfc.old_model != "proxy":
    label += f" (no proxy: old model = {config.glfc.old_model})"
  return label


# ----------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------


def cil_config(method: str = "fedavg_cil") -> ml_collections.ConfigDict:
  """Defaults of a class-incremental run: GLFC's CIFAR-100 T=10 setting (Table 1)."""
  if method not in METHODS:
    raise ValueError(f"cil_config: `method` must be one of {METHODS}, got {method!r}.")
  config = ml_collections.ConfigDict({
      "name": f"cifar100_{method}",
      "method": method,
      "seed": 0,
      "compilation_cache_dir": "~/.cache/fedjax_het/jax",  # "" disables the persistent cache
      "resume_allow_changes": "",
      "xla_cpu_scheduler": "auto",     # as config.base_config: fixed when JAX starts
      "scenario": {
          "name": SCENARIO,
          "dataset": "cifar100",
          "source": "real",            # "real" (bundle), "tfds", "folder:<path>", "synthetic"
          "data_dir": "",              # "" -> $FEDJAX_HET_DATA_DIR
          "synthetic_fallback": False,
          "num_tasks": 10,
          "num_classes": 0,            # 0 -> all classes of the dataset
          "initial_clients": 30,
          "new_clients_per_task": 10,
          "class_fraction": 0.6,
          "shift_fraction": 0.9,
          "client_data": "overlap",    # "overlap" (GLFC code) or "disjoint"
          "train_size": 0,             # 0 -> all training images of the stream's classes
          "test_size": 0,              # 0 -> all test images
      },
      "cil": {
          "rounds_per_task": 10,
          "clients_per_round": 10,
          "rounds_per_call": 1,        # rounds per jitted call (a lax.scan)
          "client_loop": "auto",       # "vmap" (GPU/TPU), "map" (CPU), "auto" by backend
      },
      "models": {"architecture": "glfc_resnet18", "width": 1.0, "conv_impl": "auto"},
      "local": {"optimizer": "sgd", "lr": 2.0, "momentum": 0.0, "weight_decay": 1e-5,
                "epochs": 20, "batch_size": 128,
                "lr_schedule": "glfc_code"},   # or "constant" (epoch_learning_rates)
      "eval": {"every": 0, "batch_size": 500},   # every: 0 -> only at task ends
      "checkpoint": {"every": 10, "keep": 2},
      "logging": {"progress": True, "plots": True, "tensorboard": False},
  })
  if method == "glfc":
    config.glfc = glfc_lib.glfc_section()   # GLFC's own settings (cil.glfc)
  if method == "icarl_fl":
    config.icarl = icarl_lib.icarl_section()   # iCaRL's own settings (cil.icarl)
  return config


def validate_cil_config(config: ml_collections.ConfigDict) -> None:
  """Checks every field of `cil_config`; errors name the field and the allowed values."""
  for section in ("scenario", "cil", "models", "local", "eval", "checkpoint", "logging"):
    if section not in config:
      v.fail(section, "a section (build the config with fedjax_het.cil.train.cil_config)",
             None)
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
  v.check(config, "method", v.choice(METHODS), f"one of {METHODS}")
  v.check(config, "seed", v.int_at_least(0), "an integer >= 0")
  v.check(config, "xla_cpu_scheduler", v.choice(xla_cpu.SCHEDULERS),
          f"one of {xla_cpu.SCHEDULERS}")
  v.check(config, "scenario.name", v.choice((SCENARIO,)), f"{SCENARIO!r}")
  datasets = tuple(incremental.INCREMENTAL_DATASETS)
  v.check(config, "scenario.dataset", v.choice(datasets), f"one of {datasets}")
  v.check(config, "scenario.source",
          lambda s: isinstance(s, str) and (s in ("real", "tfds", "synthetic")
                                            or (s.startswith("folder:") and len(s) > 7)),
          "one of ('real', 'tfds', 'folder:<path>', 'synthetic')")
  v.check(config, "scenario.synthetic_fallback", v.is_bool, "True or False")
  v.check(config, "scenario.num_tasks", v.int_at_least(1), "an integer >= 1")
  limit = incremental.INCREMENTAL_DATASETS.get(config.scenario.dataset, 100)
  v.check(config, "scenario.num_classes", lambda x: v.int_at_least(0)(x) and x <= limit,
          f"an integer in [0, {limit}] (0: all classes)")
  classes = config.scenario.num_classes or limit
  if classes % config.scenario.num_tasks:
    divisors = tuple(d for d in range(1, classes + 1) if classes % d == 0)
    v.fail("scenario.num_tasks", f"a divisor of the {classes} classes, one of {divisors}",
           config.scenario.num_tasks)
  v.check(config, "scenario.initial_clients", v.int_at_least(1), "an integer >= 1")
  v.check(config, "scenario.new_clients_per_task", v.int_at_least(0), "an integer >= 0")
  v.check(config, "scenario.class_fraction", lambda x: number(x) and 0 < x <= 1,
          "a number in (0, 1]")
  v.check(config, "scenario.shift_fraction", lambda x: number(x) and 0 <= x <= 1,
          "a number in [0, 1]")
  v.check(config, "scenario.client_data", v.choice(incremental.CLIENT_DATA),
          f"one of {incremental.CLIENT_DATA}")
  v.check(config, "scenario.train_size", v.int_at_least(0), "an integer >= 0 (0: all)")
  v.check(config, "scenario.test_size", v.int_at_least(0), "an integer >= 0 (0: all)")
  v.check(config, "cil.rounds_per_task", v.int_at_least(1), "an integer >= 1")
  v.check(config, "cil.clients_per_round",
          lambda x: v.int_at_least(1)(x) and x <= config.scenario.initial_clients,
          f"an integer in [1, scenario.initial_clients={config.scenario.initial_clients}] "
          "(the clients present at task 0)")
  v.check(config, "cil.rounds_per_call",
          lambda x: v.int_at_least(1)(x) and config.cil.rounds_per_task % x == 0,
          f"an integer >= 1 dividing cil.rounds_per_task={config.cil.rounds_per_task}")
  v.check(config, "cil.client_loop", v.choice(CLIENT_LOOPS), f"one of {CLIENT_LOOPS}")
  names = models.MODEL_NAMES
  v.check(config, "models.architecture", lambda x: x in names and x != "fedfusion",
          f"one of {tuple(n for n in names if n != 'fedfusion')}")
  v.check(config, "models.width", v.positive, "a number > 0")
  v.check(config, "models.conv_impl", v.choice(CONV_IMPLS), f"one of {CONV_IMPLS}")
  v.check(config, "local.optimizer", v.choice(OPTIMIZERS), f"one of {OPTIMIZERS}")
  v.check(config, "local.lr", v.positive, "a number > 0")
  v.check(config, "local.momentum", lambda x: number(x) and 0 <= x < 1, "a number in [0, 1)")
  if config.local.momentum and config.local.optimizer != "sgd":
    v.fail("local.momentum", "0 unless local.optimizer is 'sgd'", config.local.momentum)
  v.check(config, "local.weight_decay", lambda x: number(x) and x >= 0, "a number >= 0")
  v.check(config, "local.epochs", v.int_at_least(1), "an integer >= 1")
  v.check(config, "local.batch_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "local.lr_schedule", v.choice(LR_SCHEDULES), f"one of {LR_SCHEDULES}")
  per_call = config.cil.rounds_per_call
  for field in ("eval.every", "checkpoint.every"):
    v.check(config, field, lambda x: v.int_at_least(0)(x) and x % per_call == 0,
            f"an integer >= 0 and a multiple of cil.rounds_per_call={per_call} (0: only at "
            "task ends)")
  v.check(config, "eval.batch_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "checkpoint.keep", v.int_at_least(1), "an integer >= 1")
  for field in ("logging.progress", "logging.plots", "logging.tensorboard"):
    v.check(config, field, v.is_bool, "True or False")
  if config.method == "glfc":
    glfc_lib.validate_glfc_config(config)
  if config.method == "icarl_fl":
    icarl_lib.validate_icarl_config(config)


# ----------------------------------------------------------------------------
# The method: FedAvg on the task stream.
# ----------------------------------------------------------------------------


class StreamArrays(NamedTuple):
  """The stream on the device (a pytree; shapes fixed for the whole stream)."""
  images: Any           # (N, 32, 32, 3) uint8 pool
  labels: Any           # (N,) int32
  client_indices: Any   # (T, K_max, n_max) int32
  client_sizes: Any     # (T, K_max) int32
  client_joined: Any    # (T, K_max) bool
  client_classes: Any   # (T, K_max, C) bool (read by glfc; fedavg_cil ignores it)


def stream_arrays(stream: incremental.ClassIncrementalStream) -> StreamArrays:
  return StreamArrays(images=stream.images, labels=stream.labels,
                      client_indices=stream.client_indices, client_sizes=stream.client_sizes,
                      client_joined=stream.client_joined,
                      client_classes=stream.client_classes)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The Python constants a method is built from (read once from the config)."""
  num_tasks: int
  classes_per_task: int
  rounds_per_task: int
  clients_per_round: int
  optimizer: str
  lr: float
  momentum: float
  weight_decay: float
  epochs: int
  batch_size: int
  sequential: bool   # clients one after another (lax.map) instead of vmapped
  lr_schedule: str = "constant"   # one of LR_SCHEDULES (`epoch_learning_rates`)

  @property
  def num_classes(self) -> int:
    return self.num_tasks * self.classes_per_task

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, num_classes: int) -> "Settings":
    loop = config.cil.client_loop
    if loop == "auto":
      loop = "map" if jax.default_backend() == "cpu" else "vmap"
    t = int(config.scenario.num_tasks)
    return cls(num_tasks=t, classes_per_task=num_classes // t,
               rounds_per_task=int(config.cil.rounds_per_task),
               clients_per_round=int(config.cil.clients_per_round),
               optimizer=config.local.optimizer, lr=float(config.local.lr),
               momentum=float(config.local.momentum),
               weight_decay=float(config.local.weight_decay), epochs=int(config.local.epochs),
               batch_size=int(config.local.batch_size), sequential=loop == "map",
               lr_schedule=config.local.lr_schedule)


def task_of_round(round_index: jax.Array, settings: Settings) -> jax.Array:
  """The task trained in 0-based round `round_index` (clamped to the last task)."""
  return jnp.minimum(round_index // settings.rounds_per_task, settings.num_tasks - 1)


def epoch_learning_rates(settings: Settings, round_index: jax.Array) -> jax.Array:
  """The local learning rate of each epoch of round `round_index`: (epochs,) float32.

  "constant": `settings.lr` in every epoch.

  "glfc_code": the step decays of GLFC's code (conditionWang/FCIL
  `src/GLFC.py`, `GLFC_model.train`). Every round builds a fresh SGD optimiser
  at the base lr; inside the round, at the in-task epoch index e = (round in
  task) * epochs + epoch, the code sets the lr to base / 5 when e % 200 ==
  100, base / 25 at 150 and base / 125 at 180 (`if ... elif ...`: the first
  matching trigger wins), and the rate stays until the round ends (the next
  round's optimiser starts at the base lr again). With the paper's 10 rounds
  of 20 epochs per task: round 5 runs at lr / 5, round 7 runs epochs 0-9 at
  lr and 10-19 at lr / 25, round 9 at lr / 125, every other round at lr.

  Other settings: the code's triggers are fixed epochs of a 200-epoch task;
  here they are placed at int(0.5 * E), int(0.75 * E) and int(0.9 * E) of
  the E = rounds_per_task * epochs in-task epochs (`GLFC_CODE_LR_STEPS`;
  exactly 100, 150, 180 for E = 200), with the code's semantics (a trigger
  inside a round changes the rate from that epoch to the end of the round).
  (In its first task the code builds a new optimiser at the divided rate
  instead of changing the rate in place; plain SGD has no state, so this is
  the same.)

  Args:
    settings: the run's `Settings` (`lr`, `epochs`, `rounds_per_task`,
      `lr_schedule`).
    round_index: the 0-based global round, possibly traced (one compiled
      program for every round).

  Returns:
    (epochs,) float32 learning rates for `engine.local`.
  """
  epochs = settings.epochs
  base = jnp.full((epochs,), settings.lr, jnp.float32)
  if settings.lr_schedule == "constant":
    return base
  if settings.lr_schedule != "glfc_code":
    raise ValueError(f"epoch_learning_rates: `lr_schedule` must be one of {LR_SCHEDULES}, got "
                     f"{settings.lr_schedule!r}.")
  per_task = settings.rounds_per_task * epochs
  triggers = jnp.asarray([int(f * per_task) for f, _ in GLFC_CODE_LR_STEPS], jnp.int32)
  rates = jnp.asarray([settings.lr / d for _, d in GLFC_CODE_LR_STEPS], jnp.float32)
  start = (jnp.asarray(round_index, jnp.int32) % settings.rounds_per_task) * epochs
  epoch = start + jnp.arange(epochs, dtype=jnp.int32)                  # in-task epoch index
  fired = (triggers[None, :] >= start) & (triggers[None, :] <= epoch[:, None])  # (epochs, 3)
  # The latest trigger of this round at or before the epoch; at equal epochs the first listed.
  latest = jnp.max(jnp.where(fired, triggers[None, :], -1), axis=1)
  which = jnp.argmax(fired & (triggers[None, :] == latest[:, None]), axis=1)
  return jnp.where(latest >= 0, rates[which], base)


def masked_cross_entropy_loss(model: Any) -> local.LocalLossFn:
  """The local loss: softmax cross-entropy over the seen classes (`aux["class_mask"]`)."""

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=rng, mask=mask)
    logits = masking.mask_logits(logits, aux["class_mask"])
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (new_variables["batch_stats"], {"ce": ce})

  return loss_fn


def make_fedavg_cil(settings: Settings, model: Any, mean: Any, std: Any,
                    max_client_size: int, *, eval_batch_size: int = 500) -> Algorithm:
  """FedAvg on the task stream as an `Algorithm` (state {"server": variables}).

  The round's data is a `StreamArrays`; its metrics: "train/loss" (data-size
  weighted mean of the cohort's local losses), "task", "clients" (M,) the
  sampled client indices. `evaluate(state, (test_images, test_labels,
  num_seen))` gives the global model's per-class (correct, total, predicted)
  counts (`make_class_counts`).
  """
  m, c = settings.clients_per_round, settings.num_classes
  tx = make_optimizer(settings.optimizer, weight_decay=settings.weight_decay,
                      momentum=settings.momentum)
  trainer = local.make_local_trainer(
      loss_fn=masked_cross_entropy_loss(model), optimizer=tx, epochs=settings.epochs,
      batch_size=settings.batch_size, max_size=max_client_size,
      preprocess=normalizer(mean, std))

  def init(key, data):
    del data
    return {"server": models.init_variables(model, key)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key = jax.random.split(key)
    task = task_of_round(round_index, settings)
    joined = data.client_joined[task]
    clients = cohort.sample_cohort(sample_key, joined, m)
    rows = data.client_indices[task][clients]            # (M, n_max)
    sizes = data.client_sizes[task][clients]             # (M,)
    members = GroupData(images=data.images[rows], labels=data.labels[rows], sizes=sizes,
                        client_ids=clients, active=jnp.ones((m,), bool))
    class_mask = masking.seen_class_mask((task + 1) * settings.classes_per_task, c)
    start = aggregation.broadcast(state["server"], m)
    aux = {"class_mask": jnp.broadcast_to(class_mask, (m, c))}
    trained, local_metrics = local.train_clients(
        trainer, start, aux, members, client_keys(train_key, clients),
        epoch_learning_rates(settings, round_index), sequential=settings.sequential)
    server = aggregation.weighted_mean(trained, sizes)
    weights = sizes.astype(jnp.float32) / jnp.sum(sizes)
    loss = jnp.tensordot(weights, local_metrics["loss"], axes=1)
    return {"server": server}, {"train/loss": loss, "task": task, "clients": clients}

  def evaluate(state, test):
    images, labels, num_seen = test
    counts = make_class_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], images, labels, num_seen)

  return Algorithm(name="fedavg_cil", init=init, round=round_fn, evaluate=evaluate)


def batched_class_counts(scores_fn: Any, num_classes: int, images: jax.Array,
                         labels: jax.Array, batch_size: int) -> tuple[jax.Array, ...]:
  """Per-class (correct, total, predicted) int32 (C,) counts of a classifier on a test set.

  `scores_fn(x)` maps a uint8 batch to (scores (B, C), allowed (C,) bool); the
  prediction is the argmax over the allowed classes (`masking`). Fixed-size
  batches of `batch_size` (the last padded and masked), one `lax.scan`.
  """
  num_test = labels.shape[0]
  batch = max(1, min(batch_size, num_test))
  batches = -(-num_test // batch)
  pad = batches * batch - num_test
  images = jnp.pad(images, ((0, pad),) + ((0, 0),) * (images.ndim - 1)).reshape(
      (batches, batch) + images.shape[1:])
  labels = jnp.pad(labels, (0, pad)).reshape(batches, batch)
  valid = (jnp.arange(batches * batch) < num_test).reshape(batches, batch)

  def one(carry, xs):
    x, y, ok = xs
    scores, allowed = scores_fn(x)
    correct, total = masking.masked_class_counts(scores, y, allowed, ok)
    predicted = jnp.sum(jax.nn.one_hot(masking.masked_predictions(scores, allowed),
                                       num_classes, dtype=jnp.int32) * ok[:, None], axis=0)
    return jax.tree_util.tree_map(jnp.add, carry, (correct, total, predicted)), None

  zeros = jnp.zeros((num_classes,), jnp.int32)
  out, _ = jax.lax.scan(one, (zeros, zeros, zeros), (images, labels, valid))
  return out


def make_class_counts(model: Any, mean: Any, std: Any, num_classes: int, num_test: int,
                      batch_size: int):
  """Builds `counts(variables, test_images, test_labels, num_seen) -> (correct, total, predicted)`.

  Global-model top-1 predictions restricted to the classes [0, num_seen) over
  the whole test set of `num_test` images (`batched_class_counts`); each
  count is int32 (C,): correct and total per true class, predicted per
  predicted class. `num_seen` may be traced (one compilation for all tasks).
  """
  del num_test  # the labels' static length
  preprocess = normalizer(mean, std)

  def counts(variables, images, labels, num_seen):
    class_mask = masking.seen_class_mask(num_seen, num_classes)

    def scores(x):
      _, logits, _ = models.apply_model(model, variables, preprocess(x), train=False)
      return logits, class_mask

    return batched_class_counts(scores, num_classes, images, labels, batch_size)

  return counts


# ----------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------


def build_stream(config: ml_collections.ConfigDict) -> incremental.ClassIncrementalStream:
  sc = config.scenario
  return incremental.build_class_incremental_stream(
      sc.dataset, num_tasks=int(sc.num_tasks), num_classes=int(sc.num_classes) or None,
      initial_clients=int(sc.initial_clients), new_clients_per_task=int(sc.new_clients_per_task),
      class_fraction=float(sc.class_fraction), shift_fraction=float(sc.shift_fraction),
      client_data=sc.client_data, source=sc.source, data_dir=sc.data_dir or None,
      synthetic_fallback=bool(sc.synthetic_fallback), train_size=int(sc.train_size) or None,
      test_size=int(sc.test_size) or None, seed=int(config.seed))


def stream_fingerprint(stream: incremental.ClassIncrementalStream) -> str:
  """SHA-256 over every array of the stream the run trains and evaluates on."""
  digest = hashlib.sha256()
  for name in ("images", "labels", "client_indices", "client_sizes", "client_joined",
               "test_images", "test_labels"):
    array = np.ascontiguousarray(getattr(stream, name))
    digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
    digest.update(array.data)
  return digest.hexdigest()


def _resolve_conv_impl(conv_impl: str) -> str:
  if conv_impl != "auto":
    return conv_impl
  return "im2col" if jax.default_backend() == "cpu" else "xla"


def _metadata(config, stream, settings, conv_impl) -> dict[str, Any]:
  return {"scenario": SCENARIO, "method": config.method, "sources": dict(stream.sources),
          "substituted_by_synthetic": list(stream.substituted),
          "num_tasks": stream.num_tasks, "classes_per_task": stream.classes_per_task,
          "class_names": list(stream.class_names),
          "clients_per_task": [int(n) for n in stream.num_clients],
          "max_client_size": stream.max_client_size, "pool_size": int(len(stream.labels)),
          "test_size": int(len(stream.test_labels)), "sequential_clients": settings.sequential,
          "conv_impl": conv_impl, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
          "python": platform.python_version()}


def _eval_record(correct, total, predicted, task: int, k: int) -> dict[str, Any]:
  """eval/accuracy/seen and eval/accuracy/task_<j> (percent) after training task `task`."""
  seen = (task + 1) * k
  record = {"eval/accuracy/seen": (100.0 * float(correct[:seen].sum())
                                   / max(1, int(total[:seen].sum())))}
  for j in range(task + 1):
    part = slice(j * k, (j + 1) * k)
    record[f"eval/accuracy/task_{j}"] = (100.0 * float(correct[part].sum())
                                         / max(1, int(total[part].sum())))
  record["eval/predicted_unseen"] = int(predicted[seen:].sum())
  return record


# GLFC Table 1 of one run and the accuracy-vs-classes figure: the class-incremental report's.
table1 = cil_report.run_table
plot_seen_accuracy = cil_report.plot_seen_accuracy


def _plot(numbers: dict[str, Any], path: pathlib.Path, title: str) -> bool:
  k = numbers["classes_per_task"]
  seen = [100 * a for a in numbers["seen_accuracy"]]
  x = [(i + 1) * k for i in range(len(seen))]
  return plot_seen_accuracy([(numbers["method"], x, [seen])], path, title)


def train_class_incremental(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                            *, max_rounds: int | None = None) -> dict[str, Any]:
  """Trains a class-incremental config in `workdir` (resuming from its latest checkpoint).

  Args:
    config: a `cil_config`-shaped config.
    workdir: output directory.
    max_rounds: stop after this many rounds in total (a checkpoint is saved
      there; a later call resumes). None: the whole stream
      (num_tasks * rounds_per_task rounds). Must be a multiple of
      `cil.rounds_per_call`.

  Returns:
    {"results": results.json's numbers, "records": every metrics record,
    "rounds_done": int, "server": the global model's variables (NumPy), "state": the
    whole final training state (NumPy; the method's client and server state included)}.
  """
  validate_cil_config(config)
  workdir = pathlib.Path(workdir)
  workdir_lib.check_workdir(workdir)
  if config.compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir",
                      str(pathlib.Path(config.compilation_cache_dir).expanduser()))
  stream = build_stream(config)
  for name, source in stream.sources.items():
    logging.info("data %-10s <- %s", name, source)
  if stream.substituted:
    logging.warning("SYNTHETIC DATA SUBSTITUTED for %s: results are NOT comparable with the "
                    "paper (see metadata.json).", ", ".join(stream.substituted))
  settings = Settings.from_config(config, stream.num_classes)
  conv_impl = _resolve_conv_impl(config.models.conv_impl)
  model = models.get_model(config.models.architecture, stream.num_classes,
                           width=float(config.models.width), conv_impl=conv_impl)
  if config.method == "glfc":
    algorithm = glfc_lib.make_glfc(
        settings, glfc_lib.GLFCSettings.from_config(config, stream.client_classes), model,
        stream.mean, stream.std, stream.max_client_size,
        eval_batch_size=int(config.eval.batch_size))
  elif config.method == "icarl_fl":
    algorithm = icarl_lib.make_icarl_fl(
        settings, icarl_lib.ICaRLSettings.from_config(config, stream.client_classes), model,
        stream.mean, stream.std, stream.max_client_size,
        eval_batch_size=int(config.eval.batch_size))
  else:
    algorithm = make_fedavg_cil(settings, model, stream.mean, stream.std,
                                stream.max_client_size,
                                eval_batch_size=int(config.eval.batch_size))
  num_rounds = settings.num_tasks * settings.rounds_per_task
  per_call = int(config.cil.rounds_per_call)
  stop = num_rounds if max_rounds is None else min(int(max_rounds), num_rounds)
  if stop % per_call:
    raise ValueError(f"`max_rounds`={max_rounds} must be a multiple of cil.rounds_per_call="
                     f"{per_call}.")

  record = {"config": workdir_lib.flatten_config(config),
            "data": {"fingerprint": stream_fingerprint(stream), "sources": dict(stream.sources),
                     "substituted": list(stream.substituted)}}
  checkpointer, start = workdir_lib.open_run(workdir, config, record,
                                             _metadata(config, stream, settings, conv_impl))

  data = jax.device_put(stream_arrays(stream))
  test_images, test_labels = jax.device_put((stream.test_images, stream.test_labels))
  init = jax.jit(lambda key, d: rounds.initial_state(algorithm, key, d))
  run_rounds = jax.jit(rounds.make_run_rounds(rounds.make_round_fn(algorithm), per_call))
  evaluate = jax.jit(algorithm.evaluate)

  writer = reporting.MetricsWriter(workdir, tensorboard=bool(config.logging.tensorboard))
  if start is None:
    start, state = 0, init(jax.random.key(int(config.seed)), data)
    checkpointer.save(0, state)
  else:
    like = jax.eval_shape(init, jax.random.key(int(config.seed)), data)
    # Committed restored arrays would change the lowered program (and its cache key).
    state = jax.device_put(jax.device_get(checkpointer.restore(start, like)))
    logging.info("resumed from the checkpoint of round %d in %s", start, workdir)
  records = writer.truncate_after(start)

  k, every = settings.classes_per_task, int(config.eval.every)
  progress = reporting.Progress(num_rounds, enabled=bool(config.logging.progress), start=start)
  done = start
  while done < stop:
    tick = time.perf_counter()
    state, round_metrics = run_rounds(state, data)
    round_metrics = jax.device_get(round_metrics)
    seconds = (time.perf_counter() - tick) / per_call
    new_records = []
    for offset in range(per_call):
      new_records.append({"round": done + offset + 1,
                          "task": int(round_metrics["task"][offset]),
                          "train/loss": float(round_metrics["train/loss"][offset]),
                          "clients": [int(c) for c in round_metrics["clients"][offset]],
                          **{name: float(values[offset]) for name, values in
                             round_metrics.items()
                             if name not in ("task", "train/loss", "clients")},
                          "time/round_secs": seconds})
    done += per_call
    last = new_records[-1]
    task_end = done % settings.rounds_per_task == 0
    if task_end or (every and done % every == 0):
      task = int(last["task"])
      correct, total, predicted = jax.device_get(
          evaluate(state, (test_images, test_labels, jnp.int32((task + 1) * k))))
      last.update(_eval_record(correct, total, predicted, task, k))
      if task_end:
        last["eval/class_correct"] = [int(x) for x in correct]
        last["eval/class_total"] = [int(x) for x in total]
    for rec in new_records:
      writer.write(rec)
      records.append(rec)
    if task_end or done == stop or (int(config.checkpoint.every)
                                    and done % int(config.checkpoint.every) == 0):
      checkpointer.save(done, state)
    shown = (f"task {last['task']} acc(seen) {last['eval/accuracy/seen']:.1f}"
             if "eval/accuracy/seen" in last else f"task {last['task']}")
    progress.update(done, shown)
  progress.close()
  checkpointer.close()
  writer.close()

  label = method_label(config)
  table, numbers = table1(records, settings.num_tasks, k, label)
  numbers["rounds_done"] = done
  transitions = {name.rpartition("/")[2]: int(sum(r.get(name, 0) for r in records))
                 for name in sorted({n for r in records for n in r
                                     if n.startswith("glfc/transitions/")})}
  if transitions:  # GLFC's entropy rule against the stream's true transitions
    numbers["transitions"] = transitions
  note = (f"\n\nSynthetic data substituted for: {', '.join(stream.substituted)} (see "
          "metadata.json); the numbers say nothing about CIFAR-100.\n"
          if stream.substituted else "\n")
  heading = (f"# {config.name}: accuracy (%) on all classes seen after each task "
             f"(GLFC Table 1 layout)\n\n")
  if done < num_rounds:
    heading += f"Stopped after round {done} of {num_rounds}; rerun to resume.\n\n"
  workdir_lib.write_atomic(workdir / "results.md", heading + table + note)
  workdir_lib.write_atomic(workdir / "results.json", json.dumps(numbers, indent=2) + "\n")
  logging.info("results:\n%s", table)
  if config.logging.plots and "seen_accuracy" in numbers:
    _plot(numbers, workdir / "accuracy.png", config.name)
  return {"results": numbers, "records": records, "rounds_done": done,
          "server": jax.device_get(state["server"]), "state": jax.device_get(state)}

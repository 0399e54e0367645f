"""Exemplar replay on GLFC's class-incremental task stream: the blocks every replay method's
round is built from (GLFC, iCaRL + FL, SS-IL + FL, BiC + FL, PODNet + FL, DDE + iCaRL + FL,
GeoDL + iCaRL + FL). Every class-incremental method module with an exemplar memory imports
them from here; none imports another method's module.

* The exemplar memory. At a task transition a client adds the classes of its previous data
  that it does not hold now, by iCaRL herding on the L2-normalised features of the received
  global model, m = memory_size // (classes learned) per class, old classes reduced to their
  first m picks (`store_previous_classes`; GLFC detects the transition itself, the baselines
  read it from the stream: `update_client`). The memory holds POOL INDICES, 4 bytes each
  (`encode_pool_indices` / `decode_pool_indices`): every exemplar is an image of the
  stream's pool. `replay_section` / `validate_replay_section` are a baseline's memory
  fields, `ReplaySettings` their constants (`herding_sizes`: the static herding lengths),
  `ClientState` / `init_client_state` every client's memory and last tasks.
* Replay training: `replay_rows` (a client's current data, then its exemplars),
  `replay_cohort` (the round's sampled cohort and its training data), `previous_task_model`
  (the global model the last task ended with), `make_eval_forward` (eval-mode features and
  logits in chunks), `make_replay_training` (the local trainer, forward and client map of a
  round).
* iCaRL + FL's round and the blocks the iCaRL-based baselines share: `ICARL_MEMORY_SIZE`,
  `icarl_local_loss`, the nearest-mean-of-exemplars classifier (`class_feature_sums`,
  `nme_scores`, `make_nme_counts`, `updated_class_statistics`, `nme_stream_bytes`), the
  round's steps (`round_start`, `sample_replay_cohort`, `update_client_memories`,
  `distillation_aux`, `train_and_average`, `replay_metrics`), and `make_icarl_fl`, the whole
  round of iCaRL + FL (`algorithms.icarl_fl`) with a pluggable local loss (GeoDL + iCaRL +
  FL passes its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.algorithms import common
from fedjax_het.cil import exemplars, masking
from fedjax_het.cil.stream import (batched_class_counts, epoch_learning_rates, make_class_counts,
                                   task_of_round)
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import GroupData, client_keys
from fedjax_het.engine.optim import make_optimizer
from fedjax_het.losses import glfc as glfc_losses


def replay_section(memory_size: int) -> dict[str, Any]:
  """The memory's fields of a baseline's section: size per client and distinct picks."""
  return {"memory_size": memory_size,   # exemplars per client, images
          "distinct_exemplars": True}   # iCaRL's paper: each image at most once


def validate_replay_section(config: ml_collections.ConfigDict, section: str) -> None:
  v.require_section(config, section)
  v.check(config, f"{section}.memory_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, f"{section}.distinct_exemplars", v.is_bool, "True or False")


def herding_sizes(client_classes: np.ndarray, memory_size: int) -> tuple[int, int]:
  """Static sizes of a stream's exemplar updates: (herding length, most new classes).

  The herding length is memory // (fewest classes a client holds in a task),
  the largest per-class share m a client can get; the second is the most
  classes one client holds in one task (`client_classes` (T, K, C) bool).
  """
  counts = np.asarray(client_classes).sum(-1)
  counts = counts[counts > 0]
  fewest, most = (int(counts.min()), int(counts.max())) if counts.size else (1, 1)
  return max(1, min(memory_size, memory_size // fewest)), most


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
  memory_size: int
  distinct: bool
  max_per_class: int          # static herding length: memory // fewest classes of a client
  max_client_classes: int     # static: most classes one client holds in one task

  @classmethod
  def from_section(cls, section: ml_collections.ConfigDict, client_classes: np.ndarray
                   ) -> "ReplaySettings":
    memory = int(section.memory_size)
    max_per_class, most = herding_sizes(client_classes, memory)
    return cls(memory_size=memory, distinct=bool(section.distinct_exemplars),
               max_per_class=max_per_class, max_client_classes=most)


def encode_pool_indices(indices: jax.Array) -> jax.Array:
  """int32 (...,) pool indices -> uint8 (..., 4): the memory's "images" (module docstring)."""
  return jax.lax.bitcast_convert_type(jnp.asarray(indices, jnp.int32), jnp.uint8)


def decode_pool_indices(encoded: jax.Array) -> jax.Array:
  """Inverse of `encode_pool_indices`."""
  return jax.lax.bitcast_convert_type(encoded, jnp.int32)


class ClientState(NamedTuple):
  """Memory state of every client (leading axis K_max = all clients of the stream)."""
  memory: exemplars.ExemplarMemory   # "images" are pool indices (`encode_pool_indices`)
  task: jax.Array                    # (K,) int32 task of the data last trained on (-1: none)
  last_task: jax.Array               # (K,) int32 task of the data before that (-1: none)


def init_client_state(num_clients: int, memory_size: int) -> ClientState:
  memory = jax.vmap(lambda _: exemplars.init_memory(memory_size, (4,)))(jnp.arange(num_clients))
  return ClientState(memory=memory, task=jnp.full((num_clients,), -1, jnp.int32),
                     last_task=jnp.full((num_clients,), -1, jnp.int32))


def store_previous_classes(memory: exemplars.ExemplarMemory, forward: Any, variables: Any,
                           data: Any, client_id: jax.Array, *, last_task: jax.Array,
                           current: jax.Array, detected: jax.Array, n_max: int,
                           num_classes: int, max_new_classes: int, max_per_class: int,
                           distinct: bool) -> exemplars.ExemplarMemory:
  """At a transition, adds the classes of a client's previous data to its memory.

  The classes added are those of the client's data in task `last_task` (-1:
  none) that it does not hold now (`current` (C,) bool) and has not stored yet
  (GLFC code's `last_class`); nothing happens unless `detected`. m = capacity
  // (classes learned), old classes keep their first m herding picks, each
  added class gets m picks by iCaRL herding over the client's `last_task`
  data on the L2-normalised features of `variables` (`forward` from
  `make_eval_forward`). `data` is a `cil.stream.StreamArrays`; the memory's
  "images" are pool indices (`encode_pool_indices`).
  """
  prev_task = jnp.maximum(last_task, 0)
  prev_classes = data.client_classes[prev_task, client_id] & (last_task >= 0)
  stored = jnp.any((memory.labels[:, None] == jnp.arange(num_classes)[None, :])
                   & memory.valid[:, None], axis=0)
  add = prev_classes & ~current & ~stored & detected
  (new_classes,) = jnp.nonzero(add, size=max_new_classes, fill_value=-1)
  new_classes = jnp.where(new_classes >= 0, new_classes, -1).astype(jnp.int32)
  num_new = jnp.sum(add).astype(jnp.int32)

  def herd(memory):
    prev_rows = data.client_indices[prev_task, client_id]
    prev_valid = jnp.arange(n_max) < data.client_sizes[prev_task, client_id]
    features, _ = forward(variables, data.images[prev_rows])
    return exemplars.add_classes(
        memory, images=encode_pool_indices(prev_rows), labels=data.labels[prev_rows],
        features=features, new_classes=new_classes, num_seen=memory.num_seen + num_new,
        mask=prev_valid, max_per_class=max_per_class, distinct=distinct)

  return jax.lax.cond(num_new > 0, herd, lambda memory_: memory_, memory)


def update_client(replay: ReplaySettings, forward: Any, global_vars: Any, client: ClientState,
                  client_id: jax.Array, task: jax.Array, data: Any, *, n_max: int,
                  num_classes: int) -> tuple[ClientState, jax.Array]:
  """One sampled client's transition and memory update (iCaRL + FL's), before training.

  Returns (its new state, whether it was at a task transition: its classes
  changed since it last trained).
  """
  current = data.client_classes[task, client_id]
  moved = client.task != task
  last_task = jnp.where(moved, client.task, client.last_task)
  before = data.client_classes[jnp.maximum(client.task, 0), client_id]
  transition = (client.task >= 0) & moved & jnp.any(before != current)
  memory = store_previous_classes(
      client.memory, forward, global_vars, data, client_id, last_task=last_task,
      current=current, detected=transition, n_max=n_max, num_classes=num_classes,
      max_new_classes=replay.max_client_classes, max_per_class=replay.max_per_class,
      distinct=replay.distinct)
  return ClientState(memory=memory, task=jnp.asarray(task, jnp.int32),
                     last_task=last_task.astype(jnp.int32)), transition


def replay_rows(rows: jax.Array, size: jax.Array, memory: exemplars.ExemplarMemory,
                n_max: int) -> tuple[jax.Array, jax.Array]:
  """Pool rows of a client's training set: its current data, then its exemplars.

  `rows` (n_max,) the current data's pool rows (the first `size` valid).
  Returns (n_max + M,) rows, valid entries first, and their count.
  """
  capacity = memory.valid.shape[-1]
  stored_rows = decode_pool_indices(memory.images)
  count = jnp.sum(memory.valid).astype(jnp.int32)
  slots = jnp.arange(n_max + capacity)
  train_rows = jnp.where(slots < size, jnp.pad(rows, (0, capacity))[slots],
                         jnp.where(slots < size + count,
                                   stored_rows[jnp.clip(slots - size, 0, capacity - 1)], 0))
  return train_rows, size + count


def replay_cohort(key: jax.Array, client_states: Any, data: Any, task: jax.Array, m: int,
                  client_map: Any, prepare: Any, *, joined: jax.Array | None = None
                  ) -> tuple[Any, Any, jax.Array, GroupData, Any]:
  """Samples a round's cohort and builds its training data (GLFC, iCaRL + FL).

  `prepare(client_state, client_id) -> (new client state, train_rows (n,),
  train_size, extra)` runs for each of the `m` clients sampled among those
  joined by `task` (`client_map`; `joined` (K,) bool overrides the
  candidates, e.g. the clients present at a round of a "per_round" stream,
  `cil.stream.client_tasks`). Returns (clients, their new states, their
  train rows (m, n), the cohort's `GroupData` gathered from the pool, extra).
  """
  candidates = data.client_joined[task] if joined is None else joined
  clients = cohort.sample_cohort(key, candidates, m)
  updated, train_rows, sizes, extra = client_map(
      prepare, (cohort.gather(client_states, clients), clients))
  members = GroupData(images=data.images[train_rows], labels=data.labels[train_rows],
                      sizes=sizes, client_ids=clients, active=jnp.ones((m,), bool))
  return clients, updated, train_rows, members, extra


def previous_task_model(server: Any, old_model: Any, round_index: jax.Array,
                        rounds_per_task: int) -> Any:
  """The global model at the end of the previous task (`state["old_model"]`).

  At the first round of every task after the first, `server` (the global
  model the last task ended with) replaces the stored one.
  """
  new_task = (round_index > 0) & (round_index % rounds_per_task == 0)
  return jax.tree_util.tree_map(lambda s, o: jnp.where(new_task, s, o), server, old_model)


def make_eval_forward(model: Any, preprocess: Any, chunk: int):
  """`forward(variables, images (n, ...) uint8) -> (features, logits)`, eval mode, in chunks."""

  def forward(variables, images):
    n = images.shape[0]
    size = max(1, min(chunk, n))
    batches = -(-n // size)
    padded = jnp.pad(images, ((0, batches * size - n),) + ((0, 0),) * (images.ndim - 1))

    def one(x):
      features, logits, _ = models.apply_model(model, variables, preprocess(x), train=False)
      return features, logits

    features, logits = jax.lax.map(one, padded.reshape((batches, size) + images.shape[1:]))
    return (features.reshape((batches * size,) + features.shape[2:])[:n],
            logits.reshape((batches * size,) + logits.shape[2:])[:n])

  return forward


def make_replay_training(settings: Any, loss_fn: local.LocalLossFn, model: Any, mean: Any,
                         std: Any, max_size: int, eval_batch_size: int):
  """The pieces every exemplar-replay method's round is built from (GLFC, iCaRL + FL).

  Returns (preprocess: the dataset normalisation; the local trainer of
  `loss_fn` over up to `max_size` rows (current data + exemplars), fresh
  optimiser of `settings` each round; the eval-mode `forward`
  (`make_eval_forward`); `client_map(f, xs)`: f over the cohort, vmapped or
  one client after another (`settings.sequential`)).
  """
  preprocess = normalizer(mean, std)
  tx = make_optimizer(settings.optimizer, weight_decay=settings.weight_decay,
                      momentum=settings.momentum)
  trainer = local.make_local_trainer(
      loss_fn=loss_fn, optimizer=tx, epochs=settings.epochs, batch_size=settings.batch_size,
      max_size=max_size, preprocess=preprocess)
  forward = make_eval_forward(model, preprocess, eval_batch_size)
  if settings.sequential:
    client_map = lambda f, xs: jax.lax.map(lambda a: f(*a), xs)  # noqa: E731
  else:
    client_map = lambda f, xs: jax.vmap(f)(*xs)  # noqa: E731
  return preprocess, trainer, forward, client_map


#: iCaRL's memory K (CIFAR-100 experiments: 2000 exemplars), per client here.
ICARL_MEMORY_SIZE = 2000


def icarl_local_loss(model: Any) -> local.LocalLossFn:
  """iCaRL's classification + distillation loss on one batch [iCaRL Alg. 3].

  sum over the seen classes of the sigmoid BCE against targets that are the
  one-hot label on the new classes and sigmoid(old model's logit) on the old
  classes [0, num_old) (here: the mean over the seen classes and the batch,
  `losses.glfc.class_semantic_relation_distillation_loss`). aux:
  "class_mask" (C,) seen classes, "old_model" variables, "num_old" () int32
  = t * k (0 in task 0: plain BCE against the one-hot label).
  """

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=rng, mask=mask)
    _, old_logits, _ = models.apply_model(model, aux["old_model"], images, train=False)
    loss = glfc_losses.class_semantic_relation_distillation_loss(
        logits=logits, labels=labels, old_logits=jax.lax.stop_gradient(old_logits),
        num_old_classes=aux["num_old"], class_mask=aux["class_mask"], mask=mask)
    return loss, (new_variables["batch_stats"], {})

  return loss_fn


def class_feature_sums(features: jax.Array, labels: jax.Array, valid: jax.Array,
                       num_classes: int) -> tuple[jax.Array, jax.Array]:
  """Per-class sums of L2-normalised features and counts: ((C, D) float32, (C,) int32).

  `features` (n, D), `labels` (n,) int, `valid` (n,) bool (invalid rows count
  nowhere). The L2 normalisation is `cil.exemplars`' (x / max(||x||, 1e-12)).
  """
  normalize = exemplars._l2_normalize  # pylint: disable=protected-access
  f = normalize(jnp.asarray(features, jnp.float32))
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) * valid[:, None]
  return onehot.T @ f, jnp.sum(onehot, axis=0).astype(jnp.int32)


def nme_scores(features: jax.Array, class_sums: jax.Array, class_counts: jax.Array,
               num_seen: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Nearest-mean-of-exemplars scores [iCaRL Alg. 1].

  Returns (scores (B, C), available (C,) bool): scores = -||f/||f|| -
  mu_y/||mu_y|| ||^2 with mu_y = class_sums[y] / class_counts[y];
  `available` = the seen classes [0, num_seen) with a count > 0. The
  prediction is the argmax of the scores over the available classes
  (`masking.masked_predictions(scores, available)`).
  """
  normalize = exemplars._l2_normalize  # pylint: disable=protected-access
  f = normalize(jnp.asarray(features, jnp.float32))
  counts = jnp.asarray(class_counts)
  means = normalize(class_sums / jnp.maximum(counts, 1).astype(jnp.float32)[:, None])
  distance = jnp.sum(jnp.square(f[:, None, :] - means[None, :, :]), axis=-1)
  available = masking.seen_class_mask(num_seen, counts.shape[0]) & (counts > 0)
  return -distance, available


def make_nme_counts(model: Any, mean: Any, std: Any, num_classes: int, num_test: int,
                    batch_size: int):
  """Builds the NME classifier's test counts.

  `counts(variables, class_sums, class_counts, images, labels, num_seen) ->
  (correct, total, predicted)`.

  The per-class counts over the whole test set (int32 (C,) each, as
  `cil.stream.make_class_counts`: correct and total per true class, predicted
  per predicted class; `cil.stream.batched_class_counts`). `num_seen` may be
  traced.
  """
  del num_test  # the labels' static length
  forward = make_eval_forward(model, normalizer(mean, std), batch_size)

  def counts(variables, class_sums, class_counts, images, labels, num_seen):
    def scores(x):
      features, _ = forward(variables, x)
      return nme_scores(features, class_sums, class_counts, num_seen)

    return batched_class_counts(scores, num_classes, images, labels, batch_size)

  return counts


def round_start(state: Any, key: jax.Array, round_index: jax.Array, settings: Any
                ) -> tuple[jax.Array, jax.Array, jax.Array, Any, Any]:
  """(sample key, train key, task, global variables, previous task's model) at the start of
  a round: the round's key split in two, its task, state["server"] and the model the last
  task ended with (`previous_task_model`)."""
  sample_key, train_key = jax.random.split(key)
  task = task_of_round(round_index, settings)
  server = state["server"]
  old_model = previous_task_model(server, state["old_model"], round_index,
                                  settings.rounds_per_task)
  return sample_key, train_key, task, server, old_model


def sample_replay_cohort(key: jax.Array, client_states: Any, data: Any, task: jax.Array,
                         settings: Any, client_map: Any, replay: ReplaySettings,
                         forward: Any, variables: Any, *, n_max: int
                         ) -> tuple[Any, Any, jax.Array, Any, jax.Array]:
  """The round's cohort with updated exemplar memories and training data (`replay_cohort`).

  Every sampled client's transition and memory update under the global `variables`
  (`update_client`), then its training rows: its current data, then its
  exemplars (`replay_rows`). Returns (clients, their new states, their train rows,
  the cohort's `GroupData`, whether each was at a task transition).
  """
  def prepare(client, client_id):
    new_client, transition = update_client(
        replay, forward, variables, client, client_id, task, data, n_max=n_max,
        num_classes=settings.num_classes)
    rows, size = replay_rows(data.client_indices[task, client_id],
                             data.client_sizes[task, client_id], new_client.memory,
                             n_max)
    return new_client, rows, size, transition

  return replay_cohort(key, client_states, data, task, settings.clients_per_round,
                       client_map, prepare)


def update_client_memories(key: jax.Array, client_states: Any, data: Any, task: jax.Array,
                           settings: Any, client_map: Any, replay: ReplaySettings,
                           forward: Any, variables: Any, *, n_max: int
                           ) -> tuple[jax.Array, Any, jax.Array]:
  """(clients, their new states, transitions): the round's cohort among the clients joined by
  `task` and every sampled client's transition and memory update under `variables`
  (`update_client`), for a method that builds its training rows itself."""
  clients = cohort.sample_cohort(key, data.client_joined[task], settings.clients_per_round)
  updated, transitions = client_map(
      lambda cs, cid: update_client(replay, forward, variables, cs, cid, task, data,
                                    n_max=n_max, num_classes=settings.num_classes),
      (cohort.gather(client_states, clients), clients))
  return clients, updated, transitions


def train_and_average(trainer: Any, server: Any, aux: Any, members: Any, clients: jax.Array,
                      key: jax.Array, settings: Any, round_index: jax.Array
                      ) -> tuple[Any, dict[str, jax.Array]]:
  """FedAvg of the cohort's local training: (new global variables, per-client metrics).

  Every sampled client trains from the global `server` variables with its `aux` entries
  (`local.train_clients`, the round's epoch rates, keys folded from `key` by client); the
  new global model is the unweighted mean of the trained models.
  """
  m = settings.clients_per_round
  trained, local_metrics = local.train_clients(
      trainer, aggregation.broadcast(server, m), aux, members, client_keys(key, clients),
      epoch_learning_rates(settings, round_index), sequential=settings.sequential)
  return aggregation.weighted_mean(trained, jnp.ones((m,), jnp.float32)), local_metrics


def distillation_aux(old_model: Any, task: jax.Array, settings: Any) -> dict[str, jax.Array]:
  """iCaRL's per-client aux entries of the round: "class_mask" (m, C) the seen classes,
  "old_model" the previous task's model, "num_old" (m,) the classes of earlier tasks."""
  m, c, k = settings.clients_per_round, settings.num_classes, settings.classes_per_task
  return {"class_mask": jnp.broadcast_to(masking.seen_class_mask((task + 1) * k, c), (m, c)),
          "old_model": aggregation.broadcast(old_model, m),
          "num_old": jnp.broadcast_to(task * k, (m,)).astype(jnp.int32)}


def updated_class_statistics(forward: Any, variables: Any, train_rows: jax.Array,
                             train_sizes: jax.Array, data: Any, client_map: Any,
                             class_sums: jax.Array, class_counts: jax.Array
                             ) -> tuple[jax.Array, jax.Array]:
  """The NME statistics after a round: (class sums (C, D), class counts (C,)).

  Every cohort client's class feature sums and counts under `variables` over its training
  rows (`class_feature_sums`), summed over the cohort; a class no client reports keeps its
  stored `class_sums` and `class_counts`.
  """
  num_classes = class_counts.shape[0]

  def one(rows, size):
    features, _ = forward(variables, data.images[rows])
    valid = jnp.arange(rows.shape[0]) < size
    return class_feature_sums(features, data.labels[rows], valid, num_classes)

  sums, counts = client_map(one, (train_rows, train_sizes))
  sums, counts = jnp.sum(sums, axis=0), jnp.sum(counts, axis=0)
  reported = counts > 0
  return (jnp.where(reported[:, None], sums, class_sums),
          jnp.where(reported, counts, class_counts))


def nme_stream_bytes(server: Any, state: Any, task: jax.Array,
                     settings: Any) -> dict[str, jax.Array]:
  """The round's "train/server/bytes_up" / ".../bytes_down" with NME statistics.

  Each of the M sampled clients sends its model (the shapes of `server`) and its class
  feature sums and counts (those of state["class_sums"], state["class_counts"]) and receives
  the global model twice (to train, then to compute the statistics under the aggregated
  model), from task 1 on the old model too.
  """
  m = settings.clients_per_round
  model_size = common.tree_bytes(server)
  statistics_size = common.tree_bytes((state["class_sums"], state["class_counts"]))
  return common.stream_bytes(m * (model_size + statistics_size),
                             m * model_size * (2.0 + (task > 0)))


def replay_metrics(prefix: str, updated: ClientState,
                   transitions: jax.Array) -> dict[str, jax.Array]:
  """"<prefix>/exemplars" (mean stored exemplars of the cohort after the update) and
  "<prefix>/transitions" (sampled clients at a task transition)."""
  return {f"{prefix}/exemplars": jnp.mean(jnp.sum(updated.memory.valid, axis=-1).astype(
              jnp.float32)),
          f"{prefix}/transitions": jnp.sum(transitions).astype(jnp.int32)}


#: The classifiers of `make_icarl_fl`'s evaluation: iCaRL's nearest mean of exemplars, or the
#: global model's own head.
CLASSIFIERS = ("nme", "head")


def make_icarl_fl(settings: Any, icarl: ReplaySettings, model: Any, mean: Any, std: Any,
                  max_client_size: int, *, eval_batch_size: int = 500, classifier: str = "nme",
                  local_loss: local.LocalLossFn | None = None,
                  task_aux: Callable[[jax.Array], dict[str, jax.Array]] | None = None,
                  name: str = "icarl_fl", metric_prefix: str = "icarl") -> Algorithm:
  """iCaRL + FL on the task stream as an `Algorithm` (`algorithms.icarl_fl`'s docstring).

  `settings` is the run's `cil.stream.StreamSettings`. State: {"server":
  variables, "old_model": variables (the global model at the end of the
  previous task), "clients": `ClientState`, "class_sums": (C, D) float32,
  "class_counts": (C,) int32 (the NME statistics)}. The round's data is a
  `cil.stream.StreamArrays`. Metrics: "train/loss" (cohort mean),
  "icarl/exemplars" (mean stored exemplars of the cohort after the update),
  "icarl/transitions" (sampled clients at a task transition),
  "icarl/classes_with_mean" (classes the NME classifier can predict),
  "train/server/bytes_up" / ".../bytes_down" (the M sampled clients' models up and the
  global model down to each, from task 1 on the old model down too; for the NME statistics
  each client receives the aggregated model and sends its class feature sums and counts,
  (C, D) float32 and (C,) int32), "task", "clients". `evaluate(state, (test_images,
  test_labels, num_seen))` gives the NME classifier's per-class (correct, total,
  predicted) counts; with `classifier="head"` the global model's own head's
  (`cil.stream.make_class_counts`, top-1 among the seen classes' logits) instead.

  A method built on iCaRL + FL (GeoDL + iCaRL + FL) passes its own `local_loss` (default
  `icarl_local_loss`), `task_aux(task)`: extra per-client aux entries of the round's task
  (scalars, broadcast to the cohort), its `name` and its `metric_prefix` (the
  "icarl/..." metrics above); the loss's own metrics are logged as "train/<name>".
  """
  m, c = settings.clients_per_round, settings.num_classes
  n_max, mem = int(max_client_size), icarl.memory_size
  _, trainer, forward, client_map = make_replay_training(
      settings, local_loss or icarl_local_loss(model), model, mean, std, n_max + mem,
      eval_batch_size)

  def init(key, data):
    num_clients = data.client_joined.shape[1]
    variables = models.init_variables(model, key)
    features = jax.eval_shape(lambda x: forward(variables, x)[0], data.images[:1])
    return {"server": variables, "old_model": variables,
            "clients": init_client_state(num_clients, mem),
            "class_sums": jnp.zeros((c, features.shape[-1]), jnp.float32),
            "class_counts": jnp.zeros((c,), jnp.int32)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key, task, server, old_model = round_start(state, key, round_index,
                                                                 settings)
    clients, updated, train_rows, members, transitions = sample_replay_cohort(
        sample_key, state["clients"], data, task, settings, client_map, icarl, forward, server,
        n_max=n_max)
    extra = {} if task_aux is None else task_aux(task)
    aux = {**distillation_aux(old_model, task, settings),
           **{key: jnp.broadcast_to(value, (m,)) for key, value in extra.items()}}
    new_server, local_metrics = train_and_average(trainer, server, aux, members, clients,
                                                  train_key, settings, round_index)
    class_sums, class_counts = updated_class_statistics(
        forward, new_server, train_rows, members.sizes, data, client_map, state["class_sums"],
        state["class_counts"])

    prefix = metric_prefix
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        **{f"train/{key}": jnp.mean(value) for key, value in local_metrics.items()
           if key != "loss"},
        **{f"{prefix}/{key}": value for key, value in extra.items()},
        **replay_metrics(prefix, updated, transitions),
        f"{prefix}/classes_with_mean": jnp.sum(class_counts > 0).astype(jnp.int32),
        **nme_stream_bytes(server, state, task, settings),
        "task": task, "clients": clients}
    return ({"server": new_server, "old_model": old_model,
             "clients": cohort.scatter(state["clients"], clients, updated),
             "class_sums": class_sums, "class_counts": class_counts}, metrics)

  if classifier not in CLASSIFIERS:
    raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}")

  def evaluate(state, test):
    images, labels, num_seen = test
    if classifier == "head":
      head = make_class_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
      return head(state["server"], images, labels, num_seen)
    counts = make_nme_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], state["class_sums"], state["class_counts"], images, labels,
                  num_seen)

  return Algorithm(name=name, init=init, round=round_fn, evaluate=evaluate)

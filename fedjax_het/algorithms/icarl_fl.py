"""iCaRL + FL: the "iCaRL + FL" baseline of GLFC Table 1 on the class-incremental trainer.

`make(config, setup)` is the registered method "icarl_fl" (config.algorithm
= "icarl_fl", trained by `fedjax_het.train` like every method): iCaRL [iCaRL] run by every client, the models
averaged by FedAvg, as GLFC's paper uses it as a baseline [GLFC Sec. 5: the
class-incremental methods "combined with FL"]. One round, for the sampled
clients (the same sampling, gathering and local training as `algorithms.glfc`):

  1. the client receives the global model. It knows when its data changed
     (the task transition is read from the stream; iCaRL has no detection
     rule): at a transition the classes of its previous data that it does not
     hold now are added to its exemplar memory by iCaRL herding on the
     L2-normalised features of the received global model (eval mode), m =
     memory_size // (classes learned) per class, old classes reduced to their
     first m picks [iCaRL Alg. 4, 5] (`algorithms.glfc.store_previous_classes`; the
     memory holds pool indices, `algorithms.glfc.encode_pool_indices`);
  2. it trains on its current data plus its exemplars (`algorithms.glfc.replay_rows`)
     with iCaRL's loss [iCaRL Alg. 3]: sigmoid BCE over the seen classes
     against the one-hot target whose old-class columns [0, t*k) are replaced
     by sigmoid(old model's logits) (`losses.glfc.
     class_semantic_relation_distillation_loss`, which is exactly that; in
     task 0 num_old_classes = 0 makes it the plain BCE). The old model is the
     global model at the end of the previous task (`state["old_model"]`,
     replaced at the first round of every task; iCaRL's "network before the
     update"), the same for every client, stored once;
  3. the server averages the trained models (plain mean, like `algorithms.glfc`);
  4. nearest-mean-of-exemplars statistics [iCaRL Alg. 1]: every sampled
     client computes, with the NEW global model (eval mode), the per-class sums
     of L2-normalised features and the counts over its training set (current
     data plus exemplars: together they cover every class it has seen). The
     server keeps (C, D) sums and (C,) counts: the rows of the classes
     reported this round are replaced by the cohort's totals (a pooled mean
     over the cohort's images of the class), the other rows keep their value
     from the last round they were reported in.

Classifier (`evaluate`): nearest mean of exemplars. The class means mu_y =
sum_y / count_y are L2-normalised; a test image is assigned, among the seen
classes that have a mean, to the class whose normalised mean is nearest
(Euclidean) to its L2-normalised feature [iCaRL Alg. 1]. The result is the
per-class (correct, total, predicted) counts of `cil.stream.make_class_counts`,
so the trainer's tables and metrics are unchanged.

Federated choices and deviations from iCaRL's paper / code:
  * Class means are federated statistics of the last cohort that reported the
    class: a class no sampled client holds this round keeps its STALE mean,
    computed with an older global model (the feature extractor moved on
    since). Recomputing every mean every round would need every client, not
    the cohort, to take part.
  * Means are computed over the client's current data plus its exemplars, in
    the federation's pooled form (sum of normalised features / count over the
    cohort). iCaRL computes each class mean from its exemplar set only; its
    code (and `algorithms.glfc`'s `compute_class_mean`) also averages the features
    of horizontally flipped images, which is not done here (no augmentation
    in the trainer).
  * The task transition is read from the stream (as `glfc.transition =
    "stream"`); only sampled clients update their memory (a client not
    sampled at a task change stores its previous classes the next time it
    is sampled, from the data it last trained on).
  * Exemplars are distinct (`icarl.distinct_exemplars = True`, iCaRL's paper;
    False gives the GLFC code's herding with repeats).
  * The old model's logits are computed in task 0 as well (where they have no
    effect: num_old_classes = 0), to keep one program for the whole stream.
  * Local SGD, lr and schedule as the trainer's `local` section
    (`cil.stream.epoch_learning_rates`); iCaRL's own optimiser settings (lr
    2.0, 70 epochs, decays at 49 and 63, batch 128, weight decay 1e-5) are not
    used: the FL baseline trains like the other methods of Table 1.

References:
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017 (Alg. 1-5).
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022, Table 1 ("iCaRL + FL").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay, common
from fedjax_het.algorithms import glfc as glfc_lib
from fedjax_het.cil import exemplars, masking
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import batched_class_counts, epoch_learning_rates, task_of_round
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import client_keys
from fedjax_het.losses import glfc as glfc_losses

#: iCaRL's memory K (CIFAR-100 experiments: 2000 exemplars), per client here.
ICARL_MEMORY_SIZE = 2000


def icarl_section() -> ml_collections.ConfigDict:
  """`config.icarl`: iCaRL's settings (paper values)."""
  return ml_collections.ConfigDict({
      "memory_size": ICARL_MEMORY_SIZE,   # exemplars per client, images
      "distinct_exemplars": True,         # iCaRL's paper: each image at most once
  })


def validate_icarl_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.icarl`; errors name the field and the allowed values."""
  if "icarl" not in config:
    v.fail("icarl", "a section when config.algorithm is 'icarl_fl' (build the config with "
           "fedjax_het.config.base_config('icarl_fl'))", None)
  v.check(config, "icarl.memory_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "icarl.distinct_exemplars", v.is_bool, "True or False")


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
  forward = glfc_lib.make_eval_forward(model, normalizer(mean, std), batch_size)

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
  task ended with (`glfc.previous_task_model`)."""
  sample_key, train_key = jax.random.split(key)
  task = task_of_round(round_index, settings)
  server = state["server"]
  old_model = glfc_lib.previous_task_model(server, state["old_model"], round_index,
                                           settings.rounds_per_task)
  return sample_key, train_key, task, server, old_model


def sample_replay_cohort(key: jax.Array, client_states: Any, data: Any, task: jax.Array,
                         settings: Any, client_map: Any, replay: cil_replay.ReplaySettings,
                         forward: Any, variables: Any, *, n_max: int
                         ) -> tuple[Any, Any, jax.Array, Any, jax.Array]:
  """The round's cohort with updated exemplar memories and training data (`glfc.replay_cohort`).

  Every sampled client's transition and memory update under the global `variables`
  (`cil_replay.update_client`), then its training rows: its current data, then its
  exemplars (`glfc.replay_rows`). Returns (clients, their new states, their train rows,
  the cohort's `GroupData`, whether each was at a task transition).
  """
  def prepare(client, client_id):
    new_client, transition = cil_replay.update_client(
        replay, forward, variables, client, client_id, task, data, n_max=n_max,
        num_classes=settings.num_classes)
    rows, size = glfc_lib.replay_rows(data.client_indices[task, client_id],
                                      data.client_sizes[task, client_id], new_client.memory,
                                      n_max)
    return new_client, rows, size, transition

  return glfc_lib.replay_cohort(key, client_states, data, task, settings.clients_per_round,
                                client_map, prepare)


def update_client_memories(key: jax.Array, client_states: Any, data: Any, task: jax.Array,
                           settings: Any, client_map: Any, replay: cil_replay.ReplaySettings,
                           forward: Any, variables: Any, *, n_max: int
                           ) -> tuple[jax.Array, Any, jax.Array]:
  """(clients, their new states, transitions): the round's cohort among the clients joined by
  `task` and every sampled client's transition and memory update under `variables`
  (`cil_replay.update_client`), for a method that builds its training rows itself."""
  clients = cohort.sample_cohort(key, data.client_joined[task], settings.clients_per_round)
  updated, transitions = client_map(
      lambda cs, cid: cil_replay.update_client(replay, forward, variables, cs, cid, task, data,
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


def replay_metrics(prefix: str, updated: cil_replay.ClientState,
                   transitions: jax.Array) -> dict[str, jax.Array]:
  """"<prefix>/exemplars" (mean stored exemplars of the cohort after the update) and
  "<prefix>/transitions" (sampled clients at a task transition)."""
  return {f"{prefix}/exemplars": jnp.mean(jnp.sum(updated.memory.valid, axis=-1).astype(
              jnp.float32)),
          f"{prefix}/transitions": jnp.sum(transitions).astype(jnp.int32)}


def make_icarl_fl(settings: Any, icarl: cil_replay.ReplaySettings, model: Any, mean: Any, std: Any,
                  max_client_size: int, *, eval_batch_size: int = 500,
                  local_loss: local.LocalLossFn | None = None,
                  task_aux: Callable[[jax.Array], dict[str, jax.Array]] | None = None,
                  name: str = "icarl_fl", metric_prefix: str = "icarl") -> Algorithm:
  """iCaRL + FL on the task stream as an `Algorithm` (module docstring).

  `settings` is the run's `cil.stream.StreamSettings`. State: {"server":
  variables, "old_model": variables (the global model at the end of the
  previous task), "clients": `cil_replay.ClientState`, "class_sums": (C, D) float32,
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
  predicted) counts.

  A method built on iCaRL + FL (GeoDL + iCaRL + FL) passes its own `local_loss` (default
  `icarl_local_loss`), `task_aux(task)`: extra per-client aux entries of the round's task
  (scalars, broadcast to the cohort), its `name` and its `metric_prefix` (the
  "icarl/..." metrics above); the loss's own metrics are logged as "train/<name>".
  """
  m, c = settings.clients_per_round, settings.num_classes
  n_max, mem = int(max_client_size), icarl.memory_size
  _, trainer, forward, client_map = glfc_lib.make_replay_training(
      settings, local_loss or icarl_local_loss(model), model, mean, std, n_max + mem,
      eval_batch_size)

  def init(key, data):
    num_clients = data.client_joined.shape[1]
    variables = models.init_variables(model, key)
    features = jax.eval_shape(lambda x: forward(variables, x)[0], data.images[:1])
    return {"server": variables, "old_model": variables,
            "clients": cil_replay.init_client_state(num_clients, mem),
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

  def evaluate(state, test):
    images, labels, num_seen = test
    counts = make_nme_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], state["class_sums"], state["class_counts"], images, labels,
                  num_seen)

  return Algorithm(name=name, init=init, round=round_fn, evaluate=evaluate)


#: A method of the class-incremental task stream (`fedjax_het.algorithms.Method`).
CLASS_INCREMENTAL = True


def default_config() -> ml_collections.ConfigDict:
  """iCaRL's own section, `config.icarl` (`icarl_section`)."""
  return ml_collections.ConfigDict({"icarl": icarl_section()})


validate_config = validate_icarl_config


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """iCaRL + FL from a class-incremental config (`make_icarl_fl`)."""
  return make_icarl_fl(setup.settings, cil_replay.ReplaySettings.from_section(config.icarl, setup.client_classes),
                       setup.model, setup.mean, setup.std, setup.max_client_size,
                       eval_batch_size=setup.eval_batch_size)

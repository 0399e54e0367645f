"""DDE + iCaRL + FL: the "DDE + iCaRL + FL" row of GLFC Table 1 on the class-incremental trainer.

`make(config, setup)` is the registered method "dde_icarl_fl" (config.algorithm
= "dde_icarl_fl"): DDE [DDE] on top of iCaRL [iCaRL] run locally by every
client, the models averaged by FedAvg each round, as GLFC's paper combines
every class-incremental method with FL [GLFC Sec. 5]. It is iCaRL + FL
(`algorithms.icarl_fl`: the same stream, exemplar memory, old model and
nearest-mean-of-exemplars statistics) with DDE's two parts:

  * colliding-effect distillation [DDE Sec. 4.1] in the local loss;
  * incremental momentum effect removal [DDE Sec. 4.2] in the classifier.

One round, for the sampled clients:

  1. the client receives the global model; at a task transition (read from
     the stream) it adds the classes of its previous data to its exemplar
     memory by iCaRL herding on the received model's features (memory
     `dde.memory_size` per client, `algorithms.cil_replay`, as iCaRL + FL);
  2. it trains on its current data plus its exemplars with iCaRL's loss whose
     classification columns are DDE's colliding effect
     (`losses.causal_distillation`): for every row of a batch, its K =
     `dde.neighbours` = 10 (the code's top_k) nearest rows of the NEW classes
     in the batch, by Euclidean distance between the L2-normalised features
     of the old model (the global model at the end of the previous task,
     iCaRL + FL's), collide with it; on the new-class columns the prediction
     is q_c = W_0 sigmoid(z_c(x)) + sum_k W_k sigmoid(z_c(x_k)), W_0 =
     `dde.self_weight` = 1/2, W_k = (1 - W_0) / K (the code's mu_1 = mu_2 =
     1), the neighbours' outputs constant, trained by BCE against the one-hot
     label; the old-class columns keep iCaRL's BCE against the old model's
     sigmoid outputs. In task 0 there is no old model and no neighbour: the
     loss is iCaRL's plain BCE;
  3. during that training, from task 1 on, the client accumulates DDE's
     momentum of the features [DDE Sec. 4.2, the code's `causal_embed`]:
     h <- mu h + mean over the batch's valid rows of the new model's
     features, mu = `dde.momentum` = 0.9. h is a batch statistic of the
     model: `variables["batch_stats"]["dde_momentum"]` (D,), carried from
     step to step by the local trainer like BatchNorm's running statistics;
  4. the server averages the trained variables (plain mean, like iCaRL +
     FL), h included: each client continues the momentum from the averaged
     one, so the global h follows the federation's training; h is zeroed at
     the first round of every task (the code restarts it at every
     incremental step);
  5. NME statistics as iCaRL + FL (per-class sums of normalised features
     and counts under the new global model, the last cohort that reported a
     class).

Classifier (`evaluate`): nearest mean of exemplars on the momentum-removed
feature. DDE's removal [DDE Sec. 4.2, the code's `compute_accuracy_TDE`] acts on
a cosine classifier, logit_c = cos(x, w_c) - alpha cos(x, h) cos(h, w_c),
alpha = `dde.alpha` = 0.5; it equals (x_hat - alpha (x_hat . h_hat) h_hat) .
w_hat_c, the class weights against the normalised feature with its
projection on the momentum direction h_hat scaled by alpha removed. iCaRL's
NME on L2-normalised features and means is such a classifier with w_c the
class mean mu_c: -||x_hat - mu_hat_c||^2 = 2 cos(x, mu_c) - 2 ranks the classes
as cos(x, mu_c). So the classifier is iCaRL + FL's NME (`cil_replay.nme_scores`)
on the feature x' = x_hat - alpha (x_hat . h_hat) h_hat: nme_scores normalises
x' again, which scales all of a row's cosines by 1/||x'|| and keeps the
ranking of logit_c above. h = 0 (task 0, whose training never updates it)
leaves the feature unchanged: the classifier is iCaRL + FL's.

Federated choices, interpretations and deviations:
  * Neighbours within the training batch (current data and exemplars, the
    batch of the local trainer), not over the client's whole training set:
    the code searches its whole new data once per task with the old model and
    runs the new model on the K neighbours of every sample (K extra forward
    passes per batch); inside the batch the neighbours' predictions are rows
    of the batch's own forward pass. A row with fewer than K new-class rows
    in its batch uses those there are (weights (1 - W_0) / K'); with none, W_0
    = 1 and its loss is iCaRL's.
  * Candidates: the code's rule "v4": every row (new data and exemplars) is
    an anchor; only rows of the new classes [C_old, C_seen) other than the row
    itself are neighbours.
  * iCaRL's outputs are per-class sigmoids, so the colliding effect is taken
    per class column and replaces iCaRL's classification term (the new-class
    columns), keeping its distillation term (the old-class columns), as the
    code replaces LUCIR's cross-entropy by the joint prediction's NLL and keeps
    LUCIR's distillation (`losses.causal_distillation`). LUCIR's own feature
    distillation and margin ranking loss, which the code trains beside DDE,
    belong to LUCIR and are not used.
  * The momentum is accumulated from the new model's train-mode features of
    every valid row of every local step from task 1 on, as the code's
    `causal_embed` update; the code normalises it at test time (here: h_hat).
    Its federation (clients continue the global h, the server averages) is
    this module's choice; the momentum vector (D float32) travels with the
    model and is counted in the round's bytes.
  * The removal is applied to the NME classifier, as above: the code applies
    it to LUCIR's cosine classifier (its NME accuracies are reported without
    it). alpha is fixed (the code's 0.5; its optional fine-tuned alpha pair,
    `finetune_TDE_alpha_list`, is not used).
  * Everything else is iCaRL + FL's (`algorithms.icarl_fl` docstring):
    memory, stale class means of classes not held by the cohort, task
    transitions read from the stream, the trainer's local SGD.

References:
  [DDE] X. Hu, K. Tang, C. Miao, X.-S. Hua, H. Zhang. Distilling Causal Effect
    of Data in Class-Incremental Learning. CVPR 2021 (code: JoyHuYY1412/DDE_CIL).
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017.
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022, Table 1 ("DDE + iCaRL + FL").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay
from fedjax_het.cil import exemplars
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import batched_class_counts
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.losses import causal_distillation

#: The batch statistic holding DDE's feature momentum h (D,) (module docstring).
MOMENTUM = "dde_momentum"


def default_config() -> ml_collections.ConfigDict:
  """`config.dde`: the memory (iCaRL + FL's) and DDE's settings (the authors' code values)."""
  return ml_collections.ConfigDict({"dde": {
      **cil_replay.replay_section(cil_replay.ICARL_MEMORY_SIZE),
      "neighbours": 10,     # K, the code's top_k
      "self_weight": 0.5,   # W_0 = mu_1 / (mu_1 + mu_2), mu_1 = mu_2 = 1
      "momentum": 0.9,      # mu of the feature momentum (the code's causal_embed)
      "alpha": 0.5,         # momentum effect removal at test time (the code's alpha_TDE)
  }})


def validate_config(config: ml_collections.ConfigDict) -> None:
  cil_replay.validate_replay_section(config, "dde")
  v.check(config, "dde.neighbours", v.int_at_least(1), "an integer >= 1")
  v.check(config, "dde.self_weight", lambda x: v.finite_number(x) and 0 < x <= 1,
          "a number in (0, 1]")
  v.check(config, "dde.momentum", lambda x: v.finite_number(x) and 0 <= x < 1,
          "a number in [0, 1)")
  v.check(config, "dde.alpha", lambda x: v.finite_number(x) and 0 <= x <= 1,
          "a number in [0, 1]")


def split_variables(variables: Any) -> tuple[Any, jax.Array]:
  """(the model's own variables, the feature momentum h (D,)) of a DDE variables dict."""
  stats = {name: value for name, value in variables["batch_stats"].items() if name != MOMENTUM}
  return ({"params": variables["params"], "batch_stats": stats},
          variables["batch_stats"][MOMENTUM])


def with_momentum(variables: Any, momentum: jax.Array) -> Any:
  """`variables` with the feature momentum h set to `momentum`."""
  stats = dict(variables["batch_stats"])
  stats[MOMENTUM] = momentum
  return {"params": variables["params"], "batch_stats": stats}


def dde_local_loss(model: Any, *, num_neighbours: int, self_weight: float,
                   momentum: float) -> local.LocalLossFn:
  """iCaRL's loss with DDE's colliding effect, and the momentum update (module docstring).

  `batch_stats` carries the model's statistics and h ("dde_momentum"); h is
  updated, h <- momentum h + mean of the valid rows' features, only when
  there are old classes. aux: "class_mask" (C,) the seen classes,
  "old_model" DDE variables of the old model, "num_old" () int32 = t k.
  Metrics: "neighbours", the mean number of neighbours of the valid rows.
  """

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    model_vars, h = split_variables({"params": params, "batch_stats": batch_stats})
    features, logits, new_vars = models.apply_model(model, model_vars, images, train=True,
                                                    rng=rng, mask=mask)
    old_vars, _ = split_variables(aux["old_model"])
    old_features, old_logits, _ = models.apply_model(model, old_vars, images, train=False)
    old_features, old_logits = jax.lax.stop_gradient((old_features, old_logits))
    num_old = aux["num_old"]
    neighbours, weights = causal_distillation.colliding_neighbours(
        old_features=old_features, labels=labels, num_old_classes=num_old,
        num_neighbours=num_neighbours, self_weight=self_weight, mask=mask)
    loss = causal_distillation.colliding_effect_bce_loss(
        logits=logits, labels=labels, old_logits=old_logits, neighbours=neighbours,
        weights=weights, num_old_classes=num_old, class_mask=aux["class_mask"], mask=mask)
    valid = jnp.asarray(mask, jnp.float32)
    count = jnp.maximum(jnp.sum(valid), 1.0)
    batch_mean = jnp.sum(jax.lax.stop_gradient(features) * valid[:, None], axis=0) / count
    h = jnp.where(num_old > 0, momentum * h + batch_mean, h)
    used = jnp.sum(jnp.sum(weights[:, 1:] > 0, axis=-1) * valid) / count
    stats = dict(new_vars["batch_stats"])
    stats[MOMENTUM] = h
    return loss, (stats, {"neighbours": used})

  return loss_fn


def remove_momentum_effect(features: jax.Array, momentum: jax.Array, alpha: float) -> jax.Array:
  """x_hat - alpha (x_hat . h_hat) h_hat (B, D): DDE's momentum effect removal [DDE Sec. 4.2].

  x_hat, h_hat: the L2-normalised features and momentum (`cil.exemplars`'
  x / max(||x||, 1e-12): h = 0 gives h_hat = 0 and x_hat unchanged).
  """
  normalize = exemplars._l2_normalize  # pylint: disable=protected-access
  x = normalize(jnp.asarray(features, jnp.float32))
  h = normalize(jnp.asarray(momentum, jnp.float32)[None, :])
  return x - alpha * jnp.sum(x * h, axis=-1, keepdims=True) * h


def momentum_removed_nme_scores(features: jax.Array, momentum: jax.Array, alpha: float,
                                class_sums: jax.Array, class_counts: jax.Array,
                                num_seen: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(scores (B, C), available (C,)): `cil_replay.nme_scores` of the momentum-removed features.

  The ranking of every row's scores is that of DDE's logits cos(x, mu_c) -
  alpha cos(x, h) cos(h, mu_c) with the class means mu_c as the cosine
  classifier's weights (module docstring).
  """
  return cil_replay.nme_scores(remove_momentum_effect(features, momentum, alpha), class_sums,
                               class_counts, num_seen)


def make_dde_counts(model: Any, mean: Any, std: Any, num_classes: int, alpha: float,
                    batch_size: int):
  """`counts(variables, class_sums, class_counts, images, labels, num_seen)` of the classifier.

  `variables` are DDE variables (the model's and h); the result is the
  per-class (correct, total, predicted) counts (`cil.stream.batched_class_counts`).
  """
  forward = cil_replay.make_eval_forward(model, normalizer(mean, std), batch_size)

  def counts(variables, class_sums, class_counts, images, labels, num_seen):
    model_vars, h = split_variables(variables)

    def scores(x):
      features, _ = forward(model_vars, x)
      return momentum_removed_nme_scores(features, h, alpha, class_sums, class_counts, num_seen)

    return batched_class_counts(scores, num_classes, images, labels, batch_size)

  return counts


def make_dde_icarl_fl(settings: Any, replay: cil_replay.ReplaySettings, model: Any, mean: Any,
                      std: Any, max_client_size: int, *, neighbours: int = 10,
                      self_weight: float = 0.5, momentum: float = 0.9, alpha: float = 0.5,
                      eval_batch_size: int = 500) -> Algorithm:
  """DDE + iCaRL + FL on the task stream as an `Algorithm` (module docstring).

  State: {"server": DDE variables (the model's, "dde_momentum" (D,) in
  "batch_stats"), "old_model": the same at the end of the previous task,
  "clients": `cil_replay.ClientState`, "class_sums": (C, D) float32,
  "class_counts": (C,) int32}. Metrics: "train/loss", "train/neighbours"
  (cohort means), "dde/exemplars" (mean stored exemplars of the cohort),
  "dde/transitions" (sampled clients at a task transition),
  "dde/classes_with_mean", "dde/momentum_norm" (||h|| of the global model),
  "train/server/bytes_up" / ".../bytes_down" (as iCaRL + FL's, the variables
  with h), "task", "clients". `evaluate(state, (test_images, test_labels,
  num_seen))`: the per-class (correct, total, predicted) counts of the
  momentum-removed NME classifier.
  """
  c = settings.num_classes
  n_max, mem = int(max_client_size), replay.memory_size
  loss_fn = dde_local_loss(model, num_neighbours=neighbours, self_weight=self_weight,
                           momentum=momentum)
  _, trainer, forward, client_map = cil_replay.make_replay_training(
      settings, loss_fn, model, mean, std, n_max + mem, eval_batch_size)
  dde_counts = make_dde_counts(model, mean, std, c, alpha, eval_batch_size)

  def init(key, data):
    variables = models.init_variables(model, key)
    features = jax.eval_shape(lambda x: forward(variables, x)[0], data.images[:1])
    dim = features.shape[-1]
    return {"server": with_momentum(variables, jnp.zeros((dim,), jnp.float32)),
            "old_model": with_momentum(variables, jnp.zeros((dim,), jnp.float32)),
            "clients": cil_replay.init_client_state(data.client_joined.shape[1], mem),
            "class_sums": jnp.zeros((c, dim), jnp.float32),
            "class_counts": jnp.zeros((c,), jnp.int32)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key, task, server, old_model = cil_replay.round_start(
        state, key, round_index, settings)
    model_vars, h = split_variables(server)
    new_task = round_index % settings.rounds_per_task == 0
    server = with_momentum(server, jnp.where(new_task, jnp.zeros_like(h), h))
    clients, updated, train_rows, members, transitions = cil_replay.sample_replay_cohort(
        sample_key, state["clients"], data, task, settings, client_map, replay, forward,
        model_vars, n_max=n_max)
    new_server, local_metrics = cil_replay.train_and_average(
        trainer, server, cil_replay.distillation_aux(old_model, task, settings), members, clients,
        train_key, settings, round_index)

    new_model_vars, new_h = split_variables(new_server)
    class_sums, class_counts = cil_replay.updated_class_statistics(
        forward, new_model_vars, train_rows, members.sizes, data, client_map,
        state["class_sums"], state["class_counts"])
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        "train/neighbours": jnp.mean(local_metrics["neighbours"]),
        **cil_replay.replay_metrics("dde", updated, transitions),
        "dde/classes_with_mean": jnp.sum(class_counts > 0).astype(jnp.int32),
        "dde/momentum_norm": jnp.sqrt(jnp.sum(jnp.square(new_h))),
        **cil_replay.nme_stream_bytes(server, state, task, settings),
        "task": task, "clients": clients}
    return ({"server": new_server, "old_model": old_model,
             "clients": cohort.scatter(state["clients"], clients, updated),
             "class_sums": class_sums, "class_counts": class_counts}, metrics)

  def evaluate(state, test):
    images, labels, num_seen = test
    return dde_counts(state["server"], state["class_sums"], state["class_counts"], images,
                      labels, num_seen)

  return Algorithm(name="dde_icarl_fl", init=init, round=round_fn, evaluate=evaluate)


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """DDE + iCaRL + FL from a class-incremental config (`make_dde_icarl_fl`)."""
  section = config.dde
  return make_dde_icarl_fl(setup.settings,
                           cil_replay.ReplaySettings.from_section(section, setup.client_classes),
                           setup.model, setup.mean, setup.std, setup.max_client_size,
                           neighbours=int(section.neighbours),
                           self_weight=float(section.self_weight),
                           momentum=float(section.momentum), alpha=float(section.alpha),
                           eval_batch_size=setup.eval_batch_size)

"""SS-IL + FL: the "SS-IL + FL" baseline of GLFC Table 1 on the class-incremental trainer.

`make(config, setup)` is the registered method "ssil_fl" (config.algorithm =
"ssil_fl"): SS-IL [SS-IL] run by every client, the models averaged by
FedAvg, as GLFC's paper combines every class-incremental method with FL
[GLFC Sec. 5], on the same stream and with the same exemplar memory as
iCaRL + FL (`algorithms.icarl_fl`, `algorithms.cil_replay`). One round, for
the sampled clients:

  1. the client receives the global model; at a task transition (read from
     the stream) it adds the classes of its previous data to its exemplar
     memory by iCaRL herding on the received model's features (memory
     `ssil.memory_size` per client, m = memory // classes learned per class);
  2. it trains on its current data with ratio-preserving batches [SS-IL]: every step takes B = `local.batch_size` rows of its current
     data (the trainer's epochs are passes over them) and draws R exemplars
     of its memory (uniformly, without repetition within the step; fewer if
     the memory holds fewer), so each batch holds new data and exemplars in
     the fixed ratio B : R. R = `ssil.replay_batch_size`, or with 0 (the
     default) ceil(B * M / n_max), the ratio of the memory M to the largest
     client data n_max (SS-IL: the ratio of M to D_t). The loss on the
     batch of B + R rows (one forward pass, BatchNorm over both) is

        L = L_ce-ss + L_tkd,

     the separated softmax [SS-IL, separated softmax] (a sample of a new class t*k <= y <
     (t+1)*k: cross-entropy of the softmax over the new classes only; an
     exemplar, y < t*k: over the old classes only;
     `losses.incremental.separated_softmax_cross_entropy`) plus the
     task-wise distillation [SS-IL, task-wise KD]: for each past task s < t, T^2 *
     KL(softmax(z_old[C_s] / T) || softmax(z[C_s] / T)) over its k classes
     C_s, summed over s, on every row, T = `ssil.temperature` = 2
     (`losses.incremental.task_wise_distillation_loss`). The old model is the
     global model at the end of the previous task (iCaRL + FL's);
  3. the server averages the trained models (plain mean).

Classifier (`evaluate`): the global model's argmax over all seen classes
[SS-IL: the single softmax at test time].

Interpretations and deviations:
  * "New" and "old" samples are grouped by label (old: y < t*k), not by
    source as in the SS-IL code (its new data hold new classes only): a
    client that kept an old task's data classifies those samples among the
    old classes, like exemplars.
  * The SS-IL code draws a fixed replay batch (32 exemplars beside 128 new
    samples on ImageNet, `--replay-batch-size`) and ends an epoch with the
    shorter of the two loaders; here an epoch is a pass over the client's
    new data, and R is one static number for every client (static shapes),
    by default from the ratio of the memory to the largest client data (a
    client with less data sees relatively more exemplars). In the first
    task the memory is empty and every batch holds B new rows (R rows
    masked).
  * SS-IL's own exemplar selection is not used: the memory is iCaRL + FL's
    (herding), the one memory mechanism of GLFC's FL baselines.
  * The KD term runs on all rows (new data and exemplars), as in the SS-IL
    code. Its weight is 1 (SS-IL: L_ce-ss + L_tkd).
  * Local SGD, lr and schedule as the trainer's `local` section; SS-IL's own
    optimiser settings are not used.

References:
  [SS-IL] H. Ahn, J. Kwak, S. Lim, H. Bang, H. Kim, T. Moon. SS-IL: Separated
    Softmax for Incremental Learning. ICCV 2021.
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022, Table 1 ("SS-IL + FL").
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay, common
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import make_class_counts
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import GroupData
from fedjax_het.losses import incremental as incremental_losses


def default_config() -> ml_collections.ConfigDict:
  """`config.ssil`: the memory (iCaRL + FL's), the KD temperature, the replay batch."""
  return ml_collections.ConfigDict({"ssil": {
      **cil_replay.replay_section(cil_replay.ICARL_MEMORY_SIZE),
      "temperature": incremental_losses.DISTILLATION_TEMPERATURE,  # SS-IL: 2
      "replay_batch_size": 0,  # exemplars per batch; 0: ceil(B * memory / n_max)
  }})


def validate_config(config: ml_collections.ConfigDict) -> None:
  cil_replay.validate_replay_section(config, "ssil")
  v.check(config, "ssil.temperature",
          lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0,
          "a number > 0")
  v.check(config, "ssil.replay_batch_size", v.int_at_least(0),
          "an integer >= 0 (0: the ratio of the memory to the client data)")


def replay_batch_size(batch_size: int, memory_size: int, max_client_size: int,
                      requested: int = 0) -> int:
  """R, the exemplars of a batch: `requested`, or ceil(B * M / n_max) (at most M)."""
  if requested:
    return min(requested, memory_size)
  return max(1, min(memory_size, math.ceil(batch_size * memory_size / max(max_client_size, 1))))


def ssil_local_loss(model: Any, preprocess: Any, *, classes_per_task: int, replay: int,
                    temperature: float) -> local.LocalLossFn:
  """SS-IL's loss on one ratio-preserving batch (module docstring).

  The trainer's batch is B rows of the client's current data; `replay` (R)
  exemplars are drawn from aux["replay_images"] (M, ...) uint8 /
  "replay_labels" (M,) / "replay_valid" (M,) with the step's key. aux also
  holds "old_model" variables and "task" () int32 (t: old classes [0, t*k)).
  """

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    draw_key, model_key = jax.random.split(rng)
    capacity = aux["replay_valid"].shape[0]
    scores = jnp.where(aux["replay_valid"], jax.random.uniform(draw_key, (capacity,)), 2.0)
    _, picked = jax.lax.top_k(-scores, replay)
    x = jnp.concatenate([images, preprocess(aux["replay_images"][picked])])
    y = jnp.concatenate([labels, aux["replay_labels"][picked]])
    valid = jnp.concatenate([mask, aux["replay_valid"][picked]])
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, x, train=True,
                                                  rng=model_key, mask=valid)
    _, old_logits, _ = models.apply_model(model, aux["old_model"], x, train=False)
    task = aux["task"]
    ce = incremental_losses.separated_softmax_cross_entropy(
        logits=logits, labels=y, num_old_classes=task * classes_per_task,
        num_seen_classes=(task + 1) * classes_per_task, mask=valid)
    kd = incremental_losses.task_wise_distillation_loss(
        logits=logits, old_logits=jax.lax.stop_gradient(old_logits),
        classes_per_task=classes_per_task, num_old_tasks=task, temperature=temperature,
        mask=valid)
    return ce + kd, (new_variables["batch_stats"], {"ce": ce, "kd": kd})

  return loss_fn


def make_ssil_fl(settings: Any, replay: cil_replay.ReplaySettings, model: Any, mean: Any,
                 std: Any, max_client_size: int, *, temperature: float = 2.0,
                 replay_batch: int = 0, eval_batch_size: int = 500) -> Algorithm:
  """SS-IL + FL on the task stream as an `Algorithm` (module docstring).

  State: {"server": variables, "old_model": variables (the global model at
  the end of the previous task), "clients": `cil_replay.ClientState`}.
  Metrics: "train/loss", "train/ce", "train/kd" (cohort means),
  "ssil/exemplars" (mean stored exemplars of the cohort),
  "ssil/transitions" (sampled clients at a task transition), "train/server/bytes_up"
  (the M sampled clients' models, M |theta|) and ".../bytes_down" (the global model to
  each, and from task 1 on the old model too: M |theta| or 2 M |theta|), "task",
  "clients".
  """
  m, c, k = settings.clients_per_round, settings.num_classes, settings.classes_per_task
  n_max, mem = int(max_client_size), replay.memory_size
  r = replay_batch_size(settings.batch_size, mem, n_max, replay_batch)
  preprocess = normalizer(mean, std)
  loss_fn = ssil_local_loss(model, preprocess, classes_per_task=k, replay=r,
                            temperature=temperature)
  _, trainer, forward, client_map = cil_replay.make_replay_training(
      settings, loss_fn, model, mean, std, n_max, eval_batch_size)

  def init(key, data):
    variables = models.init_variables(model, key)
    return {"server": variables, "old_model": variables,
            "clients": cil_replay.init_client_state(data.client_joined.shape[1], mem)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key, task, server, old_model = cil_replay.round_start(
        state, key, round_index, settings)
    clients, updated, transitions = cil_replay.update_client_memories(
        sample_key, state["clients"], data, task, settings, client_map, replay, forward, server,
        n_max=n_max)
    rows = data.client_indices[task][clients]
    stored = cil_replay.decode_pool_indices(updated.memory.images)       # (m, M)
    members = GroupData(images=data.images[rows], labels=data.labels[rows],
                        sizes=data.client_sizes[task][clients], client_ids=clients,
                        active=jnp.ones((m,), bool))
    aux = {"replay_images": data.images[stored],
           "replay_labels": jnp.where(updated.memory.valid, updated.memory.labels, 0),
           "replay_valid": updated.memory.valid,
           "old_model": aggregation.broadcast(old_model, m),
           "task": jnp.broadcast_to(task, (m,)).astype(jnp.int32)}
    new_server, local_metrics = cil_replay.train_and_average(
        trainer, server, aux, members, clients, train_key, settings, round_index)
    model_size = common.tree_bytes(server)
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        "train/ce": jnp.mean(local_metrics["ce"]),
        "train/kd": jnp.mean(local_metrics["kd"]),
        **cil_replay.replay_metrics("ssil", updated, transitions),
        **common.stream_bytes(m * model_size, m * model_size * (1.0 + (task > 0))),
        "task": task, "clients": clients}
    return ({"server": new_server, "old_model": old_model,
             "clients": cohort.scatter(state["clients"], clients, updated)}, metrics)

  def evaluate(state, test):
    images, labels, num_seen = test
    counts = make_class_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], images, labels, num_seen)

  return Algorithm(name="ssil_fl", init=init, round=round_fn, evaluate=evaluate)


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """SS-IL + FL from a class-incremental config (`make_ssil_fl`)."""
  return make_ssil_fl(setup.settings,
                      cil_replay.ReplaySettings.from_section(config.ssil, setup.client_classes),
                      setup.model, setup.mean, setup.std, setup.max_client_size,
                      temperature=float(config.ssil.temperature),
                      replay_batch=int(config.ssil.replay_batch_size),
                      eval_batch_size=setup.eval_batch_size)

"""BiC + FL: the "BiC + FL" baseline of GLFC Table 1 on the class-incremental trainer.

`make(config, setup)` is the registered method "bic_fl" (config.algorithm =
"bic_fl"): BiC [BiC] run by every client, the models averaged by FedAvg, as
GLFC's paper combines every class-incremental method with FL [GLFC Sec. 5],
on the same stream and with the same exemplar memory as iCaRL + FL
(`algorithms.icarl_fl`, `algorithms.cil_replay`).

BiC's model after task t is the network followed by one bias correction
layer on the logits of that task's new classes [BiC, bias correction layer]:

    q_c = alpha_t * o_c + beta_t   for c in C_t = [t*k, (t+1)*k),   q_c = o_c otherwise

(`losses.incremental.bias_corrected_logits`). state["bias"] = {"alpha",
"beta"} (T,) keeps the pair learned at the end of every task ((1, 0) until
then; the first task has none, as BiC corrects only incremental steps); only
the latest one acts: on the old model's outputs while the next task trains,
and at evaluation. One round, for the sampled clients:

  1. the client receives the global model and the bias pairs; at a task
     transition (read from the stream) it adds the classes of its previous
     data to its exemplar memory by iCaRL herding (`bic.memory_size` per
     client, m per class);
  2. it holds out a validation split [BiC, "train/val split"]: of every old
     class in its memory the last v = floor(`bic.validation_fraction` * m)
     herding picks, and of every class of its current data the first v
     samples (so the split is class-balanced, new data in the ratio of the
     memory); a client without exemplars holds nothing out;
  3. stage 1: it trains the network (no bias layer on its own outputs) on the
     rest of its current data plus the rest of its exemplars, with

        L = lambda * L_d + (1 - lambda) * L_c,   lambda = n_old / n_seen = t / (t + 1),

     L_c the softmax cross-entropy over the seen classes, L_d the
     distillation [BiC, distillation loss] sum_{c < n_old} -pi^old_c log pi_c,
     pi = softmax(o / T) over the old classes, T = `bic.temperature` = 2, the
     old model being the global model at the end of the previous task
     followed by that task's bias layer, (alpha_{t-1}, beta_{t-1}) on C_{t-1}
     (`losses.incremental.bic_distillation_loss`);
  4. the server averages the trained models (plain mean);
  5. stage 2, at the LAST round of every task t >= 1 only: every sampled
     client with a validation split fits the current task's pair (alpha_t,
     beta_t) from (1, 0) with the new global model frozen: `bic.bias_steps`
     full-batch Adam steps at `bic.bias_lr` on the softmax cross-entropy over
     the seen classes of its validation split's logits with (alpha_t, beta_t)
     on the new classes C_t (the other logits as they are); the
     server averages the clients' pairs (equal weights, like the models) and
     stores it; with no such client the pair stays (1, 0).

Classifier (`evaluate`): argmax over the seen classes of the global model's
logits with the bias layer of the newest seen task (t = num_seen / k - 1;
identity until its pair is learned, so mid-task evaluations see the raw
network).

Federated reading and deviations:
  * The bias layer is learned once per task, after the task's last FedAvg
    round, by the clients sampled then (BiC learns it once per incremental
    step, after stage 1): the model and its correction then stay consistent
    for the next task's distillation and for the evaluation. Each client
    learns on its own held-out data only; the pairs are averaged like the
    models.
  * The validation split is BiC's (balanced, from the exemplars and the new
    data); its size per class v = floor(fraction * m) is set from the
    client's exemplar share m. The held-out images are not trained on in
    stage 1 (BiC: the same).
  * Only the newest bias layer acts (the paper's single layer; the earlier
    corrections reach the network through the distillation targets), as the
    BiC trainer of the SS-IL authors' code does.
  * Stage 2's optimiser (full-batch Adam, 100 steps, lr 0.01 by default)
    is this library's choice: the paper fixes the parameters only (that code
    runs SGD at lr / 100 over mini-batches).
  * Local SGD, lr and schedule as the trainer's `local` section; BiC's own
    optimiser settings and its data augmentation are not used.

References:
  [BiC] Y. Wu, Y. Chen, L. Wang, Y. Ye, Z. Liu, Y. Guo, Y. Fu. Large Scale
    Incremental Learning. CVPR 2019.
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022, Table 1 ("BiC + FL").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_het import losses, models
from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay, common
from fedjax_het.cil import exemplars, masking
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import batched_class_counts
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import GroupData
from fedjax_het.losses import incremental as incremental_losses


def default_config() -> ml_collections.ConfigDict:
  """`config.bic`: the memory (iCaRL + FL's), the KD temperature, the bias layer's fit."""
  return ml_collections.ConfigDict({"bic": {
      **cil_replay.replay_section(cil_replay.ICARL_MEMORY_SIZE),
      "temperature": incremental_losses.DISTILLATION_TEMPERATURE,  # BiC: 2
      "validation_fraction": 0.1,  # held-out share of every class (exemplars and new data)
      "bias_steps": 100,           # full-batch Adam steps of stage 2
      "bias_lr": 0.01,
  }})


def validate_config(config: ml_collections.ConfigDict) -> None:
  cil_replay.validate_replay_section(config, "bic")
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
  v.check(config, "bic.temperature", lambda x: number(x) and x > 0, "a number > 0")
  v.check(config, "bic.validation_fraction", lambda x: number(x) and 0 < x < 1,
          "a number in (0, 1)")
  v.check(config, "bic.bias_steps", v.int_at_least(1), "an integer >= 1")
  v.check(config, "bic.bias_lr", lambda x: number(x) and x > 0, "a number > 0")


def bic_local_loss(model: Any, *, classes_per_task: int, temperature: float
                   ) -> local.LocalLossFn:
  """BiC's stage-1 loss on one batch: lambda * L_d + (1 - lambda) * L_c (module docstring).

  aux: "class_mask" (C,) seen classes, "old_model" variables, "old_alpha" /
  "old_beta" (T,) the bias layer of the old model (`latest_layer`), "task" ()
  int32 (t: lambda = t / (t + 1), old classes [0, t*k)).
  """

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=rng, mask=mask)
    _, old_logits, _ = models.apply_model(model, aux["old_model"], images, train=False)
    old_logits = incremental_losses.bias_corrected_logits(
        old_logits, aux["old_alpha"], aux["old_beta"], classes_per_task)
    ce = losses.softmax_cross_entropy(logits=masking.mask_logits(logits, aux["class_mask"]),
                                      labels=labels, mask=mask)
    task = aux["task"]
    kd = incremental_losses.bic_distillation_loss(
        logits=logits, old_logits=jax.lax.stop_gradient(old_logits),
        num_old_classes=task * classes_per_task, temperature=temperature, mask=mask)
    lam = task.astype(jnp.float32) / (task + 1).astype(jnp.float32)
    return lam * kd + (1.0 - lam) * ce, (new_variables["batch_stats"], {"ce": ce, "kd": kd})

  return loss_fn


def latest_layer(bias: dict[str, jax.Array], task: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(alpha, beta) (T,) that apply task `task`'s pair only (identity elsewhere; -1: none)."""
  only = jnp.arange(bias["alpha"].shape[0]) == task
  return jnp.where(only, bias["alpha"], 1.0), jnp.where(only, bias["beta"], 0.0)


def validation_split(memory: exemplars.ExemplarMemory, labels: jax.Array, valid: jax.Array, *,
                     fraction: float, num_classes: int) -> tuple[jax.Array, jax.Array]:
  """Which rows a client holds out: (current data (n,) bool, memory (M,) bool).

  v = floor(fraction * m), m the memory's per-class share: of every class in
  the memory the exemplars of herding rank >= (its stored count - v), of
  every class of the current data (`labels` (n,), `valid` (n,)) its first v
  rows. Nothing without exemplars.
  """
  capacity = memory.valid.shape[-1]
  per_class = exemplars.exemplars_per_class(capacity, memory.num_seen)
  held = jnp.floor(fraction * per_class.astype(jnp.float32)).astype(jnp.int32)
  stored = jnp.sum(jax.nn.one_hot(memory.labels, num_classes, dtype=jnp.int32)
                   * memory.valid[:, None], axis=0)                     # (C,)
  count = stored[jnp.clip(memory.labels, 0, num_classes - 1)]
  memory_held = memory.valid & (memory.ranks >= count - held)
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.int32) * valid[:, None]
  position = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=-1) - 1    # index within class
  return valid & (position < held), memory_held


def compact_rows(rows: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The kept `rows` first (their order preserved), and how many."""
  order = jnp.argsort(~keep, stable=True)
  return rows[order], jnp.sum(keep).astype(jnp.int32)


def fit_bias(logits: jax.Array, labels: jax.Array, valid: jax.Array, task: jax.Array, *,
             num_tasks: int, classes_per_task: int, class_mask: jax.Array, steps: int,
             learning_rate: float) -> tuple[jax.Array, jax.Array]:
  """Stage 2 of BiC: fits (alpha_t, beta_t) of task `task` on held-out logits.

  `logits` (n, C) of the frozen model, `labels` (n,), `valid` (n,). The pair
  acts on task `task`'s k logits, the others stay as they are. Full-batch
  Adam from (1, 0) on the softmax cross-entropy over the seen classes
  (`class_mask`). Returns the fitted (alpha_t, beta_t).
  """
  logits = jax.lax.stop_gradient(logits)
  ones, zeros = jnp.ones((num_tasks,), jnp.float32), jnp.zeros((num_tasks,), jnp.float32)

  def loss(pair):
    a, b = latest_layer({"alpha": ones * pair[0], "beta": zeros + pair[1]}, task)
    q = incremental_losses.bias_corrected_logits(logits, a, b, classes_per_task)
    return losses.softmax_cross_entropy(logits=masking.mask_logits(q, class_mask),
                                        labels=labels, mask=valid)

  tx = optax.adam(learning_rate)
  start = jnp.asarray([1.0, 0.0], jnp.float32)

  def step(carry, _):
    pair, opt = carry
    updates, opt = tx.update(jax.grad(loss)(pair), opt, pair)
    return (optax.apply_updates(pair, updates), opt), None

  (pair, _), _ = jax.lax.scan(step, (start, tx.init(start)), None, length=steps)
  return pair[0], pair[1]


def make_bic_fl(settings: Any, replay: cil_replay.ReplaySettings, model: Any, mean: Any,
                std: Any, max_client_size: int, *, temperature: float = 2.0,
                validation_fraction: float = 0.1, bias_steps: int = 100,
                bias_lr: float = 0.01, eval_batch_size: int = 500) -> Algorithm:
  """BiC + FL on the task stream as an `Algorithm` (module docstring).

  State: {"server": variables, "old_model": variables (the global model at
  the end of the previous task), "bias": {"alpha", "beta"} (T,) float32,
  "clients": `cil_replay.ClientState`}. Metrics: "train/loss", "train/ce",
  "train/kd" (cohort means), "bic/exemplars" (mean stored exemplars of the
  cohort), "bic/validation" (mean held-out images of the cohort),
  "bic/transitions", "bic/alpha" / "bic/beta" (the current task's pair after
  the round), "train/server/bytes_up" / ".../bytes_down" (below), "task", "clients".

  Communication per round: the M sampled clients' models up and the global model with
  the bias layers ("bias", 2 T float32) down to each; from task 1 on the old model down
  too; at the bias correction (a task's last round, task >= 1) each client also receives
  the aggregated model and sends its fitted (alpha, beta) pair (8 bytes).
  """
  m, c, k = settings.clients_per_round, settings.num_classes, settings.classes_per_task
  num_tasks = settings.num_tasks
  n_max, mem = int(max_client_size), replay.memory_size
  _, trainer, forward, client_map = cil_replay.make_replay_training(
      settings, bic_local_loss(model, classes_per_task=k, temperature=temperature), model,
      mean, std, n_max + mem, eval_batch_size)

  def init(key, data):
    variables = models.init_variables(model, key)
    return {"server": variables, "old_model": variables,
            "bias": {"alpha": jnp.ones((num_tasks,), jnp.float32),
                     "beta": jnp.zeros((num_tasks,), jnp.float32)},
            "clients": cil_replay.init_client_state(data.client_joined.shape[1], mem)}

  def split(client, client_id, task, data):
    """One client's (train rows, train size, validation rows, validation size)."""
    rows = data.client_indices[task, client_id]
    valid = jnp.arange(n_max) < data.client_sizes[task, client_id]
    held_new, held_memory = validation_split(client.memory, data.labels[rows], valid,
                                             fraction=validation_fraction, num_classes=c)
    candidates = jnp.concatenate([rows, cil_replay.decode_pool_indices(client.memory.images)])
    train = jnp.concatenate([valid & ~held_new, client.memory.valid & ~held_memory])
    held = jnp.concatenate([held_new, held_memory])
    return (*compact_rows(candidates, train), *compact_rows(candidates, held))

  def round_fn(state, data, key, round_index):
    sample_key, train_key, task, server, old_model = cil_replay.round_start(
        state, key, round_index, settings)
    bias = state["bias"]
    clients, updated, transitions = cil_replay.update_client_memories(
        sample_key, state["clients"], data, task, settings, client_map, replay, forward, server,
        n_max=n_max)
    train_rows, train_sizes, val_rows, val_sizes = client_map(
        lambda cs, cid: split(cs, cid, task, data), (updated, clients))
    members = GroupData(images=data.images[train_rows], labels=data.labels[train_rows],
                        sizes=train_sizes, client_ids=clients, active=jnp.ones((m,), bool))
    class_mask = masking.seen_class_mask((task + 1) * k, c)
    old_alpha, old_beta = latest_layer(bias, task - 1)
    aux = {"class_mask": jnp.broadcast_to(class_mask, (m, c)),
           "old_model": aggregation.broadcast(old_model, m),
           "old_alpha": jnp.broadcast_to(old_alpha, (m, num_tasks)),
           "old_beta": jnp.broadcast_to(old_beta, (m, num_tasks)),
           "task": jnp.broadcast_to(task, (m,)).astype(jnp.int32)}
    new_server, local_metrics = cil_replay.train_and_average(
        trainer, server, aux, members, clients, train_key, settings, round_index)

    def correct_bias(bias):
      def one(rows, size):
        _, logits = forward(new_server, data.images[rows])
        valid = jnp.arange(rows.shape[0]) < size
        return fit_bias(logits, data.labels[rows], valid, task, num_tasks=num_tasks,
                        classes_per_task=k, class_mask=class_mask, steps=bias_steps,
                        learning_rate=bias_lr)

      alphas, betas = client_map(one, (val_rows, val_sizes))
      weights = (val_sizes > 0).astype(jnp.float32)
      total = jnp.sum(weights)
      mean_of = lambda x, fallback: jnp.where(  # noqa: E731
          total > 0, jnp.sum(weights * x) / jnp.maximum(total, 1.0), fallback)
      return {"alpha": bias["alpha"].at[task].set(mean_of(alphas, 1.0)),
              "beta": bias["beta"].at[task].set(mean_of(betas, 0.0))}

    last_round = (round_index + 1) % settings.rounds_per_task == 0
    new_bias = jax.lax.cond(last_round & (task > 0), correct_bias, lambda b: b, bias)
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        "train/ce": jnp.mean(local_metrics["ce"]),
        "train/kd": jnp.mean(local_metrics["kd"]),
        **cil_replay.replay_metrics("bic", updated, transitions),
        "bic/validation": jnp.mean(val_sizes.astype(jnp.float32)),
        "bic/alpha": new_bias["alpha"][task], "bic/beta": new_bias["beta"][task],
        "task": task, "clients": clients}
    corrected = (last_round & (task > 0)).astype(jnp.float32)
    model_size = common.tree_bytes(server)
    metrics.update(common.stream_bytes(
        m * (model_size + 8 * corrected),
        m * (model_size * (1.0 + (task > 0) + corrected) + common.tree_bytes(bias))))
    return ({"server": new_server, "old_model": old_model, "bias": new_bias,
             "clients": cohort.scatter(state["clients"], clients, updated)}, metrics)

  def evaluate(state, test):
    images, labels, num_seen = test
    preprocess = normalizer(mean, std)
    class_mask = masking.seen_class_mask(num_seen, c)
    alpha, beta = latest_layer(state["bias"], jnp.asarray(num_seen) // k - 1)

    def scores(x):
      _, logits, _ = models.apply_model(model, state["server"], preprocess(x), train=False)
      return incremental_losses.bias_corrected_logits(logits, alpha, beta, k), class_mask

    return batched_class_counts(scores, c, images, labels, eval_batch_size)

  return Algorithm(name="bic_fl", init=init, round=round_fn, evaluate=evaluate)


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """BiC + FL from a class-incremental config (`make_bic_fl`)."""
  b = config.bic
  return make_bic_fl(setup.settings,
                     cil_replay.ReplaySettings.from_section(b, setup.client_classes),
                     setup.model, setup.mean, setup.std, setup.max_client_size,
                     temperature=float(b.temperature),
                     validation_fraction=float(b.validation_fraction),
                     bias_steps=int(b.bias_steps), bias_lr=float(b.bias_lr),
                     eval_batch_size=setup.eval_batch_size)

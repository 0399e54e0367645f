"""RHFL (Fang & Ye, CVPR 2022): public-data KL alignment with client confidence re-weighting.

RHFL has three parts; this module implements them as the RHFL paper describes and its
authors' released code (FangXiuwen/Robust_FL, `RHFL/HHF/HHF.py`) computes them:

  * Heterogeneous collaborative learning on unlabeled public data: with
    p_i = softmax(f(theta_i; x)) the output distribution of participant i on a
    public batch, participant k descends
        L_col,k = sum_{i != k} W_i KL(p_i || p_k)                                (1)
    (KL averaged over the batch; the p_i of the others are constants), W_i the
    confidence weight of participant i.
  * Local learning with the symmetric cross-entropy (SCE) on private data:
        L_SCE = alpha CE + beta RCE                                              (2)
    alpha = `rhfl.sce_alpha` (0.1), beta = `rhfl.sce_beta` (1.0), the FCCL+
    Table VII values (`losses.symmetric_cross_entropy`, the RCE clips of the code).
  * Client confidence re-weighting (CCR): a participant whose SCE loss on its own
    private data falls faster (relative to its current value) learns from cleaner
    labels and gets a larger weight as a teacher of the others. At the start of
    round e >= 1, with L_i^e participant i's mean SCE over its private rows
    (its current model):
        F_i = (L_i^{e-1} - L_i^e) / L_i^e                                        (3)
        A_i = 1 / (K - 1) + eta F_i / sum_j F_j                                  (4)
        W_i = exp(A_i) / sum_j exp(A_j)                                          (5)
    eta = `rhfl.confidence_eta` (0.5, the code's CCR `beta`). Round 0 has no
    previous loss: W_i = 1 / (K - 1) for every i (the code's initial value).

The numbers (1)-(5) are this docstring's; they follow the order in which the
paper's method section presents the alignment, SCE and CCR.

Round e (`round` below):
  1. CCR (`rhfl.confidence_reweighting=True`): measure L_i^e of every
     participant, compute W from (L^{e-1}, L^e) (uniform 1/(K-1) in round 0) and
     keep L^e in the state for round e+1.
  2. Collaborative updating on every augmented public batch
     (`engine.public.public_phase`, `config.collaborative`): every participant
     takes one optimiser step on (1) against the detached outputs of the others
     on the same batch (all participants update simultaneously from the outputs
     before the step, as the code computes every target before any update).
  3. Local updating: `local.epochs` epochs of (2) on private data
     (`config.local`).

State: state["groups"][group] = {"variables": per-slot model,
"confidence_loss": (slots,) L^{e-1}, the SCE measured at the start of the previous
round}; it starts at 0 and is unused in round 0 (uniform weights), so round 1's
weights come from the losses measured at the starts of rounds 0 and 1.
Metrics: "confidence" {group: {"weight": W_i, "private_sce": L_i^e}},
"collaborative" {group: {"kl": L_col,k}}, "local" {group: {"loss": SCE, "ce": CE}}.

Defaults follow the FCCL+ benchmark settings shared by every method (the same
`collaborative` and `local` sections as FCCL+: Adam 1e-3 re-created for every
public batch, public batch 512, weak augmentation; local Adam 1e-3 + L2 1e-5,
20 epochs of 256; both rates decayed linearly over the run).

Interpretations and deviations (each a config field where it is a choice):
  * Scale of the weights (faithful to the code): round 0 uses 1/(K-1) per peer, so
    the peer weights of participant k sum to 1; from round 1 on W is a softmax over
    all K participants, so k's peer weights sum to 1 - W_k (about (K-1)/K).
  * `rhfl.confidence_reweighting=False` (plain heterogeneous collaborative
    learning) uses W_i = 1/(K-1) in every round and skips the measurement. The
    code's CCR-off path (its beta = 0) is `confidence_eta=0`: 1/(K-1) in round 0,
    then softmax of equal values = 1/K.
  * sum_j F_j in (4) is the code's plain sum (not of magnitudes). When the
    qualities cancel (|sum_j F_j| <= 1e-6 sum_j |F_j|, e.g. no loss changed)
    the normalised quality is taken as 0 (weights 1/K) instead of dividing by
    ~0; L^e is floored at 1e-12 in (3).
  * L_i^e is the mean SCE over the participant's private rows (the code: the
    mean of its per-batch means), in `local.batch_size`-row batches in data
    order. `rhfl.confidence_train_mode=True` (default) runs the model in train
    mode as the code does (BatchNorm batch statistics over each batch, dropout
    on); the BatchNorm running statistics are NOT updated by this measurement
    (torch's train-mode forward updates them as a side effect).
  * The RHFL code trains max(|public| / |private|, 1) local epochs with Adam 1e-3
    (no weight decay, constant rate) and public batches of 256; the FCCL+
    benchmark settings above replace these.
  * Only the code's per-batch optimiser reset is supported
    (`collaborative.optimizer_reset="batch"`).

Reference: X. Fang, M. Ye. Robust Federated Learning With Noisy and Heterogeneous
Clients. CVPR 2022, pp. 10072-10081.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import batching, local, public
from fedjax_het.engine.api import Algorithm, Setup, Stage
from fedjax_het.engine.clients import (ClientGroup, client_keys, init_group_variables,
                                       slot_active, slot_ids, where_active)
from fedjax_het.engine.optim import apply_updates, make_optimizer, round_decay_schedule

#: Relative size below which sum_j F_j counts as 0 in Eq. (4) (the qualities cancel).
QUALITY_SUM_TOLERANCE = 1e-6
#: Floor of the current loss L^e in Eq. (3).
LOSS_FLOOR = 1e-12
OPTIMIZER_RESETS = ("batch",)


def uniform_weights(num_participants: int) -> jax.Array:
  """Round 0's confidence weights: 1 / (K - 1) for every participant (K = 1: 1)."""
  return jnp.full((num_participants,), 1.0 / max(num_participants - 1, 1), jnp.float32)


def confidence_weights(previous_loss: jax.Array, current_loss: jax.Array, *,
                       eta: float) -> tuple[jax.Array, jax.Array]:
  """CCR weights, Eq. (3)-(5) of the module docstring.

  Args:
    previous_loss: (K,) L^{e-1}, each participant's private SCE one round ago.
    current_loss: (K,) L^e, the same now.
    eta: weight of the normalised quality (`rhfl.confidence_eta`).

  Returns:
    (weights W (K,), summing to 1; qualities F (K,)).
  """
  num = previous_loss.shape[0]
  quality = (previous_loss - current_loss) / jnp.maximum(current_loss, LOSS_FLOOR)
  total = jnp.sum(quality)
  usable = jnp.abs(total) > QUALITY_SUM_TOLERANCE * jnp.sum(jnp.abs(quality))
  share = jnp.where(usable, quality / jnp.where(usable, total, 1.0), 0.0)
  amount = 1.0 / max(num - 1, 1) + eta * share
  return jax.nn.softmax(amount), quality


def sce_loss_for(alpha: float, beta: float) -> Callable[[ClientGroup], local.LocalLossFn]:
  """Per-batch local objective of a group's model: SCE (Eq. 2), CE logged beside it."""
  def loss_for(group):
    forward = common.forward_fn(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      del aux
      _, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      sce = losses.symmetric_cross_entropy(logits=logits, labels=labels, alpha=alpha, beta=beta,
                                           mask=mask)
      ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
      return sce, (new_stats, {"ce": ce})

    return loss_fn

  return loss_for


def make_private_loss(group: ClientGroup, *, alpha: float, beta: float, train_mode: bool,
                      max_size: int, batch_size: int,
                      preprocess: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
  """Builds `private_loss(variables, images, labels, size, key) -> ()`, L_i of Eq. (3).

  The mean SCE over one participant's `size` valid private rows, in static
  batches of `batch_size` rows in data order (padding rows masked); nothing is
  updated (BatchNorm statistics of a train-mode forward are discarded).
  """
  batch_size = min(batch_size, max_size)
  steps = batching.steps_per_epoch(max_size, batch_size)
  forward = common.forward_fn(group, train=train_mode)

  def private_loss(variables, images, labels, size, key):
    def accumulate(total, step):
      index = step * batch_size + jnp.arange(batch_size)
      rows = jnp.minimum(index, max_size - 1)
      mask = index < size
      _, logits, _ = forward(variables["params"], variables["batch_stats"],
                             preprocess(images[rows]), jax.random.fold_in(key, step), mask)
      sce = losses.symmetric_cross_entropy(logits=logits, labels=labels[rows], alpha=alpha,
                                           beta=beta, mask=mask)
      count = jnp.sum(mask.astype(jnp.float32))
      # A batch past the data may hold NaN (train-mode BatchNorm over no rows): select.
      return total + jnp.where(count > 0, sce * count, 0.0), None

    total, _ = jax.lax.scan(accumulate, jnp.zeros((), jnp.float32), jnp.arange(steps))
    return total / jnp.maximum(size, 1).astype(jnp.float32)

  return private_loss


class Phases(NamedTuple):
  """RHFL's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state.
  confidence: (state, {group: GroupData}, key, round) -> (state, weights (K,), metrics):
    CCR, Eq. (3)-(5) (uniform weights when CCR is off or in round 0).
  collaborative_step: (state, public images, key, round, weights (K,)) -> (state, metrics):
    one step of Eq. (1) for every participant on one public batch.
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics): SCE, Eq. (2).
  """
  init: Any
  confidence: Any
  collaborative_step: Any
  local_update: Any


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """RHFL's phases from `config.rhfl`, `config.collaborative` and `config.local`."""
  cfg, col, loc = config.rhfl, config.collaborative, config.local
  alpha, beta = float(cfg.sce_alpha), float(cfg.sce_beta)
  eta = float(cfg.confidence_eta)
  reweight = bool(cfg.confidence_reweighting)
  common.check_choice("collaborative.optimizer_reset", col.optimizer_reset, OPTIMIZER_RESETS)
  col_tx = make_optimizer(col.optimizer)
  col_lr = round_decay_schedule(float(col.lr), setup.num_rounds, float(col.lr_decay))
  loc_lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))
  num = setup.num_participants
  ids = {g.name: jnp.asarray(slot_ids(g, num)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  preprocess = normalizer(setup.private_mean, setup.private_std)
  private_loss = {g.name: make_private_loss(
      g, alpha=alpha, beta=beta, train_mode=bool(cfg.confidence_train_mode),
      max_size=setup.max_sizes[g.name], batch_size=int(loc.batch_size), preprocess=preprocess)
                  for g in setup.groups}
  trainers = local.make_group_trainers(
      setup, sce_loss_for(alpha, beta), optimizer=loc.optimizer,
      weight_decay=float(loc.weight_decay), epochs=int(loc.epochs),
      batch_size=int(loc.batch_size))

  def init(key, data):
    del data
    return {"groups": {
        g.name: {"variables": init_group_variables(g, key, shared=False, num_participants=num),
                 "confidence_loss": jnp.zeros((g.num_slots,), jnp.float32)}
        for g in setup.groups}}

  def confidence(state, data, key, round_index):
    if not reweight:
      weights = uniform_weights(num)
      return state, weights, {g.name: {"weight": common.to_slots(weights, g)} for g in setup.groups}
    current = {}
    for group in setup.groups:
      d, variables = data[group.name], state["groups"][group.name]["variables"]
      current[group.name] = jax.vmap(private_loss[group.name])(
          variables, d.images, d.labels, d.sizes, client_keys(key, ids[group.name]))
    previous = {name: g["confidence_loss"] for name, g in state["groups"].items()}
    weights, _ = confidence_weights(common.to_participants(previous, setup),
                                    common.to_participants(current, setup), eta=eta)
    weights = jnp.where(round_index > 0, weights, uniform_weights(num))
    groups = {name: {**g, "confidence_loss": current[name]}
              for name, g in state["groups"].items()}
    metrics = {g.name: {"weight": common.to_slots(weights, g), "private_sce": current[g.name]}
               for g in setup.groups}
    return {**state, "groups": groups}, weights, metrics

  def collaborative_step(state, images, key, round_index, weights):
    lr = col_lr(round_index)
    params = {name: g["variables"]["params"] for name, g in state["groups"].items()}

    def total_loss(params):
      _, logits, stats = common.public_forward(setup, state, params, images, key, ids)
      peers = jax.lax.stop_gradient(common.to_participants(logits, setup))  # (K, B, C): every p_i
      total, metrics = 0.0, {}
      for group in setup.groups:
        # KL(p_i || p_k) of every slot k against every participant i: (slots, K).
        kl = jax.vmap(lambda z: jax.vmap(lambda t: losses.knowledge_distillation_loss(
            student_logits=z, teacher_logits=t))(peers))(logits[group.name])
        others = 1.0 - jax.nn.one_hot(ids[group.name], num)  # no term i = k (padding: none)
        col_loss = jnp.sum(others * weights[None, :] * kl, axis=-1)
        total = total + jnp.sum(jnp.where(active[group.name], col_loss, 0.0))
        metrics[group.name] = {"kl": col_loss}
      return total, (metrics, stats)

    grads, (metrics, stats) = jax.grad(total_loss, has_aux=True)(params)
    groups = {}
    for group in setup.groups:
      g = state["groups"][group.name]
      fresh = jax.vmap(col_tx.init)(params[group.name])  # the code's new Adam per batch
      new_params, _ = jax.vmap(lambda p, gr, o: apply_updates(col_tx, p, gr, o, lr))(
          params[group.name], grads[group.name], fresh)
      new_vars = where_active(active[group.name],
                              {"params": new_params, "batch_stats": stats[group.name]},
                              g["variables"])
      groups[group.name] = {**g, "variables": new_vars}
    return {**state, "groups": groups}, metrics

  local_update = private_training.make_private_update(setup, trainers, int(loc.epochs), loc_lr)

  return Phases(init=init, confidence=confidence, collaborative_step=collaborative_step,
                local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one RHFL round over all K participants, from the shapes.

  On each public batch (`common.public_batches`) every participant sends its logits (B, C)
  and receives the other K - 1 participants' (Eq. 1 weights each one separately): up
  K x batches x B x C x 4 bytes, down K - 1 times that. With CCR
  (`rhfl.confidence_reweighting`) every participant also sends its private loss L_i^e (one
  float32) and receives the K weights W once a round: + K x 4 up, + K x K x 4 down.
  """
  num = setup.num_participants
  batch, batches = common.public_batches(int(config.collaborative.batch_size),
                                         int(config.collaborative.epochs), num_public)
  logits = num * batches * batch * setup.num_classes * 4
  up, down = logits, (num - 1) * logits
  if bool(config.rhfl.confidence_reweighting):
    up, down = up + num * 4, down + num * num * 4
  return up, down


def make_rhfl(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """RHFL as an `Algorithm`: CCR weights, public KL alignment, then local SCE.

  The round is given as two stages, the CCR weights with the public alignment,
  then the local SCE (`Algorithm.stages`), so the trainer can compile each as
  its own program (`config.round_programs`). The public stage's metrics hold the round's
  ["server"]["bytes_up" | "bytes_down"] (`communication_bytes`).
  """
  phases = make_phases(config, setup)
  spec = public.make_spec(config.collaborative, setup.public_mean, setup.public_std)

  # Every stage splits the round's key as one round running both phases would.
  def public_stage(state, data, key, round_index):
    order_key, augment_key, collab_key, _, confidence_key = jax.random.split(key, 5)
    metrics = {}
    state, weights, metrics["confidence"] = phases.confidence(state, data.groups, confidence_key,
                                                              round_index)
    step = lambda s, images, k: phases.collaborative_step(s, images, k, round_index, weights)
    state = common.run_public_phase(step, state, data.public, spec, metrics,
                                    order_key=order_key, augment_key=augment_key,
                                    step_key=collab_key)
    return state, metrics

  return common.public_data_algorithm(
      "rhfl", config, setup, phases.init,
      stages=(common.with_server_bytes(
                  Stage("public", public_stage),
                  lambda num_public: communication_bytes(config, setup, num_public)),
              common.local_stage(phases.local_update, key_splits=5, key_index=3)))


def default_config() -> ml_collections.ConfigDict:
  """The config sections RHFL reads: the benchmark's `collaborative` / `local`, and `rhfl`."""
  return ml_collections.ConfigDict({
      "collaborative": public.default_config(),
      "local": local.default_config(),
      "rhfl": {
          "sce_alpha": 0.1,                  # alpha of Eq. (2) (FCCL+ Table VII)
          "sce_beta": 1.0,                   # beta of Eq. (2) (FCCL+ Table VII)
          "confidence_reweighting": True,    # CCR on; False: W_i = 1 / (K - 1) every round
          "confidence_eta": 0.5,             # eta of Eq. (4) (the code's CCR beta)
          "confidence_train_mode": True,     # measure L_i in train mode, as the code
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.rhfl`, `config.collaborative` and `config.local`."""
  public.validate_config(config)
  local.validate_config(config)
  validation.require_section(config, "rhfl")
  v = validation
  v.check(config, "collaborative.optimizer_reset", v.choice(OPTIMIZER_RESETS),
          f"one of {OPTIMIZER_RESETS} for rhfl (the RHFL code's fresh optimiser per public "
          f"batch)")
  v.check(config, "rhfl.sce_alpha", lambda x: x >= 0, "a number >= 0")
  v.check(config, "rhfl.sce_beta", lambda x: x >= 0, "a number >= 0")
  if not config.rhfl.sce_alpha and not config.rhfl.sce_beta:
    v.fail("rhfl.sce_beta", "a number > 0 when rhfl.sce_alpha is 0 (the SCE loss would be 0)",
           config.rhfl.sce_beta)
  v.check(config, "rhfl.confidence_eta", lambda x: x >= 0, "a number >= 0")
  for flag in ("confidence_reweighting", "confidence_train_mode"):
    v.check(config, f"rhfl.{flag}", v.is_bool, "True or False")

"""FCCL (FCCL Algorithm 1): cross-correlation learning + dual-domain distillation.

Before the first round every participant is pretrained on its private data
alone (SOLO, `fccl.pretrain_epochs`, Adam with cosine-annealed lr as in the
code); the pretrained model theta_i^* is kept as the intra-domain teacher and
also starts training. Every round t:
  1. Collaborative updating on each public batch: participant i minimises
     L_Col = sum_u (1 - M_uu)^2 + lambda sum_{u!=v} (1 + M_uv)^2 (Eq. 1-2)
     against the mean logits, where i's own slot in the mean holds the logits
     of its previous-round model theta_i^{t-1} (eval mode), the other slots the
     others' current logits (the authors' FCCL code; `fccl.own_slot="current"`
     uses every current model, like FCCL+).
  2. Local updating: L_Loc = CE + lambda_Loc (KL(theta^{t-1}) + KL(theta^*))
     (Eq. 3-7), tau = 1, both teachers in eval mode.
  3. theta_i^{t-1} <- the new end-of-local model.
Homogeneous variant (`fccl.average_parameters=True`, one architecture): the
participants' models (parameters and BatchNorm statistics, uniform weights)
are averaged once a round, where `fccl.average_placement` says:
  * "after_local" (default): after step 2; every participant enters the next
    round with the average, while theta_i^{t-1} (the inter-domain teacher and
    the own-slot model) is its own end-of-local model, not the average. This
    is the FCCL+ benchmark code (`fccl+/models/fccl.py`, `loc_update`:
    `copy_nets2_prevnets()` then `aggregate_nets(None)`), which produced the
    FCCL row of FCCL+ Table XV.
  * "between_phases": after step 1, before step 2 (FCCL Sec. 4.1, "Model
    Homogeneity Analysis", Table 3: "add the averaging parameters operation
    between collaborative updating and local updating"); every participant's
    local phase starts from the average of the post-collaborative models, and
    its end-of-local model is kept unaveraged (it is theta_i^{t-1} and the
    model evaluated and carried into the next round's collaborative phase).
  Interpretations: the conference code (`fccl/Idea/Ours/FCCL.py`) has no
  homogeneous variant, so "between_phases" follows the paper's sentence; the
  average is taken over the models as they leave the last public batch. Both
  placements start every participant from participant 0's pretrained model
  (the FCCL+ code's `ini` for `structure == 'homogeneity'`; the CVPR paper does
  not say how the homogeneous run starts), and each keeps its own pretrained
  model as the intra-domain teacher.
Learning rates and optimisers as FCCL+ (`fcclplus.py`): Adam 1e-3 re-created
per public batch, Adam 1e-3 + L2 1e-5 re-created per round, linear decay.
`local.epochs` is one number or one per participant (the CVPR code's Digits
epochs (40, 35, 3, 4); the members of an architecture group share a value);
the pretraining batch is `fccl.pretrain_batch_size` (0: `local.batch_size`).
The conference protocol (the CVPR code: batch 512 in both phases, constant
Adam 1e-3 without weight decay, 40 constant-rate pretraining epochs in batches
of 256) is the `_cvpr` variant of `fedjax_het/configs/digits.py` / `office.py`.
`fccl.fccm_eps` is the epsilon on FCCM's column variances (default 1e-6, the
library's guard against a constant column; the authors' code has none: 0).
`fccl.init_keys` says which keys draw the initial weights and the SOLO
pretraining's batches from the run's key: "split" (default) the two halves of
`jax.random.split(key)`; "run" the key itself and `fold_in(key, 1)`, as
`fcclplus.py` does (its dual-distillation variant pretrains the same way), so
that a seed's FCCL starts from the same weights as its BASE and FCCL+ (a
paired comparison with common random numbers; neither is the authors' code,
which seeds PyTorch's global generator).

Reference: W. Huang, M. Ye, B. Du. Learn from Others and Be Yourself in
Heterogeneous Federated Learning. CVPR 2022.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.engine import aggregation, local, public
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import (client_keys, init_group_variables, slot_active, slot_ids,
                                       where_active)
from fedjax_het.engine.optim import apply_updates, make_optimizer, round_decay_schedule
from fedjax_het.errors import ConfigError

OWN_SLOTS = ("previous", "current")
#: Which keys draw the initial weights and the pretraining batches (`fccl.init_keys`).
INIT_KEYS = ("split", "run")
#: Where the homogeneous variant averages the models (`fccl.average_placement`).
AVERAGE_PLACEMENTS = ("after_local", "between_phases")


class Phases(NamedTuple):
  """FCCL's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state (includes the SOLO pretraining).
  collaborative_step: (state, public images, key, round) -> (state, metrics).
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
  """
  init: Any
  collaborative_step: Any
  local_update: Any


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """FCCL's phases from `config.fccl`, `config.collaborative`, `config.local`."""
  cfg, col, loc = config.fccl, config.collaborative, config.local
  lam = float(cfg.off_diagonal_weight)
  fccm_eps = float(cfg.fccm_eps)
  own_slot = common.check_choice("fccl.own_slot", cfg.own_slot, OWN_SLOTS)
  init_keys = common.check_choice("fccl.init_keys", cfg.init_keys, INIT_KEYS)
  tau = float(cfg.distill_temperature)
  weight = float(cfg.local_distill_weight)
  teacher_train_mode = bool(cfg.teacher_train_mode)
  average = common.check_parameter_averaging("fccl.average_parameters",
                                              cfg.average_parameters, setup)
  placement = common.check_choice("fccl.average_placement", cfg.average_placement,
                                  AVERAGE_PLACEMENTS)
  average_after_local = average and placement == "after_local"
  average_before_local = average and placement == "between_phases"
  if col.optimizer_reset != "batch":
    raise ConfigError("config.collaborative.optimizer_reset must be 'batch' for fccl (the "
                      f"code's fresh Adam per public batch), got {col.optimizer_reset!r}.")
  col_tx = make_optimizer(col.optimizer)
  col_lr = round_decay_schedule(float(col.lr), setup.num_rounds, float(col.lr_decay))
  loc_lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))
  epochs = local.group_epochs("local.epochs", loc.epochs, setup)
  pretrain_batch_size = int(cfg.pretrain_batch_size) or int(loc.batch_size)
  ids = {g.name: jnp.asarray(slot_ids(g, setup.num_participants)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}

  def init(key, data):
    if init_keys == "split":
      init_key, pretrain_key = jax.random.split(key)
    else:  # fcclplus.py's: the weights of BASE and FCCL+, FCCL+'s pretraining batches
      init_key, pretrain_key = key, jax.random.fold_in(key, 1)
    variables = {g.name: init_group_variables(g, init_key, shared=False,
                                              num_participants=setup.num_participants)
                 for g in setup.groups}
    pretrained = private_training.pretrain_variables(
        setup, variables, data.groups, pretrain_key, epochs=int(cfg.pretrain_epochs),
        batch_size=pretrain_batch_size, lr=float(cfg.pretrain_lr),
        min_lr=float(cfg.pretrain_min_lr))
    groups = {}
    for group in setup.groups:
      start = pretrained[group.name]
      if average:  # the code starts every homogeneous participant from participant 0's model
        start = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v[:1], v.shape), start)
      groups[group.name] = {"variables": start, "previous": pretrained[group.name],
                            "pretrained": pretrained[group.name]}
    return {"groups": groups}

  def collaborative_step(state, images, key, round_index):
    lr = col_lr(round_index)
    params = {name: g["variables"]["params"] for name, g in state["groups"].items()}
    previous_logits = {}
    if own_slot == "previous":
      for group in setup.groups:
        prev = state["groups"][group.name]["previous"]
        forward = common.forward_fn(group, train=False, on_public=True)
        _, z, _ = jax.vmap(forward, in_axes=(0, 0, None))(prev["params"], prev["batch_stats"],
                                                          images)
        previous_logits[group.name] = jax.lax.stop_gradient(z)

    def total_loss(params):
      _, logits, stats = common.public_forward(setup, state, params, images, key, ids)
      mean_current = common.mean_over_participants(logits, setup)
      total, metrics = 0.0, {}
      for group in setup.groups:
        z = logits[group.name]
        if own_slot == "previous":
          # Replace the participant's own (current) term of the mean by its previous model's.
          targets = mean_current[None] + (previous_logits[group.name]
                                          - jax.lax.stop_gradient(z)) / setup.num_participants
        else:
          targets = jnp.broadcast_to(mean_current[None], z.shape)
        col_loss = jax.vmap(lambda zi, ti: losses.cross_correlation_loss(
            logits=zi, target_logits=ti, off_diagonal_weight=lam, eps=fccm_eps))(z, targets)
        total = total + jnp.sum(jnp.where(active[group.name], col_loss, 0.0))
        metrics[group.name] = {"col": col_loss}
      return total, (metrics, stats)

    grads, (metrics, stats) = jax.grad(total_loss, has_aux=True)(params)
    groups = {}
    for group in setup.groups:
      g = state["groups"][group.name]
      fresh = jax.vmap(col_tx.init)(params[group.name])
      new_params, _ = jax.vmap(lambda p, gr, o: apply_updates(col_tx, p, gr, o, lr))(
          params[group.name], grads[group.name], fresh)
      new_vars = where_active(active[group.name],
                              {"params": new_params, "batch_stats": stats[group.name]},
                              g["variables"])
      groups[group.name] = {**g, "variables": new_vars}
    return {**state, "groups": groups}, metrics

  def local_loss_for(group):
    forward = common.forward_fn(group, train=True)
    teacher_forward = common.forward_fn(group, train=teacher_train_mode)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      r_student, r_prev, r_pre = jax.random.split(rng, 3)
      _, z, new_stats = forward(params, batch_stats, images, r_student, mask)
      _, z_prev, _ = teacher_forward(aux["previous"]["params"], aux["previous"]["batch_stats"],
                                     images, r_prev, mask)
      _, z_pre, _ = teacher_forward(aux["pretrained"]["params"],
                                    aux["pretrained"]["batch_stats"], images, r_pre, mask)
      ce = losses.softmax_cross_entropy(logits=z, labels=labels, mask=mask)
      dual = losses.dual_domain_distillation_loss(
          logits=z, previous_logits=z_prev, pretrained_logits=z_pre, temperature=tau, mask=mask)
      return ce + weight * dual, (new_stats, {"ce": ce, "dual": dual})

    return loss_fn

  trainers = local.make_group_trainers(
      setup, local_loss_for, optimizer=loc.optimizer, weight_decay=float(loc.weight_decay),
      epochs=epochs, batch_size=int(loc.batch_size))

  def local_update(state, data, key, round_index):
    groups, metrics = {}, {}
    for group in setup.groups:
      rates = jnp.full((epochs[group.name],), loc_lr(round_index))
      g = state["groups"][group.name]
      aux = {"previous": g["previous"], "pretrained": g["pretrained"]}
      start = g["variables"]
      if average_before_local:  # FCCL Sec. 4.1: average the post-collaborative models
        start = where_active(active[group.name],
                             aggregation.average_over_active(start, active[group.name]), start)
      new_vars, m = local.train_clients(trainers[group.name], start, aux,
                                        data[group.name], client_keys(key, ids[group.name]),
                                        rates)
      new_vars = where_active(active[group.name], new_vars, g["variables"])
      current = (aggregation.average_over_active(new_vars, active[group.name])
                 if average_after_local else new_vars)
      groups[group.name] = {**g, "variables": current, "previous": new_vars}
      metrics[group.name] = m
    return {**state, "groups": groups}, metrics

  return Phases(init=init, collaborative_step=collaborative_step, local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one FCCL round over all K participants, from the shapes.

  FCCL+ Table II, FCCL row (|B0| x C): on each public batch (`common.public_batches`) every
  participant sends its logits Z_i (B, C) and receives the mean logits (B, C), from which it
  forms its cross-correlation target (its own slot swapped for its previous model's logits,
  computed locally): K x batches x B x C x 4 bytes each way. The homogeneous variant
  (`fccl.average_parameters`) also sends every model up and the average down once a round.
  """
  batch, batches = common.public_batches(int(config.collaborative.batch_size),
                                         int(config.collaborative.epochs), num_public)
  total = setup.num_participants * batches * batch * setup.num_classes * 4
  if bool(config.fccl.average_parameters):
    total += sum(g.num_clients * common.model_bytes(g.model) for g in setup.groups)
  return total, total


def make_fccl(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FCCL as an `Algorithm`: public phase (cross-correlation), then local CE + dual KD,
  given as these two stages (`Algorithm.stages`; `config.round_programs`); the public
  stage's metrics hold the round's ["server"]["bytes_up" | "bytes_down"]
  (`communication_bytes`)."""
  phases = make_phases(config, setup)
  spec = public.make_spec(config.collaborative, setup.public_mean, setup.public_std)
  public_stage, local_stage = common.public_and_local_stages(spec, phases.collaborative_step,
                                                             phases.local_update)
  public_stage = common.with_server_bytes(
      public_stage, lambda num_public: communication_bytes(config, setup, num_public))

  return common.public_data_algorithm("fccl", config, setup, phases.init,
                                      stages=(public_stage, local_stage))


def default_config() -> ml_collections.ConfigDict:
  """The config sections FCCL reads, with the paper/code defaults."""
  return ml_collections.ConfigDict({
      "collaborative": public.default_config(),
      "local": local.default_config(),
      "fccl": {
          "off_diagonal_weight": losses.FCCM_OFF_DIAGONAL_WEIGHT,  # lambda_Col, Eq. 2
          "fccm_eps": losses.FCCM_EPS,   # on FCCM's column variances; the code's: 0
          "own_slot": "previous",
          "init_keys": "split",
          "distill_temperature": 1.0,                              # tau, Eq. 4-5
          "local_distill_weight": 1.0,                             # lambda_Loc, Eq. 7
          "teacher_train_mode": False,
          "pretrain_epochs": 50,
          "pretrain_lr": 1e-3,
          "pretrain_min_lr": 1e-6,
          "pretrain_batch_size": 0,     # 0: local.batch_size
          "average_parameters": False,
          "average_placement": "after_local",  # read only when average_parameters is True
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fccl`, `config.collaborative` and `config.local`."""
  public.validate_config(config)
  local.validate_config(config, per_participant_epochs=True)
  validation.require_section(config, "fccl")
  v = validation
  v.check(config, "fccl.off_diagonal_weight", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fccl.fccm_eps", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fccl.own_slot", v.choice(OWN_SLOTS), f"one of {OWN_SLOTS}")
  v.check(config, "fccl.init_keys", v.choice(INIT_KEYS), f"one of {INIT_KEYS}")
  v.check(config, "fccl.distill_temperature", v.positive, "a number > 0")
  v.check(config, "fccl.local_distill_weight", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fccl.pretrain_epochs", v.int_at_least(0), "an integer >= 0")
  v.check(config, "fccl.pretrain_lr", v.positive, "a number > 0")
  v.check(config, "fccl.pretrain_batch_size", v.int_at_least(0),
          "an integer >= 0 (0: local.batch_size)")
  v.check(config, "fccl.pretrain_min_lr", lambda x: 0 <= x <= config.fccl.pretrain_lr,
          "a number in [0, fccl.pretrain_lr]")
  for flag in ("teacher_train_mode", "average_parameters"):
    v.check(config, f"fccl.{flag}", v.is_bool, "True or False")
  v.check(config, "fccl.average_placement", v.choice(AVERAGE_PLACEMENTS),
          f"one of {AVERAGE_PLACEMENTS}")
  v.check(config, "collaborative.optimizer_reset", v.choice(("batch",)),
          "'batch' for fccl (the code's fresh Adam per public batch)")
  if config.fccl.average_parameters and len(set(config.models.architectures)) > 1:
    v.fail("fccl.average_parameters",
           "False unless every participant uses the same architecture", True)

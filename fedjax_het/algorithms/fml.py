"""FML (Federated Mutual Learning): private models + a shared "meme" model, mutual learning.

Every participant k keeps its own private model (its heterogeneous backbone,
never communicated) and a local copy of one homogeneous meme model. Every
round t:
  1. The server sends the global meme model to every participant.
  2. Local updating, deep mutual learning (FML Sec. 3, Eq. 1-2) on each private
     batch, both models trained at the same step from the same batch:
        L_local = alpha CE(p_local, y) + (1 - alpha) KL(p_meme || p_local)
        L_meme  = beta  CE(p_meme, y)  + (1 - beta)  KL(p_local || p_meme)
     with p = softmax(logits) (temperature 1) and the KL target detached, so
     each model descends its own loss (`mutual_learning_loss`). `local.epochs`
     epochs of `config.local` (Adam 1e-3, L2 1e-5, linear decay; one optimiser
     over both models, which for Adam equals one optimiser per model).
  3. The server averages the participants' meme models (FedAvg, FML Algorithm
     1), parameters and BatchNorm statistics: `fml.weighting="uniform"` (the
     benchmark's `aggregate_nets` with equal weights) or "size" (n_k / n).
The private models are what `evaluate` reports (the FCCL tables report every
participant's own model); FML uses no public data.

Interpretations and deviations:
  * alpha = beta = 0.5 (`fml.alpha`, `fml.beta`), the FML paper's setting.
  * The meme architecture (`fml.meme_architecture`): the FCCL paper does not
    name the model it shares for FML; the default "" takes the scenario's
    first architecture (Digits: ResNet10, Office31: ResNet10, Office-Home:
    ResNet18), at the run's `models.width`. A registry name sets another one.
  * Every participant takes part in every round (the FCCL benchmark's
    protocol; FML samples a fraction of the clients).
  * `local.epochs` may be one number per participant (as FCCL; the
    participants of one architecture group must then share a value).

References: T. Shen, J. Zhang, X. Jia, F. Zhang, G. Huang, P. Zhou, K. Kuang,
F. Wu, C. Wu. Federated Mutual Learning. arXiv:2006.16765, 2020 (FCCL
reference [72]); Y. Zhang, T. Xiang, T. Hospedales, H. Lu. Deep Mutual
Learning. CVPR 2018.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, models, validation
from fedjax_het.algorithms import common
from fedjax_het.engine import local
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import (ClientGroup, client_keys, init_group_variables,
                                       slot_active, slot_ids, where_active)
from fedjax_het.engine.optim import round_decay_schedule

WEIGHTINGS = ("uniform", "size")


def mutual_learning_loss(*, logits: jax.Array, peer_logits: jax.Array, labels: jax.Array,
                         ce_weight: float, mask: jax.Array | None = None) -> jax.Array:
  """One model's deep-mutual-learning loss, FML Eq. 1 (alpha) / Eq. 2 (beta).

  ce_weight CE(softmax(logits), labels) + (1 - ce_weight) KL(softmax(peer) || softmax(logits)).

  Args:
    logits: (B, C) the model's logits.
    peer_logits: (B, C) the other model's logits; treated as a constant.
    labels: (B,) integer labels.
    ce_weight: alpha (private model) or beta (meme model), in [0, 1].
    mask: optional (B,) validity mask; padded rows get 0.

  Returns:
    Scalar loss (finite for any finite logits: log-softmax on both sides).
  """
  ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
  kl = losses.knowledge_distillation_loss(student_logits=logits, teacher_logits=peer_logits,
                                          temperature=1.0, mask=mask)
  return ce_weight * ce + (1.0 - ce_weight) * kl


def mean_over_groups(per_group: dict[str, Any], weights: dict[str, jax.Array]) -> Any:
  """sum over every group's slots of w_s x_s / sum w_s: one model from stacks of equal shapes.

  Args:
    per_group: {group: pytree of (slots, ...) arrays}, the same structure in every group.
    weights: {group: (slots,) weights} (0 for padding slots).
  """
  total = sum(jnp.sum(w) for w in weights.values())
  sums = [jax.tree_util.tree_map(
      lambda leaf, w=weights[name]: jnp.tensordot(w.astype(leaf.dtype), leaf, axes=1), tree)
      for name, tree in per_group.items()]
  summed = jax.tree_util.tree_map(lambda *leaves: sum(leaves), *sums)
  return jax.tree_util.tree_map(lambda leaf: leaf / total.astype(leaf.dtype), summed)


class Phases(NamedTuple):
  """FML's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state.
  local_update: (state, {group: GroupData}, key, round) -> (state with every
    participant's trained private model and meme copy, metrics).
  aggregate: state -> state with state["meme"] the (weighted) mean of the copies.
  """
  init: Any
  local_update: Any
  aggregate: Any


def meme_module(config: ml_collections.ConfigDict, setup: Setup) -> tuple[str, Any]:
  """(architecture, Flax module) of the meme model (`fml.meme_architecture`)."""
  first = setup.groups[0]
  name = str(config.fml.meme_architecture) or first.name
  for group in setup.groups:
    if group.name == name:
      return name, group.model
  if name not in models.MODEL_NAMES:
    validation.fail("fml.meme_architecture", f"'' or one of {tuple(models.MODEL_NAMES)}", name)
  conv_impl = getattr(getattr(first.model, "trunk", None), "conv_impl", "xla")
  return name, models.get_model(name, setup.num_classes, width=float(config.models.width),
                                conv_impl=conv_impl,
                                compute_dtype=config.models.get("compute_dtype", "float32"))


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """FML's phases from `config.fml` and `config.local`."""
  cfg, loc = config.fml, config.local
  alpha, beta = float(cfg.alpha), float(cfg.beta)
  weighting = common.check_choice("fml.weighting", cfg.weighting, WEIGHTINGS)
  _, meme = meme_module(config, setup)
  epochs = local.group_epochs("local.epochs", loc.epochs, setup)
  loc_lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))
  ids = {g.name: jnp.asarray(slot_ids(g, setup.num_participants)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  meme_group = ClientGroup(name="meme", model=meme, clients=(0,), num_slots=1)
  meme_forward = common.forward_fn(meme_group, train=True)

  def loss_for(group):
    forward = common.forward_fn(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      del aux
      r_private, r_meme = jax.random.split(rng)
      _, z, private_stats = forward(params["private"], batch_stats["private"], images,
                                    r_private, mask)
      _, z_meme, meme_stats = meme_forward(params["meme"], batch_stats["meme"], images, r_meme,
                                           mask)
      private_loss = mutual_learning_loss(logits=z, peer_logits=z_meme, labels=labels,
                                          ce_weight=alpha, mask=mask)
      meme_loss = mutual_learning_loss(logits=z_meme, peer_logits=z, labels=labels,
                                       ce_weight=beta, mask=mask)
      return private_loss + meme_loss, ({"private": private_stats, "meme": meme_stats},
                                        {"private": private_loss, "meme": meme_loss})

    return loss_fn

  trainers = local.make_group_trainers(
      setup, loss_for, optimizer=loc.optimizer, weight_decay=float(loc.weight_decay),
      epochs=epochs, batch_size=int(loc.batch_size))

  def init(key, data):
    del data
    private_key, meme_key = jax.random.split(key)
    groups = {g.name: {"variables": init_group_variables(
        g, private_key, shared=False, num_participants=setup.num_participants)}
        for g in setup.groups}
    return {"groups": groups, "meme": models.init_variables(meme, meme_key)}

  def local_update(state, data, key, round_index):
    groups, metrics = {}, {}
    for group in setup.groups:
      g = state["groups"][group.name]
      copies = jax.tree_util.tree_map(
          lambda v, n=group.num_slots: jnp.broadcast_to(v[None], (n, *v.shape)), state["meme"])
      joint = {kind: {"private": g["variables"][kind], "meme": copies[kind]}
               for kind in ("params", "batch_stats")}
      rates = jnp.full((epochs[group.name],), loc_lr(round_index))
      trained, metrics[group.name] = local.train_clients(
          trainers[group.name], joint, jnp.zeros((group.num_slots,)), data[group.name],
          client_keys(key, ids[group.name]), rates)
      private = {kind: trained[kind]["private"] for kind in ("params", "batch_stats")}
      meme_copies = {kind: trained[kind]["meme"] for kind in ("params", "batch_stats")}
      groups[group.name] = {**g,
                            "variables": where_active(active[group.name], private,
                                                      g["variables"]),
                            "meme": meme_copies,
                            "size": data[group.name].sizes}
    return {**state, "groups": groups}, metrics

  def aggregate(state):
    memes, weights, groups = {}, {}, {}
    for group in setup.groups:
      g = dict(state["groups"][group.name])
      memes[group.name] = g.pop("meme")
      size = g.pop("size")
      on = active[group.name].astype(jnp.float32)
      weights[group.name] = on * size.astype(jnp.float32) if weighting == "size" else on
      groups[group.name] = g
    return {**state, "groups": groups, "meme": mean_over_groups(memes, weights)}

  return Phases(init=init, local_update=local_update, aggregate=aggregate)


def make_fml(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FML as an `Algorithm`: broadcast the meme, mutual learning locally, average the memes."""
  phases = make_phases(config, setup)

  def round_fn(state, data, key, round_index):
    local_key = jax.random.split(key, 4)[3]  # the key FCCL/FCCL+/SOLO use for their local phase
    state, metrics = phases.local_update(state, data.groups, local_key, round_index)
    return phases.aggregate(state), {"local": metrics}

  # SOLO's heatmaps (a batch of 512 public images): FML has no public phase of its own.
  return Algorithm(name="fml", init=phases.init, round=round_fn,
                   evaluate=common.make_evaluate(config, setup),
                   diagnostics=common.cross_correlation_diagnostics(setup, 512))


def default_config() -> ml_collections.ConfigDict:
  """The config sections FML reads: `local` (the benchmark's local optimiser) and `fml`."""
  return ml_collections.ConfigDict({
      "local": local.default_config(),
      "fml": {
          "alpha": 0.5,               # private model's CE weight, FML Eq. 1
          "beta": 0.5,                # meme model's CE weight, FML Eq. 2
          "meme_architecture": "",    # "": the scenario's first architecture
          "weighting": "uniform",     # meme averaging: "uniform" or "size" (n_k / n)
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fml` and `config.local` (`local.epochs` may be one per participant)."""
  local.validate_config(config, per_participant_epochs=True)
  validation.require_section(config, "fml")
  v = validation
  for field in ("alpha", "beta"):
    v.check(config, f"fml.{field}", lambda x: 0 <= x <= 1, "a number in [0, 1]")
  v.check(config, "fml.meme_architecture",
          lambda x: x == "" or x in models.MODEL_NAMES,
          f"'' (the first architecture) or one of {tuple(models.MODEL_NAMES)}")
  v.check(config, "fml.weighting", v.choice(WEIGHTINGS), f"one of {WEIGHTINGS}")

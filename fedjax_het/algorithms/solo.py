"""SOLO / BASE: every participant trains on its private data alone.

The first row of the FCCL/FCCL+ tables ("BASE: models are optimized on private
data for 50 epochs", FCCL+ Sec. 4.1): no communication at all. Each round runs
`local.epochs` epochs of cross-entropy with Adam; with 50 rounds of 1 epoch the
per-round evaluations trace the BASE training curve. The same private training
(`pretrain_variables`) gives FCCL its pretrained intra-domain teacher.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses
from fedjax_het.algorithms import base, common
from fedjax_het.engine.clients import client_keys
from fedjax_het.engine.optim import linear_decay


def cross_entropy_loss_for(group):
  """Per-batch plain cross-entropy (the SOLO / pretraining objective)."""
  forward = common.forward_fn(group, train=True)

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    del aux
    _, logits, new_stats = forward(params, batch_stats, images, rng, mask)
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (new_stats, {"ce": ce})

  return loss_fn


def cosine_learning_rates(base_lr: float, min_lr: float, epochs: int) -> jax.Array:
  """Per-epoch cosine annealing from base_lr towards min_lr (timm CosineLRScheduler,
  t_initial=epochs, stepped per epoch), as the FCCL code pretrains."""
  e = jnp.arange(epochs, dtype=jnp.float32)
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + jnp.cos(math.pi * e / epochs))


def pretrain_variables(setup: base.Setup, variables: dict[str, Any], data: Any, key: jax.Array,
                       *, epochs: int, batch_size: int, lr: float, min_lr: float,
                       optimizer: str = "adam") -> dict[str, Any]:
  """Trains every participant on its private data alone (SOLO pretraining).

  Args:
    setup: run setup.
    variables: {group: stacked variables}.
    data: {group: GroupData}.
    key: PRNG key.
    epochs, batch_size, lr, min_lr, optimizer: cosine-annealed private training.

  Returns:
    {group: trained stacked variables}.
  """
  if epochs == 0:
    return dict(variables)
  trainers = common.make_group_trainers(setup, cross_entropy_loss_for, optimizer=optimizer,
                                        weight_decay=0.0, epochs=epochs, batch_size=batch_size)
  rates = cosine_learning_rates(lr, min_lr, epochs)
  out = {}
  for group in setup.groups:
    ids = jnp.asarray(common.slot_ids(group, setup.num_participants))
    new_vars, _ = common.run_group_trainer(
        trainers[group.name], variables[group.name], jnp.zeros((group.num_slots,)), data[group.name],
        client_keys(key, ids), rates)
    out[group.name] = base.where_active(jnp.asarray(common.slot_active(group)), new_vars,
                                        variables[group.name])
  return out


def make_solo(config: ml_collections.ConfigDict, setup: base.Setup) -> base.Algorithm:
  """Builds SOLO from `config.local` (epochs per round, Adam, lr decay)."""
  loc = config.local
  trainers = common.make_group_trainers(
      setup, cross_entropy_loss_for, optimizer=loc.optimizer,
      weight_decay=float(loc.weight_decay), epochs=int(loc.epochs),
      batch_size=int(loc.batch_size))

  def init(key, data):
    del data
    return {"groups": {
        g.name: {"variables": base.init_group_variables(
            g, key, shared=False, num_participants=setup.num_participants)}
        for g in setup.groups}}

  def local_update(state, data, key, round_index):
    lr = linear_decay(float(loc.lr), round_index, setup.num_rounds, float(loc.lr_decay))
    rates = jnp.full((int(loc.epochs),), lr)
    groups, metrics = {}, {}
    for group in setup.groups:
      variables = state["groups"][group.name]["variables"]
      ids = jnp.asarray(common.slot_ids(group, setup.num_participants))
      new_vars, m = common.run_group_trainer(trainers[group.name], variables,
                                             jnp.zeros((group.num_slots,)), data[group.name],
                                             client_keys(key, ids), rates)
      active = jnp.asarray(common.slot_active(group))
      groups[group.name] = {"variables": base.where_active(active, new_vars, variables)}
      metrics[group.name] = m
    return {**state, "groups": groups}, metrics

  return base.Algorithm(name="solo", init=init, prepare_round=base.identity_prepare_round,
                        collaborative_update=None, local_update=local_update,
                        evaluate=common.make_evaluate(config, setup))

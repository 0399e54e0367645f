"""Private training: every participant trains on its own private data alone.

The phase several methods share, each a block of their round or of their initialisation:

* `train_private`: every group's participants train on their own data (padding slots
  unchanged): SOLO's round (`algorithms.solo`), the private phase of the methods below.
* `make_private_update`: that phase as a round step `(state, {group: GroupData}, key,
  round) -> (state, metrics)` at the round's rate (the local update of FedMD's revisit,
  FedDF, RHFL, FedMatch and RCFL).
* `pretrain_variables`: private cross-entropy with cosine-annealed per-epoch rates before
  the first round (FCCL's pretrained intra-domain teacher; FCCL+'s theta^* with
  `fcclplus.local_distillation = "dual"`).
* `warm_started_init`: `init(key, data)` of models warmed up on their private data (FedMD's
  and RCFL's warm-up).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.algorithms import common
from fedjax_het.engine import local
from fedjax_het.engine.api import Setup
from fedjax_het.engine.clients import (client_keys, init_group_variables, slot_active, slot_ids,
                                       where_active)
from fedjax_het.engine.optim import cosine_epoch_rates


def train_private(setup: Setup, trainers: dict[str, Any], variables: dict[str, Any], data: Any,
                  key: jax.Array, rates: jax.Array) -> tuple[dict[str, Any], dict[str, Any]]:
  """Every participant trains on its own data alone (padding slots unchanged).

  Returns:
    ({group: new stacked variables}, {group: metrics}).
  """
  out, metrics = {}, {}
  for group in setup.groups:
    ids = jnp.asarray(slot_ids(group, setup.num_participants))
    new_vars, metrics[group.name] = local.train_clients(
        trainers[group.name], variables[group.name], jnp.zeros((group.num_slots,)),
        data[group.name], client_keys(key, ids), rates)
    out[group.name] = where_active(jnp.asarray(slot_active(group)), new_vars,
                                   variables[group.name])
  return out, metrics


def make_private_update(setup: Setup, trainers: dict[str, Any], epochs: int,
                        lr_schedule: Any, prepare: Any = None) -> Any:
  """The private-training phase of the public-data methods (FedMD's revisit, FedDF's, RHFL's
  and FedMatch's local update): `(state, {group: GroupData}, key, round) -> (state, metrics)`.

  state["groups"][group]["variables"] are trained with `train_private` for `epochs` epochs at
  `lr_schedule(round)`; `prepare({group: variables})`, if given, runs first (FedDF's
  homogeneous averaging).
  """
  def private_update(state, data, key, round_index):
    rates = jnp.full((epochs,), lr_schedule(round_index))
    variables = {name: g["variables"] for name, g in state["groups"].items()}
    if prepare is not None:
      variables = prepare(variables)
    trained, metrics = train_private(setup, trainers, variables, data, key, rates)
    groups = {name: {**g, "variables": trained[name]} for name, g in state["groups"].items()}
    return {**state, "groups": groups}, metrics

  return private_update


def pretrain_variables(setup: Setup, variables: dict[str, Any], data: Any, key: jax.Array,
                       *, epochs: int, batch_size: int, lr: float, min_lr: float,
                       optimizer: str = "adam") -> dict[str, Any]:
  """SOLO pretraining with cosine-annealed per-epoch rates (FCCL's intra-domain teacher).

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
  trainers = local.make_group_trainers(setup, common.cross_entropy_loss_for, optimizer=optimizer,
                                       weight_decay=0.0, epochs=epochs, batch_size=batch_size)
  trained, _ = train_private(setup, trainers, variables, data, key,
                             cosine_epoch_rates(lr, min_lr, epochs))
  return trained


def warm_started_init(setup: Setup, local_config: Any, epochs: int, *,
                      public_optimizer: Any = None) -> Any:
  """`init(key, data) -> state` of models warmed up on their private data.

  `key` splits into two keys: every participant's own initialisation from the first
  (`init_group_variables`), then `epochs` epochs of private cross-entropy from the second
  (`pretrain_variables` with `local_config`'s optimizer and batch size at its constant rate
  lr; 0: none). The state is `common.groups_state(variables, public_optimizer)`.
  """
  def init(key, data):
    init_key, warmup_key = jax.random.split(key)
    variables = {g.name: init_group_variables(g, init_key, shared=False,
                                              num_participants=setup.num_participants)
                 for g in setup.groups}
    variables = pretrain_variables(
        setup, variables, data.groups, warmup_key, epochs=epochs,
        batch_size=int(local_config.batch_size), lr=float(local_config.lr),
        min_lr=float(local_config.lr), optimizer=local_config.optimizer)
    return common.groups_state(variables, public_optimizer)

  return init

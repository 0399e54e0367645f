"""SOLO / BASE: every participant trains on its private data alone.

The first row of the FCCL/FCCL+ tables ("BASE: models are optimized on private
data for 50 epochs", FCCL+ Sec. 4.1): no communication at all. Each round runs
`local.epochs` epochs of cross-entropy with Adam; with 50 rounds of 1 epoch the
per-round evaluations trace the BASE training curve. The same private training
(`pretrain_variables`) gives FCCL its pretrained intra-domain teacher.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het.algorithms import common
from fedjax_het.engine import local
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import (client_keys, init_group_variables, slot_active, slot_ids,
                                       where_active)
from fedjax_het.engine.optim import cosine_epoch_rates, round_decay_schedule


cross_entropy_loss_for = common.cross_entropy_loss_for


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
  trainers = local.make_group_trainers(setup, cross_entropy_loss_for, optimizer=optimizer,
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


def make_solo(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """SOLO from `config.local` (epochs per round, optimiser, lr decay). Nothing is
  communicated: the round's ["server"]["bytes_up" | "bytes_down"] are 0."""
  loc = config.local
  trainers = local.make_group_trainers(
      setup, cross_entropy_loss_for, optimizer=loc.optimizer,
      weight_decay=float(loc.weight_decay), epochs=int(loc.epochs),
      batch_size=int(loc.batch_size))
  lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))

  def init(key, data):
    del data
    return {"groups": {
        g.name: {"variables": init_group_variables(
            g, key, shared=False, num_participants=setup.num_participants)}
        for g in setup.groups}}

  def round_fn(state, data, key, round_index):
    local_key = jax.random.split(key, 4)[3]  # the key FCCL/FCCL+ use for their local phase
    rates = jnp.full((int(loc.epochs),), lr(round_index))
    variables = {name: g["variables"] for name, g in state["groups"].items()}
    trained, metrics = train_private(setup, trainers, variables, data.groups, local_key, rates)
    return ({**state, "groups": {name: {"variables": v} for name, v in trained.items()}},
            {"local": metrics, "server": common.server_bytes(0, 0)})

  # The same heatmaps as FCCL/FCCL+ (batch of 512 public images, their public batch size), so
  # runs without communication can be compared with them.
  return Algorithm(name="solo", init=init, round=round_fn,
                   evaluate=common.make_evaluate(config, setup),
                   diagnostics=common.cross_correlation_diagnostics(setup, 512))


def default_config() -> ml_collections.ConfigDict:
  """SOLO reads `config.local` only (the BASE row: 1 epoch per round, constant lr)."""
  section = local.default_config()
  section.epochs = 1
  section.lr_decay = 0.0
  return ml_collections.ConfigDict({"local": section})


def validate_config(config: ml_collections.ConfigDict) -> None:
  local.validate_config(config)

"""SOLO / BASE: every participant trains on its private data alone.

The first row of the FCCL/FCCL+ tables ("BASE: models are optimized on private
data for 50 epochs", FCCL+ Sec. 4.1): no communication at all. Each round runs
`local.epochs` epochs of cross-entropy with Adam; with 50 rounds of 1 epoch the
per-round evaluations trace the BASE training curve. The same private training
(`private_training.pretrain_variables`) gives FCCL its pretrained intra-domain
teacher.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het.algorithms import common, private_training
from fedjax_het.engine import local
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import init_group_variables
from fedjax_het.engine.optim import round_decay_schedule


cross_entropy_loss_for = common.cross_entropy_loss_for


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
    trained, metrics = private_training.train_private(setup, trainers, variables, data.groups,
                                                      local_key, rates)
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

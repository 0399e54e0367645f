"""FedAvg (McMahan et al., AISTATS 2017) with client sampling and an optax server optimiser.

`round` below is the whole method; every communication round t:
  1. Sample `fedavg.clients_per_round` of the K participants uniformly without
     replacement (0: all of them, the FCCL+ benchmark setting). The draw uses the
     round's key, so a resumed run samples the same cohorts.
  2. Every sampled client starts from the server model w_t and runs
     `local.epochs` epochs of minibatch training on its private data
     (`local.optimizer`, fresh state every round, `local.lr` with the linear
     round decay of `local.lr_decay`). The local objective is cross-entropy;
     methods of the FedAvg family (FedProx, ...) pass their own objective to
     `make_family`.
  3. The cohort's models are averaged, weighted by local data size n_k
     (`fedavg.weighting="size"`, McMahan's w = sum_k n_k w_k / n) or uniformly
     ("uniform", the FCCL+ benchmark code's `aggregate_nets(freq=None)`);
     parameters and BatchNorm statistics alike.
  4. Server: w_{t+1} = w_t - optax_step(w_t - mean) with `config.server`
     ("sgd" lr 1: w_{t+1} = mean, plain FedAvg; "momentum": FedAvgM;
     "adam": FedAdam). BatchNorm statistics are set to the average.

Only the sampled clients are computed: their data is gathered into a cohort
axis of size `clients_per_round`, trained vmapped, and averaged.

Evaluation (`fedavg.evaluate`): "global" tests the server model and reports it
for every participant; "local" tests each participant's own model at the end
of its latest local training (clients keep it as state; only sampled clients
update theirs), which is what the FCCL+ benchmark code reports for its FedAvg
family (Table XV: per-participant intra/inter accuracy).

Reference: B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas.
Communication-Efficient Learning of Deep Networks from Decentralized Data.
AISTATS 2017. Server optimisers: S. Reddi et al., Adaptive Federated
Optimization, ICLR 2021; T. Hsu, H. Qi, M. Brown, Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification, 2019.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import evaluation, losses, validation
from fedjax_het.algorithms import common
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import ClientGroup, client_keys, init_group_variables, slot_active
from fedjax_het.engine.optim import round_decay_schedule

WEIGHTINGS = ("size", "uniform")
EVALUATES = ("global", "local")

# objective_for(group) -> loss_fn(params, batch_stats, images, labels, mask, rng, aux) with
# aux = {"global": the round's server variables}; returns (loss, (new batch_stats, metrics)).
ObjectiveFor = Callable[[ClientGroup], local.LocalLossFn]


def cross_entropy_objective(group: ClientGroup) -> local.LocalLossFn:
  """FedAvg's local objective: softmax cross-entropy on the private batch."""
  forward = common.forward_fn(group, train=True)

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    del aux
    _, logits, new_stats = forward(params, batch_stats, images, rng, mask)
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (new_stats, {"ce": ce})

  return loss_fn


def the_group(setup: Setup, method: str) -> ClientGroup:
  """The single architecture group of a FedAvg-family run (raises otherwise)."""
  if not setup.homogeneous:
    raise ValueError(f"config.models.architectures must name one architecture for every "
                     f"participant for {method} (one global model), got groups "
                     f"{[g.name for g in setup.groups]}.")
  return setup.groups[0]


def make_family(config: ml_collections.ConfigDict, setup: Setup, *, name: str,
                objective_for: ObjectiveFor) -> Algorithm:
  """A FedAvg-style `Algorithm` with a custom local objective (FedAvg, FedProx, ...)."""
  group = the_group(setup, name)
  cfg, loc = config.fedavg, config.local
  cohort_size = int(cfg.clients_per_round) or group.num_clients
  if cohort_size > group.num_clients:
    raise ValueError(f"config.fedavg.clients_per_round must be at most the number of "
                     f"participants ({group.num_clients}), got {cohort_size}.")
  weighting = common.check_choice("fedavg.weighting", cfg.weighting, WEIGHTINGS)
  keep_local = common.check_choice("fedavg.evaluate", cfg.evaluate, EVALUATES) == "local"
  epochs = int(loc.epochs)
  trainer = local.make_group_trainers(
      setup, objective_for, optimizer=loc.optimizer, weight_decay=float(loc.weight_decay),
      epochs=epochs, batch_size=int(loc.batch_size))[group.name]
  lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))
  server_tx = aggregation.server_optimizer_from_config(config.server)
  active = jnp.asarray(slot_active(group))
  evaluator = evaluation.make_evaluator(
      (group,), batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
      top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean, setup.private_std))

  def init(key, data):
    del data
    variables = init_group_variables(group, key, shared=True,
                                     num_participants=setup.num_participants)
    server = jax.tree_util.tree_map(lambda v: v[0], variables)
    state = {"server": server, "server_opt": server_tx.init(server["params"])}
    if keep_local:
      state["groups"] = {group.name: {"variables": variables}}
    return state

  def round_fn(state, data, key, round_index):
    sample_key, train_key = jax.random.split(key)
    slots = cohort.sample_cohort(sample_key, active, cohort_size)
    members = cohort.gather(data.groups[group.name], slots)
    start = aggregation.broadcast(state["server"], cohort_size)
    trained, metrics = local.train_clients(
        trainer, start, {"global": start}, members, client_keys(train_key, members.client_ids),
        jnp.full((epochs,), lr(round_index)))
    weights = members.sizes if weighting == "size" else jnp.ones((cohort_size,))
    mean = aggregation.weighted_mean(trained, weights)
    params, server_opt = aggregation.server_update(server_tx, state["server"]["params"],
                                                   mean["params"], state["server_opt"])
    server = {"params": params, "batch_stats": mean["batch_stats"]}
    zeros = jnp.zeros((group.num_slots,))
    per_slot = {metric: cohort.scatter(zeros, slots, value) for metric, value in metrics.items()}
    per_slot["participated"] = cohort.scatter(zeros, slots, jnp.ones((cohort_size,)))
    new_state = {"server": server, "server_opt": server_opt}
    if keep_local:  # only the cohort's models change
      new_state["groups"] = {group.name: {"variables": cohort.scatter(
          state["groups"][group.name]["variables"], slots, trained)}}
    return (new_state,
            {"local": {group.name: per_slot},
             "server": {"cohort_rows": jnp.sum(members.sizes).astype(jnp.float32)}})

  local_evaluator = common.make_evaluate(config, setup)

  def evaluate(state, test):
    if keep_local:
      return local_evaluator(state, test)
    one = {"groups": {group.name: {"variables": aggregation.broadcast(state["server"], 1)}}}
    accuracy = evaluator(one, test)[group.name]  # (1, domains)
    return {group.name: jnp.broadcast_to(accuracy, (group.num_slots, accuracy.shape[1]))}

  return Algorithm(name=name, init=init, round=round_fn, evaluate=evaluate)


def make_fedavg(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedAvg from `config.fedavg`, `config.local`, `config.server`."""
  return make_family(config, setup, name="fedavg", objective_for=cross_entropy_objective)


def family_default_config() -> ml_collections.ConfigDict:
  """The sections every FedAvg-family method reads."""
  return ml_collections.ConfigDict({
      "fedavg": {"clients_per_round": 0,      # 0: every participant, every round
                 "weighting": "size",         # "size": n_k / n (McMahan); "uniform"
                 "evaluate": "global"},       # "global": server model; "local": own models
      "local": local.default_config(),
      "server": aggregation.default_server_config(),
      # Run-wide default changed for this family: one global model needs one architecture.
      "models": {"architectures": ("resnet12",) * 4},
  })


def default_config() -> ml_collections.ConfigDict:
  return family_default_config()


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedavg`, `config.local`, `config.server`."""
  local.validate_config(config)
  aggregation.validate_server_config(config)
  validation.require_section(config, "fedavg")
  validation.check(config, "fedavg.clients_per_round", validation.int_at_least(0),
                   "an integer >= 0 (0: every participant)")
  validation.check(config, "fedavg.weighting", validation.choice(WEIGHTINGS),
                   f"one of {WEIGHTINGS}")
  validation.check(config, "fedavg.evaluate", validation.choice(EVALUATES),
                   f"one of {EVALUATES}")
  if len(set(config.models.architectures)) > 1:
    validation.fail("models.architectures",
                    f"one architecture for every participant for {config.algorithm}",
                    tuple(config.models.architectures))

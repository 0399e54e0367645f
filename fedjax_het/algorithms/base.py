"""The algorithm API: a federated method is a NamedTuple of pure functions.

Like optax's `GradientTransformation(init, update)` and fedjax's
`FederatedAlgorithm(init, apply)`, a method built by `make_<method>(config,
setup)` is an `Algorithm` whose state is an explicit pytree:

    state = {"groups": {group_name: {"variables": {"params", "batch_stats"},
                                      <method-specific per-client entries>}},
             <method-specific global entries>}

with the client (slot) axis leading in every per-group leaf. The engine
(`fedjax_het.engine.rounds`) runs, inside one jitted function per round:

    state = prepare_round(state, round)
    for each public batch:   state = collaborative_update(state, batch, key, round)
    state = local_update(state, private data, key, round)

and `evaluate(state, test data)` after the rounds it reports. A new method is a
new module that builds these functions; the engine does not change.

This module also holds the building blocks methods share: the per-run `Setup`,
vmapped initialisation, preprocessing, and the optimiser/learning-rate plumbing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_het import models
from fedjax_het.engine.clients import ClientGroup, GroupData, client_keys

State = Any
Metrics = Mapping[str, Mapping[str, jax.Array]]  # {group name: {metric: (slots,)}}


class Algorithm(NamedTuple):
  """A federated method as pure functions (see the module docstring).

  Attributes:
    name: method name.
    init: (key, data: `FederatedArrays`) -> state. May train (e.g. FCCL's
      pretraining).
    prepare_round: (state, round) -> state, run at the start of every round.
    collaborative_update: (state, public images (B0, 32, 32, 3) float, key,
      round) -> (state, metrics), or None for methods without a public phase.
    local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
    evaluate: (state, test data) -> {group: accuracy (slots, domains)}.
  """
  name: str
  init: Callable[[jax.Array, Any], State]
  prepare_round: Callable[[State, jax.Array], State]
  collaborative_update: Callable[[State, jax.Array, jax.Array, jax.Array],
                                 tuple[State, Metrics]] | None
  local_update: Callable[[State, Mapping[str, GroupData], jax.Array, jax.Array],
                         tuple[State, Metrics]]
  evaluate: Callable[[State, Any], Mapping[str, jax.Array]]


class FederatedArrays(NamedTuple):
  """Everything a round reads, as (device) arrays."""
  groups: Mapping[str, GroupData]  # private data per architecture group
  public: Any                      # (N0, 32, 32, 3) uint8, may have 0 rows
  test: Any                        # evaluation.TestData


@dataclasses.dataclass(frozen=True)
class Setup:
  """Static facts about a run that `make_<method>` turns into Python constants.

  Attributes:
    groups: the architecture groups.
    num_participants: K.
    num_classes: C.
    num_rounds: E (for learning-rate schedules).
    max_sizes: padded private rows per group.
    private_mean, private_std: normalisation of private images.
    public_mean, public_std: normalisation of public images.
    max_test_size: padded rows of the stacked test sets.
    homogeneous: all participants share one architecture (one group).
  """
  groups: tuple[ClientGroup, ...]
  num_participants: int
  num_classes: int
  num_rounds: int
  max_sizes: Mapping[str, int]
  private_mean: tuple[float, float, float]
  private_std: tuple[float, float, float]
  public_mean: tuple[float, float, float]
  public_std: tuple[float, float, float]
  max_test_size: int

  @property
  def homogeneous(self) -> bool:
    return len(self.groups) == 1


def normalizer(mean: tuple[float, float, float],
               std: tuple[float, float, float]) -> Callable[[jax.Array], jax.Array]:
  """uint8 or [0, 1] float images (..., 32, 32, 3) -> standardised float32."""
  mean_arr = jnp.asarray(mean, jnp.float32)
  std_arr = jnp.asarray(std, jnp.float32)

  def normalize(images):
    x = images.astype(jnp.float32)
    if images.dtype == jnp.uint8:
      x = x / 255.0
    shape = (1,) * (x.ndim - 1) + (3,)
    return (x - mean_arr.reshape(shape)) / std_arr.reshape(shape)

  return normalize


def init_group_variables(group: ClientGroup, key: jax.Array, *, shared: bool,
                         num_participants: int) -> dict[str, Any]:
  """Initial variables of every slot of a group, stacked on a leading axis.

  Each participant's initialisation key is folded from its global index, so the
  result does not depend on how participants are grouped or padded. With
  `shared=True` (homogeneous FL) every slot starts from the first member's
  initialisation.
  """
  ids = jnp.asarray(list(group.clients) + list(range(num_participants,
                                                     num_participants + group.num_slots
                                                     - group.num_clients)), jnp.int32)
  keys = client_keys(key, ids)
  if shared:
    keys = jnp.broadcast_to(keys[:1], keys.shape)
  return jax.vmap(lambda k: models.init_variables(group.model, k))(keys)


def average_over_active(tree: Any, active: jax.Array) -> Any:
  """FedAvg: the uniform mean over active slots, broadcast back to every slot.

  The FCCL+ code averages all parameters and BatchNorm statistics with equal
  weights (`aggregate_nets(freq=None)`).
  """
  weights = active.astype(jnp.float32)
  weights = weights / jnp.sum(weights)

  def mean(leaf):
    w = weights.reshape((-1,) + (1,) * (leaf.ndim - 1)).astype(leaf.dtype)
    return jnp.broadcast_to(jnp.sum(w * leaf, axis=0, keepdims=True), leaf.shape)

  return jax.tree_util.tree_map(mean, tree)


def where_active(active: jax.Array, new: Any, old: Any) -> Any:
  """Per-slot select: keep `old` in inactive (padding) slots."""
  def select(n, o):
    return jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
  return jax.tree_util.tree_map(select, new, old)


def identity_prepare_round(state: State, round_index: jax.Array) -> State:
  del round_index
  return state

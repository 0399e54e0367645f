"""Pieces shared by several methods: slot bookkeeping, cross-group targets, trainers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import evaluation, models
from fedjax_het.algorithms.base import Setup, normalizer
from fedjax_het.engine import local
from fedjax_het.engine.clients import ClientGroup, client_keys
from fedjax_het.engine.optim import make_optimizer

OPTIMIZER_RESETS = ("batch", "round", "never")


def slot_ids(group: ClientGroup, num_participants: int) -> np.ndarray:
  """Global index of every slot (padding slots numbered K, K+1, ...)."""
  padding = range(num_participants, num_participants + group.num_slots - group.num_clients)
  return np.asarray(list(group.clients) + list(padding), np.int32)


def slot_active(group: ClientGroup) -> np.ndarray:
  """True for the real members, False for padding slots."""
  return np.arange(group.num_slots) < group.num_clients


def mean_over_participants(per_group: Mapping[str, jax.Array], setup: Setup) -> jax.Array:
  """Mean over all active participants of all groups (e.g. the FCCL+ target Z_bar).

  Args:
    per_group: {group: (slots, ...)} values with equal trailing shapes.
    setup: the run setup (for the active masks).

  Returns:
    The mean, shape (...), wrapped in stop_gradient (it is a target).
  """
  total, count = 0.0, 0
  for group in setup.groups:
    values = per_group[group.name]
    weights = jnp.asarray(slot_active(group), values.dtype)
    total = total + jnp.tensordot(weights, values, axes=1)
    count += group.num_clients
  return jax.lax.stop_gradient(total / count)


def forward_fn(group: ClientGroup, *, train: bool) -> Callable[..., tuple[jax.Array, jax.Array, Any]]:
  """(params, batch_stats, images, rng, mask) -> (features, logits, new batch_stats)."""
  def forward(params, batch_stats, images, rng=None, mask=None):
    variables = {"params": params, "batch_stats": batch_stats}
    features, logits, new_variables = models.apply_model(group.model, variables, images,
                                                         train=train, rng=rng, mask=mask)
    return features, logits, new_variables["batch_stats"]
  return forward


def public_forward(setup: Setup, state: Any, params: Mapping[str, Any], images: jax.Array,
                   key: jax.Array, ids: Mapping[str, jax.Array]
                   ) -> tuple[dict[str, jax.Array], dict[str, jax.Array], dict[str, Any]]:
  """Every group's train-mode forward pass on the shared public batch.

  Args:
    setup: the run's groups.
    state: algorithm state; the BatchNorm statistics are read from
      state["groups"][group]["variables"]["batch_stats"].
    params: {group: stacked params} (the argument being differentiated).
    images: (B, 32, 32, 3) public batch, the same for every participant.
    key: the batch's key; participant p draws from fold_in(key, p).
    ids: {group: (slots,) global participant ids} (`slot_ids`).

  Returns:
    ({group: features (slots, B, D)}, {group: logits (slots, B, C)},
    {group: updated BatchNorm statistics}).
  """
  features, logits, stats = {}, {}, {}
  for group in setup.groups:
    forward = forward_fn(group, train=True)
    batch_stats = state["groups"][group.name]["variables"]["batch_stats"]
    features[group.name], logits[group.name], stats[group.name] = jax.vmap(
        forward, in_axes=(0, 0, None, 0))(params[group.name], batch_stats, images,
                                          client_keys(key, ids[group.name]))
  return features, logits, stats


def make_group_trainers(setup: Setup, loss_for_group: Callable[[ClientGroup], local.LocalLossFn], *,
                        optimizer: str, weight_decay: float, epochs: int,
                        batch_size: int) -> dict[str, Callable[..., Any]]:
  """One local trainer per group (private-data normalisation, fresh optimiser state)."""
  preprocess = normalizer(setup.private_mean, setup.private_std)
  tx = make_optimizer(optimizer, weight_decay=weight_decay)
  return {group.name: local.make_local_trainer(
      loss_fn=loss_for_group(group), optimizer=tx, epochs=epochs, batch_size=batch_size,
      max_size=setup.max_sizes[group.name], preprocess=preprocess) for group in setup.groups}


def run_group_trainer(trainer: Callable[..., Any], variables: Any, aux: Any, data: Any,
                      keys: jax.Array, learning_rates: jax.Array) -> tuple[Any, Any]:
  """vmaps a local trainer over a group's slots (aux and variables per slot)."""
  return jax.vmap(trainer, in_axes=(0, 0, 0, 0, 0, 0, None))(
      variables, aux, data.images, data.labels, data.sizes, keys, learning_rates)


def make_evaluate(config: Any, setup: Setup) -> Callable[..., Any]:
  """The shared evaluator: top-k accuracy of every slot on every test domain."""
  return evaluation.make_evaluator(
      setup.groups, batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
      top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean, setup.private_std))


def check_choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
  if value not in allowed:
    raise ValueError(f"{field} must be one of {allowed}, got {value!r}.")
  return value


def check_parameter_averaging(field: str, value: Any, setup: Setup) -> bool:
  """`field` (a bool) asks for parameter averaging, which needs one architecture."""
  average = bool(value)
  if average and not setup.homogeneous:
    raise ValueError(f"{field}=True needs one architecture for all participants, got groups "
                     f"{[g.name for g in setup.groups]}.")
  return average

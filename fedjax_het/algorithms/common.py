"""Pieces several methods share: cross-group targets, forwards, evaluation, diagnostics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import evaluation, losses, models, plots
from fedjax_het.data.augment import normalizer
from fedjax_het.engine.api import Diagnostics, Setup
from fedjax_het.engine.clients import ClientGroup, client_keys, slot_active
from fedjax_het.errors import ConfigError


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


def cross_entropy_loss_for(group: ClientGroup) -> Callable[..., Any]:
  """Per-batch plain cross-entropy of a group's model (SOLO, FCCL pretraining, FedAvg)."""
  forward = forward_fn(group, train=True)

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    del aux
    _, logits, new_stats = forward(params, batch_stats, images, rng, mask)
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (new_stats, {"ce": ce})

  return loss_fn


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
    ids: {group: (slots,) global participant ids} (`clients.slot_ids`).

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


def make_evaluate(config: Any, setup: Setup) -> Callable[..., Any]:
  """The shared evaluator: top-k accuracy of every slot's `variables` on every test domain."""
  return evaluation.make_evaluator(
      setup.groups, batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
      top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean, setup.private_std))


def check_choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
  if value not in allowed:
    raise ConfigError(f"config.{field} must be one of {allowed}, got {value!r}.")
  return value


def check_parameter_averaging(field: str, value: Any, setup: Setup) -> bool:
  """`field` (a bool) asks for parameter averaging, which needs one architecture."""
  average = bool(value)
  if average and not setup.homogeneous:
    raise ConfigError(f"config.{field}=True needs one architecture for all participants, got "
                      f"groups {[g.name for g in setup.groups]}.")
  return average


def cross_correlation_diagnostics(setup: Setup, batch_size: int) -> Diagnostics:
  """FCCL Fig. 5 / FCCL+ Fig. 8: each participant's cross-correlation matrix M_i.

  M_i is computed between participant i's eval-mode logits and the mean logits
  of all participants on the first `batch_size` public images (no augmentation).
  """
  normalize = normalizer(setup.public_mean, setup.public_std)

  def compute(state, data):
    n = min(batch_size, data.public.shape[0])
    images = normalize(data.public[:n])
    logits = {}
    for group in setup.groups:
      variables = state["groups"][group.name]["variables"]
      logits[group.name] = jax.vmap(
          lambda v, g=group: models.apply_model(g.model, v, images, train=False)[1])(variables)
    target = mean_over_participants(logits, setup)
    return {name: jax.vmap(lambda z: losses.cross_correlation_matrix(
        logits=z, target_logits=target))(z) for name, z in logits.items()}

  def plot(matrices: Mapping[int, np.ndarray], client_names, path) -> bool:
    return plots.plot_cross_correlation(matrices, client_names, path)

  return Diagnostics(name="cross_correlation", compute=compute, plot=plot)

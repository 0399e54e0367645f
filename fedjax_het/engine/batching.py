"""Static-shape batching of padded client data and of the public set.

Clients of unequal size are stacked into padded arrays (the first `size` rows
of each client are valid). Every epoch visits a client's valid examples once in
a fresh random order, in ceil(size / batch_size) batches of static shape; rows
past the end are masked, so a partial batch is exactly a smaller batch (the
losses and BatchNorm take the mask). Steps past a client's last batch are
no-ops (`active` is False), which lets clients of different sizes share one
vmapped `lax.scan` of max_steps steps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class EpochPlan(NamedTuple):
  """Index plan of several epochs of one client (all arrays static-shaped)."""
  orders: jax.Array  # (epochs, steps_per_epoch * batch_size) int32 row indices
  size: jax.Array    # () int32 number of valid rows


def steps_per_epoch(max_size: int, batch_size: int) -> int:
  """Static number of batch slots per epoch for clients of at most `max_size` rows."""
  return max(1, math.ceil(max_size / batch_size))


def plan_epochs(key: jax.Array, size: jax.Array, *, max_size: int, epochs: int,
                batch_size: int) -> EpochPlan:
  """Random orders of the valid rows [0, size) for `epochs` epochs.

  Valid rows come first in each order (uniform random permutation of them);
  padding rows follow and are never marked valid.
  """
  slots = steps_per_epoch(max_size, batch_size) * batch_size
  rows = jnp.arange(max_size)

  def one_epoch(k):
    scores = jnp.where(rows < size, jax.random.uniform(k, (max_size,)), 2.0)
    order = jnp.argsort(scores).astype(jnp.int32)
    return jnp.pad(order, (0, slots - max_size))

  keys = jax.random.split(key, epochs)
  return EpochPlan(orders=jax.vmap(one_epoch)(keys), size=jnp.asarray(size, jnp.int32))


def batch_indices(plan: EpochPlan, step: jax.Array, *, batch_size: int,
                  steps: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Row indices, validity mask and activity flag of flat step `step`.

  Returns:
    (indices (batch_size,), mask (batch_size,) bool, active () bool) where
    `active` is False when the batch holds no valid row (the step is a no-op).
  """
  epoch, slot = step // steps, step % steps
  start = slot * batch_size
  indices = jax.lax.dynamic_slice(plan.orders[epoch], (start,), (batch_size,))
  mask = (start + jnp.arange(batch_size)) < plan.size
  return indices, mask, start < plan.size


def public_batches(key: jax.Array, num_examples: int, *, batch_size: int,
                   epochs: int) -> jax.Array:
  """Index batches over the public set: (epochs * ceil(N0 / B0), B0) int32.

  Each epoch is a fresh permutation; a final partial batch is filled with the
  first examples of the same permutation, so every public batch is full (the
  collaborative losses standardise over the batch and take no mask). With
  N0 = 5000 and B0 = 512 this re-uses 120 images once per epoch.
  """
  per_epoch = math.ceil(num_examples / batch_size)
  slots = per_epoch * batch_size

  def one_epoch(k):
    perm = jax.random.permutation(k, num_examples).astype(jnp.int32)
    reps = math.ceil(slots / num_examples)
    return jnp.tile(perm, reps)[:slots].reshape(per_epoch, batch_size)

  keys = jax.random.split(key, epochs)
  return jax.vmap(one_epoch)(keys).reshape(epochs * per_epoch, batch_size)

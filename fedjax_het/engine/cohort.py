"""Cohort sampling: train a fixed-size subset of a group's participants each round.

Partial participation (e.g. 10 of 100 clients per round) keeps shapes static:

    slots = sample_cohort(key, active, cohort_size)   # (M,) slot indices
    cohort = gather(tree, slots)                       # (S, ...) -> (M, ...)
    ... train the cohort vmapped ...
    tree = scatter(tree, slots, cohort)                # write back where clients keep state

Only the M sampled participants are computed; the others' state is untouched.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp


def sample_cohort(key: jax.Array, active: jax.Array, cohort_size: int) -> jax.Array:
  """`cohort_size` distinct active slots, uniformly without replacement, in ascending order.

  Args:
    key: the round's sampling key.
    active: (S,) bool, the real (non-padding) slots; at least `cohort_size`.
    cohort_size: M (static).

  Returns:
    (M,) int32 slot indices.
  """
  chex.assert_rank(active, 1)
  num_slots = active.shape[0]
  if not 1 <= cohort_size <= num_slots:
    raise ValueError(f"cohort_size must be in [1, {num_slots}] (the group's slots), "
                     f"got {cohort_size}.")
  scores = jnp.where(active, jax.random.uniform(key, (num_slots,)), 2.0)
  chosen = jnp.argsort(scores)[:cohort_size]
  return jnp.sort(chosen).astype(jnp.int32)


def gather(tree: Any, slots: jax.Array) -> Any:
  """The rows `slots` of every leaf's leading axis."""
  return jax.tree_util.tree_map(lambda v: jnp.take(v, slots, axis=0), tree)


def scatter(tree: Any, slots: jax.Array, values: Any) -> Any:
  """`tree` with rows `slots` replaced by `values` (leading axis M)."""
  chex.assert_tree_shape_prefix(values, slots.shape)
  return jax.tree_util.tree_map(lambda v, x: v.at[slots].set(x.astype(v.dtype)), tree, values)

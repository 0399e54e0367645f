"""The round loop: one jitted function runs a whole communication round.

    round_fn(state, data) -> (state, metrics)

runs `algorithm.prepare_round`, a `lax.scan` of `collaborative_update` over the
round's public batches (augmented and normalised on the fly), and
`local_update`, reading the round index and the run's PRNG key from the state
(`state["round"]`, `state["rng"]`): key_r = fold_in(run_key, r), split per phase
and folded per participant, so a resumed run draws the same numbers.
`run_rounds` scans `round_fn` over several rounds in one call.

`TRACE_COUNTS[name]` counts how often a round function was traced (Python side
effects run only while tracing); tests use it to guard against recompilation.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.algorithms.base import Algorithm, FederatedArrays, normalizer
from fedjax_het.data import augment
from fedjax_het.engine import batching

TRACE_COUNTS: collections.Counter[str] = collections.Counter()

PUBLIC_AUGMENTATIONS = ("weak", "strong", "none")


def public_pipeline(augmentation: str, mean, std, *, crop: str = "pad") -> Callable[..., jax.Array]:
  """(key, uint8 images) -> augmented, normalised float images (FCCL+ Sec. 4.1)."""
  if augmentation not in PUBLIC_AUGMENTATIONS:
    raise ValueError(f"collaborative.augmentation must be one of {PUBLIC_AUGMENTATIONS}, "
                     f"got {augmentation!r}.")
  normalize = normalizer(mean, std)

  def prepare(key, images):
    x = images.astype(jnp.float32) / 255.0
    if augmentation == "weak":
      x = augment.weak_augment(key, x, crop=crop)
    elif augmentation == "strong":
      x = augment.strong_augment(key, x, crop=crop)
    return normalize(x)

  return prepare


def initial_state(algorithm: Algorithm, key: jax.Array, data: FederatedArrays) -> dict[str, Any]:
  """`algorithm.init` plus the engine's bookkeeping (round counter, run key)."""
  init_key, run_key = jax.random.split(key)
  state = dict(algorithm.init(init_key, data))
  state["round"] = jnp.zeros((), jnp.int32)
  state["rng"] = jax.random.key_data(run_key)
  return state


def make_round_fn(algorithm: Algorithm, *, public_batch_size: int, public_epochs: int,
                  num_public: int, public_prepare: Callable[..., jax.Array],
                  name: str = "round") -> Callable[[Any, FederatedArrays], tuple[Any, Any]]:
  """Builds the (un-jitted) pure round function.

  Args:
    algorithm: the method.
    public_batch_size, public_epochs: batches of the collaborative phase.
    num_public: N0, rows of the public set (0 or no collaborative_update: no
      collaborative phase).
    public_prepare: (key, uint8 batch) -> model input (`public_pipeline`).
    name: key of `TRACE_COUNTS`.

  Returns:
    round_fn(state, data) -> (state, metrics), metrics = {"collaborative":
    {group: {name: (slots,)}} averaged over the round's batches, "local": ...}.
  """
  collaborative = algorithm.collaborative_update is not None and num_public > 0

  def round_fn(state, data):
    TRACE_COUNTS[name] += 1
    round_index = state["round"]
    key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), round_index)
    order_key, augment_key, collab_key, local_key = jax.random.split(key, 4)
    bookkeeping = {"round": round_index, "rng": state["rng"]}
    alg_state = {k: v for k, v in state.items() if k not in bookkeeping}
    alg_state = algorithm.prepare_round(alg_state, round_index)
    metrics = {}
    if collaborative:
      batches = batching.public_batches(order_key, num_public, batch_size=public_batch_size,
                                        epochs=public_epochs)

      def body(carry, inputs):
        t, rows = inputs
        images = public_prepare(jax.random.fold_in(augment_key, t), data.public[rows])
        return algorithm.collaborative_update(carry, images, jax.random.fold_in(collab_key, t),
                                              round_index)

      alg_state, per_batch = jax.lax.scan(body, alg_state,
                                          (jnp.arange(batches.shape[0]), batches))
      metrics["collaborative"] = jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), per_batch)
    alg_state, metrics["local"] = algorithm.local_update(alg_state, data.groups, local_key,
                                                         round_index)
    return {**alg_state, "round": round_index + 1, "rng": state["rng"]}, metrics

  return round_fn


def make_run_rounds(round_fn: Callable[[Any, FederatedArrays], tuple[Any, Any]],
                    num_rounds: int) -> Callable[[Any, FederatedArrays], tuple[Any, Any]]:
  """`num_rounds` rounds as one `lax.scan` (metrics stacked on a leading axis)."""
  def run_rounds(state, data):
    return jax.lax.scan(lambda s, _: round_fn(s, data), state, None, length=num_rounds)
  return run_rounds

"""The public-batch block: a `lax.scan` of a method's step over unlabeled public batches.

Methods that communicate through a shared public set (FCCL, FCCL+, and later
FedMD, FedDF, RHFL) call `public_phase` inside their round:

    state, metrics = public.public_phase(step, state, data.public, spec,
                                         order_key=k1, augment_key=k2, step_key=k3)

with `step(state, images, key) -> (state, metrics)` run on every batch of
`spec.epochs` passes over the public set (fresh permutation per pass, full
batches; see `batching.public_batches`), each batch augmented and normalised on
the fly (`public_pipeline`). Metrics are averaged over the batches.

`default_config()` / `validate_config()` are the block's config section
(`config.collaborative`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import validation
from fedjax_het.data import augment
from fedjax_het.engine import batching
from fedjax_het.engine.optim import OPTIMIZERS

AUGMENTATIONS = ("weak", "strong", "none")
CROPS = ("pad", "resized")


def public_pipeline(augmentation: str, mean, std, *, crop: str = "pad"
                    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """(key, uint8 images) -> augmented, normalised float images (FCCL+ Sec. 4.1)."""
  if augmentation not in AUGMENTATIONS:
    raise ValueError(f"collaborative.augmentation must be one of {AUGMENTATIONS}, "
                     f"got {augmentation!r}.")
  normalize = augment.normalizer(mean, std)

  def prepare(key, images):
    x = images.astype(jnp.float32) / 255.0
    if augmentation == "weak":
      x = augment.weak_augment(key, x, crop=crop)
    elif augmentation == "strong":
      x = augment.strong_augment(key, x, crop=crop)
    return normalize(x)

  return prepare


class PublicSpec(NamedTuple):
  """Static shape of a public phase.

  Attributes:
    batch_size: images per batch (capped at the public set's size, at least 2).
    epochs: passes over the public set per round (0: no public phase).
    prepare: (key, uint8 batch) -> model input (`public_pipeline`).
  """
  batch_size: int
  epochs: int
  prepare: Callable[[jax.Array, jax.Array], jax.Array]


def make_spec(section: ml_collections.ConfigDict, mean, std) -> PublicSpec:
  """A `PublicSpec` from a `config.collaborative`-style section."""
  return PublicSpec(batch_size=int(section.batch_size), epochs=int(section.epochs),
                    prepare=public_pipeline(section.augmentation, mean, std,
                                            crop=section.crop))


def has_public_phase(spec: PublicSpec, public: Any) -> bool:
  """Static: whether the round has public batches (a non-empty set and epochs > 0)."""
  return spec.epochs > 0 and public.shape[0] > 0


def public_phase(step: Callable[[Any, jax.Array, jax.Array], tuple[Any, Any]], state: Any,
                 public: jax.Array, spec: PublicSpec, *, order_key: jax.Array,
                 augment_key: jax.Array, step_key: jax.Array) -> tuple[Any, Any]:
  """Runs `step` over the round's public batches as one `lax.scan`.

  Args:
    step: (state, images (B, 32, 32, 3) float, batch key) -> (state, metrics).
    state: the carry.
    public: (N0, 32, 32, 3) uint8 public set (N0 > 0, static).
    spec: batch size, epochs, preprocessing.
    order_key: draws the batch order (one permutation per epoch).
    augment_key: batch t is augmented with fold_in(augment_key, t).
    step_key: batch t's step gets fold_in(step_key, t).

  Returns:
    (state, metrics averaged over the batches).
  """
  num_public = public.shape[0]
  batches = batching.public_batches(order_key, num_public,
                                    batch_size=min(spec.batch_size, max(num_public, 2)),
                                    epochs=spec.epochs)

  def body(carry, inputs):
    t, rows = inputs
    images = spec.prepare(jax.random.fold_in(augment_key, t), public[rows])
    return step(carry, images, jax.random.fold_in(step_key, t))

  state, per_batch = jax.lax.scan(body, state, (jnp.arange(batches.shape[0]), batches))
  return state, jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), per_batch)


def default_config() -> ml_collections.ConfigDict:
  """`config.collaborative`: the public phase (FCCL+ paper: 1 epoch of 512, Adam 1e-3)."""
  return ml_collections.ConfigDict({
      "epochs": 1,
      "batch_size": 512,
      "lr": 1e-3,
      "lr_decay": 0.9,            # linear decay to lr * (1 - lr_decay) over the run
      "optimizer": "adam",
      "optimizer_reset": "batch",  # fresh optimiser per public batch (the FCCL+ code)
      "augmentation": "weak",
      "crop": "pad",
  })


OPTIMIZER_RESETS = ("batch", "round", "never")


def validate_config(config: ml_collections.ConfigDict, section: str = "collaborative") -> None:
  """Checks `config.<section>` (the fields of `default_config`)."""
  validation.require_section(config, section)
  v = validation
  v.check(config, f"{section}.epochs", v.int_at_least(0), "an integer >= 0")
  v.check(config, f"{section}.batch_size", v.int_at_least(2),
          "an integer >= 2 (the cross-correlation standardises over the batch)")
  v.check(config, f"{section}.lr", v.positive, "a number > 0")
  v.check(config, f"{section}.lr_decay", lambda x: 0 <= x < 1, "a number in [0, 1)")
  v.check(config, f"{section}.optimizer", v.choice(OPTIMIZERS), f"one of {OPTIMIZERS}")
  v.check(config, f"{section}.optimizer_reset", v.choice(OPTIMIZER_RESETS),
          f"one of {OPTIMIZER_RESETS}")
  v.check(config, f"{section}.augmentation", v.choice(AUGMENTATIONS), f"one of {AUGMENTATIONS}")
  v.check(config, f"{section}.crop", v.choice(CROPS), f"one of {CROPS}")

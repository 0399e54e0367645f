"""Local training of one client as a single `lax.scan` (vmap it over a group).

`make_local_trainer` turns a per-batch loss into a function that runs several
epochs of minibatch optimisation over a client's padded private data:
per-epoch random orders, static-shape masked batches (see `batching`), a fresh
optimiser state per call (the reference code builds a new optimiser every
round), and a per-epoch learning rate. No Python runs per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_het.engine import batching
from fedjax_het.engine.optim import apply_updates

# loss_fn(params, batch_stats, images, labels, mask, rng, aux)
#   -> (scalar loss, (new batch_stats, {metric name: scalar}))
LocalLossFn = Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]


def make_local_trainer(*, loss_fn: LocalLossFn, optimizer: optax.GradientTransformation,
                       epochs: int, batch_size: int, max_size: int,
                       preprocess: Callable[[jax.Array], jax.Array]) -> Callable[..., Any]:
  """Builds `train(variables, aux, images, labels, size, key, learning_rates)`.

  Args:
    loss_fn: per-batch loss (see `LocalLossFn`); `aux` is passed through
      (teachers, global model, prototypes...).
    optimizer: learning-rate-free transformation (`optim.make_optimizer`).
    epochs: passes over the client's data.
    batch_size: static batch size.
    max_size: padded row count N of the client arrays.
    preprocess: uint8 (B, 32, 32, 3) -> float model input (normalisation,
      augmentation-free).

  Returns:
    train(variables, aux, images (N,32,32,3) uint8, labels (N,), size (),
    key, learning_rates (epochs,)) -> (new variables, metrics) where metrics
    are means over the steps that held data.
  """
  steps = batching.steps_per_epoch(max_size, batch_size)
  total_steps = epochs * steps

  def train(variables, aux, images, labels, size, key, learning_rates):
    images, labels = jnp.asarray(images), jnp.asarray(labels)
    plan_key, step_key = jax.random.split(key)
    plan = batching.plan_epochs(plan_key, size, max_size=max_size, epochs=epochs,
                                batch_size=batch_size)
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = optimizer.init(params)

    def step(carry, t):
      params, batch_stats, opt_state = carry
      rows, mask, active = batching.batch_indices(plan, t, batch_size=batch_size, steps=steps)
      inputs = preprocess(images[rows])
      (loss, (new_stats, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch_stats, inputs, labels[rows], mask, jax.random.fold_in(step_key, t), aux)
      new_params, new_opt = apply_updates(optimizer, params, grads, opt_state,
                                          learning_rates[t // steps])
      keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(active, n, o), new, old)
      carry = (keep(new_params, params), keep(new_stats, batch_stats), keep(new_opt, opt_state))
      return carry, ({"loss": loss, **metrics}, active)

    (params, batch_stats, _), (metrics, active) = jax.lax.scan(
        step, (params, batch_stats, opt_state), jnp.arange(total_steps))
    count = jnp.maximum(jnp.sum(active.astype(jnp.float32)), 1.0)
    # Skipped steps may hold NaN (BatchNorm over an empty batch); select, do not multiply.
    means = {name: jnp.sum(jnp.where(active, values, 0.0)) / count
             for name, values in metrics.items()}
    return {"params": params, "batch_stats": batch_stats}, means

  return train

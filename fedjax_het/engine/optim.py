"""Optimisers as the reference code builds them, with the learning rate supplied per call.

PyTorch `Adam(lr, weight_decay=wd)` adds `wd * w` to the gradient before the
Adam moments (L2 regularisation, not AdamW); `optax.add_decayed_weights` placed
before `scale_by_adam` reproduces that. The learning rate is applied outside the
transformation so it can be a traced per-round value (the linear decay of the
FCCL+ code) without rebuilding the optimiser.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adam", "sgd")


def make_optimizer(name: str, *, weight_decay: float = 0.0, momentum: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """A learning-rate-free gradient transformation (multiply its output by -lr).

  Args:
    name: "adam" (torch.optim.Adam semantics) or "sgd" (with optional momentum,
      torch semantics: v = momentum * v + g).
    weight_decay: L2 coefficient added to the gradient (torch `weight_decay`).
    momentum: SGD momentum.
    b1, b2, eps: Adam constants (torch defaults).

  Returns:
    An optax transformation whose updates are to be scaled by -lr.
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}.")
  parts = []
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  if name == "adam":
    parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
  elif momentum:
    parts.append(optax.trace(decay=momentum, nesterov=False))
  return optax.chain(*parts) if parts else optax.identity()


def apply_updates(optimizer: optax.GradientTransformation, params: Any, grads: Any,
                  opt_state: Any, learning_rate: jax.Array | float) -> tuple[Any, Any]:
  """One optimiser step: returns (new_params, new_opt_state)."""
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = jax.tree_util.tree_map(lambda p, u: p - learning_rate * u, params, updates)
  return params, opt_state


def linear_decay(base_lr: float, round_index: jax.Array, num_rounds: int,
                 decay: float = 0.9) -> jax.Array:
  """Learning rate of round `round_index` under the FCCL/FCCL+ code's linear decay.

  The code sets lr = lr0 * (1 - decay * e / E) AFTER round e, so round r runs
  with lr0 * (1 - decay * max(r - 1, 0) / E): rounds 0 and 1 both use lr0.
  `decay=0` gives a constant rate.
  """
  done = jnp.maximum(jnp.asarray(round_index, jnp.float32) - 1.0, 0.0)
  return base_lr * (1.0 - decay * done / num_rounds)

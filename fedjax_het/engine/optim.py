"""Optimisers as the reference code builds them, and learning-rate schedules, in optax.

PyTorch `Adam(lr, weight_decay=wd)` adds `wd * w` to the gradient before the
Adam moments (L2 regularisation, not AdamW); `optax.add_decayed_weights` placed
before `scale_by_adam` reproduces that. The learning rate is an
`optax.inject_hyperparams` hyper-parameter, so a traced per-round or per-epoch
value (the linear decay of the FCCL/FCCL+ code, a cosine pretraining schedule)
is set in the optimiser state without rebuilding the optimiser, and a "fresh
optimiser per batch" (the FCCL+ code's collaborative phase) is `tx.init` with
that rate.

Schedules are optax schedules of the ROUND index (or epoch index) rather than
of the step count: the FCCL/FCCL+ code changes the learning rate once per round.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adam", "sgd")


def make_optimizer(name: str, *, weight_decay: float = 0.0, momentum: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   decay_mask: Any = None) -> optax.GradientTransformation:
  """The torch-semantics optimiser with an injectable `learning_rate` hyper-parameter.

  Args:
    name: "adam" (torch.optim.Adam semantics) or "sgd" (with optional momentum,
      torch semantics: v = momentum * v + g).
    weight_decay: L2 coefficient added to the gradient (torch `weight_decay`).
    momentum: SGD momentum.
    b1, b2, eps: Adam constants (torch defaults).
    decay_mask: optional pytree of bools (or params -> such a pytree) saying
      which parameters get weight decay (`optax.add_decayed_weights`' mask),
      e.g. False on frozen parameters, which then never move (their gradient
      is zero, and so are SGD's, momentum's and Adam's updates).

  Returns:
    `optax.inject_hyperparams` transformation; set the rate with
    `with_learning_rate` (or use `apply_updates`).
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}.")

  def build(learning_rate):
    parts = []
    if weight_decay:
      parts.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
    if name == "adam":
      parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    elif momentum:
      parts.append(optax.trace(decay=momentum, nesterov=False))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)

  return optax.inject_hyperparams(build)(learning_rate=0.0)


def with_learning_rate(opt_state: Any, learning_rate: jax.Array | float) -> Any:
  """The `inject_hyperparams` state with its learning rate replaced."""
  hyperparams = dict(opt_state.hyperparams)
  hyperparams["learning_rate"] = jnp.asarray(learning_rate,
                                             jnp.asarray(hyperparams["learning_rate"]).dtype)
  return opt_state._replace(hyperparams=hyperparams)


def apply_updates(optimizer: optax.GradientTransformation, params: Any, grads: Any,
                  opt_state: Any, learning_rate: jax.Array | float) -> tuple[Any, Any]:
  """One optimiser step at `learning_rate`: returns (new_params, new_opt_state)."""
  updates, opt_state = optimizer.update(grads, with_learning_rate(opt_state, learning_rate),
                                        params)
  return optax.apply_updates(params, updates), opt_state


def round_decay_schedule(base_lr: float, num_rounds: int, decay: float = 0.9) -> optax.Schedule:
  """The FCCL/FCCL+ code's linear decay as an optax schedule of the round index.

  The code sets lr = lr0 * (1 - decay * e / E) AFTER round e, so round r runs
  with lr0 * (1 - decay * max(r - 1, 0) / E): rounds 0 and 1 both use lr0.
  `decay=0` gives a constant rate.

  The decay is applied as a multiplier of `base_lr` (a linear schedule from 1
  to 1 - decay) so that rounds 0 and 1 use exactly lr0 in float32: the
  collaborative phase's fresh Adam per batch is sign-SGD, which turns a 1-ulp
  change of the rate into different rounding noise downstream.
  """
  if not decay:
    return optax.constant_schedule(base_lr)
  multiplier = optax.linear_schedule(init_value=1.0, end_value=1.0 - decay,
                                     transition_steps=num_rounds, transition_begin=1)
  return lambda round_index: base_lr * multiplier(round_index)


def exponential_round_schedule(base_lr: float, rate: float,
                               min_lr: float = 0.0) -> optax.Schedule:
  """Per-round exponential decay with a floor, as the FedFusion code decays its rate.

  The FedFusion code multiplies the rate by `rate` after every round while it
  is above `min_lr`, so round r runs with base_lr * rate ** min(r, n), n the
  first number of decays that brings it to `min_lr` or below (the last step
  may undershoot `min_lr`, as in the code). `min_lr=0`: no floor.

  Args:
    base_lr: rate of round 0.
    rate: factor per round, in (0, 1].
    min_lr: the floor (>= 0).

  Returns:
    An optax schedule of the 0-based round index.
  """
  if not 0 < rate <= 1:
    raise ValueError(f"`rate` must be in (0, 1], got {rate!r}.")
  if min_lr < 0:
    raise ValueError(f"`min_lr` must be >= 0, got {min_lr!r}.")
  last = None  # the number of decays after which the rate stays (None: never stops)
  if rate < 1 and min_lr > 0:
    last, lr = 0, base_lr
    while lr > min_lr:  # the code's loop, in float64
      lr *= rate
      last += 1

  def schedule(round_index):
    r = jnp.asarray(round_index, jnp.float32)
    if last is not None:
      r = jnp.minimum(r, float(last))
    return base_lr * jnp.power(jnp.float32(rate), r)

  return schedule


def linear_decay(base_lr: float, round_index: jax.Array, num_rounds: int,
                 decay: float = 0.9) -> jax.Array:
  """`round_decay_schedule(base_lr, num_rounds, decay)(round_index)`."""
  return round_decay_schedule(base_lr, num_rounds, decay)(round_index)


def cosine_epoch_rates(base_lr: float, min_lr: float, epochs: int) -> jax.Array:
  """Per-epoch cosine annealing from base_lr towards min_lr, (epochs,) rates.

  timm's CosineLRScheduler with t_initial=epochs stepped per epoch (the FCCL
  code's pretraining): min_lr + (base_lr - min_lr) (1 + cos(pi e / epochs)) / 2.
  The cosine factor is `optax.cosine_decay_schedule(1, epochs)`; scaling it
  outside the schedule keeps the float32 rates bit-identical to the formula
  (FCCL's pretraining feeds a sign-SGD-like phase that amplifies 1-ulp changes).
  """
  shape = optax.cosine_decay_schedule(init_value=1.0, decay_steps=epochs)
  return min_lr + (base_lr - min_lr) * jax.vmap(shape)(jnp.arange(epochs))

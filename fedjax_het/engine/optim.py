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
A schedule that depends on the run's number of rounds E (`round_decay_schedule`)
reads E as a value of the program: inside `run_length(num_rounds)` (the engine
enters it around every round with the run's E as a traced int32 scalar,
`FederatedArrays.num_rounds`) it uses that E instead of the one it was built
with, so one round's program is the same for every E and a run of another
length reuses the traced and compiled round.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
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


_RUN_LENGTH: contextvars.ContextVar[Any] = contextvars.ContextVar("fedjax_het_run_length",
                                                                   default=None)


@contextlib.contextmanager
def run_length(num_rounds: int | jax.Array | None) -> Iterator[None]:
  """Within the block, schedules of the run's length read E = `num_rounds`.

  `num_rounds`: the run's number of rounds, typically an int32 scalar traced
  as an argument of the round's program; None leaves each schedule its own E.
  """
  token = _RUN_LENGTH.set(num_rounds)
  try:
    yield
  finally:
    _RUN_LENGTH.reset(token)


def num_rounds_in_run(default: int | jax.Array) -> int | jax.Array:
  """The E of the enclosing `run_length` block, or `default` outside one."""
  value = _RUN_LENGTH.get()
  return default if value is None else value


def round_decay_schedule(base_lr: float, num_rounds: int | jax.Array,
                         decay: float = 0.9) -> optax.Schedule:
  """The FCCL/FCCL+ code's linear decay as an optax schedule of the round index.

  The code sets lr = lr0 * (1 - decay * e / E) AFTER round e, so round r runs
  with lr0 * (1 - decay * max(r - 1, 0) / E): rounds 0 and 1 both use lr0.
  `decay=0` gives a constant rate. E is `num_rounds`, or inside a `run_length`
  block the E it gives (then a value of the program rather than a constant).

  The decay is applied as a multiplier of `base_lr` (optax's `linear_schedule`
  from 1 to 1 - decay, written out so that E may be traced) so that rounds 0
  and 1 use exactly lr0 in float32: the collaborative phase's fresh Adam per
  batch is sign-SGD, which turns a 1-ulp change of the rate into different
  rounding noise downstream. For the same reason a traced E gives the bits of
  a program with E a constant: XLA compiles `count / E` for a constant E as
  `count * (1 / E)` (its algebraic simplifier), so with E traced the schedule
  multiplies by the float32 reciprocal itself (`divide_as_by_constant`).
  """
  if not decay:
    return optax.constant_schedule(base_lr)
  end = 1.0 - decay

  def schedule(round_index):
    total = num_rounds_in_run(num_rounds)
    # optax.linear_schedule(1.0, end, transition_steps=total, transition_begin=1)(round_index)
    count = jnp.clip(round_index - 1, 0, total)
    fraction = 1 - divide_as_by_constant(count, total)
    return base_lr * ((1.0 - end) * fraction + end)

  return schedule


def divide_as_by_constant(numerator: Any, denominator: int | jax.Array) -> jax.Array:
  """`numerator / denominator` in float32 as a jitted program computes it for a constant
  denominator: a Python int divides (XLA turns it into a multiplication by the reciprocal
  when it compiles a program), an array (traced) multiplies by its float32 reciprocal."""
  if isinstance(denominator, int):
    return numerator / denominator
  return numerator * (1.0 / jnp.asarray(denominator, jnp.float32))


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


def linear_decay(base_lr: float, round_index: jax.Array, num_rounds: int | jax.Array,
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

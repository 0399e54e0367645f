"""The local-training block: epochs of minibatch training of a set of participants.

`make_local_trainer` turns a per-batch loss into a function that runs several
epochs of minibatch optimisation over ONE client's padded private data as a
single loop: a `lax.scan` over the padded layout (every client runs as many
steps as the largest; steps past its data are no-ops, the form that vmaps)
or, with `exact_steps=True` (what `train_clients(sequential=True)` uses), a
`lax.fori_loop` over exactly its ceil(size / batch) steps per epoch:
per-epoch random orders, static-shape masked batches (see
`batching`), a fresh optimiser state per call (the reference code builds a new
optimiser every round), and a per-epoch learning rate. No Python runs per
batch. `train_clients` vmaps a trainer over the participants of a group (all
its slots, or a sampled cohort gathered with `engine.cohort`), and
`make_group_trainers` builds one trainer per architecture group.

`default_config()` / `validate_config()` are the config section of this block
(`config.local`), for the methods that train locally.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_het import validation
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import batching
from fedjax_het.engine.clients import vmap_slots
from fedjax_het.engine.optim import OPTIMIZERS, apply_updates, make_optimizer
from fedjax_het.errors import ConfigError

# loss_fn(params, batch_stats, images, labels, mask, rng, aux[, epoch])
#   -> (scalar loss, (new batch_stats, {metric name: scalar}))
# `epoch` (int32 scalar, the local epoch of the step, from 0) is passed only to trainers built
# with `with_epoch=True` (losses with an epoch schedule, e.g. FCCL+'s KD-then-FNTD).
LocalLossFn = Callable[..., tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]]


def make_local_trainer(*, loss_fn: LocalLossFn, optimizer: optax.GradientTransformation,
                       epochs: int, batch_size: int, max_size: int,
                       preprocess: Callable[[jax.Array], jax.Array],
                       with_epoch: bool = False) -> Callable[..., Any]:
  """Builds `train(variables, aux, images, labels, size, key, learning_rates, *, exact_steps)`.

  Args:
    loss_fn: per-batch loss (see `LocalLossFn`); `aux` is passed through
      (teachers, global model, prototypes...).
    optimizer: learning-rate-free transformation (`optim.make_optimizer`).
    epochs: passes over the client's data.
    batch_size: static batch size.
    max_size: padded row count N of the client arrays.
    preprocess: uint8 (B, 32, 32, 3) -> float model input (normalisation,
      augmentation-free).
    with_epoch: pass the step's local epoch (int32, from 0) to `loss_fn` as
      its last argument.

  Returns:
    train(variables, aux, images (N,32,32,3) uint8, labels (N,), size (),
    key, learning_rates (epochs,)) -> (new variables, metrics) where metrics
    are means over the steps that held data.
  """
  steps = batching.steps_per_epoch(max_size, batch_size)
  total_steps = epochs * steps

  def make_step_gradient(aux, images, labels, size, key):
    """The client's `(params, batch_stats, t) -> ((loss, aux), grads), active` for flat step t
    (its random epoch orders, its batch t, the key fold_in(step key, t))."""
    images, labels = jnp.asarray(images), jnp.asarray(labels)
    plan_key, step_key = jax.random.split(key)
    plan = batching.plan_epochs(plan_key, size, max_size=max_size, epochs=epochs,
                                batch_size=batch_size)

    def step_gradient(params, batch_stats, t):
      rows, mask, active = batching.batch_indices(plan, t, batch_size=batch_size, steps=steps)
      extra = (jnp.asarray(t // steps, jnp.int32),) if with_epoch else ()
      return jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch_stats, preprocess(images[rows]), labels[rows], mask,
          jax.random.fold_in(step_key, t), aux, *extra), active

    return step_gradient

  # The padded layout: every client runs epochs * steps steps, those past its data are no-ops
  # (the form that vmaps; FCCL/FCCL+/SOLO's numbers are pinned to it).
  def train_scan(variables, aux, images, labels, size, key, learning_rates):
    step_gradient = make_step_gradient(aux, images, labels, size, key)
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = optimizer.init(params)

    def step(carry, t):
      params, batch_stats, opt_state = carry
      ((loss, (new_stats, metrics)), grads), active = step_gradient(params, batch_stats, t)
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

  # Exactly the steps that hold data (used one client at a time, `train_clients(sequential=True)`).
  def train_exact(variables, aux, images, labels, size, key, learning_rates):
    step_gradient = make_step_gradient(aux, images, labels, size, key)
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = optimizer.init(params)
    # Only the steps that hold data run: ceil(size / batch) per epoch, as a while loop with
    # this client's own trip count. Step (epoch e, batch b) keeps its flat index
    # t = e * steps + b of the padded layout for its key and learning rate.
    per_epoch = (jnp.asarray(size, jnp.int32) + batch_size - 1) // batch_size

    ((_, (_, metric_shapes)), _), _ = jax.eval_shape(step_gradient, params, batch_stats,
                                                     jnp.zeros((), jnp.int32))
    sums = {"loss": jnp.zeros((), jnp.float32),
            **{name: jnp.zeros(m.shape, m.dtype) for name, m in metric_shapes.items()}}

    def body(k, carry):
      params, batch_stats, opt_state, sums = carry
      epoch = k // jnp.maximum(per_epoch, 1)
      t = epoch * steps + k % jnp.maximum(per_epoch, 1)
      ((loss, (new_stats, metrics)), grads), _ = step_gradient(params, batch_stats, t)
      new_params, new_opt = apply_updates(optimizer, params, grads, opt_state,
                                          learning_rates[epoch])
      sums = {name: sums[name] + value for name, value in {"loss": loss, **metrics}.items()}
      return new_params, new_stats, new_opt, sums

    params, batch_stats, _, sums = jax.lax.fori_loop(
        0, epochs * per_epoch, body, (params, batch_stats, opt_state, sums))
    count = jnp.maximum(epochs * per_epoch, 1).astype(jnp.float32)
    means = {name: value / count for name, value in sums.items()}
    return {"params": params, "batch_stats": batch_stats}, means

  def train(variables, aux, images, labels, size, key, learning_rates, *, exact_steps=False):
    fn = train_exact if exact_steps else train_scan
    return fn(variables, aux, images, labels, size, key, learning_rates)

  return train


#: How a stack of participants trains (`train_clients`): "vmap" together, each as many steps
#: as the longest (a GPU/TPU's layout), "map" one after another, each only its own steps (the
#: least work on a CPU), "auto" by backend (`resolve_client_loop`).
CLIENT_LOOPS = ("auto", "vmap", "map")


def resolve_client_loop(loop: str) -> str:
  """A client-loop setting (`CLIENT_LOOPS`) with "auto" resolved: "map" on a CPU, where vmap
  buys no parallelism and one client after another runs only the steps that hold data; else
  "vmap"."""
  if loop == "auto":
    return "map" if jax.default_backend() == "cpu" else "vmap"
  return loop


def train_clients(trainer: Callable[..., Any], variables: Any, aux: Any, data: Any,
                  keys: jax.Array, learning_rates: jax.Array, *,
                  sequential: bool = False) -> tuple[Any, Any]:
  """Runs `trainer` for every participant of a stack (leading axis), in one program.

  `sequential=False` vmaps over the participants (the point of a GPU/TPU: many
  small clients in one kernel; every client's loop runs as long as the
  longest); a stack of one participant runs unbatched (`clients.vmap_slots`).
  `sequential=True` runs them one after another with `lax.map` (each client
  only its own steps; on a CPU, where vmap buys no parallelism, this does the
  least work).

  Args:
    trainer: a `make_local_trainer` function.
    variables: stacked {"params", "batch_stats"} (P, ...).
    aux: stacked per-participant extras (teachers, ...) with leading axis P.
    data: `GroupData` with leading axis P (a group's slots or a gathered cohort).
    keys: (P,) keys, one per participant (`clients.client_keys`).
    learning_rates: (epochs,) shared per-epoch rates.

  Returns:
    (new stacked variables, {metric: (P,)}).
  """
  num = data.sizes.shape[0]
  chex.assert_tree_shape_prefix((variables, aux, data.images, data.labels, keys), (num,))
  chex.assert_rank(learning_rates, 1)
  if sequential:
    return jax.lax.map(lambda args: trainer(*args, learning_rates, exact_steps=True),
                       (variables, aux, data.images, data.labels, data.sizes, keys))
  return vmap_slots(trainer, in_axes=(0, 0, 0, 0, 0, 0, None))(
      variables, aux, data.images, data.labels, data.sizes, keys, learning_rates)


def make_group_trainers(setup: Any, loss_for_group: Callable[[Any], LocalLossFn], *,
                        optimizer: str, weight_decay: float, epochs: int | Mapping[str, int],
                        batch_size: int, with_epoch: bool = False, momentum: float = 0.0,
                        decay_mask: Any = None) -> dict[str, Callable[..., Any]]:
  """One local trainer per architecture group of `setup` (private-data normalisation).

  `epochs`: one number for every group, or {group name: epochs} (`group_epochs`).
  `momentum` (SGD) and `decay_mask` (which parameters get weight decay) are
  `optim.make_optimizer`'s.
  """
  preprocess = normalizer(setup.private_mean, setup.private_std)
  tx = make_optimizer(optimizer, weight_decay=weight_decay, momentum=momentum,
                      decay_mask=decay_mask)
  return {group.name: make_local_trainer(
      loss_fn=loss_for_group(group), optimizer=tx,
      epochs=epochs if isinstance(epochs, int) else epochs[group.name], batch_size=batch_size,
      max_size=setup.max_sizes[group.name], preprocess=preprocess, with_epoch=with_epoch)
      for group in setup.groups}


def group_epochs(field: str, value: Any, setup: Any) -> dict[str, int]:
  """{group name: local epochs} from `config.<field>`: one number, or one per participant.

  A per-participant sequence (participant order, e.g. the FCCL code's Digits
  epochs (40, 35, 3, 4)) needs as many entries as participants, and the members
  of one architecture group (trained in one vmapped program) must share a value.
  """
  if isinstance(value, int) and not isinstance(value, bool):
    return {group.name: int(value) for group in setup.groups}
  values = tuple(value)
  if len(values) != setup.num_participants:
    raise ConfigError(f"config.{field} must be one integer or one per participant "
                      f"({setup.num_participants}), got {values!r}.")
  out = {}
  for group in setup.groups:
    members = {int(values[i]) for i in group.clients}
    if len(members) != 1:
      raise ConfigError(f"config.{field} must give the participants of architecture group "
                        f"{group.name!r} (participants {group.clients}) one value, got "
                        f"{values!r}.")
    out[group.name] = members.pop()
  return out


def default_config() -> ml_collections.ConfigDict:
  """`config.local`: the local optimiser (FCCL+ paper: Adam 1e-3, L2 1e-5, 20 epochs of 256)."""
  return ml_collections.ConfigDict({
      "epochs": 20,
      "batch_size": 256,
      "lr": 1e-3,
      "lr_decay": 0.9,      # linear decay to lr * (1 - lr_decay) over the run; 0: constant
      "weight_decay": 1e-5,
      "optimizer": "adam",
  })


def validate_config(config: ml_collections.ConfigDict, section: str = "local", *,
                    per_participant_epochs: bool = False) -> None:
  """Checks `config.<section>` (the fields of `default_config`).

  `per_participant_epochs`: the method reads `<section>.epochs` with `group_epochs`, so it may
  also be a sequence of integers >= 1, one per participant.
  """
  validation.require_section(config, section)
  if per_participant_epochs:
    one = validation.int_at_least(1)
    validation.check(
        config, f"{section}.epochs",
        lambda v: one(v) or (isinstance(v, (tuple, list)) and len(v) > 0
                             and all(one(e) for e in v)),
        "an integer >= 1 or a tuple of integers >= 1, one per participant")
  else:
    validation.check(config, f"{section}.epochs", validation.int_at_least(1), "an integer >= 1")
  validation.check(config, f"{section}.batch_size", validation.int_at_least(1),
                   "an integer >= 1")
  validation.check(config, f"{section}.lr", validation.positive, "a number > 0")
  validation.check(config, f"{section}.lr_decay", lambda v: 0 <= v < 1, "a number in [0, 1)")
  validation.check(config, f"{section}.weight_decay", lambda v: v >= 0, "a number >= 0")
  validation.check(config, f"{section}.optimizer", validation.choice(OPTIMIZERS),
                   f"one of {OPTIMIZERS}")

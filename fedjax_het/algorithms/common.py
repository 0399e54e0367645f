"""Pieces several methods share: cross-group targets and participant-order conversions, forwards,
evaluation, diagnostics, communication bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import evaluation, losses, models, plots, validation
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import local, public, rounds
from fedjax_het.engine.api import Algorithm, Diagnostics, Setup, Stage
from fedjax_het.engine.clients import (ClientGroup, client_keys, init_group_variables,
                                       slot_active, slot_ids, where_active)
from fedjax_het.engine.optim import apply_updates, make_optimizer, round_decay_schedule
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


def to_participants(per_group: Mapping[str, jax.Array], setup: Setup) -> jax.Array:
  """{group: (slots, ...)} -> (K, ...) in participant order (padding slots dropped)."""
  first = next(iter(per_group.values()))
  out = jnp.zeros((setup.num_participants, *first.shape[1:]), first.dtype)
  for group in setup.groups:
    out = out.at[jnp.asarray(group.clients)].set(per_group[group.name][:group.num_clients])
  return out


def to_slots(per_participant: jax.Array, group: ClientGroup) -> jax.Array:
  """(K, ...) in participant order -> the group's (slots, ...); padding slots get 0."""
  slots = jnp.asarray(list(group.clients) + [0] * (group.num_slots - group.num_clients))
  values = per_participant[slots]
  active = jnp.asarray(slot_active(group)).reshape((-1,) + (1,) * (values.ndim - 1))
  return jnp.where(active, values, 0.0)


def forward_fn(group: ClientGroup, *, train: bool, on_public: bool = False
               ) -> Callable[..., tuple[jax.Array, jax.Array, Any]]:
  """(params, batch_stats, images, rng, mask) -> (features, logits, new batch_stats).

  `on_public`: the forward pass of the shared public batch, with the group's
  `model_on_public` (same variables, possibly another convolution
  implementation); else `group.model`.
  """
  module = group.model_on_public if on_public else group.model

  def forward(params, batch_stats, images, rng=None, mask=None):
    variables = {"params": params, "batch_stats": batch_stats}
    features, logits, new_variables = models.apply_model(module, variables, images,
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
    forward = forward_fn(group, train=True, on_public=True)
    batch_stats = state["groups"][group.name]["variables"]["batch_stats"]
    # jax.vmap even for a one-slot group (not `clients.vmap_slots`): with the unbatched forward
    # XLA:CPU schedules the collaborative step's backward pass through all four backbones with
    # more live buffers. The full FCCL+ Digits round with custom_vjp convolutions was estimated
    # at 13.8 GiB against 9.4 GiB vmapped (2-core CPU, memory scheduler), which decides whether
    # the paper setting fits a 24 GiB machine; the vmap costs about 2 s of tracing on the quick
    # config (10.7 s -> 12.6 s).
    features[group.name], logits[group.name], stats[group.name] = jax.vmap(
        forward, in_axes=(0, 0, None, 0))(params[group.name], batch_stats, images,
                                          client_keys(key, ids[group.name]))
  return features, logits, stats


def consensus_step(setup: Setup, state: Any, images: jax.Array, key: jax.Array,
                   loss_fn: Callable[[jax.Array, jax.Array], tuple[jax.Array, dict[str, Any]]],
                   optimizer: Any, learning_rate: jax.Array, *, keep_optimizer: bool = False,
                   target_fn: Callable[[dict[str, jax.Array]], jax.Array] | None = None
                   ) -> tuple[Any, dict[str, Any]]:
  """One optimiser step of every participant toward the mean logits on a public batch.

  The logit-exchange step of FedMD (digest) and FedDF (distillation): every
  participant's train-mode logits Z_i on the shared batch come from one
  forward pass (`public_forward`); the target is Z_bar = 1/K sum_i Z_i over
  all K real participants, self included, detached (`mean_over_participants`);
  participant i descends loss_fn(Z_i, Z_bar). Each loss depends only on its
  own participant's parameters, so one gradient of the sum over participants
  gives every participant's own gradient: all participants update
  simultaneously from the models they held at the start of the batch. Padding
  slots contribute nothing and keep their variables.

  Args:
    setup: the run's groups.
    state: algorithm state with state["groups"][group]["variables"] (and
      ["public_opt"] when `keep_optimizer`).
    images: (B, 32, 32, 3) preprocessed public batch.
    key: the batch's key (participant p draws from fold_in(key, p)).
    loss_fn: (logits (B, C), target (B, C)) -> (scalar loss, {metric: scalar}).
    optimizer: `optim.make_optimizer` transformation.
    learning_rate: the step's rate.
    keep_optimizer: False: a fresh optimiser state for this step (the
      reference code builds a new optimiser per public batch); True: read and
      write state["groups"][group]["public_opt"].
    target_fn: {group: logits (slots, B, C)} -> the (B, C) target every participant
      descends toward, detached; None: Z_bar (`mean_over_participants`). RCFL passes its
      α-weighted aggregation of the class scores.

  Returns:
    (new state, {group: {metric: (slots,)}}).
  """
  ids = {g.name: jnp.asarray(slot_ids(g, setup.num_participants)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  params = {name: g["variables"]["params"] for name, g in state["groups"].items()}

  def total_loss(params):
    _, logits, stats = public_forward(setup, state, params, images, key, ids)
    target = (mean_over_participants(logits, setup) if target_fn is None
              else jax.lax.stop_gradient(target_fn(logits)))
    total, metrics = 0.0, {}
    for group in setup.groups:
      per_client, metrics[group.name] = jax.vmap(lambda z: loss_fn(z, target))(logits[group.name])
      total = total + jnp.sum(jnp.where(active[group.name], per_client, 0.0))
    return total, (metrics, stats)

  grads, (metrics, stats) = jax.grad(total_loss, has_aux=True)(params)
  return public_update(setup, state, grads, stats, optimizer, learning_rate,
                       keep_optimizer=keep_optimizer), metrics


def public_update(setup: Setup, state: Any, grads: Mapping[str, Any],
                  batch_stats: Mapping[str, Any], optimizer: Any, learning_rate: jax.Array, *,
                  keep_optimizer: bool) -> Any:
  """`state` after one optimiser step of every participant on a public batch.

  Every slot's parameters descend `grads[group]` with `optimizer` at `learning_rate` and take
  `batch_stats[group]`; padding slots keep their variables. `keep_optimizer`: the step reads
  and writes state["groups"][group]["public_opt"]; else it starts from a fresh optimiser
  state.
  """
  groups = {}
  for group in setup.groups:
    g = state["groups"][group.name]
    params = g["variables"]["params"]
    opt_state = g["public_opt"] if keep_optimizer else jax.vmap(optimizer.init)(params)
    new_params, new_opt = jax.vmap(lambda p, gr, o: apply_updates(optimizer, p, gr, o,
                                                                  learning_rate))(
        params, grads[group.name], opt_state)
    new_vars = where_active(jnp.asarray(slot_active(group)),
                            {"params": new_params, "batch_stats": batch_stats[group.name]},
                            g["variables"])
    groups[group.name] = {**g, "variables": new_vars}
    if keep_optimizer:
      groups[group.name]["public_opt"] = new_opt
  return {**state, "groups": groups}


def with_fresh_public_optimizer(state: Any, optimizer: Any, entry: str = "public_opt") -> Any:
  """`state` with a new optimiser state for every slot's parameters in every group's `entry`
  (["public_opt"]: what `consensus_step(keep_optimizer=True)` reads)."""
  groups = {name: {**g, entry: jax.vmap(optimizer.init)(g["variables"]["params"])}
            for name, g in state["groups"].items()}
  return {**state, "groups": groups}


def groups_state(variables: Mapping[str, Any], public_optimizer: Any = None) -> dict[str, Any]:
  """{"groups": {group: {"variables": variables[group]}}}, each group also with a fresh
  ["public_opt"] (`with_fresh_public_optimizer`) when `public_optimizer` is given."""
  state = {"groups": {name: {"variables": v} for name, v in variables.items()}}
  return state if public_optimizer is None else with_fresh_public_optimizer(state,
                                                                            public_optimizer)


def fresh_init(setup: Setup, *, shared: bool = False,
               public_optimizer: Any = None) -> Callable[[jax.Array, Any], Any]:
  """`init(key, data) -> state` of untrained models: every group's variables from `key`
  (`init_group_variables`; `shared`: one initialisation for all participants), as
  `groups_state(variables, public_optimizer)`."""
  def init(key, data):
    del data
    return groups_state({g.name: init_group_variables(g, key, shared=shared,
                                                      num_participants=setup.num_participants)
                         for g in setup.groups}, public_optimizer)

  return init


class PublicAndLocalPieces(NamedTuple):
  """What a public-data method with a cross-entropy local phase builds from
  `config.collaborative` and `config.local` (`public_and_local_pieces`).

  reset: `collaborative.optimizer_reset` ("batch", "round" or "never").
  public_optimizer: the collaborative optimiser.
  public_lr: round -> the collaborative rate (`round_decay_schedule`).
  local_lr: round -> the local rate.
  trainers: every group's cross-entropy trainer of `local.epochs` epochs
    (`local.make_group_trainers`).
  """
  reset: str
  public_optimizer: Any
  public_lr: Callable[[Any], Any]
  local_lr: Callable[[Any], Any]
  trainers: Any


def public_and_local_pieces(config: Any, setup: Setup, *,
                            public_optimizer: Any = None) -> PublicAndLocalPieces:
  """The collaborative optimiser and schedule, the local schedule and the cross-entropy
  trainers of a public-data method (FedMD, FedDF, FedMatch, RCFL); `public_optimizer`
  replaces `make_optimizer(collaborative.optimizer)` (FedDF's weight decay)."""
  col, loc = config.collaborative, config.local
  reset = check_choice("collaborative.optimizer_reset", col.optimizer_reset,
                       public.OPTIMIZER_RESETS)
  return PublicAndLocalPieces(
      reset=reset,
      public_optimizer=(make_optimizer(col.optimizer) if public_optimizer is None
                        else public_optimizer),
      public_lr=round_decay_schedule(float(col.lr), setup.num_rounds, float(col.lr_decay)),
      local_lr=round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay)),
      trainers=local.make_group_trainers(
          setup, cross_entropy_loss_for, optimizer=loc.optimizer,
          weight_decay=float(loc.weight_decay), epochs=int(loc.epochs),
          batch_size=int(loc.batch_size)))


def make_evaluate(config: Any, setup: Setup) -> Callable[..., Any]:
  """The shared evaluator: top-k accuracy of every slot's `variables` on every test domain."""
  return evaluation.make_evaluator(
      setup.groups, batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
      top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean, setup.private_std),
      sizes=setup.test_sizes or None)


def model_dropout_rate(config: Any) -> float:
  """`config.models.dropout_rate`, 0 where the config has no such field."""
  return float(config.models.get("dropout_rate", 0.0))


def with_model_dropout(config: Any, setup: Setup) -> Setup:
  """`setup` whose models have `config.models.dropout_rate` in their tails (`models.with_dropout`).

  The FedAvg CNNs as FedMMD/FedFusion describe them (Yao et al., Sec. 4.1: "a fully connected
  layer with 512 units (with a ReLU activation and random dropout)"; p = 0.2 in the authors'
  FedFusion code, for FedAvg's model (its fusion "none") as for the fused ones): dropout after
  every fully connected hidden layer in local training, with the step's key
  (`apply_model(rng=...)`, folded from the client's key, so a resumed run draws the same
  masks); none in evaluation or in frozen streams (eval mode). Every FedAvg-family method
  applies it (`fedavg_family.make_family`). A rate of 0, or a config without the field, returns
  `setup` itself.
  """
  rate = model_dropout_rate(config)
  if rate == 0.0:
    return setup
  groups = tuple(dataclasses.replace(
      g, model=models.with_dropout(g.model, rate),
      public_model=None if g.public_model is None else models.with_dropout(g.public_model, rate))
      for g in setup.groups)
  return dataclasses.replace(setup, groups=groups)


def validate_model_dropout(config: Any) -> None:
  """Checks `config.models.dropout_rate` where the config has it."""
  if "dropout_rate" in config.models:
    validation.check(config, "models.dropout_rate",
                     lambda v: validation.finite_number(v) and 0 <= v < 1, "a number in [0, 1)")


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


def public_data_algorithm(name: str, config: Any, setup: Setup, init: Callable[..., Any], *,
                          stages: tuple[Stage, ...]) -> Algorithm:
  """The `Algorithm` of a public-data method (FCCL, FCCL+, FedMD, FedDF, RHFL, FedMatch): its
  round is `stages` run in order (`rounds.staged_round`), every participant is evaluated on
  every test domain, and the cross-correlation diagnostics use a public batch of
  `collaborative.batch_size`."""
  return Algorithm(name=name, init=init, round=rounds.staged_round(stages),
                   evaluate=make_evaluate(config, setup),
                   diagnostics=cross_correlation_diagnostics(
                       setup, int(config.collaborative.batch_size)),
                   stages=tuple(stages))


def run_public_phase(step: Callable[..., Any], state: Any, images: jax.Array,
                     spec: public.PublicSpec, metrics: dict[str, Any], *,
                     order_key: jax.Array, augment_key: jax.Array,
                     step_key: jax.Array) -> Any:
  """`public.public_phase` of `step` over `images` when the run has a public phase.

  Records the phase's metrics as metrics["collaborative"]; without public data
  (or with `collaborative.epochs=0`) returns `state` unchanged.
  """
  if not public.has_public_phase(spec, images):
    return state
  state, metrics["collaborative"] = public.public_phase(
      step, state, images, spec, order_key=order_key, augment_key=augment_key,
      step_key=step_key)
  return state


def public_stage(spec: public.PublicSpec, step: Callable[..., Any], *,
                 step_args: Callable[[Any, Any], tuple[Any, ...]] | None = None,
                 reset: Callable[[Any], Any] | None = None,
                 draw_images: Callable[[jax.Array, jax.Array], jax.Array] | None = None
                 ) -> Stage:
  """A public-data method's public phase as the stage "public".

  The stage splits the round's key into (order, augment, step, local) keys, or with
  `draw_images` into five, the fifth drawing the round's images (the keys a round running
  every phase draws). It applies `reset(state)` when given, then runs `step(state, images,
  key, round_index, *step_args(state, data)) -> (state, metrics)` (no extra arguments
  without `step_args`) on each public batch of the round's images: the public set, or
  `draw_images(key, public set)` (FedMD's subset). The phase's metrics become
  metrics["collaborative"] (`run_public_phase`).
  """
  def run(state, data, key, round_index):
    keys = jax.random.split(key, 4 if draw_images is None else 5)
    if reset is not None:
      state = reset(state)
    metrics = {}
    extra = () if step_args is None else tuple(step_args(state, data))
    batch_step = lambda s, images, k: step(s, images, k, round_index, *extra)  # noqa: E731
    images = data.public
    if draw_images is not None and public.has_public_phase(spec, images):
      images = draw_images(keys[4], images)
    state = run_public_phase(batch_step, state, images, spec, metrics, order_key=keys[0],
                             augment_key=keys[1], step_key=keys[2])
    return state, metrics

  return Stage("public", run)


def public_and_local_stages(spec: public.PublicSpec, collaborative_step: Callable[..., Any],
                            local_update: Callable[..., Any], *,
                            reset: Callable[[Any], Any] | None = None) -> tuple[Stage, Stage]:
  """FCCL's and FCCL+'s round as two stages: the public phase, then the local phase.

  Both split the round's key the same way (order, augment, collaborative step, local), so
  the stages draw what one `round` running both phases draws. `collaborative_step(state,
  images, key, round_index)` runs on each public batch (after `reset(state)`, when given);
  `local_update(state, groups' data, key, round_index) -> (state, metrics)` gives
  metrics["local"].
  """
  return (public_stage(spec, collaborative_step, reset=reset),
          local_stage(local_update, key_splits=4, key_index=3))


def public_then_local_algorithm(name: str, config: Any, setup: Setup, init: Callable[..., Any],
                                *, step: Callable[..., Any], local_update: Callable[..., Any],
                                communication_bytes: Callable[[Any, Setup, int], tuple[int, int]],
                                step_args: Callable[[Any, Any], tuple[Any, ...]] | None = None,
                                spec: public.PublicSpec | None = None,
                                public_optimizer: Any = None,
                                draw_images: Callable[[jax.Array, jax.Array], jax.Array]
                                | None = None,
                                local_first: bool = False) -> Algorithm:
  """`public_data_algorithm` of a method whose round is a public stage and a local stage.

  The public stage (`public_stage(spec, step, step_args=..., draw_images=...)`; `spec` None:
  `public.make_spec` of `config.collaborative`) starts from a fresh `public_optimizer` state
  (None: `make_optimizer(collaborative.optimizer)`) every round when
  `collaborative.optimizer_reset` is "round", and records the round's ["server"]["bytes_up" |
  "bytes_down"] = `communication_bytes(config, setup, N0)` (`with_server_bytes`); the local
  stage runs `local_update` on the round's fourth key (`local_stage`). `local_first`: the
  local stage runs first.
  """
  if spec is None:
    spec = public.make_spec(config.collaborative, setup.public_mean, setup.public_std)
  if public_optimizer is None:
    public_optimizer = make_optimizer(config.collaborative.optimizer)
  reset = None
  if config.collaborative.optimizer_reset == "round":
    reset = lambda state: with_fresh_public_optimizer(state, public_optimizer)  # noqa: E731
  stages = (with_server_bytes(public_stage(spec, step, step_args=step_args, reset=reset,
                                           draw_images=draw_images),
                              lambda num_public: communication_bytes(config, setup, num_public)),
            local_stage(local_update, key_splits=4 if draw_images is None else 5,
                        key_index=3))
  return public_data_algorithm(name, config, setup, init,
                               stages=stages[::-1] if local_first else stages)


def local_stage(local_update: Callable[..., Any], *, key_splits: int, key_index: int) -> Stage:
  """A public-data method's local phase as the stage "local": `local_update(state, groups'
  data, jax.random.split(key, key_splits)[key_index], round_index) -> (state, metrics)` on the
  key that a round running every phase gives it; the metrics become metrics["local"]. Each
  participant group trains on its own data (`Stage.groups_independent`)."""
  def run(state, data, key, round_index):
    state, metrics = local_update(state, data.groups,
                                  jax.random.split(key, key_splits)[key_index], round_index)
    return state, {"local": metrics}

  return Stage("local", run, groups_independent=True)


# Communication accounting (FCCL+ Tables II-IV). Every method logs, per round,
# metrics["server"]["bytes_up"] (train/server/bytes_up; client -> server) and
# ["bytes_down"] (server -> client): the bytes of every array the round's protocol moves,
# summed over the participants that take part in the round, counted from shapes and dtypes
# when the round is traced (no computation is added). What is shared before training (the
# public images, GLFC's proxy encoder) and what stays on a participant costs nothing; the
# models' variables count parameters and BatchNorm statistics. The values are float32 scalars,
# exact below 2**24 bytes and rounded to float32 above; `communication_bytes` of every method
# gives the exact integers.


def tree_bytes(tree: Any) -> int:
  """Bytes of the arrays (or `jax.ShapeDtypeStruct`s) of a pytree: sum of size x itemsize."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def model_bytes(model: Any) -> int:
  """Bytes of one model's variables (parameters and BatchNorm statistics), from the shapes."""
  return tree_bytes(jax.eval_shape(lambda: models.init_variables(model, jax.random.key(0))))


def variables_bytes(group: ClientGroup, part: Callable[[Any], Any] | None = None) -> int:
  """Bytes of one model's variables (parameters and BatchNorm statistics), from the shapes.

  `part` (variables -> the communicated part of them) counts only that part.
  """
  shapes = jax.eval_shape(lambda: models.init_variables(group.model, jax.random.key(0)))
  if part is not None:
    shapes = part(shapes)
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))


def public_batches(batch_size: int, epochs: int, num_public: int) -> tuple[int, int]:
  """(B, batches): the size and number of the public batches of one round over `num_public`
  images (`public.public_phase`: B = min(batch_size, max(N0, 2)), epochs x ceil(N0 / B)
  batches; (0, 0) without a public phase)."""
  if epochs <= 0 or num_public <= 0:
    return 0, 0
  batch = min(batch_size, max(num_public, 2))
  return batch, epochs * -(-num_public // batch)


def server_bytes(up: Any, down: Any) -> dict[str, jax.Array]:
  """The round's {"bytes_up", "bytes_down"} server metrics as float32 scalars."""
  return {"bytes_up": jnp.asarray(up, jnp.float32), "bytes_down": jnp.asarray(down, jnp.float32)}


def with_server_bytes(stage: Stage, count: Callable[[int], tuple[int, int]]) -> Stage:
  """`stage` whose metrics also hold "server": `server_bytes(*count(N0))`, N0 the round's
  public images (0 without public data); static, so the stage's computation is unchanged."""
  def run(state, data, key, round_index):
    state, metrics = stage.run(state, data, key, round_index)
    num_public = 0 if data.public is None else int(data.public.shape[0])
    return state, {**metrics, "server": server_bytes(*count(num_public))}

  return Stage(stage.name, run)


def stream_bytes(up: Any, down: Any) -> dict[str, jax.Array]:
  """A task-stream round's flat "train/server/bytes_up" / ".../bytes_down" metrics (float32;
  `up` and `down` may be traced, e.g. when a transfer happens only in some rounds)."""
  return {f"train/server/{name}": value for name, value in server_bytes(up, down).items()}

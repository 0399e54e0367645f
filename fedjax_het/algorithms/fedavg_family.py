"""The FedAvg round with a pluggable local objective: FedAvg and its family (FedProx, MOON,
FedProc, FedRS, FedMMD, FedFusion).

`make_family(config, setup, name=..., objective_for=...)` is the round of
`algorithms.fedavg` (sample a cohort, train it from the server model, average, one server
optimiser step) with a member's local objective; `family_default_config` and
`validate_config` are the sections every member reads (`config.fedavg`, `config.local`,
`config.server`), `the_group` the single architecture group of such a run,
`local_lr_schedule` the local rate per round, `cross_entropy_objective` FedAvg's objective.

Only the sampled clients are computed: their data is gathered into a cohort
axis of size `clients_per_round`, trained in one program and averaged.
`fedavg.client_loop`: "vmap" trains the cohort vmapped (GPU/TPU), "map" one
client after another inside the program (`lax.map`; each client runs only its
own steps, the least work on a CPU), "auto" picks by backend.

Server metrics of every round: `cohort_rows` (private rows trained on) and
`bytes_up` / `bytes_down`, the bytes communicated that round: cohort size x
the bytes of the model variables (parameters and BatchNorm statistics, which
go both ways) plus what a method adds (FedProc's prototypes), from the shapes.

Family members (FedProx, MOON, FedProc, FedRS, FedMMD, FedFusion) change only
the local objective and plug in through `make_family`'s optional hooks:
`ClientState` (per-client state that only sampled clients update, e.g. MOON's
previous local model), `ServerState` (server state computed after aggregation,
e.g. FedProc's global prototypes), `client_constants` (per-client values
derived from the data inside the round, e.g. FedRS's locally present classes),
and for methods with frozen parts in the model (FedFusion) `prepare_server`,
`server_tx`, `decay_mask` and `communicated`. The local loss reads everything
from its `aux` argument (see `make_family`).

Dropout (`config.models.dropout_rate`; absent or 0: none): every family member trains
`common.with_model_dropout`'s model, dropout after the fully connected hidden layers of the
model's tail in local training only (never in evaluation or in a frozen stream). The FedMMD /
FedFusion paper settings set 0.2 for every method they compare, FedAvg included, as the
authors' FedFusion code does for all its models (`fedjax_het/configs/_two_stream.py`); the
other configs have no dropout.

Augmentation (`fedavg.augmentation`): "none" (default) trains on the stored images;
"resized_crop_flip" draws, at every local step, a RandomResizedCrop (area 8-100%, aspect 3/4 to
4/3, resized back to the image size) and a horizontal flip per image, the training transform
of the FedFusion authors' permuted-MNIST script (`data.augment.resized_crop_flip`). On a
pixel-permuted scenario (`scenario.partition` "permuted" / "permuted_classes") it acts on the
unpermuted image, as the script's transform runs before its permutation: the round hands each
client's permutation (`GroupData.pixel_permutation`) to the objective, which unpermutes the
batch, augments it and permutes it again. The augmentation key is folded from the step's key
(`AUGMENT_KEY_DATA`), so the dropout masks a step draws do not change with the switch, and a
resumed run repeats the crops. Evaluation sees the stored images.

Evaluation (`fedavg.evaluate`): "global" tests the server model and reports it
for every participant; "local" tests each participant's own model at the end
of its latest local training (clients keep it as state; only sampled clients
update theirs), which is what the FCCL+ benchmark code reports for its FedAvg
family (Table XV: per-participant intra/inter accuracy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_het import evaluation, validation
from fedjax_het.algorithms import common
from fedjax_het.data import augment as augment_lib
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import (ClientGroup, GroupData, client_keys, init_group_variables,
                                       slot_active)
from fedjax_het.engine.optim import exponential_round_schedule, round_decay_schedule
from fedjax_het.errors import ConfigError

WEIGHTINGS = ("size", "uniform")
LR_SCHEDULES = ("linear", "exponential")
EVALUATES = ("global", "local")
CLIENT_LOOPS = local.CLIENT_LOOPS
#: `fedavg.augmentation` (module docstring).
AUGMENTATIONS = ("none", "resized_crop_flip")
#: The augmentation key of a local step: `jax.random.fold_in(step key, AUGMENT_KEY_DATA)`.
AUGMENT_KEY_DATA = 0x617567


# objective_for(group) -> loss_fn(params, batch_stats, images, labels, mask, rng, aux), where
# aux holds one client's entries (see `make_family`): "global" (the round's server variables),
# "round" (the 0-based round index) and the hooks' entries; it returns
# (loss, (new batch_stats, metrics)).
ObjectiveFor = Callable[[ClientGroup], local.LocalLossFn]


class ClientState(NamedTuple):
  """Per-client state kept across rounds; only the sampled clients update theirs.

  The entries live under `state["groups"][group.name]` with the slot axis
  leading; each round the cohort's rows are gathered into the local objective's
  `aux` (under the entries' names) and the updated rows scattered back.

  Attributes:
    init: initial variables of every slot (S, ...) -> {entry: (S, ...)}.
    update: (the cohort's entries {entry: (M, ...)}, its trained variables
      (M, ...)) -> the new entries (M, ...).
  """
  init: Callable[[Any], dict[str, Any]]
  update: Callable[[Mapping[str, Any], Any], dict[str, Any]]


class ServerState(NamedTuple):
  """Extra server state computed after aggregation, sent to the next round's clients.

  Stored replicated as `state[name]`; the local objective reads the previous
  round's value as `aux[name]`.

  Attributes:
    name: state and aux key (e.g. "prototypes").
    init: () -> the initial value.
    update: (old value, the cohort's trained variables (M, ...), the cohort's
      data `GroupData` (M, ...)) -> (new value, {server metric: scalar}).
    bytes_up, bytes_down: bytes one sampled client sends / receives for it per
      round (for the `bytes_up` / `bytes_down` metrics).
  """
  name: str
  init: Callable[[], Any]
  update: Callable[[Any, Any, GroupData], tuple[Any, dict[str, jax.Array]]]
  bytes_up: int
  bytes_down: int


# client_constants(cohort data GroupData (M, ...)) -> {entry: (M, ...)}: per-client values
# derived from the private data inside the round (e.g. FedRS's present classes), put in aux.
ClientConstants = Callable[[GroupData], Mapping[str, Any]]


# FedAvg's local objective: softmax cross-entropy on the private batch (shared with SOLO).
cross_entropy_objective = common.cross_entropy_loss_for


def the_group(setup: Setup, method: str) -> ClientGroup:
  """The single architecture group of a FedAvg-family run (raises otherwise)."""
  if not setup.homogeneous:
    raise ConfigError(f"config.models.architectures must name one architecture for every "
                      f"participant for {method} (one global model), got groups "
                      f"{[g.name for g in setup.groups]}.")
  return setup.groups[0]


def local_lr_schedule(loc: ml_collections.ConfigDict, num_rounds: int) -> optax.Schedule:
  """The local learning rate per round from `config.local` (see the module docstring)."""
  kind = common.check_choice("local.lr_schedule", loc.get("lr_schedule", "linear"),
                             LR_SCHEDULES)
  if kind == "exponential":
    return exponential_round_schedule(float(loc.lr), float(loc.lr_decay_rate),
                                      float(loc.min_lr))
  return round_decay_schedule(float(loc.lr), num_rounds, float(loc.lr_decay))


def _merge(entries: dict[str, Any], extra: Mapping[str, Any], hook: str) -> None:
  """entries.update(extra), refusing to overwrite (hook names must be distinct)."""
  clash = set(entries) & set(extra)
  if clash:
    raise ValueError(f"make_family: the {hook} entries {sorted(clash)} clash with the entries "
                     f"{sorted(entries)}; rename them.")
  entries.update(extra)


def augmented_objective_for(objective_for: ObjectiveFor, augmentation: str) -> ObjectiveFor:
  """`objective_for` whose loss sees each batch augmented by `augmentation` (module docstring),
  on the unpermuted image when `aux` holds the client's "pixel_permutation"."""
  if augmentation not in AUGMENTATIONS:
    raise ValueError(f"augmentation must be one of {AUGMENTATIONS}, got {augmentation!r}.")
  if augmentation == "none":
    return objective_for

  def for_group(group: ClientGroup) -> local.LocalLossFn:
    loss_fn = objective_for(group)

    def loss(params, batch_stats, images, labels, mask, rng, aux, *extra):
      images = augment_lib.resized_crop_flip(jax.random.fold_in(rng, AUGMENT_KEY_DATA), images,
                                             aux.get("pixel_permutation"))
      return loss_fn(params, batch_stats, images, labels, mask, rng, aux, *extra)

    return loss

  return for_group


def make_family(config: ml_collections.ConfigDict, setup: Setup, *, name: str,
                objective_for: ObjectiveFor, client_state: ClientState | None = None,
                server_state: ServerState | None = None,
                client_constants: ClientConstants | None = None,
                prepare_server: Callable[[Any], Any] | None = None,
                server_tx: optax.GradientTransformation | None = None,
                decay_mask: Any = None,
                communicated: Callable[[Any], Any] | None = None) -> Algorithm:
  """A FedAvg-style `Algorithm` with a custom local objective (FedAvg, FedProx, MOON, ...).

  Args:
    config: reads `config.fedavg`, `config.local`, `config.server`, `config.eval` and
      `config.models.dropout_rate` (`common.with_model_dropout`).
    setup: the run setup (one architecture group); the method trains and evaluates its
      models with the config's dropout in their tails.
    name: the method name.
    objective_for: group -> local loss. Its `aux` holds, per client: "global"
      (the round's server variables), "round" (the round index, int32) and
      the entries of the hooks below.
    client_state: optional per-client persistent state (`ClientState`).
    server_state: optional extra server state (`ServerState`).
    client_constants: optional per-client constants from the cohort's data
      (`ClientConstants`).
    prepare_server: optional server variables -> the variables every sampled
      client starts from (also applied to the initial server model), e.g.
      FedFusion loads its frozen global trunk from the server's trunk.
    server_tx: optional server optimiser replacing `config.server`'s (e.g.
      FedFusion's EMA of the fusion weights).
    decay_mask: optional weight-decay mask of the local optimiser (pytree of
      bools or params -> pytree), False on parameters the local objective
      keeps frozen.
    communicated: optional variables -> the part a client and the server
      exchange (for `bytes_up` / `bytes_down`; default: all variables).

  Returns:
    The `Algorithm`.
  """
  setup = common.with_model_dropout(config, setup)
  group = the_group(setup, name)
  cfg, loc = config.fedavg, config.local
  cohort_size = int(cfg.clients_per_round) or group.num_clients
  if cohort_size > group.num_clients:
    raise ConfigError(f"config.fedavg.clients_per_round must be at most the number of "
                      f"participants ({group.num_clients}), got {cohort_size}.")
  weighting = common.check_choice("fedavg.weighting", cfg.weighting, WEIGHTINGS)
  keep_local = common.check_choice("fedavg.evaluate", cfg.evaluate, EVALUATES) == "local"
  client_loop = local.resolve_client_loop(
      common.check_choice("fedavg.client_loop", cfg.client_loop, CLIENT_LOOPS))
  augmentation = common.check_choice("fedavg.augmentation", cfg.get("augmentation", "none"),
                                     AUGMENTATIONS)
  objective_for = augmented_objective_for(objective_for, augmentation)
  epochs = int(loc.epochs)
  trainer = local.make_group_trainers(
      setup, objective_for, optimizer=loc.optimizer, weight_decay=float(loc.weight_decay),
      epochs=epochs, batch_size=int(loc.batch_size), momentum=float(loc.get("momentum", 0.0)),
      decay_mask=decay_mask)[group.name]
  lr = local_lr_schedule(loc, setup.num_rounds)
  if server_tx is None:
    server_tx = aggregation.server_optimizer_from_config(config.server)
  prepare = prepare_server if prepare_server is not None else (lambda variables: variables)
  active = jnp.asarray(slot_active(group))
  evaluator = evaluation.make_evaluator(
      (group,), batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
      top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean, setup.private_std),
      sizes=setup.test_sizes or None)
  if server_state is not None and server_state.name in ("server", "server_opt", "groups"):
    raise ValueError(f"make_family: ServerState.name {server_state.name!r} is taken by the "
                     "family's own state; choose another name.")
  model_bytes = common.variables_bytes(group, communicated)
  bytes_up = cohort_size * (model_bytes + (server_state.bytes_up if server_state else 0))
  bytes_down = cohort_size * (model_bytes + (server_state.bytes_down if server_state else 0))

  def init(key, data):
    del data
    variables = init_group_variables(group, key, shared=True,
                                     num_participants=setup.num_participants)
    server = prepare(jax.tree_util.tree_map(lambda v: v[0], variables))
    state = {"server": server, "server_opt": server_tx.init(server["params"])}
    per_client = {"variables": variables} if keep_local else {}
    if client_state is not None:
      _merge(per_client, client_state.init(variables), "client_state")
    if per_client:
      state["groups"] = {group.name: per_client}
    if server_state is not None:
      state[server_state.name] = server_state.init()
    return state

  def round_fn(state, data, key, round_index):
    sample_key, train_key = jax.random.split(key)
    slots = cohort.sample_cohort(sample_key, active, cohort_size)
    members = cohort.gather(data.groups[group.name], slots)
    start = aggregation.broadcast(prepare(state["server"]), cohort_size)
    aux = {"global": start, "round": jnp.full((cohort_size,), round_index, jnp.int32)}
    if augmentation != "none" and members.pixel_permutation is not None:
      aux["pixel_permutation"] = members.pixel_permutation
    if client_state is not None:  # every per-client entry but the kept local models
      kept = {entry: value for entry, value in state["groups"][group.name].items()
              if not (keep_local and entry == "variables")}
      own = cohort.gather(kept, slots)
      _merge(aux, own, "client_state")
    if server_state is not None:
      sent = aggregation.broadcast(state[server_state.name], cohort_size)
      _merge(aux, {server_state.name: sent}, "server_state")
    if client_constants is not None:
      _merge(aux, client_constants(members), "client_constants")
    trained, metrics = local.train_clients(
        trainer, start, aux, members, client_keys(train_key, members.client_ids),
        jnp.full((epochs,), lr(round_index)), sequential=client_loop == "map")
    weights = members.sizes if weighting == "size" else jnp.ones((cohort_size,))
    mean = aggregation.weighted_mean(trained, weights)
    params, server_opt = aggregation.server_update(server_tx, state["server"]["params"],
                                                   mean["params"], state["server_opt"])
    server = {"params": params, "batch_stats": mean["batch_stats"]}
    zeros = jnp.zeros((group.num_slots,))
    per_slot = {metric: cohort.scatter(zeros, slots, value) for metric, value in metrics.items()}
    per_slot["participated"] = cohort.scatter(zeros, slots, jnp.ones((cohort_size,)))
    server_metrics = {"cohort_rows": jnp.sum(members.sizes).astype(jnp.float32),
                      "bytes_up": jnp.float32(bytes_up), "bytes_down": jnp.float32(bytes_down)}
    new_state = {"server": server, "server_opt": server_opt}
    per_client = {}
    if keep_local:  # only the cohort's models change
      per_client["variables"] = cohort.scatter(state["groups"][group.name]["variables"], slots,
                                               trained)
    if client_state is not None:  # only the cohort's entries change
      per_client.update(cohort.scatter(kept, slots, client_state.update(own, trained)))
    if per_client:
      new_state["groups"] = {group.name: per_client}
    if server_state is not None:
      new_state[server_state.name], extra_metrics = server_state.update(
          state[server_state.name], trained, members)
      server_metrics.update(extra_metrics)
    return new_state, {"local": {group.name: per_slot}, "server": server_metrics}

  local_evaluator = common.make_evaluate(config, setup)

  def evaluate(state, test):
    if keep_local:
      return local_evaluator(state, test)
    one = {"groups": {group.name: {"variables": aggregation.broadcast(state["server"], 1)}}}
    accuracy = evaluator(one, test)[group.name]  # (1, domains)
    return {group.name: jnp.broadcast_to(accuracy, (group.num_slots, accuracy.shape[1]))}

  return Algorithm(name=name, init=init, round=round_fn, evaluate=evaluate)


def family_default_config() -> ml_collections.ConfigDict:
  """The sections every FedAvg-family method reads."""
  return ml_collections.ConfigDict({
      "fedavg": {"clients_per_round": 0,      # 0: every participant, every round
                 "weighting": "size",         # "size": n_k / n (McMahan); "uniform"
                 "evaluate": "global",        # "global": server model; "local": own models
                 "client_loop": "auto",       # cohort: "vmap" (GPU/TPU), "map" (CPU), "auto"
                 "augmentation": "none"},     # or "resized_crop_flip" (module docstring)
      "local": {**local.default_config().to_dict(),
                "momentum": 0.0,             # SGD momentum (torch semantics)
                "lr_schedule": "linear",     # "linear": lr_decay over the run; "exponential"
                "lr_decay_rate": 1.0,        # exponential: lr * rate ** round ...
                "min_lr": 0.0},              # ... until lr <= min_lr (0: no floor)
      "server": aggregation.default_server_config(),
      # Run-wide default changed for this family: one global model needs one architecture.
      "models": {"architectures": ("resnet12",) * 4},
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedavg`, `config.local`, `config.server`, `config.models.dropout_rate`."""
  local.validate_config(config)
  common.validate_model_dropout(config)
  aggregation.validate_server_config(config)
  validation.check(config, "local.momentum", lambda v: 0 <= v < 1, "a number in [0, 1)")
  validation.check(config, "local.lr_schedule", validation.choice(LR_SCHEDULES),
                   f"one of {LR_SCHEDULES}")
  validation.check(config, "local.lr_decay_rate", lambda v: 0 < v <= 1, "a number in (0, 1]")
  validation.check(config, "local.min_lr", lambda v: v >= 0, "a number >= 0")
  if config.local.momentum and config.local.optimizer != "sgd":
    validation.fail("local.momentum", "0 unless local.optimizer is 'sgd'",
                    config.local.momentum)
  validation.require_section(config, "fedavg")
  validation.check(config, "fedavg.clients_per_round", validation.int_at_least(0),
                   "an integer >= 0 (0: every participant)")
  validation.check(config, "fedavg.weighting", validation.choice(WEIGHTINGS),
                   f"one of {WEIGHTINGS}")
  validation.check(config, "fedavg.evaluate", validation.choice(EVALUATES),
                   f"one of {EVALUATES}")
  validation.check(config, "fedavg.client_loop", validation.choice(CLIENT_LOOPS),
                   f"one of {CLIENT_LOOPS}")
  if "augmentation" in config.fedavg:
    validation.check(config, "fedavg.augmentation", validation.choice(AUGMENTATIONS),
                     f"one of {AUGMENTATIONS}")
  if len(set(config.models.architectures)) > 1:
    validation.fail("models.architectures",
                    f"one architecture for every participant for {config.algorithm}",
                    tuple(config.models.architectures))

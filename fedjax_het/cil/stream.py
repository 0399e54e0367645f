"""The class-incremental task stream on the device: the family's config, settings and blocks.

What every method on GLFC's task stream [GLFC Sec. 5] shares
(`fedjax_het.algorithms.fedavg_cil`, `.glfc`, `.icarl_fl`), and what the one
trainer (`fedjax_het.train`, through `fedjax_het.stream_experiment`) reads:

  * `stream_config(config)` / `validate_stream_config`: the class-incremental
    family's part of a config (GLFC's CIFAR-100 T=10 setting of Table 1), added
    to the run-wide fields every run has (`fedjax_het.config.run_config`):
    `scenario` (the stream), `cil` (rounds per task, clients per round, the
    client loop), `local` (the local optimiser and its learning-rate schedule),
    `models.stem`, and the stream's own defaults of a few run-wide fields
    (`RUN_WIDE_DEFAULTS`); the validation also refuses the run-wide values the
    stream cannot honour (several devices, a staged or cached round, bfloat16,
    top-k accuracy, rounds to a target);
  * `StreamSettings`: those numbers as Python constants; `StreamSetup`: what a
    method's `make(config, setup)` builds from (settings, model, normalisation,
    the stream's static sizes);
  * `StreamArrays`: the stream on the device, fixed shapes for the whole
    stream, so the round compiles once: round r trains task
    t = r // rounds_per_task (`task_of_round`), picked by dynamic indexing;
  * `scenario.client_roles` (`CLIENT_ROLES`): when the clients' roles are
    drawn: "per_task" (default; the authors' code) or "per_round" (the
    paper's text, `draw_round_roles`, `RoundRoleStream`); `client_tasks` is
    the row of the per-task arrays each client trains on at a round;
  * `epoch_learning_rates`: the local learning rate of each epoch of a round;
  * `batched_class_counts` / `make_class_counts`: the per-class test counts
    every evaluation gives, restricted to the classes seen so far;
  * `build_stream`, `stream_fingerprint`, `eval_record`.

The classifier has all C classes from the start; unseen classes are masked
(`cil.masking`): losses see the seen classes only and predictions are
restricted to them.

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.cil import masking
from fedjax_het.data import incremental
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import local
from fedjax_het.engine.optim import OPTIMIZERS

SCENARIO = "class_incremental"
CLIENT_LOOPS = local.CLIENT_LOOPS
#: `scenario.client_roles`: the clients' roles (old / in-between / new) and classes are drawn
#: once per task (the authors' code) or again at every global round (the paper's text);
#: `draw_round_roles`.
CLIENT_ROLES = ("per_task", "per_round")
#: The methods that read a "per_round" stream's roles (`client_tasks`); the others index the
#: per-task arrays by the round's task.
PER_ROUND_METHODS = ("glfc",)
#: Roles of `draw_round_roles` (`RoundRoleStream.round_roles`): not joined yet, old (S_o: no
#: data of the current task), in-between (S_b: the current task's data and a memory of earlier
#: tasks), new (S_n: joined during the current task, its data, no memory of earlier tasks).
ROLE_ABSENT, ROLE_OLD, ROLE_IN_BETWEEN, ROLE_NEW = 0, 1, 2, 3
ROLE_NAMES = ("absent", "old", "in_between", "new")
# Random-stream code of the per-round role draw (SeedSequence([seed, _ROLES_STREAM])).
_ROLES_STREAM = 7321
#: `local.lr_schedule`: the learning rate over the local epochs of a round (`epoch_learning_rates`).
LR_SCHEDULES = ("constant", "glfc_code")
#: The GLFC code's step decays: (fraction of a task's local epochs, divisor of the base lr).
GLFC_CODE_LR_STEPS = ((0.5, 5.0), (0.75, 25.0), (0.9, 125.0))


#: The stream's own defaults of run-wide fields (GLFC Table 1: one ResNet-18 for every client,
#: evaluation at each task's end on test batches of 500, a checkpoint every 10 rounds); every
#: other run-wide field keeps the default of `fedjax_het.config.run_config`.
RUN_WIDE_DEFAULTS = {"models.architectures": ("glfc_resnet18",), "eval.every": 0,
                     "eval.batch_size": 500, "checkpoint.every": 10}


def stream_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the class-incremental family's sections to the run-wide fields `config`.

  GLFC Table 1's CIFAR-100 T=10 stream. `config` is `fedjax_het.config.run_config`'s;
  the method's own section (`config.glfc`, `config.icarl`) comes from its registered
  `default_config` (`fedjax_het.config.base_config` merges them). The run is
  num_tasks * rounds_per_task rounds long (`num_rounds`).
  """
  config.scenario = {
      "name": SCENARIO,
      "dataset": "cifar100",
      "source": "real",            # "real" (bundle), "tfds", "folder:<path>", "synthetic"
      "data_dir": "",              # "" -> $FEDJAX_HET_DATA_DIR
      "synthetic_fallback": False,
      "num_tasks": 10,
      "num_classes": 0,            # 0 -> all classes of the dataset
      "initial_clients": 30,
      "new_clients_per_task": 10,
      "class_fraction": 0.6,
      "shift_fraction": 0.9,
      "client_data": "overlap",    # "overlap" (GLFC code) or "disjoint"
      "train_size": 0,             # 0 -> all training images of the stream's classes
      "test_size": 0,              # 0 -> all test images
      "class_order": "seeded",     # or "icarl", "identity" (incremental.CLASS_ORDERS)
      "client_roles": "per_task",  # or "per_round" (the paper's text; draw_round_roles)
      # Side of the square images; 0: the dataset's (incremental.NATIVE_IMAGE_SIZES:
      # CIFAR-100 32, Tiny-ImageNet 64, ImageNet-Subset 224).
      "image_size": 0,
  }
  config.cil = {
      "rounds_per_task": 10,
      "clients_per_round": 10,
      "client_loop": "auto",       # "vmap" (GPU/TPU), "map" (CPU), "auto" by backend
  }
  config.local = {"optimizer": "sgd", "lr": 2.0, "momentum": 0.0, "weight_decay": 1e-5,
                  "epochs": 20, "batch_size": 128,
                  "lr_schedule": "glfc_code"}   # or "constant" (epoch_learning_rates)
  # stem (glfc_resnet18 only): "auto" (the CIFAR stem below 128 px, the ImageNet stem from
  # 128 px on; `stem_for`), "cifar" or "imagenet" (fedjax_het/models/resnet.py).
  config.models.stem = "auto"
  config.update_from_flattened_dict(RUN_WIDE_DEFAULTS)
  return config


#: `models.stem`: the ResNet stem of glfc_resnet18 ("auto": by the image side, `stem_for`).
STEMS = ("auto", "cifar", "imagenet")
#: Image sides from which "auto" picks the ImageNet stem.
IMAGENET_STEM_FROM = 128
#: The architectures whose stem `models.stem` sets.
STEM_MODELS = ("glfc_resnet18",)


def image_size(config: ml_collections.ConfigDict) -> int:
  """The run's image side: scenario.image_size, or the dataset's native side when 0."""
  size = int(config.scenario.image_size)
  return size or incremental.NATIVE_IMAGE_SIZES[config.scenario.dataset]


def stem_for(stem: str, side: int) -> str:
  """The ResNet stem of `models.stem` at images of `side` px ("auto": cifar below 128 px)."""
  if stem != "auto":
    return stem
  return "imagenet" if side >= IMAGENET_STEM_FROM else "cifar"


def model_kwargs(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The extra `models.get_model` keywords of the run's architecture (the stem of a ResNet)."""
  if config.models.architectures[0] not in STEM_MODELS:
    return {}
  return {"stem": stem_for(config.models.stem, image_size(config))}


def num_rounds(config: ml_collections.ConfigDict) -> int:
  """The stream's rounds: num_tasks * rounds_per_task."""
  return int(config.scenario.num_tasks) * int(config.cil.rounds_per_task)


def validate_stream_config(config: ml_collections.ConfigDict) -> None:
  """Checks the family's fields of `stream_config`; errors name the field and the allowed values.

  The run-wide fields are checked once by `fedjax_het.config.validate_run_wide`;
  here the stream's sections, its one architecture, rounds_per_call against the
  task length, and the run-wide values the stream cannot honour. The method's own
  section is checked by its registered `validate_config`.
  """
  for section in ("scenario", "cil", "local"):
    if section not in config:
      v.fail(section, "a section (build the config with "
             "fedjax_het.config.base_config('<class-incremental algorithm>'))", None)
  number = v.finite_number
  v.check(config, "scenario.name", v.choice((SCENARIO,)), f"{SCENARIO!r}")
  datasets = tuple(incremental.INCREMENTAL_DATASETS)
  v.check(config, "scenario.dataset", v.choice(datasets), f"one of {datasets}")
  v.check(config, "scenario.source",
          lambda s: isinstance(s, str) and (s in ("real", "tfds", "synthetic")
                                            or (s.startswith("folder:") and len(s) > 7)),
          "one of ('real', 'tfds', 'folder:<path>', 'synthetic')")
  v.check(config, "scenario.synthetic_fallback", v.is_bool, "True or False")
  v.check(config, "scenario.num_tasks", v.int_at_least(1), "an integer >= 1")
  limit = incremental.INCREMENTAL_DATASETS.get(config.scenario.dataset, 100)
  v.check(config, "scenario.num_classes", lambda x: v.int_at_least(0)(x) and x <= limit,
          f"an integer in [0, {limit}] (0: all classes)")
  classes = config.scenario.num_classes or limit
  if classes % config.scenario.num_tasks:
    divisors = tuple(d for d in range(1, classes + 1) if classes % d == 0)
    v.fail("scenario.num_tasks", f"a divisor of the {classes} classes, one of {divisors}",
           config.scenario.num_tasks)
  v.check(config, "scenario.initial_clients", v.int_at_least(1), "an integer >= 1")
  v.check(config, "scenario.new_clients_per_task", v.int_at_least(0), "an integer >= 0")
  v.check(config, "scenario.class_fraction", lambda x: number(x) and 0 < x <= 1,
          "a number in (0, 1]")
  v.check(config, "scenario.shift_fraction", lambda x: number(x) and 0 <= x <= 1,
          "a number in [0, 1]")
  v.check(config, "scenario.client_data", v.choice(incremental.CLIENT_DATA),
          f"one of {incremental.CLIENT_DATA}")
  dataset, source = config.scenario.dataset, config.scenario.source
  sizes = incremental.image_sizes(dataset, source)
  low, high = incremental.MIN_IMAGE_SIZE, incremental.MAX_IMAGE_SIZE
  v.check(config, "scenario.image_size",
          lambda x: v.int_at_least(0)(x) and (x == 0 or (x in sizes if sizes is not None
                                                          else low <= x <= high)),
          (f"0 (the dataset's {incremental.NATIVE_IMAGE_SIZES[dataset]}) or one of {sizes} "
           f"for scenario.dataset={dataset!r} with scenario.source={source!r}"
           if sizes is not None else f"0 (the dataset's side) or an integer in [{low}, "
           f"{high}] for scenario.dataset={dataset!r} with scenario.source={source!r}"))
  v.check(config, "scenario.train_size", v.int_at_least(0), "an integer >= 0 (0: all)")
  v.check(config, "scenario.test_size", v.int_at_least(0), "an integer >= 0 (0: all)")
  v.check(config, "scenario.class_order", v.choice(incremental.CLASS_ORDERS),
          f"one of {incremental.CLASS_ORDERS}")
  if config.scenario.class_order == "icarl" and (config.scenario.dataset != "cifar100"
                                                 or config.scenario.source == "synthetic"):
    v.fail("scenario.class_order", "'seeded' or 'identity' unless scenario.dataset is "
           "'cifar100' with real data ('icarl' orders the CIFAR-100 labels)",
           config.scenario.class_order)
  v.check(config, "scenario.client_roles", v.choice(CLIENT_ROLES), f"one of {CLIENT_ROLES}")
  if (config.scenario.client_roles == "per_round"
      and config.algorithm not in PER_ROUND_METHODS):
    v.fail("scenario.client_roles", f"'per_task' for config.algorithm="
           f"{config.algorithm!r} ('per_round' is read by {PER_ROUND_METHODS})",
           config.scenario.client_roles)
  v.check(config, "cil.rounds_per_task", v.int_at_least(1), "an integer >= 1")
  v.check(config, "cil.clients_per_round",
          lambda x: v.int_at_least(1)(x) and x <= config.scenario.initial_clients,
          f"an integer in [1, scenario.initial_clients={config.scenario.initial_clients}] "
          "(the clients present at task 0)")
  v.check(config, "rounds_per_call",
          lambda x: v.int_at_least(1)(x) and config.cil.rounds_per_task % x == 0,
          f"an integer >= 1 dividing cil.rounds_per_task={config.cil.rounds_per_task}")
  v.check(config, "cil.client_loop", v.choice(CLIENT_LOOPS), f"one of {CLIENT_LOOPS}")
  names = tuple(n for n in models.MODEL_NAMES if n != "fedfusion")
  v.check(config, "models.architectures",
          lambda x: isinstance(x, (tuple, list)) and len(x) == 1 and x[0] in names,
          f"one name (every client of the stream shares it) from {names}")
  v.check(config, "models.stem", v.choice(STEMS), f"one of {STEMS}")
  if config.models.stem != "auto" and config.models.architectures[0] not in STEM_MODELS:
    v.fail("models.stem", f"'auto' unless models.architectures is one of {STEM_MODELS} "
           "(the stem is a ResNet's)", config.models.stem)
  v.check(config, "local.optimizer", v.choice(OPTIMIZERS), f"one of {OPTIMIZERS}")
  v.check(config, "local.lr", v.positive, "a number > 0")
  v.check(config, "local.momentum", lambda x: number(x) and 0 <= x < 1, "a number in [0, 1)")
  if config.local.momentum and config.local.optimizer != "sgd":
    v.fail("local.momentum", "0 unless local.optimizer is 'sgd'", config.local.momentum)
  v.check(config, "local.weight_decay", lambda x: number(x) and x >= 0, "a number >= 0")
  v.check(config, "local.epochs", v.int_at_least(1), "an integer >= 1")
  v.check(config, "local.batch_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "local.lr_schedule", v.choice(LR_SCHEDULES), f"one of {LR_SCHEDULES}")
  # Run-wide values the stream cannot honour: one line each rather than a silent fallback.
  stream = f"for a class-incremental run (scenario.name={SCENARIO!r})"
  v.check(config, "sharding.num_devices", v.choice((1,)),
          f"1 {stream}: it runs in one process on one device")
  v.check(config, "round_programs", v.choice(("auto", "one")),
          f"'auto' or 'one' {stream}: its methods' rounds are one piece")
  v.check(config, "models.compute_dtype", v.choice(("float32",)),
          f"'float32' {stream}: the stream's models are built in float32")
  v.check(config, "eval.top_k", v.choice((1,)),
          f"1 {stream}: the stream reports top-1 accuracy (GLFC Table 1)")
  v.check(config, "eval.targets", lambda x: isinstance(x, (tuple, list)) and not x,
          f"() {stream}: its results are accuracies per task, not rounds to a target")


class StreamArrays(NamedTuple):
  """The stream on the device (a pytree; shapes fixed for the whole stream).

  `round_tasks` / `round_roles` are None for a "per_task" stream; for a
  "per_round" one (`RoundRoleStream`) they say, per global round, which row
  of the per-task arrays each client trains on and its role
  (`draw_round_roles`; read them through `client_tasks`).
  """
  images: Any           # (N, 32, 32, 3) uint8 pool
  labels: Any           # (N,) int32
  client_indices: Any   # (T, K_max, n_max) int32
  client_sizes: Any     # (T, K_max) int32
  client_joined: Any    # (T, K_max) bool
  client_classes: Any   # (T, K_max, C) bool (read by glfc; fedavg_cil ignores it)
  round_tasks: Any = None   # (R, K_max) int32 per_round: the task row a client holds (-1: absent)
  round_roles: Any = None   # (R, K_max) int32 per_round: ROLE_* of each client


def stream_arrays(stream: incremental.ClassIncrementalStream) -> StreamArrays:
  return StreamArrays(images=stream.images, labels=stream.labels,
                      client_indices=stream.client_indices, client_sizes=stream.client_sizes,
                      client_joined=stream.client_joined,
                      client_classes=stream.client_classes,
                      round_tasks=getattr(stream, "round_tasks", None),
                      round_roles=getattr(stream, "round_roles", None))


def draw_round_roles(*, num_tasks: int, rounds_per_task: int, initial_clients: int,
                     new_clients_per_task: int, shift_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The clients' roles re-drawn at every global round (`scenario.client_roles="per_round"`).

  GLFC Sec. 3: the clients of a task are old (S_o: "cannot receive the new
  data of current task but have the exemplar memory"), in-between (S_b: "the
  new data of current task and the exemplar memory of previous tasks") or new
  (S_n: newly added, "the new data of current task, but ... no exemplar
  memory"); "we randomly determine {S_o, S_b, S_n} at each global round, and
  S_n are irregularly added at any global round". The authors' code draws the
  groups once per task (`fl_main.py`; `scenario.client_roles="per_task"`,
  `partition.class_incremental_tasks`). The reading here, over R = T x
  rounds_per_task rounds (round r trains task t = r // rounds_per_task):

    * Every client has one data set per task it exists in: row t of the
      stream's per-task arrays, a random round(class_fraction x k) of task
      t's classes drawn once per (client, task) (`build_stream` draws the
      per-task stream with shift_fraction 1, so every client present at task
      t gets its task-t draw). A role picks which row a client trains on.
    * Joining at any round: the `initial_clients` join at round 0; each of
      the `new_clients_per_task` clients that task t >= 1 adds joins at a
      round drawn uniformly from task t's rounds, so the number of clients
      still grows by `new_clients_per_task` per task (GLFC Sec. 5.1). From its
      joining round to the end of task t a client is new (S_n): it holds its
      task-t data and has no earlier task.
    * In-between / old: the veterans of task t (clients that joined before
      task t's first round) are re-split at every round of the task: exactly
      round(shift_fraction x veterans) of them, drawn uniformly, are
      in-between (S_b) and hold their task-t data; the others are old (S_o)
      and hold the data of the latest EARLIER task in which they held new data
      (the latest task t' < t at whose rounds they were new or in-between),
      as the code's old clients keep their previous classes. An old client
      thus holds no data of the current task, even where it was in-between at
      an earlier round of the task.

  Shapes stay static: every client of the stream (K_max = initial + (T-1) x
  new) has a column from the start, absent (-1) before it joins.

  Args:
    num_tasks, rounds_per_task: T and the rounds of each task.
    initial_clients, new_clients_per_task: as `scenario`.
    shift_fraction: the in-between fraction of a task's veterans per round.
    seed: the run's seed (its own random stream).

  Returns:
    (round_tasks (R, K_max) int32: the task row each client trains on, -1
    absent; round_roles (R, K_max) int32: ROLE_*; join_rounds (K_max,) int32).
  """
  t_count, per_task = int(num_tasks), int(rounds_per_task)
  k_max = int(initial_clients) + (t_count - 1) * int(new_clients_per_task)
  rng = np.random.default_rng(np.random.SeedSequence([int(seed), _ROLES_STREAM]))
  join = np.zeros(k_max, np.int64)
  for t in range(1, t_count):
    ids = initial_clients + (t - 1) * new_clients_per_task + np.arange(new_clients_per_task)
    join[ids] = t * per_task + rng.integers(per_task, size=ids.size)
  tasks = np.full((t_count * per_task, k_max), -1, np.int32)
  roles = np.full((t_count * per_task, k_max), ROLE_ABSENT, np.int32)
  last_new = np.full(k_max, -1, np.int64)   # the latest task whose data a client held
  for t in range(t_count):
    earlier = last_new.copy()               # as at task t's first round
    veterans = np.nonzero(join < t * per_task)[0]
    movers = int(round(shift_fraction * veterans.size))
    for r in range(t * per_task, (t + 1) * per_task):
      new = np.nonzero((join >= t * per_task) & (join <= r))[0]
      order = veterans[rng.permutation(veterans.size)]
      between, old = order[:movers], order[movers:]
      tasks[r, new], roles[r, new] = t, ROLE_NEW
      tasks[r, between], roles[r, between] = t, ROLE_IN_BETWEEN
      tasks[r, old], roles[r, old] = earlier[old], ROLE_OLD
      last_new[new] = t
      last_new[between] = t
  return tasks, roles, join.astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class RoundRoleStream(incremental.ClassIncrementalStream):
  """A class-incremental stream whose roles are re-drawn every round (`draw_round_roles`).

  The per-task arrays hold every client's data of every task it exists in
  (drawn with shift_fraction 1); `round_tasks[r, k]` is the row client k
  trains on at round r (-1: not joined), `round_roles[r, k]` its ROLE_*,
  `join_rounds[k]` its joining round.
  """
  round_tasks: np.ndarray | None = None
  round_roles: np.ndarray | None = None
  join_rounds: np.ndarray | None = None
  rounds_per_task: int = 1

  def __post_init__(self):
    super().__post_init__()
    want = (self.num_tasks * self.rounds_per_task, self.max_clients)
    for name in ("round_tasks", "round_roles"):
      got = np.shape(getattr(self, name))
      if got != want:
        raise ValueError(f"RoundRoleStream: `{name}` must have shape {want}, got {got}.")
    rows = self.round_tasks
    if rows.size and (rows.max() >= self.num_tasks or rows.min() < -1):
      raise ValueError(f"RoundRoleStream: `round_tasks` must lie in [-1, {self.num_tasks}).")


def client_tasks(data: StreamArrays, round_index: jax.Array,
                 settings: StreamSettings) -> jax.Array:
  """(K_max,) int32: the row of the per-task arrays each client trains on at a round (-1: absent).

  "per_task" streams (`data.round_tasks` None): the round's task
  (`task_of_round`) for the clients joined by it, -1 for the others, i.e.
  exactly `client_joined[task]` and the task's row. "per_round" streams:
  `round_tasks[round]` (`draw_round_roles`; clamped to the last round).
  """
  if data.round_tasks is None:
    task = task_of_round(round_index, settings)
    return jnp.where(jnp.asarray(data.client_joined)[task], task, -1).astype(jnp.int32)
  last = data.round_tasks.shape[0] - 1
  return jnp.asarray(data.round_tasks)[jnp.minimum(jnp.asarray(round_index, jnp.int32), last)]


def client_roles(data: StreamArrays, round_index: jax.Array) -> jax.Array | None:
  """(K_max,) int32 ROLE_* of every client at a round of a "per_round" stream (else None)."""
  if data.round_roles is None:
    return None
  last = data.round_roles.shape[0] - 1
  return jnp.asarray(data.round_roles)[jnp.minimum(jnp.asarray(round_index, jnp.int32), last)]


@dataclasses.dataclass(frozen=True)
class StreamSettings:
  """The Python constants a method is built from (read once from the config)."""
  num_tasks: int
  classes_per_task: int
  rounds_per_task: int
  clients_per_round: int
  optimizer: str
  lr: float
  momentum: float
  weight_decay: float
  epochs: int
  batch_size: int
  sequential: bool   # clients one after another (lax.map) instead of vmapped
  lr_schedule: str = "constant"   # one of LR_SCHEDULES (`epoch_learning_rates`)

  @property
  def num_classes(self) -> int:
    return self.num_tasks * self.classes_per_task

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, num_classes: int) -> "StreamSettings":
    loop = local.resolve_client_loop(config.cil.client_loop)
    t = int(config.scenario.num_tasks)
    return cls(num_tasks=t, classes_per_task=num_classes // t,
               rounds_per_task=int(config.cil.rounds_per_task),
               clients_per_round=int(config.cil.clients_per_round),
               optimizer=config.local.optimizer, lr=float(config.local.lr),
               momentum=float(config.local.momentum),
               weight_decay=float(config.local.weight_decay), epochs=int(config.local.epochs),
               batch_size=int(config.local.batch_size), sequential=loop == "map",
               lr_schedule=config.local.lr_schedule)


def task_of_round(round_index: jax.Array, settings: StreamSettings) -> jax.Array:
  """The task trained in 0-based round `round_index` (clamped to the last task)."""
  return jnp.minimum(round_index // settings.rounds_per_task, settings.num_tasks - 1)


def epoch_learning_rates(settings: StreamSettings, round_index: jax.Array) -> jax.Array:
  """The local learning rate of each epoch of round `round_index`: (epochs,) float32.

  "constant": `settings.lr` in every epoch.

  "glfc_code": the step decays of GLFC's code (conditionWang/FCIL
  `src/GLFC.py`, `GLFC_model.train`). Every round builds a fresh SGD optimiser
  at the base lr; inside the round, at the in-task epoch index e = (round in
  task) * epochs + epoch, the code sets the lr to base / 5 when e % 200 ==
  100, base / 25 at 150 and base / 125 at 180 (`if ... elif ...`: the first
  matching trigger wins), and the rate stays until the round ends (the next
  round's optimiser starts at the base lr again). With the paper's 10 rounds
  of 20 epochs per task: round 5 runs at lr / 5, round 7 runs epochs 0-9 at
  lr and 10-19 at lr / 25, round 9 at lr / 125, every other round at lr.

  Other settings: the code's triggers are fixed epochs of a 200-epoch task;
  here they are placed at int(0.5 * E), int(0.75 * E) and int(0.9 * E) of
  the E = rounds_per_task * epochs in-task epochs (`GLFC_CODE_LR_STEPS`;
  exactly 100, 150, 180 for E = 200), with the code's semantics (a trigger
  inside a round changes the rate from that epoch to the end of the round).
  (In its first task the code builds a new optimiser at the divided rate
  instead of changing the rate in place; plain SGD has no state, so this is
  the same.)

  Args:
    settings: the run's `Settings` (`lr`, `epochs`, `rounds_per_task`,
      `lr_schedule`).
    round_index: the 0-based global round, possibly traced (one compiled
      program for every round).

  Returns:
    (epochs,) float32 learning rates for `engine.local`.
  """
  epochs = settings.epochs
  base = jnp.full((epochs,), settings.lr, jnp.float32)
  if settings.lr_schedule == "constant":
    return base
  if settings.lr_schedule != "glfc_code":
    raise ValueError(f"epoch_learning_rates: `lr_schedule` must be one of {LR_SCHEDULES}, got "
                     f"{settings.lr_schedule!r}.")
  per_task = settings.rounds_per_task * epochs
  triggers = jnp.asarray([int(f * per_task) for f, _ in GLFC_CODE_LR_STEPS], jnp.int32)
  rates = jnp.asarray([settings.lr / d for _, d in GLFC_CODE_LR_STEPS], jnp.float32)
  start = (jnp.asarray(round_index, jnp.int32) % settings.rounds_per_task) * epochs
  epoch = start + jnp.arange(epochs, dtype=jnp.int32)                  # in-task epoch index
  fired = (triggers[None, :] >= start) & (triggers[None, :] <= epoch[:, None])  # (epochs, 3)
  # The latest trigger of this round at or before the epoch; at equal epochs the first listed.
  latest = jnp.max(jnp.where(fired, triggers[None, :], -1), axis=1)
  which = jnp.argmax(fired & (triggers[None, :] == latest[:, None]), axis=1)
  return jnp.where(latest >= 0, rates[which], base)


@dataclasses.dataclass(frozen=True)
class StreamSetup:
  """What a class-incremental method's `make(config, setup)` builds from.

  Attributes:
    settings: the run's `StreamSettings`.
    model: the classifier (all C classes), built with the run's convolutions.
    mean, std: normalisation of the stream's images.
    max_client_size: n_max, the padded rows of one client's data in one task.
    client_classes: (T, K_max, C) bool, which classes each client holds in
      each task (static herding sizes are read from it).
    eval_batch_size: test images per evaluation batch.
    image_size: the side of the stream's square images (models whose shapes
      depend on it, GLFC's LeNet encoder, are built for it).
  """
  settings: StreamSettings
  model: Any
  mean: Any
  std: Any
  max_client_size: int
  client_classes: np.ndarray = dataclasses.field(repr=False, compare=False)
  eval_batch_size: int = 500
  image_size: int = 32


def batched_class_counts(scores_fn: Any, num_classes: int, images: jax.Array,
                         labels: jax.Array, batch_size: int) -> tuple[jax.Array, ...]:
  """Per-class (correct, total, predicted) int32 (C,) counts of a classifier on a test set.

  `scores_fn(x)` maps a uint8 batch to (scores (B, C), allowed (C,) bool); the
  prediction is the argmax over the allowed classes (`masking`). Fixed-size
  batches of `batch_size` (the last padded and masked), one `lax.scan`.
  """
  num_test = labels.shape[0]
  batch = max(1, min(batch_size, num_test))
  batches = -(-num_test // batch)
  pad = batches * batch - num_test
  images = jnp.pad(images, ((0, pad),) + ((0, 0),) * (images.ndim - 1)).reshape(
      (batches, batch) + images.shape[1:])
  labels = jnp.pad(labels, (0, pad)).reshape(batches, batch)
  valid = (jnp.arange(batches * batch) < num_test).reshape(batches, batch)

  def one(carry, xs):
    x, y, ok = xs
    scores, allowed = scores_fn(x)
    correct, total = masking.masked_class_counts(scores, y, allowed, ok)
    predicted = jnp.sum(jax.nn.one_hot(masking.masked_predictions(scores, allowed),
                                       num_classes, dtype=jnp.int32) * ok[:, None], axis=0)
    return jax.tree_util.tree_map(jnp.add, carry, (correct, total, predicted)), None

  zeros = jnp.zeros((num_classes,), jnp.int32)
  out, _ = jax.lax.scan(one, (zeros, zeros, zeros), (images, labels, valid))
  return out


def make_class_counts(model: Any, mean: Any, std: Any, num_classes: int, num_test: int,
                      batch_size: int):
  """Builds `counts(variables, test_images, test_labels, num_seen) -> (correct, total, predicted)`.

  Global-model top-1 predictions restricted to the classes [0, num_seen) over
  the whole test set of `num_test` images (`batched_class_counts`); each
  count is int32 (C,): correct and total per true class, predicted per
  predicted class. `num_seen` may be traced (one compilation for all tasks).
  """
  del num_test  # the labels' static length
  preprocess = normalizer(mean, std)

  def counts(variables, images, labels, num_seen):
    class_mask = masking.seen_class_mask(num_seen, num_classes)

    def scores(x):
      _, logits, _ = models.apply_model(model, variables, preprocess(x), train=False)
      return logits, class_mask

    return batched_class_counts(scores, num_classes, images, labels, batch_size)

  return counts


def build_stream(config: ml_collections.ConfigDict) -> incremental.ClassIncrementalStream:
  """The run's stream; a `RoundRoleStream` for scenario.client_roles = "per_round".

  "per_round": the per-task arrays are drawn with shift_fraction 1 (every
  client present at a task gets its own draw of that task's classes) and
  `scenario.shift_fraction` splits the veterans at every round instead
  (`draw_round_roles`).
  """
  sc = config.scenario
  per_round = sc.client_roles == "per_round"
  stream = incremental.build_class_incremental_stream(
      sc.dataset, num_tasks=int(sc.num_tasks), num_classes=int(sc.num_classes) or None,
      initial_clients=int(sc.initial_clients), new_clients_per_task=int(sc.new_clients_per_task),
      class_fraction=float(sc.class_fraction),
      shift_fraction=1.0 if per_round else float(sc.shift_fraction),
      client_data=sc.client_data, source=sc.source, data_dir=sc.data_dir or None,
      synthetic_fallback=bool(sc.synthetic_fallback), train_size=int(sc.train_size) or None,
      test_size=int(sc.test_size) or None, class_order=sc.class_order,
      image_size=image_size(config), seed=int(config.seed))
  if not per_round:
    return stream
  rounds_per_task = int(config.cil.rounds_per_task)
  tasks, roles, join = draw_round_roles(
      num_tasks=int(sc.num_tasks), rounds_per_task=rounds_per_task,
      initial_clients=int(sc.initial_clients), new_clients_per_task=int(sc.new_clients_per_task),
      shift_fraction=float(sc.shift_fraction), seed=int(config.seed))
  for array in (tasks, roles, join):
    array.setflags(write=False)
  fields = {f.name: getattr(stream, f.name) for f in dataclasses.fields(stream)}
  return RoundRoleStream(**fields, round_tasks=tasks, round_roles=roles, join_rounds=join,
                         rounds_per_task=rounds_per_task)


def stream_fingerprint(stream: incremental.ClassIncrementalStream) -> str:
  """SHA-256 over every array of the stream the run trains and evaluates on.

  A `RoundRoleStream` adds its `round_tasks` (a "per_task" stream's digest is
  unchanged).
  """
  digest = hashlib.sha256()
  names = ("images", "labels", "client_indices", "client_sizes", "client_joined",
           "test_images", "test_labels")
  if getattr(stream, "round_tasks", None) is not None:
    names += ("round_tasks",)
  for name in names:
    array = np.ascontiguousarray(getattr(stream, name))
    digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
    digest.update(array.data)
  return digest.hexdigest()


def eval_record(correct, total, predicted, task: int, k: int) -> dict[str, Any]:
  """eval/accuracy/seen and eval/accuracy/task_<j> (percent) after training task `task`."""
  seen = (task + 1) * k
  record = {"eval/accuracy/seen": (100.0 * float(correct[:seen].sum())
                                   / max(1, int(total[:seen].sum())))}
  for j in range(task + 1):
    part = slice(j * k, (j + 1) * k)
    record[f"eval/accuracy/task_{j}"] = (100.0 * float(correct[part].sum())
                                         / max(1, int(total[part].sum())))
  record["eval/predicted_unseen"] = int(predicted[seen:].sum())
  return record

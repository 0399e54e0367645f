"""A newly joining client (FedFusion paper Sec. 4.3.2, Fig. 6): local epochs it needs to converge.

Yao et al. measure "the local epochs to reach convergence for newly incoming
clients" starting from each method's global model: a better global model (or
FedFusion's fused model) is a better initialisation for a client the
federation has never seen. This module holds the pieces of that experiment;
`experiments/new_client.py` runs it on finished runs and writes the tables.

The protocol here (the paper gives no details; every choice is ours):

  * Start. FedAvg and FedMMD: the server model `state["server"]` of the run's
    final checkpoint. FedFusion: the server's fused model with its frozen
    global trunk loaded from the server's trunk (`fedfusion.load_global_trunk`,
    what a client of the next round would receive); only the local trunk,
    the fusion operator and the classifier are trained, and weight decay is
    masked off the frozen trunk (`fedfusion_trainable_mask`). Reference: the
    run's plain model at a random initialisation (`models.init_variables`),
    trained with cross-entropy.
  * Objective. FedAvg / FedFusion / the reference: cross-entropy. FedMMD: its
    own local objective (CE + lambda * D(global stream, local stream),
    `fedmmd.make_objective`) with the received global model as the frozen
    stream.
  * Optimiser. The run's `config.local`: optimiser, momentum, weight decay,
    batch size, at ONE constant learning rate (`new_client_lr`): by default
    `local.lr`, the rate a client starts a run with ("config"); "last" takes
    the rate of the run's last round (`fedavg_family.local_lr_schedule`), or a
    number. The optimiser state is kept across the epochs: training for E
    epochs is one local phase of E epochs, exactly what
    `engine.local.make_local_trainer` computes with `epochs=E` (same batch
    orders, same step keys; `make_epoch_trainer` only stops between epochs
    to evaluate). Every curve (each run and the random reference) uses the
    same batch orders.
  * Data (`new_client_data`): data the federation never trained on. The
    union of the run's test sets (for the `permuted` partition un-permuted
    first: the run's test set once, as `permuted_test="split"` builds it) is
    split at random into two halves: the new client trains on one and is
    evaluated on the other. In the `permuted` setting both halves get a NEW
    pixel permutation, that of client index K = `scenario.num_clients`
    (`partition.client_permutation(K, seed)`; the training clients use
    0 ... K-1), so the new client's distribution is one no training client
    had.
  * Evaluation. Top-`eval.top_k` accuracy (percent) on the evaluation half
    before training (epoch 0) and after every epoch.
  * Convergence (`epochs_to_converge`): the first epoch e in 0 ... E whose
    accuracy is within `tolerance` points of the best accuracy of the curve
    (max over epochs 0 ... E); and (`epochs_to_target`) the first epoch whose
    accuracy reaches `target` (None if none does). Epoch 0 means the start
    model is already there.

Reference: X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun. Federated Learning
with Additional Mechanisms on Clients to Reduce Communication Costs, 2019
(arXiv:1908.05891), Sec. 4.3.2, Fig. 6.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import checkpointing, evaluation, models, reporting
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import fedavg_family, fedfusion, fedmmd
from fedjax_het.config import base_config, validate_config
from fedjax_het.data import partition as partition_lib
from fedjax_het.data._base import Split
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import batching
from fedjax_het.engine.clients import ClientGroup
from fedjax_het.engine.local import LocalLossFn
from fedjax_het.engine.optim import apply_updates, make_optimizer
from fedjax_het.errors import ConfigError, WorkdirError
from fedjax_het.models.fedfusion import fedfusion_trainable_mask

#: Methods whose global model a new client can start from.
METHODS = ("fedavg", "fedmmd", "fedfusion")
#: Learning-rate choices besides a number (see `new_client_lr`).
LR_CHOICES = ("config", "last")

# Random streams (SeedSequence([seed, _STREAM, code]) / fold_in codes), apart from the run's.
_STREAM = 6151
_SPLIT, _ORDER, _RANDOM_INIT = range(3)


# --- Convergence definitions ---------------------------------------------------------------


def epochs_to_converge(accuracy: Sequence[float], tolerance: float = 0.5) -> int:
  """The first epoch whose accuracy is within `tolerance` points of the curve's best.

  Args:
    accuracy: accuracy (percent) after 0 (before training), 1, ..., E epochs.
    tolerance: points below the best accuracy still counted as converged (>= 0).

  Returns:
    The epoch e (0 ... E) of the first accuracy[e] >= max(accuracy) - tolerance.
  """
  if not len(accuracy):
    raise ValueError("epochs_to_converge: empty accuracy curve.")
  if not tolerance >= 0:
    raise ValueError(f"`tolerance` must be >= 0, got {tolerance!r}.")
  values = np.asarray(accuracy, np.float64)
  return int(np.argmax(values >= np.max(values) - tolerance))


def epochs_to_target(accuracy: Sequence[float], target: float) -> int | None:
  """The first epoch whose accuracy (percent) is >= `target`, or None."""
  for epoch, value in enumerate(accuracy):
    if value >= target:
      return epoch
  return None


# --- The new client's data -----------------------------------------------------------------


class NewClientData(NamedTuple):
  """The newly joining client's private (train) and evaluation (test) data.

  Attributes:
    train: the half it trains on.
    test: the half it is evaluated on.
    permutation: the client index of its pixel permutation
      (`partition.client_permutation(permutation, seed)`), None when the
      run's setting permutes nothing.
    description: one sentence saying where the data come from.
  """
  train: Split
  test: Split
  permutation: int | None
  description: str


def held_out_pool(scenario: Any) -> Split:
  """The run's test images as they were before any permutation (never trained on).

  `permuted`: client i's test split, un-permuted with client i's permutation,
  concatenated over i (the run's test set once). Otherwise: the test sets of
  every test domain, concatenated.
  """
  parts = []
  for domain, split in scenario.test.items():
    images = split.images
    if scenario.pixel_permutations is not None:  # test split of client i = domains.index(domain)
      order = scenario.pixel_permutations[list(scenario.domains).index(domain)]
      images = partition_lib.take_pixels(images, np.argsort(order))
    parts.append(Split(images, split.labels))
  return Split(np.concatenate([p.images for p in parts]),
               np.concatenate([p.labels for p in parts]))


def new_client_data(config: ml_collections.ConfigDict, scenario: Any, *,
                    seed: int | None = None) -> NewClientData:
  """The new client's data: two random halves of the run's test data (module docstring).

  Args:
    config: the run's config (seed, scenario).
    scenario: the run's `Scenario` (`experiment.build_scenario(config)`).
    seed: seed of the halves (default: the run's `config.seed`).

  Returns:
    `NewClientData`.
  """
  seed = int(config.seed) if seed is None else int(seed)
  pool = held_out_pool(scenario)
  if len(pool) < 2:
    raise ConfigError(f"the run's test data hold {len(pool)} image(s); the new client needs at "
                      "least 2 (one half to train on, one to evaluate on).")
  rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM, _SPLIT]))
  train_idx, test_idx = partition_lib.iid_partition(len(pool), 2, rng)
  train, test = pool.take(rng.permutation(train_idx)), pool.take(test_idx)
  domains = ", ".join(scenario.test)
  what = (f"the run's test data ({len(pool)} images of {domains}), never trained on by the "
          f"federation, split at random (seed {seed}) into two halves: {len(train)} to train "
          f"on, {len(test)} to evaluate on")
  permutation = None
  if scenario.pixel_permutations is not None:
    permutation = scenario.num_clients
    train = Split(partition_lib.permuted_pixels(train.images, permutation,
                                                seed=int(config.seed)), train.labels)
    test = Split(partition_lib.permuted_pixels(test.images, permutation,
                                               seed=int(config.seed)), test.labels)
    what = (f"the run's test data un-permuted ({len(pool)} images), never trained on by the "
            f"federation, split at random (seed {seed}) into two halves ({len(train)} to train "
            f"on, {len(test)} to evaluate on), both with a NEW pixel permutation: that of "
            f"client {permutation} (the run's clients use 0-{permutation - 1}; "
            f"partition.client_permutation, seed {int(config.seed)})")
  return NewClientData(train=train, test=test, permutation=permutation,
                       description=what[0].upper() + what[1:] + ".")


# --- What the new client trains ------------------------------------------------------------


class ClientStart(NamedTuple):
  """A new client's model, starting variables and local objective.

  Attributes:
    group: the (one-client) group of the model it trains.
    variables: its starting {"params", "batch_stats"}.
    loss_fn: its per-batch local loss (`engine.local.LocalLossFn`).
    aux: what the loss reads ({"global": the received model}).
    decay_mask: the weight-decay mask of its optimiser (None: all parameters).
    description: one line.
  """
  group: ClientGroup
  variables: Any
  loss_fn: LocalLossFn
  aux: Mapping[str, Any]
  decay_mask: Any
  description: str


def check_method(config: ml_collections.ConfigDict) -> str:
  """The run's method, if a new client can start from its global model (else ConfigError)."""
  method = str(config.algorithm)
  if method not in METHODS:
    raise ConfigError(f"the new-client experiment starts from the global model of one of "
                      f"{METHODS}; this run's config.algorithm is {method!r}.")
  return method


def global_start(config: ml_collections.ConfigDict, setup: Any, server: Any) -> ClientStart:
  """The new client starting from the run's server model (see the module docstring).

  Args:
    config: the run's config.
    setup: the run's `Setup` (`experiment.Experiment.setup`, the plain model).
    server: the server variables `state["server"]` of the finished run.
  """
  method = check_method(config)
  if method == "fedfusion":
    group = fedfusion.fused_setup(config, setup).groups[0]
    variables = fedfusion.load_global_trunk(server)
    return ClientStart(group, variables, fedavg_family.cross_entropy_objective(group),
                       {"global": variables}, fedfusion_trainable_mask,
                       f"FedFusion-{config.fedfusion.fusion}: the server's fused model, frozen "
                       "global trunk loaded from the server's trunk; trunk, fusion and "
                       "classifier trained on cross-entropy")
  group = fedavg_family.the_group(setup, method)
  if method == "fedmmd":
    return ClientStart(group, server, fedmmd.make_objective(config)(group), {"global": server},
                       None, f"FedMMD: the server model; its local objective (CE + "
                       f"{float(config.fedmmd.weight):g} x {config.fedmmd.constraint}) with the "
                       "received model as the frozen global stream")
  return ClientStart(group, server, fedavg_family.cross_entropy_objective(group),
                     {"global": server}, None, "FedAvg: the server model, trained on cross-entropy")


def random_start(config: ml_collections.ConfigDict, setup: Any) -> ClientStart:
  """The reference: the run's plain model at a random initialisation, cross-entropy."""
  group = fedavg_family.the_group(setup, str(config.algorithm))
  key = jax.random.fold_in(jax.random.key(int(config.seed)), _STREAM * 8 + _RANDOM_INIT)
  variables = models.init_variables(group.model, key)
  return ClientStart(group, variables, fedavg_family.cross_entropy_objective(group),
                     {"global": variables}, None,
                     f"random initialisation of {group.name}, trained on cross-entropy")


def new_client_lr(config: ml_collections.ConfigDict, choice: str | float = "config") -> float:
  """The new client's (constant) learning rate.

  "config": `config.local.lr` (the rate of a run's first round); "last": the
  rate of the run's last round (`fedavg_family.local_lr_schedule`); a number: itself.
  """
  if isinstance(choice, str) and choice in LR_CHOICES:
    if choice == "config":
      return float(config.local.lr)
    schedule = fedavg_family.local_lr_schedule(config.local, int(config.num_rounds))
    return float(schedule(int(config.num_rounds) - 1))
  try:
    value = float(choice)
  except (TypeError, ValueError):
    raise ConfigError(f"the new client's learning rate must be one of {LR_CHOICES} or a "
                      f"number, got {choice!r}.") from None
  if not value > 0:
    raise ConfigError(f"the new client's learning rate must be > 0, got {value!r}.")
  return value


# --- Training and evaluation ---------------------------------------------------------------


def make_epoch_trainer(loss_fn: LocalLossFn, *, optimizer: Any, epochs: int, batch_size: int,
                       size: int, preprocess: Callable[[jax.Array], jax.Array]
                       ) -> Callable[..., Any]:
  """`train_epoch(variables, opt_state, aux, images, labels, key, epoch, lr)`: one local epoch.

  Epoch `epoch` of `make_local_trainer(loss_fn=..., epochs=epochs,
  max_size=size, ...)`'s training on one client holding `size` rows, with the
  optimiser state carried in and out: running epochs 0 ... E-1 in turn gives
  that trainer's result (same batch orders from `key`, same step keys), with
  the model available after every epoch.

  Returns:
    train_epoch -> (variables, opt_state, {"loss", ...: means over the epoch's
    steps}); images (size, 32, 32, 3) uint8, labels (size,), lr a scalar.
  """
  steps = batching.steps_per_epoch(size, batch_size)

  def train_epoch(variables, opt_state, aux, images, labels, key, epoch, learning_rate):
    plan_key, step_key = jax.random.split(key)
    plan = batching.plan_epochs(plan_key, size, max_size=size, epochs=epochs,
                                batch_size=batch_size)

    def step(carry, t):
      params, batch_stats, opt_state = carry
      rows, mask, _ = batching.batch_indices(plan, t, batch_size=batch_size, steps=steps)
      (loss, (new_stats, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch_stats, preprocess(images[rows]), labels[rows], mask,
          jax.random.fold_in(step_key, t), aux)
      params, opt_state = apply_updates(optimizer, params, grads, opt_state, learning_rate)
      return (params, new_stats, opt_state), {"loss": loss, **metrics}

    first = jnp.asarray(epoch, jnp.int32) * steps
    (params, batch_stats, opt_state), metrics = jax.lax.scan(
        step, (variables["params"], variables["batch_stats"], opt_state),
        first + jnp.arange(steps, dtype=jnp.int32))
    means = {name: jnp.mean(values) for name, values in metrics.items()}
    return {"params": params, "batch_stats": batch_stats}, opt_state, means

  return train_epoch


def make_accuracy(model: Any, *, size: int, batch_size: int, top_k: int,
                  preprocess: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
  """`accuracy(variables, images, labels)`: top-k accuracy (percent) of one model on one set.

  The library's evaluator (`evaluation.make_evaluator`: eval mode, static
  batches, padding masked) on a one-client group and a one-domain test set.
  """
  group = ClientGroup(name="new_client", model=model, clients=(0,), num_slots=1)
  evaluate = evaluation.make_evaluator((group,), batch_size=batch_size, max_size=size,
                                       top_k=top_k, preprocess=preprocess)

  def accuracy(variables, images, labels):
    state = {"groups": {group.name: {"variables": jax.tree_util.tree_map(
        lambda v: v[None], variables)}}}
    test = evaluation.TestData(images[None], labels[None], jnp.full((1,), size, jnp.int32))
    return evaluate(state, test)[group.name][0, 0]

  return accuracy


class Curve(NamedTuple):
  """A new client's training: accuracy after 0 ... E local epochs (percent), the mean
  training loss of epochs 1 ... E and the variables after epoch E."""
  accuracy: list[float]
  loss: list[float]
  variables: Any


def train_curve(start: ClientStart, data: NewClientData, config: ml_collections.ConfigDict,
                setup: Any, *, max_epochs: int, learning_rate: float,
                seed: int | None = None) -> Curve:
  """Trains the new client for `max_epochs` epochs from `start`, evaluating after each.

  Args:
    start: where it starts and what it minimises (`global_start` / `random_start`).
    data: its data (`new_client_data`).
    config: the run's config (`config.local`: optimiser, momentum, weight
      decay, batch size; `config.eval`: batch size, top-k).
    setup: the run's `Setup` (the normalisation statistics).
    max_epochs: E >= 1.
    learning_rate: the constant rate (`new_client_lr`).
    seed: seed of the batch orders (default `config.seed`; the same for
      every curve of an experiment).

  Returns:
    `Curve` (accuracy has E + 1 entries: before training, then after each epoch).
  """
  if int(max_epochs) < 1:
    raise ValueError(f"`max_epochs` must be >= 1, got {max_epochs!r}.")
  loc = config.local
  preprocess = normalizer(setup.private_mean, setup.private_std)
  optimizer = make_optimizer(loc.optimizer, weight_decay=float(loc.weight_decay),
                             momentum=float(loc.get("momentum", 0.0)),
                             decay_mask=start.decay_mask)
  train_epoch = jax.jit(make_epoch_trainer(
      start.loss_fn, optimizer=optimizer, epochs=int(max_epochs),
      batch_size=int(loc.batch_size), size=len(data.train), preprocess=preprocess))
  accuracy = jax.jit(make_accuracy(start.group.model, size=len(data.test),
                                   batch_size=int(config.eval.batch_size),
                                   top_k=int(config.eval.top_k), preprocess=preprocess))
  seed = int(config.seed) if seed is None else int(seed)
  key = jax.random.fold_in(jax.random.key(seed), _STREAM * 8 + _ORDER)
  train_images, train_labels = jnp.asarray(data.train.images), jnp.asarray(data.train.labels)
  test_images, test_labels = jnp.asarray(data.test.images), jnp.asarray(data.test.labels)
  variables = jax.device_put(start.variables)
  aux = jax.device_put(dict(start.aux))
  opt_state = optimizer.init(variables["params"])
  lr = jnp.float32(learning_rate)
  accuracies = [float(accuracy(variables, test_images, test_labels))]
  losses = []
  for epoch in range(int(max_epochs)):
    variables, opt_state, metrics = train_epoch(variables, opt_state, aux, train_images,
                                                train_labels, key, epoch, lr)
    accuracies.append(float(accuracy(variables, test_images, test_labels)))
    losses.append(float(metrics["loss"]))
  return Curve(accuracy=accuracies, loss=losses, variables=jax.device_get(variables))


# --- A finished run, restored --------------------------------------------------------------


def config_from_run_record(record: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The run's config from its run.json record (`workdir.run_record`), checked to round-trip.

  `base_config(algorithm)` with every recorded field set (fields the base
  config lacks, e.g. the Office configs' `scenario.office_test`, are added).
  """
  flat = dict(record["config"])
  config = base_config(str(flat["algorithm"]))
  present = workdir_lib.flatten_config(config)
  for field, value in flat.items():
    if field in present:
      continue
    *parents, leaf = field.split(".")
    node = config
    for part in parents:
      if part not in node:
        node[part] = ml_collections.ConfigDict()
      node = node[part]
    node[leaf] = tuple(value) if isinstance(value, list) else value
  config.update_from_flattened_dict({k: v for k, v in flat.items() if k in present})
  data = record.get("data") or {"fingerprint": None, "sources": {}}
  lines = workdir_lib.differences({"config": flat, "data": data},
                                  {"config": workdir_lib.flatten_config(config), "data": data}, ())
  if lines:
    raise WorkdirError("the config rebuilt from run.json differs from the recorded one:\n  "
                       + "\n  ".join(lines))
  validate_config(config)
  return config


@dataclasses.dataclass
class FinishedRun:
  """A finished run restored from its workdir.

  Attributes:
    workdir: the run's directory.
    config: its config (rebuilt from run.json).
    experiment: `experiment.Experiment(config)` (its data, setup, evaluation).
    state: the training state of its final checkpoint.
    round: the round of that checkpoint (= config.num_rounds).
    records: its metrics.jsonl records.
  """
  workdir: pathlib.Path
  config: ml_collections.ConfigDict
  experiment: Any
  state: Any
  round: int
  records: list[dict[str, Any]]

  @property
  def server(self) -> Any:
    """The server variables {"params", "batch_stats"} on the host."""
    return jax.device_get(self.state["server"])

  def recorded_accuracy(self) -> float | None:
    """The run's last recorded headline accuracy (mean test, or mean intra-domain), percent."""
    from fedjax_het.experiment import headline_kind  # pylint: disable=g-import-not-at-top
    name = f"eval/{headline_kind(self.experiment.accuracy_kinds)}/mean"
    values = [r[name] for r in self.records if name in r]
    return float(values[-1]) if values else None


def restore_finished_run(workdir: str | pathlib.Path, *, mesh: Any = None) -> FinishedRun:
  """Restores the final state of the finished run in `workdir` with the run's own config.

  The config comes from the workdir's run.json; the data are rebuilt from it
  and must have the fingerprint the run recorded (otherwise WorkdirError, e.g.
  when FEDJAX_HET_DATA_DIR now points at real data the run did not use); the
  state is the latest checkpoint, restored by `experiment.Experiment.restore_state`,
  and must be that of round `config.num_rounds`.
  """
  from fedjax_het.experiment import Experiment  # pylint: disable=g-import-not-at-top
  from fedjax_het.engine import sharding  # pylint: disable=g-import-not-at-top
  workdir = pathlib.Path(workdir)
  path = workdir / workdir_lib.RUN_FILE
  if not path.exists():
    raise WorkdirError(f"{str(workdir)!r} holds no {workdir_lib.RUN_FILE}: not the workdir of a "
                       "training run (train_and_evaluate / experiments/train.py writes it).")
  record = json.loads(path.read_text())
  config = config_from_run_record(record)
  if mesh is None and config.sharding.num_devices != 1:
    mesh = sharding.client_mesh(config.sharding.num_devices or None)
  experiment = Experiment(config, mesh=mesh)
  lines = workdir_lib.differences(record, workdir_lib.run_record(config, experiment.scenario), ())
  if lines:
    raise WorkdirError(f"the run in {str(workdir)!r} cannot be restored as it was trained:\n  "
                       + "\n  ".join(lines))
  checkpoints = workdir / "checkpoints"
  if not checkpoints.is_dir():
    raise WorkdirError(f"{str(workdir)!r} holds no checkpoints/.")
  checkpointer = checkpointing.Checkpointer(checkpoints, keep=int(config.checkpoint.keep))
  try:
    last = checkpointer.latest_round()
    if last is None or last != int(config.num_rounds):
      raise WorkdirError(f"the run in {str(workdir)!r} is not finished: its latest checkpoint "
                         f"is of round {last}, config.num_rounds is {int(config.num_rounds)} "
                         "(finish it with experiments/train.py and the same --workdir).")
    state = experiment.restore_state(checkpointer, last)
  finally:
    checkpointer.close()
  records = reporting.MetricsWriter(workdir, enabled=False).read()
  return FinishedRun(workdir=workdir, config=config, experiment=experiment, state=state,
                     round=last, records=records)


def method_label(config: ml_collections.ConfigDict) -> str:
  """"fedavg", "fedmmd_mmd", "fedfusion_conv", ... (the method and its variant)."""
  method = str(config.algorithm)
  if method == "fedfusion":
    return f"fedfusion_{config.fedfusion.fusion}"
  if method == "fedmmd":
    return f"fedmmd_{config.fedmmd.constraint}"
  return method


def data_fingerprint(data: NewClientData) -> str:
  """SHA-256 of the new client's data (to tell whether two runs' new clients are the same)."""
  digest = hashlib.sha256()
  for split in (data.train, data.test):
    for array in (split.images, split.labels):
      array = np.ascontiguousarray(array)
      digest.update(f"{array.dtype}:{array.shape};".encode())
      digest.update(array.data)
  return digest.hexdigest()


def summarize(accuracy: Sequence[float], *, tolerance: float, target: float | None
              ) -> dict[str, Any]:
  """best, epochs_to_converge and (with a target) epochs_to_target of one curve."""
  out = {"best": float(max(accuracy)), "final": float(accuracy[-1]),
         "epochs_to_converge": epochs_to_converge(accuracy, tolerance)}
  if target is not None and math.isfinite(target):
    out["epochs_to_target"] = epochs_to_target(accuracy, target)
  return out


# The experiment over finished runs, its report and plot (experiments/new_client.py is its
# command line).

RANDOM_LABEL = "random init"


def default_out(run_dirs: Sequence[pathlib.Path]) -> pathlib.Path:
  """<run>/new_client for one run, <common parent>/new_client for several."""
  if len(run_dirs) == 1:
    return run_dirs[0] / "new_client"
  return pathlib.Path(os.path.commonpath([str(p.absolute()) for p in run_dirs])) / "new_client"


def resolve_target(target: str | float | None, runs: Sequence[FinishedRun]) -> float | None:
  """--target: a percent, "none", or "auto" (the first run's first eval.targets, else none)."""
  if target is None or (isinstance(target, str) and target.lower() == "none"):
    return None
  if isinstance(target, str) and target.lower() == "auto":
    targets = tuple(runs[0].config.eval.targets)
    return float(targets[0]) if targets else None
  value = float(target)
  if not 0 < value <= 100:
    raise ConfigError(f"--target must be a percent in (0, 100], 'auto' or 'none', got "
                         f"{target!r}.")
  return value


def _unique_labels(labels: list[str], runs: Sequence[FinishedRun]) -> list[str]:
  """Method labels, suffixed with the run's directory name where two are equal."""
  return [f"{label} ({run.workdir.name})" if labels.count(label) > 1 else label
          for label, run in zip(labels, runs)]


def run_experiment(run_dirs: Sequence[str | os.PathLike], *, out: str | os.PathLike | None = None,
                   max_epochs: int = 20, tolerance: float = 0.5,
                   target: str | float | None = "auto", lr: str | float = "config",
                   seed: int | None = None, plot: bool = True,
                   echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the new-client experiment on finished runs; writes and returns the results.

  Args:
    run_dirs: workdirs of finished runs (FedAvg, FedMMD or FedFusion).
    out: output directory (default: `default_out`).
    max_epochs: local epochs of every new client.
    tolerance: points below the best accuracy that count as converged.
    target: accuracy target in percent, "auto" or "none" (`resolve_target`).
    lr: "config", "last" or a rate (`new_client.new_client_lr`).
    seed: seed of the data halves and batch orders (default: each run's seed).
    plot: write new_client.png (needs matplotlib).
    echo: progress lines.

  Returns:
    The contents of new_client.json.
  """
  tick = time.perf_counter()
  if not run_dirs:
    raise ConfigError("--runs: name at least one finished run's workdir.")
  if int(max_epochs) < 1:
    raise ConfigError(f"--max_epochs must be >= 1, got {max_epochs!r}.")
  if not float(tolerance) >= 0:
    raise ConfigError(f"--tolerance must be >= 0, got {tolerance!r}.")
  paths = [pathlib.Path(p) for p in run_dirs]
  runs = []
  for path in paths:
    echo(f"restoring {path}")
    run = restore_finished_run(path)
    check_method(run.config)
    runs.append(run)
  target_value = resolve_target(target, runs)
  labels = _unique_labels([method_label(r.config) for r in runs], runs)
  curves, references, datasets = [], {}, {}
  for run, label in zip(runs, labels):
    config, setup = run.config, run.experiment.setup
    data = new_client_data(config, run.experiment.scenario, seed=seed)
    fingerprint = data_fingerprint(data)
    datasets[fingerprint] = data.description
    rate = new_client_lr(config, lr)
    start = global_start(config, setup, run.server)
    echo(f"{label}: {max_epochs} local epochs from the global model at lr {rate:g}")
    began = time.perf_counter()
    curve = train_curve(start, data, config, setup, max_epochs=max_epochs,
                           learning_rate=rate, seed=seed)
    # The server model exactly as the run evaluated it, on the new client's evaluation half
    # (FedFusion: before its frozen trunk is reloaded, so it may differ from epoch 0).
    accuracy = jax_accuracy(start, data, config, setup)
    curves.append({
        "label": label, "kind": "global", "run": str(run.workdir), "config_name": config.name,
        "method": str(config.algorithm), "start": start.description, "learning_rate": rate,
        "rounds_trained": run.round, "data_fingerprint": fingerprint,
        "federation_accuracy": run.recorded_accuracy(),
        "server_model_accuracy": float(accuracy(run.server)),
        "accuracy": curve.accuracy, "loss": curve.loss,
        "seconds": time.perf_counter() - began,
        **summarize(curve.accuracy, tolerance=float(tolerance), target=target_value)})
    key = json.dumps([fingerprint, config.models.to_dict(), config.local.to_dict(),
                      config.eval.to_dict(), rate, seed if seed is not None else int(config.seed)],
                     sort_keys=True, default=str)
    if key not in references:
      references[key] = (run, data, rate, fingerprint)
  for run, data, rate, fingerprint in references.values():
    label = RANDOM_LABEL if len(references) == 1 else f"{RANDOM_LABEL} ({labels[runs.index(run)]})"
    start = random_start(run.config, run.experiment.setup)
    echo(f"{label}: {max_epochs} local epochs from a random initialisation at lr {rate:g}")
    began = time.perf_counter()
    curve = train_curve(start, data, run.config, run.experiment.setup,
                           max_epochs=max_epochs, learning_rate=rate, seed=seed)
    curves.append({
        "label": label, "kind": "random", "run": str(run.workdir),
        "config_name": run.config.name, "method": "random", "start": start.description,
        "learning_rate": rate, "data_fingerprint": fingerprint,
        "accuracy": curve.accuracy, "loss": curve.loss,
        "seconds": time.perf_counter() - began,
        **summarize(curve.accuracy, tolerance=float(tolerance), target=target_value)})
  out_dir = pathlib.Path(out) if out is not None else default_out(paths)
  out_dir.mkdir(parents=True, exist_ok=True)
  results = {
      "experiment": "new_client (FedFusion paper Sec. 4.3.2, Fig. 6)",
      "runs": [str(p) for p in paths], "max_epochs": int(max_epochs),
      "tolerance": float(tolerance), "target": target_value, "lr": str(lr),
      "seed": seed, "data": sorted(datasets.values()),
      "definitions": {
          "epoch 0": "the starting model, before any local training",
          "epochs_to_converge": f"the first epoch whose accuracy is within {tolerance:g} points "
                                f"of the curve's best accuracy over epochs 0-{max_epochs}",
          "epochs_to_target": "the first epoch whose accuracy reaches the target (null: never)",
          "federation_accuracy": "the run's last recorded mean (intra-domain) test accuracy",
          "server_model_accuracy": "the server model as the run evaluates it, on the new "
                                   "client's evaluation half",
      },
      "curves": curves, "wall_seconds": time.perf_counter() - tick}
  workdir_lib.write_atomic(out_dir / "new_client.json", json.dumps(results, indent=2) + "\n")
  workdir_lib.write_atomic(out_dir / "new_client.md", markdown(results))
  if plot:
    plot_curves(results, out_dir / "new_client.png")
  echo(f"wrote {out_dir / 'new_client.md'}")
  return results


def jax_accuracy(start: ClientStart, data: NewClientData, config: Any,
                 setup: Any) -> Callable[[Any], float]:
  """variables -> accuracy (percent) of `start`'s model on the new client's evaluation half."""
  accuracy = jax.jit(make_accuracy(start.group.model, size=len(data.test),
                                      batch_size=int(config.eval.batch_size),
                                      top_k=int(config.eval.top_k),
                                      preprocess=normalizer(setup.private_mean,
                                                            setup.private_std)))
  images, labels = jnp.asarray(data.test.images), jnp.asarray(data.test.labels)
  return lambda variables: float(accuracy(variables, images, labels))


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
  if value is None:
    return "—"
  return fmt.format(value) if isinstance(value, float) else str(value)


def markdown(results: dict[str, Any]) -> str:
  """new_client.md: the summary table and the accuracy per epoch."""
  target, tolerance = results["target"], results["tolerance"]
  lines = ["# New client: local epochs to converge from each method's global model",
           "", "FedFusion paper Sec. 4.3.2 / Fig. 6. Runs: "
           + ", ".join(f"`{r}`" for r in results["runs"]) + ".", ""]
  lines += [f"Data: {d}" for d in results["data"]]
  lines += ["", f"Local training: {results['max_epochs']} epochs with each run's local optimiser "
            f"(config.local) at a constant learning rate (--lr={results['lr']}: "
            + ", ".join(sorted({f"{c['learning_rate']:g}" for c in results["curves"]})) + ").",
            f"Epochs to converge: the first epoch within {tolerance:g} points of the curve's best "
            f"accuracy (epochs 0-{results['max_epochs']}; epoch 0 = before training)."
            + (f" Epochs to target: the first epoch reaching {target:g}%." if target else ""), ""]
  header = ["start", "epoch 0", "best", "final", f"epochs to converge (±{tolerance:g})"]
  if target:
    header.append(f"epochs to {target:g}%")
  header += ["federation accuracy (run)", "server model on new client"]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for c in results["curves"]:
    row = [c["label"], _cell(c["accuracy"][0]), _cell(c["best"]), _cell(c["final"]),
           _cell(c["epochs_to_converge"])]
    if target:
      row.append(_cell(c.get("epochs_to_target")) if c.get("epochs_to_target") is not None
                 else f"not in {results['max_epochs']}")
    row += [_cell(c.get("federation_accuracy")), _cell(c.get("server_model_accuracy"))]
    lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Accuracy (%) on the new client's evaluation half after each local epoch:", ""]
  names = [c["label"] for c in results["curves"]]
  lines += ["| epoch | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
  for epoch in range(results["max_epochs"] + 1):
    lines.append(f"| {epoch} | " + " | ".join(f"{c['accuracy'][epoch]:.2f}"
                                              for c in results["curves"]) + " |")
  lines += ["", "Starts:", *[f"- {c['label']}: {c['start']}." for c in results["curves"]], ""]
  return "\n".join(lines)


def plot_curves(results: dict[str, Any], path: pathlib.Path) -> bool:
  """Accuracy vs local epochs, one line per start (reference dashed). False without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib is not installed (pip install 'fedjax_het[viz]'): no plot.")
    return False
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for c in results["curves"]:
    epochs = range(len(c["accuracy"]))
    ax.plot(epochs, c["accuracy"], "--" if c["kind"] == "random" else "-", marker="o",
            markersize=3, label=f"{c['label']} (converged at {c['epochs_to_converge']})")
  if results["target"]:
    ax.axhline(results["target"], color="grey", linestyle=":", linewidth=1,
               label=f"target {results['target']:g}%")
  ax.set_xlabel("local epochs of the new client")
  ax.set_ylabel("test accuracy (%)")
  ax.set_title("New client: accuracy vs local epochs from each method's start")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True

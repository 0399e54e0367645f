"""Shared setup of the tiny runs the method tests check by hand.

Public-data methods (FedMD, FedDF, RCFL, FedMatch, RHFL, FML, FCCL): TinyLinear
participants with identity normalisation (`tiny_public_setup`) and configs of plain SGD at
constant rates (`tiny_public_config`, `public_sgd`, `local_sgd`). Class-incremental
baselines (iCaRL, DDE, PODNet, BiC, GeoDL, SS-IL + FL): their replay settings
(`tiny_replay`), the jitted rounds across the task change of `test_cil_train.tiny_stream`
(`rounds_across_a_task_change`) and the evaluation on its test set (`evaluate_seen`). A
config field added after runs were recorded: what resuming such a record reports
(`lines_against_a_record_without`).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import workdir
from fedjax_het.algorithms import cil_replay
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import base_config
from fedjax_het.engine import api, clients, rounds
from tests.tiny_models import TinyLinear

STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
IMAGES = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))  # a preprocessed public batch


# ------------------------------------------------------------------------ public-data methods


def tiny_public_setup(archs=("a", "b"), *, slot_multiple=1, max_size=6, num_classes=3):
  """One TinyLinear participant per entry of `archs` (grouped by name), identity
  normalisation (mean 0, std 1 on [0, 1] inputs), 4 rounds, test sets of at most 4."""
  model = TinyLinear(num_classes=num_classes)
  groups = clients.group_clients(list(archs), [model] * len(archs), slot_multiple=slot_multiple)
  return api.Setup(groups=groups, num_participants=len(archs), num_classes=num_classes,
                   num_rounds=4, max_sizes={g.name: max_size for g in groups},
                   private_mean=STATS[0], private_std=STATS[1], public_mean=STATS[0],
                   public_std=STATS[1], max_test_size=4)


def tiny_public_data(setup, public_size=0, seed=0):
  """FederatedArrays of participants with 6, 4 and 5 random uint8 images and labels in
  [0, C), then `public_size` public images, all from one generator seeded `seed`."""
  rng = np.random.default_rng(seed)
  sizes = [6, 4, 5][:setup.num_participants]
  images = [rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8) for n in sizes]
  labels = [rng.integers(0, setup.num_classes, n).astype(np.int32) for n in sizes]
  groups = {g.name: jax.device_put(clients.stack_group_data(
      g, images, labels, num_participants=setup.num_participants, max_size=6))
            for g in setup.groups}
  pub = jnp.asarray(rng.integers(0, 255, (public_size, 32, 32, 3), dtype=np.uint8))
  return api.FederatedArrays(groups=groups, public=pub, test=None)


def participant_heads(state, setup):
  """{participant: (kernel (3072, C), bias (C,))} of every TinyLinear head as float64 NumPy."""
  out = {}
  for g in setup.groups:
    head = state["groups"][g.name]["variables"]["params"]["head"]
    for slot, p in enumerate(g.clients):
      out[p] = (np.asarray(head["kernel"][slot], np.float64),
                np.asarray(head["bias"][slot], np.float64))
  return out


def local_sgd(config, *, lr=0.05, epochs=1, batch_size=6):
  """`config` whose local phase is plain SGD at the constant rate `lr` without weight decay,
  `epochs` epochs (None: the method's own) of batches of `batch_size`."""
  loc = config.local
  loc.optimizer = "sgd"
  loc.lr = lr
  loc.lr_decay = 0.0
  loc.weight_decay = 0.0
  if epochs is not None:
    loc.epochs = epochs
  loc.batch_size = batch_size
  return config


def public_batches(config, *, batch_size=4, augmentation="none"):
  """`config` whose public phase takes batches of `batch_size` (None: the method's own) with
  `augmentation` (None: the method's own)."""
  if batch_size is not None:
    config.collaborative.batch_size = batch_size
  if augmentation is not None:
    config.collaborative.augmentation = augmentation
  return config


def public_sgd(config, *, lr=0.1, batch_size=4, augmentation="none"):
  """`config` whose public phase is plain SGD at the constant rate `lr` (`public_batches`)."""
  config.collaborative.optimizer = "sgd"
  config.collaborative.lr = lr
  config.collaborative.lr_decay = 0.0
  return public_batches(config, batch_size=batch_size, augmentation=augmentation)


def tiny_public_config(method, **fields):
  """`method`'s base config with `public_sgd`, `local_sgd` and evaluation batches of 4, then
  `fields` (flattened names, e.g. {"fedmd.warmup_epochs": 0})."""
  c = local_sgd(public_sgd(base_config(method)))
  c.eval.batch_size = 4
  c.update_from_flattened_dict(fields)
  return c


def rounds_traced_once(experiment, num_rounds):
  """`num_rounds` rounds of an `Experiment` from its initial state through ONE trace of the
  jitted round, every metric finite: (the final state, every round's metrics)."""
  state = experiment.init_state()
  chex.clear_trace_counter()
  step = jax.jit(chex.assert_max_traces(experiment.round_fn, n=1))
  history = []
  for _ in range(num_rounds):  # a second trace would raise AssertionError
    state, metrics = step(state, experiment.data)
    for leaf in jax.tree_util.tree_leaves(metrics):
      assert np.all(np.isfinite(np.asarray(leaf)))
    history.append(metrics)
  return state, history


# --------------------------------------------------------------- class-incremental baselines


def tiny_replay(stream, memory_size=8):
  """Replay settings of `memory_size` distinct exemplars per client (at most `memory_size`
  of a class) for the clients of `stream`."""
  return cil_replay.ReplaySettings(memory_size=memory_size, distinct=True,
                                   max_per_class=memory_size,
                                   max_client_classes=int(stream.client_classes.sum(-1).max()))


def rounds_across_a_task_change(algorithm, stream, *, after_round=None):
  """Rounds 0-3 of `stream` (tasks 0, 0, 1, 1 of `tiny_stream`) of the jitted round from key 0.

  `after_round(state, history)` runs after every round. Returns (the final state, every
  round's metrics).
  """
  data = jax.device_put(cil_stream.stream_arrays(stream))
  round_fn = jax.jit(rounds.make_round_fn(algorithm))
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  history = []
  for _ in range(4):
    state, metrics = round_fn(state, data)
    history.append(metrics)
    if after_round is not None:
      after_round(state, history)
  return state, history


def evaluate_seen(algorithm, state, stream, num_seen=4):
  """The jitted `algorithm.evaluate` on `stream`'s test set with `num_seen` classes seen:
  per-class (correct, total, predicted) counts."""
  return jax.jit(algorithm.evaluate)(
      state, (jnp.asarray(stream.test_images), jnp.asarray(stream.test_labels),
              jnp.int32(num_seen)))


def lines_against_a_record_without(config, field):
  """`workdir.differences` of resuming, with `config`, a run recorded before `field` existed
  (its record: `config`'s other fields, the same data)."""
  current = workdir.flatten_config(config)
  recorded = {k: v for k, v in current.items() if k != field}
  data = {"fingerprint": "x", "sources": {}}
  return workdir.differences({"config": recorded, "data": data},
                             {"config": current, "data": data}, ())

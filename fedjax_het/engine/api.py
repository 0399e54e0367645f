"""The types an algorithm and the engine share: `Setup`, `FederatedArrays`, `Algorithm`.

A federated method is an `Algorithm`: a NamedTuple of pure functions over an
explicit state pytree (optax's `GradientTransformation(init, update)`, fedjax's
`FederatedAlgorithm(init, apply)`):

    state            = init(key, data)
    state, metrics   = round(state, data, key, round_index)
    accuracy         = evaluate(state, data.test)
    arrays           = diagnostics.compute(state, data)        (optional)

The method owns its round: `round` is a short sequence of engine blocks (a
public-batch scan, local training of a set of participants, cohort sampling,
aggregation, a server optimiser step) in the order the paper gives. The engine
wraps it (`engine.rounds`) into one jitted, traced-once program that scans over
rounds; the trainer (`fedjax_het.train`) runs any `Algorithm` the same way.

A method may also give its round as `stages` (e.g. FCCL+'s public phase, then
its local phase), with `round = rounds.staged_round(stages)`. The trainer can
then compile each stage as a program of its own and run them one after the
other (`config.round_programs`): the same computations, and XLA compiles and
loads a few smaller programs faster than one large one.

State conventions (what the trainer relies on):
  * `state["groups"][group_name]` holds per-participant entries with the slot
    axis leading (sharded over the `clients` mesh axis); at least
    `["variables"]` = {"params", "batch_stats"} of every slot is what
    `evaluate` and the diagnostics usually read.
  * Every other top-level entry (a server model, its optimiser state, a task
    counter) is replicated.
  * metrics = {phase: {group_name: {metric: (slots,)}}} for per-participant
    values, or {phase: {metric: ()}} for scalars (e.g. the server's).

This module imports nothing from `fedjax_het.algorithms`: the dependency
direction is algorithms -> engine -> models / losses / data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_het.engine.clients import ClientGroup, GroupData

State = Any
Metrics = Mapping[str, Any]


class FederatedArrays(NamedTuple):
  """Everything a round reads, as (device) arrays.

  `num_rounds`, the run's number of rounds E as an int32 scalar, is what the
  schedules of the run's length read (`optim.run_length`), so a round's program
  does not depend on E; None (arrays built by hand) leaves them the
  `Setup.num_rounds` they were built with, a constant of the program.
  """
  groups: Mapping[str, GroupData]  # private data per architecture group
  public: Any                      # (N0, 32, 32, 3) uint8, may have 0 rows
  test: Any                        # evaluation.TestData
  num_rounds: Any = None           # () int32, or None


@dataclasses.dataclass(frozen=True)
class Setup:
  """Static facts about a run that `make_<method>` turns into Python constants.

  Attributes:
    groups: the architecture groups.
    num_participants: K.
    num_classes: C.
    num_rounds: E (for learning-rate schedules, unless `FederatedArrays.num_rounds`
      gives it at run time).
    max_sizes: padded private rows per group.
    private_mean, private_std: normalisation of private images.
    public_mean, public_std: normalisation of public images.
    max_test_size: padded rows of the stacked test sets.
    test_sizes: the real rows of each domain's test set, in the stacked order
      (empty when unknown: the evaluator then runs every domain's padded rows).
  """
  groups: tuple[ClientGroup, ...]
  num_participants: int
  num_classes: int
  num_rounds: int
  max_sizes: Mapping[str, int]
  private_mean: tuple[float, float, float]
  private_std: tuple[float, float, float]
  public_mean: tuple[float, float, float]
  public_std: tuple[float, float, float]
  max_test_size: int
  test_sizes: tuple[int, ...] = ()

  @property
  def homogeneous(self) -> bool:
    """All participants share one architecture (one group)."""
    return len(self.groups) == 1


class Diagnostics(NamedTuple):
  """An optional per-method figure, computed at `config.logging.diagnostic_rounds` on the
  public batch (a run without public data, `scenario.public_size=0`, has none).

  Attributes:
    name: file stem: the trainer writes `<name>.npz` (one array per round, in
      participant order) and `<name>.png`.
    compute: (state, data) -> {group: (slots, ...)} arrays, jittable.
    plot: (per-round {round: (K, ...) array}, participant names, path) ->
      bool (False when nothing was drawn, e.g. without matplotlib).
  """
  name: str
  compute: Callable[[State, FederatedArrays], Mapping[str, jax.Array]]
  plot: Callable[[Mapping[int, np.ndarray], list[str], Any], bool]


class Stage(NamedTuple):
  """One stage of a round (see `Algorithm.stages`).

  Attributes:
    name: what the stage is (e.g. "public", "local"); names the stage's
      program in logs and benchmarks, unique within a round.
    run: (state, data, key, round_index) -> (state, metrics), with the
      arguments of `Algorithm.round`: the round's key and index, so a stage
      draws the same numbers whether the round runs as one program or as
      stages. It returns the whole state; its metrics are a dict whose top-level
      keys no other stage of the round uses.
    groups_independent: each participant group's new `state["groups"][g]` (and
      its metrics, a dict keyed by the group names) depends on that group's own
      state and data only, as in a local phase where every participant trains on
      its private data. `config.round_programs="groups"` then compiles the stage
      as one program per group (`fedjax_het.runtime.programs`); with False it
      stays one program.
  """
  name: str
  run: Callable[[State, FederatedArrays, jax.Array, jax.Array], tuple[State, Metrics]]
  groups_independent: bool = False


class Algorithm(NamedTuple):
  """A federated method as pure functions (see the module docstring).

  Attributes:
    name: method name (the `config.algorithm` it was built from).
    init: (key, data: FederatedArrays) -> state. May train (e.g. FCCL's
      pretraining).
    round: (state, data, key, round_index) -> (state, metrics): one
      communication round. `key` is this round's key (the engine folds the
      round index into the run key), `round_index` the 0-based round as a
      traced int32.
    evaluate: (state, test data) -> {group: accuracy (slots, domains)} in
      percent, one row per slot and one column per test domain.
    diagnostics: optional `Diagnostics`.
    stages: optional: the round as `Stage`s run in order, for a method whose
      `round` is `rounds.staged_round(stages)`; empty when the round is one
      piece.
  """
  name: str
  init: Callable[[jax.Array, FederatedArrays], State]
  round: Callable[[State, FederatedArrays, jax.Array, jax.Array], tuple[State, Metrics]]
  evaluate: Callable[[State, Any], Mapping[str, jax.Array]]
  diagnostics: Diagnostics | None = None
  stages: tuple[Stage, ...] = ()

"""The run contract: what the training loop (`train.train_and_evaluate`) needs of a run.

Two protocols, each with its implementations:

  RunBuilder  one run built from its config: `experiment.Experiment` (domain-shift and
              partitioned scenarios) and `stream_experiment.StreamExperiment` (the
              class-incremental task stream). It owns the config, the algorithm, the data,
              the compiled programs, the records of a round, the evaluation, the results.
  Run         what the loop trains: `seed_stack.SingleRun` (one builder as one lane) and
              `seed_stack.SeedStack` (several seeds' builders as one vmapped program). It
              reads its lanes' builders and turns their state and metrics into each lane's.

The loop calls nothing else on either; tests/test_run_contract.py checks every
implementation has every member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import ml_collections


@runtime_checkable
class RunBuilder(Protocol):
  """One run built from its config (`Experiment`, `StreamExperiment`)."""

  config: ml_collections.ConfigDict
  algorithm: Any        # engine.api.Algorithm
  data: Any             # the device arrays every round reads
  num_rounds: int
  has_public: bool      # whether the method has a public batch (its diagnostics draw on it)
  conv_impl: str        # the convolutions chosen for the local phase / the public batch
  public_conv_impl: str

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "RunBuilder":
    """The same run with other convolution implementations (the memory fallback)."""

  def run_record(self) -> dict[str, Any]:
    """The run's identity (what a checkpoint must match to be resumed)."""

  def metadata(self) -> dict[str, Any]:
    """metadata.json: data provenance, sizes, devices."""

  def init_state(self) -> Any:
    """The state before round 1."""

  def restore_state(self, checkpointer: Any, round_index: int) -> Any:
    """The state of the checkpoint of `round_index`."""

  def compile_all(self, state: Any, *, with_diagnostics: bool) -> Callable[..., Any]:
    """Compiles the round (and the evaluation); returns `run_rounds(state, data)`."""

  def train_records(self, metrics: Any, num_rounds: int) -> list[dict[str, Any]]:
    """The per-round records of `num_rounds` rounds' metrics."""

  def is_eval_round(self, done: int) -> bool:
    """Whether the loop evaluates after round `done`."""

  def is_checkpoint_round(self, done: int) -> bool:
    """Whether the loop writes a checkpoint after round `done`."""

  def evaluation_record(self, state: Any, done: int) -> dict[str, Any]:
    """The evaluation metrics of `state` after round `done`."""

  def diagnostics(self, state: Any) -> Any:
    """The method's diagnostics of `state` (e.g. FCCL+'s cross-correlation matrices)."""

  def progress_text(self, last: dict[str, Any]) -> str:
    """The progress line's accuracy part, from the last record."""

  def results(self, records: list[dict[str, Any]], done: int) -> tuple[str, dict[str, Any]]:
    """(results.md, results.json's numbers) of the records."""

  def plot(self, records: list[dict[str, Any]], numbers: dict[str, Any], workdir: Any,
           diagnostics: Any = None) -> None:
    """The run's figures in its workdir."""


@runtime_checkable
class Run(Protocol):
  """What the loop trains: one builder (`SingleRun`) or several seeds' (`SeedStack`)."""

  @property
  def experiment(self) -> RunBuilder:
    """The first lane's builder: what every lane shares (names, rounds, conv choices)."""

  @property
  def lanes(self) -> Sequence[RunBuilder]:
    """One builder per lane (per seed), each with its own workdir."""

  @property
  def data(self) -> Any:
    """The device arrays the compiled round reads (stacked over lanes in a SeedStack)."""

  def init_state(self) -> Any:
    """The state before round 1 (every lane's)."""

  def lane_state(self, state: Any, lane: int) -> Any:
    """Lane `lane`'s part of `state` (what its checkpoint holds)."""

  def join(self, checkpointers: Sequence[Any], round_index: int) -> Any:
    """The state restored from every lane's checkpoint of `round_index`."""

  def compile_all(self, state: Any, *, with_diagnostics: bool) -> Callable[..., Any]:
    """Compiles the round and returns `run_rounds(state, data)`."""

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "Run":
    """The same run with other convolution implementations."""

  def train_records(self, metrics: Any, num_rounds: int) -> list[list[dict[str, Any]]]:
    """Each lane's per-round records."""

  def evaluation_records(self, state: Any, done: int) -> list[dict[str, Any]]:
    """Each lane's evaluation metrics after round `done`."""

  def diagnostics(self, state: Any) -> list[Any]:
    """Each lane's diagnostics."""


def members(protocol: type) -> list[str]:
  """The names a protocol declares (its annotations and its methods)."""
  names = set(getattr(protocol, "__annotations__", {}))
  names |= {n for n, v in vars(protocol).items()
            if not n.startswith("_") and (callable(v) or isinstance(v, property))}
  return sorted(names)

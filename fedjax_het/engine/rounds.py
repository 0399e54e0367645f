"""The round wrapper: an `Algorithm`'s round as one jitted, scanned program.

    state = initial_state(algorithm, key, data)
    round_fn = make_round_fn(algorithm)            # (state, data) -> (state, metrics)
    run_rounds = make_run_rounds(round_fn, n)      # n rounds as one lax.scan
    stage_fns = make_stage_fns(algorithm)         # or: the round's stages, one program each

The engine adds bookkeeping to the method's state: the round counter
(`state["round"]`) and the run key (`state["rng"]`). Round r calls
`algorithm.round(state, data, fold_in(run_key, r), r)`, so a resumed run draws
the same numbers as an uninterrupted one, inside `optim.run_length(data.num_rounds)`
(`FederatedArrays.num_rounds`; data without it leaves the schedules their own), so
the schedules read the run's number of rounds from the data. The engine never
decides a method's phase order: that is the method's `round`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.engine import optim
from fedjax_het.engine.api import Algorithm, FederatedArrays, Stage

BOOKKEEPING = ("round", "rng")


def initial_state(algorithm: Algorithm, key: jax.Array, data: FederatedArrays) -> dict[str, Any]:
  """`algorithm.init` plus the engine's bookkeeping (round counter, run key)."""
  init_key, run_key = jax.random.split(key)
  state = dict(algorithm.init(init_key, data))
  clash = set(state) & set(BOOKKEEPING)
  if clash:
    raise ValueError(f"algorithm {algorithm.name!r}: state keys {sorted(clash)} are reserved "
                     "for the engine's bookkeeping.")
  state["round"] = jnp.zeros((), jnp.int32)
  state["rng"] = jax.random.key_data(run_key)
  return state


def _num_rounds(data: Any) -> Any:
  """The run's number of rounds the data carries (`FederatedArrays.num_rounds`), else None."""
  return getattr(data, "num_rounds", None)


def method_state(state: dict[str, Any]) -> dict[str, Any]:
  """The state without the engine's bookkeeping (what `algorithm.round` sees)."""
  return {k: v for k, v in state.items() if k not in BOOKKEEPING}


def make_round_fn(algorithm: Algorithm) -> Callable[[Any, FederatedArrays], tuple[Any, Any]]:
  """Builds the (un-jitted) pure `round_fn(state, data) -> (state, metrics)`."""

  def round_fn(state, data):
    round_index = state["round"]
    key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), round_index)
    with optim.run_length(_num_rounds(data)):
      new_state, metrics = algorithm.round(method_state(state), data, key, round_index)
    return {**new_state, "round": round_index + 1, "rng": state["rng"]}, metrics

  return round_fn


def make_run_rounds(round_fn: Callable[[Any, FederatedArrays], tuple[Any, Any]],
                    num_rounds: int) -> Callable[[Any, FederatedArrays], tuple[Any, Any]]:
  """`num_rounds` rounds as one `lax.scan` (metrics stacked on a leading axis)."""
  def run_rounds(state, data):
    return jax.lax.scan(lambda s, _: round_fn(s, data), state, None, length=num_rounds)
  return run_rounds


def staged_round(stages: tuple[Stage, ...]) -> Callable[..., tuple[Any, Any]]:
  """The round that runs `stages` in order: (state, data, key, round_index) -> (state, metrics).

  Each stage gets the round's key and index; the round's metrics are the
  union of the stages' top-level metric entries (a key two stages both
  return is an error: the second would hide the first).
  """
  names = [stage.name for stage in stages]
  if not stages or len(set(names)) != len(names):
    raise ValueError(f"a staged round needs at least one stage and unique stage names; got "
                     f"{names}")

  def round_fn(state, data, key, round_index):
    metrics = {}
    for stage in stages:
      state, stage_metrics = stage.run(state, data, key, round_index)
      clash = set(metrics) & set(stage_metrics)
      if clash:
        raise ValueError(f"stage {stage.name!r} returns metrics {sorted(clash)} that an earlier "
                         "stage of the round returned too")
      metrics.update(stage_metrics)
    return state, metrics

  return round_fn


def make_stage_fns(algorithm: Algorithm) -> tuple[tuple[str, Callable[..., Any]], ...]:
  """The algorithm's stages as (name, `stage_fn(state, data) -> (state, metrics)`) pairs.

  Running the stage functions in order is `make_round_fn(algorithm)`: every
  stage reads the round counter and run key of the state it gets (so all
  stages of a round see the same key and index), and the last one advances
  the counter. Raises ValueError for an algorithm without stages.
  """
  if not algorithm.stages:
    raise ValueError(f"algorithm {algorithm.name!r} has no stages: its round is one piece")
  last = len(algorithm.stages) - 1

  def stage_fn(stage, advance):
    def run(state, data):
      round_index = state["round"]
      key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), round_index)
      with optim.run_length(_num_rounds(data)):
        new_state, metrics = stage.run(method_state(state), data, key, round_index)
      return {**new_state, "round": round_index + advance, "rng": state["rng"]}, metrics
    return run

  return tuple((stage.name, stage_fn(stage, int(i == last)))
               for i, stage in enumerate(algorithm.stages))

"""A round compiled as one XLA program per stage (`config.round_programs="stages"`).

A method that gives its round as `Algorithm.stages` (FCCL+: the public phase,
then the local phase) can be compiled stage by stage: `lower_stages` lowers one
program per stage, `LoweredStages.compile` compiles them (side by side on a
CPU), and `CompiledStages` runs them one after the other, `rounds_per_call`
rounds per call, with the interface of a compiled `run_rounds`:
`(state, data) -> (state, metrics stacked on a leading rounds axis)`.

Why: the stages are the same computations as the one-program round (the
rounds are bitwise identical in the tests and in the quick FCCL+ round), but
XLA handles a few smaller modules faster than one large one. On XLA:CPU,
loading an executable from the persistent compilation cache grows with the
product of the module's size and its number of YNNPACK fusions
(`xla::cpu::YnnFusionThunkFromProto` looks each fusion up among the module's
instructions), so two programs of half the size load in well under the time of
the one; and programs compiled side by side share the single-threaded HLO
passes between cores.
"""

from __future__ import annotations

import concurrent.futures
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from fedjax_het.engine import sharding
from fedjax_het.errors import ConfigError

#: The choices of `config.round_programs`.
ROUND_PROGRAMS = ("auto", "one", "stages")


def resolve(choice: str, has_stages: bool) -> str:
  """`config.round_programs` (one of `ROUND_PROGRAMS`, checked by `validate_config`) -> "one"
  or "stages" ("auto": stages when the method has them).

  Raises ConfigError for "stages" asked of a method whose round is one piece.
  """
  if choice == "stages" and not has_stages:
    raise ConfigError("config.round_programs='stages' needs a method whose round is given as "
                     "stages (Algorithm.stages); this method's round is one piece: use 'one' "
                     "or 'auto'")
  if choice == "auto":
    return "stages" if has_stages else "one"
  return choice


class CompiledStages:
  """The compiled stage programs, called as a compiled `run_rounds` is.

  Attributes:
    names: the stages' names, in order.
    compiled: their compiled programs, `(state, data) -> (state, metrics)`.
    rounds_per_call: rounds run by one call.
    compile_secs: {stage name: seconds its `.compile()` took} (a persistent
      cache hit: the time to load it).
  """

  def __init__(self, names: Sequence[str], compiled: Sequence[Any], rounds_per_call: int,
               compile_secs: dict[str, float]):
    self.names, self.compiled = tuple(names), tuple(compiled)
    self.rounds_per_call, self.compile_secs = int(rounds_per_call), dict(compile_secs)

  def __call__(self, state: Any, data: Any) -> tuple[Any, Any]:
    """`rounds_per_call` rounds; the metrics (host arrays) stacked on a leading rounds axis."""
    per_round = []
    for _ in range(self.rounds_per_call):
      metrics = {}
      for program in self.compiled:
        state, stage_metrics = program(state, data)
        metrics.update(stage_metrics)
      per_round.append(metrics)
    # Fetched once, after every program is dispatched: no stage waits for the host.
    per_round = sharding.fetch(per_round)
    return state, jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_round)

  def memory_analysis(self) -> Any:
    """XLA's memory analysis of the stage that needs the most (temporaries + outputs).

    The stages run one after the other, so a round needs what its largest
    stage needs; None when XLA gives no analysis.
    """
    analyses = [program.memory_analysis() for program in self.compiled]
    if any(a is None for a in analyses):
      return None
    peak = max(analyses, key=lambda a: int(a.temp_size_in_bytes) + int(a.output_size_in_bytes))
    return types.SimpleNamespace(temp_size_in_bytes=int(peak.temp_size_in_bytes),
                                 output_size_in_bytes=int(peak.output_size_in_bytes),
                                 argument_size_in_bytes=max(int(a.argument_size_in_bytes)
                                                            for a in analyses))


class LoweredStages:
  """The lowered stage programs; `compile()` gives `CompiledStages`.

  Attributes:
    names, lowered: the stages' names and lowered programs, in order.
    hit: with the trace cache, whether every stage was read from it.
  """

  def __init__(self, names: Sequence[str], lowered: Sequence[Any], rounds_per_call: int, *,
               side_by_side: bool):
    self.names, self.lowered = tuple(names), tuple(lowered)
    self.rounds_per_call, self.side_by_side = int(rounds_per_call), bool(side_by_side)
    self.hit = all(getattr(program, "hit", False) for program in self.lowered)

  def as_text(self) -> str:
    return "\n".join(program.as_text() for program in self.lowered)

  def compile(self) -> CompiledStages:
    """Compiles every stage: side by side in threads when `side_by_side`, else in turn."""
    def timed(program):
      tick = time.perf_counter()
      compiled = program.compile()
      return compiled, time.perf_counter() - tick

    if self.side_by_side and len(self.lowered) > 1:
      with concurrent.futures.ThreadPoolExecutor(
          max_workers=len(self.lowered), thread_name_prefix="fedjax_het_stage") as pool:
        results = list(pool.map(timed, self.lowered))
    else:
      results = [timed(program) for program in self.lowered]
    return CompiledStages(self.names, [c for c, _ in results], self.rounds_per_call,
                          {name: secs for name, (_, secs) in zip(self.names, results)})


def lower_stages(stage_fns: Sequence[tuple[str, Callable[..., Any]]],
                 lower: Callable[[str, Callable[..., Any]], Any], rounds_per_call: int, *,
                 side_by_side: bool) -> LoweredStages:
  """`LoweredStages` of `stage_fns` (`rounds.make_stage_fns`), each lowered by
  `lower(name, stage_fn)` (jit + lower, or through the trace cache)."""
  return LoweredStages([name for name, _ in stage_fns],
                       [lower(name, fn) for name, fn in stage_fns], rounds_per_call,
                       side_by_side=side_by_side)

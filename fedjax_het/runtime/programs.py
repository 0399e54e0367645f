"""A round compiled as one XLA program per stage (`config.round_programs="stages"`), or per
stage and participant group (`"groups"`).

A method that gives its round as `Algorithm.stages` (FCCL+: the public phase,
then the local phase) can be compiled stage by stage: `lower_stages` lowers one
program per stage, `LoweredStages.compile` compiles them (side by side on a
CPU; `config.round_compile`), and `CompiledStages` runs them one after the
other, `rounds_per_call` rounds per call, with the interface of a compiled
`run_rounds`: `(state, data) -> (state, metrics stacked on a leading rounds
axis)`.

With "groups", a stage whose participant groups are independent
(`Stage.groups_independent`: the local phase, each participant on its private
data) becomes one program per group plus one for the rest of the state
(`split_by_group`): the stage is traced once (`jax.make_jaxpr`) and each
program evaluates that trace for its own outputs only, so the tracer and
XLA's dead-code elimination drop the other groups' loops. The programs read
the same input state; `CompiledStages` joins their outputs into the stage's.
Each program holds one backbone's training loop instead of four, and the
programs compile side by side.

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
ROUND_PROGRAMS = ("auto", "one", "stages", "groups")
#: The choices of `config.round_compile`: how the programs of a round compile.
ROUND_COMPILE = ("auto", "side_by_side", "in_turn")


def resolve(choice: str, has_stages: bool, backend: str = "cpu") -> str:
  """`config.round_programs` (one of `ROUND_PROGRAMS`, checked by `validate_config`) on
  `backend` -> "one", "stages" or "groups" ("auto": when the method has stages, groups on a
  GPU, where they compile in less than half the time of stages, and stages elsewhere, where
  they do not; one otherwise; docs/performance.md, "One program per participant group").

  Raises ConfigError for "stages" or "groups" asked of a method whose round is one piece.
  """
  if choice in ("stages", "groups") and not has_stages:
    raise ConfigError(f"config.round_programs={choice!r} needs a method whose round is given "
                      "as stages (Algorithm.stages); this method's round is one piece: use "
                      "'one' or 'auto'")
  if choice == "auto":
    return ("groups" if backend == "gpu" else "stages") if has_stages else "one"
  return choice


def side_by_side(choice: str, backend: str, round_programs: str = "stages") -> bool:
  """`config.round_compile` (one of `ROUND_COMPILE`) on `backend`, for the round's programs
  (`resolve`'s answer) -> whether they compile side by side in threads ("auto": on a CPU,
  where XLA's HLO passes are single-threaded per program, and for "groups" anywhere; in turn
  on an accelerator otherwise)."""
  if choice == "auto":
    return backend == "cpu" or round_programs == "groups"
  return choice == "side_by_side"


#: Joins a per-group node's path into one string key (a group program's metrics are
#: {path: entry}, a tree of string keys as the trace cache's export needs).
_SEP = "/"


def _group_paths(tree: Any, names: frozenset[str], prefix: tuple = ()) -> list[tuple]:
  """The paths (tuples of keys) of the per-group nodes of metrics `tree`: dicts keyed by
  exactly the group names."""
  if isinstance(tree, dict) and tree and frozenset(tree) == names:
    return [prefix]
  if isinstance(tree, dict):
    if any(_SEP in str(k) for k in tree):
      raise ValueError(f"metric names {sorted(tree)} hold {_SEP!r}, which the group programs "
                       "of config.round_programs='groups' join paths with")
    return [p for k, v in tree.items() for p in _group_paths(v, names, prefix + (k,))]
  return []


def _at(tree: Any, path: tuple) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _without(tree: Any, paths: list[tuple], prefix: tuple = ()) -> Any:
  """Metrics `tree` without the nodes at `paths`."""
  if not isinstance(tree, dict):
    return tree
  return {k: _without(v, paths, prefix + (k,)) for k, v in tree.items()
          if prefix + (k,) not in paths}


def _join(rest: Any, parts: dict[str, dict[str, Any]]) -> Any:
  """Metrics `rest` with the node {group: parts[group][path]} put back at every path."""
  joined = rest if rest is not None else {}
  for joined_path in next(iter(parts.values()), {}):
    entry = {g: part[joined_path] for g, part in parts.items()}
    if not joined_path:  # the metrics are themselves the per-group node
      return entry
    path = joined_path.split(_SEP)
    node = joined
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = entry
  return joined


def split_by_group(name: str, stage_fn: Callable[..., Any], groups: Sequence[str]
                   ) -> tuple[tuple[tuple[str, Callable[..., Any]], ...], Callable[..., Any]]:
  """One stage as programs: the rest of the state, then one per participant group.

  `stage_fn(state, data) -> (state, metrics)` (`rounds.make_stage_fns`) with
  `state["groups"]` keyed by `groups` and metrics whose per-group parts are dicts keyed by
  exactly the group names. Returns ((program name, fn), ...) with names `name[rest]` (all
  but the groups: the round counter, the key, the server's state, the metrics outside the
  groups) and `name[group]`, each `fn(state, data)` giving its part, and `join(outputs)`
  building the stage's (state, metrics) from the parts in that order; each fn's `state_part`
  attribute selects, from an input state, the part its output state has the structure of
  (`trace_cache.lower_round`). The stage is traced
  once, the first time a program is traced (`jax.make_jaxpr`, kept); each program evaluates
  that trace for its outputs only.
  """
  names = frozenset(groups)
  traced = {}

  def whole(state, data):
    key = (jax.tree_util.tree_structure((state, data)),
           tuple((x.shape, x.dtype) for x in jax.tree_util.tree_leaves((state, data))))
    if key not in traced:
      traced[key] = jax.make_jaxpr(stage_fn, return_shape=True)(state, data)
    closed, shape = traced[key]
    flat = jax.core.eval_jaxpr(closed.jaxpr, closed.consts,
                               *jax.tree_util.tree_leaves((state, data)))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), flat)

  def rest(state, data):
    new_state, metrics = whole(state, data)
    return ({k: v for k, v in new_state.items() if k != "groups"},
            _without(metrics, _group_paths(metrics, names)))

  def one(group):
    def run(state, data):  # the group's state and {path of a per-group node: its entry}
      new_state, metrics = whole(state, data)
      return new_state["groups"][group], {_SEP.join(path): _at(metrics, path)[group]
                                          for path in _group_paths(metrics, names)}
    run.state_part = lambda state: state["groups"][group]
    return run

  rest.state_part = lambda state: {k: v for k, v in state.items() if k != "groups"}

  def join(outputs):
    (rest_state, rest_metrics), parts = outputs[0], dict(zip(groups, outputs[1:]))
    state = {**rest_state, "groups": {g: part[0] for g, part in parts.items()}}
    return state, _join(rest_metrics, {g: part[1] for g, part in parts.items()})

  programs = ((f"{name}[rest]", rest),) + tuple((f"{name}[{g}]", one(g)) for g in groups)
  return programs, join


#: How a round's programs make its stages: (stage name, number of programs, join) per stage,
#: in order; join is None for a stage that is one program, else `split_by_group`'s join.
Layout = tuple[tuple[str, int, Callable[..., Any] | None], ...]


def _one_per_stage(names: Sequence[str]) -> Layout:
  return tuple((name, 1, None) for name in names)


class CompiledStages:
  """The compiled round programs, called as a compiled `run_rounds` is.

  Attributes:
    names: the programs' names, in order (a stage's name, or with
      `split_by_group` the stage's rest and `stage[group]`).
    compiled: their compiled programs.
    rounds_per_call: rounds run by one call.
    compile_secs: {program name: seconds its `.compile()` took} (a persistent
      cache hit: the time to load it).
    layout: which programs make which stage (`Layout`).
  """

  def __init__(self, names: Sequence[str], compiled: Sequence[Any], rounds_per_call: int,
               compile_secs: dict[str, float], layout: Layout | None = None):
    self.names, self.compiled = tuple(names), tuple(compiled)
    self.rounds_per_call, self.compile_secs = int(rounds_per_call), dict(compile_secs)
    self.layout = _one_per_stage(self.names) if layout is None else tuple(layout)
    # Each stage's programs and join, in order.
    starts = np.cumsum([0] + [count for _, count, _ in self.layout]).tolist()
    self._stages = tuple((self.compiled[start:start + count], join)
                         for start, (_, count, join) in zip(starts, self.layout))

  @property
  def stage_names(self) -> tuple[str, ...]:
    return tuple(name for name, _, _ in self.layout)

  def run_stage(self, index: int, state: Any, data: Any) -> tuple[Any, Any]:
    """Stage `index` of the round on `state`: (state, the stage's metrics)."""
    stage_programs, join = self._stages[index]
    outputs = [program(state, data) for program in stage_programs]
    return outputs[0] if join is None else join(outputs)

  def __call__(self, state: Any, data: Any) -> tuple[Any, Any]:
    """`rounds_per_call` rounds; the metrics (host arrays) stacked on a leading rounds axis."""
    per_round = []
    for _ in range(self.rounds_per_call):
      metrics = {}
      for index in range(len(self.layout)):
        state, stage_metrics = self.run_stage(index, state, data)
        metrics.update(stage_metrics)
      per_round.append(metrics)
    # Fetched once, after every program is dispatched: no stage waits for the host.
    per_round = sharding.fetch(per_round)
    return state, jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_round)

  def memory_analysis(self) -> Any:
    """XLA's memory analysis of the program that needs the most (temporaries + outputs).

    The programs run one after the other, so a round needs what its largest
    program needs; None when XLA gives no analysis.
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
  """The lowered round programs; `compile()` gives `CompiledStages`.

  Attributes:
    names, lowered: the programs' names and lowered programs, in order.
    hit: with the trace cache, whether every program was read from it.
    layout: which programs make which stage (`Layout`).
  """

  def __init__(self, names: Sequence[str], lowered: Sequence[Any], rounds_per_call: int, *,
               side_by_side: bool, layout: Layout | None = None):
    self.names, self.lowered = tuple(names), tuple(lowered)
    self.rounds_per_call, self.side_by_side = int(rounds_per_call), bool(side_by_side)
    self.layout = _one_per_stage(self.names) if layout is None else tuple(layout)
    self.hit = all(getattr(program, "hit", False) for program in self.lowered)

  def as_text(self) -> str:
    return "\n".join(program.as_text() for program in self.lowered)

  def compile(self) -> CompiledStages:
    """Compiles every program: side by side in threads when `side_by_side`, else in turn."""
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
                          {name: secs for name, (_, secs) in zip(self.names, results)},
                          self.layout)


def lower_stages(stage_fns: Sequence[tuple[str, Callable[..., Any]]],
                 lower: Callable[[str, Callable[..., Any]], Any], rounds_per_call: int, *,
                 side_by_side: bool, split: dict[str, Sequence[str]] | None = None
                 ) -> LoweredStages:
  """`LoweredStages` of `stage_fns` (`rounds.make_stage_fns`), each program lowered by
  `lower(name, fn)` (jit + lower, or through the trace cache); `split`: {stage name: its
  group names} for the stages lowered as `split_by_group`'s programs."""
  names, fns, layout = [], [], []
  for name, fn in stage_fns:
    if split and name in split:
      parts, join = split_by_group(name, fn, split[name])
      layout.append((name, len(parts), join))
    else:
      parts = ((name, fn),)
      layout.append((name, 1, None))
    names += [part_name for part_name, _ in parts]
    fns += [part_fn for _, part_fn in parts]
  return LoweredStages(names, [lower(n, f) for n, f in zip(names, fns)], rounds_per_call,
                       side_by_side=side_by_side, layout=layout)

"""`RoundCompiler`: how a run's round becomes executables, for every kind of run.

A run (`experiment.Experiment` for the domain and partitioned scenarios,
`stream_experiment.StreamExperiment` for the class-incremental task stream)
builds its method and data; the compiler takes the method's `Algorithm` and
the data and owns the rest of the way to a compiled round:

  * the round's programs: `run_rounds` (`config.rounds_per_call` rounds as one
    jitted `lax.scan`), or with `config.round_programs` "stages" / "groups" one
    program per stage of a staged method, a stage whose groups are independent
    split by participant group (`runtime.programs`);
  * lowering them through the trace cache (`runtime.trace_cache`): a round
    already in the cache is read as its exported program instead of traced; the
    key covers the config, the sizes and statics the method's `make` read (the
    run's `statics`), the shapes of the state and data and the library's source;
  * `compile_all`: the evaluation (and diagnostics) compiled in a worker thread
    while the round is traced and lowered, the round compiled after them, then
    the memory the compiler freed handed back to the system
    (`resources.release_freed_host_memory`), so that the trainer's memory check
    (`resources.check_round_memory`) and the round see it.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from fedjax_het import workdir as workdir_lib
from fedjax_het.engine import rounds
from fedjax_het.engine.api import Algorithm
from fedjax_het.runtime import programs, resources, trace_cache


def statics_text(value: Any) -> str:
  """`repr(value)` with every array printed in full (the trace cache's key must see all of a
  setup's arrays, which numpy's repr elides past 1000 elements)."""
  with np.printoptions(threshold=sys.maxsize):
    return repr(value)


class RoundCompiler:
  """A run's round programs, lowered through the trace cache and compiled (no state).

  Attributes:
    round_fn: the round, `(state, data) -> (state, metrics)` (`rounds.make_round_fn`).
    run_rounds: `rounds_per_call` rounds as one jitted program (with `lanes`, vmapped
      over the lanes' leading axis).
    round_programs: "one", "stages" or "groups" (`programs.resolve` of
      `config.round_programs`; "groups" runs as "stages" on a device mesh; "one"
      with `lanes`).
    stage_programs: ((stage name, jitted stage program), ...); empty for "one".
    split_stages: {stage name: group names} of the stages compiled per group.
    outside_files: the source files outside the package that define the method or
      a model (`trace_cache.outside_package`).
    statics, defined_by: as given (a `seed_stack.SeedStack` builds its compiler from
      its first lane's).
  """

  def __init__(self, config: ml_collections.ConfigDict, algorithm: Algorithm, data: Any, *,
               statics: Mapping[str, str], defined_by: Iterable[Any],
               group_names: Sequence[str] = (), mesh: Any = None,
               state_shardings: Any = None, lanes: int = 0):
    """`statics`: what the method's `make` read besides the config (for the trace cache's key,
    e.g. {"setup": statics_text(setup), "conv_impl": ...}); `defined_by`: the method's `make`
    and the models (their defining files outside the package are the `outside_files`);
    `group_names`: the participant groups a stage may be split by; `state_shardings`: the
    state's shardings on `mesh` (the round programs' output shardings); `lanes`: 0 for one
    run, else the number of lanes (seeds, `seed_stack.SeedStack`) on the leading axis of
    the state and `data`, whose round is the method's round under `jax.vmap`, as one
    program."""
    self.config, self.data, self.mesh = config, data, mesh
    self.statics, self.defined_by = dict(statics), list(defined_by)
    self.round_fn = rounds.make_round_fn(algorithm)
    calls = rounds.make_run_rounds(self.round_fn, int(config.rounds_per_call))
    if lanes:
      calls = jax.vmap(calls)
      self.statics["lanes"] = str(int(lanes))
    self.round_programs = "one" if lanes else programs.resolve(
        config.round_programs, bool(algorithm.stages), jax.default_backend())
    if self.round_programs == "groups" and mesh is not None:
      logging.info("config.round_programs='groups' runs as 'stages' on a device mesh (the "
                   "group programs' outputs have no shardings of their own)")
      self.round_programs = "stages"
    stage_fns = (rounds.make_stage_fns(algorithm)
                 if self.round_programs in ("stages", "groups") else ())
    self.split_stages = {
        stage.name: tuple(group_names) for stage in algorithm.stages
        if self.round_programs == "groups" and stage.groups_independent
        and len(group_names) > 1}
    self._stage_fns = dict(stage_fns)
    round_jit = {} if state_shardings is None else {"out_shardings": (state_shardings, None)}
    self.run_rounds = jax.jit(calls, **round_jit)
    self.stage_programs = tuple((name, jax.jit(fn, **round_jit)) for name, fn in stage_fns)
    self.outside_files = trace_cache.outside_package(self.defined_by)

  def trace_cache_directory(self) -> pathlib.Path | None:
    """Where `lower_rounds` keeps exported rounds (`runtime.trace_cache`), or None.

    None when `config.trace_cache` is "off", without `config.compilation_cache_dir`,
    for a run sharded over a mesh, and, under "auto", when the method or a model
    is defined outside the fedjax_het package.
    """
    mode = self.config.trace_cache  # checked by validate_config
    if mode == "off" or not self.config.compilation_cache_dir or self.mesh is not None:
      return None
    if mode == "auto" and self.outside_files:
      logging.info("trace cache off: the method or a model is defined outside fedjax_het (%s); "
                   "config.trace_cache='on' keys it on those files too",
                   ", ".join(map(str, self.outside_files)))
      return None
    return pathlib.Path(self.config.compilation_cache_dir).expanduser() / trace_cache.FOLDER

  def lower_rounds(self, state: Any) -> Any:
    """The round lowered for `state`'s shapes, through the trace cache when it is on.

    `run_rounds` lowered, or with `round_programs == "stages"` the
    `programs.LoweredStages` of the stage programs (and, with "groups", the group
    programs of the stages split by group), compiled side by side on a CPU or
    when split by group, one after the other otherwise (`config.round_compile`).
    With the cache, a later run of the same round reads each exported program
    instead of tracing and lowering it; both compile the same module. A program
    the cache cannot hold is traced as usual.
    """
    cache = self._trace_cache_key(state)
    if self.round_programs in ("stages", "groups"):
      # One key for the round (one read of the package source), one entry per program.
      jitted = dict(self.stage_programs)

      def lower(name, fn):
        if fn is self._stage_fns.get(name):
          program = jitted[name]
        else:  # a program of a stage split by group
          program = jax.jit(fn)
          program.state_part = fn.state_part
        return self._lower_program(
            program, state, cache and (cache[0], trace_cache.stage_key(cache[1], name)), name)

      return programs.lower_stages(
          tuple(self._stage_fns.items()), lower, int(self.config.rounds_per_call),
          side_by_side=programs.side_by_side(self.config.round_compile,
                                             jax.default_backend(), self.round_programs),
          split=self.split_stages)
    return self._lower_program(self.run_rounds, state, cache, None)

  def compile_rounds(self, state: Any) -> Any:
    """The compiled round for this state's shapes: `run_rounds`, or with stages the
    `programs.CompiledStages` (traces once; uses the caches)."""
    return self.lower_rounds(state).compile()

  def compile_all(self, state: Any, compile_beside: Callable[[], None]) -> Any:
    """Compiles the round and, beside it, `compile_beside()` (the run's evaluation and
    diagnostics); returns the compiled round.

    `compile_beside` runs in a worker thread while this thread traces and lowers
    the round (pure Python, one core busy), and the round's XLA compile starts
    only once it is done: compiling the evaluation beside the round's compile is
    slower on an H100 (FCCL+ quick: over 268 s against 176 s; XLA's GPU
    compiler is itself multi-threaded and autotunes on the device). Then the
    memory the compiler freed is handed back to the system
    (`resources.release_freed_host_memory`), so that the memory check and the
    round see it.
    """
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="fedjax_het_compile") as pool:
      side = pool.submit(compile_beside)
      lowered = self.lower_rounds(state)
      side.result()  # raises what the worker raised
    compiled = lowered.compile()
    released = resources.release_freed_host_memory()  # the compiler's freed heap
    if released:
      logging.info("returned %.2f GiB of memory the compiler had freed to the system",
                   released / 2.0 ** 30)
    return compiled

  def _trace_cache_key(self, state: Any) -> tuple[pathlib.Path, str] | None:
    """(the trace cache's directory, this round's key), or None when the cache is not used."""
    directory = self.trace_cache_directory()
    if directory is None:
      return None
    config = {name: value for name, value in workdir_lib.flatten_config(self.config).items()
              if not workdir_lib.covered(name, workdir_lib.NEUTRAL_FIELDS
                                         + trace_cache.NOT_IN_ROUND)}
    try:
      return directory, trace_cache.round_key(config_json=json.dumps(config, sort_keys=True),
                                              choices=self.statics, args=(state, self.data),
                                              extra_files=self.outside_files)
    except Exception as error:  # pylint: disable=broad-except
      logging.info("trace cache not used for this round (%s: %s); tracing it as usual",
                   type(error).__name__, error)
      return None

  def _lower_program(self, jitted: Any, state: Any, cache: tuple[pathlib.Path, str] | None,
                     stage: str | None) -> Any:
    """`jitted(state, data)` lowered, through the trace cache entry `cache` (directory, key)
    when there is one; `stage`: the stage's name, None for the whole round (for the log)."""
    if cache is None:
      return jitted.lower(state, self.data)
    directory, key = cache
    tick = time.perf_counter()
    try:
      lowered = trace_cache.lower_round(jitted, (state, self.data), directory=directory, key=key,
                                        state_part=getattr(jitted, "state_part", None))
    except Exception as error:  # pylint: disable=broad-except
      logging.info("trace cache not used for this round (%s: %s); tracing it as usual",
                   type(error).__name__, error)
      return jitted.lower(state, self.data)
    what = "round" if stage is None else f"round's stage {stage!r}"
    logging.info("%s the traced %s %s %s in %.1f s", "read" if lowered.hit else "saved", what,
                 "from" if lowered.hit else "to", directory, time.perf_counter() - tick)
    return lowered

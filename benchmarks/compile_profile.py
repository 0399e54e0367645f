"""Where an XLA compile spends its time, from a profiler trace of the compile.

    summary = profile_compile(lambda: lowered.compile())   # (compiled, summary)

`profile_compile` runs a thunk (typically `lowered.compile()`) under
`jax.profiler.trace(..., create_perfetto_trace=True)` with the Python tracer
off, so that the trace holds the compiler's own annotations (XLA's TraceMe
events), and `summarize_trace` reduces the trace to the figures
`first_round.py` reports:

  * `phases`: inclusive seconds of XLA's top-level compile stages where the
    backend annotates them, matched by name (`PHASES`): on XLA:CPU the HLO
    pass pipeline before and after layout assignment, the backend
    (`CpuCompiler::RunBackend`), inside it the emission of the fusion kernels
    (`ThunkEmitter::EmitEntryComputation`, whose kernels compile on
    `tf_xla-cpu-codegen` worker threads: `fusion_kernels_all_threads` sums
    them over the threads) and LLVM's machine-code generation
    (`JitCompiler::Compile`); autotuning where a GPU annotates it (other GPU
    stages show in `top_events`);
  * `top_events`: the `top` event names by inclusive seconds (events nest, so
    these overlap: a pass pipeline contains its passes), thread-pool dispatch
    wrappers left out;
  * `threads`: per thread, its number of events and its busy span, which
    shows how much of the compile ran in parallel.

The profiler and the export of its trace add seconds to the compile they
observe (quick FCCL+ round, 2-core CPU: 75.4 s under the profiler, of which
XLA's own compile was 63.7 s and the cache write about 5 s); `first_round.py`
therefore profiles only when asked (`--compile-profile`), and its timings of
that run include the overhead.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

#: (phase, substrings of an event name, any of which marks the phase): the names XLA:CPU
#: (jaxlib 0.10) gives its compile stages, and autotuning's (GPU). Every event whose name holds
#: a substring counts; other backends' stages show in `top_events` under their own names.
PHASES = (
    ("client_compile", ("PjRtCpuClient::Compile",)),
    ("hlo_passes_before_layout", ("HLO passes through layout assignment",)),
    ("hlo_passes_after_layout", ("HLO passes after layout assignment",)),
    ("backend", ("CpuCompiler::RunBackend",)),
    ("kernel_emission", ("ThunkEmitter::EmitEntryComputation",)),
    ("fusion_kernels_all_threads", ("FusionCompiler::Compile",)),
    ("llvm_codegen", ("JitCompiler::Compile",)),
    ("autotuning", ("Autotun",)),
)

#: Thread-pool wrappers whose durations only repeat the work they dispatch.
WRAPPERS = ("TaskDispatcher::dispatch", "ThreadpoolListener::Record",
            "PythonRefManager::CollectGarbage")


def summarize_trace(events: list[dict[str, Any]], *, top: int = 15) -> dict[str, Any]:
  """Reduces Chrome/Perfetto trace events ("X" complete events, "M" thread names) to phases.

  Returns {"phases": {phase: seconds}, "top_events": [[name, seconds, count]],
  "threads": {thread: {"events", "busy_secs", "span_secs"}}}. Seconds are
  inclusive sums over a name's events. A phase whose names never occur is
  absent (e.g. autotuning on a CPU).
  """
  names = {}
  for event in events:
    if event.get("ph") == "M" and event.get("name") == "thread_name":
      names[(event.get("pid"), event.get("tid"))] = event.get("args", {}).get("name", "")
  totals: dict[str, float] = collections.defaultdict(float)
  counts: collections.Counter = collections.Counter()
  per_thread: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
  for event in events:
    if event.get("ph") != "X":
      continue
    seconds = float(event.get("dur", 0.0)) / 1e6
    totals[event["name"]] += seconds
    counts[event["name"]] += 1
    thread = names.get((event.get("pid"), event.get("tid")), str(event.get("tid")))
    per_thread[thread].append(event)
  phases = {}
  for phase, markers in PHASES:
    matched = [name for name in totals if any(marker in name for marker in markers)]
    if matched:
      phases[phase] = sum(totals[name] for name in matched)
  ranked = sorted((name for name in totals if name not in WRAPPERS), key=lambda n: -totals[n])
  threads = {}
  for thread, thread_events in per_thread.items():
    start = min(float(e["ts"]) for e in thread_events)
    end = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in thread_events)
    threads[thread] = {"events": len(thread_events),
                       "busy_secs": _union_seconds(thread_events),
                       "span_secs": (end - start) / 1e6}
  return {"phases": phases,
          "top_events": [[name, totals[name], counts[name]] for name in ranked[:top]],
          "threads": threads}


def _union_seconds(events: list[dict[str, Any]]) -> float:
  """Seconds covered by at least one of `events` (nested events counted once)."""
  intervals = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                     for e in events)
  covered, current_start, current_end = 0.0, None, None
  for start, end in intervals:
    if current_end is None or start > current_end:
      if current_end is not None:
        covered += current_end - current_start
      current_start, current_end = start, end
    else:
      current_end = max(current_end, end)
  if current_end is not None:
    covered += current_end - current_start
  return covered / 1e6


def profile_compile(thunk: Callable[[], Any], *, top: int = 15,
                    directory: str | os.PathLike[str] | None = None) -> tuple[Any, dict[str, Any]]:
  """Runs `thunk()` under the JAX profiler; returns (its result, `summarize_trace` of it).

  The summary also holds `wall_secs` (the thunk's wall time under the
  profiler) and `trace_events` (how many events the trace kept). With
  `directory`, the profiler's files stay there (for TensorBoard's profile
  plugin or https://ui.perfetto.dev: `first_round.py --round-trace` keeps a
  steady round's); otherwise they go to a temporary folder, removed after.
  """
  if directory is None:
    with tempfile.TemporaryDirectory(prefix="fedjax_het_compile_profile_") as temporary:
      return _profile(thunk, temporary, top)
  os.makedirs(directory, exist_ok=True)
  return _profile(thunk, os.fspath(directory), top)


def _profile(thunk: Callable[[], Any], directory: str, top: int) -> tuple[Any, dict[str, Any]]:
  import jax  # noqa: PLC0415 (benchmark helper; JAX is already imported by the caller)
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0  # the compiler's events only: Python frames fill the buffer
  with jax.profiler.trace(directory, create_perfetto_trace=True, profiler_options=options):
    start = time.perf_counter()
    result = thunk()
    wall = time.perf_counter() - start
  paths = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
  if not paths:
    return result, {"wall_secs": wall, "error": "the profiler wrote no perfetto trace"}
  with gzip.open(max(paths, key=os.path.getmtime), "rt") as handle:
    trace = json.load(handle)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  summary = summarize_trace(events, top=top)
  summary["wall_secs"], summary["trace_events"] = wall, len(events)
  return result, summary

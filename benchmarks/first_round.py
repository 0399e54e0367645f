"""Where the first round's time goes: data, trace, lower, XLA compile, first run, steady state.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/first_round.py \
        --config=digits_fcclplus_quick \
        --out benchmarks/results/first_round__digits_fcclplus_quick__<device>.json

For one config (any name `experiments/train.py` takes, with `--set field=value`
overrides), the script times in one process, cold (an empty persistent
compilation cache) and then, in a second process, warm (the cache the first
one filled):

  * `data_secs`: building the Experiment (data loading/synthesis, models, groups);
  * `init_secs`: the jitted initial state (its compile included);
  * `trace_lower_secs`, `compile_secs`: tracing and lowering the round program,
    then its `.compile()` (where a persistent-cache hit saves its time). With
    the trace cache on (`--trace-cache`, as `config.trace_cache`; default auto)
    the round goes through `Experiment.lower_rounds` as in `train.py`: the cold
    process exports it (trace + lower) and the warm one reads the export
    (`trace_cache`: "miss" / "hit"); with `--trace-cache off`, `trace_secs` and
    `lower_secs` split `jax.jit(run_rounds).trace(...)` from `.lower()` (for
    the one-program round);
  * `round_programs`: "one" (the round as one program), "stages" (one program
    per stage of the method's round, `config.round_programs`; `--set
    round_programs=one` measures the former for a staged method) or "groups"
    (the local stage one program per participant group), then
    `compile_secs_by_stage`: each program's compile;
  * `first_round_secs`: the first execution of the compiled round (on a GPU it
    includes loading the kernels);
  * `eval_first_secs`: the evaluation's compile plus its first run;
  * `steady_round_secs`: the median of `--rounds` further rounds; for stage
    programs, `steady_round_secs_by_stage`: one more round, each stage's program
    timed on its own (which phase holds the round's time);
  * `memory_gib`: XLA's memory analysis of the round (arguments, temporaries,
    outputs), which on a CPU depends on `--xla-cpu-scheduler` (as
    `config.xla_cpu_scheduler`; default auto = the memory-minimising one);
  * `start_to_round1_end_secs`: from the start of the process to the end of the
    first round, what a user waits for;
  * `round1_state_sha256`: a hash of the state's bytes after the first round,
    which says whether an option (`XLA_FLAGS`, `--set`) changes the round's
    rounding (equal hashes: the same bits);
  * `cpu_secs`: the process's CPU time (user + system, every thread) in each of
    the phases above and `to_round1_end` from the start of the process, and
    `cpu_floor_to_round1_secs`, that CPU time over the machine's cores: the
    shortest wall time the same work could take on this machine however it
    were overlapped (`cores_busy_to_round1`: CPU time over wall time, how many
    cores the start kept busy on average);
  * with `--round-trace DIR`, `round_profile`: one more steady round run
    under the JAX profiler, its trace kept in DIR/cold and DIR/warm (for
    TensorBoard's profile plugin or ui.perfetto.dev), with its `top_events`
    (kernels on a GPU, XLA's thunks on a CPU) and wall time;
  * with `--compile-profile`, `compile_profile`: XLA's own breakdown of the
    compile step (HLO passes, kernel emission, LLVM code generation, ...; see
    `compile_profile.py`), from a profiler trace of it; the profiler and the
    export of its trace add seconds to that run's `compile_secs` (the export
    alone took 3.9 s for the quick FCCL+ round on a 2-core CPU). In the warm
    phase it shows what a persistent-cache hit still costs (loading the
    executable).

The lowered StableHLO's size (characters and lines) is reported as a measure of
how much the tracer produced. JSON rows {"cold": ..., "warm": ...} go to `--out`.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

START = time.perf_counter()
REPO = pathlib.Path(__file__).resolve().parents[1]


def load_config(name: str, overrides: Sequence[str] = ()):
  """`<scenario>_<variant>` (as experiments/train.py takes it) -> its ConfigDict, with each
  `field=value` of `overrides` set (`set_field`)."""
  from fedjax_het import configs  # pylint: disable=g-import-not-at-top
  config = configs.get_config(name)
  for item in overrides:
    field, value = item.split("=", 1)
    set_field(config, field, value)
  return config


def set_field(config, field: str, value: str) -> None:
  """config.<field> = value, the value parsed as a Python literal where it is one."""
  try:
    parsed = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    parsed = value
  *parents, leaf = field.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = parsed


def memory_gib(compiled) -> float | None:
  """XLA's memory analysis of a compiled program: arguments + temporaries + outputs, GiB."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
          + analysis.output_size_in_bytes) / 2.0 ** 30


def state_sha256(state) -> str:
  """SHA-256 of the bytes of every leaf of `state` (keys as their raw key data), in tree order."""
  import jax  # noqa: PLC0415 (imported after START)
  import numpy as np  # noqa: PLC0415
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(state):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
  return digest.hexdigest()


def _progress(name: str, seconds: float) -> float:
  """Prints one measured figure as it lands (a run cut short still shows it); returns it."""
  print(f"[first_round {time.perf_counter() - START:7.1f} s] {name} {seconds:.2f}", flush=True)
  return seconds


class _CpuClock:
  """The process's CPU time (user + system, all threads: `time.process_time`) per phase; the
  first, "import", from the start of the process to the clock's creation."""

  def __init__(self):
    self._last = time.process_time()
    self.secs = {"import": self._last}

  def lap(self, phase: str) -> None:
    """Books the CPU time since the previous lap to `phase` (the `*_secs` name less `_secs`)."""
    now = time.process_time()
    self.secs[phase], self._last = now - self._last, now


def _measure(config_name: str, overrides: list[str], rounds: int, *,
             compile_profile: bool = False, trace_cache: str = "auto",
             round_trace: str = "") -> dict:
  import jax  # noqa: PLC0415 (imported after START: the import is part of the wait)

  from fedjax_het.experiment import Experiment  # noqa: PLC0415

  config = load_config(config_name, overrides)
  config.logging.progress = False
  config.logging.tensorboard = False
  config.compilation_cache_dir = jax.config.jax_compilation_cache_dir or ""  # trace cache's home
  config.trace_cache = trace_cache
  row = {"config": config_name, "overrides": overrides, "import_secs": time.perf_counter() - START}
  cpu = _CpuClock()

  tick = time.perf_counter()
  experiment = Experiment(config)
  row["data_secs"] = _progress("data_secs", time.perf_counter() - tick)
  cpu.lap("data")
  tick = time.perf_counter()
  state = jax.block_until_ready(experiment.init_state())
  row["init_secs"] = _progress("init_secs", time.perf_counter() - tick)
  cpu.lap("init")
  tick = time.perf_counter()
  row["round_programs"] = experiment.round_programs
  if experiment.trace_cache_directory() is not None:  # as train.py: export, or read the export
    lowered = experiment.lower_rounds(state)
    row["trace_cache"] = "hit" if lowered.hit else "miss"
  elif experiment.round_programs in ("stages", "groups"):  # one program per stage (or group)
    lowered = experiment.lower_rounds(state)
  else:
    traced = experiment.run_rounds.trace(state, experiment.data)
    row["trace_secs"] = time.perf_counter() - tick
    lowered = traced.lower()
    row["lower_secs"] = time.perf_counter() - tick - row["trace_secs"]
  row["trace_lower_secs"] = _progress("trace_lower_secs", time.perf_counter() - tick)
  cpu.lap("trace_lower")
  text = lowered.as_text()
  row["stablehlo_chars"], row["stablehlo_lines"] = len(text), text.count("\n")
  cpu.lap("stablehlo_text")
  tick = time.perf_counter()
  if compile_profile:
    import compile_profile as profiling  # noqa: PLC0415 (benchmarks/, beside this script)
    compiled, row["compile_profile"] = profiling.profile_compile(lowered.compile)
  else:
    compiled = lowered.compile()
  row["compile_secs"] = _progress("compile_secs", time.perf_counter() - tick)
  cpu.lap("compile")
  if hasattr(compiled, "compile_secs"):  # stage programs (compiled side by side on a CPU)
    row["compile_secs_by_stage"] = compiled.compile_secs
  tick = time.perf_counter()
  state, _ = compiled(state, experiment.data)
  jax.block_until_ready(state)
  row["first_round_secs"] = _progress("first_round_secs", time.perf_counter() - tick)
  row["start_to_round1_end_secs"] = time.perf_counter() - START
  cpu.lap("first_round")
  cpu.secs["to_round1_end"] = time.process_time()
  row["round1_state_sha256"] = state_sha256(state)
  row["cpu_secs"] = cpu.secs
  row["cpu_floor_to_round1_secs"] = cpu.secs["to_round1_end"] / os.cpu_count()
  row["cores_busy_to_round1"] = cpu.secs["to_round1_end"] / row["start_to_round1_end_secs"]
  tick = time.perf_counter()
  jax.block_until_ready(experiment.evaluate(state, experiment.data.test))
  row["eval_first_secs"] = _progress("eval_first_secs", time.perf_counter() - tick)
  times = []
  for _ in range(rounds):
    tick = time.perf_counter()
    state, _ = compiled(state, experiment.data)
    jax.block_until_ready(state)
    times.append(_progress("round_secs", time.perf_counter() - tick))
  row["steady_round_secs"] = statistics.median(times) if times else None
  row["steady_round_all"] = times
  if rounds and hasattr(compiled, "stage_names"):  # one more round, each stage timed on its own
    row["steady_round_secs_by_stage"] = {}
    for index, name in enumerate(compiled.stage_names):
      tick = time.perf_counter()
      state, _ = compiled.run_stage(index, state, experiment.data)
      jax.block_until_ready(state)
      row["steady_round_secs_by_stage"][name] = time.perf_counter() - tick
  if round_trace:  # one more round under the profiler, its trace kept in `round_trace`
    import compile_profile as profiling  # noqa: PLC0415 (benchmarks/, beside this script)

    def one_round():
      return jax.block_until_ready(compiled(state, experiment.data))

    (state, _), row["round_profile"] = profiling.profile_compile(one_round, top=25,
                                                                 directory=round_trace)
    row["round_profile"]["directory"] = round_trace
  if (memory := memory_gib(compiled)) is not None:
    row["memory_gib"] = memory
  row["backend"], row["devices"] = jax.default_backend(), [str(d) for d in jax.devices()]
  row["jax"] = jax.__version__
  row["substituted"] = list(experiment.scenario.substituted)
  return row


def main():
  import timing  # noqa: PLC0415 (benchmarks/, beside this script; starts no JAX backend)
  from fedjax_het.runtime import trace_cache, xla_cpu, xla_gpu  # noqa: PLC0415 (no JAX backend)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--rounds", type=int, default=3, help="steady-state rounds timed")
  parser.add_argument("--cache-dir", default="", help="persistent cache (default: a new temp)")
  parser.add_argument("--skip-warm", action="store_true")
  parser.add_argument("--xla-cpu-scheduler", default="auto",
                      choices=xla_cpu.SCHEDULERS,
                      help="XLA:CPU's scheduler in the measured processes, as "
                           "config.xla_cpu_scheduler (auto: memory)")
  parser.add_argument("--compile-profile", action="store_true",
                      help="profile the round's XLA compile (compile_profile.py)")
  parser.add_argument("--trace-cache", default="auto", choices=trace_cache.MODES,
                      help="as config.trace_cache (the traced round kept in the cache dir)")
  parser.add_argument("--round-trace", default="",
                      help="keep a profiler trace of one more steady round in DIR/cold, "
                           "DIR/warm (TensorBoard's profile plugin, ui.perfetto.dev)")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  if args.child:  # one measurement in this process, the cache dir given
    scheduler = xla_cpu.set_xla_cpu_scheduler(args.xla_cpu_scheduler)  # before JAX starts
    xla_gpu.set_xla_gpu_triton_gemm(load_config(args.config, args.set).get(
        "xla_gpu_triton_gemm", "auto"))  # as experiments/train.py
    import jax  # noqa: PLC0415
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    row = _measure(args.config, args.set, args.rounds, compile_profile=args.compile_profile,
                   trace_cache=args.trace_cache, round_trace=args.round_trace)
    if row["backend"] == "cpu":
      row["xla_cpu_scheduler"] = scheduler
    pathlib.Path(args.child).write_text(json.dumps(row))
    return
  cache = args.cache_dir or tempfile.mkdtemp(prefix="fedjax_het_first_round_cache_")
  report = {"python": platform.python_version(), "cpu_count": os.cpu_count(),
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""), "cache_dir": cache}
  for phase in ("cold", "warm"):
    if phase == "warm" and args.skip_warm:
      break
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
      out = handle.name
    command = [sys.executable, __file__, "--config", args.config, "--rounds", str(args.rounds),
               "--cache-dir", cache, "--child", out,
               "--xla-cpu-scheduler", args.xla_cpu_scheduler, "--trace-cache", args.trace_cache]
    if args.compile_profile:
      command.append("--compile-profile")
    if args.round_trace:
      command += ["--round-trace", str(pathlib.Path(args.round_trace).resolve() / phase)]
    for item in args.set:
      command += ["--set", item]
    subprocess.run(command, check=True)
    report[phase] = json.loads(pathlib.Path(out).read_text())
    print(f"[{phase}] " + ", ".join(f"{k} {v:.1f}" for k, v in report[phase].items()
                                    if k.endswith("_secs") and isinstance(v, float))
          + f", trace cache {report[phase].get('trace_cache', 'off')}", flush=True)
    if "compile_profile" in report[phase]:
      print(f"[{phase}] XLA compile: " + ", ".join(
          f"{k} {v:.1f}" for k, v in report[phase]["compile_profile"]["phases"].items()),
          flush=True)
    if args.out:  # after each phase: a run killed in the warm phase keeps the cold figures
      timing.write_result(args.out, report, indent=2)
  if "warm" in report:
    report["warm_vs_cold_start_to_round1"] = (report["warm"]["start_to_round1_end_secs"]
                                              / report["cold"]["start_to_round1_end_secs"])
  print(json.dumps(report, indent=2))
  if args.out:
    timing.write_result(args.out, report, indent=2)


if __name__ == "__main__":
  main()

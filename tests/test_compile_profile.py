"""benchmarks/compile_profile.py: the compile breakdown first_round.py reports."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest

from fedjax_het.config import load_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
profiling = load_module(ROOT / "benchmarks" / "compile_profile.py")


def _thread(tid, name):
  return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}


def _event(tid, name, start_us, dur_us):
  return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": start_us, "dur": dur_us}


def test_summary_by_hand():
  events = [
      _thread(1, "compiler"), _thread(2, "codegen-a"), _thread(3, "codegen-b"),
      # compiler thread: the client compile [0, 10 s] holds the passes [0, 4 s] and the
      # backend [4, 10 s]; the backend holds kernel emission [4, 7 s] and LLVM [7, 10 s].
      _event(1, "PjRtCpuClient::Compile", 0, 10_000_000),
      _event(1, "HLO passes through layout assignment (jit_f)", 0, 3_000_000),
      _event(1, "HLO passes after layout assignment (jit_f)", 3_000_000, 1_000_000),
      _event(1, "CpuCompiler::RunBackend", 4_000_000, 6_000_000),
      _event(1, "ThunkEmitter::EmitEntryComputation", 4_000_000, 3_000_000),
      _event(1, "JitCompiler::Compile", 7_000_000, 3_000_000),
      # two codegen threads compile fusion kernels, a dispatch wrapper around each
      _event(2, "TaskDispatcher::dispatch", 4_000_000, 2_500_000),
      _event(2, "FusionCompiler::Compile", 4_000_000, 2_000_000),
      _event(2, "FusionCompiler::Compile", 6_000_000, 500_000),
      _event(3, "TaskDispatcher::dispatch", 4_500_000, 2_000_000),
      _event(3, "FusionCompiler::Compile", 4_500_000, 1_000_000),
      _event(3, "FusionCompiler::Compile", 8_000_000, 1_000_000),
  ]
  summary = profiling.summarize_trace(events, top=3)
  assert summary["phases"] == pytest.approx({
      "client_compile": 10.0, "hlo_passes_before_layout": 3.0, "hlo_passes_after_layout": 1.0,
      "backend": 6.0, "kernel_emission": 3.0, "fusion_kernels_all_threads": 4.5,
      "llvm_codegen": 3.0})
  # top events by inclusive seconds, the dispatch wrapper (4.5 s in all) left out
  assert [row[0] for row in summary["top_events"]] == [
      "PjRtCpuClient::Compile", "CpuCompiler::RunBackend", "FusionCompiler::Compile"]
  assert summary["top_events"][2][1:] == [pytest.approx(4.5), 4]
  # busy = union of intervals: thread 3 is busy [4.5, 6.5] and [8, 9] = 3 s of a 4.5 s span
  assert summary["threads"]["codegen-b"] == pytest.approx(
      {"events": 3, "busy_secs": 3.0, "span_secs": 4.5})
  assert summary["threads"]["compiler"]["busy_secs"] == pytest.approx(10.0)
  assert "autotuning" not in summary["phases"]  # absent phases are left out, not zero


def test_profile_compile_of_a_real_program():
  lowered = jax.jit(lambda x: jnp.tanh(x @ x.T).sum()).lower(jnp.ones((64, 32)))
  compiled, summary = profiling.profile_compile(lowered.compile)
  assert float(compiled(jnp.ones((64, 32)))) == pytest.approx(64 * 64 * float(jnp.tanh(32.0)))
  assert summary["trace_events"] > 0 and summary["wall_secs"] > 0
  assert summary["top_events"], summary
  if jax.default_backend() == "cpu":  # XLA:CPU's stage names (PHASES) are in the trace
    assert {"hlo_passes_before_layout", "backend"} <= set(summary["phases"]), summary["phases"]
    assert all(seconds >= 0 for seconds in summary["phases"].values())


def test_a_profiled_call_keeps_its_trace_in_the_directory_given(tmp_path):
  """`first_round.py --round-trace`: a steady round profiled, its trace files kept."""
  step = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
  x = jnp.ones((64, 32))
  step(x).block_until_ready()  # compiled outside the profile, as the benchmark's round is
  value, summary = profiling.profile_compile(lambda: step(x).block_until_ready(),
                                             directory=tmp_path / "warm")
  assert float(value) == pytest.approx(64 * 64 * float(jnp.tanh(32.0)))
  assert summary["trace_events"] > 0 and summary["top_events"], summary
  assert list((tmp_path / "warm").glob("**/perfetto_trace.json.gz"))
  assert list((tmp_path / "warm").glob("**/*.xplane.pb"))  # TensorBoard's profile plugin

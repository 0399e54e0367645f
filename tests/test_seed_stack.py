"""Seeds as a vmapped axis (`fedjax_het.seed_stack`): one program trains every seed of
`config.seeds`, each seed's workdir equal to a separate run of that seed.

The class-incremental stream draws each client's data with the seed; where that changes its
padded shapes (the tiny synthetic stream), such seeds are refused with one line (they train as
separate runs).

Tolerance: XLA:CPU compiles the batched (vmapped) convolutions and matrix products with
other loop orders than the unbatched ones, so the seeds agree with their separate runs to
float32 rounding carried through a few SGD steps: losses to rtol 1e-4, parameters to atol
1e-5; the accuracies (counts of test images) are equal. A stacked run and its resume are
the same program, so they agree bit for bit.
"""

from __future__ import annotations

import json

import chex
import jax
import numpy as np
import pytest

from fedjax_het import seed_stack
from fedjax_het.config import validate_config
from fedjax_het.engine import rounds
from fedjax_het.errors import ConfigError
from fedjax_het.train import train_and_evaluate
from tests.test_cil_train import tiny_cil_config
from tests.test_train import tiny_config

SEEDS = (0, 1)


def _counting_round_fns(monkeypatch):
  """Counts the traces of every round function the engine builds."""
  traces = []
  make_round_fn = rounds.make_round_fn

  def counting(algorithm):
    round_fn = make_round_fn(algorithm)

    def traced(state, data):
      traces.append(1)
      return round_fn(state, data)

    return traced

  monkeypatch.setattr(seed_stack.rounds, "make_round_fn", counting)
  return traces


def _records(workdir):
  return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
          for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _assert_close_records(got, want):
  assert [r["round"] for r in got] == [r["round"] for r in want]
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    for name, value in b.items():
      if name.startswith("eval/"):
        np.testing.assert_allclose(a[name], value, atol=1e-9, err_msg=name)
      elif isinstance(value, float):
        np.testing.assert_allclose(a[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
      else:
        assert a[name] == value, name


@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_each_seed_equals_its_separate_run(tmp_path, monkeypatch):
  make_config = lambda: tiny_config("solo")  # noqa: E731
  traces = _counting_round_fns(monkeypatch)
  config = make_config()
  config.seeds = SEEDS
  validate_config(config)
  out = train_and_evaluate(config, tmp_path / "stacked")
  assert len(traces) == 1   # one trace of the round serves every seed and every round
  assert set(out["seeds"]) == set(SEEDS)
  for seed in SEEDS:
    alone = make_config()
    alone.seed = seed
    separate = train_and_evaluate(alone, tmp_path / f"alone_{seed}")
    lane = tmp_path / "stacked" / f"seed_{seed}"
    _assert_close_records(_records(lane), _records(tmp_path / f"alone_{seed}"))
    chex.assert_trees_all_close(out["seeds"][seed]["state"], separate["state"], atol=1e-5,
                                rtol=1e-4)
    assert json.loads((lane / "run.json").read_text()) == json.loads(
        (tmp_path / f"alone_{seed}" / "run.json").read_text())   # a seed's run, resumable alone
  # The seeds differ: they are not one run copied.
  assert _records(tmp_path / "stacked" / "seed_0") != _records(tmp_path / "stacked" / "seed_1")


@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_a_stacked_run_resumes_bit_identical(tmp_path):
  config = tiny_config("solo")
  config.seeds = SEEDS
  full = train_and_evaluate(config, tmp_path / "full")
  part = train_and_evaluate(config, tmp_path / "split", max_rounds=1)
  assert all(out["rounds_done"] == 1 for out in part["seeds"].values())
  resumed = train_and_evaluate(config, tmp_path / "split")
  for seed in SEEDS:
    chex.assert_trees_all_equal(resumed["seeds"][seed]["state"], full["seeds"][seed]["state"])
    assert (_records(tmp_path / "split" / f"seed_{seed}")
            == _records(tmp_path / "full" / f"seed_{seed}"))
    assert ((tmp_path / "split" / f"seed_{seed}" / "results.json").read_text()
            == (tmp_path / "full" / f"seed_{seed}" / "results.json").read_text())


@pytest.mark.slow  # about 20 s on 2 cores; test_a_stacked_run_resumes_bit_identical covers resume
def test_lanes_a_kill_left_a_round_apart_resume_from_their_common_checkpoint(tmp_path):
  config = tiny_config("solo")
  config.seeds = SEEDS
  full = train_and_evaluate(config, tmp_path / "full")
  train_and_evaluate(config, tmp_path / "split", max_rounds=1)
  alone = tiny_config("solo")
  alone.seed = 1
  train_and_evaluate(alone, tmp_path / "split" / "seed_1", max_rounds=2)  # seed 1 a round ahead
  resumed = train_and_evaluate(config, tmp_path / "split")
  for seed in SEEDS:
    chex.assert_trees_all_equal(resumed["seeds"][seed]["state"], full["seeds"][seed]["state"])


def test_seeds_whose_data_differ_in_shape_are_refused(tmp_path):
  """The task stream's per-client sizes depend on the seed: one line, nothing written."""
  config = tiny_cil_config()
  config.seeds = SEEDS
  with pytest.raises(ConfigError, match="config.seeds: seed 1 gives data of other shapes"):
    train_and_evaluate(config, tmp_path)
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("seeds,allowed", [((0, 0), "distinct integers"),
                                           ((0, -1), "distinct integers >= 0"),
                                           ((0.5,), "integers")])
def test_bad_seeds_name_the_field(seeds, allowed):
  for config in (tiny_config("solo"), tiny_cil_config()):
    config.seeds = seeds
    with pytest.raises(ConfigError, match=f"config.seeds.*{allowed}"):
      validate_config(config)


def test_seeds_need_one_process_without_a_mesh(tmp_path):
  config = tiny_config("solo")
  config.seeds = SEEDS
  config.sharding.num_devices = 2
  with pytest.raises(ConfigError, match="config.seeds"):
    train_and_evaluate(config, tmp_path)


def test_seed_configs_are_single_runs():
  config = tiny_config("solo")
  config.seeds = (3, 5)
  configs = seed_stack.seed_configs(config)
  assert [(c.seed, tuple(c.seeds)) for c in configs] == [(3, ()), (5, ())]
  assert jax.tree_util.tree_leaves(config.to_dict())  # the original is unchanged
  assert tuple(config.seeds) == (3, 5)


def _bitwise_equal(a, b):
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  return tree_a == tree_b and all(
      x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
      for x, y in zip(leaves_a, leaves_b))


def _cached_stacks(tmp_path):
  """Two stacks of the same two seeds (one group of small CNNs: quick to compile) with the
  trace cache in `tmp_path`, and their lanes."""
  from fedjax_het.train import build_experiment  # pylint: disable=g-import-not-at-top
  config = tiny_config("solo", compilation_cache_dir=str(tmp_path), seeds=SEEDS,
                       **{"models.architectures": ("simple_cnn",) * 4})
  validate_config(config)
  lanes = [build_experiment(c) for c in seed_stack.seed_configs(config)]
  return seed_stack.SeedStack(lanes), seed_stack.SeedStack(lanes), lanes


def test_a_second_stack_reads_its_vmapped_round_from_the_trace_cache(tmp_path, monkeypatch):
  """The stack's round lowers as every run's (runtime.RoundCompiler): the second stack of the
  same seeds reads the traced round instead of tracing it, the very module the first saved."""
  from fedjax_het.runtime import trace_cache  # pylint: disable=g-import-not-at-top
  traces = _counting_round_fns(monkeypatch)
  first, second, _ = _cached_stacks(tmp_path)
  assert first.compiler.trace_cache_directory() == tmp_path / trace_cache.FOLDER
  state = first.init_state()
  missed = first.compiler.lower_rounds(state)
  assert not missed.hit and len(traces) == 1
  read = second.compiler.lower_rounds(state)
  assert read.hit and len(traces) == 1  # read, not traced
  assert read.as_text() == missed.as_text()


@pytest.mark.slow  # three compiles of the round and evaluation: about 20 s on 2 cores
def test_a_stack_compiled_through_the_trace_cache_computes_the_same_bits(tmp_path):
  """compile_all (the round read from the cache, the evaluation and diagnostics compiled
  beside it) gives the bits of the vmapped round, evaluation and diagnostics jitted without
  the cache."""
  first, second, lanes = _cached_stacks(tmp_path)
  state = first.init_state()
  first.compiler.lower_rounds(state)  # saves the traced round
  out = second.compile_all(state, with_diagnostics=True)(state, second.data)
  assert second._evaluate_compiled is not None  # pylint: disable=protected-access
  for lane in lanes:
    lane.config.trace_cache = "off"
  plain = seed_stack.SeedStack(lanes)
  assert plain.compiler.trace_cache_directory() is None
  assert _bitwise_equal(out, plain.run_rounds(state, plain.data))
  assert second.evaluation_records(out[0], 1) == plain.evaluation_records(out[0], 1)
  assert [d.tolist() for d in second.diagnostics(out[0])] == [
      d.tolist() for d in plain.diagnostics(out[0])]

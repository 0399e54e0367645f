"""The trace cache: the next run reads the exported round instead of tracing it, same bits."""

import json
import pathlib
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import config as config_lib
from fedjax_het import models
from fedjax_het.runtime import trace_cache
from fedjax_het import experiment as experiment_lib
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import fcclplus, solo
from fedjax_het.errors import ConfigError
from tests.test_train import ONE_MODEL, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def _bitwise_equal(a, b):
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  assert tree_a == tree_b
  return all(x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
             for x, y in zip(leaves_a, leaves_b))


@pytest.fixture
def counted_traces(monkeypatch):
  """Counts the traces of every Experiment's round body made after the fixture starts."""
  count = {"traces": 0}
  make = experiment_lib.rounds.make_round_fn

  def counting_make_round_fn(algorithm):
    round_fn = make(algorithm)

    def counted(state, data):
      count["traces"] += 1
      return round_fn(state, data)
    return counted

  def counting_make_stage_fns(algorithm):  # config.round_programs="stages": a trace per stage
    def counted(fn):
      def run(state, data):
        count["traces"] += 1
        return fn(state, data)
      return run
    return tuple((name, counted(fn)) for name, fn in make_stages(algorithm))

  make_stages = experiment_lib.rounds.make_stage_fns
  monkeypatch.setattr(experiment_lib.rounds, "make_round_fn", counting_make_round_fn)
  monkeypatch.setattr(experiment_lib.rounds, "make_stage_fns", counting_make_stage_fns)
  return count


# Slow: FCCL+ (a public phase, metrics of both phases) takes about 30 s on a 2-core CPU, SOLO
# (one model group, `ONE_MODEL`) about 20 s. The default suite keeps the check in
# test_configs_that_differ_only_in_num_rounds_share_one_entry (a round read back, traced once,
# computes the bits of a traced one) and
# test_a_class_incremental_run_reads_its_traced_round_and_computes_the_same_bits; the round of
# two groups is saved and read back in test_another_config_value_is_another_entry.
@pytest.mark.parametrize("variant", [pytest.param("solo", marks=pytest.mark.slow),
                                     pytest.param("fcclplus", marks=pytest.mark.slow)])
def test_a_second_experiment_reads_the_round_and_computes_the_same_bits(tmp_path, counted_traces,
                                                                         variant):
  # The round as one program (stage programs: tests/test_round_programs.py).
  config = tiny_config(variant, compilation_cache_dir=str(tmp_path / "cache"),
                       round_programs="one", **(ONE_MODEL if variant == "solo" else {}))
  first = experiment_lib.Experiment(config)
  assert first.trace_cache_directory() == tmp_path / "cache" / trace_cache.FOLDER
  state = first.init_state()
  missed = first.lower_rounds(state)
  assert not missed.hit and counted_traces["traces"] == 1
  saved = sorted(p.suffix for p in (tmp_path / "cache" / trace_cache.FOLDER).iterdir())
  assert saved == [trace_cache.SUFFIX, ".json"]

  second = experiment_lib.Experiment(config, scenario=first.scenario)
  read = second.lower_rounds(state)
  assert read.hit and counted_traces["traces"] == 1  # read, not traced
  # The miss lowers the program it saved, read back: the hit compiles the very same module.
  assert read.as_text() == missed.as_text()
  out_cached = second.compile_all(state)(state, second.data)
  assert counted_traces["traces"] == 1

  # The cached program is the round itself: jax.jit of it (no cache) gives the same bits.
  config.trace_cache = "off"
  plain = experiment_lib.Experiment(config, scenario=first.scenario)
  assert plain.trace_cache_directory() is None
  assert _bitwise_equal(out_cached, plain.run_rounds(state, plain.data))


def test_another_config_value_is_another_entry(tmp_path, counted_traces):
  # Two model groups (tiny_config's default): their round is saved, and read back at the end.
  config = tiny_config("solo", compilation_cache_dir=str(tmp_path))
  experiment = experiment_lib.Experiment(config)
  state = experiment.init_state()
  assert not experiment.lower_rounds(state).hit
  config.local.lr = 0.5 * config.local.lr
  changed = experiment_lib.Experiment(config, scenario=experiment.scenario)
  assert not changed.lower_rounds(state).hit
  assert counted_traces["traces"] == 2
  assert len(list((tmp_path / trace_cache.FOLDER).glob(f"*{trace_cache.SUFFIX}"))) == 2
  # A field that never changes the numbers keeps the entry.
  config.logging.plots = not config.logging.plots
  config.name = "renamed"
  assert experiment_lib.Experiment(config, scenario=experiment.scenario).lower_rounds(state).hit


def _old_round_decay_schedule(base_lr, num_rounds, decay=0.9):
  """The linear decay with E a constant of the traced round (optax's schedule, by hand)."""
  if not decay:
    return optax.constant_schedule(base_lr)
  multiplier = optax.linear_schedule(init_value=1.0, end_value=1.0 - decay,
                                     transition_steps=num_rounds, transition_begin=1)
  return lambda round_index: base_lr * multiplier(round_index)


def _rounds(run, state, data, calls):
  """`calls` calls of the compiled round `run` from `state`: (state, [metrics per call])."""
  metrics = []
  for _ in range(calls):
    state, m = run(state, data)
    metrics.append(m)
  return state, metrics


def test_configs_that_differ_only_in_num_rounds_share_one_entry(tmp_path, counted_traces,
                                                                 monkeypatch):
  config = tiny_config("solo", compilation_cache_dir=str(tmp_path), round_programs="one",
                       num_rounds=4, **ONE_MODEL)
  config.local.lr_decay = 0.9  # a rate that depends on E from round 2 on
  first = experiment_lib.Experiment(config)
  state = first.init_state()
  missed = first.lower_rounds(state)
  assert not missed.hit and counted_traces["traces"] == 1
  config.num_rounds, config.eval.every = 6, 2  # fields a round's program does not read
  longer = experiment_lib.Experiment(config, scenario=first.scenario)
  read = longer.lower_rounds(state)
  assert read.hit and counted_traces["traces"] == 1
  assert read.as_text() == missed.as_text()
  assert len(list((tmp_path / trace_cache.FOLDER).glob(f"*{trace_cache.SUFFIX}"))) == 1

  # The shared program reads E from the data: three rounds of the 6-round run give the bits of
  # a round that has E = 6 as a constant (the schedule written with optax, no cache), and
  # differ from the 4-round run's third round.
  shared = longer.compile_rounds(state)
  state6, metrics6 = _rounds(shared, state, longer.data, 3)
  state4, _ = _rounds(shared, state, first.data, 3)  # the same program, E = 4
  config.trace_cache = "off"
  monkeypatch.setattr(solo, "round_decay_schedule", _old_round_decay_schedule)
  constant = experiment_lib.Experiment(config, scenario=first.scenario)
  assert constant.data.num_rounds is not None  # given, and not read by the old schedule
  expected_state, expected_metrics = _rounds(constant.compile_rounds(state), state,
                                             constant.data, 3)
  assert _bitwise_equal((state6, metrics6), (expected_state, expected_metrics))
  assert not _bitwise_equal(state6, state4)


def test_an_unreadable_entry_is_traced_again_and_replaced(tmp_path, counted_traces):
  config = tiny_config("solo", compilation_cache_dir=str(tmp_path), **ONE_MODEL)
  experiment = experiment_lib.Experiment(config)
  state = experiment.init_state()
  experiment.lower_rounds(state)
  (program,) = (tmp_path / trace_cache.FOLDER).glob(f"*{trace_cache.SUFFIX}")
  program.write_bytes(b"not a flatbuffer")
  again = experiment_lib.Experiment(config, scenario=experiment.scenario)
  assert not again.lower_rounds(state).hit
  assert counted_traces["traces"] == 2
  assert experiment_lib.Experiment(config, scenario=experiment.scenario).lower_rounds(state).hit


def test_no_cache_without_a_cache_dir_or_when_off():
  assert experiment_lib.Experiment(tiny_config("solo")).trace_cache_directory() is None
  off = tiny_config("solo", compilation_cache_dir="/tmp/x", trace_cache="off")
  assert experiment_lib.Experiment(off).trace_cache_directory() is None


def test_the_mode_is_validated_with_the_field_named():
  with pytest.raises(ConfigError, match=r"config.trace_cache must be one of "
                                        r"\('auto', 'on', 'off'\), got 'sometimes'"):
    config_lib.validate_config(tiny_config("solo", trace_cache="sometimes"))
  assert "trace_cache" in workdir_lib.NEUTRAL_FIELDS  # same bits, so a resume may change it


def _round_defined_here():
  pass


def test_code_outside_the_package_is_found_and_hashed(tmp_path):
  assert trace_cache.outside_package([fcclplus.make_fcclplus,
                                      models.get_model("simple_cnn", 10)]) == []
  here = pathlib.Path(__file__).resolve()
  assert trace_cache.outside_package([_round_defined_here]) == [here]
  helper = tmp_path / "helper.py"
  helper.write_text("x = 1\n")
  before = trace_cache.source_digest([helper])
  assert trace_cache.source_digest([helper]) == before
  helper.write_text("x = 2\n")
  assert trace_cache.source_digest([helper]) != before
  assert trace_cache.source_digest() != before


def test_the_key_follows_shapes_dtypes_config_and_choices():
  args = ({"w": jnp.zeros((2, 3))}, jnp.zeros((4,), jnp.int32))
  key = lambda a, config="{}", choices=None: trace_cache.round_key(  # noqa: E731
      config_json=config, choices=choices or {}, args=a)
  assert key(args) == key(args)
  assert key(args) != key(({"w": jnp.zeros((2, 4))}, args[1]))
  assert key(args) != key(({"w": jnp.zeros((2, 3), jnp.bfloat16)}, args[1]))
  assert key(args) != key(({"v": jnp.zeros((2, 3))}, args[1]))
  assert key(args) != key(args, config='{"local.lr": 0.1}')
  assert key(args) != key(args, choices={"conv_impl": "im2col"})


class _Pair(NamedTuple):
  a: jax.Array
  b: jax.Array


def test_tree_spec_round_trip_and_what_it_refuses():
  tree = {"loss": jnp.zeros(()), "groups": {"g": [jnp.ones(2), (jnp.ones(1), None)]}}
  rebuilt = trace_cache.tree_from_spec(json.loads(json.dumps(trace_cache.tree_spec(tree))))
  assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(tree)
  with pytest.raises(TypeError, match="_Pair"):
    trace_cache.tree_spec({"pair": _Pair(jnp.ones(1), jnp.ones(1))})
  with pytest.raises(TypeError, match="keys must be strings"):
    trace_cache.tree_spec({1: jnp.ones(1)})


def test_lower_round_of_a_toy_round_and_a_metrics_tree_it_cannot_describe(tmp_path):
  def toy_round(state, data):
    new = {"w": state["w"] * data["scale"] + 1.0, "step": state["step"] + 1}
    return new, {"loss": jnp.sum(new["w"]), "per": [new["w"][0], new["w"][1]]}

  state = {"w": jnp.arange(3.0), "step": jnp.zeros((), jnp.int32)}
  data = {"scale": jnp.asarray(2.0)}
  key = trace_cache.round_key(config_json="{}", choices={}, args=(state, data))
  miss = trace_cache.lower_round(toy_round, (state, data), directory=tmp_path, key=key)
  hit = trace_cache.lower_round(toy_round, (state, data), directory=tmp_path, key=key)
  assert (miss.hit, hit.hit) == (False, True)
  expected = jax.jit(toy_round)(state, data)
  assert _bitwise_equal(hit.compile()(state, data), expected)
  assert _bitwise_equal(miss.compile()(state, data), expected)
  with pytest.raises(ValueError, match="structure"):
    hit.compile()(state, {"scale": data["scale"], "extra": data["scale"]})

  def pair_round(state, data):
    return state, {"pair": _Pair(state["w"], data["scale"])}

  with pytest.raises(TypeError):
    trace_cache.lower_round(pair_round, (state, data), directory=tmp_path / "pair", key=key)


@pytest.mark.slow  # two fresh processes, each training the tiny config: about a minute
def test_a_second_cli_run_reads_the_traced_round_and_gives_the_same_results(tmp_path):
  cache = tmp_path / "cache"
  results, logs = [], []
  for run in ("first", "second"):
    command = [sys.executable, str(REPO / "experiments" / "train.py"),
               "--config=digits_fcclplus_quick", f"--workdir={tmp_path / run}",
               f"--config.compilation_cache_dir={cache}", "--config.num_rounds=2",
               "--config.models.architectures=('simple_cnn','fedavg_cifar_cnn','simple_cnn',"
               "'fedavg_cifar_cnn')", "--config.local.epochs=1", "--config.local.batch_size=16",
               "--config.collaborative.batch_size=32", "--config.scenario.public_size=64",
               "--config.scenario.private_sizes.mnist=30", "--config.scenario.private_sizes.usps=20",
               "--config.scenario.private_sizes.svhn=40", "--config.scenario.private_sizes.syn=24",
               "--config.scenario.test_size=30", "--config.eval.batch_size=30",
               "--config.logging.progress=False", "--config.logging.plots=False"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=True)
    logs.append(done.stderr)
    results.append(json.loads((tmp_path / run / "results.json").read_text()))
  assert "saved the traced round to" in logs[0]
  assert "read the traced round from" in logs[1]
  assert results[0] == results[1]


def test_a_class_incremental_run_reads_its_traced_round_and_computes_the_same_bits(tmp_path):
  from fedjax_het.stream_experiment import StreamExperiment  # pylint: disable=g-import-not-at-top
  from tests.test_cil_train import tiny_cil_config  # pylint: disable=g-import-not-at-top
  config = tiny_cil_config()
  config.compilation_cache_dir = str(tmp_path)
  first = StreamExperiment(config)
  assert first.compiler.trace_cache_directory() == tmp_path / trace_cache.FOLDER
  state = first.init_state()
  missed = first.lower_rounds(state)
  second = StreamExperiment(config, scenario=first.scenario)
  read = second.lower_rounds(state)
  assert (missed.hit, read.hit) == (False, True)
  assert read.as_text() == missed.as_text()
  config.trace_cache = "off"
  plain = StreamExperiment(config, scenario=first.scenario)
  assert plain.compiler.trace_cache_directory() is None
  assert _bitwise_equal(read.compile()(state, second.data), plain.run_rounds(state, plain.data))


def test_a_class_incremental_run_with_trace_cache_on_caches_a_method_of_its_own(
    tmp_path, monkeypatch, counted_traces):
  """trace_cache="on" for a stream whose method is defined outside the package (here: this
  module), which "auto" leaves uncached: the second build reads the round, no second trace."""
  from fedjax_het import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_het.stream_experiment import StreamExperiment  # pylint: disable=g-import-not-at-top
  from tests.test_cil_train import tiny_cil_config  # pylint: disable=g-import-not-at-top
  make = algorithms.get_method("fedavg_cil").make

  def make_here(config, setup):
    return make(config, setup)

  monkeypatch.setitem(algorithms.METHODS, "fedavg_cil",
                      algorithms.METHODS["fedavg_cil"]._replace(make=make_here))
  config = tiny_cil_config()
  config.compilation_cache_dir = str(tmp_path)
  assert StreamExperiment(config).compiler.trace_cache_directory() is None  # "auto"
  config.trace_cache = "on"
  config_lib.validate_config(config)
  first = StreamExperiment(config)
  assert first.compiler.trace_cache_directory() == tmp_path / trace_cache.FOLDER
  state = first.init_state()
  missed = first.lower_rounds(state)
  assert not missed.hit and counted_traces["traces"] == 1
  second = StreamExperiment(config, scenario=first.scenario)
  read = second.lower_rounds(state)
  assert read.hit and counted_traces["traces"] == 1  # read, not traced
  assert read.as_text() == missed.as_text()

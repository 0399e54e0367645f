"""A round as one program per stage (`config.round_programs`): same bits as one program."""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import algorithms
from fedjax_het import config as config_lib
from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het.runtime import trace_cache
from fedjax_het import workdir as workdir_lib
from fedjax_het.engine import rounds
from fedjax_het.runtime import programs
from fedjax_het.engine.api import Algorithm, Stage
from fedjax_het.errors import ConfigError
from tests.test_train import tiny_config


def _bitwise_equal(a, b):
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  assert tree_a == tree_b
  return all(np.asarray(x).dtype == np.asarray(y).dtype
             and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
             for x, y in zip(leaves_a, leaves_b))


def _toy_stages():
  def double(state, data, key, round_index):
    del data
    noise = jax.random.uniform(key)  # the round's key: the same in every stage
    return {"x": 2.0 * state["x"] + noise}, {"double": {"before": state["x"], "noise": noise}}

  def add(state, data, key, round_index):
    noise = jax.random.uniform(key)
    return ({"x": state["x"] + data + round_index + noise},
            {"add": {"before": state["x"], "noise": noise}})

  return (Stage("double", double), Stage("add", add))


def _toy_algorithm():
  stages = _toy_stages()
  return Algorithm(name="toy", init=lambda key, data: {"x": jnp.float32(1.0)},
                   round=rounds.staged_round(stages), evaluate=lambda s, t: {}, stages=stages)


def test_staged_round_runs_the_stages_in_order_on_the_rounds_key():
  round_fn = rounds.staged_round(_toy_stages())
  key = jax.random.key(3)
  noise = float(jax.random.uniform(key))
  state, metrics = round_fn({"x": jnp.float32(1.0)}, 10.0, key, 2)
  # By hand: x = 2 * 1 + u, then x + 10 + 2 + u, with u the same draw in both stages.
  np.testing.assert_allclose(float(state["x"]), (2.0 + noise) + 12.0 + noise, rtol=1e-6)
  assert set(metrics) == {"double", "add"}
  np.testing.assert_allclose(float(metrics["add"]["before"]), 2.0 + noise, rtol=1e-6)
  assert float(metrics["double"]["noise"]) == float(metrics["add"]["noise"]) == noise


def test_staged_round_refuses_clashing_metrics_and_names():
  same = lambda s, d, k, r: (s, {"local": 1.0})  # noqa: E731
  with pytest.raises(ValueError, match=r"stage 'b' returns metrics \['local'\]"):
    rounds.staged_round((Stage("a", same), Stage("b", same)))({}, None, jax.random.key(0), 0)
  with pytest.raises(ValueError, match="unique stage names"):
    rounds.staged_round((Stage("a", same), Stage("a", same)))
  with pytest.raises(ValueError, match="at least one stage"):
    rounds.staged_round(())


def test_stage_functions_in_order_are_the_round_function():
  algorithm = _toy_algorithm()
  state = rounds.initial_state(algorithm, jax.random.key(0), 5.0)
  round_fn = rounds.make_round_fn(algorithm)
  stage_fns = rounds.make_stage_fns(algorithm)
  assert [name for name, _ in stage_fns] == ["double", "add"]
  by_round, by_stages = state, state
  for _ in range(3):
    by_round, round_metrics = round_fn(by_round, 5.0)
    stage_metrics = {}
    for _, fn in stage_fns:
      by_stages, m = fn(by_stages, 5.0)
      stage_metrics.update(m)
    assert _bitwise_equal((by_round, round_metrics), (by_stages, stage_metrics))
  assert int(by_stages["round"]) == 3  # the last stage advances the counter, once per round
  with pytest.raises(ValueError, match="no stages"):
    rounds.make_stage_fns(algorithm._replace(stages=()))


def test_compiled_stages_run_rounds_per_call_and_stack_the_metrics():
  algorithm = _toy_algorithm()
  state = rounds.initial_state(algorithm, jax.random.key(0), 5.0)
  stage_fns = rounds.make_stage_fns(algorithm)
  lowered = programs.lower_stages(stage_fns, lambda name, fn: jax.jit(fn).lower(state, 5.0),
                                  rounds_per_call=4, side_by_side=True)
  assert lowered.names == ("double", "add") and not lowered.hit
  compiled = lowered.compile()
  assert set(compiled.compile_secs) == {"double", "add"}
  out, metrics = compiled(state, 5.0)
  scanned, scanned_metrics = jax.jit(rounds.make_run_rounds(rounds.make_round_fn(algorithm),
                                                            4))(state, 5.0)
  assert _bitwise_equal((out, metrics), (scanned, scanned_metrics))
  assert metrics["add"]["before"].shape == (4,) and int(out["round"]) == 4


def test_the_memory_estimate_is_the_largest_stage():
  def program(temp, output, argument):
    analysis = types.SimpleNamespace(temp_size_in_bytes=temp, output_size_in_bytes=output,
                                     argument_size_in_bytes=argument)
    return types.SimpleNamespace(memory_analysis=lambda: analysis)

  compiled = programs.CompiledStages(["a", "b", "c"], [program(10, 5, 7), program(12, 1, 9),
                                                       program(3, 20, 8)], 1, {})
  peak = compiled.memory_analysis()  # c: 23 bytes of temporaries + outputs
  assert (peak.temp_size_in_bytes, peak.output_size_in_bytes) == (3, 20)
  assert peak.argument_size_in_bytes == 9
  assert resources.estimated_bytes(compiled) == 23
  unknown = types.SimpleNamespace(memory_analysis=lambda: None)
  assert programs.CompiledStages(["a"], [unknown], 1, {}).memory_analysis() is None


def test_the_choice_is_resolved_and_validated_with_the_field_named():
  assert programs.resolve("auto", True) == "stages"
  assert programs.resolve("auto", True, "cpu") == "stages"
  assert programs.resolve("auto", True, "gpu") == "groups"  # measured on an H200
  assert programs.resolve("auto", False) == "one"
  assert programs.resolve("auto", False, "gpu") == "one"
  assert programs.resolve("one", True) == "one"
  with pytest.raises(ConfigError, match=r"config.round_programs must be one of "
                                        r"\('auto', 'one', 'stages', 'groups'\), got 'many'"):
    config_lib.validate_config(tiny_config("solo", round_programs="many"))
  with pytest.raises(ConfigError, match=r"config.round_programs='stages' needs a method whose "
                                        r"round is given as stages"):
    experiment_lib.Experiment(tiny_config("solo", round_programs="stages"))
  with pytest.raises(ConfigError, match=r"config.round_programs='groups' needs a method whose "):
    experiment_lib.Experiment(tiny_config("solo", round_programs="groups"))
  with pytest.raises(ConfigError, match=r"config.round_compile must be one of \('auto', "
                                        r"'side_by_side', 'in_turn'\), got 'threads'"):
    config_lib.validate_config(tiny_config("solo", round_compile="threads"))
  assert programs.side_by_side("auto", "cpu") and not programs.side_by_side("auto", "gpu")
  assert programs.side_by_side("auto", "gpu", "groups")
  assert not programs.side_by_side("auto", "tpu", "stages")
  assert not programs.side_by_side("in_turn", "gpu", "groups")
  assert programs.side_by_side("side_by_side", "gpu")
  assert not programs.side_by_side("in_turn", "cpu")
  assert "round_programs" in workdir_lib.NEUTRAL_FIELDS  # same bits, so a resume may change it
  assert "round_compile" in workdir_lib.NEUTRAL_FIELDS
  for name in ("fccl", "fcclplus", "fedmd", "feddf", "rhfl", "fedmatch", "rcfl"):  # staged
    assert [s.name for s in algorithms.get_method(name).make(
        *_made(name)).stages] == ["public", "local"]


def _made(name):
  experiment = experiment_lib.Experiment(tiny_config(name, round_programs="one"))
  return experiment.config, experiment.setup


def test_fcclplus_stage_programs_compute_the_one_program_bits_and_trace_once(tmp_path,
                                                                            monkeypatch):
  """Both stages of a homogeneous tiny FCCL+ (one small CNN: quick to compile), read back
  from the trace cache, against the round as one scanned program."""
  make = algorithms.get_method("fcclplus").make

  def counted(config, setup):  # every stage body may be traced once in this test
    algorithm = make(config, setup)
    stages = tuple(Stage(s.name, chex.assert_max_traces(s.run, n=1)) for s in algorithm.stages)
    return algorithm._replace(stages=stages, round=rounds.staged_round(stages))

  monkeypatch.setitem(algorithms.METHODS, "fcclplus",
                      algorithms.METHODS["fcclplus"]._replace(make=counted))
  chex.clear_trace_counter()
  # trace_cache="on": `counted` is defined outside the package, where "auto" would not cache.
  config = tiny_config("fcclplus", rounds_per_call=3, compilation_cache_dir=str(tmp_path),
                       trace_cache="on", **{"models.architectures": ("simple_cnn",)})
  first = experiment_lib.Experiment(config)
  assert first.round_programs == "stages"
  assert [name for name, _ in first.stage_programs] == ["public", "local"]
  state = first.init_state()
  missed = first.lower_rounds(state)
  assert isinstance(missed, programs.LoweredStages) and not missed.hit
  assert len(list((tmp_path / trace_cache.FOLDER).glob(f"*{trace_cache.SUFFIX}"))) == 2

  second = experiment_lib.Experiment(config, scenario=first.scenario)
  read = second.lower_rounds(state)  # both stages from the cache: no trace
  assert read.hit and read.as_text() == missed.as_text()
  compiled = read.compile()
  out = compiled(state, second.data)
  again = compiled(*(out[0], second.data))  # a second call: compiled, not traced again

  chex.clear_trace_counter()  # the one-program round traces the same stage bodies once more
  config.round_programs, config.trace_cache = "one", "off"
  one = experiment_lib.Experiment(config, scenario=first.scenario)
  expected = one.run_rounds(state, one.data)
  assert _bitwise_equal(out, expected)
  assert _bitwise_equal(again, one.run_rounds(expected[0], one.data))


def test_a_stage_split_by_group_computes_the_stage_and_traces_it_once():
  """`programs.split_by_group` on a toy stage: each group's new state is its own, the rest
  (counter, server value) and the metrics (per-group nodes at two depths, and others) are put
  back as the stage gives them; the stage body is traced once for all programs."""
  groups = ("a", "b", "c")

  def body(state, data):
    new = {g: state["groups"][g] * data[g] + 1.0 for g in groups}
    metrics = {"local": {g: {"loss": jnp.sum(new[g])} for g in groups},
               "server": {"seen": state["server"], "deep": {g: new[g][0] for g in groups}}}
    return {**state, "groups": new, "round": state["round"] + 1}, metrics

  chex.clear_trace_counter()
  stage_fn = chex.assert_max_traces(body, n=1)
  state = {"groups": {g: jnp.arange(3.0) + i for i, g in enumerate(groups)},
           "round": jnp.int32(4), "server": jnp.float32(7.0)}
  data = {g: jnp.float32(i + 2) for i, g in enumerate(groups)}
  parts, join = programs.split_by_group("local", stage_fn, groups)
  assert [name for name, _ in parts] == ["local[rest]", "local[a]", "local[b]", "local[c]"]
  outputs = [jax.jit(fn)(state, data) for _, fn in parts]
  # The rest program holds no group's arrays; group b's program holds b's only.
  assert set(outputs[0][0]) == {"round", "server"} and outputs[0][1] == {"server": {"seen": 7.0}}
  np.testing.assert_array_equal(outputs[2][0], (np.arange(3.0) + 1) * 3 + 1)
  assert set(outputs[2][1]) == {"local", "server/deep"}
  # Against the stage by hand: new_g = (arange(3) + i) * (i + 2) + 1.
  expected_groups = {g: (np.arange(3.0) + i) * (i + 2) + 1 for i, g in enumerate(groups)}
  joined_state, joined_metrics = join(outputs)
  assert int(joined_state["round"]) == 5 and float(joined_state["server"]) == 7.0
  for g in groups:
    np.testing.assert_array_equal(joined_state["groups"][g], expected_groups[g])
    assert float(joined_metrics["local"][g]["loss"]) == expected_groups[g].sum()
    assert float(joined_metrics["server"]["deep"][g]) == expected_groups[g][0]
  assert float(joined_metrics["server"]["seen"]) == 7.0
  assert _bitwise_equal((joined_state, joined_metrics), jax.jit(body)(state, data))


@pytest.mark.slow  # 67 s; the toy test above keeps `split_by_group` in the default suite
def test_fcclplus_group_programs_compute_the_stage_programs_bits(tmp_path):
  """The tiny heterogeneous FCCL+ (two backbones) with its local stage split by group, through
  the trace cache and back, against the same round as two stage programs."""
  config = tiny_config("fcclplus", compilation_cache_dir=str(tmp_path), trace_cache="on",
                       round_programs="groups", round_compile="side_by_side")
  split = experiment_lib.Experiment(config)
  assert split.round_programs == "groups"
  names = tuple(g.name for g in split.groups)
  assert len(names) > 1 and split.split_stages == {"local": names}
  state = split.init_state()
  lowered = split.lower_rounds(state)
  assert lowered.names == ("public", "local[rest]") + tuple(f"local[{g}]" for g in names)
  assert not lowered.hit
  again = experiment_lib.Experiment(config, scenario=split.scenario).lower_rounds(state)
  assert again.hit  # every program read back from the trace cache
  compiled = again.compile()
  assert compiled.stage_names == ("public", "local")
  out = compiled(state, split.data)

  config.round_programs, config.trace_cache = "stages", "off"
  staged = experiment_lib.Experiment(config, scenario=split.scenario)
  expected = staged.compile_rounds(state)(state, staged.data)
  assert _bitwise_equal(out, expected)

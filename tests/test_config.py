"""The one config schema: run-wide fields written once, checked once, one meaning per field."""

import json
import pathlib
import types

import pytest

from fedjax_het import algorithms
from fedjax_het import workdir as workdir_lib
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import base_config, run_config, validate_config
from fedjax_het.errors import ConfigError
from fedjax_het.experiment import Experiment
from fedjax_het.stream_experiment import StreamExperiment

REPO = pathlib.Path(__file__).parents[1]
CIL_METHODS = tuple(n for n, m in algorithms.METHODS.items() if m.class_incremental)
DOMAIN_METHODS = tuple(n for n, m in algorithms.METHODS.items() if not m.class_incremental)
#: The compile and runtime switches every run has.
SWITCHES = ("trace_cache", "round_programs", "round_compile", "memory_check", "on_nonfinite",
            "overwrite", "xla_cpu_scheduler", "xla_gpu_triton_gemm", "compilation_cache_dir",
            "rounds_per_call", "seeds", "resume_allow_changes", "sharding.num_devices")


def flat(config):
  return workdir_lib.flatten_config(config)


def set_field(config, field, value):
  *parents, leaf = field.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def method_overrides(algorithm):
  """The run-wide fields whose defaults the method itself changes (e.g. one architecture)."""
  sections = algorithms.get_method(algorithm).default_config()
  return {f for f in flat(run_config(algorithm))
          if f.split(".")[0] in sections}


def test_every_config_has_every_run_wide_field_with_the_schemas_default():
  for algorithm in DOMAIN_METHODS + CIL_METHODS:
    schema, config = flat(run_config(algorithm)), flat(base_config(algorithm))
    assert set(schema) <= set(config), (algorithm, set(schema) - set(config))
    assert set(SWITCHES) <= set(schema)
    declared = method_overrides(algorithm) | (
        set(cil_stream.RUN_WIDE_DEFAULTS) if algorithm in CIL_METHODS else set())
    differ = {f for f in schema if config[f] != schema[f]}
    assert differ <= declared, (algorithm, differ - declared)


def test_a_class_incremental_and_a_domain_config_share_the_run_wide_fields():
  cil, domain, schema = (flat(base_config("glfc")), flat(base_config("fcclplus")),
                         flat(run_config("glfc")))
  differ = {f for f in schema if cil[f] != domain[f]}
  assert differ == {"algorithm"} | set(cil_stream.RUN_WIDE_DEFAULTS)
  for field in SWITCHES:
    assert cil[field] == domain[field] == schema[field]
  assert (cil["eval.every"], domain["eval.every"]) == (0, 1)


def test_each_family_adds_only_its_own_sections():
  for algorithm in CIL_METHODS:
    added = set(base_config(algorithm)) - set(run_config(algorithm))
    assert added == {"scenario", "cil", "local"} | set(
        algorithms.get_method(algorithm).default_config())
  assert set(base_config("fcclplus")) - set(run_config("fcclplus")) == {
      "num_rounds", "scenario", "collaborative", "fcclplus", "local"}


def test_the_library_configs_validate_with_eval_every_zero_in_both_families():
  for algorithm in ("fcclplus", "fedavg", "fedavg_cil", "glfc"):
    config = base_config(algorithm)
    config.eval.every = 0
    config.checkpoint.every = 0
    validate_config(config)


@pytest.mark.parametrize("field,value,allowed", [
    ("eval.every", -1, "an integer >= 0 (evaluate every that many rounds; 0: only the rounds"),
    ("checkpoint.every", -2, "an integer >= 0 (checkpoint every that many rounds; 0: only"),
    ("trace_cache", "always", "one of ('auto', 'on', 'off')"),
    ("round_compile", "threads", "one of ('auto', 'side_by_side', 'in_turn')"),
    ("xla_gpu_triton_gemm", "yes", "one of ('auto', 'on', 'off')"),
    ("on_nonfinite", "ignore", "one of ('stop', 'warn')"),
    ("logging.writers", "jsonl,csv", "a comma-separated string of writers"),
    ("logging.diagnostic_rounds", (0,), "a sequence of rounds >= 1"),
    ("eval.batch_size", 0, "an integer >= 1"),
    ("checkpoint.keep", 0, "an integer >= 1"),
    ("models.conv_impl", "fft", "one of ('auto', 'xla', 'im2col', 'custom_vjp', 'gemm_taps')"),
])
def test_a_bad_run_wide_field_gets_the_same_line_in_both_families(field, value, allowed):
  lines = []
  for algorithm in ("fcclplus", "fedavg_cil"):
    config = base_config(algorithm)
    set_field(config, field, value)
    with pytest.raises(ConfigError) as error:
      validate_config(config)
    lines.append(str(error.value))
  assert lines[0] == lines[1]
  assert lines[0].startswith(f"config.{field} must be {allowed}")
  assert lines[0].endswith(f"got {value!r}.") and "\n" not in lines[0]


@pytest.mark.parametrize("algorithm,rounds", [("fcclplus", "num_rounds"),
                                              ("fedavg_cil", "cil.rounds_per_task")])
def test_eval_every_against_rounds_per_call_is_one_rule(algorithm, rounds):
  config = base_config(algorithm)
  set_field(config, rounds, 20)
  config.rounds_per_call = 5
  for every, ok in ((0, True), (1, True), (5, True), (10, True), (3, False), (7, False)):
    config.eval.every = every
    if ok:
      validate_config(config)
      continue
    with pytest.raises(ConfigError, match=r"^config\.eval\.every must be 0 \(only the rounds the "
                       r"results are read from\) or an integer that divides or is a multiple "
                       rf"of rounds_per_call=5 .*got {every}\.$"):
      validate_config(config)


def test_rounds_to_a_target_need_periodic_evaluation():
  config = base_config("fedavg")
  config.eval.targets = (50.0,)
  validate_config(config)
  config.eval.every = 0
  with pytest.raises(ConfigError, match=r"config\.eval\.every must be an integer >= 1 while "
                     r"config\.eval\.targets is set"):
    validate_config(config)


@pytest.mark.parametrize("field,value,allowed", [
    ("sharding.num_devices", 2, "1 for a class-incremental run"),
    ("sharding.num_devices", 0, "1 for a class-incremental run"),
    ("round_programs", "stages", "'auto' or 'one' for a class-incremental run"),
    ("models.compute_dtype", "bfloat16", "'float32' for a class-incremental run"),
    ("eval.top_k", 5, "1 for a class-incremental run"),
    ("eval.targets", (50.0,), "() for a class-incremental run"),
])
def test_the_stream_refuses_run_wide_values_it_cannot_honour(field, value, allowed):
  domain = base_config("fcclplus")  # the same value is a valid run-wide value
  set_field(domain, field, value)
  validate_config(domain)
  config = base_config("glfc")
  set_field(config, field, value)
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert str(error.value).startswith(f"config.{field} must be {allowed}")


def _domain_run(every, num_rounds=10, last_rounds=3):
  config = base_config("fcclplus")
  config.num_rounds, config.eval.every, config.eval.last_rounds = num_rounds, every, last_rounds
  return types.SimpleNamespace(config=config, num_rounds=num_rounds)


def _stream_run(every, num_tasks=4, rounds_per_task=5):
  config = base_config("fedavg_cil")
  config.eval.every = every
  run = types.SimpleNamespace(config=config, settings=types.SimpleNamespace(
      rounds_per_task=rounds_per_task))
  run.task_end = lambda done: StreamExperiment.task_end(run, done)
  return run, num_tasks * rounds_per_task


def test_eval_every_means_every_nth_round_plus_the_rounds_the_results_read():
  """One meaning in both families: evaluate after every `every`-th round (0: none), and always
  at the rounds the results are read from (the last `last_rounds` rounds; each task's end)."""
  def domain(every):
    return {d for d in range(1, 11) if Experiment.is_eval_round(_domain_run(every), d)}

  def stream(every):
    run, rounds = _stream_run(every)
    return {d for d in range(1, rounds + 1) if StreamExperiment.is_eval_round(run, d)}

  assert domain(0) == {8, 9, 10}
  assert domain(4) == {4, 8, 9, 10}
  assert domain(1) == set(range(1, 11))
  assert stream(0) == {5, 10, 15, 20}
  assert stream(4) == {4, 5, 8, 10, 12, 15, 16, 20}
  assert stream(1) == set(range(1, 21))


def test_checkpoint_every_zero_keeps_only_the_checkpoints_every_run_writes():
  run = _domain_run(1)
  run.config.checkpoint.every = 0
  assert not any(Experiment.is_checkpoint_round(run, d) for d in range(1, 11))  # the last
  # round's checkpoint is the trainer's own (train.py saves at the run's last round)
  stream, rounds = _stream_run(0)
  stream.config.checkpoint.every = 0
  assert {d for d in range(1, rounds + 1)
          if StreamExperiment.is_checkpoint_round(stream, d)} == {5, 10, 15, 20}


def test_a_record_without_the_new_run_wide_fields_still_resumes():
  """A class-incremental run.json written before the stream had the run-wide fields (at the
  values those runs had) is no difference: workdir.ADDED_FIELDS covers every one of them."""
  config = base_config("glfc")
  current = flat(config)
  gained = set(flat(run_config("glfc"))) - {
      "name", "seed", "seeds", "algorithm", "rounds_per_call", "compilation_cache_dir",
      "resume_allow_changes", "memory_check", "xla_cpu_scheduler",
      "models.architectures", "models.width", "models.conv_impl", "eval.every",
      "eval.batch_size", "checkpoint.every", "checkpoint.keep", "logging.progress",
      "logging.plots", "logging.tensorboard", "logging.writers", "logging.wandb_mode",
      "logging.mlflow_tracking_uri", "on_nonfinite", "overwrite"}
  assert {"trace_cache", "round_programs", "round_compile", "xla_gpu_triton_gemm",
          "sharding.num_devices", "eval.top_k"} <= gained
  recorded = {f: v for f, v in current.items() if f not in gained}
  data = {"fingerprint": "x", "sources": {}}
  assert workdir_lib.differences({"config": recorded, "data": data},
                                 {"config": current, "data": data}, ()) == []
  config.sharding.num_devices = 2  # not a value the recorded runs had
  lines = workdir_lib.differences({"config": recorded, "data": data},
                                  {"config": flat(config), "data": data}, ())
  assert lines == ["config.sharding.num_devices: '<absent>' -> 2"]


def test_every_committed_cell_config_is_rebuilt_and_validates():
  """`studies.new_client.config_from_run_record` (base_config + the recorded fields, compared
  field by field, then validate_config) on every committed cell of results/."""
  from fedjax_het.studies import new_client  # pylint: disable=g-import-not-at-top
  records = sorted((REPO / "results").glob("*/*/*/run.json"))
  if not records:
    pytest.skip("no committed cells in this checkout")
  families = set()
  for path in records:
    config = new_client.config_from_run_record(json.loads(path.read_text()))
    families.add(config.scenario.name == cil_stream.SCENARIO)
  assert families == {True, False}

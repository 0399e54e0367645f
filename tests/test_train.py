"""End to end: train_and_evaluate, resume, no recompilation, scan == loop, sharding, configs."""

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import chex
import jax
import numpy as np
import pytest

from fedjax_het import reporting
from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het.config import validate_config
from fedjax_het.engine import rounds, sharding
from fedjax_het.experiment import Experiment
from fedjax_het.train import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


digits = _load(REPO / "fedjax_het" / "configs" / "digits.py", "digits_config")
cli = _load(REPO / "experiments" / "train.py", "train_cli")


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  """Synthetic data generated once per session, and no real data directory."""
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


#: The data sizes of every tiny run (tiny_config, and the command-line runs of test_stops and
#: test_workdir): a few dozen images per client, generated or read in seconds.
TINY_DATA = {"scenario.public_size": 64, "scenario.private_sizes.mnist": 30,
             "scenario.private_sizes.usps": 20, "scenario.private_sizes.svhn": 40,
             "scenario.private_sizes.syn": 24, "scenario.test_size": 30, "eval.batch_size": 30}
#: TINY_DATA as experiments/train.py flags.
TINY_DATA_FLAGS = tuple(f"--config.{field}={value}" for field, value in TINY_DATA.items())


def tiny_config(variant="fcclplus", **overrides):
  """The quick Digits config shrunk to small CNNs and a few dozen images per client."""
  c = digits.get_config(f"{variant}_quick")
  c.models.architectures = ("simple_cnn", "fedavg_cifar_cnn", "simple_cnn", "fedavg_cifar_cnn")
  c.num_rounds = 3
  c.local.epochs = 1
  c.local.batch_size = 16
  if "collaborative" in c:
    c.collaborative.batch_size = 32
  c.update_from_flattened_dict(TINY_DATA)
  if variant == "fccl":
    c.fccl.pretrain_epochs = 1
  c.logging.progress = False
  c.logging.tensorboard = False
  # Drawing the figures takes ~40% of a warm tiny run (the cross-correlation grid alone ~3 s
  # on a 2-core CPU): off here; test_train_and_evaluate_writes_every_artefact draws them.
  c.logging.plots = False
  c.logging.diagnostic_rounds = (1, 3)
  c.compilation_cache_dir = ""
  c.update_from_flattened_dict(overrides)
  return c


#: Overrides giving every participant one small CNN: the round has one model group, traced and
#: compiled in about half the time of `tiny_config`'s two. For tests whose subject is not the
#: heterogeneous models (checkpoints, stops, the trace cache, the scan of rounds); FCCL+'s runs
#: (test_train_and_evaluate_writes_every_artefact, tests/test_workdir.py) and SOLO's pinned round
#: (tests/test_round_api.py) keep two groups.
ONE_MODEL = {"models.architectures": ("simple_cnn",)}


def solo_config(**overrides):
  """The tiny SOLO config of one model group (`ONE_MODEL`) with `overrides`: the runs of the
  checkpoint and reliability tests."""
  return tiny_config("solo", **ONE_MODEL, **overrides)


def copy_run(run: pathlib.Path, workdir: pathlib.Path) -> None:
  """Makes `workdir` a copy of the workdir `run` (a run trained once, damaged or resumed by
  each test that copies it)."""
  shutil.copytree(run, workdir, dirs_exist_ok=True)


def _eval_numbers(record):
  return {k: v for k, v in record.items() if k.startswith(("eval/", "train/"))}


# FCCL's variant is the slowest (27 s); FCCL+ and SOLO keep it in the default suite. SOLO's
# run has one model group (`ONE_MODEL`, the config of the checkpoint tests' runs).
@pytest.mark.parametrize("variant", ["fcclplus", pytest.param("fccl", marks=pytest.mark.slow),
                                     "solo"])
def test_train_and_evaluate_writes_every_artefact(tmp_path, variant):
  overrides = {"logging.plots": True, **(ONE_MODEL if variant == "solo" else {})}
  out = train_and_evaluate(tiny_config(variant, **overrides), tmp_path)
  for name in ("config.json", "metadata.json", "metrics.jsonl", "results.md", "results.json",
               "accuracy.png", "cross_correlation.png"):
    assert (tmp_path / name).exists(), name
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2, 3]
  last = records[-1]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert 0.0 <= last[f"eval/intra/{client}"] <= 100.0
    assert 0.0 <= last[f"eval/inter/{client}"] <= 100.0
    assert np.isfinite(last[f"train/local/loss/{client}"])
  assert last["time/round_secs"] > 0
  if variant != "solo":
    assert np.isfinite(last["train/collaborative/" + ("fccm" if variant == "fcclplus" else "col")
                            + "/mnist"])
  metadata = json.loads((tmp_path / "metadata.json").read_text())
  assert "public" in metadata["substituted_by_synthetic"]  # declared, not silent
  assert "Synthetic data substituted" in (tmp_path / "results.md").read_text()
  assert out["results"]["intra"]["AVG"] == pytest.approx(
      np.mean([np.mean([r[f"eval/intra/{c}"] for r in records])
               for c in ("mnist", "usps", "svhn", "syn")]))
  heatmaps = np.load(tmp_path / "cross_correlation.npz")
  assert sorted(heatmaps) == ["round_1", "round_3"] and heatmaps["round_1"].shape == (4, 10, 10)


@pytest.mark.slow  # 53 s; the default suite's resume tests: test_workdir, test_cil_train
def test_killed_run_resumes_to_the_same_final_metrics(tmp_path, monkeypatch):
  config = tiny_config(num_rounds=4)
  reference = train_and_evaluate(config, tmp_path / "uninterrupted")

  original_write = reporting.MetricsWriter.write

  def crash_in_round_3(self, record):
    if record["round"] == 3:
      raise KeyboardInterrupt("simulated kill after round 3's computation")
    return original_write(self, record)

  monkeypatch.setattr(reporting.MetricsWriter, "write", crash_in_round_3)
  with pytest.raises(KeyboardInterrupt):
    train_and_evaluate(config, tmp_path / "killed")
  monkeypatch.setattr(reporting.MetricsWriter, "write", original_write)
  resumed = train_and_evaluate(config, tmp_path / "killed")

  records = [json.loads(l) for l in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2, 3, 4]
  for got, want in zip(resumed["records"], reference["records"]):
    a, b = _eval_numbers(got), _eval_numbers(want)
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # about 28 s on 2 cores (compiles the round to measure it)
def test_a_round_that_cannot_fit_in_memory_fails_before_training(tmp_path, monkeypatch):
  config = tiny_config(name="memory", num_rounds=1)
  monkeypatch.setattr(resources, "available_memory_bytes", lambda device: 1024)
  with pytest.raises(MemoryError, match=r"needs about .* GiB for one round .* Lower "
                     r"config.collaborative.batch_size \(32\), config.local.batch_size \(16\)"):
    train_and_evaluate(config, tmp_path)
  assert not (tmp_path / "metrics.jsonl").read_text()  # no round ran
  config.memory_check = False  # the documented way past the check; the run starts at round 0
  # The progress bar starts after compilation, so its rate and ETA count rounds only.
  events = []
  compile_all = Experiment.compile_all
  monkeypatch.setattr(Experiment, "compile_all", lambda self, state, **kw: events.append(
      "compile") or compile_all(self, state, **kw))
  progress_init = reporting.Progress.__init__
  monkeypatch.setattr(reporting.Progress, "__init__",
                      lambda self, *a, **k: events.append("progress") or progress_init(self, *a, **k))
  result = train_and_evaluate(config, tmp_path)
  assert [r["round"] for r in result["records"]] == [1]
  assert events == ["compile", "progress"]


def test_compile_all_compiles_the_evaluation_in_a_worker_before_the_rounds_compile(monkeypatch):
  experiment = Experiment(tiny_config(name="compile_all"))
  state = experiment.init_state()
  spans = []
  compile_lowered = jax.stages.Lowered.compile

  def recording(self, *args, **kwargs):
    start = time.perf_counter()
    compiled = compile_lowered(self, *args, **kwargs)
    spans.append((threading.current_thread().name, start, time.perf_counter()))
    return compiled

  monkeypatch.setattr(jax.stages.Lowered, "compile", recording)
  compiled = experiment.compile_all(state)
  worker = [span for span in spans if span[0].startswith("fedjax_het_compile")]
  main = [span for span in spans if span not in worker]
  # Evaluation + diagnostics; the round (FCCL+: its two stage programs, side by side on a CPU).
  assert len(worker) == 2 and len(main) == len(experiment.stage_programs) == 2, spans
  # The round's compiles start once the evaluation's are done.
  assert min(start for _, start, _ in main) >= max(end for _, _, end in worker)
  # The kept executables are the ones used, and they compute what the jitted functions do.
  state, _ = compiled(state, experiment.data)
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         experiment._evaluate_compiled(state, experiment.data.test),
                         jax.jit(experiment.algorithm.evaluate)(state, experiment.data.test))
  assert experiment._diagnostics_compiled is not None


@pytest.mark.slow  # 33 s; the guard test above keeps the estimate in the default suite
def test_memory_estimate_is_positive_and_below_this_machine():
  experiment = Experiment(tiny_config(name="memory_estimate"))
  compiled = experiment.compile_rounds(experiment.init_state())
  need = resources.check_round_memory(compiled, experiment.config, available=None)
  assert 0 < need < resources.available_memory_bytes(jax.devices()[0])


# FCCL and FCCL+ take 55-65 s each here: slow. FCCL+'s stage bodies are traced once and its
# scanned rounds checked in tests/test_round_programs.py; the scan itself is method-agnostic
# (and SOLO's round has one model group here, `ONE_MODEL`).
@pytest.mark.parametrize("variant", ["solo", pytest.param("fcclplus", marks=pytest.mark.slow),
                                     pytest.param("fccl", marks=pytest.mark.slow)])
def test_round_is_traced_once_and_scan_of_rounds_equals_single_rounds(variant):
  config = tiny_config(variant, name=f"trace_guard_{variant}",
                       **(ONE_MODEL if variant == "solo" else {}))
  experiment = Experiment(config)
  state = experiment.init_state()
  chex.clear_trace_counter()
  single = jax.jit(chex.assert_max_traces(experiment.round_fn, n=1))
  looped = state
  for _ in range(3):  # a second trace would raise AssertionError
    looped, _ = single(looped, experiment.data)
  scanned, metrics = jax.jit(rounds.make_run_rounds(experiment.round_fn, 3))(state, experiment.data)
  assert int(scanned["round"]) == int(looped["round"]) == 3
  assert jax.tree_util.tree_leaves(metrics)[0].shape[0] == 3
  for a, b in zip(jax.tree_util.tree_leaves(looped), jax.tree_util.tree_leaves(scanned)):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_sharded_round_equals_unsharded_round():
  assert len(jax.devices()) == 4  # conftest simulates 4 CPU devices
  # SGD in both phases: the default fresh Adam per public batch is sign-SGD, which turns
  # reduction-order rounding of the (analytically zero) FCCM bias gradients into +-lr steps.
  config = tiny_config(**{"name": "sharding", "collaborative.optimizer": "sgd",
                          "collaborative.lr": 0.01, "local.optimizer": "sgd", "local.lr": 0.01})
  plain = Experiment(config)
  sharded = Experiment(config, mesh=sharding.client_mesh(4))
  assert {g.num_slots for g in sharded.groups} == {4}  # 2 clients per group padded to 4
  states = []
  for experiment in (plain, sharded):
    state = experiment.init_state()
    state, _ = experiment.run_rounds(state, experiment.data)
    states.append(state)
  leaf = jax.tree_util.tree_leaves(states[1]["groups"])[0]
  assert len(leaf.sharding.device_set) == 4
  for group in plain.groups:
    n = group.num_clients
    for a, b in zip(jax.tree_util.tree_leaves(states[0]["groups"][group.name]),
                    jax.tree_util.tree_leaves(states[1]["groups"][group.name])):
      np.testing.assert_allclose(np.asarray(a)[:n], np.asarray(b)[:n], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(plain.evaluation_record(states[0])["eval/intra/mean"],
                             sharded.evaluation_record(states[1])["eval/intra/mean"], atol=1e-6)


@pytest.mark.parametrize("field,value,message", [
    ("local.batch_size", 0, "config.local.batch_size must be an integer >= 1, got 0"),
    ("algorithm", "fedavgg", "config.algorithm must be one of ('fcclplus', 'fccl', 'solo'"),
    ("models.conv_impl", "cudnn", "config.models.conv_impl must be one of ('auto', 'xla', "
                                  "'im2col', 'custom_vjp', 'gemm_taps')"),
    ("collaborative.batch_size", 1, "config.collaborative.batch_size must be an integer >= 2"),
    ("local.lr_decay", 1.5, "config.local.lr_decay must be a number in [0, 1)"),
    ("fcclplus.fisl_temperature", 0.0, "config.fcclplus.fisl_temperature must be a number > 0"),
])
def test_invalid_config_values_name_the_field(field, value, message):
  config = tiny_config()
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[")):
    validate_config(config)


def test_locked_config_rejects_a_misspelt_key_with_a_suggestion():
  config = tiny_config()
  config.lock()
  with pytest.raises(AttributeError, match="num_rounds"):
    config.num_round = 3  # pylint: disable=attribute-defined-outside-init


def test_every_digits_variant_builds_and_validates():
  for method in digits.METHODS:
    for suffix in ("", "_homogeneous", "_quick", "_homogeneous_quick"):
      validate_config(digits.get_config(method + suffix))
  full = digits.get_config("fcclplus")
  assert (full.num_rounds, full.local.epochs, full.local.batch_size,
          full.collaborative.batch_size) == (40, 20, 256, 512)  # the paper's settings
  with pytest.raises(ValueError, match="expected <method>"):
    digits.get_config("fedgkt")  # a method this library does not implement
  assert "collaborative" not in digits.get_config("solo")  # a method's config has its sections only


def test_switching_algorithm_without_its_sections_names_the_missing_section():
  config = tiny_config("solo")
  config.algorithm = "fcclplus"
  with pytest.raises(ValueError, match=r"config.collaborative is missing but "
                     r"config.algorithm='fcclplus' needs it: build the config with "
                     r"fedjax_het.config.base_config\('fcclplus'\)"):
    validate_config(config)


def test_unknown_method_lists_the_registered_ones():
  from fedjax_het.config import base_config
  with pytest.raises(ValueError, match=r"config.algorithm must be one of \('fcclplus', 'fccl', "
                     r"'solo'.*got 'fedavgg'"):
    base_config("fedavgg")


def test_cli_maps_bare_config_names_to_config_files():
  argv = cli.expand_config_name(["train.py", "--config=digits_fcclplus", "--config.num_rounds=2"])
  assert argv[1] == f"--config={REPO / 'fedjax_het/configs/digits.py'}:fcclplus"
  assert argv[2] == "--config.num_rounds=2"
  explicit = "--config=fedjax_het/configs/digits.py:fccl"
  assert cli.expand_config_name([explicit]) == [explicit]
  with pytest.raises(SystemExit, match="the families: cifar10, cifar100, digits"):
    cli.expand_config_name(["--config=nosuchscenario_fcclplus"])


@pytest.mark.slow
def test_cli_runs_the_quick_config_with_overrides(tmp_path):
  """The README's main job, shortened to 2 rounds, from the repository root."""
  result = subprocess.run(
      [sys.executable, "experiments/train.py", "--config=digits_fcclplus_quick",
       "--config.num_rounds=2", "--config.logging.diagnostic_rounds=(1,2)",
       f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "results.md").exists()
  typo = subprocess.run(
      [sys.executable, "experiments/train.py", "--config=digits_fcclplus_quick",
       "--config.num_round=2", f"--workdir={tmp_path / 'typo'}"], cwd=REPO, capture_output=True,
      text=True, timeout=600)
  assert typo.returncode != 0 and "num_rounds" in typo.stderr


def test_rounds_to_target_is_the_first_round_reaching_the_mean_accuracy():
  records = [{"round": 1, "eval/accuracy/mean": 40.0}, {"round": 2},
             {"round": 3, "eval/accuracy/mean": 55.0}, {"round": 4, "eval/accuracy/mean": 50.0}]
  assert experiment_lib.rounds_to_target(records, ("accuracy",), 50.0) == 3
  assert experiment_lib.rounds_to_target(records, ("accuracy",), 60.0) is None
  domain = [{"round": 1, "eval/intra/mean": 70.0, "eval/inter/mean": 10.0}]
  assert experiment_lib.rounds_to_target(domain, ("inter", "intra"), 65.0) == 1


def test_one_architecture_name_applies_to_every_participant():
  config = tiny_config("solo", **{"name": "one_arch"})
  config.models.architectures = ("simple_cnn",)
  validate_config(config)
  experiment = Experiment(config)
  assert [g.name for g in experiment.groups] == ["simple_cnn"]
  assert experiment.groups[0].clients == (0, 1, 2, 3)


@pytest.mark.parametrize("field,value,message", [
    ("scenario.partition", "pathological", "config.scenario.partition must be one of ('iid', "
                                          "'dirichlet', 'shards', 'class_split', "
                                          "'class_split_own', 'permuted', "
                                          "'permuted_classes')"),
    ("scenario.num_clients", 0, "config.scenario.num_clients must be an integer >= 1"),
    ("eval.targets", (50.0, 120.0), "config.eval.targets must be a sequence of accuracies in "
                                    "(0, 100]"),
])
def test_partitioned_scenario_fields_are_validated(field, value, message):
  config = tiny_config("solo")
  config.scenario.name = "partitioned"
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[")):
    validate_config(config)


@pytest.mark.parametrize("scenario", ["cifar10", "mnist"])
def test_every_many_client_variant_builds_and_validates(scenario):
  module = _load(REPO / "fedjax_het" / "configs" / f"{scenario}.py", f"{scenario}_config")
  for method in module.FEDAVG_FAMILY:
    for suffix in ("", "_quick"):
      config = module.get_config(method + suffix)
      validate_config(config)
      assert config.scenario.name == "partitioned" and config.scenario.num_clients == 100
      assert config.fedavg.clients_per_round == 10
  with pytest.raises(ValueError, match="expected <method>"):
    module.get_config("fcclplus")
  argv = cli.expand_config_name([f"--config={scenario}_fedavg_quick"])
  assert argv == [f"--config={REPO / 'fedjax_het/configs' / scenario}.py:fedavg_quick"]


def test_a_sparse_eval_every_still_evaluates_the_rounds_the_results_average():
  """eval.every=4 over 10 rounds with eval.last_rounds=3: rounds 4 and 8, then 8, 9 and 10,
  the three whose mean results.md reports."""
  experiment = experiment_lib.Experiment(tiny_config("solo", num_rounds=10,
                                                     **{"eval.every": 4, "eval.last_rounds": 3}))
  assert [r for r in range(1, 11) if experiment.is_eval_round(r)] == [4, 8, 9, 10]
  experiment.config.eval.every = 1
  assert all(experiment.is_eval_round(r) for r in range(1, 11))

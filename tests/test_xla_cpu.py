"""XLA:CPU's scheduler setting and the low-memory convolution fallback of "auto" runs."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het import workdir as workdir_lib
from fedjax_het.runtime import xla_cpu
from fedjax_het.errors import ConfigError
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_resolve_maps_auto_to_memory_and_names_the_field_of_a_bad_choice():
  assert [xla_cpu.resolve(c) for c in xla_cpu.SCHEDULERS] == ["memory", "concurrency", "memory"]
  with pytest.raises(ConfigError, match=r"config.xla_cpu_scheduler must be one of "
                                        r"\('auto', 'concurrency', 'memory'\), got 'fast'"):
    xla_cpu.resolve("fast")


@pytest.mark.parametrize("flags,expected", [
    ("", None),
    ("--xla_force_host_platform_device_count=4", None),
    (f"{xla_cpu.FLAG}=false", "memory"),
    (f"{xla_cpu.FLAG}=False --xla_dump_to=/tmp/x", "memory"),
    (f"{xla_cpu.FLAG}=true", "concurrency"),
    (f"{xla_cpu.FLAG}", "concurrency"),
    (f"{xla_cpu.FLAG}=true {xla_cpu.FLAG}=false", "memory"),  # the last one wins, as in XLA
])
def test_flag_in_environment_reads_xla_flags(monkeypatch, flags, expected):
  monkeypatch.setenv("XLA_FLAGS", flags)
  assert xla_cpu.flag_in_environment() == expected


def test_after_the_backend_started_nothing_is_changed(monkeypatch):
  jax.numpy.zeros(1).block_until_ready()  # this process's backend is running
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
  assert xla_cpu.backend_started()
  assert xla_cpu.set_xla_cpu_scheduler("memory") == "concurrency"  # XLA's default is in force
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
  with pytest.raises(ConfigError, match="config.xla_cpu_scheduler"):
    xla_cpu.set_xla_cpu_scheduler("fast")


def test_config_validation_names_the_scheduler_field():
  config = tiny_config(xla_cpu_scheduler="low")
  with pytest.raises(ConfigError, match=r"xla_cpu_scheduler.*one of \('auto', 'concurrency', "
                                        r"'memory'\)"):
    experiment_lib.validate_config(config)


# Run in a fresh process (the flag is read when the backend starts): one FCCL+ round of the tiny
# heterogeneous config, then its XLA memory estimate and a digest of every state leaf's bytes.
_ONE_ROUND = """
import hashlib, json, sys
sys.path.insert(0, {repo!r})
from fedjax_het.runtime import xla_cpu
in_force = xla_cpu.set_xla_cpu_scheduler({choice!r})
import jax, numpy as np
from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het import workdir as workdir_lib
from tests.test_train import tiny_config
experiment = experiment_lib.Experiment(tiny_config(num_rounds=1))
state = experiment.init_state()
compiled = experiment.compile_rounds(state)
state, _ = compiled(state, experiment.data)
digest = hashlib.sha256()
for leaf in jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.asarray, state)):
  digest.update(np.ascontiguousarray(leaf).tobytes())
print(json.dumps({{"in_force": in_force, "xla_flags": __import__("os").environ["XLA_FLAGS"],
                  "need": resources.estimated_bytes(compiled), "digest": digest.hexdigest()}}))
"""


def _one_round(choice, tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", FEDJAX_HET_CACHE_DIR=str(tmp_path / "data_cache"))
  env.pop("FEDJAX_HET_DATA_DIR", None)
  out = subprocess.run([sys.executable, "-c", _ONE_ROUND.format(repo=str(REPO), choice=choice)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes compiling a heterogeneous round: about a minute
def test_the_memory_scheduler_is_in_force_lowers_the_estimate_and_keeps_every_bit(tmp_path):
  memory, concurrency = _one_round("auto", tmp_path), _one_round("concurrency", tmp_path)
  assert memory["in_force"] == "memory" and concurrency["in_force"] == "concurrency"
  assert memory["xla_flags"] == f"{xla_cpu.FLAG}=false"
  assert concurrency["xla_flags"] == f"{xla_cpu.FLAG}=true"
  # The flag reached XLA: the same program is scheduled for a lower peak of live buffers...
  assert 0 < memory["need"] < concurrency["need"]
  # ...and computes exactly the same round.
  assert memory["digest"] == concurrency["digest"]


def _record_convolutions(monkeypatch) -> list[tuple[str, str]]:
  """The (conv_impl, public_conv_impl) of every Experiment built from now on, in order."""
  built = []
  init = experiment_lib.Experiment.__init__

  def recording_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    built.append((self.conv_impl, self.public_conv_impl))

  monkeypatch.setattr(experiment_lib.Experiment, "__init__", recording_init)
  return built


# Slow (about 50 s: four compiles of the tiny round). The default suite keeps the decision table
# (test_low_memory_conv_impls_switch_the_public_batch_first) and the first step end to end
# (the hybrid test below).
@pytest.mark.slow
def test_an_auto_run_too_large_for_im2col_switches_to_custom_vjp(tmp_path, monkeypatch):
  # Any estimate is "too large" at fraction 0; the memory guard itself sees plenty of memory.
  monkeypatch.setattr(resources, "LOW_MEMORY_FRACTION", 0.0)
  monkeypatch.setattr(resources, "available_memory_bytes", lambda device: 2 ** 40)
  built = _record_convolutions(monkeypatch)
  build, scenarios = experiment_lib.build_scenario, []
  monkeypatch.setattr(experiment_lib, "build_scenario",
                      lambda config: scenarios.append(1) or build(config))
  common = {"num_rounds": 1, "logging.plots": False, "logging.diagnostic_rounds": ()}
  switched = train_and_evaluate(tiny_config(name="fallback", **common), tmp_path / "auto")
  # First only the public batch's convolutions (the collaborative phase's memory peak), then all.
  assert built == [("im2col", "im2col"), ("im2col", "custom_vjp"), ("custom_vjp", "custom_vjp")]
  assert len(scenarios) == 1  # the later Experiments reuse the data the first one built
  metadata = json.loads((tmp_path / "auto" / "metadata.json").read_text())
  assert metadata["conv_impl"] == "custom_vjp"
  assert metadata["public_conv_impl"] == "custom_vjp"
  assert metadata["xla_cpu_scheduler"] == xla_cpu.scheduler_in_force()
  # The same run as one configured with custom_vjp convolutions from the start (no switch: the
  # fallback is for "auto" only).
  built.clear()
  explicit = train_and_evaluate(
      tiny_config(name="fallback", **common, **{"models.conv_impl": "custom_vjp"}),
      tmp_path / "explicit")
  assert built == [("custom_vjp", "custom_vjp")]
  assert switched["results"] == explicit["results"]
  assert switched["last_record"].keys() == explicit["last_record"].keys()
  for key, value in explicit["last_record"].items():
    if not key.startswith("time/"):
      assert switched["last_record"][key] == value, key


@pytest.mark.slow  # about 17 s on 2 cores
def test_an_auto_run_whose_public_step_is_the_peak_keeps_im2col_for_the_local_phase(
    tmp_path, monkeypatch):
  # The im2col round is "too large", the one with custom-VJP convolutions on the public batch fits.
  monkeypatch.setattr(resources, "available_memory_bytes", lambda device: 2 ** 40)
  monkeypatch.setattr(resources, "needs_low_memory_convs",
                      lambda config, conv_impl, need, available: (
                          config.models.conv_impl == "auto"
                          and built[-1] == ("im2col", "im2col")))
  built = _record_convolutions(monkeypatch)
  common = {"num_rounds": 1, "logging.plots": False, "logging.diagnostic_rounds": ()}
  switched = train_and_evaluate(tiny_config(name="hybrid", **common), tmp_path / "auto")
  assert built == [("im2col", "im2col"), ("im2col", "custom_vjp")]
  metadata = json.loads((tmp_path / "auto" / "metadata.json").read_text())
  assert (metadata["conv_impl"], metadata["public_conv_impl"]) == ("im2col", "custom_vjp")
  # The same run as one configured that way (public_conv_impl named: no switch)...
  built.clear()
  explicit = train_and_evaluate(
      tiny_config(name="hybrid", **common, **{"models.public_conv_impl": "custom_vjp"}),
      tmp_path / "explicit")
  assert built == [("im2col", "custom_vjp")]
  assert switched["results"] == explicit["results"]
  # ...and, to float32 rounding, as the all-im2col run (the same parameters and math).
  built.clear()
  plain = train_and_evaluate(tiny_config(name="hybrid", **common, **{"models.conv_impl": "im2col"}),
                             tmp_path / "im2col")
  assert built == [("im2col", "im2col")]
  for key, value in plain["last_record"].items():
    if not key.startswith("time/"):
      assert switched["last_record"][key] == pytest.approx(value, rel=1e-3, abs=1e-3), key
  # Resumed, the run starts from the convolutions its fallback chose (no im2col compile first).
  built.clear()
  train_and_evaluate(tiny_config(name="hybrid", **{**common, "num_rounds": 2},
                                 resume_allow_changes="num_rounds"), tmp_path / "auto")
  assert built == [("im2col", "custom_vjp")]


def test_recorded_conv_impls_only_for_an_auto_run_with_checkpoints_on_the_same_backend(tmp_path):
  config = tiny_config()
  metadata = {"conv_impl": "im2col", "public_conv_impl": "custom_vjp",
              "backend": jax.default_backend()}
  (tmp_path / "metadata.json").write_text(json.dumps(metadata))
  assert resources.recorded_conv_impls(tmp_path, config) == {}  # no checkpoints: a fresh run
  (tmp_path / "checkpoints").mkdir()
  assert resources.recorded_conv_impls(tmp_path, config) == {"conv_impl": "im2col",
                                                             "public_conv_impl": "custom_vjp"}
  named = tiny_config(**{"models.public_conv_impl": "xla"})
  assert resources.recorded_conv_impls(tmp_path, named) == {"conv_impl": "im2col"}
  assert resources.recorded_conv_impls(tmp_path, tiny_config(**{"models.conv_impl": "xla"})) == {}
  (tmp_path / "metadata.json").write_text(json.dumps({**metadata, "backend": "gpu"}))
  assert resources.recorded_conv_impls(tmp_path, config) == {}
  (tmp_path / "metadata.json").write_text(json.dumps({**metadata, "conv_impl": "fast"}))
  assert resources.recorded_conv_impls(tmp_path, config) == {}


@pytest.mark.parametrize("conv_impl,public,has_public,configured,expected", [
    ("im2col", "im2col", True, "auto", ("im2col", "custom_vjp")),   # the public batch first
    ("im2col", "custom_vjp", True, "auto", ("custom_vjp", "custom_vjp")),  # then everything
    ("im2col", "im2col", False, "auto", ("custom_vjp", "custom_vjp")),  # no public phase
    ("im2col", "xla", True, "xla", ("custom_vjp", "xla")),    # a named public impl is kept
    ("im2col", "im2col", True, "im2col", ("custom_vjp", "im2col")),
])
def test_low_memory_conv_impls_switch_the_public_batch_first(conv_impl, public, has_public,
                                                             configured, expected):
  config = tiny_config(**{"models.public_conv_impl": configured})
  assert resources.low_memory_conv_impls(config, conv_impl, public,
                                         has_public=has_public) == expected


def test_public_conv_impl_is_validated_and_resolved():
  with pytest.raises(ConfigError, match=r"models.public_conv_impl.*one of \('auto', 'xla', "
                                        r"'im2col', 'custom_vjp', 'gemm_taps'\)"):
    experiment_lib.validate_config(tiny_config(**{"models.public_conv_impl": "fast"}))
  assert resources.resolve_public_conv_impl("auto", "im2col") == "im2col"
  assert resources.resolve_public_conv_impl("custom_vjp", "im2col") == "custom_vjp"


@pytest.mark.parametrize("conv_impl,memory_check,need,expected", [
    ("auto", True, 18, True),          # im2col above 75% of 23: switch
    ("auto", True, 17, False),         # below: keep im2col
    ("im2col", True, 18, False),       # asked for by name: never second-guessed
    ("auto", False, 18, False),        # config.memory_check=False: the user takes the risk
])
def test_needs_low_memory_convs(conv_impl, memory_check, need, expected):
  config = tiny_config(**{"models.conv_impl": conv_impl, "memory_check": memory_check})
  gib = 2 ** 30
  assert resources.needs_low_memory_convs(config, "im2col", need * gib, 23 * gib) is expected
  assert not resources.needs_low_memory_convs(config, "xla", need * gib, 23 * gib)
  assert not resources.needs_low_memory_convs(config, "im2col", need * gib, None)


def test_the_scheduler_never_blocks_a_resume():
  config = tiny_config(xla_cpu_scheduler="concurrency")
  new = {"config": workdir_lib.flatten_config(config), "data": {"fingerprint": "f", "sources": {}}}
  allowed = workdir_lib.allowed_changes(config)
  older = {"config": {k: v for k, v in new["config"].items() if k != "xla_cpu_scheduler"},
           "data": new["data"]}  # a workdir recorded before the field existed
  switched = {"config": {**new["config"], "xla_cpu_scheduler": "memory"}, "data": new["data"]}
  assert workdir_lib.differences(older, new, allowed) == []
  assert workdir_lib.differences(switched, new, allowed) == []
  # ...while a field that changes the numbers still does.
  seeded = {"config": {**new["config"], "seed": 5}, "data": new["data"]}
  assert workdir_lib.differences(seeded, new, allowed) == ["config.seed: 5 -> 0"]


def test_cli_names_the_field_of_a_bad_scheduler_and_writes_nothing(tmp_path):
  out = subprocess.run(
      [sys.executable, "experiments/train.py", "--config=digits_fcclplus_quick",
       "--config.xla_cpu_scheduler=fast", f"--workdir={tmp_path / 'run'}"],
      cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 1
  assert ("error: config.xla_cpu_scheduler must be one of ('auto', 'concurrency', 'memory'), "
          "got 'fast'.") in out.stderr
  assert not (tmp_path / "run").exists()


def test_the_public_batch_alone_runs_the_public_conv_impl():
  from fedjax_het.algorithms import common  # pylint: disable=import-outside-toplevel
  from fedjax_het.engine.clients import slot_ids  # pylint: disable=import-outside-toplevel
  experiment = experiment_lib.Experiment(tiny_config(**{"models.conv_impl": "im2col",
                                                   "models.public_conv_impl": "custom_vjp"}))
  assert (experiment.conv_impl, experiment.public_conv_impl) == ("im2col", "custom_vjp")
  state = experiment.init_state()
  setup = experiment.setup
  params = {g.name: state["groups"][g.name]["variables"]["params"] for g in setup.groups}
  images = jax.numpy.zeros((4, 32, 32, 3))
  ids = {g.name: slot_ids(g, setup.num_participants) for g in setup.groups}
  public = str(jax.make_jaxpr(lambda p: common.public_forward(
      setup, state, p, images, jax.random.key(0), ids))(params))
  group = setup.groups[0]
  first = jax.tree.map(lambda leaf: leaf[0], state["groups"][group.name]["variables"])  # slot 0
  local = str(jax.make_jaxpr(lambda p, s: common.forward_fn(group, train=True)(p, s, images))(
      first["params"], first["batch_stats"]))
  assert public.count("custom_vjp_call") > 0
  assert "custom_vjp_call" not in local
  # Without a public_conv_impl of its own, the public batch runs the run's convolutions.
  assert all(g.public_model is None and g.model_on_public is g.model for g in
             experiment_lib.Experiment(tiny_config(**{"models.conv_impl": "im2col"})).groups)

"""XLA:GPU's Triton GEMM setting and the GPU's default convolutions."""

import os
import subprocess
import sys
import pathlib

import jax
import pytest

from fedjax_het import experiment as experiment_lib
from fedjax_het.runtime import resources
from fedjax_het.runtime import xla_gpu
from fedjax_het.errors import ConfigError
from tests.test_train import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_resolve_maps_auto_to_off_and_names_the_field_of_a_bad_choice():
  assert [xla_gpu.resolve(c) for c in xla_gpu.CHOICES] == ["off", "on", "off"]
  with pytest.raises(ConfigError, match=r"config.xla_gpu_triton_gemm must be one of "
                                        r"\('auto', 'on', 'off'\), got 'fast'"):
    xla_gpu.resolve("fast")


@pytest.mark.parametrize("flags,expected", [
    ("", None),
    ("--xla_force_host_platform_device_count=4", None),
    (f"{xla_gpu.FLAG}=false", "off"),
    (f"{xla_gpu.FLAG}=False --xla_dump_to=/tmp/x", "off"),
    (f"{xla_gpu.FLAG}=true", "on"),
    (f"{xla_gpu.FLAG}", "on"),
    (f"{xla_gpu.FLAG}=false {xla_gpu.FLAG}=true", "on"),  # the last one wins, as in XLA
])
def test_flag_in_environment_reads_xla_flags(monkeypatch, flags, expected):
  monkeypatch.setenv("XLA_FLAGS", flags)
  assert xla_gpu.flag_in_environment() == expected


def test_after_the_backend_started_nothing_is_changed(monkeypatch):
  jax.numpy.zeros(1).block_until_ready()  # this process's backend is running
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
  assert xla_gpu.set_xla_gpu_triton_gemm("off") == "on"  # XLA's default is in force
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
  with pytest.raises(ConfigError, match="config.xla_gpu_triton_gemm"):
    xla_gpu.set_xla_gpu_triton_gemm("fast")


def test_config_validation_names_the_triton_gemm_field():
  config = tiny_config(xla_gpu_triton_gemm="maybe")
  with pytest.raises(ConfigError, match=r"xla_gpu_triton_gemm.*one of \('auto', 'on', 'off'\)"):
    experiment_lib.validate_config(config)


@pytest.mark.parametrize("choice,environment,expected_flags", [
    ("auto", "", f"{xla_gpu.FLAG}=false"),
    ("on", "--xla_dump_to=/tmp/x", f"--xla_dump_to=/tmp/x {xla_gpu.FLAG}=true"),
    ("auto", f"{xla_gpu.FLAG}=true", f"{xla_gpu.FLAG}=true"),  # the user's setting wins
])
def test_a_fresh_process_gets_the_flag_before_its_backend_starts(choice, environment,
                                                                  expected_flags):
  script = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from fedjax_het.runtime import xla_gpu\n"
            f"in_force = xla_gpu.set_xla_gpu_triton_gemm({choice!r})\n"
            "import os, jax\n"
            "assert float(jax.numpy.ones(3).sum()) == 3.0  # the flag is one XLA knows\n"
            "print(in_force, os.environ['XLA_FLAGS'], sep='|')\n")
  env = {**os.environ, "XLA_FLAGS": environment}
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       check=True, timeout=120).stdout.strip().splitlines()[-1]
  in_force, flags = out.split("|")
  assert in_force == ("on" if expected_flags.endswith("true") else "off")
  assert flags == expected_flags


@pytest.mark.parametrize("backend,expected", [("cpu", "im2col"), ("gpu", "gemm_taps"),
                                              ("tpu", "xla")])
def test_auto_convolutions_per_backend(monkeypatch, backend, expected):
  monkeypatch.setattr(resources.jax, "default_backend", lambda: backend)
  assert resources.resolve_conv_impl("auto") == expected
  assert resources.resolve_conv_impl("custom_vjp") == "custom_vjp"

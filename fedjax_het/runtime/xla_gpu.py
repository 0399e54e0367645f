"""XLA:GPU's Triton GEMM autotuning: off by default, for a shorter compile at the same speed.

On a GPU, XLA compiles many matrix products (and the fusions around them) as
Triton kernels and autotunes each one: it compiles and times a set of tilings
on the device while the program compiles. The "gemm_taps" convolutions of the
GPU default (`fedjax_het.models.layers`) make every pointwise convolution of
MobileNetV2 and EfficientNet-B0 a matrix product, so this autotuning is a
large share of their compile. With `--xla_gpu_enable_triton_gemm=false` the
products run on cuBLAS, whose autotuning only times the library's few
algorithms. Measured on one NVIDIA H200 (jax 0.11.2, 2026-11-26,
`benchmarks/gpu_compile.py`, full-width EfficientNet-B0, 10 local Adam steps at
batch 256 in one `lax.scan`): compile 43.0 s with Triton GEMM (under the
profiler, whose trace shows 19.3 s in XLA's `config-assigner` pass, the
autotuning) and 11.4 s without, the step 12.55 ms and 12.82 ms.

XLA reads `XLA_FLAGS` once, when the backend starts, so `experiments/train.py`
sets the flag from `config.xla_gpu_triton_gemm` before JAX computes anything
(`set_xla_gpu_triton_gemm`). A setting of the flag already in `XLA_FLAGS` wins.
The flag is known to every XLA build and changes nothing on a CPU or TPU.
"""

from __future__ import annotations

import os

from fedjax_het.errors import ConfigError
from fedjax_het.runtime import xla_cpu

#: The XLA flag; "false" sends the matrix products to cuBLAS.
FLAG = "--xla_gpu_enable_triton_gemm"

#: Values of `config.xla_gpu_triton_gemm`. "auto" is "off" (see `resolve`).
CHOICES = ("auto", "on", "off")


def resolve(choice: str) -> str:
  """"auto" -> "off"; the others are themselves."""
  if choice not in CHOICES:
    raise ConfigError(f"config.xla_gpu_triton_gemm must be one of {CHOICES}, got {choice!r}.")
  return "off" if choice == "auto" else choice


def flag_in_environment() -> str | None:
  """"on" / "off" as `XLA_FLAGS` sets Triton GEMM, or None if it does not."""
  setting = xla_cpu.environment_flag(FLAG)
  if setting is None:
    return None
  return "on" if setting.lower() in ("", "true", "1") else "off"


def set_xla_gpu_triton_gemm(choice: str) -> str:
  """Sets Triton GEMM for this process's XLA:GPU; returns the setting in force.

  Must run before JAX computes anything. A setting already in `XLA_FLAGS`
  wins over `choice` (and is returned); once a backend has started nothing
  changes any more, and XLA's default ("on") is returned when `XLA_FLAGS`
  does not set it. Raises `ConfigError` for a `choice` outside `CHOICES`.
  """
  wanted = resolve(choice)
  in_environment = flag_in_environment()
  if in_environment is not None:
    return in_environment
  if xla_cpu.backend_started():
    return "on"
  setting = "false" if wanted == "off" else "true"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FLAG}={setting}".strip()
  return wanted


def triton_gemm_in_force() -> str:
  """Whether this process's XLA:GPU uses Triton GEMM ("on" / "off")."""
  return flag_in_environment() or "on"

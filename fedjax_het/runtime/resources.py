"""The host's resources for a run: which convolutions, how much memory, and the check before training.

One module for the policy every run (`fedjax_het.experiment`,
`fedjax_het.stream_experiment`) and the trainer's loop (`fedjax_het.train`)
share:

  * `resolve_conv_impl` / `resolve_public_conv_impl`: what "auto" means on this
    backend (im2col on a CPU, gemm_taps on a GPU, xla elsewhere);
  * the low-memory fallback of an "auto" CPU run (`needs_low_memory_convs`,
    `low_memory_conv_impls`, `LOW_MEMORY_FRACTION`) and the convolutions a
    resumed run keeps (`recorded_conv_impls`);
  * the memory a round may use (`available_memory_bytes`), what XLA says it
    needs (`estimated_bytes`) and the check that fails before training with
    one line naming the fields to lower (`check_round_memory`);
  * the process's resident memory (`resident_bytes`) and handing the
    compiler's freed heap back to the system (`release_freed_host_memory`).

XLA's flags that must be set before JAX starts (the XLA:CPU scheduler, XLA:GPU's
Triton GEMM) are `runtime.xla_cpu` and `runtime.xla_gpu`.
"""

from __future__ import annotations

import pathlib
import platform
from typing import Any

import jax
import ml_collections

from fedjax_het import models
from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import RoundTooLargeError
from fedjax_het.runtime import xla_cpu, xla_gpu


def resolve_conv_impl(conv_impl: str) -> str:
  """'auto' -> 'im2col' on a CPU, 'gemm_taps' on a GPU, 'xla' elsewhere (TPU).

  im2col avoids the conv-gradient-in-scan slowdown of XLA:CPU. On a GPU,
  gemm_taps keeps cuDNN for the spatial convolutions and makes the pointwise
  and depthwise ones matmuls and elementwise fusions, which XLA compiles
  without autotuning a cuDNN convolution each. On one NVIDIA H200 the
  full-width EfficientNet-B0 local step compiles in 11.4 s with gemm_taps and
  in more than 100 s with stock convolutions; the full Digits FCCL+ round
  reaches the end of round 1 in 288 s cold with gemm_taps, in more than 480 s
  with stock convolutions (`benchmarks/results/*__h200.json`).

  On a CPU, `train_and_evaluate` switches an 'auto' run to leaner
  convolutions when the im2col round needs more than `LOW_MEMORY_FRACTION` of
  the available memory (`needs_low_memory_convs`, `low_memory_conv_impls`).
  """
  if conv_impl != "auto":
    return conv_impl
  return {"cpu": "im2col", "gpu": "gemm_taps"}.get(jax.default_backend(), "xla")


def resolve_public_conv_impl(public_conv_impl: str, conv_impl: str) -> str:
  """`config.models.public_conv_impl`: 'auto' -> the run's resolved `conv_impl`."""
  return conv_impl if public_conv_impl == "auto" else public_conv_impl


#: Share of the available memory above which an "auto" CPU run trades im2col convolutions for
#: custom-VJP ones (same parameters, same values to float32 rounding, about half the memory of
#: the full FCCL+ Digits round). Below 1 because XLA's estimate is not the process's peak: the
#: full FCCL+ Digits round with im2col, estimated at 19.9 GiB, exceeds 22.3 GiB resident on a
#: 23 GiB machine and is killed there.
LOW_MEMORY_FRACTION = 0.75


def needs_low_memory_convs(config: ml_collections.ConfigDict, conv_impl: str, need: int,
                           available: int | None) -> bool:
  """Whether an "auto" run compiled with im2col convolutions should switch to leaner ones.

  Not when `config.memory_check` is False: that run takes its memory risk as configured.
  """
  return (config.models.conv_impl == "auto" and conv_impl == "im2col"
          and bool(config.memory_check) and available is not None
          and need > LOW_MEMORY_FRACTION * available)


def low_memory_conv_impls(config: ml_collections.ConfigDict, conv_impl: str,
                          public_conv_impl: str, *, has_public: bool) -> tuple[str, str]:
  """The next (conv_impl, public_conv_impl) an "auto" run too large for im2col compiles.

  Custom-VJP convolutions keep only their inputs for the backward pass where
  im2col ones keep the patch matrices: less memory, but 4.5x slower in the
  local phase of the full FCCL+ Digits round on a 2-core CPU (an epoch of the
  four backbones: 369 s against 82 s). That round's memory peak is the
  collaborative step's backward pass through every participant's model at
  once on a public batch of 512 (20.0 GiB with im2col, 9.7 GiB with
  custom_vjp), while the local phase trains one batch of one client per group
  at a time (7.3 GiB with im2col). So the first step switches only the public
  batch's convolutions (`ClientGroup.public_model`), when the run has a public
  set and `config.models.public_conv_impl` is "auto" (the full round: 19.9 GiB
  -> 9.5 GiB, the same as with custom_vjp everywhere); the next one every
  convolution. A `public_conv_impl` named in the config is kept. A method
  that has a public set but no public-batch training (SOLO, FedAvg, ...)
  compiles the same program again at the first step, then goes on.
  """
  named = config.models.public_conv_impl != "auto"
  if public_conv_impl == "im2col" and has_public and not named:
    return conv_impl, "custom_vjp"
  return "custom_vjp", public_conv_impl if named else "custom_vjp"


def recorded_conv_impls(workdir: pathlib.Path, config: ml_collections.ConfigDict
                        ) -> dict[str, str]:
  """The convolutions an "auto" run in `workdir` last trained with, to resume with them.

  {"conv_impl": ..., "public_conv_impl": ...} from the workdir's metadata.json
  when it holds checkpoints, `config.models.conv_impl` is "auto" and the
  metadata was recorded on the same backend; else {} (the run resolves them
  itself). `train_and_evaluate` may still switch to leaner ones if the round
  does not fit now.
  """
  if config.models.conv_impl != "auto" or not (pathlib.Path(workdir) / "checkpoints").is_dir():
    return {}
  recorded = workdir_lib.read_metadata(workdir)
  if recorded.get("backend") != jax.default_backend() or "conv_impl" not in recorded:
    return {}
  impls = {"conv_impl": recorded["conv_impl"]}
  if config.models.public_conv_impl == "auto" and "public_conv_impl" in recorded:
    impls["public_conv_impl"] = recorded["public_conv_impl"]
  if not all(impl in models.CONV_IMPLS for impl in impls.values()):
    return {}
  return impls


def _proc_bytes(path: str, field: str) -> int | None:
  """A "Field:   N kB" line of a Linux /proc file, in bytes; None where it is missing."""
  try:
    for line in pathlib.Path(path).read_text().splitlines():
      if line.startswith(f"{field}:"):
        return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def resident_bytes() -> int | None:
  """This process's resident memory (Linux VmRSS), or None where /proc is missing."""
  return _proc_bytes("/proc/self/status", "VmRSS")


def release_freed_host_memory() -> int | None:
  """Hands the C heap's free pages back to the system (glibc's `malloc_trim(0)`); returns the
  resident bytes this released, or None where there is no glibc or no /proc.

  XLA's compiler (its HLO passes and LLVM) allocates gigabytes while it compiles a
  paper-size round and frees them when done, but glibc keeps freed pages in its
  arenas (one per compiling thread), where they still count as the process's
  resident memory. Measured on a 2-core, 23 GiB CPU with `digits_fcclplus`: after
  its compiles the process held 7.1 GiB resident, 2.7 GiB after the trim, and the
  round then peaked at 15.8 GiB resident instead of 19.9 GiB (XLA's estimate of
  the round: 11.0 GiB). The values computed are unchanged.
  """
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    trim = ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):  # not glibc (macOS, musl)
    return None
  before = resident_bytes()
  trim(0)
  after = resident_bytes()
  return None if before is None or after is None else max(before - after, 0)


def available_memory_bytes(device: Any) -> int | None:
  """Memory a jitted round may use on `device`: the accelerator's limit, else Linux MemAvailable."""
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  if device.platform == "cpu":
    return _proc_bytes("/proc/meminfo", "MemAvailable")
  return None


def estimated_bytes(compiled: Any) -> int:
  """Temporaries + outputs of a compiled program (XLA memory analysis; 0 when unknown)."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return 0
  return int(analysis.temp_size_in_bytes) + int(analysis.output_size_in_bytes)


def check_round_memory(compiled: Any, config: ml_collections.ConfigDict,
                       available: int | None) -> int:
  """Raises before training when XLA's memory analysis says a round cannot fit.

  Returns the estimated bytes (temporaries + outputs of one `run_rounds` call).
  A round that needs more than the available memory would otherwise fail with
  RESOURCE_EXHAUSTED only after minutes of compilation (e.g. the full-width
  paper config on a 32 GB CPU machine).
  """
  need = estimated_bytes(compiled)
  if config.memory_check and available is not None and need > available:
    gib = 2.0 ** 30
    fields = ", ".join(f"config.{name} ({value})" for name, value in _batch_size_fields(config))
    scheduler = ""
    if jax.default_backend() == "cpu" and xla_cpu.scheduler_in_force() == "concurrency":
      scheduler = (f"XLA:CPU's memory-minimising scheduler (config.xla_cpu_scheduler='memory' "
                   f"with experiments/train.py, or XLA_FLAGS={xla_cpu.FLAG}=false before JAX "
                   f"starts; it is the concurrency one in this process), ")
    raise RoundTooLargeError(
        f"config {config.name!r} needs about {need / gib:.1f} GiB for one round (XLA memory "
        f"analysis) but {available / gib:.1f} GiB is available on {jax.default_backend()}. "
        f"Lower {fields} or config.models.width ({config.models.width}), use "
        f"{scheduler}config.models.conv_impl='custom_vjp' or 'xla' (less memory, slower on "
        f"CPU), or run on an "
        f"accelerator with more memory; config.memory_check=False skips this check.")
  return need


def _batch_size_fields(config: ml_collections.ConfigDict) -> list[tuple[str, Any]]:
  """Every `<section>.batch_size` of the method's sections (what sets a round's memory)."""
  fields = []
  for section in config.keys():
    value = config[section]
    if isinstance(value, ml_collections.ConfigDict) and "batch_size" in value and section != "eval":
      fields.append((f"{section}.batch_size", value.batch_size))
  return fields


def runtime_metadata() -> dict[str, Any]:
  """What metadata.json records of the machine a run trains on: the backend, the XLA settings
  in force, the devices, the jax and Python versions and the process count (when several)."""
  backend = jax.default_backend()
  return {"backend": backend,
          **({"xla_cpu_scheduler": xla_cpu.scheduler_in_force()} if backend == "cpu" else {}),
          **({"xla_gpu_triton_gemm": xla_gpu.triton_gemm_in_force()} if backend == "gpu" else {}),
          "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
          "python": platform.python_version(),
          **({"processes": jax.process_count()} if jax.process_count() > 1 else {})}

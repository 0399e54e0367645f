"""`train_and_evaluate(config, workdir)`: one federated run of any registered method.

The data flows one way: config -> scenario data (numpy) -> architecture groups
and stacked client arrays -> algorithm (pure functions, looked up by
`config.algorithm`) -> engine (jit, vmap, scan, optional sharding) -> metrics,
checkpoints, plots. Nothing here depends on which method runs: the method's
round, evaluation and diagnostics come from its `Algorithm`.

Artefacts in `workdir`:
  run.json          every config field and a fingerprint of the data the run
                    started with: a resume with a different config or data is
                    refused before anything is written (`fedjax_het.workdir`)
  config.json       the resolved config
  metadata.json     data provenance (real / TFDS / synthetic, substitutions),
                    participants, groups, devices, versions
  metrics.jsonl     one record per round: train/<phase>/<metric>/<client> (or
                    train/<phase>/<metric> for server-side scalars),
                    eval/intra|inter/<client> and eval/intra|inter/mean for
                    multi-domain scenarios (eval/accuracy/... for one domain),
                    time/round_secs
  results.md/.json  mean of the last evaluated rounds: the FCCL+ Table VIII/IX
                    layout (inter/intra) for multi-domain scenarios, plain test
                    accuracy for a single domain
  checkpoints/      orbax checkpoints; a restarted run resumes from the latest
  accuracy.png      accuracy curves
  <diagnostic>.npz/.png  the method's diagnostics (e.g. FCCL/FCCL+'s
                    cross_correlation) at config.logging.diagnostic_rounds
  tensorboard/      with config.logging.tensorboard=True (needs tensorboardX)

Across processes (`engine.sharding.initialize_distributed`, every process
running `train_and_evaluate` with the same config and workdir): the clients
mesh spans every process's devices, each process builds the same host data
and keeps its own shards of the participants, metrics and evaluations are
gathered to every process (so every process returns the same records), and
only process 0 writes the files above; orbax writes the checkpoints from every
process into the one `checkpoints/` directory (on several hosts it must be on
a filesystem they share).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import pathlib
import platform
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import checkpointing, data as data_lib, models, plots, reporting, trace_cache
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import get_method
from fedjax_het.config import validate_config
from fedjax_het.engine import programs, rounds, sharding, xla_cpu, xla_gpu
from fedjax_het.engine.api import FederatedArrays, Setup
from fedjax_het.engine.clients import group_clients, scatter_to_participants, stack_group_data
from fedjax_het.errors import ConfigError, RoundTooLargeError
from fedjax_het.evaluation import intra_inter, stack_test_sets


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
  named = config.models.get("public_conv_impl", "auto") != "auto"
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
  if config.models.get("public_conv_impl", "auto") == "auto" and "public_conv_impl" in recorded:
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


def _client_names(domains: list[str]) -> list[str]:
  """Participant labels: the domain name, suffixed with the index when repeated."""
  repeated = {d for d in domains if domains.count(d) > 1}
  return [f"{d}{i}" if d in repeated else d for i, d in enumerate(domains)]


def build_scenario(config: ml_collections.ConfigDict) -> data_lib.Scenario:
  """The scenario of `config.scenario`: a domain-shift scenario or a partitioned dataset."""
  sc = config.scenario
  if sc.name == "partitioned":
    from fedjax_het.data import partitioned  # pylint: disable=g-import-not-at-top
    return partitioned.build_partitioned_scenario(
        sc.dataset, num_clients=int(sc.num_clients), partition=sc.partition,
        dirichlet_alpha=float(sc.dirichlet_alpha), shards_per_client=int(sc.shards_per_client),
        source=sc.dataset_source, data_dir=sc.data_dir or None,
        synthetic_fallback=bool(sc.synthetic_fallback), train_size=int(sc.train_size) or None,
        test_size=int(sc.test_size) or None, seed=int(config.seed))
  return data_lib.build_scenario(
      sc.name, data_dir=sc.data_dir or None, sources=dict(sc.sources) or None,
      synthetic_fallback=bool(sc.synthetic_fallback),
      private_sizes=dict(sc.private_sizes) or None, test_size=int(sc.test_size) or None,
      public_name=sc.public_name, public_size=int(sc.public_size), seed=int(config.seed),
      domains=tuple(sc.domains) or None, office_test=sc.get("office_test", "held_out"))


def _size_field(config: ml_collections.ConfigDict, domain: str) -> str:
  """The config field that sets a participant's private data size."""
  if config.scenario.name == "partitioned":
    return "scenario.train_size / scenario.num_clients"
  return f"scenario.private_sizes.{domain}"


def check_data_sizes(config: ml_collections.ConfigDict, scenario: data_lib.Scenario,
                     client_names: list[str]) -> None:
  """Checks the batch sizes against the data before anything compiles.

  Raises `ConfigError` for a local batch larger than every participant's data
  (which would only fail, or exhaust memory, minutes into compilation); warns,
  naming the field, for participants with fewer rows than a batch or than
  classes, and for a public batch larger than the public set (it is clamped).
  """
  sizes = [int(len(split.labels)) for split in scenario.train]
  if "local" in config and sizes:
    batch = int(config.local.batch_size)
    if batch > max(sizes):
      raise ConfigError(
          f"config.local.batch_size must be at most the largest participant's data "
          f"({max(sizes)} rows), got {batch}.")
    small = [(n, d, s) for n, d, s in zip(client_names, scenario.domains, sizes) if s < batch]
    if small:
      shown = ", ".join(f"{n} ({s})" for n, _, s in small[:5]) + (" ..." if len(small) > 5 else "")
      logging.warning("%d participant(s) hold fewer rows than config.local.batch_size=%d, so "
                      "each of their epochs is one partial batch: %s (set by config.%s).",
                      len(small), batch, shown, _size_field(config, small[0][1]))
  tiny = [(n, d, s) for n, d, s in zip(client_names, scenario.domains, sizes)
          if s < scenario.num_classes]
  if tiny:
    shown = ", ".join(f"{n} ({s})" for n, _, s in tiny[:5]) + (" ..." if len(tiny) > 5 else "")
    logging.warning("%d participant(s) hold fewer rows than the %d classes, so they cannot see "
                    "every class: %s (set by config.%s).", len(tiny), scenario.num_classes,
                    shown, _size_field(config, tiny[0][1]))
  public = int(len(scenario.public))
  if "collaborative" in config and public and int(config.collaborative.batch_size) > public:
    logging.warning("config.collaborative.batch_size=%d is larger than the public set (%d "
                    "images, config.scenario.public_size): batches of %d are used.",
                    int(config.collaborative.batch_size), public, max(public, 2))


class Experiment:
  """A configured run: data, groups, algorithm and jitted functions (no state)."""

  def __init__(self, config: ml_collections.ConfigDict, *, mesh: Any = None,
               conv_impl: str | None = None, public_conv_impl: str | None = None,
               scenario: data_lib.Scenario | None = None):
    """`conv_impl` and `public_conv_impl` (im2col / xla / custom_vjp) override
    `config.models.conv_impl` and `config.models.public_conv_impl`; `scenario`
    reuses data already built for `config` (else `build_scenario(config)`)."""
    validate_config(config)
    self.config = config
    self.scenario = scenario if scenario is not None else build_scenario(config)
    scenario = self.scenario
    self.client_names = _client_names(list(scenario.domains))
    check_data_sizes(config, scenario, self.client_names)
    archs = list(config.models.architectures)
    k = len(scenario.train)
    if len(archs) == 1:  # one architecture for every participant
      archs = archs * k
    if len(archs) != k:
      raise ConfigError(f"config.models.architectures has {len(archs)} entries but scenario "
                        f"{scenario.name!r} has {k} participants ({scenario.domains}).")
    self.conv_impl = conv_impl or resolve_conv_impl(config.models.conv_impl)
    self.public_conv_impl = public_conv_impl or resolve_public_conv_impl(
        config.models.get("public_conv_impl", "auto"), self.conv_impl)
    width = float(config.models.width)
    self.mesh = mesh
    slot_multiple = mesh.devices.size if mesh is not None else 1

    def build(impl):
      return [models.get_model(a, scenario.num_classes, width=width, conv_impl=impl,
                               compute_dtype=config.models.compute_dtype) for a in archs]

    modules = build(self.conv_impl)
    public_modules = (build(self.public_conv_impl) if self.public_conv_impl != self.conv_impl
                      else None)
    self.architectures = archs
    self.groups = group_clients(archs, modules, slot_multiple=slot_multiple,
                                public_models=public_modules)
    self.test_domains = list(dict.fromkeys(scenario.test))
    self.client_domain_index = [self.test_domains.index(d) for d in scenario.domains]
    images = [s.images for s in scenario.train]
    labels = [s.labels for s in scenario.train]
    group_data = {g.name: stack_group_data(g, images, labels, num_participants=k)
                  for g in self.groups}
    test = stack_test_sets(self.test_domains, {d: scenario.test[d].images for d in scenario.test},
                           {d: scenario.test[d].labels for d in scenario.test})
    self.setup = Setup(
        groups=self.groups, num_participants=k, num_classes=scenario.num_classes,
        num_rounds=int(config.num_rounds),
        max_sizes={name: d.images.shape[1] for name, d in group_data.items()},
        private_mean=tuple(scenario.private_mean), private_std=tuple(scenario.private_std),
        public_mean=tuple(scenario.public_mean), public_std=tuple(scenario.public_std),
        max_test_size=int(test.images.shape[1]),
        test_sizes=tuple(int(n) for n in test.sizes))
    self.algorithm = get_method(config.algorithm).make(config, self.setup)
    arrays = FederatedArrays(groups=group_data, public=scenario.public, test=test)
    if mesh is not None:
      # Across processes each process builds the same `arrays` (same config and seed) and keeps
      # only the shards of its own devices (device_put to a sharding spanning processes).
      self.data = jax.device_put(arrays, sharding.data_shardings(arrays, mesh))
    else:
      self.data = jax.device_put(arrays)
    self.round_fn = rounds.make_round_fn(self.algorithm)
    calls = rounds.make_run_rounds(self.round_fn, int(config.rounds_per_call))
    init = lambda key, d: rounds.initial_state(self.algorithm, key, d)  # noqa: E731
    # "one": `run_rounds` is the round; "stages": `stage_programs` run it, one per stage.
    self.round_programs = programs.resolve(config.get("round_programs", "auto"),
                                           bool(self.algorithm.stages))
    stage_fns = (rounds.make_stage_fns(self.algorithm) if self.round_programs == "stages"
                 else ())
    self._state_shardings = None
    round_jit = {}  # how every round program (whole or stage) is jitted
    if mesh is None:
      self._init = jax.jit(init)
    else:
      abstract = jax.eval_shape(init, jax.random.key(0), self.data)
      self._state_shardings = sharding.state_shardings(abstract, mesh)
      self._init = jax.jit(init, out_shardings=self._state_shardings)
      round_jit["out_shardings"] = (self._state_shardings, None)
    self.run_rounds = jax.jit(calls, **round_jit)
    self.stage_programs = tuple((name, jax.jit(fn, **round_jit)) for name, fn in stage_fns)
    self.evaluate = jax.jit(self.algorithm.evaluate)
    diagnostics = self.algorithm.diagnostics
    self._diagnostics = jax.jit(diagnostics.compute) if diagnostics is not None else None
    self._evaluate_compiled = self._diagnostics_compiled = None  # set by `compile_all`
    # The code outside the package that the round runs (its method, its models): in the trace
    # cache's key under config.trace_cache="on"; "auto" then does not use the cache.
    self._outside_files = trace_cache.outside_package(
        [get_method(config.algorithm).make]
        + [m for g in self.groups for m in (g.model, g.public_model) if m is not None])
    # One test domain: plain accuracy; several: intra/inter-domain accuracy (FCCL+ tables).
    self.accuracy_kinds = ("inter", "intra") if len(self.test_domains) > 1 else ("accuracy",)

  def compile_rounds(self, state: Any) -> Any:
    """The compiled round for this state's shapes: `run_rounds`, or with stages the
    `programs.CompiledStages` (traces once; uses the caches)."""
    return self.lower_rounds(state).compile()

  def compile_all(self, state: Any, *, with_diagnostics: bool = True) -> Any:
    """Compiles the round, the evaluation and the diagnostics; returns the round.

    The evaluation and diagnostics executables are kept and used by
    `evaluation_record` / `diagnostics` from then on. They are traced and
    compiled in a worker thread while this thread traces and lowers the round
    (pure Python, one core busy), and the round's XLA compile starts only once
    they are done: compiling the evaluation beside the round's compile is
    slower on an H100 (FCCL+ quick: over 268 s against 176 s; XLA's GPU
    compiler is itself multi-threaded and autotunes on the device). The
    round is lowered by `lower_rounds`, through the trace cache when it is on;
    a round in stage programs compiles them side by side on a CPU, in turn on
    an accelerator. Then the memory the compiler freed is handed back to the
    system (`release_freed_host_memory`), so that the memory check and the
    round see it.
    """
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="fedjax_het_compile") as pool:
      side = pool.submit(self._compile_evaluation, state, with_diagnostics)
      lowered = self.lower_rounds(state)
      side.result()  # raises what the worker raised
    compiled = lowered.compile()
    released = release_freed_host_memory()  # the compiler's freed heap, before the round runs
    if released:
      logging.info("returned %.2f GiB of memory the compiler had freed to the system",
                   released / 2.0 ** 30)
    return compiled

  def trace_cache_directory(self) -> pathlib.Path | None:
    """Where `lower_rounds` keeps exported rounds (`fedjax_het.trace_cache`), or None.

    None when `config.trace_cache` is "off", without `config.compilation_cache_dir`,
    for a run sharded over a mesh, and, under "auto", when the method or a model
    is defined outside the fedjax_het package.
    """
    mode = self.config.get("trace_cache", "auto")  # checked by validate_config
    if mode == "off" or not self.config.compilation_cache_dir or self.mesh is not None:
      return None
    if mode == "auto" and self._outside_files:
      logging.info("trace cache off: the method or a model is defined outside fedjax_het (%s); "
                   "config.trace_cache='on' keys it on those files too",
                   ", ".join(map(str, self._outside_files)))
      return None
    return pathlib.Path(self.config.compilation_cache_dir).expanduser() / trace_cache.FOLDER

  def lower_rounds(self, state: Any) -> Any:
    """The round lowered for `state`'s shapes, through the trace cache when it is on.

    `run_rounds` lowered, or with `round_programs == "stages"` the
    `programs.LoweredStages` of the stage programs (compiled side by side on a
    CPU; on a GPU one after the other, as XLA's GPU compiler is itself
    multi-threaded). With the cache, a later run of the same round reads each
    exported program instead of tracing and lowering it
    (`fedjax_het.trace_cache`); both compile the same module. A program the
    cache cannot hold is traced as usual.
    """
    cache = self._trace_cache_key(state)
    if self.round_programs == "stages":
      # One key for the round (one read of the package source), one entry per stage.
      return programs.lower_stages(
          self.stage_programs,
          lambda name, jitted: self._lower_program(
              jitted, state, cache and (cache[0], trace_cache.stage_key(cache[1], name)), name),
          int(self.config.rounds_per_call), side_by_side=jax.default_backend() == "cpu")
    return self._lower_program(self.run_rounds, state, cache, None)

  def _trace_cache_key(self, state: Any) -> tuple[pathlib.Path, str] | None:
    """(the trace cache's directory, this round's key), or None when the cache is not used."""
    directory = self.trace_cache_directory()
    if directory is None:
      return None
    config = {name: value for name, value in workdir_lib.flatten_config(self.config).items()
              if not workdir_lib.covered(name, workdir_lib.NEUTRAL_FIELDS)}
    # What the method's make() read besides the config (data sizes, normalisation statistics,
    # the modules) and the convolutions this Experiment chose.
    statics = {"setup": repr(self.setup), "conv_impl": self.conv_impl,
               "public_conv_impl": self.public_conv_impl}
    try:
      return directory, trace_cache.round_key(config_json=json.dumps(config, sort_keys=True),
                                              choices=statics, args=(state, self.data),
                                              extra_files=self._outside_files)
    except Exception as error:  # pylint: disable=broad-except
      logging.info("trace cache not used for this round (%s: %s); tracing it as usual",
                   type(error).__name__, error)
      return None

  def _lower_program(self, jitted: Any, state: Any, cache: tuple[pathlib.Path, str] | None,
                     stage: str | None) -> Any:
    """`jitted(state, data)` lowered, through the trace cache entry `cache` (directory, key)
    when there is one; `stage`: the stage's name, None for the whole round (for the log)."""
    if cache is None:
      return jitted.lower(state, self.data)
    directory, key = cache
    tick = time.perf_counter()
    try:
      lowered = trace_cache.lower_round(jitted, (state, self.data), directory=directory, key=key)
    except Exception as error:  # pylint: disable=broad-except
      logging.info("trace cache not used for this round (%s: %s); tracing it as usual",
                   type(error).__name__, error)
      return jitted.lower(state, self.data)
    what = "round" if stage is None else f"round's stage {stage!r}"
    logging.info("%s the traced %s %s %s in %.1f s", "read" if lowered.hit else "saved", what,
                 "from" if lowered.hit else "to", directory, time.perf_counter() - tick)
    return lowered

  def _compile_evaluation(self, state: Any, with_diagnostics: bool) -> None:
    self._evaluate_compiled = self.evaluate.lower(state, self.data.test).compile()
    if with_diagnostics and self._diagnostics is not None:
      self._diagnostics_compiled = self._diagnostics.lower(state, self.data).compile()

  def init_state(self) -> Any:
    return self._init(jax.random.key(int(self.config.seed)), self.data)

  def abstract_state(self) -> Any:
    """Shapes, dtypes and (with a mesh) shardings of the state: the checkpoint restore target."""
    like = jax.eval_shape(self.init_state)
    if self._state_shardings is None:
      return like
    return jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), like,
        self._state_shardings)

  def restore_state(self, checkpointer: checkpointing.Checkpointer, round_index: int) -> Any:
    """The state saved at `round_index`, placed as a fresh state is.

    Restored arrays come back committed to a device while a fresh run's are
    not; without a mesh that changes the lowered program, hence its
    persistent-cache key, and a resumed run would recompile from scratch.
    """
    state = checkpointer.restore(round_index, self.abstract_state())
    if self.mesh is None:
      state = jax.device_put(jax.device_get(state))
    return state

  def diagnostics(self, state) -> np.ndarray | None:
    """The method's diagnostic arrays (K, ...) in participant order, or None if it has none."""
    if self._diagnostics is None:
      return None
    compute = self._diagnostics_compiled or self._diagnostics
    per_group = sharding.fetch(compute(state, self.data))
    return scatter_to_participants(self.groups, per_group, self.setup.num_participants)

  def evaluation_record(self, state) -> dict[str, float]:
    """eval/<kind>/<client> and eval/<kind>/mean from one evaluation.

    kind is intra/inter (own domain / mean of the other domains) when the
    scenario has several test domains, else accuracy.
    """
    evaluate = self._evaluate_compiled or self.evaluate
    accuracy = scatter_to_participants(self.groups, sharding.fetch(evaluate(state, self.data.test)),
                                       self.setup.num_participants)
    if self.accuracy_kinds == ("accuracy",):
      per_kind = {"accuracy": np.asarray(accuracy, np.float64)[:, 0]}
    else:
      intra, inter = intra_inter(accuracy, self.client_domain_index)
      per_kind = {"intra": intra, "inter": inter}
    record = {}
    for name_index, name in enumerate(self.client_names):
      for kind in self.accuracy_kinds:
        record[f"eval/{kind}/{name}"] = float(per_kind[kind][name_index])
    for kind in self.accuracy_kinds:
      record[f"eval/{kind}/mean"] = float(np.mean(per_kind[kind]))
    return record

  def train_records(self, metrics: Any, num_rounds: int) -> list[dict[str, float]]:
    """Per-round records from stacked round metrics.

    {phase: {group: {metric: (rounds, slots)}}} gives train/<phase>/<metric>/<client>;
    {phase: {metric: (rounds,)}} (server-side scalars) gives train/<phase>/<metric>.
    """
    metrics = sharding.fetch(metrics)
    records = [{} for _ in range(num_rounds)]
    group_names = {g.name for g in self.groups}
    for phase, values in metrics.items():
      if set(values) <= group_names and all(isinstance(v, Mapping) for v in values.values()):
        names = next(iter(values.values())).keys()
        for metric in names:
          stacked = {g: np.asarray(v[metric]) for g, v in values.items()}  # (rounds, slots)
          for r in range(num_rounds):
            per_client = scatter_to_participants(self.groups, {g: x[r] for g, x in stacked.items()},
                                                 self.setup.num_participants)
            for name, value in zip(self.client_names, per_client):
              records[r][f"train/{phase}/{metric}/{name}"] = float(value)
      else:
        for metric, value in values.items():
          for r in range(num_rounds):
            records[r][f"train/{phase}/{metric}"] = float(np.asarray(value)[r])
    return records

  def metadata(self) -> dict[str, Any]:
    sc = self.scenario
    return {
        "scenario": sc.name, "domains": list(sc.domains), "sources": dict(sc.sources),
        "substituted_by_synthetic": list(sc.substituted),
        "train_sizes": {n: int(len(s.labels)) for n, s in zip(self.client_names, sc.train)},
        "test_sizes": {d: int(len(sc.test[d].labels)) for d in sc.test},
        "public_size": int(len(sc.public)),
        **({"office_test": sc.office_test} if sc.office_test else {}),
        "participants": [{"name": n, "domain": d, "architecture": a} for n, d, a in
                         zip(self.client_names, sc.domains, self.architectures)],
        "groups": {g.name: {"clients": list(g.clients), "slots": g.num_slots} for g in self.groups},
        "conv_impl": self.conv_impl, "public_conv_impl": self.public_conv_impl,
        "backend": jax.default_backend(),
        **({"xla_cpu_scheduler": xla_cpu.scheduler_in_force()}
           if jax.default_backend() == "cpu" else {}),
        **({"xla_gpu_triton_gemm": xla_gpu.triton_gemm_in_force()}
           if jax.default_backend() == "gpu" else {}),
        "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
        "python": platform.python_version(),
        **({"processes": jax.process_count()} if jax.process_count() > 1 else {}),
    }


def _log_data_provenance(scenario: data_lib.Scenario) -> None:
  for domain, source in scenario.sources.items():
    logging.info("data %-10s <- %s", domain, source)
  if scenario.substituted:
    banner = "!" * 78
    logging.warning("%s\nSYNTHETIC DATA SUBSTITUTED for %s (real source unavailable; see "
                    "metadata.json). Results are NOT comparable with the paper.\n%s",
                    banner, ", ".join(scenario.substituted), banner)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, mesh: Any = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming from its latest checkpoint) and evaluates.

  Args:
    config: an experiment config (see `fedjax_het.config.base_config`).
    workdir: output directory.
    mesh: optional device mesh (`engine.sharding.client_mesh`); by default one
      is built when `config.sharding.num_devices != 1` or when the run spans
      several processes (then over every process's devices).

  Returns:
    {"results": the final table numbers, "last_record": the last metrics
    record, "records": all records}.
  """
  workdir = pathlib.Path(workdir)
  workdir_lib.check_workdir(workdir)
  if config.compilation_cache_dir:
    # XLA compilation of a heterogeneous round takes minutes on a CPU; cache it across runs.
    jax.config.update("jax_compilation_cache_dir",
                      str(pathlib.Path(config.compilation_cache_dir).expanduser()))
  if mesh is None and (config.sharding.num_devices != 1 or jax.process_count() > 1):
    mesh = sharding.client_mesh(config.sharding.num_devices or None)
  # In a multi-process run every process trains; process 0 alone writes the workdir files.
  primary = sharding.is_primary()
  # A resumed "auto" run keeps the convolutions its memory fallback chose (the same rounding as
  # before the interruption, and no compile of a round already known not to fit).
  experiment = Experiment(config, mesh=mesh, **recorded_conv_impls(workdir, config))
  _log_data_provenance(experiment.scenario)
  # Nothing is written to the workdir before the resume guard has passed.
  record = workdir_lib.run_record(config, experiment.scenario)
  checkpointer, start = workdir_lib.open_run(workdir, config, record, experiment.metadata(),
                                             primary=primary, sync=sharding.barrier)

  writer = reporting.MetricsWriter(workdir,
                                  tensorboard=primary and bool(config.logging.tensorboard))
  if start is None:
    start, state = 0, experiment.init_state()
    checkpointer.save(0, state)
  else:
    state = experiment.restore_state(checkpointer, start)
    logging.info("resumed from the checkpoint of round %d in %s", start, workdir)
  if primary:
    records = writer.truncate_after(start)
  sharding.barrier("fedjax_het:metrics")  # the others read the records process 0 kept
  if not primary:
    records = [r for r in writer.read() if r["round"] <= start]

  num_rounds, per_call = int(config.num_rounds), int(config.rounds_per_call)
  diagnostics = experiment.algorithm.diagnostics
  diagnostic_rounds = {int(r) for r in config.logging.diagnostic_rounds
                       if 0 < int(r) <= num_rounds} if diagnostics is not None else set()
  saved = _load_diagnostics(workdir / f"{diagnostics.name}.npz") if diagnostics and start else {}
  kinds = experiment.accuracy_kinds
  done = start
  if done < num_rounds:
    logging.info("compiling the round (the first run on a machine takes minutes; later runs "
                 "reuse the compilation cache%s)",
                 f" in {config.compilation_cache_dir}" if config.compilation_cache_dir else "")
    tick = time.perf_counter()
    # The evaluation (and diagnostics) compile now too, beside the round: the first round's
    # time, and so the progress bar's ETA, then count training rounds only.
    run_rounds = experiment.compile_all(state, with_diagnostics=bool(diagnostic_rounds))
    available = sharding.primary_bytes(available_memory_bytes(jax.devices()[0]))
    need = estimated_bytes(run_rounds)
    while needs_low_memory_convs(config, experiment.conv_impl, need, available):
      conv_impl, public_conv_impl = low_memory_conv_impls(
          config, experiment.conv_impl, experiment.public_conv_impl,
          has_public=len(experiment.scenario.public) > 0)
      logging.warning("the round with %s convolutions (%s on the public batch) needs about %.1f "
                      "GiB of the %.1f GiB available: compiling it again with %s convolutions "
                      "(%s on the public batch; less memory, same parameters; "
                      "config.models.conv_impl='auto')", experiment.conv_impl,
                      experiment.public_conv_impl, need / 2.0 ** 30, available / 2.0 ** 30,
                      conv_impl, public_conv_impl)
      del run_rounds
      experiment = Experiment(config, mesh=mesh, conv_impl=conv_impl,
                              public_conv_impl=public_conv_impl, scenario=experiment.scenario)
      run_rounds = experiment.compile_all(state, with_diagnostics=bool(diagnostic_rounds))
      need = estimated_bytes(run_rounds)
      if primary:
        workdir_lib.write_metadata(workdir, experiment.metadata())
    need = check_round_memory(run_rounds, config, available)
    logging.info("compiled the round and its evaluation in %.1f s; a round needs about %.2f GiB "
                 "(XLA memory analysis)", time.perf_counter() - tick, need / 2.0 ** 30)
  # Made after compiling: its rate and ETA count training rounds only.
  progress = reporting.Progress(num_rounds, enabled=primary and bool(config.logging.progress),
                               start=start)
  while done < num_rounds:
    tick = time.perf_counter()
    state, metrics = run_rounds(state, experiment.data)
    jax.block_until_ready(state)
    seconds = (time.perf_counter() - tick) / per_call
    new_records = experiment.train_records(metrics, per_call)
    done += per_call
    for offset, record in enumerate(new_records):
      record["round"] = done - per_call + offset + 1
      record["time/round_secs"] = seconds
    last = new_records[-1]
    if done % int(config.eval.every) == 0 or done == num_rounds:
      last.update(experiment.evaluation_record(state))
    if diagnostic_rounds & set(range(done - per_call + 1, done + 1)):
      saved[done] = experiment.diagnostics(state)
      if primary:
        workdir_lib.savez_atomic(workdir / f"{diagnostics.name}.npz",
                                 **{f"round_{r}": m for r, m in saved.items()})
    for record in new_records:
      if primary:
        writer.write(record)
      records.append(record)
    if done % int(config.checkpoint.every) == 0 or done == num_rounds:
      checkpointer.save(done, state)
    shown = " ".join(f"{kind} {last[f'eval/{kind}/mean']:.1f}" for kind in kinds
                     if f"eval/{kind}/mean" in last)
    progress.update(done, shown)
  progress.close()
  checkpointer.close()
  writer.close()

  table, numbers = reporting.results_table(records, experiment.client_names,
                                           last_rounds=int(config.eval.last_rounds),
                                           method=config.algorithm, kinds=kinds)
  targets = [float(t) for t in config.eval.targets]
  if targets and numbers:
    numbers["rounds_to_target"] = {f"{t:g}": rounds_to_target(records, kinds, t)
                                   for t in targets}
    what = "test" if headline_kind(kinds) == "accuracy" else "intra-domain"
    table += "\n\n" + "\n".join(
        f"Rounds to reach {t:g}% mean {what} accuracy: "
        f"{reached if reached is not None else 'not reached in ' + str(num_rounds)}."
        for t, reached in zip(targets, numbers["rounds_to_target"].values()))
  substituted = experiment.scenario.substituted
  note = (f"\n\nSynthetic data substituted for: {', '.join(substituted)} "
          "(see metadata.json).\n" if substituted else "\n")
  protocol = _office_test_line(experiment.scenario.office_test, int(config.eval.top_k))
  result = {"results": numbers, "last_record": records[-1] if records else {}, "records": records}
  if not primary:
    return result
  workdir_lib.write_atomic(
      workdir / "results.md",
      f"# {config.name}: mean of the last {config.eval.last_rounds} evaluated rounds\n\n"
      f"{protocol}{table}{note}")
  workdir_lib.write_atomic(workdir / "results.json", json.dumps(numbers, indent=2) + "\n")
  logging.info("results (mean of the last %d evaluated rounds):\n%s", config.eval.last_rounds,
               table)
  if config.logging.plots:
    plots.plot_accuracy_curves(records, experiment.client_names, workdir / "accuracy.png",
                               title=config.name, kinds=kinds,
                               num_classes=experiment.scenario.num_classes)
    if diagnostics is not None and saved:
      diagnostics.plot(saved, experiment.client_names, workdir / f"{diagnostics.name}.png")
  return result


def _office_test_line(office_test: str, top_k: int) -> str:
  """The results.md line saying which Office test protocol (and top-k) the numbers use."""
  if not office_test:
    return ""
  what = {"held_out": "held-out images (i % 10 >= 8 of each domain, never in private data)",
          "whole_domain": "the whole domain, training images included (as the FCCL+ code "
                          "evaluates)"}[office_test]
  return f"Test sets (scenario.office_test={office_test!r}): {what}; top-{top_k} accuracy.\n\n"


def headline_kind(kinds: tuple[str, ...]) -> str:
  """The accuracy a target refers to: plain accuracy, else intra-domain accuracy."""
  return "accuracy" if "accuracy" in kinds else "intra"


def rounds_to_target(records: list[dict[str, Any]], kinds: tuple[str, ...],
                     target: float) -> int | None:
  """The first round whose mean (headline) accuracy is >= target percent, or None."""
  name = f"eval/{headline_kind(kinds)}/mean"
  for record in records:
    if name in record and record[name] >= target:
      return int(record["round"])
  return None


def _load_diagnostics(path: pathlib.Path) -> dict[int, np.ndarray]:
  """{round: array} from a diagnostics file written by an interrupted run."""
  if not path.exists():
    return {}
  with np.load(path) as stored:
    return {int(k.split("_")[1]): stored[k] for k in stored.files}

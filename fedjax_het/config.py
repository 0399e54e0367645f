"""Experiment configuration: one schema of run-wide fields, then the family's and method's sections.

`base_config(algorithm)` builds a config in three layers:

  * `run_config(algorithm)`: the run-wide fields every run has, whatever its
    scenario and method (seed and seeds, rounds per call, the compile and runtime
    switches, `models`, `eval`, `checkpoint`, `sharding`, `logging`), written once
    here with their defaults;
  * the scenario family's sections: `domain_sections` for the domain and
    partitioned scenarios (`num_rounds`, `scenario`: FCCL+ Digits by default),
    `cil.stream.stream_config` for the class-incremental task stream (`scenario`,
    `cil`, `local`, plus the stream's own defaults of a few run-wide fields,
    `cil.stream.RUN_WIDE_DEFAULTS`);
  * the method's sections (`default_config()` of the registered method, e.g.
    `config.collaborative`, `config.local`, `config.<method>`; a method may also
    change the defaults of the run-wide sections, e.g. one architecture).

Scenario files (`fedjax_het/configs/<scenario>.py`) start from `base_config` and
override what differs. `validate_config` checks the run-wide fields once
(`validate_run_wide`), then the family's (`validate_domain_config`,
`cil.stream.validate_stream_config`), then the schedule fields that depend on
both (`validate_schedule`), then asks the method to check its sections; every
error names the field and the allowed values. The config is read once into
Python constants by the method's `make`; it never enters a jitted function.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import types

import ml_collections

from fedjax_het import algorithms, validation
from fedjax_het.cil import stream as cil_stream
from fedjax_het.data.partitioned import PARTITIONS
from fedjax_het.data.scenarios import OFFICE_TESTS, PUBLIC_NORMALIZATIONS
from fedjax_het.runtime import programs, trace_cache, xla_cpu, xla_gpu
from fedjax_het.errors import ConfigError
from fedjax_het.validation import check, choice, fail, int_at_least, positive

CONV_IMPLS = ("auto", "xla", "im2col", "custom_vjp", "gemm_taps")
SCENARIOS = ("digits", "office_caltech", "office31", "office_home", "partitioned")
PUBLIC_SETS = ("cifar100", "fmnist", "tinyimagenet", "synthetic")
OFFICE_SCENARIOS = ("office_caltech", "office31", "office_home")
ON_NONFINITE = ("stop", "warn")

#: Top-level sections a method may give its own defaults of; every other section a method
#: declares is its own.
SHARED_SECTIONS = ("scenario", "models", "eval", "checkpoint", "sharding", "logging")


def load_module(path: str | os.PathLike) -> types.ModuleType:
  """Imports a Python file by path: a user's config file (`--config=path.py:arg`).

  The library's configs are the modules of `fedjax_het.configs`, imported as such (a family
  imports a shared sibling as `from fedjax_het.configs import _two_stream`).
  """
  path = pathlib.Path(path)
  spec = importlib.util.spec_from_file_location(f"fedjax_het_config_{path.stem}", path)
  if spec is None or spec.loader is None or not path.is_file():
    raise FileNotFoundError(f"load_module: no Python file at {path}.")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_config(algorithm: str) -> ml_collections.ConfigDict:
  """The run-wide fields and their defaults: the part of the schema every run shares."""
  c = ml_collections.ConfigDict()
  c.name = "run"
  c.seed = 0
  # Several seeds as one vmapped program, each in <workdir>/seed_<s>/ (fedjax_het/seed_stack.py);
  # () trains config.seed alone.
  c.seeds = ()
  c.algorithm = algorithm
  # Rounds per jitted call (one lax.scan); the trainer evaluates and checkpoints between calls.
  c.rounds_per_call = 1
  c.compilation_cache_dir = "~/.cache/fedjax_het/jax"  # "" disables the persistent cache
  # Keep the traced round beside the compilation cache, so a later run of the same round skips
  # tracing and lowering too: auto (when the method and models are the library's own), on, off.
  # Same numbers either way. See fedjax_het/runtime/trace_cache.py.
  c.trace_cache = "auto"
  # A method whose round is given as stages (FCCL+, FCCL: public phase, local phase) can run it
  # as one XLA program per stage, compiled side by side on a CPU and loaded from the cache much
  # faster than one large program: auto (when the method has stages: groups on a GPU, stages
  # elsewhere), one, stages, or groups (as stages, with the local phase one program per
  # participant group). Same numbers either way. See fedjax_het/runtime/programs.py.
  c.round_programs = "auto"
  # How the round's programs compile: auto (side by side on a CPU or for groups, else in turn),
  # side_by_side (threads), in_turn. Same programs either way.
  c.round_compile = "auto"
  c.memory_check = True                  # fail before training if a round cannot fit in memory
  # A non-finite loss, metric or parameter: "stop" the run there (the last finite checkpoint
  # stays, the run exits non-zero naming the round and the metric) or "warn" and train on.
  c.on_nonfinite = "stop"
  # A workdir with results (results.json, metrics.jsonl) but no checkpoint is refused unless
  # True: then the run trains afresh and replaces them.
  c.overwrite = False
  # XLA:CPU's instruction scheduler, fixed when JAX starts (experiments/train.py sets it):
  # auto = memory (the peak-memory-minimising one: the paper-size rounds fit on a 24 GiB CPU
  # machine), or concurrency (XLA's default). Same numbers either way. See runtime/xla_cpu.py.
  c.xla_cpu_scheduler = "auto"
  # XLA:GPU's Triton GEMM kernels, fixed when JAX starts (experiments/train.py sets it): auto =
  # off (matrix products on cuBLAS: a far shorter GPU compile, the same step time within 2%),
  # or on (XLA's default). No effect on a CPU or TPU. See runtime/xla_gpu.py.
  c.xla_gpu_triton_gemm = "auto"
  # Resuming a workdir refuses a changed config; fields named here may differ (comma-separated
  # names or section prefixes, e.g. "num_rounds" to extend a run). See fedjax_het.workdir.
  c.resume_allow_changes = ""

  c.models = ml_collections.ConfigDict()
  # One name per participant, or one for all (the class-incremental stream: one for all).
  c.models.architectures = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")
  c.models.width = 1.0
  c.models.conv_impl = "auto"            # auto: im2col on CPU, xla on GPU/TPU
  # The convolutions of the forward passes on the shared public batch (the collaborative phase
  # of FCCL, FCCL+, FedMD, FedDF, RHFL, FedMatch). "auto": as models.conv_impl, except that an
  # "auto" CPU run too large for im2col switches the public batch to custom_vjp first.
  c.models.public_conv_impl = "auto"
  c.models.compute_dtype = "float32"     # "bfloat16": mixed precision (GPU/TPU; slower on CPU)

  c.eval = ml_collections.ConfigDict()
  # Evaluate after every `every`-th round (0: none besides the rounds the results are read
  # from). Those rounds are evaluated whatever `every` says: a domain or partitioned run's last
  # `last_rounds` rounds, a class-incremental run's task ends. With rounds_per_call > 1 the
  # evaluations fall between calls: `every` divides rounds_per_call (every call) or is a
  # multiple of it.
  c.eval.every = 1
  c.eval.batch_size = 512
  c.eval.top_k = 1                       # top-k accuracy (the class-incremental stream: top-1)
  c.eval.last_rounds = 3                 # the rounds whose mean a domain or partitioned run reports
  c.eval.targets = ()                    # accuracies (percent): report the first round reaching each

  c.checkpoint = ml_collections.ConfigDict()
  # Checkpoint after every `every`-th round (0: none besides the ones every run writes: its
  # last round; a class-incremental run's task ends); as eval.every with rounds_per_call.
  c.checkpoint.every = 1
  c.checkpoint.keep = 2

  c.sharding = ml_collections.ConfigDict()
  # 0 -> all visible devices (the class-incremental stream runs on one device: 1)
  c.sharding.num_devices = 1

  c.logging = ml_collections.ConfigDict()
  c.logging.progress = True
  c.logging.tensorboard = False         # True: also write TensorBoard events (needs tensorboardX)
  # Where the per-round records go besides metrics.jsonl: comma-separated from
  # reporting.WRITERS, e.g. "jsonl,tensorboard,wandb,mlflow" (extras tensorboard, wandb, mlflow).
  c.logging.writers = "jsonl"
  c.logging.wandb_mode = "offline"       # or "online" (needs a W&B login)
  c.logging.mlflow_tracking_uri = ""     # "" -> a local SQLite store, <workdir>/mlflow.db
  c.logging.plots = True
  c.logging.diagnostic_rounds = (1, 10, 40)  # rounds at which the method's diagnostics are saved
  return c


def domain_sections(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the domain and partitioned scenarios' sections to the run-wide fields `c`.

  FCCL+ Digits paper settings: 40 rounds over the MNIST, USPS, SVHN and SYN
  participants with a CIFAR-100 public set.
  """
  c.num_rounds = 40
  c.scenario = ml_collections.ConfigDict()
  c.scenario.name = "digits"
  c.scenario.data_dir = ""               # "" -> $FEDJAX_HET_DATA_DIR
  c.scenario.domains = ()                # () -> one participant per domain; may repeat
  c.scenario.sources = ml_collections.ConfigDict()
  c.scenario.synthetic_fallback = False
  c.scenario.private_sizes = ml_collections.ConfigDict()  # empty -> FCCL+ Table V
  c.scenario.test_size = 0               # 0 -> full test sets
  c.scenario.public_name = "cifar100"
  c.scenario.public_size = 5000
  # The public images' normalisation: "library" (CIFAR-100's statistics; Fashion-MNIST ImageNet's)
  # or "fcclplus_code" (the FCCL+ code's: CIFAR-100 with Tiny-ImageNet's statistics).
  c.scenario.public_normalization = "library"
  # scenario.office_test ("held_out" | "whole_domain"): declared by the Office configs
  # (fedjax_het/configs/office.py) only, so other runs' configs stay as they were.
  # scenario.name="partitioned": one labelled dataset split over many clients.
  c.scenario.dataset = "mnist"           # mnist | cifar10
  c.scenario.dataset_source = "real"     # the .npz bundle; "tfds"; "folder:<path>"
  c.scenario.num_clients = 100
  c.scenario.partition = "iid"           # iid | dirichlet | shards | class_split[_own] | permuted
  c.scenario.dirichlet_alpha = 0.5
  c.scenario.shards_per_client = 2
  c.scenario.train_size = 0              # 0: the whole training set; else a stratified subsample
  return c


def base_config(algorithm: str) -> ml_collections.ConfigDict:
  """The run-wide fields, the sections of `algorithm`'s scenario family, and its own sections.

  A method of domain or partitioned scenarios gets `domain_sections` (FCCL+
  Digits paper settings); a class-incremental one (glfc, icarl_fl, fedavg_cil,
  ...) GLFC's CIFAR-100 T=10 task stream (`cil.stream.stream_config`).
  """
  method = algorithms.get_method(algorithm)
  c = run_config(algorithm)
  if method.class_incremental:
    cil_stream.stream_config(c)
  else:
    domain_sections(c)
  sections = method.default_config()
  for name in sections:
    if name in SHARED_SECTIONS:  # a method may change run-wide defaults (e.g. one architecture)
      c[name].update(sections[name])
    elif name in c:
      raise ConfigError(f"method {algorithm!r} declares config section {name!r}, which is a "
                        f"field of the run or of its scenario family; sections it may override: "
                        f"{SHARED_SECTIONS}.")
    else:
      c[name] = sections[name]
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first invalid field and its allowed values.

  The run-wide fields first (`validate_run_wide`), then the scenario family's
  (`validate_domain_config` or, for scenario.name="class_incremental",
  `cil.stream.validate_stream_config`), then `validate_schedule`, then the
  method's own sections (its registered `validate_config`).
  """
  check(config, "algorithm", choice(tuple(algorithms.METHODS)),
        f"one of {tuple(algorithms.METHODS)}")
  validate_run_wide(config)
  stream_methods = tuple(n for n, m in algorithms.METHODS.items() if m.class_incremental)
  if config.scenario.name == cil_stream.SCENARIO:
    check(config, "algorithm", choice(stream_methods),
          f"one of {stream_methods} (the methods of scenario.name={cil_stream.SCENARIO!r})")
    cil_stream.validate_stream_config(config)
  else:
    if config.algorithm in stream_methods:
      fail("scenario.name", f"{cil_stream.SCENARIO!r} for config.algorithm={config.algorithm!r} "
           f"(build the config with fedjax_het.config.base_config({config.algorithm!r}))",
           config.scenario.name)
    validate_domain_config(config)
  validate_schedule(config)
  algorithms.get_method(config.algorithm).validate_config(config)


def validate_run_wide(config: ml_collections.ConfigDict) -> None:
  """Checks the fields of `run_config` (each on its own; `models.architectures`, whose shape
  the scenario family sets, and the fields read against rounds_per_call come later)."""
  check(config, "seed", int_at_least(0), "an integer >= 0")
  check(config, "seeds",
        lambda v: isinstance(v, (tuple, list)) and all(int_at_least(0)(s) for s in v)
        and len(set(v)) == len(v),
        "a sequence of distinct integers >= 0 (() trains config.seed alone)")
  check(config, "rounds_per_call", int_at_least(1), "an integer >= 1")
  check(config, "compilation_cache_dir", lambda v: isinstance(v, str),
        "a directory path (\"\" disables the persistent cache)")
  check(config, "trace_cache", choice(trace_cache.MODES), f"one of {trace_cache.MODES}")
  check(config, "round_programs", choice(programs.ROUND_PROGRAMS),
        f"one of {programs.ROUND_PROGRAMS}")
  check(config, "round_compile", choice(programs.ROUND_COMPILE),
        f"one of {programs.ROUND_COMPILE}")
  check(config, "memory_check", validation.is_bool, "True or False")
  check(config, "on_nonfinite", choice(ON_NONFINITE), f"one of {ON_NONFINITE}")
  check(config, "overwrite", validation.is_bool, "True or False")
  check(config, "xla_cpu_scheduler", choice(xla_cpu.SCHEDULERS), f"one of {xla_cpu.SCHEDULERS}")
  check(config, "xla_gpu_triton_gemm", choice(xla_gpu.CHOICES), f"one of {xla_gpu.CHOICES}")
  check(config, "resume_allow_changes", lambda v: isinstance(v, str),
        "a comma-separated string of config field names (\"\" for none)")
  check(config, "models.width", positive, "a number > 0")
  check(config, "models.conv_impl", choice(CONV_IMPLS), f"one of {CONV_IMPLS}")
  check(config, "models.public_conv_impl", choice(CONV_IMPLS), f"one of {CONV_IMPLS}")
  from fedjax_het import models  # pylint: disable=g-import-not-at-top
  check(config, "models.compute_dtype", choice(models.COMPUTE_DTYPES),
        f"one of {models.COMPUTE_DTYPES}")
  check(config, "eval.every", int_at_least(0),
        "an integer >= 0 (evaluate every that many rounds; 0: only the rounds the results are "
        "read from)")
  check(config, "eval.batch_size", int_at_least(1), "an integer >= 1")
  check(config, "eval.top_k", int_at_least(1), "an integer >= 1")
  check(config, "eval.last_rounds", int_at_least(1), "an integer >= 1")
  check(config, "eval.targets",
        lambda v: isinstance(v, (tuple, list)) and all(0 < float(t) <= 100 for t in v),
        "a sequence of accuracies in (0, 100] (percent; empty: off)")
  check(config, "checkpoint.every", int_at_least(0),
        "an integer >= 0 (checkpoint every that many rounds; 0: only the checkpoints every run "
        "writes)")
  check(config, "checkpoint.keep", int_at_least(1), "an integer >= 1")
  check(config, "sharding.num_devices", int_at_least(0), "an integer >= 0 (0: all devices)")
  validate_logging(config)


def validate_logging(config: ml_collections.ConfigDict) -> None:
  """Checks `config.logging`."""
  from fedjax_het import reporting  # pylint: disable=g-import-not-at-top
  for field in ("logging.progress", "logging.plots", "logging.tensorboard"):
    check(config, field, validation.is_bool, "True or False")
  check(config, "logging.writers",
        lambda v: isinstance(v, str) and all(
            n.strip() in reporting.WRITERS for n in v.split(",") if n.strip()),
        f"a comma-separated string of writers from {reporting.WRITERS}")
  check(config, "logging.wandb_mode", choice(reporting.WANDB_MODES),
        f"one of {reporting.WANDB_MODES}")
  check(config, "logging.mlflow_tracking_uri", lambda v: isinstance(v, str),
        "a string (\"\": a local SQLite store, <workdir>/mlflow.db)")
  check(config, "logging.diagnostic_rounds",
        lambda v: isinstance(v, (tuple, list)) and all(int_at_least(1)(r) for r in v),
        "a sequence of rounds >= 1 (empty: none)")


def validate_domain_config(config: ml_collections.ConfigDict) -> None:
  """Checks the fields of `domain_sections` and the participants' architectures."""
  from fedjax_het import models  # pylint: disable=g-import-not-at-top
  check(config, "num_rounds", int_at_least(1), "an integer >= 1")
  if config.num_rounds % config.rounds_per_call:
    fail("rounds_per_call", f"a divisor of num_rounds={config.num_rounds}",
         config.rounds_per_call)
  check(config, "scenario.name", choice(SCENARIOS + (cil_stream.SCENARIO,)),
        f"one of {SCENARIOS + (cil_stream.SCENARIO,)}")
  check(config, "scenario.test_size", int_at_least(0), "an integer >= 0 (0: full test sets)")
  check(config, "scenario.public_name", choice(PUBLIC_SETS), f"one of {PUBLIC_SETS}")
  check(config, "scenario.public_size", int_at_least(0), "an integer >= 0")
  check(config, "scenario.public_normalization", choice(PUBLIC_NORMALIZATIONS),
        f"one of {PUBLIC_NORMALIZATIONS}")
  for domain in config.scenario.private_sizes:
    check(config, f"scenario.private_sizes.{domain}", int_at_least(1),
          "an integer >= 1 (every participant trains on private data)")
  if "office_test" in config.scenario:  # declared by the Office configs only
    check(config, "scenario.office_test", choice(OFFICE_TESTS), f"one of {OFFICE_TESTS}")
    office = config.scenario.name in OFFICE_SCENARIOS
    if not office and config.scenario.office_test != "held_out":
      fail("scenario.office_test", f"'held_out' unless config.scenario.name is one of "
           f"{OFFICE_SCENARIOS} (other scenarios keep their own test sets)",
           config.scenario.office_test)
  if config.scenario.name == "partitioned":
    check(config, "scenario.num_clients", int_at_least(1), "an integer >= 1")
    check(config, "scenario.partition", choice(PARTITIONS), f"one of {PARTITIONS}")
    check(config, "scenario.dirichlet_alpha", positive, "a number > 0")
    check(config, "scenario.shards_per_client", int_at_least(1), "an integer >= 1")
    check(config, "scenario.train_size", int_at_least(0),
          "an integer >= 0 (0: the whole training set)")
  archs = tuple(config.models.architectures)
  if not archs or any(a not in models.MODEL_NAMES for a in archs):
    fail("models.architectures", f"a non-empty sequence of names from {models.MODEL_NAMES} "
         "(one per participant, or one for all)", archs)


def validate_schedule(config: ml_collections.ConfigDict) -> None:
  """`eval.every` and `checkpoint.every` against `rounds_per_call` and `eval.targets`.

  The trainer evaluates and checkpoints between calls of rounds_per_call
  rounds, so a period > 0 either divides rounds_per_call (every call) or is a
  multiple of it; rounds to a target need periodic evaluation.
  """
  per_call = config.rounds_per_call
  for field, what, verb in (("eval.every", "the rounds the results are read from", "evaluates"),
                            ("checkpoint.every", "the checkpoints every run writes", "saves")):
    check(config, field, lambda v: v == 0 or per_call % v == 0 or v % per_call == 0,
          f"0 (only {what}) or an integer that divides or is a multiple of "
          f"rounds_per_call={per_call} (the trainer {verb} between calls)")
  if config.eval.targets and not config.eval.every:
    fail("eval.every", "an integer >= 1 while config.eval.targets is set (the rounds to a "
         "target are read from the periodic evaluations)", config.eval.every)

"""Experiment configuration: defaults shared by every scenario, and validation.

Scenario files (`experiments/configs/<scenario>.py`) start from `base_config()`
and override what differs. `validate_config` checks every field the library
reads and raises a ValueError that names the field and the allowed values.
The config is read once into Python constants by `make_<method>`; it never
enters a jitted function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from fedjax_het.algorithms import ALGORITHMS
from fedjax_het.algorithms import fccl as fccl_lib
from fedjax_het.algorithms import fcclplus as fcclplus_lib

CONV_IMPLS = ("auto", "xla", "im2col", "custom_vjp")
SCENARIOS = ("digits", "office_caltech", "office31", "office_home")
PUBLIC_SETS = ("cifar100", "fmnist", "tinyimagenet", "synthetic")


def base_config() -> ml_collections.ConfigDict:
  """Defaults of reference-notes.md (FCCL+ Digits, paper settings)."""
  c = ml_collections.ConfigDict()
  c.name = "run"
  c.seed = 0
  c.algorithm = "fcclplus"
  c.num_rounds = 40
  c.rounds_per_call = 1
  c.compilation_cache_dir = "~/.cache/fedjax_het/jax"  # "" disables the persistent cache
  c.memory_check = True                  # fail before training if a round cannot fit in memory

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

  c.models = ml_collections.ConfigDict()
  c.models.architectures = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")
  c.models.width = 1.0
  c.models.conv_impl = "auto"            # auto: im2col on CPU, xla on GPU/TPU

  c.collaborative = ml_collections.ConfigDict()
  c.collaborative.epochs = 1
  c.collaborative.batch_size = 512
  c.collaborative.lr = 1e-3
  c.collaborative.lr_decay = 0.9
  c.collaborative.optimizer = "adam"
  c.collaborative.optimizer_reset = "batch"
  c.collaborative.augmentation = "weak"
  c.collaborative.crop = "pad"

  c.local = ml_collections.ConfigDict()
  c.local.epochs = 20
  c.local.batch_size = 256
  c.local.lr = 1e-3
  c.local.lr_decay = 0.9
  c.local.weight_decay = 1e-5
  c.local.optimizer = "adam"

  c.fcclplus = fcclplus_lib.default_config()
  c.fccl = fccl_lib.default_config()

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 1
  c.eval.batch_size = 512
  c.eval.top_k = 1
  c.eval.last_rounds = 3

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 1
  c.checkpoint.keep = 2

  c.sharding = ml_collections.ConfigDict()
  c.sharding.num_devices = 1             # 0 -> all visible devices

  c.logging = ml_collections.ConfigDict()
  c.logging.progress = True
  c.logging.tensorboard = True
  c.logging.plots = True
  c.logging.heatmap_rounds = (1, 10, 40)
  return c


def _fail(field: str, allowed: str, value: Any) -> None:
  raise ValueError(f"config.{field} must be {allowed}, got {value!r}.")


def _check(config: ml_collections.ConfigDict, field: str, ok: Callable[[Any], bool],
           allowed: str) -> None:
  value = config
  for part in field.split("."):
    value = value[part]
  try:
    good = ok(value)
  except TypeError:
    good = False
  if not good:
    _fail(field, allowed, value)


def _int_at_least(minimum: int) -> Callable[[Any], bool]:
  return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _choice(options: Sequence[str]) -> Callable[[Any], bool]:
  return lambda v: v in options


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the first invalid field and its allowed values."""
  from fedjax_het import models  # pylint: disable=g-import-not-at-top

  positive = lambda v: isinstance(v, (int, float)) and v > 0
  _check(config, "algorithm", _choice(tuple(ALGORITHMS)), f"one of {tuple(ALGORITHMS)}")
  _check(config, "seed", _int_at_least(0), "an integer >= 0")
  _check(config, "num_rounds", _int_at_least(1), "an integer >= 1")
  _check(config, "rounds_per_call", _int_at_least(1), "an integer >= 1")
  _check(config, "memory_check", lambda v: isinstance(v, bool), "True or False")
  if config.num_rounds % config.rounds_per_call:
    _fail("rounds_per_call", f"a divisor of num_rounds={config.num_rounds}",
          config.rounds_per_call)
  _check(config, "scenario.name", _choice(SCENARIOS), f"one of {SCENARIOS}")
  _check(config, "scenario.test_size", _int_at_least(0), "an integer >= 0 (0: full test sets)")
  _check(config, "scenario.public_name", _choice(PUBLIC_SETS), f"one of {PUBLIC_SETS}")
  _check(config, "scenario.public_size", _int_at_least(0), "an integer >= 0")
  archs = tuple(config.models.architectures)
  if not archs or any(a not in models.MODEL_NAMES for a in archs):
    _fail("models.architectures", f"a non-empty sequence of names from {models.MODEL_NAMES}",
          archs)
  _check(config, "models.width", positive, "a number > 0")
  _check(config, "models.conv_impl", _choice(CONV_IMPLS), f"one of {CONV_IMPLS}")
  for phase in ("collaborative", "local"):
    _check(config, f"{phase}.epochs", _int_at_least(0 if phase == "collaborative" else 1),
           "an integer >= 1" if phase == "local" else "an integer >= 0")
    _check(config, f"{phase}.lr", positive, "a number > 0")
    _check(config, f"{phase}.lr_decay", lambda v: 0 <= v < 1, "a number in [0, 1)")
    _check(config, f"{phase}.optimizer", _choice(("adam", "sgd")), "one of ('adam', 'sgd')")
  _check(config, "collaborative.batch_size", _int_at_least(2),
         "an integer >= 2 (the cross-correlation standardises over the batch)")
  _check(config, "local.batch_size", _int_at_least(1), "an integer >= 1")
  _check(config, "local.weight_decay", lambda v: v >= 0, "a number >= 0")
  _check(config, "collaborative.optimizer_reset", _choice(("batch", "round", "never")),
         "one of ('batch', 'round', 'never')")
  _check(config, "collaborative.augmentation", _choice(("weak", "strong", "none")),
         "one of ('weak', 'strong', 'none')")
  _check(config, "collaborative.crop", _choice(("pad", "resized")), "one of ('pad', 'resized')")
  _check(config, "fcclplus.fisl_temperature", positive, "a number > 0")
  _check(config, "fcclplus.fntd_temperature", positive, "a number > 0")
  _check(config, "fcclplus.fisl_weight", lambda v: v >= 0, "a number >= 0")
  _check(config, "fcclplus.off_diagonal_weight", lambda v: v >= 0, "a number >= 0")
  _check(config, "fcclplus.local_distillation", _choice(fcclplus_lib.LOCAL_DISTILLATIONS),
         f"one of {fcclplus_lib.LOCAL_DISTILLATIONS}")
  _check(config, "fccl.own_slot", _choice(fccl_lib.OWN_SLOTS), f"one of {fccl_lib.OWN_SLOTS}")
  _check(config, "fccl.pretrain_epochs", _int_at_least(0), "an integer >= 0")
  _check(config, "fccl.distill_temperature", positive, "a number > 0")
  _check(config, "eval.every", _int_at_least(1), "an integer >= 1")
  _check(config, "eval.batch_size", _int_at_least(1), "an integer >= 1")
  _check(config, "eval.top_k", _int_at_least(1), "an integer >= 1")
  _check(config, "eval.last_rounds", _int_at_least(1), "an integer >= 1")
  _check(config, "checkpoint.every", _int_at_least(1), "an integer >= 1")
  _check(config, "checkpoint.keep", _int_at_least(1), "an integer >= 1")
  _check(config, "sharding.num_devices", _int_at_least(0), "an integer >= 0 (0: all devices)")
  homogeneous = len(set(archs)) == 1
  for method in ("fcclplus", "fccl"):
    if config.algorithm == method and config[method].average_parameters and not homogeneous:
      _fail(f"{method}.average_parameters",
            "False unless every participant uses the same architecture", True)

"""The scenario families' configs, one module per family, each with `get_config(variant)`.

  digits           FCCL+ / FCCL Digits (MNIST, USPS, SVHN, SYN) and the benchmark's baselines
  office           Office-Caltech, Office31, Office-Home with heterogeneous backbones
  mnist, cifar10   McMahan's partitions and the FedMMD / FedFusion paper settings
  cifar100         GLFC's class-incremental CIFAR-100 stream and its Table 1 baselines
  imagenet_subset, tinyimagenet
                   GLFC Tables 2 and 3
  htfl             HtFLlib's heterogeneous-model scenario (the data-free methods)
  _two_stream, _glfc_datasets
                   settings two families share

A config name as `experiments/train.py --config=` takes it is `<family>_<variant>`
(`digits_fcclplus_quick`); `get_config(name)` builds it and `resolve_name(name)` names its
file and variant. Each module's docstring gives its variants, commands and expected results.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import types

import ml_collections

from fedjax_het.errors import ConfigError

#: The folder of the config modules (what `experiments/train.py --config=<name>` reads).
DIRECTORY = pathlib.Path(__file__).resolve().parent


def families() -> list[str]:
  """The config families (modules without a leading underscore), sorted."""
  return sorted(p.stem for p in DIRECTORY.glob("*.py") if not p.stem.startswith("_"))


def module(family: str) -> types.ModuleType:
  """The config module of `family` (`fedjax_het.configs.<family>`)."""
  if family not in families() and not (DIRECTORY / f"{family}.py").is_file():
    raise ValueError(f"no config family {family!r}; the families: {', '.join(families())}.")
  return importlib.import_module(f"{__name__}.{family}")


def split_name(name: str) -> tuple[str, str] | None:
  """"<family>_<variant>" -> (family, variant), the longest family the name starts with
  ("imagenet_subset_glfc" -> ("imagenet_subset", "glfc")); None when no family matches."""
  if not re.fullmatch(r"[A-Za-z0-9_]+", name):
    return None
  parts = name.split("_")
  for cut in range(len(parts), 0, -1):
    family = "_".join(parts[:cut])
    if family in families():
      return family, "_".join(parts[cut:])
  return None


def get_config(name: str) -> ml_collections.ConfigDict:
  """The config of `name` = "<family>_<variant>" (or a family alone: its default)."""
  split = split_name(name)
  if split is None:
    raise ValueError(f"{name!r} names no config family; the families: {', '.join(families())}.")
  family, variant = split
  config_module = module(family)
  return config_module.get_config(variant) if variant else config_module.get_config()


def resolve_name(name: str) -> tuple[pathlib.Path, str]:
  """(config file, variant) of a config name as experiments/train.py takes it.

  "<scenario>_<variant>" (e.g. "cifar100_glfc_quick") -> the config module's file in
  fedjax_het/configs/ (cifar100.py) and "<variant>"; a scenario whose name holds underscores
  (imagenet_subset) is the longest such prefix naming a config family
  ("imagenet_subset_glfc" -> imagenet_subset.py, "glfc"); "<path>.py[:<variant>]" -> that
  file and variant ("" for none). ConfigError for a name that resolves to neither.
  """
  if re.fullmatch(r"[A-Za-z0-9_]+", name):
    split = split_name(name)
    if split is None:
      raise ConfigError(f"{name!r}: no config family {name.split('_')[0]!r} in fedjax_het/configs; "
                        f"the families: {', '.join(families())}.")
    family, variant = split
    return DIRECTORY / f"{family}.py", variant
  path, _, variant = name.partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"{name!r} names no config file ({path} does not exist).")
  return pathlib.Path(path), variant

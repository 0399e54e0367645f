"""A cell's config: its row's config file and variant at the cell's scale, the row's fields,
the seed and the --set overrides; and the rounds a finished run of a config has trained."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from fedjax_het import configs as configs_lib
from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cells as cells_lib

#: The scenario whose runs last num_tasks x rounds_per_task rounds.
CLASS_INCREMENTAL = "class_incremental"
#: The folder of `fedjax_het.configs`' modules.
CONFIGS_DIR = configs_lib.DIRECTORY


@functools.lru_cache(maxsize=None)
def load_config_file(name: str) -> Any:
  """A config module: a family of `fedjax_het.configs` ("digits"), or a config file (a path
  relative to the repository, or absolute) loaded once."""
  if (CONFIGS_DIR / f"{name}.py").is_file():
    return configs_lib.module(name)
  return load_module(cells_lib.REPO / name)


def cell_config(
    cell: cells_lib.Cell, overrides: Sequence[str] = (),
    configure: Callable[[ml_collections.ConfigDict, cells_lib.Cell], None] | None = None
) -> ml_collections.ConfigDict:
  """get_config(<row variant at the cell's scale>) with the row's fields, the seed, the
  --set overrides and `configure(config, cell)` (tests shrink the models with it)."""
  module = load_config_file(cell.row.config or cell.setting.config)
  variant = cell.row.config_variant(cell.scale)
  try:
    config = module.get_config(variant)
  except ValueError as error:
    raise ConfigError(f"{cell.label}: {error}") from None
  for field, value in cell.row.fields(cell.scale):
    node, parts = config, field.split(".")
    for part in parts[:-1]:
      node = node[part]
    node[parts[-1]] = value
  config.seed = int(cell.seed)
  config.name = f"{config.name}_seed{cell.seed}"
  arguments.apply_overrides(config, overrides)
  if configure is not None:
    configure(config, cell)
  return config


def expected_rounds(config: ml_collections.ConfigDict) -> int:
  """The rounds a finished run of `config` has trained."""
  if config.get("scenario", {}).get("name") == CLASS_INCREMENTAL:
    return int(config.scenario.num_tasks) * int(config.cil.rounds_per_task)
  return int(config.num_rounds)


def load_config(name: str) -> ml_collections.ConfigDict:
  """The config a name resolves to (`fedjax_het.configs.resolve_name`); ConfigError for a bad
  variant."""
  path, variant = configs_lib.resolve_name(name)
  module = load_config_file(path.stem if path.resolve().parent == CONFIGS_DIR
                            else str(path.resolve()))
  try:
    return module.get_config(variant) if variant else module.get_config()
  except ValueError as error:
    raise ConfigError(f"{name!r}: {error}") from None

"""Config checks that name the field and its allowed values (shared by every config section).

    check(config, "local.batch_size", int_at_least(1), "an integer >= 1")

raises `ConfigError("config.local.batch_size must be an integer >= 1, got 0.")`.
The run-wide fields are checked once, for every scenario family, by
`fedjax_het.config.validate_run_wide`; each scenario family, method module and
engine block checks its own sections with these helpers.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from fedjax_het.errors import ConfigError


def fail(field: str, allowed: str, value: Any) -> None:
  raise ConfigError(f"config.{field} must be {allowed}, got {value!r}.")


def get(config: ml_collections.ConfigDict, field: str) -> Any:
  value = config
  for part in field.split("."):
    value = value[part]
  return value


def check(config: ml_collections.ConfigDict, field: str, ok: Callable[[Any], bool],
          allowed: str) -> None:
  """Raises naming `field` unless `ok(config.<field>)`."""
  value = get(config, field)
  try:
    good = ok(value)
  except TypeError:
    good = False
  if not good:
    fail(field, allowed, value)


def require_section(config: ml_collections.ConfigDict, section: str) -> None:
  """Raises when the method's section `config.<section>` is missing."""
  if section not in config:
    raise ConfigError(
         f"config.{section} is missing but config.algorithm={config.algorithm!r} needs it: "
         f"build the config with fedjax_het.config.base_config({config.algorithm!r}) (or a "
         f"scenario config for that method) instead of changing config.algorithm alone.")


def int_at_least(minimum: int) -> Callable[[Any], bool]:
  return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def choice(options: Sequence[str]) -> Callable[[Any], bool]:
  return lambda v: v in options


def finite_number(value: Any) -> bool:
  """An int or float (not a bool) that is neither infinite nor NaN."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(value: Any) -> bool:
  """A finite number > 0 (an infinite learning rate is refused, not trained)."""
  return finite_number(value) and value > 0


def is_bool(value: Any) -> bool:
  return isinstance(value, bool)

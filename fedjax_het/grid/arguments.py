"""The arguments the grid's runners share: lists, seeds, --set overrides, the aliases'
arguments, and a runner's `main` that reports a user error in one line."""

from __future__ import annotations

import argparse
import ast
import difflib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError, UserError, wants_traceback
from fedjax_het.grid import cells as cells_lib


def parse_list(text: str, what: str) -> list[str]:
  """"a, b,a" -> ["a", "b"]; ConfigError naming --<what> for an empty list."""
  items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
  if not items:
    raise ConfigError(f"--{what} must be a comma-separated list, got {text!r}.")
  return items


def parse_seeds(text: str) -> list[int]:
  """"0,1,2" -> [0, 1, 2]; ConfigError for anything but non-negative integers."""
  seeds = []
  for item in parse_list(text, "seeds"):
    try:
      seeds.append(int(item))
    except ValueError:
      raise ConfigError(f"--seeds must be comma-separated integers (e.g. 0,1,2), got "
                        f"{text!r}.") from None
    if seeds[-1] < 0:
      raise ConfigError(f"--seeds must be integers >= 0, got {text!r}.")
  return seeds


def parse_override(text: str) -> tuple[str, str]:
  """"local.epochs=2" -> ("local.epochs", "2") (the value is parsed against the field)."""
  field, sep, value = text.partition("=")
  if not sep or not field.strip():
    raise ConfigError(f"--set expects <dotted config field>=<value> (e.g. --set "
                      f"num_rounds=10), got {text!r}.")
  return field.strip(), value.strip()


def _parse_value(raw: str, current: Any) -> Any:
  """Like ml_collections' flag overrides: a string field takes the text as is, other
  fields a Python literal (true/false accepted for booleans), else the text."""
  if isinstance(current, str):
    return raw
  if raw.lower() in ("true", "false"):
    return raw.lower() == "true"
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Sets each "dotted.field=value" on `config`; ConfigError for an unknown field or a bad type."""
  for text in overrides:
    field, raw = parse_override(text)
    node, parts = config, field.split(".")
    for depth, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        where = ".".join(parts[:depth]) or "the config"
        choices = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        close = difflib.get_close_matches(part, choices, n=1)
        hint = f"; did you mean {'.'.join(parts[:depth] + close[:1])!r}?" if close else ""
        raise ConfigError(f"--set {text}: {where} has no field {part!r}{hint}")
      if depth < len(parts) - 1:
        node = node[part]
    value = _parse_value(raw, node[parts[-1]])
    try:
      node[parts[-1]] = value
    except (TypeError, ValueError) as error:
      raise ConfigError(f"--set {text}: cannot set config.{field} (now "
                        f"{node[parts[-1]]!r}) to {value!r}: {error}") from None


def significant_overrides(overrides: Sequence[str],
                          config: ml_collections.ConfigDict) -> list[str]:
  """The overrides of fields that change results (not logging, caching, ...)."""
  neutral = workdir_lib.allowed_changes(config)
  return [o for o in overrides
          if not any(parse_override(o)[0] == f or parse_override(o)[0].startswith(f + ".")
                     for f in neutral)]


def add_alias_arguments(parser: argparse.ArgumentParser) -> None:
  """The arguments experiments/benchmark.py and rounds_benchmark.py share: --seeds, --quick,
  --workdir (the results directory), --set (as `overrides`), --verbose."""
  parser.add_argument("--seeds", default="0", help="comma-separated integers, default: 0")
  parser.add_argument("--quick", action="store_true", help="the quick scale (_quick configs)")
  parser.add_argument("--workdir", default=str(cells_lib.DEFAULT_RESULTS),
                      help="the results directory, default: results/")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="config override, repeatable")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of configuration, data and workdir errors")


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
            run_args: Callable[[argparse.Namespace, Callable[[str], None]], Any]) -> int:
  """A runner's `main`: parses `argv`, sets up logging, reports user errors in one line.

  Args:
    parser: the runner's parser (with a --verbose flag).
    argv: the command-line arguments (None: sys.argv[1:]).
    run_args: called as run_args(args, echo) with the parsed arguments and a
      print that flushes.

  Returns:
    The exit status: 0, or 1 after printing "error: <message>" to stderr for a
    `UserError` (re-raised with --verbose or FEDJAX_HET_TRACEBACK=1).
  """
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                      datefmt="%H:%M:%S")
  # Messages a normal run does not need: JAX probing for backends this machine lacks.
  for name in ("jax._src.xla_bridge", "jax._src.xla_bridge.backends"):
    logging.getLogger(name).setLevel(logging.WARNING)
  try:
    run_args(args, lambda line: print(line, flush=True))
  except UserError as error:
    if wants_traceback(args.verbose):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  return 0

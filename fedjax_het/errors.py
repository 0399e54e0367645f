"""Errors in what the user asked for: a config field, the data, the workdir.

Each message names what is wrong and what is allowed. `experiments/train.py`
prints such an error as one line and exits with status 1 (the traceback only
with `--verbose` or `FEDJAX_HET_TRACEBACK=1`); any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
  """Base class: the run cannot start or go on as configured."""


class ConfigError(UserError, ValueError):
  """A config field has a value that is not allowed (the message names the field)."""


class WorkdirError(UserError):
  """The workdir cannot hold this run (it is a file, or holds a different run)."""


class RoundTooLargeError(UserError, MemoryError):
  """One round needs more memory than the device has (XLA memory analysis)."""


class DivergedError(UserError, FloatingPointError):
  """Training produced a non-finite loss, metric or parameter (`config.on_nonfinite`)."""

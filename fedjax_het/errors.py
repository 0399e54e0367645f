"""Errors in what the user asked for: a config field, the data, the workdir.

Each message names what is wrong and what is allowed. `experiments/train.py`
prints such an error as one line and exits with status 1 (the traceback only
with `--verbose` or `FEDJAX_HET_TRACEBACK=1`); any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import os


#: Set (to anything but "" or "0") to keep the traceback of a `UserError`, as --verbose does.
TRACEBACK_ENV = "FEDJAX_HET_TRACEBACK"


def wants_traceback(verbose: bool = False) -> bool:
  """Whether a command shows a `UserError`'s traceback instead of its one line: `verbose`
  (the command's --verbose) or FEDJAX_HET_TRACEBACK set to anything but "" or "0"."""
  return bool(verbose) or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


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


class RunStopped(KeyboardInterrupt):
  """Ctrl-C or SIGTERM stopped the run; `round` is the last round trained, `checkpoint` the
  round of the newest checkpoint written (a rerun resumes from it)."""

  def __init__(self, round_index: int, checkpoint: int | None):
    super().__init__(round_index, checkpoint)
    self.round = round_index
    self.checkpoint = checkpoint


def os_error_line(error: OSError) -> str:
  """An operating-system error (a full disk, a path that cannot be written) as one line naming
  the path and what to do."""
  path = f" {error.filename!r}" if error.filename else ""
  if error.errno == errno.ENOSPC:
    return (f"no space left on the device writing{path}; free some space and rerun the same "
            "command to resume from the latest checkpoint.")
  reason = error.strerror or type(error).__name__
  return f"cannot use{path}: {reason}; pass a --workdir you can write to."

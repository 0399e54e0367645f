"""Errors in what the user asked for (a config field, the data, the workdir), errors of the
storage a run writes to, and how Ctrl-C and SIGTERM stop a run.

Each message names what is wrong and what is allowed. `experiments/train.py`
prints such an error as one line and exits with status 1 (the traceback only
with `--verbose` or `FEDJAX_HET_TRACEBACK=1`); any other exception is a bug and
keeps its traceback.

Stopping: `experiments/train.py` makes `on_stop_signal` the handler of SIGINT and SIGTERM.
It raises `KeyboardInterrupt` where the run is, except inside `held_stop()`, the
trainer's sections that must not be cut (a checkpoint write: starting it, and waiting for
the one under way to finish): there the signal is held until the section ends, and a
second signal raises `StopForced` at once (the write under way is then discarded: the
next start removes its unfinished folder).

A `KeyboardInterrupt` raised while Python runs a `__del__` method or a weakref callback
is printed as "Exception ignored in ..." and dropped (CPython's rule for exceptions in
finalizers); the handler therefore also records the signal, and the trainer calls
`raise_dropped_stop()` between its steps: a stop is never lost to a finalizer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Iterator
from typing import Any


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


class StorageError(UserError):
  """A write into the workdir failed: a full disk, a path that cannot be written. `path` is
  the path the write failed on (None when unknown), `error_number` its errno."""

  def __init__(self, message: str, *, path: str | None = None,
               error_number: int | None = None):
    super().__init__(message)
    self.path = path
    self.error_number = error_number

  @property
  def reason(self) -> str:
    return str(self)


class RunStopped(KeyboardInterrupt):
  """Ctrl-C or SIGTERM stopped the run; `round` is the last round trained, `checkpoint` the
  round of the newest checkpoint on disk (a rerun resumes from it; None: none yet).
  `phase`: "training" (in or before a round), "results" (after the last round, while the
  results were written); `discarded`: the round of a checkpoint write a second signal cut
  short (None when none was); `in_flight`: the stop came while a round was computing on the
  device (its result is dropped; the process exits without waiting for it)."""

  def __init__(self, round_index: int, checkpoint: int | None, *, phase: str = "training",
               started: int | None = None, discarded: int | None = None,
               in_flight: bool = False):
    super().__init__(round_index, checkpoint)
    self.round = round_index
    self.checkpoint = checkpoint
    self.phase = phase
    self.started = round_index if started is None else started
    self.discarded = discarded
    self.in_flight = in_flight


class StopForced(KeyboardInterrupt):
  """A second Ctrl-C or SIGTERM while the first was held (`held_stop`)."""


_held = 0                    # depth of held_stop() sections (main thread only)
_pending: int | None = None  # the signal that arrived inside one
_raised: int | None = None   # a signal raised as KeyboardInterrupt and not yet handled


def on_stop_signal(signum: int, frame: Any) -> None:
  """The handler of SIGINT and SIGTERM: `KeyboardInterrupt`, held inside `held_stop()` (a
  second signal there raises `StopForced`)."""
  del frame
  global _pending, _raised
  if _held:
    if _pending is not None:
      raise StopForced(signum)
    _pending = signum
    return
  _raised = signum
  raise KeyboardInterrupt(signum)


def raise_dropped_stop() -> None:
  """Raises `KeyboardInterrupt` again for a stop signal whose `KeyboardInterrupt` did not
  reach the caller (raised inside a finalizer, where Python prints and drops it); nothing
  when no stop signal is unhandled."""
  if _raised is not None:
    raise KeyboardInterrupt(_raised)


def unraisable_hook(unraisable: Any) -> None:
  """`sys.unraisablehook` of the command: a stop's `KeyboardInterrupt` dropped in a finalizer
  is silent (`raise_dropped_stop` raises it again); anything else is reported as Python
  does."""
  if isinstance(unraisable.exc_value, KeyboardInterrupt) and _raised is not None:
    return
  sys.__unraisablehook__(unraisable)


def stop_handled() -> None:
  """The stop signal raised last has been caught by the code that ends the run."""
  global _raised
  _raised = None


_STOPPING = 0  # `_pending` while a section runs on behalf of a stop already under way


@contextlib.contextmanager
def held_stop(*, stopping: bool = False) -> Iterator[None]:
  """A section that a stop signal does not cut: a signal inside it is raised as
  `KeyboardInterrupt` when the section ends (unless the section raised an error of its
  own); a second one raises `StopForced` at once. `stopping`: the section runs because a
  stop is under way (the trainer waiting for a checkpoint write before it exits), so the
  next signal is the second one. Only where `on_stop_signal` handles the signals (the
  command line); elsewhere Python's own handler raises at once."""
  global _held, _pending
  _held += 1
  if stopping and _pending is None:
    _pending = _STOPPING
  try:
    yield
  except BaseException:
    _held -= 1
    if not _held:
      _pending = None
    raise
  _held -= 1
  if not _held and _pending is not None:
    signum, _pending = _pending, None
    if signum != _STOPPING:
      raise KeyboardInterrupt(signum)


#: Tensorstore's words for the errors of a write, as orbax raises them (a `ValueError`).
_STORAGE_CODES = {"RESOURCE_EXHAUSTED": errno.ENOSPC, "PERMISSION_DENIED": errno.EACCES}
_STORAGE_WORDS = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                  "Permission denied": errno.EACCES, "Read-only file system": errno.EROFS}


def storage_error(error: BaseException) -> StorageError | None:
  """`error` (or an error it was raised from) as a `StorageError` naming the path, when it is
  an operating-system error of a path (an `OSError` with an errno) or orbax's `ValueError`
  of a write that tensorstore could not make ("RESOURCE_EXHAUSTED: ... Failed writing:
  "<path>": ... No space left on device [os_error_code='28']"); None otherwise. The path is
  the first one an error of the chain names (None when none does)."""
  found: tuple[int, str | None, str | None] | None = None  # (errno, path, strerror)
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, StorageError):
      return error
    number, path, strerror = None, None, None
    if isinstance(error, OSError) and error.errno is not None:
      number, path, strerror = error.errno, error.filename, error.strerror
    elif isinstance(error, (ValueError, RuntimeError)):
      text = str(error)
      code = re.search(r"os_error_code='(\d+)'", text)
      words = next((n for word, n in _STORAGE_WORDS.items() if word in text), None)
      number = (int(code.group(1)) if code else words
                or next((n for c, n in _STORAGE_CODES.items() if text.startswith(c)), None))
      if number is not None:
        match = re.search(r'Failed writing: "([^"]+)"', text) or re.search(r'"(/[^"]+)"', text)
        path = match.group(1) if match else None
    if number is not None:
      if found is None:
        found = (number, path, strerror)
      elif found[1] is None and path is not None:
        found = (found[0], path, found[2])
      if found[1] is not None:
        break
    error = error.__cause__ or error.__context__
  if found is None:
    return None
  number, path, strerror = found
  return StorageError(_storage_reason(number, path, strerror or os.strerror(number)),
                      path=path, error_number=number)


def _storage_reason(number: int, path: str | None, strerror: str | None) -> str:
  where = f" {str(path)!r}" if path else ""
  if number in (errno.ENOSPC, errno.EDQUOT):
    return f"no space left on the device writing{where}"
  return f"cannot write{where}: {strerror or os.strerror(number)}"


def storage_advice(error_number: int | None) -> str:
  """What to do before rerunning, for a storage error's errno."""
  if error_number in (errno.ENOSPC, errno.EDQUOT):
    return "free some space"
  return "make the folder writable"


def os_error_line(error: OSError) -> str:
  """An operating-system error (a full disk, a path that cannot be written) as one line naming
  the path and what to do."""
  path = f" {error.filename!r}" if error.filename else ""
  if error.errno == errno.ENOSPC:
    return (f"no space left on the device writing{path}; free some space and rerun the same "
            "command to resume from the latest checkpoint.")
  reason = error.strerror or type(error).__name__
  return f"cannot use{path}: {reason}; pass a --workdir you can write to."

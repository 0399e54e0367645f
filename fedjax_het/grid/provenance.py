"""cell.json: who trained a cell, with which code, on which device, for how long.

Beside each cell's own files the grid keeps `cell.json`: its status ("running",
"finished", "interrupted"; "killed" for an invocation whose process died without
recording its end, its seconds then those up to its last heartbeat), the wall time
spent on it over all invocations, and the device kind, commit and --set overrides of
the runs that trained it. A cell trained from a working tree with uncommitted changes
keeps their patch beside it (PATCH_FILE).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het import workdir as workdir_lib
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import progress
from fedjax_het.reports import document

#: The cell's record beside its run's files.
CELL_FILE = document.CELL_FILE

#: What a cell's code is: every tracked file but the results the runner itself writes.
CODE_PATHSPEC = (".", ":(exclude)results")


def git_commit() -> tuple[str | None, bool]:
  """(HEAD's commit or None, whether tracked files outside results/ differ from it)."""
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cells_lib.REPO,
                            capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHSPEC], cwd=cells_lib.REPO, capture_output=True,
                                text=True, timeout=20, check=True).stdout.strip())
    return commit or None, dirty
  except (OSError, subprocess.SubprocessError):
    return None, False


#: The file beside a cell trained from a working tree with uncommitted changes: `git diff HEAD`
#: of the tracked files outside results/, so the cell's commit plus this patch pins its code.
PATCH_FILE = "patch.diff"


def code_state(cell_dirs: Sequence[pathlib.Path]) -> dict[str, Any]:
  """{"commit", "dirty"} of the code about to train, and with uncommitted changes the patch:
  written as PATCH_FILE into every one of `cell_dirs`, its SHA-256 as "patch_sha256"."""
  commit, dirty = git_commit()
  state: dict[str, Any] = {"commit": commit, "dirty": dirty}
  if not dirty:
    return state
  try:
    patch = subprocess.run(["git", "diff", "--binary", "HEAD", "--", *CODE_PATHSPEC],
                           cwd=cells_lib.REPO, capture_output=True, timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return state
  for cell_dir in cell_dirs:
    cell_dir.mkdir(parents=True, exist_ok=True)
    workdir_lib.write_atomic(cell_dir / PATCH_FILE, patch.decode("utf-8", "surrogateescape"))
  state["patch_sha256"] = hashlib.sha256(patch).hexdigest()
  return state


def _cpu_name() -> str | None:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return None


def device_info() -> dict[str, Any]:
  """{"device_kind" (jax.devices()[0].device_kind, with the CPU model on a CPU), "backend",
  "device_count"} of this process (starts JAX's backend)."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  kind = device.device_kind
  if jax.default_backend() == "cpu" and _cpu_name():
    kind = f"{kind} ({_cpu_name()}, {os.cpu_count()} cores)"
  return {"device_kind": kind, "backend": jax.default_backend(),
          "device_count": jax.device_count()}


def now() -> str:
  """The UTC time to the second, ISO 8601."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


#: Seconds between two updates of a training invocation's seconds in cell.json (its
#: heartbeat): an invocation killed without recording its end keeps its time up to the last.
HEARTBEAT_SECS = 30.0
_CELL_RECORD_LOCK = threading.Lock()  # the heartbeat thread and the trainer's updates


def _process_gone(entry: Mapping[str, Any]) -> bool:
  """Whether the process of a "running" invocation entry is gone: its PID runs no process on
  this host (an entry without a PID, written before PIDs were recorded, counts as gone; one
  from another host is left as it is)."""
  pid, host = entry.get("pid"), entry.get("host")
  if pid is None:
    return True
  if host != socket.gethostname():
    return False
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return True
  except OSError:  # it exists and belongs to someone else
    return False
  return False


def unpinned(record: Mapping[str, Any]) -> bool:
  """Whether no commit pins the code of a cell's `record` (its cell.json): one of its
  invocations trained it from a working tree with uncommitted changes and kept no patch.
  `reproduce.py --list` counts such cells and `--retrain-unpinned` trains them again."""
  return any(e.get("dirty") and not e.get("patch_sha256")
             for e in (record, *record.get("invocations", [])))


def update_cell_record(cell_dir: pathlib.Path, meta: Mapping[str, Any], *, status: str,
                       seconds: float | None = None, new_invocation: bool = False,
                       extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Writes cell.json: `meta` (table, cell, row, ...), the status, and this invocation's
  entry (added with `new_invocation`, else the last one updated) with its seconds; the
  cell's "seconds" are the sum over its invocations. A new invocation marks the one before
  it "killed" when that one is still "running" and its process is gone (a kill -9, a
  crash): its seconds are those of its last heartbeat (`train_recorded`). The top-level
  "commit", "dirty" and "patch_sha256" are the last invocation's; "stacked_seeds" is set once
  any invocation trained the cell's seed inside a vmapped program of several seeds."""
  with _CELL_RECORD_LOCK:
    return _update_cell_record(cell_dir, meta, status=status, seconds=seconds,
                               new_invocation=new_invocation, extra=extra)


def _update_cell_record(cell_dir: pathlib.Path, meta: Mapping[str, Any], *, status: str,
                        seconds: float | None, new_invocation: bool,
                        extra: Mapping[str, Any] | None) -> dict[str, Any]:
  record = progress.read_json(cell_dir / CELL_FILE) or {}
  record.update(meta)
  invocations = list(record.get("invocations", []))
  if new_invocation or not invocations:
    if (invocations and invocations[-1].get("status") == "running"
        and _process_gone(invocations[-1])):
      invocations[-1] = {**invocations[-1], "status": "killed"}
    invocations.append({"start": now()})
  entry = dict(invocations[-1])
  entry["status"] = status
  if seconds is not None:
    entry["seconds"] = round(float(seconds), 3)
  entry.update(extra or {})
  invocations[-1] = entry
  record["invocations"] = invocations
  record["status"] = status
  timed = [i["seconds"] for i in invocations if i.get("seconds") is not None]
  record["seconds"] = round(sum(timed), 3) if timed else None
  for key in ("device_kind", "backend", "device_count", "commit", "dirty", "patch_sha256",
              "stacked_seeds"):
    if key in entry:
      record[key] = entry[key]
  if "commit" in entry and "patch_sha256" not in entry:  # the last invocation's code was clean
    record.pop("patch_sha256", None)
  cell_dir.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_atomic(cell_dir / CELL_FILE,
                           json.dumps(record, indent=2, ensure_ascii=False) + "\n")
  return record


def cell_meta(cell: cells_lib.Cell, significant: Sequence[str], custom: bool
              ) -> dict[str, Any]:
  """What cell.json says the cell is: its table, setting, row, seed, scale, config file and
  variant, row fields, significant --set overrides and whether a `configure` changed it."""
  return {"table": cell.owner, "cell": cell.name, "label": cell.label, "scale": cell.scale,
          "setting": cell.setting.key, "row": cell.row.key, "seed": cell.seed,
          "config_file": cell.row.config or cell.setting.config,
          "variant": cell.row.config_variant(cell.scale),
          "row_fields": dict(cell.row.fields(cell.scale)), "overrides": list(significant),
          "custom_configure": custom}

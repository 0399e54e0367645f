"""The resumable grid of cells behind `experiments/reproduce.py` (and its three aliases).

A cell is one ordinary training run: a row (method or variant) of a table
(`fedjax_het.reports.tables`) in one of its settings, with one seed, at one
scale ("quick": the `_quick` configs; "paper": the paper-scale configs). Its
workdir is `results/<table>/<scale>/<cell>/`, cell = `<row>__seed<s>` (with
`<setting>__` in front when the table has several settings).

`run(cells, ...)` builds every cell's config first (so a bad override fails
before anything trains), then for each cell in order:
  * skips it when it is finished: results.json exists, metrics.jsonl reaches
    the config's last round and run.json records the same config (a finished
    cell with another config stops the grid, naming the differing fields);
  * otherwise trains it with `train_cell`, which resumes an interrupted cell
    from its latest checkpoint (the trainers' own resume);
  * then rewrites the table's table.md / table.json / figures
    (`reports.document`) from what the results directory holds.
Beside each cell's own files it keeps `cell.json`: its status ("running",
"finished", "interrupted"; "killed" for an invocation whose process died without
recording its end, its seconds then those up to its last heartbeat), the wall time
spent on it over all invocations,
and the device kind, commit and --set overrides of the runs that trained it.
Each invocation appends what it did to `<results>/invocations.jsonl`.

With a deadline (`deadline_secs`), each cell trains in a child process
(`python -m fedjax_het.grid`); no cell starts with less than `min_cell_secs`
left, and the running one is stopped at the deadline (SIGTERM, then SIGKILL):
its checkpoints stay, it is recorded "interrupted", and the next invocation
resumes it. This is the GPU command's mode: the run never outlives its budget
and every finished cell's files are written as soon as it finishes
(`copy_to` mirrors them, and an interrupted cell's checkpoints, into another
directory).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import functools
import hashlib
import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from fedjax_het import configs as configs_lib
from fedjax_het import workdir as workdir_lib
from fedjax_het.config import load_module
from fedjax_het.errors import (ConfigError, RoundTooLargeError, UserError, WorkdirError,
                               wants_traceback)
from fedjax_het.reports import document
from fedjax_het.reports import tables as tables_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "results"
CELL_FILE = document.CELL_FILE
INVOCATIONS_FILE = "invocations.jsonl"
CLASS_INCREMENTAL = "class_incremental"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One (table, setting, row, seed, scale) of the grid."""
  table: tables_lib.Table
  setting: tables_lib.Setting
  row: tables_lib.Row
  seed: int
  scale: str

  @property
  def name(self) -> str:
    return tables_lib.cell_name(self.table, self.setting, self.row, self.seed)

  @property
  def owner(self) -> str:
    """The table id whose directory holds the cell."""
    return tables_lib.cells_table_id(self.table, self.setting)

  @property
  def label(self) -> str:
    return f"{self.table.id}/{self.scale}/{self.name}"

  def directory(self, results_dir: pathlib.Path) -> pathlib.Path:
    return tables_lib.cell_dir(pathlib.Path(results_dir), self.table, self.setting, self.row,
                               self.seed, self.scale)


def plan(table: tables_lib.Table, scale: str, seeds: Sequence[int],
         rows: Sequence[str] | None = None, settings: Sequence[str] | None = None
         ) -> list[Cell]:
  """The table's cells in training order: seeds, then settings, then rows (a complete
  table for the first seed before the next seed's cells)."""
  if scale not in table.scales:
    raise ConfigError(f"--scale={scale!r} is not allowed for table {table.id}; allowed scales: "
                      f"{', '.join(table.scales)}.")
  known = [s.key for s in table.settings]
  unknown = [s for s in settings or () if s not in known]
  if unknown:
    raise ConfigError(f"--settings: unknown setting(s) {', '.join(map(repr, unknown))} of "
                      f"table {table.id}; allowed: {', '.join(known)}.")
  wanted = tables_lib.select_rows(table, rows)
  return [Cell(table, setting, row, int(seed), scale) for seed in seeds
          for setting in table.settings if not settings or setting.key in settings
          for row in setting.rows if row.key in wanted]


def queue_plan(name: str, scale: str, seeds: Sequence[int]) -> list[Cell]:
  """The cells of a prepared queue (`tables.QUEUES`): per seed, its tables in order."""
  if name not in tables_lib.QUEUES:
    raise ConfigError(f"--queue={name!r} is not allowed; allowed queues: "
                      f"{', '.join(tables_lib.QUEUES)}.")
  cells = []
  for seed in seeds:
    for table_id, rows in tables_lib.QUEUES[name]:
      table = tables_lib.get_table(table_id)
      for row in rows or table.row_keys:  # the queue's order of rows
        cells += plan(table, scale, [seed], [row])
  return cells


# --- arguments and overrides --------------------------------------------------------------


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


# --- configs ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def load_config_file(name: str) -> Any:
  """A config module: a family of `fedjax_het.configs` ("digits"), or a config file (a path
  relative to the repository, or absolute) loaded once."""
  if (CONFIGS_DIR / f"{name}.py").is_file():
    return configs_lib.module(name)
  return load_module(REPO / name)


def cell_config(cell: Cell, overrides: Sequence[str] = (),
                configure: Callable[[ml_collections.ConfigDict, Cell], None] | None = None
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
  apply_overrides(config, overrides)
  if configure is not None:
    configure(config, cell)
  return config


def expected_rounds(config: ml_collections.ConfigDict) -> int:
  """The rounds a finished run of `config` has trained."""
  if config.get("scenario", {}).get("name") == CLASS_INCREMENTAL:
    return int(config.scenario.num_tasks) * int(config.cil.rounds_per_task)
  return int(config.num_rounds)


def _read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def rounds_done(cell_dir: pathlib.Path) -> int:
  """The last round metrics.jsonl records (0 without one)."""
  return max((int(r["round"]) for r in document.read_records(cell_dir)), default=0)


def _stand_ins(config: ml_collections.ConfigDict,
               recorded: Mapping[str, Any]) -> dict[str, str]:
  """The recorded data sources of the digit domains that `config` gives the synthetic
  stand-in as well (read off the bundle's keys, `data.is_synthetic_stand_in`): a changed
  `scenario.sources.<domain>` with the same stand-in on both sides is the same cell."""
  sources = config.get("scenario", {}).get("sources")
  if not sources:
    return {}
  from fedjax_het.data import scenarios  # pylint: disable=g-import-not-at-top (numpy-heavy)
  recorded_sources = recorded.get("data", {}).get("sources", {})
  data_dir = config.scenario.get("data_dir") or None
  fallback = bool(config.scenario.get("synthetic_fallback", False))
  return {domain: recorded_sources[domain] for domain, source in sources.items()
          if str(recorded_sources.get(domain, "")).startswith("synthetic(")
          and scenarios.is_synthetic_stand_in(domain, source, data_dir=data_dir,
                                             synthetic_fallback=fallback)}


def is_finished(cell_dir: pathlib.Path, config: ml_collections.ConfigDict) -> bool:
  """True for a cell whose run completed `expected_rounds(config)` (results.json written).

  Raises WorkdirError when it finished with a different config (the data are
  not fingerprinted again here; the trainers check them on a resume).
  """
  if not (cell_dir / "results.json").exists():
    return False
  if rounds_done(cell_dir) < expected_rounds(config):
    return False
  recorded = _read_json(cell_dir / workdir_lib.RUN_FILE)
  if recorded is not None:
    # Compare the configs only: the same (absent) fingerprint on both sides.
    lines = workdir_lib.differences(
        {"config": recorded.get("config", {}),
         "data": {"sources": recorded.get("data", {}).get("sources", {})}},
        {"config": workdir_lib.flatten_config(config),
         "data": {"fingerprint": None, "sources": _stand_ins(config, recorded)}},
        workdir_lib.allowed_changes(config))
    if lines:
      listing = "\n  ".join(lines)
      raise WorkdirError(
          f"cell {str(cell_dir)!r} holds a finished run with a different config:\n  {listing}\n"
          "Delete that directory to retrain the cell, or pass another --results-dir.")
  return True


def cell_status(cell_dir: pathlib.Path, config: ml_collections.ConfigDict) -> str:
  """"finished", "partial (round r of N)", "different config" or "-" (not started)."""
  try:
    if is_finished(cell_dir, config):
      return "finished"
  except WorkdirError:
    return "different config"
  done = rounds_done(cell_dir)
  if done or (cell_dir / "checkpoints").is_dir():
    return f"partial (round {done} of {expected_rounds(config)})"
  return "-"


# --- training one cell ------------------------------------------------------------------------


def train_cell(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Any:
  """Trains (or resumes) one cell with the one trainer."""
  from fedjax_het.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  return train_and_evaluate(config, workdir)


#: What a cell's code is: every tracked file but the results the runner itself writes.
CODE_PATHSPEC = (".", ":(exclude)results")


def git_commit() -> tuple[str | None, bool]:
  """(HEAD's commit or None, whether tracked files outside results/ differ from it)."""
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                            text=True, timeout=20, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHSPEC], cwd=REPO, capture_output=True, text=True,
                                timeout=20, check=True).stdout.strip())
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
                           cwd=REPO, capture_output=True, timeout=60, check=True).stdout
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


def _now() -> str:
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
  record = _read_json(cell_dir / CELL_FILE) or {}
  record.update(meta)
  invocations = list(record.get("invocations", []))
  if new_invocation or not invocations:
    if (invocations and invocations[-1].get("status") == "running"
        and _process_gone(invocations[-1])):
      invocations[-1] = {**invocations[-1], "status": "killed"}
    invocations.append({"start": _now()})
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


def train_recorded(config: ml_collections.ConfigDict, cell_dir: pathlib.Path,
                   meta: Mapping[str, Any],
                   train: Callable[[ml_collections.ConfigDict, pathlib.Path], Any] | None = None
                   ) -> str:
  """Trains one cell and keeps its cell.json: "running" while it trains (its seconds updated
  every `HEARTBEAT_SECS`, with the PID and host that say whether it still runs), then
  "finished" (or "stopped" when the trainer returned before the last round). Returns the
  status."""
  tick = time.perf_counter()
  update_cell_record(cell_dir, meta, status="running", new_invocation=True,
                     extra={**code_state([cell_dir]), "pid": os.getpid(),
                            "host": socket.gethostname()})
  stop = threading.Event()

  def heartbeat() -> None:
    while not stop.wait(HEARTBEAT_SECS):
      try:
        update_cell_record(cell_dir, meta, status="running",
                           seconds=time.perf_counter() - tick)
      except OSError:  # a full disk: the next beat, or the end, records the time
        pass

  beat = threading.Thread(target=heartbeat, name="cell_heartbeat", daemon=True)
  beat.start()
  try:
    (train or train_cell)(config, cell_dir)
  except BaseException as error:
    stop.set()
    beat.join()
    update_cell_record(cell_dir, meta, seconds=time.perf_counter() - tick,
                       status="interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
    raise
  stop.set()
  beat.join()
  update_cell_record(cell_dir, meta, status="running", extra=device_info())
  status = "finished" if is_finished(cell_dir, config) else "stopped"
  update_cell_record(cell_dir, meta, status=status, seconds=time.perf_counter() - tick)
  return status


#: The exit status of a child whose seeds cannot train as one program (nothing trained).
NOT_STACKED = 4


def _child_main(spec_path: str) -> int:
  """`python -m fedjax_het.grid <spec>`: trains the pickled cell of a deadline run, or (a
  spec with "group") a row's fresh seeds as one program; NOT_STACKED when they cannot be."""
  spec = pickle.loads(pathlib.Path(spec_path).read_bytes())
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                      datefmt="%H:%M:%S")
  from fedjax_het.engine import xla_cpu  # pylint: disable=g-import-not-at-top
  first = spec["configs"][spec["group"][0]] if "group" in spec else spec["config"]
  xla_cpu.set_xla_cpu_scheduler(first.get("xla_cpu_scheduler", "auto"))
  try:
    if "group" in spec:
      stacked = _train_stacked(spec["group"], spec["configs"], pathlib.Path(spec["results_dir"]),
                               spec["overrides"], spec["custom"], {}, spec["label"],
                               lambda line: print(line, flush=True))
      return 0 if stacked else NOT_STACKED
    train_recorded(spec["config"], pathlib.Path(spec["cell_dir"]), spec["meta"])
  except UserError as error:
    pathlib.Path(spec_path + ".error").write_text(str(error))
    return 3
  return 0


def _run_child(spec: Mapping[str, Any], timeout: float) -> tuple[int | None, str | None, float]:
  """Runs `python -m fedjax_het.grid` on the pickled `spec` for at most `timeout` seconds:
  (its exit status, None when the deadline stopped it; its UserError's message or None;
  its seconds)."""
  with tempfile.TemporaryDirectory(prefix="fedjax_het_cell_") as tmp:
    path = pathlib.Path(tmp) / "cell.pkl"
    path.write_bytes(pickle.dumps(dict(spec)))
    tick = time.perf_counter()
    # The child imports this package from the same checkout, wherever the command started.
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    child = subprocess.Popen([sys.executable, "-m", "fedjax_het.grid", str(path)],
                             env={**os.environ, "PYTHONPATH": python_path})
    try:
      code = child.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
      child.send_signal(signal.SIGTERM)
      try:
        child.wait(timeout=15)
      except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
      return None, None, time.perf_counter() - tick
    error = pathlib.Path(str(path) + ".error")
    return code, error.read_text() if error.exists() else None, time.perf_counter() - tick


def _train_in_child(config: ml_collections.ConfigDict, cell_dir: pathlib.Path,
                    meta: Mapping[str, Any], *, timeout: float, echo: Callable[[str], None]
                    ) -> str:
  """Trains the cell in a child process stopped after `timeout` seconds; its status."""
  code, error, seconds = _run_child({"config": config, "cell_dir": str(cell_dir),
                                     "meta": dict(meta)}, timeout)
  if code is None:
    echo(f"{meta['label']}: stopped at the deadline after {seconds:.1f} s "
         "(its checkpoints stay; rerun to resume)")
    update_cell_record(cell_dir, meta, status="interrupted", seconds=seconds)
    return "interrupted"
  if error is not None:
    update_cell_record(cell_dir, meta, status="failed", seconds=seconds)
    raise UserError(f"{meta['label']}: {error}")
  if code != 0:
    update_cell_record(cell_dir, meta, status="failed", seconds=seconds)
    raise RuntimeError(f"{meta['label']}: its training process exited with status {code} "
                       "(its output is above)")
  record = _read_json(cell_dir / CELL_FILE) or {}
  return str(record.get("status", "stopped"))


def _train_stacked_in_child(group: Sequence[Cell], configs: Mapping[Cell, Any],
                            results_dir: pathlib.Path, overrides: Sequence[str], custom: bool,
                            statuses: dict[str, str], label: str, *, timeout: float,
                            echo: Callable[[str], None]) -> str:
  """`_train_stacked` in a child process stopped after `timeout` seconds: "trained",
  "interrupted" (each seed's checkpoints stay; the next invocation resumes the seeds one by
  one) or "not stacked" (nothing trained: the seeds train one by one)."""
  code, error, seconds = _run_child(
      {"group": list(group), "configs": {c: configs[c] for c in group},
       "results_dir": str(results_dir), "overrides": list(overrides), "custom": custom,
       "label": label}, timeout)
  metas = [_meta(c, significant_overrides(overrides, configs[c]), custom) for c in group]
  if code == NOT_STACKED:
    return "not stacked"
  if code is None:
    echo(f"{label}: seeds {', '.join(str(c.seed) for c in group)} stopped at the deadline "
         f"after {seconds:.1f} s (their checkpoints stay; rerun to resume)")
    for cell, meta in zip(group, metas):
      if cell.directory(results_dir).exists():
        update_cell_record(cell.directory(results_dir), meta, status="interrupted")
      statuses[cell.label] = "interrupted"
    return "interrupted"
  if error is not None or code != 0:
    raise (UserError(f"{label}: {error}") if error is not None else RuntimeError(
        f"{label}: its training process exited with status {code} (its output is above)"))
  for cell in group:
    statuses[cell.label] = "trained"
  return "trained"


# --- the grid -----------------------------------------------------------------------------------


def check_targets(configs: Mapping[Cell, ml_collections.ConfigDict]) -> None:
  """ConfigError when the cells of one partitioned setting have different eval.targets (the
  rounds-to-target table needs the same ones)."""
  seen: dict[tuple[str, str], tuple[str, tuple[float, ...]]] = {}
  for cell, config in configs.items():
    if cell.table.family != "partitioned":
      continue
    targets = tuple(float(t) for t in config.eval.targets)
    key = (cell.owner, cell.setting.key)
    first = seen.setdefault(key, (config.name, targets))
    if first[1] != targets:
      raise ConfigError(f"the cells' eval.targets differ ({first[0]}: {first[1]}; "
                        f"{config.name}: {targets}): the rounds table needs the same targets.")


def _meta(cell: Cell, significant: Sequence[str], custom: bool) -> dict[str, Any]:
  return {"table": cell.owner, "cell": cell.name, "label": cell.label, "scale": cell.scale,
          "setting": cell.setting.key, "row": cell.row.key, "seed": cell.seed,
          "config_file": cell.row.config or cell.setting.config,
          "variant": cell.row.config_variant(cell.scale),
          "row_fields": dict(cell.row.fields(cell.scale)), "overrides": list(significant),
          "custom_configure": custom}


def _summary_line(cell: Cell, cell_dir: pathlib.Path) -> str:
  results = _read_json(cell_dir / "results.json") or {}
  if cell.table.family == "class_incremental":
    avg = results.get("average_incremental_accuracy")
    return "Avg. (no task finished)" if avg is None else f"Avg. {100 * avg:.1f}"
  shown = [f"{k} {results[k]['AVG']:.2f}" for k in ("inter", "intra", "accuracy")
           if "AVG" in results.get(k, {})]
  reached = ", ".join(f"{k}%: {'not reached' if r is None else f'round {r}'}"
                      for k, r in results.get("rounds_to_target", {}).items())
  return ("AVG " + " ".join(shown) if shown else "(no evaluation)") + (
      f", {reached}" if reached else "")


def write_outputs(table: tables_lib.Table, scale: str, results_dir: pathlib.Path, *,
                  figures: bool = True) -> pathlib.Path:
  """table.md, table.json (and the figures) of a table from what results_dir holds."""
  out = pathlib.Path(results_dir) / table.id / scale
  out.mkdir(parents=True, exist_ok=True)
  markdown, numbers = document.render(table, scale, pathlib.Path(results_dir))
  workdir_lib.write_atomic(out / "table.md", markdown)
  workdir_lib.write_atomic(out / "table.json",
                           json.dumps(numbers, indent=2, ensure_ascii=False) + "\n")
  if figures:
    document.figures(table, scale, pathlib.Path(results_dir), out)
  return out / "table.md"


def _copy(results_dir: pathlib.Path, copy_to: pathlib.Path, paths: Sequence[pathlib.Path], *,
          checkpoints: bool) -> None:
  """Mirrors `paths` (files or directories under results_dir) into copy_to/<results name>/."""
  base = pathlib.Path(results_dir)
  for path in paths:
    if not path.exists():
      continue
    target = copy_to / base.name / path.relative_to(base)
    if path.is_dir():
      ignore = None if checkpoints else shutil.ignore_patterns("checkpoints")
      if not checkpoints:  # a cell finished since an earlier copy of its checkpoints
        shutil.rmtree(target / "checkpoints", ignore_errors=True)
      shutil.copytree(path, target, dirs_exist_ok=True, ignore=ignore)
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(path, target)


# --- twins: one run shared by every table that holds the same cell --------------------------


def _recipe(setting: tables_lib.Setting, row: tables_lib.Row, scale: str) -> tuple[Any, ...]:
  """What `cell_config` builds a cell's config from, besides the seed and the overrides."""
  return (row.config or setting.config, row.config_variant(scale), row.fields(scale))


def find_twin(cell: Cell, config: ml_collections.ConfigDict,
              results_dir: pathlib.Path) -> pathlib.Path | None:
  """The directory of a finished cell of another table (or setting) that is the same run as
  `cell`: the same config file, variant at the cell's scale, row fields and seed, and a
  recorded config equal to `config` (`is_finished`, so the --set overrides must agree too).
  None when there is none. E.g. the BASE row of FCCL Tables 1/2 on Digits is the BASE row of
  FCCL+ Table VIII/IX on Digits; the quick cells of GLFC's T = 5 and 20 layouts are Table 1's."""
  own = cell.directory(results_dir)
  recipe = _recipe(cell.setting, cell.row, cell.scale)
  for table in tables_lib.TABLES.values():
    for setting in table.settings:
      for row in setting.rows:
        if _recipe(setting, row, cell.scale) != recipe:
          continue
        path = tables_lib.cell_dir(results_dir, table, setting, row, cell.seed, cell.scale)
        if path == own or not path.is_dir():
          continue
        try:
          if is_finished(path, config):
            return path
        except WorkdirError:  # the same recipe trained under other --set overrides
          continue
  return None


def copy_twin(twin: pathlib.Path, cell_dir: pathlib.Path, meta: Mapping[str, Any],
              results_dir: pathlib.Path) -> dict[str, Any]:
  """Copies a finished twin's files (not its checkpoints) into `cell_dir`. cell.json keeps
  the twin's invocations (the device, commit and wall time of the run that produced the
  numbers), adds this copy as an invocation of 0 s, and names the original run's directory
  (relative to results_dir) as `copy_of`. The copy is made beside `cell_dir` and renamed onto
  it (a fresh cell's directory holds nothing to keep), so a kill leaves no half copy."""
  staging = cell_dir.parent / f".{cell_dir.name}.copying"
  shutil.rmtree(staging, ignore_errors=True)
  shutil.copytree(twin, staging, ignore=shutil.ignore_patterns(
      "checkpoints", workdir_lib.LOCK_FILE, CELL_FILE))
  record = _read_json(twin / CELL_FILE) or {}
  source = record.get("copy_of") or twin.relative_to(results_dir).as_posix()
  record.update(meta)
  record["copy_of"] = source
  record["invocations"] = [*record.get("invocations", []),
                           {"start": _now(), "status": "finished", "seconds": 0.0,
                            "copy_of": source}]
  record["status"] = "finished"
  workdir_lib.write_atomic(staging / CELL_FILE,
                           json.dumps(record, indent=2, ensure_ascii=False) + "\n")
  shutil.rmtree(cell_dir, ignore_errors=True)
  os.replace(staging, cell_dir)
  return record


def _fresh(cell_dir: pathlib.Path) -> bool:
  return not (cell_dir / "checkpoints").is_dir() and rounds_done(cell_dir) == 0


def _seed_group(cell: Cell, later: Sequence[Cell], configs: Mapping[Cell, Any],
                results_dir: pathlib.Path,
                has_twin: Callable[[Cell], bool] = lambda cell: False) -> list[Cell]:
  """`cell` and the later fresh cells of its table, setting and row whose configs differ from
  its own only by the seed and that have no finished twin to copy (empty when `cell` itself
  is not fresh or has one)."""
  if not _fresh(cell.directory(results_dir)) or has_twin(cell):
    return []

  def without_seed(config):
    flat = workdir_lib.flatten_config(config)
    for name in ("seed", "name"):  # a cell's name carries its seed
      flat.pop(name, None)
    return flat

  key = (cell.table.id, cell.setting.key, cell.row.key, cell.scale)
  mine = without_seed(configs[cell])
  return [cell] + [c for c in later
                   if (c.table.id, c.setting.key, c.row.key, c.scale) == key
                   and c.seed != cell.seed and _fresh(c.directory(results_dir))
                   and without_seed(configs[c]) == mine and not has_twin(c)]


def _train_stacked(group: Sequence[Cell], configs: Mapping[Cell, Any],
                   results_dir: pathlib.Path, overrides: Sequence[str], custom: bool,
                   statuses: dict[str, str], label: str, echo: Callable[[str], None]) -> bool:
  """Trains `group` (one row's seeds) as one vmapped program, keeping each cell's cell.json;
  False (nothing trained) when the seeds' data differ in shape."""
  from fedjax_het.train import train_lanes  # pylint: disable=g-import-not-at-top
  dirs = [c.directory(results_dir) for c in group]
  metas = [_meta(c, significant_overrides(overrides, configs[c]), custom) for c in group]
  seeds = ", ".join(str(c.seed) for c in group)
  echo(f"{label}: training seeds {seeds} of {group[0].row.key} as one program "
       f"({expected_rounds(configs[group[0]])} rounds each)")
  code = code_state(dirs)
  started, tick = _now(), time.perf_counter()
  try:
    train_lanes([configs[c] for c in group], dirs, leaner_convs_for_seeds=False)
  except ConfigError as error:
    if "config.seeds" not in str(error):
      raise
    echo(f"{label}: {error} Training the seeds one by one.")
    return False
  except RoundTooLargeError as error:  # raised before anything trains
    echo(f"{label}: the seeds as one program do not fit ({str(error).split(';')[0]}). "
         "Training the seeds one by one.")
    return False
  except BaseException:
    for cell_dir, meta in zip(dirs, metas):
      if cell_dir.exists():
        update_cell_record(cell_dir, meta, seconds=time.perf_counter() - tick, status="failed",
                           new_invocation=True, extra={"start": started, **code})
    raise
  seconds = time.perf_counter() - tick
  for cell, cell_dir, meta in zip(group, dirs, metas):
    update_cell_record(cell_dir, meta, status="running", new_invocation=True,
                       extra={"start": started, **code, **device_info(),
                              "stacked_seeds": [c.seed for c in group]})
    status = "finished" if is_finished(cell_dir, configs[cell]) else "stopped"
    update_cell_record(cell_dir, meta, status=status, seconds=seconds)
    statuses[cell.label] = "trained"
    echo(f"  {cell.label}: trained with seeds {seeds} ({seconds:.1f} s for all), "
         f"{_summary_line(cell, cell_dir)}")
  return True


def run(cells: Sequence[Cell], *, results_dir: str | pathlib.Path = DEFAULT_RESULTS,
        overrides: Sequence[str] = (),
        configure: Callable[[ml_collections.ConfigDict, Cell], None] | None = None,
        build_config: Callable[[Cell], ml_collections.ConfigDict] | None = None,
        deadline_secs: float | None = None, min_cell_secs: float = 60.0,
        isolate: bool | None = None,
        train: Callable[[ml_collections.ConfigDict, pathlib.Path], Any] | None = None,
        copy_to: str | pathlib.Path | None = None, figures: bool = True,
        stack_seeds: bool = True, copy_twins: bool = True,
        echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains, resumes or skips every cell in order; rewrites each table's outputs after each.

  With `stack_seeds`, a fresh cell trains together with the other fresh cells of its table,
  setting and row that differ from it only by the seed: one vmapped program for those seeds
  (`fedjax_het.seed_stack`), each into its own cell (with a deadline, in one child process
  stopped at the deadline; the next invocation resumes its seeds one by one). Seeds
  whose data differ in shape, or whose program would need leaner (slower) convolutions to
  fit in memory than one seed alone, train one by one.

  A fresh cell whose run another table already holds finished (`find_twin`: the same
  config file, variant, row fields, seed and recorded config) is copied from it
  (`copy_twin`) instead of trained, with `copy_twins`.

  Args:
    cells: from `plan` or `queue_plan`.
    results_dir: the results directory (default results/ of the repository).
    overrides: "dotted.field=value" settings for every cell.
    configure: called as configure(config, cell) after the overrides (tests
      shrink the models with it); marks the cells as not the paper's setting.
    build_config: builds a cell's config instead of `cell_config` (the
      class-incremental alias passes configs built elsewhere).
    deadline_secs: stop starting cells when fewer than `min_cell_secs` remain
      of this many seconds, and stop the running one at the deadline.
    min_cell_secs: see `deadline_secs`.
    isolate: train each cell in a child process (default: with a deadline).
    train: a stand-in for `train_cell` (in-process only; tests).
    copy_to: also mirror every cell's files (checkpoints only of an
      interrupted cell), the tables' outputs and invocations.jsonl here.
    figures: write the tables' figures.
    stack_seeds: train a method's fresh seeds as one program (see above).
    copy_twins: copy a fresh cell from a finished twin in another table (see above).
    echo: where the one-line progress messages go.

  Returns:
    {"statuses": {cell label: "skipped" | "trained" | "resumed" | "copied" | "interrupted"
     | "not started"}, "tables": [table.md paths], "wall_seconds",
     "deadline_reached": bool}.
  """
  tick = time.monotonic()
  results_dir = pathlib.Path(results_dir)
  workdir_lib.check_workdir(results_dir)
  if not cells:
    raise ConfigError("no cell to run: the --methods / --settings / --seeds select none.")
  isolate = deadline_secs is not None if isolate is None else isolate
  if isolate and train is not None:
    raise ValueError("`train` stands in for the trainer in this process; it cannot be used "
                     "with `isolate` (a deadline).")
  build = build_config or (lambda cell: cell_config(cell, overrides, configure))
  # Every config is built (and every override checked) before anything trains.
  configs = {cell: build(cell) for cell in cells}
  check_targets(configs)
  custom = configure is not None or build_config is not None
  statuses: dict[str, str] = {}
  written: list[pathlib.Path] = []
  deadline_reached = False
  started = _now()
  copy_to = pathlib.Path(copy_to) if copy_to else None
  twins: dict[Cell, pathlib.Path | None] = {}

  def twin_of(cell: Cell) -> pathlib.Path | None:
    if not copy_twins or not _fresh(cell.directory(results_dir)):
      return None
    if cell not in twins:
      twins[cell] = find_twin(cell, configs[cell], results_dir)
    return twins[cell]

  try:
    for index, cell in enumerate(cells, start=1):
      config = configs[cell]
      cell_dir = cell.directory(results_dir)
      label = f"[{index}/{len(cells)}] {cell.label}"
      workdir_lib.check_workdir(cell_dir)
      twin = twin_of(cell) if cell.label not in statuses else None
      group = (_seed_group(cell, cells[index:], configs, results_dir,
                           lambda c: twin_of(c) is not None)
               if stack_seeds and train is None and twin is None else [])
      remaining = None if deadline_secs is None else deadline_secs - (time.monotonic() - tick)
      if cell.label in statuses:  # trained beside an earlier cell of its row
        pass
      elif twin is not None:
        copy_twin(twin, cell_dir, _meta(cell, significant_overrides(overrides, config), custom),
                  results_dir)
        statuses[cell.label] = "copied"
        echo(f"{label}: copied from {twin.relative_to(results_dir).as_posix()} (the same run, "
             f"finished there), {_summary_line(cell, cell_dir)}")
      elif len(group) > 1 and not isolate and _train_stacked(
          group, configs, results_dir, overrides, custom, statuses, label, echo):
        pass
      elif (len(group) > 1 and isolate and remaining is not None
            and remaining >= min_cell_secs
            and _train_stacked_in_child(group, configs, results_dir, overrides, custom,
                                        statuses, label, timeout=remaining, echo=echo)
            != "not stacked"):
        if statuses[cell.label] == "interrupted":
          deadline_reached = True
          for rest in cells[index:]:
            statuses.setdefault(rest.label, "not started")
      elif is_finished(cell_dir, config):
        statuses[cell.label] = "skipped"
        if (_read_json(cell_dir / CELL_FILE) or {}).get("status") != "finished":
          update_cell_record(cell_dir, _meta(cell, significant_overrides(overrides, config),
                                             custom), status="finished")
        echo(f"{label}: skipped (finished earlier), {_summary_line(cell, cell_dir)}")
      else:
        if remaining is not None and remaining < min_cell_secs:
          deadline_reached = True
          for rest in cells[index - 1:]:
            statuses.setdefault(rest.label, "not started")
          echo(f"{label}: not started ({remaining:.0f} s left of the {deadline_secs:g} s "
               f"deadline, a cell needs {min_cell_secs:g} s); rerun to continue")
          break
        resuming = rounds_done(cell_dir) > 0 or (cell_dir / "checkpoints").is_dir()
        echo(f"{label}: {'resuming' if resuming else 'training'} "
             f"{expected_rounds(config)} rounds in {cell_dir}")
        meta = _meta(cell, significant_overrides(overrides, config), custom)
        cell_tick = time.perf_counter()
        if isolate:
          status = _train_in_child(config, cell_dir, meta, timeout=remaining or 1e9,
                                   echo=echo)
        else:
          status = train_recorded(config, cell_dir, meta, train)
        seconds = time.perf_counter() - cell_tick
        if status == "interrupted":
          statuses[cell.label] = "interrupted"
          deadline_reached = True
          for rest in cells[index:]:
            statuses.setdefault(rest.label, "not started")
        else:
          statuses[cell.label] = "resumed" if resuming else "trained"
          echo(f"{label}: {statuses[cell.label]} ({seconds:.1f} s), "
               f"{_summary_line(cell, cell_dir)}")
      outputs = [cell.table] + ([tables_lib.TABLES[cell.owner]]
                                if cell.owner != cell.table.id else [])
      for table in outputs:
        path = write_outputs(table, cell.scale, results_dir, figures=figures)
        if path not in written:
          written.append(path)
      if copy_to is not None:
        _copy(results_dir, copy_to, [cell_dir], checkpoints=statuses[cell.label] == "interrupted")
        _copy(results_dir, copy_to, [p.parent / n for p in written
                                     for n in ("table.md", "table.json")]
              + [f for p in written for f in p.parent.glob("*accuracy.png")], checkpoints=False)
      if deadline_reached:
        break
  finally:
    record = {"start": started, "end": _now(),
              "wall_seconds": round(time.monotonic() - tick, 3),
              "deadline_secs": deadline_secs, "deadline_reached": deadline_reached,
              "cells": [{"cell": c.label, "status": statuses.get(c.label, "not started")}
                        for c in cells]}
    results_dir.mkdir(parents=True, exist_ok=True)
    with (results_dir / INVOCATIONS_FILE).open("a") as f:
      f.write(json.dumps(record) + "\n")
    if copy_to is not None:
      _copy(results_dir, copy_to, [results_dir / INVOCATIONS_FILE], checkpoints=False)
  wall = time.monotonic() - tick
  counts = {s: list(statuses.values()).count(s) for s in dict.fromkeys(statuses.values())}
  echo(f"reproduce: {', '.join(f'{n} {s}' for s, n in counts.items())}; wall time "
       f"{wall:.1f} s" + ("; the deadline stopped the grid, rerun to continue"
                          if deadline_reached else ""))
  return {"statuses": statuses, "tables": written, "wall_seconds": wall,
          "deadline_reached": deadline_reached}



# --- configs given as such (the class-incremental alias, notebooks) ---------------------------

CONFIGS_DIR = configs_lib.DIRECTORY


def add_alias_arguments(parser: argparse.ArgumentParser) -> None:
  """The arguments experiments/benchmark.py and rounds_benchmark.py share: --seeds, --quick,
  --workdir (the results directory), --set (as `overrides`), --verbose."""
  parser.add_argument("--seeds", default="0", help="comma-separated integers, default: 0")
  parser.add_argument("--quick", action="store_true", help="the quick scale (_quick configs)")
  parser.add_argument("--workdir", default=str(DEFAULT_RESULTS),
                      help="the results directory, default: results/")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="config override, repeatable")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of configuration, data and workdir errors")


def resolve_config_name(name: str) -> tuple[pathlib.Path, str]:
  """(config file, variant) of a config name as experiments/train.py takes it.

  "<scenario>_<variant>" (e.g. "cifar100_glfc_quick") -> the config module's file in
  fedjax_het/configs/ (cifar100.py) and "<variant>"; a scenario whose name holds underscores
  (imagenet_subset) is the longest such prefix naming a config family
  ("imagenet_subset_glfc" -> imagenet_subset.py, "glfc"); "<path>.py[:<variant>]" -> that
  file and variant ("" for none).
  """
  if re.fullmatch(r"[A-Za-z0-9_]+", name):
    split = configs_lib.split_name(name)
    if split is None:
      raise ConfigError(f"{name!r}: no config family {name.split('_')[0]!r} in fedjax_het/configs; "
                        f"the families: {', '.join(configs_lib.families())}.")
    family, variant = split
    return CONFIGS_DIR / f"{family}.py", variant
  path, _, variant = name.partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"{name!r} names no config file ({path} does not exist).")
  return pathlib.Path(path), variant


def load_config(name: str) -> ml_collections.ConfigDict:
  """The config a name resolves to (`resolve_config_name`); ConfigError for a bad variant."""
  path, variant = resolve_config_name(name)
  module = load_config_file(path.stem if path.resolve().parent == CONFIGS_DIR
                            else str(path.resolve()))
  try:
    return module.get_config(variant) if variant else module.get_config()
  except ValueError as error:
    raise ConfigError(f"{name!r}: {error}") from None


def cell_dir_name(name: str) -> str:
  """A config name as a row key (a path-form name without its slashes)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "config"


def run_configs(configs: Mapping[str, ml_collections.ConfigDict], seeds: Sequence[int], *,
                family: str, table_id: str, scale: str = "quick",
                labels: Mapping[str, str] | None = None, overrides: Sequence[str] = (),
                title: str = "", **kwargs: Any) -> dict[str, Any]:
  """Runs given configs x seeds as the rows of an unregistered table of `family`.

  Args:
    configs: {name: config}, in row order; each cell gets a copy with its seed
      and the overrides.
    seeds: the seeds.
    family: the report family ("domain_shift", "partitioned",
      "class_incremental").
    table_id: the table's directory name under the results directory.
    scale: the scale directory ("quick" or "paper").
    labels: {name: row label} (default the names).
    overrides: "dotted.field=value" settings for every cell.
    title: the table's title.
    **kwargs: passed to `run` (results_dir, echo, deadline_secs, ...).

  Returns:
    `run`'s result plus "table_dir" and "cell_dirs" ({name: {seed: path}}).
  """
  if family not in tables_lib.FAMILIES:
    raise ValueError(f"`family` must be one of {tables_lib.FAMILIES}, got {family!r}.")
  keys = {name: cell_dir_name(name) for name in configs}
  if len(set(keys.values())) < len(keys):
    raise ConfigError(f"two configs share a row name ({keys}).")
  rows = tuple(tables_lib.Row(key=keys[n], label=(labels or {}).get(n, n), variant=n,
                              quick_variant=n) for n in configs)
  table = tables_lib.Table(
      id=table_id, title=title or f"{len(rows)} configs", paper="no paper numbers",
      source="the configs as given", protocol="the configs' own", family=family,
      settings=(tables_lib.Setting(key="", label="", config="", rows=rows),),
      kinds=("inter", "intra") if family == "domain_shift" else ())
  setting = table.settings[0]
  cells = [Cell(table, setting, row, int(seed), scale) for seed in seeds for row in rows]
  by_key = {keys[n]: c for n, c in configs.items()}

  def build(cell: Cell) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(by_key[cell.row.key].to_dict())
    config.seed = int(cell.seed)
    config.name = f"{config.name}_seed{cell.seed}"
    apply_overrides(config, overrides)
    return config

  results_dir = pathlib.Path(kwargs.pop("results_dir", DEFAULT_RESULTS))
  out = run(cells, results_dir=results_dir, build_config=build, overrides=overrides, **kwargs)
  return {**out, "table_dir": results_dir / table_id / scale,
          "cell_dirs": {n: {int(s): Cell(table, setting, r, int(s), scale).directory(results_dir)
                            for s in seeds} for n, r in zip(configs, rows)}}



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


if __name__ == "__main__":
  sys.exit(_child_main(sys.argv[1]))

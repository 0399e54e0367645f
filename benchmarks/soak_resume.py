"""Soak test of resume: SIGKILL a training run at random points, damage what it left, resume it,
compare bit for bit; start two processes on one workdir; and make a run end on a fault (a
checkpoints folder that cannot be written, a full disk, a stop signal during a checkpoint
write), resume it and compare.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/soak_resume.py --kinds=kill \
        --trials-per-kind 20 --seed 0 \
        --out benchmarks/results/soak_resume__digits_fcclplus_quick-tiny__<device>.json
    python benchmarks/soak_resume.py --config=digits_solo_quick --num-rounds 4 \
        --trials-per-kind 20 --seed 0 --time-limit-s 2450 \
        --out benchmarks/results/soak_resume__digits_solo_quick-tiny-faults__<device>.json
    python benchmarks/soak_resume.py --config=digits_solo_quick --num-rounds 4 \
        --kinds=flip_record,flip_identity,unwritable_checkpoints,disk_full,signal_during_write \
        --trials-per-kind 20 --seed 0 --time-limit-s 4200 \
        --out benchmarks/results/soak_resume__digits_solo_quick-tiny-stops__<device>.json

What it does (everything in a fresh temporary folder; no real data directory):
1. The reference: `experiments/train.py --config=digits_fcclplus_quick` (or `--config`)
   shrunk to small CNNs and a few dozen images per participant (`TINY_FLAGS`, `--num-rounds`
   rounds, a checkpoint after every round) runs once uninterrupted. It fills a persistent
   compilation cache in the temporary folder, so every later process compiles in seconds.
2. The control: the same command again, uninterrupted, with the warm cache. It must end
   identical to the reference (otherwise the run is not deterministic and the soak proves
   nothing), and its timeline (wall time; when it compiled and when its last round ended,
   from the absl timestamps) gives the kill-time windows. The windows are medians over the
   control and every later uninterrupted full run, since a shared machine's load varies.
3. Each trial starts the command in a fresh workdir and kills it with SIGKILL after a
   random delay: uniform over the whole wall time, so kills land during start-up
   (imports, data, the round-0 checkpoint), compilation, mid-round and while orbax writes
   a checkpoint; with probability `--round-focus` (default 0.5) uniform over the training
   loop instead (from "compiled the round" to the last round's line), because on a tiny
   config start-up and compilation take most of the wall time and kills during rounds and
   checkpoint writes would be rare. The same command is then rerun (resuming from the
   latest checkpoint); with probability `--second-kill` that rerun is killed too, at a
   fresh random delay. Reruns continue until the process exits 0 (at most
   `--max-attempts` processes). A run that ends (with status 0) before its first kill is
   restarted in a fresh workdir with a new delay; a trial never killed counts as failed.
   This is the trial kind `kill`. `--kinds` (default: the first five below, `DEFAULT_KINDS`;
   run round robin, so that a soak stopped by `--time-limit-s` has as many trials of each)
   adds:
   - `corrupt_checkpoint`: one kill a random fraction of a round after the run logs a
     random round k >= 2 (so two checkpoints are kept: the damaged one has one before it),
     then 1-16 random bytes of 1-3 random files of the newest committed checkpoint folder
     are overwritten (each byte XORed with a random non-zero value); then resume.
   - `truncate_checkpoint`: the same kill, then one random file of the newest checkpoint is
     cut to a random shorter length or deleted; then resume.
   - `damage_metrics`: the same kill (k >= 1), then one random metrics.jsonl line is cut in
     half, or one is deleted, or the file is deleted; then resume.
   - `concurrent`: two processes start on one fresh workdir, at once or 0.5 to
     `--concurrent-gap` seconds apart. Exactly one must train all rounds and exit 0; the
     other must exit 1, train no round, and end its stderr (after the absl log lines every
     run writes) with exactly one "error:" line that names the trainer's PID. The trained
     workdir is then compared as below; the trial's outcome is "refused correctly". Where
     the second process starts after the first has finished, it is a rerun of a finished
     run: it must resume from the final checkpoint, train no round and exit 0; the outcome
     is "identical" (`second_start_after_finish` in its record).
   - `flip_record`, `flip_identity`: the same kill (k >= 2), then one digit of one number in
     the newest checkpoint's run item (`run/metadata`) has its lowest bit flipped: a train/
     or eval/ value of a record, or a field of the run's identity (seed, local.lr, ...). A
     digit stays a digit, so the JSON stays valid and only the run item's SHA-256 can tell;
     then resume (the checkpoint is moved to checkpoints/unreadable/ and the run resumes
     from the one before).
   - `unwritable_checkpoints`, `disk_full`, `signal_during_write` (`run_fault_trial`): a
     fault the running process must end on: its checkpoints folder made read-only (the
     process runs without the privilege to override file permissions: as root, `setpriv`
     drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), its disk filled (the workdir on a
     small tmpfs, mounted in a private mount namespace: the script re-executes itself under
     `unshare -m`; where it cannot, the kind is skipped and the record says why), or SIGINT
     / SIGTERM the moment a checkpoint write's folder appears (sometimes a second signal).
     The process must exit within `--fault-timeout` seconds with one line and no
     traceback, leave no record past its latest checkpoint (storage faults) and finish the
     write under way (a signal; a second one discards it and says so); the fault is undone
     and the same command resumes, as above.
   Each trial records the kind, what was damaged, its outcome ("identical", "refused
   correctly" or "failed"), the warning lines the runs logged (the synthetic-data notices
   left out) and any "error:" line of the last process.
4. The finished workdir is compared with the reference: every metrics.jsonl record
   (the round list and every eval/ and train/ number, exactly; time/ fields ignored),
   results.json exactly, the diagnostics (cross_correlation.npz) and the arrays of the
   final checkpoint bit for bit.

The phase of each kill comes from what the run had logged ("compiling the round",
"compiled the round", one "round k/N" line per round: stderr is not a TTY) and from
the checkpoint folder: an orbax temporary folder left behind means a checkpoint write
was under way. Phases: start-up, compiling, round (k = the round being trained),
checkpoint (a write was under way; it overlaps the next round, orbax saves in the
background), finishing (after the last round: results, closing).

Prints one line per trial and the counts per kind; writes the JSON to `--out` after every
trial (`"complete": false` until the end); exits with status 1 when any trial fails (or the
control differs from the reference).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import pathlib
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = (REPO / "benchmarks" / "results"
               / "soak_resume__digits_fcclplus_quick-tiny__cpu2.json")

#: tests/test_train.py `tiny_config()` as command-line overrides of digits_fcclplus_quick.
TINY_FLAGS = (
    "--config.models.architectures=('simple_cnn','fedavg_cifar_cnn','simple_cnn',"
    "'fedavg_cifar_cnn')",
    "--config.local.epochs=1",
    "--config.local.batch_size=16",
    "--config.collaborative.batch_size=32",
    "--config.scenario.public_size=64",
    "--config.scenario.private_sizes.mnist=30",
    "--config.scenario.private_sizes.usps=20",
    "--config.scenario.private_sizes.svhn=40",
    "--config.scenario.private_sizes.syn=24",
    "--config.scenario.test_size=30",
    "--config.eval.batch_size=30",
    # One log line per round (stderr is a file, not a TTY): the kill's phase is read from it.
    "--config.logging.progress=True",
    "--config.logging.plots=False",
    "--config.logging.tensorboard=False",
    "--config.checkpoint.every=1",
)

PHASES = ("start-up", "compiling", "round", "checkpoint", "finishing")


def tiny_flags(config: str) -> tuple[str, ...]:
  """`TINY_FLAGS` for `config`; a config without a collaborative phase (SOLO) drops its flag."""
  if "solo" in config:
    return tuple(f for f in TINY_FLAGS if not f.startswith("--config.collaborative."))
  return TINY_FLAGS


def cli_command(workdir: pathlib.Path, cache_dir: pathlib.Path, num_rounds: int,
                config: str = "digits_fcclplus_quick") -> list[str]:
  """The training command; identical flags for the first run and every resume."""
  return [sys.executable, str(REPO / "experiments" / "train.py"),
          f"--config={config}", f"--workdir={workdir}",
          f"--config.num_rounds={num_rounds}", f"--config.compilation_cache_dir={cache_dir}",
          *tiny_flags(config)]


def child_env(root: pathlib.Path) -> dict[str, str]:
  """No real data directory (synthetic data, generated once under `root`), CPU, unbuffered."""
  env = dict(os.environ)
  env.pop("FEDJAX_HET_DATA_DIR", None)
  env["FEDJAX_HET_CACHE_DIR"] = str(root / "data_cache")
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["PYTHONUNBUFFERED"] = "1"
  return env


# ----------------------------------------------------------------------------- running


def checkpoint_state(workdir: pathlib.Path) -> dict[str, Any]:
  """Committed checkpoint rounds and orbax temporary folders (writes cut short) in `workdir`
  (checkpoints moved to `checkpoints/unreadable/` are neither)."""
  folder = workdir / "checkpoints"
  if not folder.is_dir():
    return {"committed": [], "temporary": []}
  committed, temporary = [], []
  for entry in sorted(folder.iterdir()):
    if entry.name.isdigit():
      committed.append(int(entry.name))
    elif entry.name != "unreadable":  # checkpoints moved aside (fedjax_het.checkpointing)
      temporary.append(entry.name)
  return {"committed": sorted(committed), "temporary": temporary}


def classify(log: str, workdir: pathlib.Path, num_rounds: int,
             temporary_before: Sequence[str] = ()) -> dict[str, Any]:
  """Where a killed run was, from its log and the checkpoint writes it left unfinished.

  `temporary_before`: orbax temporary folders that were there before the run started
  (left by an earlier kill), which say nothing about this run.
  """
  lines = [l for l in log.splitlines() if l.strip()]
  resumed = [int(m.group(1)) for l in lines
             for m in [re.search(r"resumed from the checkpoint of round (\d+)", l)] if m]
  start = resumed[-1] if resumed else 0
  done = [int(m.group(1)) for l in lines for m in [re.search(r"\bround (\d+)/(\d+)\b", l)] if m]
  rounds_done = done[-1] if done else start
  if done or any("compiled the round" in l for l in lines):
    if rounds_done < num_rounds:
      phase, detail = "round", f"round {rounds_done + 1}"
    else:
      phase, detail = "finishing", "finishing"
  elif any("compiling the round" in l for l in lines):
    phase, detail = "compiling", "compiling"
  elif resumed and start >= num_rounds:
    phase, detail = "finishing", "finishing (resumed after the last round)"
  else:
    phase, detail = "start-up", "start-up"
  checkpoints = checkpoint_state(workdir)
  unfinished = [t for t in checkpoints["temporary"] if t not in set(temporary_before)]
  if unfinished:
    rounds = sorted({t.split(".")[0] for t in unfinished})
    phase, detail = "checkpoint", f"{detail}, writing checkpoint {'/'.join(rounds)}"
  return {"phase": phase, "detail": detail, "rounds_logged": rounds_done,
          "resumed_from": start if resumed else None,
          "checkpoints": checkpoints, "log_last": lines[-1][:200] if lines else ""}


_ABSL_TIME = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")


def timeline(log: str, started: float) -> dict[str, float]:
  """Seconds after the process start at which the run began compiling, compiled, ended rounds.

  From the absl timestamps of the log (time of day) and the wall-clock start time.
  """
  day = datetime.datetime.fromtimestamp(started)
  start = day.hour * 3600 + day.minute * 60 + day.second + day.microsecond / 1e6
  marks: dict[str, float] = {}
  for line in log.splitlines():
    match = _ABSL_TIME.match(line)
    if not match:
      continue
    hours, minutes, seconds = match.groups()
    offset = (int(hours) * 3600 + int(minutes) * 60 + float(seconds) - start) % 86400
    if "compiling the round" in line:
      marks.setdefault("compiling", offset)
    elif "compiled the round" in line:
      marks.setdefault("compiled", offset)
    elif re.search(r"\bround (\d+)/(\d+)\b", line):
      marks.setdefault("first_round", offset)
      marks["last_round"] = offset
  return {k: round(v, 3) for k, v in marks.items()}


def run_once(cmd: Sequence[str], env: Mapping[str, str], log_path: pathlib.Path,
             workdir: pathlib.Path, num_rounds: int, kill_after: float | None,
             kill_at_round: tuple[int, float] | None = None) -> dict[str, Any]:
  """Runs `cmd` (stdout and stderr to `log_path`), with SIGKILL after `kill_after` seconds, or
  `kill_at_round` = (k, s): s seconds after the run logs "round k/N"."""
  temporary_before = checkpoint_state(workdir)["temporary"]
  started = time.time()
  tick = time.perf_counter()
  with log_path.open("w") as log:
    process = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                               cwd=REPO)
    killed = False
    try:
      if kill_at_round is None:
        process.wait(timeout=kill_after)
      else:
        mark = f"round {kill_at_round[0]}/{num_rounds} "
        while process.poll() is None and mark not in log_path.read_text(errors="replace"):
          time.sleep(0.02)
        process.wait(timeout=kill_at_round[1])
    except subprocess.TimeoutExpired:
      process.send_signal(signal.SIGKILL)
      process.wait()
      killed = True
  attempt = {"rc": process.returncode, "killed": killed, "wall_s": time.perf_counter() - tick}
  if kill_after is not None:
    attempt["delay_s"] = kill_after
  if kill_at_round is not None:
    attempt["kill_at_round"] = list(kill_at_round)
    attempt["delay_s"] = attempt["wall_s"]
  text = log_path.read_text(errors="replace")
  attempt["timeline_s"] = timeline(text, started)
  where = classify(text, workdir, num_rounds, temporary_before)
  attempt.update(where if killed else {"resumed_from": where["resumed_from"]})
  if not killed and process.returncode != 0:
    attempt["log_tail"] = text[-3000:]
  return attempt


# -------------------------------------------------------------------------- comparison


def _same(a: Any, b: Any) -> bool:
  """Exact equality of JSON values, NaN equal to NaN, int and float kept apart."""
  if isinstance(a, float) and isinstance(b, float):
    return a == b or (math.isnan(a) and math.isnan(b))
  if type(a) is not type(b):  # pylint: disable=unidiomatic-typecheck
    return False
  if isinstance(a, dict):
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == b


def _numbers(record: Mapping[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in record.items() if k.startswith(("eval/", "train/"))}


def _read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_metrics(reference: pathlib.Path, candidate: pathlib.Path) -> list[str]:
  """Differences between two metrics.jsonl files: rounds, eval/ and train/ numbers."""
  if not candidate.exists():
    return [f"{candidate.name}: missing"]
  ref, got = _read_jsonl(reference), _read_jsonl(candidate)
  ref_rounds, got_rounds = [r.get("round") for r in ref], [r.get("round") for r in got]
  if ref_rounds != got_rounds:
    return [f"metrics.jsonl rounds: {ref_rounds} != {got_rounds}"]
  out = []
  for a, b in zip(ref, got):
    a, b, where = _numbers(a), _numbers(b), f"metrics.jsonl round {a['round']}"
    if a.keys() != b.keys():
      out.append(f"{where}: fields {sorted(set(a) ^ set(b))} in only one run")
    for key in sorted(a.keys() & b.keys()):
      if not _same(a[key], b[key]):
        out.append(f"{where} {key}: {a[key]!r} != {b[key]!r}")
  return out


def compare_json(reference: pathlib.Path, candidate: pathlib.Path) -> list[str]:
  if not candidate.exists():
    return [f"{candidate.name}: missing"]
  a, b = json.loads(reference.read_text()), json.loads(candidate.read_text())
  return [] if _same(a, b) else [f"{candidate.name}: {a!r} != {b!r}"]


def _arrays_differ(name: str, a: np.ndarray, b: np.ndarray) -> list[str]:
  """Bit-level comparison (NaN payloads and -0.0 included)."""
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape:
    return [f"{name}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"]
  if np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes():
    return []
  raw_a = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1) if a.size else a
  raw_b = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1) if b.size else b
  differ = np.flatnonzero(np.any(raw_a != raw_b, axis=-1))
  first = np.unravel_index(int(differ[0]), a.shape) if a.shape else ()
  return [f"{name}: {differ.size} of {a.size} elements differ (first at {tuple(map(int, first))}: "
          f"{a[first]!r} != {b[first]!r})"]


def restore_checkpoint(folder: pathlib.Path, step: int) -> dict[str, np.ndarray]:
  """{tree path: numpy array} of checkpoint `step` (orbax, no target: as stored)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  item = folder.absolute() / str(step) / "state"  # the arrays' item (fedjax_het.checkpointing)
  if not item.is_dir():
    item = item.with_name("default")              # a checkpoint written as one unnamed item
  state = ocp.StandardCheckpointer().restore(item)
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf))
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def compare_checkpoints(reference: pathlib.Path, candidate: pathlib.Path) -> list[str]:
  """The final checkpoints: same round, same tree, every array equal bit for bit."""
  ref_steps = checkpoint_state(reference.parent)["committed"]
  got_steps = checkpoint_state(candidate.parent)["committed"]
  if not got_steps:
    return ["checkpoints: none committed"]
  if not ref_steps or ref_steps[-1] != got_steps[-1]:
    return [f"checkpoints: final round {ref_steps[-1:]} != {got_steps[-1:]}"]
  step = ref_steps[-1]
  a, b = restore_checkpoint(reference, step), restore_checkpoint(candidate, step)
  out = []
  if a.keys() != b.keys():
    out.append(f"checkpoint {step}: leaves {sorted(set(a) ^ set(b))} in only one run")
  for key in sorted(a.keys() & b.keys()):
    out += _arrays_differ(f"checkpoint {step} {key}", a[key], b[key])
  return out


def compare_npz(reference: pathlib.Path, candidate: pathlib.Path) -> list[str]:
  if not reference.exists():
    return [] if not candidate.exists() else [f"{candidate.name}: only in the resumed run"]
  if not candidate.exists():
    return [f"{candidate.name}: missing"]
  with np.load(reference) as a, np.load(candidate) as b:
    if sorted(a.files) != sorted(b.files):
      return [f"{candidate.name}: arrays {sorted(a.files)} != {sorted(b.files)}"]
    return [line for k in sorted(a.files)
            for line in _arrays_differ(f"{candidate.name} {k}", a[k], b[k])]


def compare_runs(reference: pathlib.Path, candidate: pathlib.Path) -> list[str]:
  """Every difference in results between two finished workdirs ([] = identical)."""
  reference, candidate = pathlib.Path(reference), pathlib.Path(candidate)
  out = compare_metrics(reference / "metrics.jsonl", candidate / "metrics.jsonl")
  out += compare_json(reference / "results.json", candidate / "results.json")
  out += compare_npz(reference / "cross_correlation.npz", candidate / "cross_correlation.npz")
  out += compare_checkpoints(reference / "checkpoints", candidate / "checkpoints")
  return out


# ------------------------------------------------------------------------------- soak


class KillTimes:
  """Random kill times, from the timelines of the uninterrupted full runs seen so far.

  The windows are medians over the latest `RECENT` of the control and the later runs that
  trained all rounds without being killed: the load of a shared machine changes how long a
  run takes, and windows drawn from runs under another load miss the run (a kill time past
  its end).
  """

  RECENT = 7

  def __init__(self, rng: random.Random, round_focus: float):
    self.rng, self.round_focus = rng, round_focus
    self.runs: list[tuple[float, float, float]] = []  # (wall, compiled, last round)

  def add(self, attempt: Mapping[str, Any]) -> None:
    marks = attempt.get("timeline_s", {})
    if (not attempt["killed"] and attempt["rc"] == 0 and attempt.get("resumed_from") in (None, 0)
        and "compiled" in marks and "last_round" in marks):
      self.runs.append((attempt["wall_s"], marks["compiled"], marks["last_round"]))

  def windows(self) -> dict[str, tuple[float, float]]:
    recent = self.runs[-self.RECENT:]
    wall, compiled, last = (float(np.median(column)) for column in zip(*recent))
    return {"whole run": (0.0, wall), "rounds": (compiled, last)}

  def draw(self, window: str | None = None) -> tuple[float, str]:
    """(seconds after the process start, the window it was drawn from); `window` ("rounds",
    "whole run") fixes the window, else it is "rounds" with probability `round_focus`."""
    windows = self.windows()
    name = window or ("rounds" if self.rng.random() < self.round_focus else "whole run")
    return self.rng.uniform(*windows[name]), name


def newest_checkpoint(workdir: pathlib.Path) -> pathlib.Path | None:
  """The folder of the newest committed checkpoint of `workdir`, or None while fewer than two
  are committed (with one before it, a damaged newest checkpoint has one to fall back on)."""
  committed = checkpoint_state(workdir)["committed"]
  return workdir / "checkpoints" / str(committed[-1]) if len(committed) >= 2 else None


def _files(folder: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in folder.rglob("*") if p.is_file())


def corrupt_files(folder: pathlib.Path, rng: random.Random,
                  max_files: int = 3, max_bytes: int = 16) -> list[dict[str, Any]]:
  """Overwrites 1..`max_bytes` random bytes of 1..`max_files` random non-empty files under
  `folder`, each byte changed (XOR with a random non-zero value); what it did, per file."""
  files = [f for f in _files(folder) if f.stat().st_size > 0]
  done = []
  for path in rng.sample(files, min(len(files), rng.randint(1, max_files))):
    data = bytearray(path.read_bytes())
    offsets = sorted(rng.sample(range(len(data)), min(len(data), rng.randint(1, max_bytes))))
    for offset in offsets:
      data[offset] ^= rng.randint(1, 255)
    path.write_bytes(bytes(data))
    done.append({"file": str(path.relative_to(folder)), "action": "overwrote bytes",
                 "size": len(data), "offsets": offsets})
  return done


def truncate_or_delete(folder: pathlib.Path, rng: random.Random) -> list[dict[str, Any]]:
  """Truncates a random file under `folder` to a random shorter length, or deletes one."""
  files = _files(folder)
  if not files:
    return []
  path = rng.choice(files)
  size = path.stat().st_size
  entry = {"file": str(path.relative_to(folder)), "size": size}
  if size > 0 and rng.random() < 0.5:
    length = rng.randrange(size)
    with path.open("r+b") as handle:
      handle.truncate(length)
    return [{**entry, "action": "truncated", "length": length}]
  path.unlink()
  return [{**entry, "action": "deleted"}]


def damage_metrics_file(path: pathlib.Path, rng: random.Random) -> list[dict[str, Any]]:
  """Cuts a random line of `path` (metrics.jsonl) in half, deletes a random line, or deletes
  the file; [] when there is no line to damage."""
  if not path.exists():
    return []
  lines = path.read_text().splitlines(keepends=True)
  if not lines:
    return []
  action = rng.choice(("cut a line", "deleted a line", "deleted the file"))
  if action == "deleted the file":
    path.unlink()
    return [{"file": path.name, "action": action, "lines": len(lines)}]
  index = rng.randrange(len(lines))
  if action == "cut a line":
    lines[index] = lines[index][:len(lines[index].rstrip("\n")) // 2]
    if index < len(lines) - 1:
      lines[index] += "\n"
  else:
    del lines[index]
  path.write_text("".join(lines))
  return [{"file": path.name, "action": action, "line": index + 1, "lines": len(lines)}]


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def flip_run_item(folder: pathlib.Path, what: str, rng: random.Random) -> list[dict[str, Any]]:
  """Flips the lowest bit of one digit of one number in the checkpoint's run item
  (`<folder>/run/metadata`): of a metrics record (`what` = "record": a train/ or eval/
  value) or of the run's identity ("identity": a config field such as seed or local.lr).
  A digit stays a digit, so the JSON stays valid; the number's value changes (one of its
  first six digits, never a leading zero). What it did; [] when there is no such number."""
  path = folder / "run" / "metadata"
  if not path.is_file():
    return []
  text = path.read_text()
  split = text.find('"records"')
  if what == "record":
    pattern = re.compile(r'"((?:train|eval)/[^"]+)": (-?\d+\.\d+(?:e-?\d+)?)')
    matches = [m for m in pattern.finditer(text) if m.start() > split >= 0]
  else:
    pattern = re.compile(r'"([A-Za-z_.]+)": (-?\d+(?:\.\d+)?(?:e-?\d+)?)(?=[,}])')
    matches = list(pattern.finditer(text[:split] if split >= 0 else text))
  rng.shuffle(matches)
  for match in matches:
    number = match.group(2)
    digits = [i for i, ch in enumerate(number) if ch.isdigit()][:6]
    for i in rng.sample(digits, len(digits)):
      flipped = number[:i] + chr(ord(number[i]) ^ 1) + number[i + 1:]
      if not _JSON_NUMBER.fullmatch(flipped) or float(flipped) == float(number):
        continue
      start = match.start(2) + i
      changed = text[:start] + flipped[i] + text[start + 1:]
      json.loads(changed)
      path.write_text(changed)
      return [{"file": "run/metadata", "action": f"flipped a digit of the {what}",
               "field": match.group(1), "from": number, "to": flipped, "offset": start}]
  return []


def damage(kind: str, workdir: pathlib.Path, rng: random.Random) -> list[dict[str, Any]]:
  """Damages the killed run in `workdir` as `kind` says; [] when there is nothing to damage
  yet (no committed checkpoint, no metrics line)."""
  if kind == "damage_metrics":
    return damage_metrics_file(workdir / "metrics.jsonl", rng)
  folder = newest_checkpoint(workdir)
  if folder is None:
    return []
  if kind in ("flip_record", "flip_identity"):
    done = flip_run_item(folder, kind.removeprefix("flip_"), rng)
  else:
    done = (corrupt_files(folder, rng) if kind == "corrupt_checkpoint"
            else truncate_or_delete(folder, rng))
  prefix = str(folder.relative_to(workdir))
  return [{**d, "file": f"{prefix}/{d['file']}"} for d in done]


_NOISE = ("SYNTHETIC", "!!!!")


def warning_lines(log: str) -> list[str]:
  """The absl warning lines of a log (the synthetic-data notices left out), message only."""
  out = []
  for line in log.splitlines():
    if re.match(r"^[WE]\d{4} ", line):
      message = line.split("] ", 1)[-1]
      if not message.startswith(_NOISE):
        out.append(message[:300])
  return out


def run_trial(index: int, root: pathlib.Path, reference: pathlib.Path, env: Mapping[str, str],
              cache_dir: pathlib.Path, args: argparse.Namespace,
              kill_times: KillTimes, kind: str = "kill") -> dict[str, Any]:
  """One trial: kill (maybe twice; for a damage kind once, then the damage), resume until
  exit 0, compare with the reference."""
  name = f"{kind}_{index:02d}"
  workdir = root / name
  cmd = cli_command(workdir, cache_dir, args.num_rounds, args.config)
  attempts: list[dict[str, Any]] = []
  damaged: list[dict[str, Any]] = []
  kills_wanted = 2 if kind == "kill" and kill_times.rng.random() < args.second_kill else 1
  redraws = 0
  while len(attempts) < args.max_attempts:
    kills = sum(a["killed"] for a in attempts)
    wanted = kills < kills_wanted or (kind != "kill" and not damaged)
    delay, drawn, at_round = None, None, None
    if wanted and kind == "kill":
      delay, drawn = kill_times.draw()
    elif wanted:
      # After a random round's line (from round 2 on: two checkpoints committed or under way),
      # within about a round's time: mid-round, while a checkpoint is written, or finishing.
      low = 1 if kind == "damage_metrics" else 2
      rounds = kill_times.windows()["rounds"]
      per_round = max(0.05, (rounds[1] - rounds[0]) / max(1, args.num_rounds - 1))
      at_round = (kill_times.rng.randint(low, args.num_rounds),
                  round(kill_times.rng.uniform(0.0, 1.5 * per_round), 3))
      drawn = "after a round's line"
    attempt = run_once(cmd, env, root / f"{name}_{len(attempts)}.log", workdir,
                       args.num_rounds, delay, at_round)
    if drawn is not None:
      attempt["drawn_over"] = drawn
    kill_times.add(attempt)
    if not damaged and not attempt["killed"] and attempt["rc"] == 0 and redraws < 10:
      if kills == 0 or kind != "kill":
        # The run finished before its first kill (or its damage): start over.
        redraws += 1
        shutil.rmtree(workdir, ignore_errors=True)
        attempts.clear()
        continue
    attempts.append(attempt)
    if attempt["killed"] and kind != "kill" and not damaged:
      damaged = damage(kind, workdir, kill_times.rng)
      attempt["damaged"] = damaged
    if not attempt["killed"]:
      break
  killed = [a for a in attempts if a["killed"]]
  finished = bool(attempts) and not attempts[-1]["killed"] and attempts[-1]["rc"] == 0
  if not killed:
    differences = ["never killed: the run finished before every kill time"]
  elif kind != "kill" and not damaged:
    differences = ["never damaged: nothing to damage after every kill"]
  elif not finished:
    differences = [f"did not finish: exit status {attempts[-1]['rc']} after {len(attempts)} "
                   "processes"]
  else:
    differences = compare_runs(reference, workdir)
  logs = [(root / f"{name}_{k}.log").read_text(errors="replace") for k in range(len(attempts))]
  warnings = [w for log in logs for w in warning_lines(log)]
  refusals = [l[:400] for l in (logs[-1] if logs else "").splitlines() if l.startswith("error:")]
  trial = {"kind": kind, "trial": index, "kills": len(killed), "redraws": redraws,
           "phases": [a["phase"] for a in killed], "details": [a["detail"] for a in killed],
           "delays_s": [round(a["delay_s"], 3) for a in killed], "damaged": damaged,
           "warnings": warnings, "refusals": refusals, "identical": not differences,
           "outcome": "identical" if not differences else "failed",
           "differences": differences[:50],
           "attempts": attempts, "leftover_temporary_checkpoints":
               checkpoint_state(workdir)["temporary"], "workdir": str(workdir)}
  return trial


def _holder_pid(line: str) -> int | None:
  match = re.search(r"is in use by PID (\d+)", line)
  return int(match.group(1)) if match else None


def run_concurrent_trial(index: int, root: pathlib.Path, reference: pathlib.Path,
                         env: Mapping[str, str], cache_dir: pathlib.Path,
                         args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
  """Two processes on one fresh workdir, at once or a few seconds apart: one trains (and ends
  identical to the reference), the other exits 1 with one "error:" line naming the holder's
  PID and trains nothing; or, where the second starts after the first has finished, it
  resumes from the final checkpoint, trains nothing and exits 0 (outcome "identical")."""
  name = f"concurrent_{index:02d}"
  workdir = root / name
  cmd = cli_command(workdir, cache_dir, args.num_rounds, args.config)
  gap = 0.0 if rng.random() < 0.5 else round(rng.uniform(0.5, args.concurrent_gap), 3)
  processes, handles = [], []
  tick = time.perf_counter()
  for k in range(2):
    if k == 1 and gap:
      time.sleep(gap)
    out = (root / f"{name}_{k}.out").open("w")
    err = (root / f"{name}_{k}.err").open("w")
    handles += [out, err]
    processes.append(subprocess.Popen(list(cmd), stdout=out, stderr=err, env=dict(env), cwd=REPO))
  for process in processes:
    process.wait()
  wall = time.perf_counter() - tick
  for handle in handles:
    handle.close()
  runs = []
  for k, process in enumerate(processes):
    err = (root / f"{name}_{k}.err").read_text(errors="replace")
    out = (root / f"{name}_{k}.out").read_text(errors="replace")
    lines = err.splitlines()
    refusals = [l for l in (out + err).splitlines() if l.startswith("error:")]
    runs.append({"pid": process.pid, "rc": process.returncode,
                 "rounds_logged": len(re.findall(r"\bround \d+/\d+\b", err)),
                 "refusals": refusals, "last_stderr_line": lines[-1][:300] if lines else "",
                 "resumed_final": (f"resumed from the checkpoint of round {args.num_rounds} "
                                   in err),
                 "stderr_lines": len(lines), "warnings": warning_lines(err)})
  problems = []
  trained = [r for r in runs if r["rc"] == 0]
  refused = [r for r in runs if r["rc"] != 0]
  # The second start came after the first run finished: a rerun of a finished run, which
  # resumes from its last checkpoint, trains nothing and exits 0.
  after_finish = (len(trained) == 2 and runs[1]["rounds_logged"] == 0 and not runs[1]["refusals"]
                  and runs[1]["resumed_final"])
  if after_finish:
    if runs[0]["rounds_logged"] != args.num_rounds:
      problems.append(f"the training process logged {runs[0]['rounds_logged']} rounds")
  elif len(trained) != 1 or len(refused) != 1:
    problems.append(f"exit statuses {[r['rc'] for r in runs]}: not one 0 and one 1")
  else:
    winner, loser = trained[0], refused[0]
    if loser["rc"] != 1:
      problems.append(f"the refused process exited {loser['rc']}, not 1")
    if len(loser["refusals"]) != 1:
      problems.append(f"the refused process wrote {len(loser['refusals'])} error lines: "
                      f"{loser['refusals']}")
    elif _holder_pid(loser["refusals"][0]) != winner["pid"]:
      problems.append(f"the refusal does not name the holder (PID {winner['pid']}): "
                      f"{loser['refusals'][0]}")
    elif loser["last_stderr_line"] != loser["refusals"][0][:300]:
      problems.append(f"the refusal is not the last stderr line: {loser['last_stderr_line']}")
    if loser["rounds_logged"]:
      problems.append(f"the refused process trained {loser['rounds_logged']} rounds")
    if winner["refusals"]:
      problems.append(f"the training process wrote error lines: {winner['refusals']}")
    if winner["rounds_logged"] != args.num_rounds:
      problems.append(f"the training process logged {winner['rounds_logged']} rounds")
  differences = problems + (compare_runs(reference, workdir) if trained else [])
  return {"kind": "concurrent", "trial": index, "gap_s": gap, "wall_s": wall,
          "first_started": processes[0].pid, "processes": runs,
          "refusal": refused[0]["refusals"][0] if refused and refused[0]["refusals"] else None,
          "warnings": [w for r in runs for w in r["warnings"]],
          "identical": not differences, "second_start_after_finish": after_finish,
          "outcome": ("failed" if differences else "identical" if after_finish
                      else "refused correctly"),
          "differences": differences[:50], "workdir": str(workdir)}


# --------------------------------------------------------------------- faults a run must survive


def drop_file_permission_override() -> tuple[list[str] | None, str | None]:
  """(a command prefix that makes a child subject to file permissions, None) or (None, why
  not).

  As root, the child keeps uid 0 and loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped
  from its bounding set by `setpriv` before exec): a folder without write permission is then
  unwritable to it, as to any user. An unprivileged user needs nothing dropped."""
  if os.geteuid() != 0:
    return [], None
  setpriv = shutil.which("setpriv")
  if setpriv is None:
    return None, "no setpriv command to drop capabilities with"
  prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
  probe = pathlib.Path(tempfile.mkdtemp(prefix="soak_probe_"))
  probe.chmod(0o555)
  try:
    out = subprocess.run([*prefix, sys.executable, "-c", f"open({str(probe / 'x')!r}, 'w')"],
                         capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError) as error:
    return None, f"cannot start a child without them ({error})"
  finally:
    probe.chmod(0o755)
    shutil.rmtree(probe, ignore_errors=True)
  if "PermissionError" not in out.stderr:
    return None, f"a child without CAP_DAC_OVERRIDE still writes a read-only folder: {out}"
  return prefix, None


#: Set in the soak's own process once it runs in a private mount namespace (disk_full).
PRIVATE_MOUNTS_ENV = "FEDJAX_HET_SOAK_PRIVATE_MOUNTS"


def in_private_mounts(argv: Sequence[str]) -> str | None:
  """Re-executes this soak in a private mount namespace (`unshare -m`), where it can mount a
  small tmpfs without touching the machine's mounts; returns (in that process) None, or why
  it cannot (then disk_full trials are skipped)."""
  if os.environ.get(PRIVATE_MOUNTS_ENV) == "1":
    return None
  unshare = shutil.which("unshare")
  if unshare is None:
    return "no unshare command"
  probe = subprocess.run([unshare, "-m", "--propagation", "private", "true"],
                         capture_output=True, text=True)
  if probe.returncode != 0:
    return f"unshare -m fails: {probe.stderr.strip()[:200]}"
  os.environ[PRIVATE_MOUNTS_ENV] = "1"
  os.execv(unshare, [unshare, "-m", "--propagation", "private", sys.executable,
                     str(pathlib.Path(__file__).resolve()), *argv])
  return None  # not reached


def mount_small_disk(folder: pathlib.Path, size_kib: int) -> str | None:
  """Mounts a `size_kib` KiB tmpfs at `folder` (in this process's private mount namespace);
  None, or why it could not."""
  folder.mkdir(parents=True, exist_ok=True)
  out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                        str(folder)], capture_output=True, text=True)
  return None if out.returncode == 0 else f"mount tmpfs fails: {out.stderr.strip()[:200]}"


def fill_disk(folder: pathlib.Path, leave: int) -> int:
  """Fills the filesystem of `folder` with `folder/filler` until it is full, then frees
  `leave` bytes of it; the filler's size."""
  filler = folder / "filler"
  block = b"\0" * (1 << 16)
  handle = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  try:
    for size in (1 << 16, 1 << 12, 1 << 9, 1):
      try:
        while True:
          os.write(handle, block[:size])
      except OSError:
        pass
  finally:
    os.close(handle)
  size = max(0, filler.stat().st_size - leave)
  os.truncate(filler, size)
  return size


def stop_lines(stderr: str) -> tuple[list[str], list[str]]:
  """(the "error:" lines, the "stopped ..." lines) of a run's stderr."""
  lines = stderr.splitlines()
  return ([l for l in lines if l.startswith("error:")],
          [l for l in lines if l.startswith("stopped ")])


def _rounds_in_metrics(workdir: pathlib.Path) -> list[int]:
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  out = []
  for line in path.read_text(errors="replace").splitlines():
    try:
      out.append(int(json.loads(line)["round"]))
    except (ValueError, KeyError, TypeError):
      out.append(-1)  # a cut line
  return out


def _leftovers(workdir: pathlib.Path) -> list[str]:
  """Temporary files an atomic write left (`.<name>.tmp`)."""
  return sorted(p.name for p in workdir.glob(".*.tmp")) if workdir.is_dir() else []


def run_fault_trial(index: int, root: pathlib.Path, reference: pathlib.Path,
                    env: Mapping[str, str], cache_dir: pathlib.Path, args: argparse.Namespace,
                    kill_times: KillTimes, kind: str, faults: Mapping[str, Any]
                    ) -> dict[str, Any]:
  """One trial of a fault the run must end on, in one line, with a workdir the same command
  resumes: `unwritable_checkpoints` (the checkpoints folder made read-only up to half a
  round after a random round's line, the run lacking the privilege to override file
  permissions), `disk_full` (its disk, a small tmpfs, filled as that to a random 0-64 KiB of
  free space), or
  `signal_during_write` (SIGINT or SIGTERM as soon as a checkpoint write's folder appears,
  with probability 1/4 a second one 0-0.3 s later). The faulted process must exit (status 1
  for a storage fault, 130 for a signal) within `--fault-timeout` seconds with exactly one
  line ("error: ..." naming a path in the workdir, or "stopped ..." naming the checkpoint
  the disk holds) as its last line and no traceback; after a storage fault metrics.jsonl
  holds no record past the latest checkpoint and no temporary file is left; after a signal
  the write under way has finished (or, after a second signal, is said to be discarded).
  The fault is then undone and the same command resumes until it exits 0; the workdir is
  compared with the reference."""
  rng = kill_times.rng
  name = f"{kind}_{index:02d}"
  base = faults["disk"] if kind == "disk_full" else root
  workdir = base / name
  cmd = cli_command(workdir, cache_dir, args.num_rounds, args.config)
  rounds = kill_times.windows()["rounds"]
  per_round = max(0.05, (rounds[1] - rounds[0]) / max(1, args.num_rounds - 1))
  attempts: list[dict[str, Any]] = []
  problems: list[str] = []
  injected: dict[str, Any] = {}
  redraws = 0
  while True:
    shutil.rmtree(workdir, ignore_errors=True)
    at_round = rng.randint(1, args.num_rounds)
    delay = round(rng.uniform(0.0, 0.5 * per_round), 3)
    log_path = root / f"{name}_0.log"
    injected = {"after_round_line": at_round, "delay_s": delay}
    prefix = faults.get("drop", []) if kind == "unwritable_checkpoints" else []
    tick = time.perf_counter()
    with log_path.open("w") as log:
      process = subprocess.Popen([*prefix, *cmd], stdout=log, stderr=subprocess.STDOUT,
                                 env=dict(env), cwd=REPO)
      mark = f"round {at_round}/{args.num_rounds} "
      while process.poll() is None and mark not in log_path.read_text(errors="replace"):
        time.sleep(0.01)
      if kind == "signal_during_write":
        folder = workdir / "checkpoints"
        deadline = time.perf_counter() + 10 * per_round + 5
        seen = None
        while process.poll() is None and time.perf_counter() < deadline and seen is None:
          names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
          seen = next((n for n in names if ".orbax-checkpoint-tmp" in n
                       and int(n.split(".")[0]) >= at_round), None)
          if seen is None:
            time.sleep(0.0005)
        if seen is not None and process.poll() is None:
          stop = rng.choice((signal.SIGINT, signal.SIGTERM))
          process.send_signal(stop)
          injected.update(signal=signal.Signals(stop).name, writing=seen,
                          writing_round=int(seen.split(".")[0]))
          if rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 0.3))
            if process.poll() is None:
              process.send_signal(stop)
              injected["second_signal"] = True
      else:
        time.sleep(delay)
        if process.poll() is None:
          if kind == "unwritable_checkpoints":
            (workdir / "checkpoints").chmod(0o555)
            injected["read_only"] = "checkpoints"
          else:
            injected["free_bytes"] = rng.randint(0, 64 * 1024)
            injected["filler_bytes"] = fill_disk(faults["disk"], injected["free_bytes"])
      try:
        process.wait(timeout=args.fault_timeout)
        hung = False
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        hung = True
    stderr = log_path.read_text(errors="replace")
    first = {"rc": process.returncode, "hung": hung,
             "wall_s": round(time.perf_counter() - tick, 3), "injected": dict(injected),
             "checkpoints": checkpoint_state(workdir), "metrics_rounds":
                 _rounds_in_metrics(workdir), "leftover_tmp_files": _leftovers(workdir)}
    errors, stops = stop_lines(stderr)
    first["lines"] = [l[:400] for l in errors + stops]
    landed = ("signal" in injected if kind == "signal_during_write"
              else ("read_only" in injected or "filler_bytes" in injected))
    if (not landed or process.returncode == 0) and redraws < 10 and not hung:
      # The run finished before the fault could act: start over at another moment.
      redraws += 1
      _undo(kind, workdir, faults)
      continue
    break
  attempts.append(first)
  # What the faulted process must have done.
  rc, lines = first["rc"], stderr.strip().splitlines()
  last = lines[-1] if lines else ""
  committed = first["checkpoints"]["committed"]
  if hung:
    problems.append(f"did not exit within {args.fault_timeout} s")
  elif not landed:
    problems.append("the fault never landed: the run finished first every time")
  elif "Traceback" in stderr:
    problems.append("a traceback in its output")
  elif kind == "signal_during_write":
    if rc != 130 or len(stops) != 1 or stops[0] != last or errors:
      problems.append(f"exit {rc}, stop lines {stops[:3]}, errors {errors[:3]}, last {last!r}")
    else:
      said = re.search(r"checkpoint of round (\d+)", stops[0])
      said = int(said.group(1)) if said else None
      if committed and said != committed[-1]:
        problems.append(f"the line names round {said}, the disk holds {committed[-1]}")
      writing = injected.get("writing_round")
      discarded = "under way is discarded" in stops[0]
      if writing is not None and not discarded and writing not in committed:
        problems.append(f"the write of round {writing} under way did not finish")
      if discarded and not injected.get("second_signal"):
        problems.append("a write was discarded after one signal")
      if first["checkpoints"]["temporary"] and not discarded:
        problems.append(f"unfinished writes left: {first['checkpoints']['temporary']}")
  else:
    words = "no space left on the device writing '" if kind == "disk_full" else "cannot write '"
    if rc != 1 or len(errors) != 1 or errors[0] != last or stops:
      problems.append(f"exit {rc}, error lines {errors[:3]}, last {last!r}")
    elif words not in errors[0] or str(workdir) not in errors[0]:
      problems.append(f"the error does not name the path: {errors[0][:300]}")
    newest = committed[-1] if committed else 0
    past = [r for r in first["metrics_rounds"] if r > newest or r < 0]
    if past:
      problems.append(f"metrics.jsonl holds rounds {past} past the latest checkpoint {newest}")
    if first["leftover_tmp_files"]:
      problems.append(f"temporary files left: {first['leftover_tmp_files']}")
    if kind == "disk_full" and first["checkpoints"]["temporary"]:
      problems.append(f"unfinished writes left: {first['checkpoints']['temporary']}")
  _undo(kind, workdir, faults)
  # The same command resumes until it exits 0.
  while not attempts[-1].get("hung") and attempts[-1]["rc"] != 0 and (
      len(attempts) < args.max_attempts):
    attempt = run_once(cmd, env, root / f"{name}_{len(attempts)}.log", workdir,
                       args.num_rounds, None)
    attempts.append(attempt)
  finished = attempts[-1]["rc"] == 0 and len(attempts) > 1
  differences = list(problems)
  if not finished and not problems:
    differences.append(f"did not finish: exit status {attempts[-1]['rc']} after "
                       f"{len(attempts)} processes")
  if finished:
    differences += compare_runs(reference, workdir)
  logs = [(root / f"{name}_{k}.log").read_text(errors="replace") for k in range(len(attempts))]
  trial = {"kind": kind, "trial": index, "kills": 0, "redraws": redraws,
           "phases": [], "details": [], "delays_s": [], "damaged": [], "injected": injected,
           "faulted_process": first, "warnings": [w for log in logs for w in warning_lines(log)],
           "refusals": first["lines"], "identical": not differences,
           "outcome": "identical" if not differences else "failed",
           "differences": differences[:50], "attempts": attempts,
           "leftover_temporary_checkpoints": checkpoint_state(workdir)["temporary"],
           "workdir": str(workdir)}
  if not differences and kind == "disk_full":
    shutil.rmtree(workdir, ignore_errors=True)  # the small disk holds one trial at a time
  return trial


def _undo(kind: str, workdir: pathlib.Path, faults: Mapping[str, Any]) -> None:
  """Undoes a fault: the checkpoints folder writable again, the filler deleted."""
  if kind == "unwritable_checkpoints" and (workdir / "checkpoints").is_dir():
    (workdir / "checkpoints").chmod(0o755)
  if kind == "disk_full":
    (faults["disk"] / "filler").unlink(missing_ok=True)


KINDS = ("kill", "corrupt_checkpoint", "truncate_checkpoint", "damage_metrics", "concurrent",
         "flip_record", "flip_identity", "unwritable_checkpoints", "disk_full",
         "signal_during_write")
#: The kinds a soak runs unless --kinds names others.
DEFAULT_KINDS = KINDS[:5]
#: The kinds that inject a fault the run must end on (`run_fault_trial`).
FAULT_KINDS = ("unwritable_checkpoints", "disk_full", "signal_during_write")


def _trial_line(trial: Mapping[str, Any], total: int) -> str:
  where = f"{trial['kind']} {trial['trial'] + 1:2d}/{total}"
  if trial["kind"] == "concurrent":
    return (f"{where}: second start after {trial['gap_s']:.2f} s -> {trial['outcome']}"
            f" ({trial['refusal'] or 'no refusal'})")
  kills = "; ".join(f"{d:5.2f} s {detail}" for d, detail in zip(trial["delays_s"],
                                                               trial["details"]))
  if trial["kind"] in FAULT_KINDS:
    injected = trial["injected"]
    what = {"unwritable_checkpoints": "checkpoints read-only", "disk_full":
            f"disk filled to {injected.get('free_bytes', '?')} B free",
            "signal_during_write": f"{injected.get('signal', 'no signal')} writing "
                                   f"{injected.get('writing', '?')}"
                                   + (" (+ a second)" if injected.get("second_signal") else "")
            }[trial["kind"]]
    line = (trial["refusals"] or ["no line"])[-1]
    return (f"{where}: {what} after round {injected.get('after_round_line')}'s line -> exit "
            f"{trial['faulted_process']['rc']}: {line[:160]} -> {trial['outcome']}")
  damaged = "; ".join(f"{d['action']} {d['file']}" for d in trial["damaged"])
  return (f"{where}: {trial['kills']} kill(s) [{kills}]"
          + (f", {damaged}" if damaged else "")
          + (f", {len(trial['warnings'])} warning(s)" if trial["warnings"] else "")
          + f" -> {trial['outcome']}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                      help=f"comma-separated trial kinds, of {','.join(KINDS)}")
  parser.add_argument("--trials-per-kind", "--trials", dest="trials", type=int, default=20)
  parser.add_argument("--config", default="digits_fcclplus_quick",
                      help="a fedjax_het/configs name, shrunk by TINY_FLAGS")
  parser.add_argument("--seed", type=int, default=0, help="seed of the kill times and damage")
  parser.add_argument("--num-rounds", type=int, default=6)
  parser.add_argument("--second-kill", type=float, default=0.3,
                      help="probability that the first resume is killed too (kind kill)")
  parser.add_argument("--round-focus", type=float, default=0.5,
                      help="probability that a kill time is drawn over the training rounds "
                      "instead of the whole wall time (kind kill)")
  parser.add_argument("--concurrent-gap", type=float, default=3.0,
                      help="the most seconds between the two starts of a concurrent trial")
  parser.add_argument("--time-limit-s", type=float, default=0.0,
                      help="start no trial after this many seconds (0: no limit)")
  parser.add_argument("--fault-timeout", type=float, default=180.0,
                      help="seconds a faulted process has to exit (fault kinds)")
  parser.add_argument("--disk-kib", type=int, default=4096,
                      help="size of the tmpfs the disk_full trials' workdirs live on")
  parser.add_argument("--max-attempts", type=int, default=6,
                      help="processes per trial before giving up")
  parser.add_argument("--tmp-dir", default=None, help="parent of the temporary folder")
  parser.add_argument("--keep", action="store_true",
                      help="keep every workdir (by default only those that differ)")
  parser.add_argument("--out", default=str(DEFAULT_OUT))
  args = parser.parse_args(argv)
  kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
  unknown = sorted(set(kinds) - set(KINDS))
  if unknown:
    parser.error(f"unknown --kinds {unknown}; expected some of {','.join(KINDS)}")

  started = time.perf_counter()
  root = pathlib.Path(tempfile.mkdtemp(prefix="soak_resume_", dir=args.tmp_dir))
  cache_dir = root / "jaxcache"
  env = child_env(root)
  print(f"soak: {args.trials} trials of each of {','.join(kinds)}, {args.config}, seed "
        f"{args.seed}, {args.num_rounds} rounds, in {root}", flush=True)
  # What the fault kinds need; a kind whose fault cannot be made here is skipped, with why.
  faults: dict[str, Any] = {}
  skipped: dict[str, str] = {}
  if "unwritable_checkpoints" in kinds:
    faults["drop"], reason = drop_file_permission_override()
    if reason:
      skipped["unwritable_checkpoints"] = reason
  if "disk_full" in kinds:
    faults["disk"] = root / "disk"
    reason = ("not in a private mount namespace (run the script itself: it re-executes under "
              "unshare -m)" if os.environ.get(PRIVATE_MOUNTS_ENV) != "1"
              else mount_small_disk(faults["disk"], args.disk_kib))
    if reason:
      skipped["disk_full"] = reason
  for kind, reason in skipped.items():
    print(f"skipping {kind}: {reason}", flush=True)

  def command(workdir: pathlib.Path) -> list[str]:
    return cli_command(workdir, cache_dir, args.num_rounds, args.config)

  reference = root / "reference"
  ref = run_once(command(reference), env, root / "reference.log", reference, args.num_rounds,
                 None)
  if ref["rc"] != 0:
    raise RuntimeError(f"the reference run failed (exit {ref['rc']}):\n{ref.get('log_tail')}")
  control_dir = root / "control"
  control = run_once(command(control_dir), env, root / "control.log", control_dir,
                     args.num_rounds, None)
  control["differences"] = (compare_runs(reference, control_dir) if control["rc"] == 0
                            else [f"exit status {control['rc']}"])
  control["identical"] = not control["differences"]
  kill_times = KillTimes(random.Random(args.seed), args.round_focus)
  kill_times.add(control)
  if not kill_times.runs:
    raise RuntimeError(f"the control run logged no compilation or rounds:\n{control}")
  windows = kill_times.windows()
  print(f"reference {ref['wall_s']:.1f} s (cold compilation cache), control "
        f"{control['wall_s']:.1f} s (warm; compiling at "
        f"{control['timeline_s'].get('compiling', math.nan):.1f} s, rounds "
        f"{windows['rounds'][0]:.1f}-{windows['rounds'][1]:.1f} s); control identical to "
        f"reference: {control['identical']}", flush=True)

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  import timing  # noqa: PLC0415 (benchmarks/timing.py, beside this script)
  out = pathlib.Path(args.out)
  trials: list[dict[str, Any]] = []
  kind_wall = collections.Counter()
  stopped_early = False

  def summarize(complete: bool) -> dict[str, Any]:
    per_kind = {}
    for kind in kinds:
      mine = [t for t in trials if t["kind"] == kind]
      per_kind[kind] = {"trials": len(mine),
                        "identical": sum(t["outcome"] == "identical" for t in mine),
                        "refused_correctly": sum(t["outcome"] == "refused correctly"
                                                 for t in mine),
                        "failed": sum(t["outcome"] == "failed" for t in mine),
                        "with_warnings": sum(bool(t["warnings"]) for t in mine),
                        "wall_s": round(kind_wall[kind], 1)}
    passed = sum(t["identical"] for t in trials)
    killed = [t for t in trials if t["kind"] != "concurrent"]
    kills = [p for t in killed for p in t["phases"]]
    return {
        "benchmark": "soak_resume", "command": ["benchmarks/soak_resume.py", *(argv or [])],
        "config": args.config, "train_command": command(pathlib.Path("<workdir>"))[1:],
        "complete": complete, "stopped_early": stopped_early,
        "kinds": kinds, "trials_per_kind": args.trials, "trials": len(trials),
        "seed": args.seed, "num_rounds": args.num_rounds,
        "second_kill": args.second_kill, "round_focus": args.round_focus,
        "concurrent_gap_s": args.concurrent_gap, "time_limit_s": args.time_limit_s,
        "identical": sum(t["outcome"] == "identical" for t in trials),
        "refused_correctly": sum(t["outcome"] == "refused correctly" for t in trials),
        "failed": len(trials) - passed,
        "all_identical": passed == len(trials) and control["identical"],
        "per_kind": per_kind, "kills": len(kills),
        "phase_counts": {p: kills.count(p) for p in PHASES if p in kills},
        "first_kill_phase_counts": dict(collections.Counter(t["phases"][0] for t in killed
                                                            if t["phases"])),
        "wall_s": round(time.perf_counter() - started, 1),
        "reference": ref, "control": control,
        "kill_windows_s": {"first": {k: list(v) for k, v in windows.items()},
                           "last": {k: list(v) for k, v in kill_times.windows().items()}},
        "skipped_kinds": skipped,
        "faults": {"unwritable_checkpoints": "the run without CAP_DAC_OVERRIDE / "
                   "CAP_DAC_READ_SEARCH (uid 0 keeps its files)" if os.geteuid() == 0 else
                   "an unprivileged user",
                   "disk_full": f"a {args.disk_kib} KiB tmpfs in a private mount namespace",
                   "fault_timeout_s": args.fault_timeout},
        "results": trials, "temporary_folder": str(root),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "load_average": list(os.getloadavg())},
    }

  # Round robin over the kinds (trial 0 of each, then trial 1, ...), so that a run stopped
  # by --time-limit-s has as many trials of each kind.
  for index in range(args.trials):
    for kind in kinds:
      if args.time_limit_s and time.perf_counter() - started > args.time_limit_s:
        stopped_early = True
        break
      tick = time.perf_counter()
      if kind == "concurrent":
        trial = run_concurrent_trial(index, root, reference, env, cache_dir, args,
                                     kill_times.rng)
      else:
        if kind in skipped:
          continue
        if kind in FAULT_KINDS:
          trial = run_fault_trial(index, root, reference, env, cache_dir, args, kill_times,
                                  kind, faults)
        else:
          trial = run_trial(index, root, reference, env, cache_dir, args, kill_times, kind)
      kind_wall[kind] += time.perf_counter() - tick
      trial["wall_s"] = round(time.perf_counter() - tick, 2)
      trials.append(trial)
      print(_trial_line(trial, args.trials), flush=True)
      for line in trial["differences"][:5]:
        print(f"    {line}", flush=True)
      if trial["identical"] and not args.keep:
        shutil.rmtree(trial["workdir"], ignore_errors=True)
      timing.write_result(out, summarize(False), indent=2)  # so far
    if stopped_early:
      print(f"stopped after {len(trials)} trials: --time-limit-s {args.time_limit_s} reached",
            flush=True)
      break

  summary = summarize(True)
  phase_counts, kills = summary["phase_counts"], summary["kills"]
  passed = summary["identical"] + summary["refused_correctly"]
  for kind, counts in summary["per_kind"].items():
    print(f"{kind}: {counts}")
  print(f"kills by phase: {phase_counts} ({kills} kills)")
  print(f"passed: {passed}/{len(trials)} (identical {summary['identical']}, refused correctly "
        f"{summary['refused_correctly']}); wall {summary['wall_s']:.0f} s")
  timing.write_result(out, summary, indent=2)
  print(f"wrote {out}")
  if summary["all_identical"] and not args.keep:
    shutil.rmtree(root, ignore_errors=True)
  return summary


if __name__ == "__main__":
  if any("disk_full" in a for a in sys.argv[1:]):
    why_not = in_private_mounts(sys.argv[1:])  # re-executes; returns when it cannot
    if why_not:
      print(f"disk_full: {why_not}", flush=True)
  sys.exit(0 if main(sys.argv[1:])["all_identical"] else 1)

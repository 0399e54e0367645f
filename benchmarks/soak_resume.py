"""Soak test of resume: SIGKILL a training run at random points, resume it, compare bit for bit.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/soak_resume.py \
        --trials 20 --seed 0 \
        --out benchmarks/results/soak_resume__digits_fcclplus_quick-tiny__<device>.json

What it does (everything in a fresh temporary folder; no real data directory):
1. The reference: `experiments/train.py --config=digits_fcclplus_quick` shrunk to small
   CNNs and a few dozen images per participant (`TINY_FLAGS`, `--num-rounds` rounds, a
   checkpoint after every round) runs once uninterrupted. It fills a persistent
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

Prints one line per trial and "identical: X/N"; writes the JSON to `--out`; exits with
status 1 when any trial (or the control) differs from the reference.
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


def cli_command(workdir: pathlib.Path, cache_dir: pathlib.Path, num_rounds: int) -> list[str]:
  """The training command; identical flags for the first run and every resume."""
  return [sys.executable, str(REPO / "experiments" / "train.py"),
          "--config=digits_fcclplus_quick", f"--workdir={workdir}",
          f"--config.num_rounds={num_rounds}", f"--config.compilation_cache_dir={cache_dir}",
          *TINY_FLAGS]


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
  """Committed checkpoint rounds and orbax temporary folders (writes cut short) in `workdir`."""
  folder = workdir / "checkpoints"
  if not folder.is_dir():
    return {"committed": [], "temporary": []}
  committed, temporary = [], []
  for entry in sorted(folder.iterdir()):
    if entry.name.isdigit():
      committed.append(int(entry.name))
    else:
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
             workdir: pathlib.Path, num_rounds: int, kill_after: float | None) -> dict[str, Any]:
  """Runs `cmd` (stdout and stderr to `log_path`), with SIGKILL after `kill_after` seconds."""
  temporary_before = checkpoint_state(workdir)["temporary"]
  started = time.time()
  tick = time.perf_counter()
  with log_path.open("w") as log:
    process = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                               cwd=REPO)
    killed = False
    try:
      process.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
      process.send_signal(signal.SIGKILL)
      process.wait()
      killed = True
  attempt = {"rc": process.returncode, "killed": killed, "wall_s": time.perf_counter() - tick}
  if kill_after is not None:
    attempt["delay_s"] = kill_after
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

  The windows are medians over the control and every later run that trained all rounds
  without being killed: the load of a shared machine changes how long a run takes.
  """

  def __init__(self, rng: random.Random, round_focus: float):
    self.rng, self.round_focus = rng, round_focus
    self.runs: list[tuple[float, float, float]] = []  # (wall, compiled, last round)

  def add(self, attempt: Mapping[str, Any]) -> None:
    marks = attempt.get("timeline_s", {})
    if (not attempt["killed"] and attempt["rc"] == 0 and attempt.get("resumed_from") in (None, 0)
        and "compiled" in marks and "last_round" in marks):
      self.runs.append((attempt["wall_s"], marks["compiled"], marks["last_round"]))

  def windows(self) -> dict[str, tuple[float, float]]:
    wall, compiled, last = (float(np.median(column)) for column in zip(*self.runs))
    return {"whole run": (0.0, wall), "rounds": (compiled, last)}

  def draw(self) -> tuple[float, str]:
    """(seconds after the process start, the window it was drawn from)."""
    windows = self.windows()
    name = "rounds" if self.rng.random() < self.round_focus else "whole run"
    return self.rng.uniform(*windows[name]), name


def run_trial(index: int, root: pathlib.Path, reference: pathlib.Path, env: Mapping[str, str],
              cache_dir: pathlib.Path, args: argparse.Namespace,
              kill_times: KillTimes) -> dict[str, Any]:
  """One trial: kill (maybe twice), resume until exit 0, compare with the reference."""
  workdir = root / f"trial_{index:02d}"
  cmd = cli_command(workdir, cache_dir, args.num_rounds)
  attempts: list[dict[str, Any]] = []
  kills_wanted = 2 if kill_times.rng.random() < args.second_kill else 1
  redraws = 0
  while len(attempts) < args.max_attempts:
    kills = sum(a["killed"] for a in attempts)
    delay, drawn = kill_times.draw() if kills < kills_wanted else (None, None)
    attempt = run_once(cmd, env, root / f"trial_{index:02d}_{len(attempts)}.log", workdir,
                       args.num_rounds, delay)
    if drawn is not None:
      attempt["drawn_over"] = drawn
    kill_times.add(attempt)
    if kills == 0 and not attempt["killed"] and attempt["rc"] == 0 and redraws < 10:
      # The run finished before its first kill: start over so that every trial is killed.
      redraws += 1
      shutil.rmtree(workdir, ignore_errors=True)
      continue
    attempts.append(attempt)
    if not attempt["killed"]:
      break
  killed = [a for a in attempts if a["killed"]]
  finished = bool(attempts) and not attempts[-1]["killed"] and attempts[-1]["rc"] == 0
  if not killed:
    differences = ["never killed: the run finished before every kill time"]
  elif not finished:
    differences = [f"did not finish: exit status {attempts[-1]['rc']} after {len(attempts)} "
                   "processes"]
  else:
    differences = compare_runs(reference, workdir)
  trial = {"trial": index, "kills": len(killed), "redraws": redraws,
           "phases": [a["phase"] for a in killed], "details": [a["detail"] for a in killed],
           "delays_s": [round(a["delay_s"], 3) for a in killed],
           "identical": not differences, "differences": differences[:50],
           "attempts": attempts, "leftover_temporary_checkpoints":
               checkpoint_state(workdir)["temporary"], "workdir": str(workdir)}
  return trial


def _trial_line(trial: Mapping[str, Any], total: int) -> str:
  kills = "; ".join(f"{d:5.2f} s {detail}" for d, detail in zip(trial["delays_s"],
                                                               trial["details"]))
  return (f"trial {trial['trial'] + 1:2d}/{total}: {trial['kills']} kill(s) [{kills}] -> "
          f"identical: {'yes' if trial['identical'] else 'NO'}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0, help="seed of the kill times")
  parser.add_argument("--num-rounds", type=int, default=6)
  parser.add_argument("--second-kill", type=float, default=0.3,
                      help="probability that the first resume is killed too")
  parser.add_argument("--round-focus", type=float, default=0.5,
                      help="probability that a kill time is drawn over the training rounds "
                      "instead of the whole wall time")
  parser.add_argument("--max-attempts", type=int, default=6,
                      help="processes per trial before giving up")
  parser.add_argument("--tmp-dir", default=None, help="parent of the temporary folder")
  parser.add_argument("--keep", action="store_true",
                      help="keep every workdir (by default only those that differ)")
  parser.add_argument("--out", default=str(DEFAULT_OUT))
  args = parser.parse_args(argv)

  root = pathlib.Path(tempfile.mkdtemp(prefix="soak_resume_", dir=args.tmp_dir))
  cache_dir = root / "jaxcache"
  env = child_env(root)
  print(f"soak: {args.trials} trials, seed {args.seed}, {args.num_rounds} rounds, in {root}",
        flush=True)

  reference = root / "reference"
  ref = run_once(cli_command(reference, cache_dir, args.num_rounds), env,
                 root / "reference.log", reference, args.num_rounds, None)
  if ref["rc"] != 0:
    raise RuntimeError(f"the reference run failed (exit {ref['rc']}):\n{ref.get('log_tail')}")
  control_dir = root / "control"
  control = run_once(cli_command(control_dir, cache_dir, args.num_rounds), env,
                     root / "control.log", control_dir, args.num_rounds, None)
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

  trials = []
  for index in range(args.trials):
    trial = run_trial(index, root, reference, env, cache_dir, args, kill_times)
    trials.append(trial)
    print(_trial_line(trial, args.trials), flush=True)
    for line in trial["differences"][:5]:
      print(f"    {line}", flush=True)
    if trial["identical"] and not args.keep:
      shutil.rmtree(trial["workdir"], ignore_errors=True)

  identical = sum(t["identical"] for t in trials)
  kills = [p for t in trials for p in t["phases"]]
  phase_counts = {p: kills.count(p) for p in PHASES if p in kills}
  first_kill = collections.Counter(t["phases"][0] for t in trials if t["phases"])
  summary = {
      "benchmark": "soak_resume", "command": cli_command(pathlib.Path("<workdir>"),
                                                          pathlib.Path("<tmp>/jaxcache"),
                                                          args.num_rounds)[1:],
      "trials": args.trials, "seed": args.seed, "num_rounds": args.num_rounds,
      "second_kill": args.second_kill, "round_focus": args.round_focus, "identical": identical,
      "all_identical": identical == args.trials and control["identical"],
      "kills": len(kills), "phase_counts": phase_counts,
      "first_kill_phase_counts": dict(first_kill),
      "reference": ref, "control": control,
      "kill_windows_s": {"first": {k: list(v) for k, v in windows.items()},
                         "last": {k: list(v) for k, v in kill_times.windows().items()}},
      "results": trials, "temporary_folder": str(root),
      "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                  "platform": platform.platform()},
  }
  print(f"kills by phase: {phase_counts} ({len(kills)} kills in {args.trials} trials)")
  print(f"identical: {identical}/{args.trials}")
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  import timing  # noqa: PLC0415 (benchmarks/timing.py, beside this script)
  out = pathlib.Path(args.out)
  timing.write_result(out, summary, indent=2)
  print(f"wrote {out}")
  if summary["all_identical"] and not args.keep:
    shutil.rmtree(root, ignore_errors=True)
  return summary


if __name__ == "__main__":
  sys.exit(0 if main(sys.argv[1:])["all_identical"] else 1)

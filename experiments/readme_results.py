"""Runs the documented example configs and writes their measured tables into the docs.

  python experiments/readme_results.py --run=digits_fcclplus_quick,digits_solo_quick --fresh-cache
  python experiments/readme_results.py          # rewrite the blocks from the record
  python experiments/readme_results.py --check  # exit 1 if a block is stale

`--run` trains each named config with `experiments/train.py` in a fresh
workdir (and, with `--fresh-cache`, a fresh compilation cache), times the whole
command, and stores its results table, wall time, compile and round times, data
provenance and machine in `RECORD` (`benchmarks/results/readme_results__*.json`,
with a header naming the commit, date, device and jax version of the last run);
`--figures DIR` also keeps each run's `accuracy.png` as `DIR/<config>_accuracy.png`.
README.md and docs/results.md hold each block between
`<!-- readme_results:<block> -->` and `<!-- /readme_results -->` (`FILES` says
which block lives where); this script renders the blocks from the record, and
`tests/test_repository.py` checks that the files match it, so every number
these blocks show comes from a recorded run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RECORD = REPO / "benchmarks" / "results" / "readme_results__quick_configs__cpu2.json"

#: Block -> the configs whose runs it shows. "tables" blocks show each run's results
#: table; "summary" blocks one row per run (wall time, AVG inter / intra).
BLOCKS = {
    "main_job": ("digits_fcclplus_quick",),
    "digits_quick": ("digits_fcclplus_quick", "digits_solo_quick"),
    "digits_fedavg_family_quick": tuple(f"digits_{m}_quick" for m in
                                        ("fedavg", "fedprox", "moon", "fedproc", "fedrs")),
    "many_clients_quick": ("mnist_fedavg_quick", "cifar10_fedavg_quick"),
}
SUMMARY_BLOCKS = ("digits_fedavg_family_quick",)

#: Block -> the file (relative to the repository) that holds it.
FILES = {"main_job": "README.md", "digits_quick": "docs/results.md",
         "digits_fedavg_family_quick": "docs/results.md", "many_clients_quick": "docs/results.md"}

_BLOCK = re.compile(r"(<!-- readme_results:(\w+) -->\n)(.*?)(<!-- /readme_results -->)", re.S)


def _minutes(seconds: float) -> str:
  minutes, secs = divmod(int(round(seconds)), 60)
  return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def run_config(name: str, *, fresh_cache: bool, data_dir: str | None,
               figures: pathlib.Path | None = None) -> dict:
  """Trains `name` from the CLI in a fresh workdir; returns its record."""
  with tempfile.TemporaryDirectory() as tmp:
    command = [sys.executable, "experiments/train.py", f"--config={name}",
               f"--workdir={tmp}/run", f"--config.logging.plots={figures is not None}"]
    if fresh_cache:
      command.append(f"--config.compilation_cache_dir={tmp}/jax_cache")
    env = dict(os.environ)
    env.pop("FEDJAX_HET_DATA_DIR", None)
    if data_dir:
      env["FEDJAX_HET_DATA_DIR"] = data_dir
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
      raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    run = pathlib.Path(tmp) / "run"
    compiled = re.search(r"compiled the round\D*([\d.]+) s", done.stderr)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metadata = json.loads((run / "metadata.json").read_text())
    table = (run / "results.md").read_text().split("\n\n")[1].strip()
    if figures is not None:
      figures.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(run / "accuracy.png", figures / f"{name}_accuracy.png")
    return {
        "config": name, "wall_secs": round(wall, 1),
        "compile_secs": float(compiled.group(1)) if compiled else None,
        "round_secs": round(sorted(r["time/round_secs"] for r in records)[len(records) // 2], 1),
        "num_rounds": len(records),
        "table": table, "results": json.loads((run / "results.json").read_text()),
        "substituted": metadata["substituted_by_synthetic"], "sources": metadata["sources"],
        "fresh_cache": fresh_cache,
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU" if metadata["backend"] == "cpu"
                   else metadata["devices"][0],
        "jax": metadata["jax"], "date": datetime.date.today().isoformat(), "commit": _commit(),
    }


def _data_line(run: dict) -> str:
  """Which domains (and the public set) were synthetic: substituted or synthetic by config."""
  synthetic = [d for d, source in run["sources"].items() if source.startswith("synthetic")]
  real = [d for d in run["sources"] if d not in synthetic]
  if not synthetic:
    return "all data real"
  if not real:
    return "all data synthetic (no data bundle)"
  return f"synthetic {', '.join(synthetic)}; real {', '.join(real)}"


def _summary(names: tuple[str, ...], runs: dict[str, dict]) -> str:
  first = runs[names[0]]
  cache = "fresh compilation cache" if first["fresh_cache"] else "compilation cache reused"
  lines = [f"Measured on a {first['machine']} (jax {first['jax']}, {cache}; {_data_line(first)}; "
           f"{first['date']}), mean of the last evaluated rounds:", "",
           "| config | wall time | AVG inter → | AVG intra ↩ |", "|---|---|---|---|"]
  for name in names:
    run = runs[name]
    lines.append(f"| `{name}` | {_minutes(run['wall_secs'])} | "
                 f"{run['results']['inter']['AVG']:.2f} | {run['results']['intra']['AVG']:.2f} |")
  return "\n".join(lines) + "\n"


def render_block(block: str, runs: dict[str, dict]) -> str:
  """The text of `block` from the recorded runs."""
  if block in SUMMARY_BLOCKS:
    return _summary(BLOCKS[block], runs)
  parts = []
  for name in BLOCKS[block]:
    run = runs[name]
    cache = "fresh compilation cache" if run["fresh_cache"] else "compilation cache reused"
    parts.append(
        f"`python experiments/train.py --config={name}`: **{_minutes(run['wall_secs'])}** end "
        f"to end on a {run['machine']} (jax {run['jax']}, {cache}; {_data_line(run)}; "
        f"{run['date']}): compiling the round {_minutes(run['compile_secs'] or 0)}, then "
        f"{run['round_secs']} s per round for {run['num_rounds']} rounds.\n\n{run['table']}\n")
  return "\n".join(parts)


def rewrite(text: str, runs: dict[str, dict]) -> str:
  """`text` with every known block re-rendered from `runs`."""
  def replace(match):
    block = match.group(2)
    if block not in BLOCKS:
      raise SystemExit(f"block {block!r} is not one of {sorted(BLOCKS)}")
    return match.group(1) + render_block(block, runs) + match.group(4)
  return _BLOCK.sub(replace, text)


def load_runs() -> dict[str, dict]:
  """The recorded runs, config name -> record."""
  return json.loads(RECORD.read_text())["runs"] if RECORD.exists() else {}


def _commit() -> str | None:
  """The commit checked out in the repository, or None outside a git checkout."""
  done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
  return (done.stdout.strip() or None) if done.returncode == 0 else None


def header(runs: dict[str, dict]) -> dict:
  """The record's header: the latest run's commit, date, machine and jax version."""
  latest = max(runs.values(), key=lambda run: run["date"])
  return {"commit": latest.get("commit"), "date": latest["date"], "device": latest["machine"],
          "jax": latest["jax"]}


def save_runs(runs: dict[str, dict]) -> None:
  RECORD.write_text(json.dumps({"header": header(runs), "runs": runs}, indent=2,
                               sort_keys=True) + "\n")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run", default="", help="comma-separated config names to (re)run")
  parser.add_argument("--fresh-cache", action="store_true",
                      help="each run compiles from scratch (a first run on a machine)")
  parser.add_argument("--data-dir", default="", help="the .npz bundle ('' = none: synthetic)")
  parser.add_argument("--figures", default="",
                      help="keep each run's accuracy.png in this folder ('' = no figures)")
  parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
  args = parser.parse_args(argv)
  runs = load_runs()
  figures = pathlib.Path(args.figures) if args.figures else None
  for name in [n for n in args.run.split(",") if n]:
    runs[name] = run_config(name, fresh_cache=args.fresh_cache, data_dir=args.data_dir or None,
                            figures=figures)
    print(f"{name}: {_minutes(runs[name]['wall_secs'])}\n{runs[name]['table']}", flush=True)
    save_runs(runs)
  stale = []
  for relative in sorted(set(FILES.values())):
    path = REPO / relative
    if not path.exists():
      continue
    text = path.read_text()
    new = rewrite(text, runs)
    if new != text:
      stale.append(relative)
      if not args.check:
        path.write_text(new)
  if args.check and stale:
    print(f"stale: {', '.join(stale)}: run python experiments/readme_results.py", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

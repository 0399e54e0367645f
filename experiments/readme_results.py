"""Runs the README's example configs and writes their measured tables into the README.

  python experiments/readme_results.py --run=digits_fcclplus_quick,digits_solo_quick
  python experiments/readme_results.py          # rewrite the README blocks from the record
  python experiments/readme_results.py --check  # exit 1 if the README is stale

`--run` trains each named config with `experiments/train.py` in a fresh
workdir (and, with `--fresh-cache`, a fresh compilation cache), times the whole
command, and stores its results table, wall time, compile and round times, data
provenance and machine in `benchmarks/results/readme_runs.json`. The README
holds each block between `<!-- readme_results:<block> -->` and
`<!-- /readme_results -->`; this script renders the blocks from the record, and
`tests/test_repository.py` checks that the README matches it, so every number
the README shows comes from a recorded run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RECORD = REPO / "benchmarks" / "results" / "readme_runs.json"

#: README block -> the configs whose runs it shows. "tables" blocks show each run's results
#: table; "summary" blocks one row per run (wall time, AVG inter / intra).
BLOCKS = {
    "digits_quick": ("digits_fcclplus_quick", "digits_solo_quick"),
    "digits_fedavg_family_quick": tuple(f"digits_{m}_quick" for m in
                                        ("fedavg", "fedprox", "moon", "fedproc", "fedrs")),
}
SUMMARY_BLOCKS = ("digits_fedavg_family_quick",)

_BLOCK = re.compile(r"(<!-- readme_results:(\w+) -->\n)(.*?)(<!-- /readme_results -->)", re.S)


def _minutes(seconds: float) -> str:
  minutes, secs = divmod(int(round(seconds)), 60)
  return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def run_config(name: str, *, fresh_cache: bool, data_dir: str | None) -> dict:
  """Trains `name` from the CLI in a fresh workdir; returns its record."""
  with tempfile.TemporaryDirectory() as tmp:
    command = [sys.executable, "experiments/train.py", f"--config={name}",
               f"--workdir={tmp}/run", "--config.logging.plots=False"]
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
        "jax": metadata["jax"], "date": datetime.date.today().isoformat(),
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
  """The README text of `block` from the recorded runs."""
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
      raise SystemExit(f"README block {block!r} is not one of {sorted(BLOCKS)}")
    return match.group(1) + render_block(block, runs) + match.group(4)
  return _BLOCK.sub(replace, text)


def load_runs() -> dict[str, dict]:
  return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run", default="", help="comma-separated config names to (re)run")
  parser.add_argument("--fresh-cache", action="store_true",
                      help="each run compiles from scratch (a first run on a machine)")
  parser.add_argument("--data-dir", default="", help="the .npz bundle ('' = none: synthetic)")
  parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale")
  args = parser.parse_args(argv)
  runs = load_runs()
  for name in [n for n in args.run.split(",") if n]:
    runs[name] = run_config(name, fresh_cache=args.fresh_cache, data_dir=args.data_dir or None)
    print(f"{name}: {_minutes(runs[name]['wall_secs'])}\n{runs[name]['table']}", flush=True)
    RECORD.write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
  text = README.read_text()
  new = rewrite(text, runs)
  if args.check:
    if new != text:
      print("README.md is stale: run python experiments/readme_results.py", file=sys.stderr)
      return 1
    return 0
  README.write_text(new)
  return 0


if __name__ == "__main__":
  sys.exit(main())

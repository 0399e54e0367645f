"""Runs class-incremental configs x seeds and tabulates them like GLFC Table 1.

  python experiments/cil_benchmark.py \\
      [--configs=cifar100_fedavg_cil_quick,cifar100_icarl_fl_quick,cifar100_glfc_quick] \\
      [--seeds=0,1,2] [--workdir=runs/cil_benchmark] [--set field=value ...] [--verbose]

(--configs defaults to the three quick configs above, --seeds to 0.)

Configs: names as experiments/train.py takes them, resolved by its
`expand_config_name` ("cifar100_glfc_quick" -> experiments/configs/cifar100.py
variant "glfc_quick"), or "<path>.py:<variant>". Every config must be
class-incremental (scenario.name = "class_incremental") and all must share one
task layout (scenario.num_tasks and the classes per task), so that the table's
columns align; otherwise the run stops before training and names the configs.

What it runs: every (config, seed) cell is one ordinary class-incremental run,
`fedjax_het.cil.train.train_class_incremental(config, <workdir>/<config>/seed<s>)`,
with `config.seed = s` and the `--set` overrides (a dotted config field = a
Python literal, or a string, as experiments/benchmark.py). The cells run one
after another in this process, in the order configs x seeds.

Outputs in the workdir (default runs/cil_benchmark):
  table.md      GLFC Table 1 layout: one row per config (its method's label),
                columns = the number of classes seen after each task, then
                Avg. (average incremental accuracy) and the average forgetting,
                in percent; with several seeds each cell is mean ± sample std
                (ddof=1) over seeds, the mean alone with one seed; rewritten
                after every cell, marked partial until every cell is done
  results.json  per config and seed the seen accuracies (fractions), their
                average and the forgetting, the means and stds over seeds, the
                cells' workdirs and data provenance
  accuracy.png  accuracy on the seen classes vs classes seen, one line per
                config (mean over seeds, min-max band), when matplotlib is
                installed
  <config>/seed<s>/  each cell's own run directory (results.md/.json,
                metrics.jsonl, metadata.json, checkpoints, accuracy.png)

Resume: each cell is always handed to train_class_incremental, whose own resume
continues an interrupted run from its latest checkpoint, finds a finished run
finished (nothing is retrained; its results are recomputed from metrics.jsonl)
and refuses a workdir holding a run of another config or other data, naming the
differing fields. So rerunning the same command continues where it stopped.

Errors in the arguments, the configs, the data or a workdir print one line and
exit with status 1 (the traceback with --verbose or FEDJAX_HET_TRACEBACK=1).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/cil_benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections
import numpy as np

from fedjax_het import benchmark_table as table
from fedjax_het import workdir as workdir_lib
from fedjax_het.cil import metrics as cil_metrics
from fedjax_het.config import load_module
from fedjax_het.data import incremental
from fedjax_het.errors import ConfigError

# The FCCL+ table runner: its --set parsing, list parsing and CLI skeleton.
bench = load_module(REPO / "experiments" / "benchmark.py")

SCENARIO = "class_incremental"
DEFAULT_CONFIGS = ("cifar100_fedavg_cil_quick", "cifar100_icarl_fl_quick", "cifar100_glfc_quick")

#: experiments/train.py as a module, whose `expand_config_name` resolves the --configs names.
#: It defines absl flags when loaded, and a second load in one process fails
#: (DuplicateFlagError), so it is loaded once, on first use; a process that has loaded it
#: already (the tests: tests/test_train.py's `cli`) sets this to that module instead.
train_cli: Any = None


def _train_cli_module() -> Any:
  global train_cli  # pylint: disable=global-statement
  if train_cli is None:
    train_cli = load_module(REPO / "experiments" / "train.py")
  return train_cli


def resolve_config(name: str) -> ml_collections.ConfigDict:
  """The config a --configs entry names, resolved as experiments/train.py's --config.

  Args:
    name: "<scenario>_<variant>" (e.g. "cifar100_glfc_quick") or
      "<path>.py[:<variant>]".

  Raises:
    ConfigError: no such config file or variant.
  """
  try:
    (arg,) = _train_cli_module().expand_config_name([f"--config={name}"])
  except SystemExit as error:
    raise ConfigError(f"--configs: {error}") from None
  path, _, variant = arg.removeprefix("--config=").partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"--configs: {name!r} names no config file ({path} does not exist).")
  module = load_module(path)
  try:
    return module.get_config(variant) if variant else module.get_config()
  except ValueError as error:
    raise ConfigError(f"--configs: {name!r}: {error}") from None


def layout(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """(num_tasks, classes per task) of a class-incremental config."""
  scenario = config.scenario
  classes = int(scenario.num_classes) or incremental.INCREMENTAL_DATASETS.get(
      scenario.dataset, 0)
  return int(scenario.num_tasks), classes // int(scenario.num_tasks)


def check_layouts(configs: Mapping[str, ml_collections.ConfigDict]) -> tuple[int, int]:
  """Checks that every config is class-incremental and that all share one task layout.

  Args:
    configs: {name: config}.

  Returns:
    The shared (num_tasks, classes per task).

  Raises:
    ConfigError: no config, a config whose scenario.name is not
      "class_incremental", or configs with different layouts (each is named
      with its layout).
  """
  if not configs:
    raise ConfigError("--configs needs at least one class-incremental config.")
  scenarios = {n: (c.scenario.get("name") if "scenario" in c else None)
               for n, c in configs.items()}
  other = {n: s for n, s in scenarios.items() if s != SCENARIO}
  if other:
    raise ConfigError(
        "--configs: not class-incremental (scenario.name must be "
        f"{SCENARIO!r}): " + ", ".join(f"{n} (scenario.name={s!r})" for n, s in other.items()))
  layouts = {n: layout(c) for n, c in configs.items()}
  if len(set(layouts.values())) > 1:
    listing = ", ".join(f"{n}: {t} tasks of {k} classes" for n, (t, k) in layouts.items())
    raise ConfigError("--configs: the configs' task layouts differ, so the table's columns "
                      f"would not align ({listing}); use configs with the same "
                      "scenario.num_tasks and classes per task, or align them with --set.")
  return next(iter(layouts.values()))


def summarize(results: Mapping[str, Mapping[int, Mapping[str, Any]]], *, num_tasks: int,
              classes_per_task: int) -> dict[str, Any]:
  """Mean and std over seeds of each config's Table 1 numbers.

  Args:
    results: {config name: {seed: its results.json numbers
      ("seen_accuracy" fractions per task, "average_incremental_accuracy",
      "forgetting", "classes_per_task", "method")}}, configs in row order (a
      config with no seed yet is left out).
    num_tasks: the shared number of tasks (the table's columns).
    classes_per_task: the shared classes per task.

  Returns:
    {"num_tasks", "classes_per_task", "columns": [k, 2k, ..., T*k],
     "configs": [...], "rows": {name: {"label": row label, "method": method
     label, "seeds": [...], "seen_accuracy": [{"mean", "std", "per_seed"}
     per task], "average_incremental_accuracy": {...}, "forgetting": {...}
     or None}}}. Fractions; "std" is the sample std (ddof=1), None with one
     seed.

  Raises:
    ConfigError: a run whose numbers do not have the shared layout.
  """
  rows: dict[str, Any] = {}
  for name, per_seed in results.items():
    if not per_seed:
      continue
    seeds = sorted(int(s) for s in per_seed)
    for seed in seeds:
      numbers = per_seed[seed]
      got = (len(numbers.get("seen_accuracy", [])), numbers.get("classes_per_task"))
      if got != (num_tasks, classes_per_task):
        raise ConfigError(f"{name} seed {seed}: its results cover {got[0]} task(s) of "
                          f"{got[1]} classes, not the table's {num_tasks} tasks of "
                          f"{classes_per_task} classes.")

    def stat(values: Sequence[float], seeds=seeds) -> dict[str, Any]:
      mean, std = table._mean_std(values)  # pylint: disable=protected-access
      return {"mean": mean, "std": std, "per_seed": dict(zip(seeds, map(float, values)))}

    seen = np.array([per_seed[s]["seen_accuracy"] for s in seeds], np.float64)
    forgetting = [per_seed[s].get("forgetting") for s in seeds]
    rows[name] = {
        "method": str(per_seed[seeds[0]].get("method", name)), "seeds": seeds,
        "seen_accuracy": [stat(seen[:, t]) for t in range(num_tasks)],
        "average_incremental_accuracy": stat(
            [per_seed[s]["average_incremental_accuracy"] for s in seeds]),
        "forgetting": (None if any(f is None for f in forgetting) else stat(forgetting))}
  methods = [r["method"] for r in rows.values()]
  for name, row in rows.items():  # a method label twice: the config names tell the rows apart
    row["label"] = row["method"] if methods.count(row["method"]) == 1 else (
        f"{row['method']} [{name}]")
  return {"num_tasks": num_tasks, "classes_per_task": classes_per_task,
          "columns": [(t + 1) * classes_per_task for t in range(num_tasks)],
          "configs": list(rows), "rows": rows}


def _cell(stat: Mapping[str, Any] | None) -> str:
  """A fraction's mean ± std as GLFC prints it: percent, one decimal."""
  if stat is None:
    return "–"
  std = None if stat["std"] is None else 100 * stat["std"]
  return table.format_cell(100 * stat["mean"], std, digits=1)


def markdown_table(summary: Mapping[str, Any]) -> str:
  """GLFC Table 1: rows = configs, columns = classes seen after each task, Avg., forgetting."""
  header, align = cil_metrics.table1_header(summary["num_tasks"],
                                            summary["classes_per_task"]).split("\n")
  lines = [header + " Forgetting |", align + "---:|"]
  for name in summary["configs"]:
    row = summary["rows"][name]
    cells = ([row["label"]] + [_cell(s) for s in row["seen_accuracy"]]
             + [_cell(row["average_incremental_accuracy"]), _cell(row["forgetting"])])
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def render_markdown(summary: Mapping[str, Any], *, configs: Sequence[str], seeds: Sequence[int],
                    overrides: Sequence[str], done: int, total: int,
                    substituted: Mapping[str, Sequence[str]]) -> str:
  """table.md: a header, the table and the rows' configs."""
  lines = ["# Federated class-incremental learning: accuracy (%) on all classes seen after "
           "each task (GLFC Table 1 layout)", ""]
  if done < total:
    lines += [f"**Partial: {done} of {total} runs done.**", ""]
  lines += [
      f"- configs: {', '.join(configs)}; seeds: {', '.join(map(str, seeds))}"
      + (f"; overrides: {' '.join(overrides)}" if overrides else ""),
      f"- {summary['num_tasks']} tasks of {summary['classes_per_task']} classes; Avg. = "
      "average incremental accuracy (mean over tasks); Forgetting = average forgetting "
      "after the last task (percentage points)",
      f"- {table.std_line(len(seeds))}"]
  if substituted:
    lines.append("- SYNTHETIC DATA substituted (the numbers say nothing about the real "
                 "dataset): " + "; ".join(f"{n}: {', '.join(d)}" for n, d in substituted.items()))
  lines += ["", markdown_table(summary), ""]
  lines += [f"- {summary['rows'][n]['label']}: `{n}`" for n in summary["configs"]]
  return "\n".join(lines) + "\n"


def plot_accuracy(summary: Mapping[str, Any], path: pathlib.Path, *, title: str) -> bool:
  """accuracy.png: accuracy on the seen classes vs classes seen, a line per config.

  Returns:
    False (nothing written) without matplotlib.
  """
  from fedjax_het.cil import train as cil_train  # pylint: disable=g-import-not-at-top
  curves = []
  for name in summary["configs"]:
    row = summary["rows"][name]
    per_seed = [[100 * s["per_seed"][seed] for s in row["seen_accuracy"]]
                for seed in row["seeds"]]
    curves.append((row["label"], summary["columns"], per_seed))
  return cil_train.plot_seen_accuracy(curves, path, title)


def cell_dir_name(name: str) -> str:
  """A config's directory name in the workdir (a path-form name without its slashes)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "config"


def write_outputs(workdir: pathlib.Path, *, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
                  configs: Sequence[str], seeds: Sequence[int], overrides: Sequence[str],
                  num_tasks: int, classes_per_task: int, wall_seconds: float,
                  figure: bool = False) -> dict[str, Any]:
  """table.md, results.json (and with `figure` accuracy.png) from the cells done so far."""
  summary = summarize({n: {s: c["results"] for s, c in cells.get(n, {}).items()}
                       for n in configs}, num_tasks=num_tasks, classes_per_task=classes_per_task)
  done, total = sum(len(cells.get(n, {})) for n in configs), len(configs) * len(seeds)
  substituted = {f"{n} seed {s}": list(c["metadata"].get("substituted_by_synthetic", []))
                 for n in configs for s, c in cells.get(n, {}).items()
                 if c["metadata"].get("substituted_by_synthetic")}
  workdir_lib.write_atomic(workdir / "table.md", render_markdown(
      summary, configs=configs, seeds=seeds, overrides=overrides, done=done, total=total,
      substituted=substituted))
  numbers = {
      "configs": list(configs), "seeds": list(seeds), "overrides": list(overrides),
      "complete": done == total, "cells_done": done, "cells_total": total,
      "num_tasks": num_tasks, "classes_per_task": classes_per_task,
      "classes_seen": summary["columns"],
      "std": table.STD_CONVENTION + " over seeds (null with one seed)",
      "accuracy_unit": "fraction in [0, 1]", "wall_seconds": wall_seconds,
      "methods": {
          n: {"label": row["label"], "method": row["method"],
              "mean": {"seen_accuracy": [s["mean"] for s in row["seen_accuracy"]],
                       "average_incremental_accuracy":
                           row["average_incremental_accuracy"]["mean"],
                       "forgetting": row["forgetting"] and row["forgetting"]["mean"]},
              "std": {"seen_accuracy": [s["std"] for s in row["seen_accuracy"]],
                      "average_incremental_accuracy": row["average_incremental_accuracy"]["std"],
                      "forgetting": row["forgetting"] and row["forgetting"]["std"]},
              "seeds": {str(s): {
                  "seen_accuracy": list(cells[n][s]["results"]["seen_accuracy"]),
                  "average_incremental_accuracy":
                      cells[n][s]["results"]["average_incremental_accuracy"],
                  "forgetting": cells[n][s]["results"].get("forgetting"),
                  "workdir": cells[n][s]["workdir"], "status": cells[n][s]["status"],
                  "seconds_this_invocation": cells[n][s]["seconds"],
                  "data_sources": cells[n][s]["metadata"].get("sources", {}),
                  "substituted_by_synthetic":
                      cells[n][s]["metadata"].get("substituted_by_synthetic", [])}
                  for s in row["seeds"]}}
          for n, row in summary["rows"].items()},
  }
  workdir_lib.write_atomic(workdir / "results.json",
                           json.dumps(numbers, indent=2, ensure_ascii=False) + "\n")
  if figure and summary["configs"]:
    title = ("accuracy vs classes seen, " + (
        f"mean over seeds {', '.join(map(str, seeds))} (min-max band)" if len(seeds) > 1
        else f"seed {seeds[0]}"))
    plot_accuracy(summary, workdir / "accuracy.png", title=title)
  return numbers


def _status(cell_dir: pathlib.Path, num_rounds: int) -> str:
  """"reused" (a finished run), "resumed" (checkpoints) or "trained" (nothing yet)."""
  try:
    finished = json.loads((cell_dir / "results.json").read_text()).get("rounds_done")
  except (OSError, ValueError):
    finished = None
  if finished == num_rounds:
    return "reused"
  return "resumed" if (cell_dir / "checkpoints").is_dir() else "trained"


def run_cil_benchmark(configs: Mapping[str, ml_collections.ConfigDict], seeds: Sequence[int], *,
                      workdir: str | pathlib.Path | None = None, overrides: Sequence[str] = (),
                      echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains (or resumes, or reuses when finished) every (config, seed) cell; writes the outputs.

  Args:
    configs: {name: class-incremental config}, in row order (`resolve_config`
      gives the CLI's); each cell gets a copy with its seed and the overrides.
    seeds: the seeds.
    workdir: default runs/cil_benchmark under the repository.
    overrides: "dotted.field=value" settings applied to every cell's config.
    echo: where the one-line progress messages go.

  Returns:
    results.json's contents plus "statuses" ({name: {seed: "trained" |
    "resumed" | "reused"}}) and "markdown_path".

  Raises:
    ConfigError: no seed, a bad override, a config that is not
      class-incremental, or configs with different task layouts (before
      anything trains).
  """
  tick = time.perf_counter()
  seeds = list(seeds)
  if not seeds:
    raise ConfigError("--seeds needs at least one entry.")
  names = list(configs)
  dirs = {n: cell_dir_name(n) for n in names}
  if len(set(dirs.values())) < len(dirs):
    raise ConfigError(f"--configs: two configs share a directory name ({dirs}).")
  workdir = pathlib.Path(workdir or REPO / "runs" / "cil_benchmark")
  workdir_lib.check_workdir(workdir)
  # Every config is built (and every override checked) before anything trains.
  cell_configs: dict[tuple[str, int], ml_collections.ConfigDict] = {}
  for name in names:
    for seed in seeds:
      config = ml_collections.ConfigDict(configs[name].to_dict())
      config.seed = int(seed)
      config.name = f"{config.name}_seed{seed}"
      bench.apply_overrides(config, overrides)
      cell_configs[(name, seed)] = config
  num_tasks, k = check_layouts({n: cell_configs[(n, seeds[0])] for n in names})
  workdir.mkdir(parents=True, exist_ok=True)
  from fedjax_het.cil.train import train_class_incremental  # the heavy imports once args are fine

  cells: dict[str, dict[int, dict[str, Any]]] = {}
  common = dict(configs=names, seeds=seeds, overrides=list(overrides), num_tasks=num_tasks,
                classes_per_task=k)
  for index, ((name, seed), config) in enumerate(cell_configs.items(), start=1):
    label = f"[{index}/{len(cell_configs)}] {name} seed {seed}"
    cell_dir = workdir / dirs[name] / f"seed{seed}"
    status = _status(cell_dir, num_tasks * int(config.cil.rounds_per_task))
    if status != "reused":
      echo(f"{label}: {'resuming' if status == 'resumed' else 'training'} in {cell_dir}")
    start = time.perf_counter()
    out = train_class_incremental(config, cell_dir)
    seconds = time.perf_counter() - start
    metadata_path = cell_dir / "metadata.json"
    cells.setdefault(name, {})[seed] = {
        "results": out["results"], "status": status, "seconds": seconds,
        "workdir": str(cell_dir),
        "metadata": json.loads(metadata_path.read_text()) if metadata_path.exists() else {}}
    echo(f"{label}: {status}, Avg. {100 * out['results']['average_incremental_accuracy']:.1f}")
    write_outputs(workdir, cells=cells, wall_seconds=time.perf_counter() - tick, **common)
  wall = time.perf_counter() - tick
  numbers = write_outputs(workdir, cells=cells, wall_seconds=wall, figure=True, **common)
  echo(f"cil benchmark: {workdir / 'table.md'} (wall time {wall:.1f} s)")
  return {**numbers, "markdown_path": str(workdir / "table.md"),
          "statuses": {n: {s: c["status"] for s, c in per_seed.items()}
                       for n, per_seed in cells.items()}}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/cil_benchmark.py",
      description="Runs class-incremental configs x seeds; writes the GLFC Table 1 layout.")
  parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                      help="comma-separated config names, default: %(default)s")
  return bench.add_common_arguments(parser, quick_help=None,
                                    workdir_help="default: runs/cil_benchmark")


def main(argv: Sequence[str] | None = None) -> int:
  return bench.run_main(build_parser(), argv, lambda args, echo: run_cil_benchmark(
      {n: resolve_config(n) for n in bench.parse_list(args.configs, "configs")},
      bench.parse_seeds(args.seeds), workdir=args.workdir, overrides=args.overrides, echo=echo))


if __name__ == "__main__":
  sys.exit(main())

"""The grid's runner: `run(cells, ...)` trains, resumes, copies or skips every cell in order
and rewrites each table's documents after each; `run_configs` runs given configs as the
rows of an unregistered table."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import child
from fedjax_het.grid import progress
from fedjax_het.grid import provenance
from fedjax_het.grid import training
from fedjax_het.grid import twins
from fedjax_het.reports import document
from fedjax_het.reports import tables as tables_lib

#: Each invocation's record (its cells and their statuses), one JSON line, in the results
#: directory.
INVOCATIONS_FILE = "invocations.jsonl"


def check_targets(configs: Mapping[cells_lib.Cell, ml_collections.ConfigDict]) -> None:
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


def run(cells: Sequence[cells_lib.Cell], *,
        results_dir: str | pathlib.Path = cells_lib.DEFAULT_RESULTS,
        overrides: Sequence[str] = (),
        configure: Callable[[ml_collections.ConfigDict, cells_lib.Cell], None] | None = None,
        build_config: Callable[[cells_lib.Cell], ml_collections.ConfigDict] | None = None,
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

  A fresh cell whose run another table already holds finished (`twins.find_twin`: the same
  config file, variant, row fields, seed and recorded config) is copied from it
  (`twins.copy_twin`) instead of trained, with `copy_twins`.

  Args:
    cells: from `cells.plan` or `cells.queue_plan`.
    results_dir: the results directory (default results/ of the repository).
    overrides: "dotted.field=value" settings for every cell.
    configure: called as configure(config, cell) after the overrides (tests
      shrink the models with it); marks the cells as not the paper's setting.
    build_config: builds a cell's config instead of `cell_configs.cell_config` (the
      class-incremental alias passes configs built elsewhere).
    deadline_secs: stop starting cells when fewer than `min_cell_secs` remain
      of this many seconds, and stop the running one at the deadline.
    min_cell_secs: see `deadline_secs`.
    isolate: train each cell in a child process (default: with a deadline).
    train: a stand-in for `training.train_cell` (in-process only; tests).
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
  build = build_config or (lambda cell: cell_configs.cell_config(cell, overrides, configure))
  # Every config is built (and every override checked) before anything trains.
  configs = {cell: build(cell) for cell in cells}
  check_targets(configs)
  custom = configure is not None or build_config is not None
  statuses: dict[str, str] = {}
  written: list[pathlib.Path] = []
  deadline_reached = False
  started = provenance.now()
  copy_to = pathlib.Path(copy_to) if copy_to else None
  twin_dirs: dict[cells_lib.Cell, pathlib.Path | None] = {}

  def twin_of(cell: cells_lib.Cell) -> pathlib.Path | None:
    if not copy_twins or not progress.is_fresh(cell.directory(results_dir)):
      return None
    if cell not in twin_dirs:
      twin_dirs[cell] = twins.find_twin(cell, configs[cell], results_dir)
    return twin_dirs[cell]

  def meta_of(cell: cells_lib.Cell, config: ml_collections.ConfigDict) -> dict[str, Any]:
    return provenance.cell_meta(cell, arguments.significant_overrides(overrides, config), custom)

  try:
    for index, cell in enumerate(cells, start=1):
      config = configs[cell]
      cell_dir = cell.directory(results_dir)
      label = f"[{index}/{len(cells)}] {cell.label}"
      workdir_lib.check_workdir(cell_dir)
      twin = twin_of(cell) if cell.label not in statuses else None
      group = (training.seed_group(cell, cells[index:], configs, results_dir,
                                   lambda c: twin_of(c) is not None)
               if stack_seeds and train is None and twin is None else [])
      remaining = None if deadline_secs is None else deadline_secs - (time.monotonic() - tick)
      if cell.label in statuses:  # trained beside an earlier cell of its row
        pass
      elif twin is not None:
        twins.copy_twin(twin, cell_dir, meta_of(cell, config), results_dir)
        statuses[cell.label] = "copied"
        echo(f"{label}: copied from {twin.relative_to(results_dir).as_posix()} (the same run, "
             f"finished there), {progress.summary_line(cell, cell_dir)}")
      elif len(group) > 1 and not isolate and training.train_stacked(
          group, configs, results_dir, overrides, custom, statuses, label, echo):
        pass
      elif (len(group) > 1 and isolate and remaining is not None
            and remaining >= min_cell_secs
            and child.train_stacked_in_child(group, configs, results_dir, overrides, custom,
                                             statuses, label, timeout=remaining, echo=echo)
            != "not stacked"):
        if statuses[cell.label] == "interrupted":
          deadline_reached = True
          for rest in cells[index:]:
            statuses.setdefault(rest.label, "not started")
      elif progress.is_finished(cell_dir, config):
        statuses[cell.label] = "skipped"
        if (progress.read_json(cell_dir / provenance.CELL_FILE) or {}).get("status") != "finished":
          provenance.update_cell_record(cell_dir, meta_of(cell, config), status="finished")
        echo(f"{label}: skipped (finished earlier), {progress.summary_line(cell, cell_dir)}")
      else:
        if remaining is not None and remaining < min_cell_secs:
          deadline_reached = True
          for rest in cells[index - 1:]:
            statuses.setdefault(rest.label, "not started")
          echo(f"{label}: not started ({remaining:.0f} s left of the {deadline_secs:g} s "
               f"deadline, a cell needs {min_cell_secs:g} s); rerun to continue")
          break
        resuming = progress.rounds_done(cell_dir) > 0 or (cell_dir / "checkpoints").is_dir()
        echo(f"{label}: {'resuming' if resuming else 'training'} "
             f"{cell_configs.expected_rounds(config)} rounds in {cell_dir}")
        meta = meta_of(cell, config)
        cell_tick = time.perf_counter()
        if isolate:
          status = child.train_in_child(config, cell_dir, meta, timeout=remaining or 1e9,
                                        echo=echo)
        else:
          status = training.train_recorded(config, cell_dir, meta, train)
        seconds = time.perf_counter() - cell_tick
        if status == "interrupted":
          statuses[cell.label] = "interrupted"
          deadline_reached = True
          for rest in cells[index:]:
            statuses.setdefault(rest.label, "not started")
        else:
          statuses[cell.label] = "resumed" if resuming else "trained"
          echo(f"{label}: {statuses[cell.label]} ({seconds:.1f} s), "
               f"{progress.summary_line(cell, cell_dir)}")
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
    record = {"start": started, "end": provenance.now(),
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
  cells = [cells_lib.Cell(table, setting, row, int(seed), scale)
           for seed in seeds for row in rows]
  by_key = {keys[n]: c for n, c in configs.items()}

  def build(cell: cells_lib.Cell) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(by_key[cell.row.key].to_dict())
    config.seed = int(cell.seed)
    config.name = f"{config.name}_seed{cell.seed}"
    arguments.apply_overrides(config, overrides)
    return config

  results_dir = pathlib.Path(kwargs.pop("results_dir", cells_lib.DEFAULT_RESULTS))
  out = run(cells, results_dir=results_dir, build_config=build, overrides=overrides, **kwargs)
  return {**out, "table_dir": results_dir / table_id / scale,
          "cell_dirs": {n: {int(s): cells_lib.Cell(table, setting, r, int(s),
                                                   scale).directory(results_dir)
                            for s in seeds} for n, r in zip(configs, rows)}}

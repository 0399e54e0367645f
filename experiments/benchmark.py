"""Runs a grid of methods x seeds on one scenario and tabulates it like FCCL+ Tables VIII/IX.

  python experiments/benchmark.py --scenario=digits \\
      --methods=solo,fedmd,feddf,fedmatch,rhfl,fccl,fcclplus --seeds=0,1,2 [--quick] \\
      [--workdir=runs/benchmark_digits] [--set field=value ...] [--verbose]

(--methods defaults to every method of the tables, solo,fedmd,feddf,fedmatch,rhfl,fccl,
fcclplus; --seeds to 0.)

Scenarios: those of FCCL+ Tables VIII/IX that experiments/configs/ provides:
digits (experiments/configs/digits.py) and, through experiments/configs/office.py
where present, office_caltech, office31, office_home.

What it runs: every (method, seed) cell is one ordinary training run,
`fedjax_het.train.train_and_evaluate(config, <workdir>/<method>/seed<s>)`, with
config `experiments/configs/<scenario>.py:get_config("<method>[_quick]")` (for
the Office scenarios `office.py:get_config("<caltech|office31|home>_<method>[_quick]")`),
`config.seed = s` and the `--set` overrides (a dotted config field = a Python
literal, or a string; e.g. `--set num_rounds=10 --set local.epochs=2`). The FCCL
row is the benchmark's FCCL (FCCL+ Table VIII): its collaborative target is the
mean of every participant's current logits, its own included
(`fccl.own_slot=current`, `TABLE_SETTINGS`), not the conference code's previous-
round model in the participant's own slot (the default of `digits_fccl`). The
cells run one after another in this one process, in the order methods x seeds;
seeds are not vmapped together (each seed is a separate run and compiles from
the same persistent compilation cache, `config.compilation_cache_dir`).

Outputs in the workdir (default runs/benchmark_<scenario>[_quick]):
  benchmark.md    a header (scenario, quick or full configs, seeds, which
                  domains are real or synthetic from the cells' metadata.json,
                  the std convention) and two tables, "inter →" and "intra ↩":
                  rows = methods, columns = participants, AVG and Δ vs BASE
                  (solo), each cell `mean ± std` over seeds (sample std,
                  ddof=1; the mean alone with one seed), with the paper's
                  number beside it in the paper's setting (full configs, real
                  data, no overrides); rewritten after every cell, marked
                  partial until the grid is done
  benchmark.json  the same numbers, per seed too, the paper's numbers, the data
                  provenance, the wall time of this invocation ("wall_seconds")
                  and of each cell ("seconds": the time the invocation that
                  trained it spent on it, kept from the previous benchmark.json
                  when the cell is skipped; "training_seconds": the sum of its
                  round times from metrics.jsonl)
  benchmark_accuracy.png
                  mean intra- and inter-domain accuracy over participants per
                  round for every method (mean over seeds, min-max band)
  <method>/seed<s>/  each cell's own run directory (results.md/.json,
                  metrics.jsonl, metadata.json, checkpoints, plots)

Resume: a cell whose results.json exists and whose metrics.jsonl reaches
config.num_rounds is finished and skipped, provided its run.json records the
same config (otherwise the run stops and names the differing fields; delete
the cell's directory to retrain it, or use another --workdir). An interrupted
cell resumes from its latest checkpoint through train_and_evaluate's own
resume, which also checks that config and data are unchanged. So rerunning the
same command after a crash or a kill continues where it stopped.

An unknown scenario or method, a malformed --set or --seeds, and the errors
train_and_evaluate reports about the config, the data or a workdir print one
line and exit with status 1 (the traceback with --verbose or
FEDJAX_HET_TRACEBACK=1).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import logging
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections

from fedjax_het import benchmark_table as table
from fedjax_het import workdir as workdir_lib
from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError, UserError, WorkdirError

CONFIGS = REPO / "experiments" / "configs"

logger = logging.getLogger("benchmark")


def scenario_configs() -> dict[str, tuple[pathlib.Path, str]]:
  """{scenario: (config file, variant prefix)} for the scenarios of FCCL+ Tables VIII/IX.

  experiments/configs/<scenario>.py gives variants "<method>[_quick]"; a config
  file with a `SCENARIOS` dict {prefix: scenario} (office.py) gives
  "<prefix>_<method>[_quick]".
  """
  found: dict[str, tuple[pathlib.Path, str]] = {}
  for path in sorted(CONFIGS.glob("*.py")):
    if path.stem in table.PAPER_DOMAINS:
      found.setdefault(path.stem, (path, ""))
      continue
    try:
      module = load_module(path)
    except Exception:  # pylint: disable=broad-except
      continue  # a config file that does not load offers no scenario
    prefixes = getattr(module, "SCENARIOS", None)
    if isinstance(prefixes, Mapping):
      for prefix, name in prefixes.items():
        if name in table.PAPER_DOMAINS:
          found.setdefault(str(name), (path, f"{prefix}_"))
  return found


def allowed_scenarios() -> list[str]:
  """The multi-domain scenarios (those of the paper's tables) with a config file."""
  return sorted(scenario_configs())


def load_config_module(scenario: str) -> tuple[Any, str]:
  """(the scenario's config module, its variant prefix)."""
  known = scenario_configs()
  if scenario not in known:
    raise ConfigError(f"--scenario={scenario!r} is not allowed; allowed scenarios: "
                      f"{', '.join(sorted(known))} (the multi-domain scenarios of FCCL+ "
                      f"Tables VIII/IX that experiments/configs/ provides).")
  path, prefix = known[scenario]
  return load_module(path), prefix


def allowed_methods(module: Any) -> list[str]:
  """The methods of FCCL+ Tables VIII/IX that the scenario's config file provides."""
  provided = getattr(module, "METHODS", table.TABLE_METHODS)
  return [m for m in table.TABLE_METHODS if m in provided]


def parse_list(text: str, what: str) -> list[str]:
  items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
  if not items:
    raise ConfigError(f"--{what} must be a comma-separated list, got {text!r}.")
  return items


def parse_seeds(text: str) -> list[int]:
  seeds = []
  for item in parse_list(text, "seeds"):
    try:
      seeds.append(int(item))
    except ValueError:
      raise ConfigError(f"--seeds must be comma-separated integers (e.g. 0,1,2), got "
                        f"{text!r}.") from None
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


#: Settings of the table's rows that differ from the method's own config: FCCL+ Table VIII's
#: FCCL row comes from the benchmark's FCCL, whose collaborative target is the mean of every
#: participant's current logits, its own included (the conference code puts the participant's
#: previous-round model in its own slot instead, the default of experiments/configs).
TABLE_SETTINGS = {"fccl": {"fccl.own_slot": "current"}}


def cell_config(module: Any, method: str, seed: int, *, quick: bool, prefix: str = "",
                overrides: Sequence[str] = (),
                configure: Callable[[ml_collections.ConfigDict, str], None] | None = None
                ) -> ml_collections.ConfigDict:
  """get_config("<prefix><method>[_quick]") with the seed, the overrides and `configure`."""
  config = module.get_config(f"{prefix}{method}{'_quick' if quick else ''}")
  config.update_from_flattened_dict(TABLE_SETTINGS.get(method, {}))
  config.seed = int(seed)
  config.name = f"{config.name}_seed{seed}"
  apply_overrides(config, overrides)
  if configure is not None:
    configure(config, method)
  return config


def _read_json(path: pathlib.Path) -> Any:
  return json.loads(path.read_text()) if path.exists() else None


def _records(cell_dir: pathlib.Path) -> list[dict[str, Any]]:
  from fedjax_het import reporting
  return reporting.MetricsWriter(cell_dir, tensorboard=False).read()


def is_finished(cell_dir: pathlib.Path, config: ml_collections.ConfigDict) -> bool:
  """True for a cell whose run completed config.num_rounds (results.json written).

  Raises WorkdirError when it finished with a different config (the data are
  not fingerprinted again here; train_and_evaluate checks them on a resume).
  """
  if not (cell_dir / "results.json").exists():
    return False
  records = _records(cell_dir)
  if not records or int(records[-1]["round"]) < int(config.num_rounds):
    return False
  recorded = _read_json(cell_dir / workdir_lib.RUN_FILE)
  if recorded is not None:
    # Compare the configs only: the same (absent) fingerprint on both sides.
    lines = workdir_lib.differences(
        {"config": recorded.get("config", {})},
        {"config": workdir_lib.flatten_config(config), "data": {"fingerprint": None,
                                                                "sources": {}}},
        workdir_lib.allowed_changes(config))
    if lines:
      listing = "\n  ".join(lines)
      raise WorkdirError(
          f"cell {str(cell_dir)!r} holds a finished run with a different config:\n  {listing}\n"
          "Delete that directory to retrain the cell, or pass --workdir=<another directory>.")
  return True


def _significant(overrides: Sequence[str], config: ml_collections.ConfigDict) -> list[str]:
  """The overrides of fields that change results (not logging, caching, ...)."""
  neutral = workdir_lib.allowed_changes(config)
  return [o for o in overrides
          if not any(parse_override(o)[0] == f or parse_override(o)[0].startswith(f + ".")
                     for f in neutral)]


def _num_classes(config: ml_collections.ConfigDict) -> int | None:
  from fedjax_het.data import SCENARIOS
  spec = SCENARIOS.get(str(config.scenario.name))
  return spec.num_classes if spec is not None else None


def run_cell(config: ml_collections.ConfigDict, cell_dir: pathlib.Path, *, label: str,
             previous: Mapping[str, Any] | None = None,
             train: Callable[[ml_collections.ConfigDict, pathlib.Path], Any] | None = None,
             echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains one cell in `cell_dir`, resumes it, or skips it when finished (`is_finished`).

  Args:
    config: the cell's config.
    cell_dir: its run directory.
    label: the start of its progress line ("[1/4] fcclplus seed 0").
    previous: its entry in the previous invocation's outputs ("seconds",
      "workdir"): a skipped cell keeps the time it took in the invocation that
      trained it.
    train: `fedjax_het.train.train_and_evaluate` (the default) or a stand-in.
    echo: where the "training ..." line goes.

  Returns:
    {"status": "trained" | "resumed" | "skipped", "seconds_this_invocation",
     "seconds", "workdir", "training_seconds" (sum of its round times),
     "results" (results.json), "metadata" (metadata.json), "records"
     (metrics.jsonl)}.
  """
  previous = previous or {}
  tick = time.perf_counter()
  if is_finished(cell_dir, config):
    status = "skipped"
  else:
    if train is None:
      # pylint: disable-next=g-import-not-at-top
      from fedjax_het.train import train_and_evaluate as train
    resuming = (cell_dir / "checkpoints").is_dir()
    echo(f"{label}: {'resuming' if resuming else 'training'} {config.num_rounds} rounds "
         f"in {cell_dir}")
    train(config, cell_dir)
    status = "resumed" if resuming else "trained"
  seconds = time.perf_counter() - tick
  records = _records(cell_dir)
  return {
      "status": status, "seconds_this_invocation": seconds,
      "seconds": (seconds if status != "skipped" else
                  previous.get("seconds") if previous.get("workdir") == str(cell_dir) else None),
      "workdir": str(cell_dir),
      "training_seconds": float(sum(r.get("time/round_secs", 0.0) for r in records)),
      "results": _read_json(cell_dir / "results.json") or {},
      "metadata": _read_json(cell_dir / "metadata.json") or {},
      "records": records}


def write_outputs(workdir: pathlib.Path, *, scenario: str, quick: bool, methods: Sequence[str],
                  seeds: Sequence[int], overrides: Sequence[str], cells: Mapping[str, Any],
                  wall_seconds: float, total: int, custom_hook: bool, configs_text: str,
                  figure: bool = False, num_classes: int | None = None,
                  significant: Sequence[str] = ()) -> dict[str, Any]:
  """benchmark.md, benchmark.json (and with `figure` benchmark_accuracy.png) from the cells."""
  results = {m: {s: c["results"] for s, c in cells.get(m, {}).items()} for m in methods}
  summary = table.summarize(results)
  sources = table.provenance([c["metadata"] for m in methods for c in cells.get(m, {}).values()
                              if c.get("metadata")])
  setting_overrides = list(significant) + (["a custom configure hook"] if custom_hook else [])
  show_paper, setting_text = table.paper_setting(scenario=scenario, quick=quick, sources=sources,
                                                 overrides=setting_overrides,
                                                 domains=summary["columns"][:-1])
  last = {len(c["results"].get("rounds", [])) for m in methods for c in cells.get(m, {}).values()}
  done = sum(len(cells.get(m, {})) for m in methods)
  markdown = table.render_markdown(
      summary, scenario=scenario, quick=quick, seeds=seeds,
      provenance_text=table.provenance_line(sources), setting_text=setting_text,
      show_paper=show_paper, last_rounds=last.pop() if len(last) == 1 else None,
      overrides=overrides, done=done, total=total, configs_text=configs_text)
  workdir_lib.write_atomic(workdir / "benchmark.md", markdown)
  paper = {kind: {m: table.paper_numbers(scenario, m, kind) for m in methods
                  if table.paper_numbers(scenario, m, kind)} for kind in table.KINDS}
  numbers = {
      "scenario": scenario, "quick": quick, "methods": list(methods), "seeds": list(seeds),
      "overrides": list(overrides), "complete": done == total, "cells_done": done,
      "cells_total": total, "std": table.STD_CONVENTION + " over seeds (null with one seed)",
      "data_sources": sources, "all_real_data": table.all_real(sources),
      "paper_setting": show_paper, "paper_setting_reason": setting_text,
      "paper": paper if show_paper else {}, "paper_available": paper,
      "summary": summary, "wall_seconds": wall_seconds,
      "cells_seconds": sum(c["seconds"] or 0.0 for m in methods
                           for c in cells.get(m, {}).values()),
      "cells": {m: {str(s): {k: v for k, v in c.items() if k != "records"}
                    for s, c in cells.get(m, {}).items()} for m in methods},
  }
  workdir_lib.write_atomic(workdir / "benchmark.json",
                           json.dumps(numbers, indent=2, ensure_ascii=False) + "\n")
  if figure:
    curves = {m: {kind: table.mean_curves([c["records"] for c in cells[m].values()], kind)
                  for kind in table.KINDS} for m in methods if cells.get(m)}
    title = (f"{scenario} ({'quick' if quick else 'full'} configs): accuracy per round, "
             + (f"mean over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1
                else f"seed {seeds[0]}"))
    table.plot_benchmark_curves(curves, workdir / "benchmark_accuracy.png", title=title,
                                num_classes=num_classes,
                                labels={m: table.METHOD_LABELS.get(m, m) for m in curves})
  return numbers


def run_benchmark(scenario: str, methods: Sequence[str], seeds: Sequence[int], *,
                  quick: bool = False, workdir: str | pathlib.Path | None = None,
                  overrides: Sequence[str] = (),
                  configure: Callable[[ml_collections.ConfigDict, str], None] | None = None,
                  echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains (or skips, when finished) every (method, seed) cell, then writes the outputs.

  Args:
    scenario, methods, seeds, quick, overrides: as the command-line flags.
    workdir: default runs/benchmark_<scenario>[_quick] under the repository.
    configure: called as configure(config, method) on each cell's config after
      the overrides (tests use it to shrink the models and data); marks the
      setting as not the paper's.
    echo: where the one-line progress messages go.

  Returns:
    benchmark.json's contents plus "trained", "skipped" (lists of (method, seed))
    and "markdown_path".
  """
  tick = time.perf_counter()
  module, prefix = load_config_module(scenario)
  known = allowed_methods(module)
  unknown = [m for m in methods if m not in known]
  if unknown:
    raise ConfigError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}; allowed "
                      f"methods for {scenario}: {', '.join(known)}.")
  if not methods or not seeds:
    raise ConfigError("--methods and --seeds need at least one entry each.")
  default = REPO / "runs" / f"benchmark_{scenario}{'_quick' if quick else ''}"
  workdir = pathlib.Path(workdir or default)
  workdir_lib.check_workdir(workdir)
  # Every config is built (and every override checked) before anything trains.
  configs = {(m, s): cell_config(module, m, s, quick=quick, prefix=prefix, overrides=overrides,
                                 configure=configure) for m in methods for s in seeds}
  first = configs[(methods[0], seeds[0])]
  significant = _significant(overrides, first)
  workdir.mkdir(parents=True, exist_ok=True)
  from fedjax_het.train import train_and_evaluate  # the heavy imports only once the args are fine

  # A skipped cell keeps the time it took in the invocation that trained it.
  previous = (_read_json(workdir / "benchmark.json") or {}).get("cells", {})
  cells: dict[str, dict[int, dict[str, Any]]] = {}
  trained, skipped = [], []
  total = len(configs)
  configs_text = (f"experiments/configs/{module.__file__.rsplit('/', 1)[-1]}:{prefix}<method>"
                  f"{'_quick' if quick else ''}")
  if "fccl" in methods:
    configs_text += " (FCCL as the benchmark runs it: fccl.own_slot=current)"
  common = dict(scenario=scenario, quick=quick, methods=methods, seeds=seeds,
                configs_text=configs_text,
                overrides=list(overrides), total=total, custom_hook=configure is not None,
                significant=significant)
  for index, ((method, seed), config) in enumerate(configs.items(), start=1):
    label = f"[{index}/{total}] {method} seed {seed}"
    cell = run_cell(config, workdir / method / f"seed{seed}", label=label,
                    previous=previous.get(method, {}).get(str(seed), {}),
                    train=train_and_evaluate, echo=echo)
    (skipped if cell["status"] == "skipped" else trained).append((method, seed))
    cells.setdefault(method, {})[seed] = cell
    results, status, seconds = cell["results"], cell["status"], cell["seconds"]
    shown = " ".join(f"{k} {results[k]['AVG']:.2f}" for k in table.KINDS
                     if "AVG" in results.get(k, {}))
    echo(f"{label}: {status} ({'finished earlier' if status == 'skipped' else f'{seconds:.1f} s'})"
         f", AVG {shown or '(no evaluation)'}")
    write_outputs(workdir, cells=cells, wall_seconds=time.perf_counter() - tick, **common)
  wall = time.perf_counter() - tick
  numbers = write_outputs(workdir, cells=cells, wall_seconds=wall, figure=True,
                          num_classes=_num_classes(first), **common)
  echo(f"benchmark: {workdir / 'benchmark.md'} ({len(trained)} cell(s) trained, "
       f"{len(skipped)} skipped; wall time {wall:.1f} s)")
  return {**numbers, "trained": trained, "skipped": skipped,
          "markdown_path": str(workdir / "benchmark.md")}


def add_common_arguments(parser: argparse.ArgumentParser, *, quick_help: str | None,
                         workdir_help: str) -> argparse.ArgumentParser:
  """Adds the options the benchmark runners share to `parser`.

  --seeds (comma-separated integers, default "0"), --quick (unless `quick_help`
  is None), --workdir (default None), --set FIELD=VALUE (repeatable, into
  `args.overrides`) and --verbose.

  Args:
    parser: the runner's parser, holding its own options already.
    quick_help: the help text of --quick (which configs it selects); None: no
      --quick (a runner whose config names say quick or not themselves).
    workdir_help: the help text of --workdir (its default).

  Returns:
    `parser`.
  """
  parser.add_argument("--seeds", default="0", help="comma-separated integers, default: 0")
  if quick_help is not None:
    parser.add_argument("--quick", action="store_true", help=quick_help)
  parser.add_argument("--workdir", default=None, help=workdir_help)
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="config override, repeatable")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of configuration, data and workdir errors")
  return parser


def run_main(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             run: Callable[[argparse.Namespace, Callable[[str], None]], Any]) -> int:
  """A benchmark runner's `main`: parses `argv`, sets up logging, reports user errors in one line.

  Args:
    parser: the runner's parser (with `add_common_arguments`' options).
    argv: the command-line arguments (None: sys.argv[1:]).
    run: called as run(args, echo) with the parsed arguments and a print that
      flushes; its result is ignored.

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
    run(args, lambda line: print(line, flush=True))
  except UserError as error:
    if args.verbose or os.environ.get("FEDJAX_HET_TRACEBACK", "") not in ("", "0"):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/benchmark.py",
      description="Runs methods x seeds on one scenario; writes the FCCL+ Table VIII/IX layout.")
  parser.add_argument("--scenario", required=True, help="e.g. digits")
  parser.add_argument("--methods", default=",".join(table.TABLE_METHODS),
                      help="comma-separated, default: %(default)s")
  return add_common_arguments(parser, quick_help="the <method>_quick configs",
                              workdir_help="default: runs/benchmark_<scenario>[_quick]")


def main(argv: Sequence[str] | None = None) -> int:
  return run_main(build_parser(), argv, lambda args, echo: run_benchmark(
      args.scenario, parse_list(args.methods, "methods"), parse_seeds(args.seeds),
      quick=args.quick, workdir=args.workdir, overrides=args.overrides, echo=echo))


if __name__ == "__main__":
  sys.exit(main())

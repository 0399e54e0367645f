"""Runs FedAvg / FedMMD / FedFusion x seeds on one setting: rounds to target and bytes.

  python experiments/rounds_benchmark.py --dataset=mnist --setting=permuted \\
      --methods=fedavg,fedmmd,fedmmd_l2,fedfusion_conv,fedfusion_multi,fedfusion_single \\
      --seeds=0,1,2 [--quick] [--workdir=runs/rounds_mnist_permuted] [--set field=value ...]

(--methods defaults to all six, --seeds to 0.)

Settings: those of experiments/configs/_two_stream.py (Yao et al., "Federated
Learning with Additional Mechanisms on Clients to Reduce Communication Costs"):
cifar10 binary | iid, mnist binary | shards | permuted.

What it runs: every (method, seed) cell is one ordinary training run,
`fedjax_het.train.train_and_evaluate(config, <workdir>/<method>/seed<s>)`, with
config `experiments/configs/<dataset>.py:get_config(...)` of the method token:
fedavg -> <method>_<setting> (FedAvg), fedmmd -> fedmmd_<setting> (the MMD
constraint), fedmmd_l2 -> fedmmd_<setting>_l2 (the authors' code's L2 on the
logits), fedfusion_conv|multi|single -> fedfusion_<setting>_<operator>, each
with _quick under --quick; `config.seed = s` and the `--set` overrides (a
dotted config field = a Python literal, or a string). The cells run one after
another in this process, in the order methods x seeds.

Outputs in the workdir (default runs/rounds_<dataset>_<setting>[_quick]):
  rounds.md     a header (dataset, setting, quick or full, seeds, real or
                synthetic data from the cells' metadata.json, std convention)
                and three tables (`fedjax_het.rounds_table`): the final
                accuracy (FedFusion Table 1 layout), the rounds to reach each
                of config.eval.targets and the reduction vs FedAvg (Table 2
                layout), the bytes per round and up to each target; the
                paper's numbers beside ours in its setting (full configs, real
                data, no overrides) where it reports them; rewritten after
                every cell, marked partial until the grid is done
  rounds.json   the same numbers, per seed too, the data provenance, the wall
                time of this invocation and of each cell (as
                experiments/benchmark.py's benchmark.json)
  rounds_accuracy.png
                accuracy per round, a line per method (mean over seeds, min-max
                band), the targets as dotted lines (the paper's Figs. 4-5)
  <method>/seed<s>/  each cell's own run directory

Resume: exactly as experiments/benchmark.py (its `run_cell` and `is_finished`):
a finished cell (results.json, metrics.jsonl up to config.num_rounds, the same
config in run.json) is skipped, a finished cell with another config stops the
run naming the differing fields, an interrupted one resumes from its latest
checkpoint. Errors in the arguments, the config, the data or a workdir print
one line and exit with status 1 (the traceback with --verbose or
FEDJAX_HET_TRACEBACK=1).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/rounds_benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections

from fedjax_het import benchmark_table as table
from fedjax_het import rounds_table as rt
from fedjax_het import workdir as workdir_lib
from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError

# The FCCL+ table runner: its cell loop, resume checks, --set parsing and CLI skeleton.
bench = load_module(REPO / "experiments" / "benchmark.py")
CONFIGS = REPO / "experiments" / "configs"


def settings() -> dict[str, tuple[str, ...]]:
  """{dataset: its settings} of experiments/configs/_two_stream.py."""
  two_stream = load_module(CONFIGS / "_two_stream.py")
  return {d: tuple(s) for d, s in two_stream.SETTINGS.items() if (CONFIGS / f"{d}.py").exists()}


def load_dataset_module(dataset: str, setting: str) -> Any:
  """experiments/configs/<dataset>.py, after checking the dataset and the setting."""
  known = settings()
  if dataset not in known:
    raise ConfigError(f"--dataset={dataset!r} is not allowed; allowed datasets: "
                      f"{', '.join(sorted(known))}.")
  if setting not in known[dataset]:
    raise ConfigError(f"--setting={setting!r} is not allowed for {dataset}; allowed settings: "
                      f"{', '.join(known[dataset])}.")
  return load_module(CONFIGS / f"{dataset}.py")


def cell_config(module: Any, method: str, setting: str, seed: int, *, quick: bool,
                overrides: Sequence[str] = (),
                configure: Callable[[ml_collections.ConfigDict, str], None] | None = None
                ) -> ml_collections.ConfigDict:
  """The config of one cell: benchmark.cell_config of the method token's variant."""
  config = bench.cell_config(module, rt.config_variant(method, setting, quick=False), seed,
                             quick=quick, overrides=overrides)
  if configure is not None:
    configure(config, method)
  return config


def _train_images(metadatas: Sequence[Mapping[str, Any]]) -> int | None:
  """The cells' training set size in all, None when unknown or not the same in every cell."""
  sizes = {sum(m.get("train_sizes", {}).values()) for m in metadatas if m.get("train_sizes")}
  return sizes.pop() if len(sizes) == 1 else None


def write_outputs(workdir: pathlib.Path, *, dataset: str, setting: str, quick: bool,
                  methods: Sequence[str], seeds: Sequence[int], overrides: Sequence[str],
                  cells: Mapping[str, Mapping[int, Mapping[str, Any]]], targets: Sequence[float],
                  wall_seconds: float, total: int, configs_text: str, num_rounds_text: str,
                  significant: Sequence[str] = (), custom_hook: bool = False,
                  figure: bool = False) -> dict[str, Any]:
  """rounds.md, rounds.json (and with `figure` rounds_accuracy.png) from the cells."""
  done_cells = {m: dict(cells[m]) for m in methods if cells.get(m)}
  summary = rt.summarize(done_cells, targets=targets)
  metadatas = [c["metadata"] for per_seed in done_cells.values() for c in per_seed.values()
               if c.get("metadata")]
  sources = table.provenance(metadatas)
  setting_overrides = list(significant) + (["a custom configure hook"] if custom_hook else [])
  show_paper, setting_text = rt.paper_setting(dataset=dataset, setting=setting, quick=quick,
                                              sources=sources, overrides=setting_overrides)
  caveats = rt.paper_caveats(dataset, setting, _train_images(metadatas))
  done = sum(len(c) for c in done_cells.values())
  # The rounds each results.json averaged (fewer than eval.last_rounds in a short run).
  averaged = {len(c["results"].get("rounds", [])) for per_seed in done_cells.values()
              for c in per_seed.values()}
  markdown = rt.render_markdown(
      summary, dataset=dataset, setting=setting, quick=quick, seeds=seeds,
      provenance_text=table.provenance_line(sources), setting_text=setting_text,
      show_paper=show_paper, last_rounds=averaged.pop() if len(averaged) == 1 else None,
      num_rounds_text=num_rounds_text,
      configs_text=configs_text, overrides=overrides, done=done, total=total, caveats=caveats)
  workdir_lib.write_atomic(workdir / "rounds.md", markdown)
  paper = rt.PAPER.get((dataset, setting), {})
  numbers = {
      "dataset": dataset, "setting": setting, "quick": quick, "methods": list(methods),
      "seeds": list(seeds), "overrides": list(overrides), "targets": [float(t) for t in targets],
      "complete": done == total, "cells_done": done, "cells_total": total,
      "std": table.STD_CONVENTION + " over seeds (null with one seed or a censored cell)",
      "data_sources": sources, "all_real_data": rt.all_real(sources),
      "paper_setting": show_paper, "paper_setting_reason": setting_text,
      "paper": paper if show_paper else {}, "paper_available": paper,
      "paper_citation": rt.PAPER_CITATION, "paper_caveats": caveats if show_paper else [],
      "summary": summary, "wall_seconds": wall_seconds,
      "cells_seconds": sum(c["seconds"] or 0.0 for per_seed in done_cells.values()
                           for c in per_seed.values()),
      "cells": {m: {str(s): {k: v for k, v in c.items() if k != "records"}
                    for s, c in per_seed.items()} for m, per_seed in done_cells.items()},
  }
  workdir_lib.write_atomic(workdir / "rounds.json",
                           json.dumps(numbers, indent=2, ensure_ascii=False) + "\n")
  if figure and done_cells:
    title = (f"{dataset} {setting} ({'quick' if quick else 'full'} configs): accuracy per "
             "round, " + (f"mean over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1
                          else f"seed {seeds[0]}"))
    rt.plot_rounds_curves(done_cells, workdir / "rounds_accuracy.png", kind=summary["kind"],
                          targets=targets, title=title)
  return numbers


def run_rounds_benchmark(dataset: str, setting: str, methods: Sequence[str],
                         seeds: Sequence[int], *, quick: bool = False,
                         workdir: str | pathlib.Path | None = None,
                         overrides: Sequence[str] = (),
                         configure: Callable[[ml_collections.ConfigDict, str], None] | None = None,
                         echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains (or skips, when finished) every (method, seed) cell, then writes the outputs.

  Args:
    dataset, setting, methods, seeds, quick, overrides: as the command-line flags.
    workdir: default runs/rounds_<dataset>_<setting>[_quick] under the repository.
    configure: called as configure(config, method) on each cell's config after
      the overrides (tests use it); marks the setting as not the paper's.
    echo: where the one-line progress messages go.

  Returns:
    rounds.json's contents plus "trained", "skipped" (lists of (method, seed))
    and "markdown_path".
  """
  tick = time.perf_counter()
  module = load_dataset_module(dataset, setting)
  unknown = [m for m in methods if m not in rt.METHODS]
  if unknown:
    raise ConfigError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}; allowed "
                      f"methods: {', '.join(rt.METHODS)}.")
  if not methods or not seeds:
    raise ConfigError("--methods and --seeds need at least one entry each.")
  default = REPO / "runs" / f"rounds_{dataset}_{setting}{'_quick' if quick else ''}"
  workdir = pathlib.Path(workdir or default)
  workdir_lib.check_workdir(workdir)
  # Every config is built (and every override checked) before anything trains.
  configs = {(m, s): cell_config(module, m, setting, s, quick=quick, overrides=overrides,
                                 configure=configure) for m in methods for s in seeds}
  first = configs[(methods[0], seeds[0])]
  targets = tuple(float(t) for t in first.eval.targets)
  differing = sorted({c.name for c in configs.values()
                      if tuple(float(t) for t in c.eval.targets) != targets})
  if differing:
    raise ConfigError(f"the cells' eval.targets differ ({first.name}: {targets}; "
                      f"{', '.join(differing)}): the rounds table needs the same targets.")
  workdir.mkdir(parents=True, exist_ok=True)
  from fedjax_het.train import train_and_evaluate  # the heavy imports only once the args are fine

  # A skipped cell keeps the time it took in the invocation that trained it.
  previous = (bench._read_json(workdir / "rounds.json")  # pylint: disable=protected-access
              or {}).get("cells", {})
  rounds_per_run = sorted({int(c.num_rounds) for c in configs.values()})
  common = dict(
      dataset=dataset, setting=setting, quick=quick, methods=methods, seeds=seeds,
      overrides=list(overrides), targets=targets, total=len(configs),
      configs_text=(f"experiments/configs/{dataset}.py:<method>_{setting}[_<variant>]"
                    f"{'_quick' if quick else ''} (experiments/configs/_two_stream.py)"),
      num_rounds_text=f"{', '.join(map(str, rounds_per_run))} rounds per run",
      significant=bench._significant(overrides, first),  # pylint: disable=protected-access
      custom_hook=configure is not None)
  cells: dict[str, dict[int, dict[str, Any]]] = {}
  trained, skipped = [], []
  for index, ((method, seed), config) in enumerate(configs.items(), start=1):
    label = f"[{index}/{len(configs)}] {method} seed {seed}"
    cell = bench.run_cell(config, workdir / method / f"seed{seed}", label=label,
                          previous=previous.get(method, {}).get(str(seed), {}),
                          train=train_and_evaluate, echo=echo)
    (skipped if cell["status"] == "skipped" else trained).append((method, seed))
    cells.setdefault(method, {})[seed] = cell
    results = cell["results"]
    kind = rt.headline_kind(results)
    accuracy = results.get(kind, {}).get("AVG")
    reached = ", ".join(f"{k}%: {'not reached' if r is None else f'round {r}'}"
                        for k, r in results.get("rounds_to_target", {}).items())
    status, seconds = cell["status"], cell["seconds"]
    echo(f"{label}: {status} ({'finished earlier' if status == 'skipped' else f'{seconds:.1f} s'})"
         f", accuracy {'(no evaluation)' if accuracy is None else f'{accuracy:.2f}'}"
         + (f", {reached}" if reached else ""))
    write_outputs(workdir, cells=cells, wall_seconds=time.perf_counter() - tick, **common)
  wall = time.perf_counter() - tick
  numbers = write_outputs(workdir, cells=cells, wall_seconds=wall, figure=True, **common)
  echo(f"rounds benchmark: {workdir / 'rounds.md'} ({len(trained)} cell(s) trained, "
       f"{len(skipped)} skipped; wall time {wall:.1f} s)")
  return {**numbers, "trained": trained, "skipped": skipped,
          "markdown_path": str(workdir / "rounds.md")}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/rounds_benchmark.py",
      description="Runs FedAvg/FedMMD/FedFusion x seeds on one setting; writes the rounds to "
                  "target and the bytes communicated (Yao et al., Tables 1-2 layout).")
  parser.add_argument("--dataset", required=True, help="mnist or cifar10")
  parser.add_argument("--setting", required=True, help="e.g. permuted, binary, shards, iid")
  parser.add_argument("--methods", default=",".join(rt.METHODS),
                      help="comma-separated, default: %(default)s")
  return bench.add_common_arguments(
      parser, quick_help="the _quick configs",
      workdir_help="default: runs/rounds_<dataset>_<setting>[_quick]")


def main(argv: Sequence[str] | None = None) -> int:
  return bench.run_main(build_parser(), argv, lambda args, echo: run_rounds_benchmark(
      args.dataset, args.setting, bench.parse_list(args.methods, "methods"),
      bench.parse_seeds(args.seeds), quick=args.quick, workdir=args.workdir,
      overrides=args.overrides, echo=echo))


if __name__ == "__main__":
  sys.exit(main())

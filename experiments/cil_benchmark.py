"""Class-incremental configs x seeds in the GLFC Table 1 layout: an alias of reproduce.py's grid.

  python experiments/cil_benchmark.py \\
      [--configs=cifar100_fedavg_cil_quick,cifar100_icarl_fl_quick,cifar100_glfc_quick] \\
      [--seeds=0,1,2] [--workdir=results] [--set field=value ...] [--verbose]

Configs: names as experiments/train.py takes them ("cifar100_glfc_quick" ->
fedjax_het/configs/cifar100.py variant "glfc_quick", or "<path>.py:<variant>"). Every
config must be class-incremental (scenario.name = "class_incremental") and all must share
one task layout (scenario.num_tasks and the classes per task), so that the columns align;
otherwise the run stops before training and names the configs. The cells train through
`fedjax_het.grid` (resumed when interrupted, skipped when finished) into
<workdir>/cil_benchmark/<quick|paper>/<config>__seed<s>/ (default workdir results/), and the
class-incremental report writes table.md / table.json and accuracy.png beside them. The
registered GLFC tables are experiments/reproduce.py's glfc_table1, glfc_tasks5 and
glfc_tasks20.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/cil_benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
import ml_collections

from fedjax_het.data import incremental
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import runner
from fedjax_het.reports import class_incremental as cil_report

SCENARIO = "class_incremental"
DEFAULT_CONFIGS = ("cifar100_fedavg_cil_quick", "cifar100_icarl_fl_quick", "cifar100_glfc_quick")
TABLE_ID = "cil_benchmark"


def layout(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """(num_tasks, classes per task) of a class-incremental config."""
  scenario = config.scenario
  classes = int(scenario.num_classes) or incremental.INCREMENTAL_DATASETS.get(
      scenario.dataset, 0)
  return int(scenario.num_tasks), classes // int(scenario.num_tasks)


def check_layouts(configs: Mapping[str, ml_collections.ConfigDict]) -> tuple[int, int]:
  """The shared (num_tasks, classes per task); ConfigError for no config, a config that is
  not class-incremental, or configs with different layouts (each named with its layout)."""
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


def run_cil_benchmark(configs: Mapping[str, ml_collections.ConfigDict], seeds: Sequence[int], *,
                      workdir: str | pathlib.Path | None = None, overrides: Sequence[str] = (),
                      echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains (or resumes, or skips when finished) every (config, seed) cell; writes the table.

  Returns `grid.run_configs`'s result ("statuses", "table_dir", "cell_dirs", ...).
  """
  if not seeds:
    raise ConfigError("--seeds needs at least one entry.")
  built = {}
  for name, config in configs.items():
    copy = ml_collections.ConfigDict(config.to_dict())
    arguments.apply_overrides(copy, overrides)
    built[name] = copy
  check_layouts(built)
  quick = all(name.endswith("_quick") for name in configs)
  return runner.run_configs(
      configs, seeds, family="class_incremental", table_id=TABLE_ID,
      scale="quick" if quick else "paper", overrides=overrides,
      labels={n: cil_report.method_label(c) for n, c in built.items()},
      title="class-incremental configs in the GLFC Table 1 layout",
      results_dir=pathlib.Path(workdir) if workdir else cells_lib.DEFAULT_RESULTS, echo=echo)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/cil_benchmark.py",
      description="Class-incremental configs x seeds in the GLFC Table 1 layout.")
  parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                      help="comma-separated config names, default: %(default)s")
  parser.add_argument("--seeds", default="0", help="comma-separated integers, default: 0")
  parser.add_argument("--workdir", default=None, help="the results directory, default: results/")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="config override, repeatable")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of configuration, data and workdir errors")
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  return arguments.run_cli(build_parser(), argv, lambda args, echo: run_cil_benchmark(
      {n: cell_configs.load_config(n) for n in arguments.parse_list(args.configs, "configs")},
      arguments.parse_seeds(args.seeds), workdir=args.workdir, overrides=args.overrides, echo=echo))


if __name__ == "__main__":
  sys.exit(main())

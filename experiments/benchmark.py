"""FCCL+ Tables VIII/IX for one scenario: an alias of experiments/reproduce.py.

  python experiments/benchmark.py --scenario=digits \\
      [--methods=solo,fedmd,feddf,fedmatch,rhfl,fccl,fcclplus] [--seeds=0,1,2] [--quick] \\
      [--workdir=results] [--set field=value ...] [--verbose]

is `python experiments/reproduce.py --table=fcclplus_<scenario> --scale=quick|paper
--methods=... --seeds=... --results-dir=<workdir>`: scenarios digits, office31,
office_caltech, office_home; --quick selects the quick scale (the `_quick` configs),
without it the paper scale; --workdir is the results directory (default results/). The
cells, their resume and the table (results/fcclplus_<scenario>/<scale>/table.md, .json)
are reproduce.py's (`fedjax_het.grid`).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import runner
from fedjax_het.reports import tables

SCENARIOS = ("digits", "office31", "office_caltech", "office_home")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/benchmark.py",
      description="FCCL+ Tables VIII/IX for one scenario (experiments/reproduce.py "
                  "--table=fcclplus_<scenario>).")
  parser.add_argument("--scenario", required=True, help=", ".join(SCENARIOS))
  parser.add_argument("--methods", default=",".join(tables.FCCLPLUS_METHODS),
                      help="comma-separated, default: %(default)s")
  arguments.add_alias_arguments(parser)
  return parser


def run(args: argparse.Namespace, echo: Callable[[str], None]) -> None:
  if args.scenario not in SCENARIOS:
    raise ConfigError(f"--scenario={args.scenario!r} is not allowed; allowed scenarios: "
                      f"{', '.join(SCENARIOS)}.")
  table = tables.get_table(f"fcclplus_{args.scenario}")
  cells = cells_lib.plan(table, "quick" if args.quick else "paper",
                         arguments.parse_seeds(args.seeds),
                         arguments.parse_list(args.methods, "methods"))
  runner.run(cells, results_dir=args.workdir, overrides=args.overrides, echo=echo)


def main(argv: Sequence[str] | None = None) -> int:
  return arguments.run_cli(build_parser(), argv, run)


if __name__ == "__main__":
  sys.exit(main())

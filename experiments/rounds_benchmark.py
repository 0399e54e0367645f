"""Rounds to target on one FedMMD / FedFusion setting: an alias of experiments/reproduce.py.

  python experiments/rounds_benchmark.py --dataset=mnist --setting=permuted \\
      [--methods=fedavg,fedmmd,fedmmd_l2,fedfusion_single,fedfusion_multi,fedfusion_conv] \\
      [--seeds=0,1,2] [--quick] [--workdir=results] [--set field=value ...] [--verbose]

Settings: those of fedjax_het/configs/_two_stream.py: cifar10 binary | iid | classes5 |
classes2, mnist binary | shards | permuted. The grid of the six method tokens (FedAvg, FedMMD with its MMD and the
authors' L2 constraint, FedFusion with each fusion operator) trains through
`fedjax_het.grid` as experiments/reproduce.py's tables do, into
<workdir>/rounds_<dataset>_<setting>/<quick|paper>/ (default workdir results/), with the
partitioned report's table.md / table.json (final accuracy, rounds and bytes to each
target, the paper's numbers where it prints them). The registered tables of these settings
are fedfusion_table1, fedfusion_table2, fedmmd_cifar10_binary and fedmmd_mnist_shards.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/rounds_benchmark.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import runner
from fedjax_het.reports import tables



def settings() -> dict[str, tuple[str, ...]]:
  """{dataset: its settings} of fedjax_het/configs/_two_stream.py."""
  two_stream = cell_configs.load_config_file("fedjax_het/configs/_two_stream.py")
  return {d: tuple(s) for d, s in two_stream.SETTINGS.items()}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/rounds_benchmark.py",
      description="FedAvg / FedMMD / FedFusion x seeds on one setting: rounds to target and "
                  "bytes (experiments/reproduce.py's grid and partitioned report).")
  parser.add_argument("--dataset", required=True, help="mnist or cifar10")
  parser.add_argument("--setting", required=True, help="e.g. permuted, binary, shards, iid")
  parser.add_argument("--methods", default=",".join(tables.TWO_STREAM_METHODS),
                      help="comma-separated, default: %(default)s")
  arguments.add_alias_arguments(parser)
  return parser


def run(args: argparse.Namespace, echo: Callable[[str], None]) -> None:
  known = settings()
  if args.dataset not in known:
    raise ConfigError(f"--dataset={args.dataset!r} is not allowed; allowed datasets: "
                      f"{', '.join(known)}.")
  if args.setting not in known[args.dataset]:
    raise ConfigError(f"--setting={args.setting!r} is not allowed for {args.dataset}; allowed "
                      f"settings: {', '.join(known[args.dataset])}.")
  methods = arguments.parse_list(args.methods, "methods")
  unknown = [m for m in methods if m not in tables.TWO_STREAM_METHODS]
  if unknown:
    raise ConfigError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}; allowed "
                      f"methods: {', '.join(tables.TWO_STREAM_METHODS)}.")
  table = tables.two_stream_table(args.dataset, args.setting)
  cells = cells_lib.plan(table, "quick" if args.quick else "paper",
                         arguments.parse_seeds(args.seeds), methods)
  runner.run(cells, results_dir=args.workdir, overrides=args.overrides, echo=echo)


def main(argv: Sequence[str] | None = None) -> int:
  return arguments.run_cli(build_parser(), argv, run)


if __name__ == "__main__":
  sys.exit(main())

"""Reproduces a paper's table: every cell (row x seed x setting) one resumable run.

  python experiments/reproduce.py --list [--table=<id>]
  python experiments/reproduce.py --table=<id> [--scale=quick|mid|paper] [--seeds=0,1,2] \\
      [--methods=<row>,...] [--settings=<setting>,...] [--set field=value ...] \\
      [--results-dir=DIR] [--dry-run]
  python experiments/reproduce.py --table=<id> [--scale=...] --report
  python experiments/reproduce.py --claims [--results-dir=DIR]
  python experiments/reproduce.py --queue=gpu --scale=paper --deadline-secs=540 --copy-to=$OUT \\
      --results-dir=results

Table ids (`--list` prints them all with their cells): FCCL+ Tables VIII/IX per scenario
(fcclplus_digits, fcclplus_office31, fcclplus_office_caltech, fcclplus_office_home), the
FCCL+ ablations fcclplus_table10, fcclplus_table13, fcclplus_table14, fcclplus_table17,
FCCL+ Table XV (fcclplus_table15, homogeneous), FCCL Tables 1-3 (fccl_tables1_2,
fccl_table3), FedFusion Tables 1 and 2 (fedfusion_table1, fedfusion_table2), FedMMD's
rounds in the text (fedmmd_cifar10_binary, fedmmd_mnist_shards), GLFC Table 1 and its
layout at T = 5 and 20 (glfc_table1, glfc_tasks5, glfc_tasks20), three diagnoses at mid
scale only: fcclplus_office31_width (Office31's BASE and FCCL+ on width-1/4 backbones),
fcclplus_office31_base_width (Office31's BASE for the paper's 50 private epochs at widths 1/8,
1/4, 1/2 and 1) and fcclplus_digits_real (Digits' BASE, FCCL and FCCL+ with the real MNIST and
USPS participants alone), and two at quick scale only: fcclplus_digits_fccl_teachers (Digits' FCCL
with its local teachers in eval mode, the FCCL code's, and in train mode) and
fcclplus_digits_fccl_keys (Digits' BASE and FCCL beside FCCL started from its BASE's initial
weights, fccl.init_keys=run).
The registry is `fedjax_het/reports/tables.py`.

Each cell trains into <results>/<table>/<scale>/<cell>/ (cell = <row>__seed<s>, with
<setting>__ in front in a table of several settings), <results> being --results-dir: by
default runs/reproduce/, your own directory, whatever the repository ships; the
repository's cells are in results/ (--results-dir=results trains or resumes those). The
cells train through the ordinary trainers, with
the row's config at the scale (--scale=quick: the `_quick` configs, minutes on a CPU;
mid: the `_mid` configs of the FCCL+ tables, the authors' code protocol on width-1/8
backbones for 40 rounds, about an hour a cell on a 2-core CPU, and of FedMMD's MNIST shards
and FedFusion Table 2, the paper protocol cut as configs/_two_stream.py says, and of GLFC
Table 1, as configs/cifar100.py says; paper: the paper's
configs), config.seed = s and the --set overrides. A rerun skips
finished cells and resumes an interrupted one from its checkpoints. A cell that is the same
run as a finished cell of another table (the same config and seed: the BASE rows shared by
FCCL's and FCCL+'s tables, GLFC's quick cells at T = 5 / 20) is copied from it, its
cell.json naming the source (`copy_of`); --retrain-copies trains it instead. After every cell,
<results>/<table>/<scale>/table.md and table.json hold the table over the seeds that
finished (mean ± sample std, n, the paper's number and source beside each cell, Δ vs BASE,
the data provenance and sizes, the scale, the devices, commits and wall time of the runs),
with the figures beside them; in a directory other than results/, beside_shipped.md sets
your cells' headline numbers beside the shipped cells' and the paper's. --report rewrites
those files from what <results> holds, and with --results-dir=results the table's block of
docs/results.md and the papers' claims (below).

--claims sets each paper's headline comparisons (fedjax_het/reports/claims.py: FCCL+ and
FCCL against BASE, GLFC against iCaRL + FL, FedMMD and FedFusion+Conv against FedAvg in
rounds to a target) beside the cells of <results>, seed by seed at every scale that has
them: with --results-dir=results it rewrites the claims blocks of docs/results.md and
README.md, for another directory it prints the table.

--deadline-secs=N (the GPU command): each cell trains in its own process; no cell starts
with less than --min-cell-secs left and the running one stops at N seconds, keeping its
checkpoints (the next invocation resumes it). --queue=gpu runs the prepared priority
order: fcclplus_office31 FCCL+ and BASE, fcclplus_digits FCCL+ and BASE, FedFusion
Table 2, GLFC Table 1 (T = 10); --queue=mid --scale=mid the mid-scale FCCL+ Tables
VIII/IX (FCCL+ and BASE of Office31, its width diagnoses, of Digits, its real-domain
diagnosis with its FCCL rows; then FCCL, FedMD, FedDF, RHFL, FedMatch of Office31 and of
Digits), seed by seed; --copy-to=DIR mirrors every cell's files (and an interrupted cell's
checkpoints) and the tables into DIR/results/ as they are written.
Every invocation appends what it ran to results/invocations.jsonl.

A cell trained from a working tree with uncommitted changes keeps their patch beside it
(patch.diff), so its commit and the patch pin its code. A cell whose record says it was
trained from uncommitted changes without a patch is "unpinned": --list counts them,
--retrain-unpinned deletes the selected ones and trains them again, and no cell is copied from
an unpinned twin.

Errors in the arguments, the configs, the data or a workdir print one line and exit with
status 1 (the traceback with --verbose or FEDJAX_HET_TRACEBACK=1).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/reproduce.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import progress
from fedjax_het.grid import provenance
from fedjax_het.grid import runner
from fedjax_het.grid import twins
from fedjax_het.reports import claims as claims_lib
from fedjax_het.reports import document
from fedjax_het.reports import tables as tables_lib

DEFAULT_DOC = REPO / "docs" / "results.md"
#: A user's own cells (git-ignored), so that a run never skips a cell because the repository
#: ships it; `grid.DEFAULT_RESULTS` (results/) holds the shipped ones.
USER_RESULTS = REPO / "runs" / "reproduce"
#: The file beside a user's table that sets its cells beside the shipped ones.
BESIDE_FILE = "beside_shipped.md"


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="experiments/reproduce.py",
      description="Reproduces a paper's table: one resumable run per cell (row x seed).")
  parser.add_argument("--list", action="store_true",
                      help="print one line per table: its id, title and finished cells per "
                      "scale (with --cells: every cell, its status and config)")
  parser.add_argument("--cells", action="store_true",
                      help="with --list: every cell of the tables, its status at each scale "
                      "and its config")
  parser.add_argument("--table", default=None, help="table id(s), comma-separated")
  parser.add_argument("--queue", default=None,
                      help=f"a prepared order of cells: {', '.join(tables_lib.QUEUES)}")
  parser.add_argument("--scale", default="quick",
                      help="quick (default), mid (the FCCL+ tables) or paper")
  parser.add_argument("--seeds", default=None,
                      help="comma-separated integers, default: 0 (--list: 0,1,2)")
  parser.add_argument("--methods", default=None, help="the rows to run (default: all)")
  parser.add_argument("--settings", default=None,
                      help="the settings to run, in a table of several (default: all)")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="FIELD=VALUE", help="config override for every cell, repeatable")
  parser.add_argument("--results-dir", default=str(USER_RESULTS),
                      help="where the cells train (default: runs/reproduce/ of the repository; "
                      "results/ holds the cells the repository ships)")
  parser.add_argument("--report", action="store_true",
                      help="rewrite the table's block of docs/results.md from the results")
  parser.add_argument("--claims", action="store_true",
                      help="the papers' headline claims beside the cells of --results-dir "
                      "(results/: rewrites the claims blocks of docs/results.md and README.md)")
  parser.add_argument("--doc", default=str(DEFAULT_DOC), help=argparse.SUPPRESS)
  parser.add_argument("--readme", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--deadline-secs", type=float, default=None,
                      help="stop at this many seconds (each cell in its own process)")
  parser.add_argument("--min-cell-secs", type=float, default=60.0,
                      help="with a deadline: start no cell with less time left (default 60)")
  parser.add_argument("--copy-to", default=None,
                      help="mirror the cells' files and the tables into DIR/<results>/")
  parser.add_argument("--separate-seeds", action="store_true",
                      help="train every seed on its own (default: a row's fresh seeds as one "
                      "vmapped program where their shapes agree)")
  parser.add_argument("--retrain-copies", action="store_true",
                      help="train every cell (default: a fresh cell whose run another table "
                      "holds finished, same config and seed, is copied from it)")
  parser.add_argument("--retrain-unpinned", action="store_true",
                      help="delete and train again every selected cell whose code no commit "
                      "pins (trained from uncommitted changes without their patch; --list "
                      "counts them)")
  parser.add_argument("--dry-run", action="store_true", help="print the cells it would run")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of configuration, data and workdir errors")
  return parser


def _tables(args: argparse.Namespace) -> list[tables_lib.Table]:
  if args.table is None:
    return list(tables_lib.TABLES.values())
  return [tables_lib.get_table(t) for t in arguments.parse_list(args.table, "table")]


def _cells(args: argparse.Namespace) -> list[cells_lib.Cell]:
  seeds = arguments.parse_seeds(args.seeds or "0")
  if args.queue and args.table:
    raise ConfigError("--queue and --table exclude each other: pass one.")
  if args.queue:
    if args.methods or args.settings:
      raise ConfigError("--methods and --settings do not apply to --queue (its rows are "
                        "fixed in fedjax_het/reports/tables.py QUEUES).")
    return cells_lib.queue_plan(args.queue, args.scale, seeds)
  if not args.table:
    raise ConfigError("pass --table=<id> (or --queue=<name>, --list); table ids: "
                      f"{', '.join(tables_lib.TABLES)}.")
  methods = arguments.parse_list(args.methods, "methods") if args.methods else None
  settings = arguments.parse_list(args.settings, "settings") if args.settings else None
  return [c for table in _tables(args)
          for c in cells_lib.plan(table, args.scale, seeds, methods, settings)]


#: The seeds `--list` counts a table's cells over (the tables' three seeds) unless --seeds.
SUMMARY_SEEDS = (0, 1, 2)


def _record(cell_dir: pathlib.Path) -> dict:
  """A cell's cell.json ({} without a readable one)."""
  record = progress.read_json(cell_dir / provenance.CELL_FILE)
  return record if isinstance(record, dict) else {}


def summarize_tables(tables: Sequence[tables_lib.Table], seeds: Sequence[int],
                     results_dir: pathlib.Path, echo: Callable[[str], None]) -> None:
  """One line per table: its id, title and, per scale it has, the cells whose cell.json says
  finished out of its cells at `seeds` (read from the records alone: `--list --cells`
  also checks each finished cell's config against the current one)."""
  width = max(len(t.id) for t in tables)
  echo(f"{'table':<{width}}  finished cells in {results_dir} (of seeds "
       f"{', '.join(map(str, seeds))}) per scale; title")
  unpinned = []
  for table in tables:
    counts = []
    for scale in tables_lib.SCALES:
      if scale not in table.scales:
        counts.append(f"{scale} -")
        continue
      cells = cells_lib.plan(table, scale, seeds)
      done = [r for r in (_record(c.directory(results_dir)) for c in cells)
              if r.get("status") == "finished"]
      counts.append(f"{scale} {len(done)}/{len(cells)}")
      loose = sum(provenance.unpinned(r) for r in done)
      if loose:
        unpinned.append(f"{table.id} {scale} {loose}")
    echo(f"{table.id:<{width}}  {'  '.join(f'{c:<11}' for c in counts)}  {table.title}")
  if unpinned:
    echo(f"finished cells that no commit pins (trained from uncommitted changes, no patch "
         f"kept; `--retrain-unpinned` trains them again): {', '.join(unpinned)}")
  echo("`--list --cells [--table=<id>]` lists every cell with its status and config.")
  if not shipped(results_dir):
    echo("the cells the repository ships (those docs/results.md renders): add "
         "--results-dir=results")


def remove_unpinned(cells: Sequence[cells_lib.Cell], results_dir: pathlib.Path,
                    echo: Callable[[str], None], dry_run: bool = False) -> list[cells_lib.Cell]:
  """Deletes the directory of every cell of `cells` whose code no commit pins
  (`provenance.unpinned`), so that the run trains it again; returns those cells. With
  `dry_run`, only says which."""
  found = []
  for cell in cells:
    path = cell.directory(results_dir)
    record = _record(path)
    if not provenance.unpinned(record):
      continue
    found.append(cell)
    commit = (record.get("commit") or "an unknown commit")[:10]
    if not dry_run:
      shutil.rmtree(path)
    echo(f"{cell.label}: {'would delete' if dry_run else 'deleted'} (trained from uncommitted "
         f"changes at {commit} without their patch: no commit pins its code); it trains again")
  return found


def list_tables(tables: Sequence[tables_lib.Table], seeds: Sequence[int],
                results_dir: pathlib.Path, echo: Callable[[str], None]) -> None:
  """Every table id, its rows' configs and each cell's status at each scale ("- (a copy is
  ready)": another table holds the same run finished, so training the cell copies it; "n/a":
  the table has no configs at that scale)."""
  for table in tables:
    echo(f"{table.id}: {table.title} [{table.family}]")
    echo(f"  paper: {table.paper}, {table.source}")
    rows = []
    for setting in table.settings:
      for row in setting.rows:
        found = set()
        for scale in table.scales:
          probe = tables_lib.cell_dir(results_dir, table, setting, row, 0, scale)
          prefix = probe.name.rsplit("seed", 1)[0] + "seed"
          if probe.parent.is_dir():
            found |= {int(p.name[len(prefix):]) for p in probe.parent.iterdir()
                      if p.name.startswith(prefix) and p.name[len(prefix):].isdigit()}
        for seed in sorted(set(seeds) | found):
          statuses = []
          for scale in tables_lib.SCALES:
            if scale not in table.scales:
              statuses.append("n/a")
              continue
            cell = cells_lib.Cell(table, setting, row, seed, scale)
            path, config = cell.directory(results_dir), cell_configs.cell_config(cell)
            status = progress.cell_status(path, config) if path.exists() else "-"
            if status == "-" and twins.find_twin(cell, config, results_dir) is not None:
              status = "- (a copy is ready)"
            statuses.append(status)
          config = f"{tables_lib.config_file_name(setting.config)}:{row.variant}" + (
              " +" + ",".join(f"{k}={v!r}" for k, v in row.overrides) if row.overrides else "")
          rows.append((tables_lib.cell_name(table, setting, row, seed), *statuses, config))
    width = max(len(r[0]) for r in rows)
    echo(f"  {'cell':<{width}}  {'quick':<24}  {'mid':<24}  {'paper':<24}  config (paper scale)")
    for name, quick, mid, paper, config in rows:
      echo(f"  {name:<{width}}  {quick:<24}  {mid:<24}  {paper:<24}  {config}")


def shipped(results_dir: pathlib.Path) -> bool:
  """Whether `results_dir` is the repository's own results/."""
  return pathlib.Path(results_dir).resolve() == cells_lib.DEFAULT_RESULTS.resolve()


def write_beside(tables: Sequence[tables_lib.Table], scale: str, results_dir: pathlib.Path,
                 echo: Callable[[str], None]) -> None:
  """<results_dir>/<table>/<scale>/beside_shipped.md of each table (a user's directory)."""
  for table in tables:
    out = results_dir / table.id / scale
    if not out.is_dir():
      continue
    path = out / BESIDE_FILE
    workdir_lib.write_atomic(path, document.render_beside(table, scale, results_dir,
                                                          cells_lib.DEFAULT_RESULTS))
    echo(f"report: {path}: your cells beside the shipped ones and the paper's")


def readme_of(args: argparse.Namespace) -> pathlib.Path:
  """The README whose claims block --report / --claims rewrite: --readme, by default the one
  beside the documentation folder of --doc (the repository's README.md for docs/results.md)."""
  if args.readme:
    return pathlib.Path(args.readme)
  return pathlib.Path(args.doc).resolve().parent.parent / "README.md"


def write_claims(results_dir: pathlib.Path, documents: Sequence[pathlib.Path],
                 echo: Callable[[str], None]) -> None:
  """Rewrites the claims blocks (`claims.BLOCKS`) of each document that has one from the
  cells of results_dir."""
  for path in documents:
    if not path.exists():
      continue
    text = new = path.read_text()
    for name, make in claims_lib.BLOCKS.items():
      if claims_lib.block(new, name) is not None:
        new = claims_lib.rewrite(new, name, make(results_dir))
    if new != text:
      workdir_lib.write_atomic(path, new)
      echo(f"claims: {path} rewritten from {results_dir}")


def report(tables: Sequence[tables_lib.Table], scale: str, results_dir: pathlib.Path,
           doc: pathlib.Path, echo: Callable[[str], None],
           readme: pathlib.Path | None = None) -> None:
  """Rewrites each table's table.md / table.json and, for the shipped results/, its
  docs/results.md block and the claims blocks of docs/results.md and `readme`; for another
  directory, its beside_shipped.md."""
  if not shipped(results_dir):
    for table in tables:
      runner.write_outputs(table, scale, results_dir, figures=False)
      echo(f"report: {results_dir / table.id / scale / 'table.md'} rewritten")
    write_beside(tables, scale, results_dir, echo)
    return
  text = doc.read_text() if doc.exists() else ""
  for table in tables:
    markdown, _ = document.render(table, scale, results_dir)
    runner.write_outputs(table, scale, results_dir, figures=False)
    text = document.rewrite(text, table.id, scale, markdown)
    echo(f"report: {doc} block {table.id}:{scale} rewritten from {results_dir / table.id / scale}")
  doc.parent.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_atomic(doc, text)
  write_claims(results_dir, [doc] + ([readme] if readme is not None else []), echo)


def dry_run(cells: Sequence[cells_lib.Cell], results_dir: pathlib.Path, overrides: Sequence[str],
            echo: Callable[[str], None]) -> None:
  for index, cell in enumerate(cells, start=1):
    config = cell_configs.cell_config(cell, overrides)
    path = cell.directory(results_dir)
    status = progress.cell_status(path, config) if path.exists() else "-"
    twin = twins.find_twin(cell, config, results_dir) if status == "-" else None
    if twin is not None:
      action = f"copy (the same run, finished in {twin.relative_to(results_dir).as_posix()})"
    else:
      action = {"finished": "skip (finished)", "-": "train"}.get(
          status, "retrain? (finished with a different config: stops the run)"
          if status == "different config" else f"resume ({status})")
    echo(f"[{index}/{len(cells)}] {cell.label}: {action}; "
         f"{tables_lib.config_file_name(cell.row.config or cell.setting.config)}:"
         f"{cell.row.config_variant(cell.scale)} -> {path}")


def run(args: argparse.Namespace, echo: Callable[[str], None]) -> None:
  results_dir = pathlib.Path(args.results_dir)
  if args.scale not in tables_lib.SCALES:
    raise ConfigError(f"--scale={args.scale!r} is not allowed; allowed scales: "
                      f"{', '.join(tables_lib.SCALES)}.")
  if args.list:
    if args.cells:
      list_tables(_tables(args), arguments.parse_seeds(args.seeds or "0"), results_dir, echo)
    else:
      seeds = arguments.parse_seeds(args.seeds) if args.seeds else SUMMARY_SEEDS
      summarize_tables(_tables(args), seeds, results_dir, echo)
    return
  if args.report:
    if not args.table:
      raise ConfigError("--report needs --table=<id>[,<id>...].")
    report(_tables(args), args.scale, results_dir, pathlib.Path(args.doc), echo,
           readme=readme_of(args))
    return
  if args.claims:
    if shipped(results_dir):
      write_claims(results_dir, [pathlib.Path(args.doc), readme_of(args)], echo)
    else:
      echo(claims_lib.render(results_dir).rstrip())
    return
  cells = _cells(args)
  if args.retrain_unpinned:
    remove_unpinned(cells, results_dir, echo, dry_run=args.dry_run)
  if args.dry_run:
    dry_run(cells, results_dir, args.overrides, echo)
    return
  if args.deadline_secs is None:
    # This process trains: XLA:CPU's scheduler is fixed when JAX starts (as experiments/train.py).
    from fedjax_het.runtime import xla_cpu
    xla_cpu.set_xla_cpu_scheduler("auto")
  try:
    runner.run(cells, results_dir=results_dir, overrides=args.overrides,
             deadline_secs=args.deadline_secs, min_cell_secs=args.min_cell_secs,
             copy_to=args.copy_to, stack_seeds=not args.separate_seeds,
             copy_twins=not args.retrain_copies, echo=echo)
  finally:
    if not shipped(results_dir):
      write_beside(list(dict.fromkeys(c.table for c in cells)), args.scale, results_dir, echo)


def main(argv: Sequence[str] | None = None) -> int:
  return arguments.run_cli(build_parser(), argv, run)


if __name__ == "__main__":
  sys.exit(main())

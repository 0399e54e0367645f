"""The convergence study: a method against BASE round by round over seeds, from finished cells.

  python experiments/convergence.py --scale=mid

reads the finished `solo` and `fcclplus` cells of each table at the scale (by default
FCCL+ Tables VIII/IX on Office31 and Digits and their diagnoses fcclplus_office31_width and
fcclplus_digits_real, each that has a finished cell; trained by
`python experiments/reproduce.py --table=<id> --scale=mid --methods=solo,fcclplus
--seeds=0,1,2 --separate-seeds`), writes results/convergence/<scale>/study.json and
curves.png (mean ± std bands per round), and rewrites the study's block in docs/results.md
(`fedjax_het/reports/convergence.py` computes it; tests/test_convergence.py keeps the block
equal to what results/ holds).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/convergence.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import UserError
from fedjax_het.reports import convergence
from fedjax_het.reports import tables as tables_lib


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="experiments/convergence.py", description=__doc__.split(
      "\n")[0])
  parser.add_argument("--tables", default=",".join(convergence.STUDY_TABLES))
  parser.add_argument("--scale", default="mid")
  parser.add_argument("--method", default="fcclplus")
  parser.add_argument("--results-dir", default=str(REPO / "results"))
  parser.add_argument("--doc", default=str(REPO / "docs" / "results.md"))
  args = parser.parse_args(argv)
  try:
    tables = [tables_lib.get_table(t.strip()) for t in args.tables.split(",") if t.strip()]
  except UserError as error:
    print(f"error: {error}", file=sys.stderr)
    return 1
  results_dir = pathlib.Path(args.results_dir)
  text, numbers = convergence.render_all(tables, args.scale, results_dir, method=args.method)
  out = results_dir / "convergence" / args.scale
  out.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_atomic(out / "study.json", json.dumps(numbers, indent=1) + "\n")
  convergence.figure(tables, args.scale, results_dir, out / "curves.png", method=args.method)
  doc = pathlib.Path(args.doc)
  workdir_lib.write_atomic(doc, convergence.rewrite(doc.read_text(), args.scale, text))
  print(f"convergence: {out / 'study.json'}, {out / 'curves.png'} and the block in {doc}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""The FCCL / FCCL+ figures of finished runs: t-SNE of features, cross-correlation heatmaps, L_Loc.

  python experiments/figures.py tsne --workdirs=runs/solo,runs/fccl --out=tsne.png
  python experiments/figures.py heatmaps --workdirs=runs/fccl --out=heatmaps.png
  python experiments/figures.py local_loss --workdirs=runs/solo,runs/fccl --out=local_loss.png
  python experiments/figures.py all --workdirs=runs/solo,runs/fccl --out=figures/

  tsne        FCCL Fig. 4 / FCCL+ Fig. 9: each participant's features (the model's
              penultimate layer, eval mode) on its own domain's test set, embedded by
              scikit-learn's t-SNE, coloured by class; rows = participants, columns = runs
              (e.g. SOLO = cross-entropy alone beside FCCL's dual-domain distillation).
              --domains=inter: each participant's features on the next domain's test set
              instead (FCCL Fig. 4's inter-domain row, M -> U); --domains=both: that row
              under each participant's own. Options: --max_points (per panel),
              --perplexity, --tsne_iterations, --seed, --tsne_threads.
  heatmaps    FCCL Fig. 5 / FCCL+ Fig. 8: each participant's cross-correlation matrix M_i
              (Eq. 1, its logits against the participants' mean logits) on the public
              batch beside M_i on its own private data (--private_split=test: its domain's
              test set); --rows private images (default: the public batch's size).
  local_loss  FCCL Fig. 6b: train/local/<term>/<participant> of metrics.jsonl per round,
              the local objective L_Loc and its terms, one line per participant.
  all         the three, into the folder --out.

--workdirs: comma-separated workdirs of FINISHED experiments/train.py runs (with
config.seeds, a seed_<s> folder); tsne and heatmaps restore the final checkpoint
with the run's own config and rebuild its data (set FEDJAX_HET_DATA_DIR as the
run had it), local_loss reads metrics.jsonl only. The runs side by side must
have the same participants. --out: a .png file, or a folder that receives
<figure>.png (default: <workdir>/figures/ for one run, <common parent>/figures/
for several). Needs matplotlib and, for tsne, scikit-learn: pip install -e ".[figures]".
Interpretations (which images, which layer, which mean): fedjax_het/studies/figures.py and
docs/figures.md.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/figures.py` from a source checkout
  sys.path.insert(0, str(REPO))

from fedjax_het.studies import figures  # noqa: E402  pylint: disable=g-import-not-at-top
from fedjax_het.errors import UserError, wants_traceback  # noqa: E402  pylint: disable=g-import-not-at-top

FIGURES = ("tsne", "heatmaps", "local_loss")


def default_out(workdirs: Sequence[pathlib.Path]) -> pathlib.Path:
  """<workdir>/figures for one run, <common parent>/figures for several."""
  if len(workdirs) == 1:
    return workdirs[0] / "figures"
  return pathlib.Path(os.path.commonpath([str(p.absolute()) for p in workdirs])) / "figures"


def output_path(out: str | None, figure: str, workdirs: Sequence[pathlib.Path]) -> pathlib.Path:
  """--out as the path of `figure`'s PNG: a .png file as given, else <folder>/<figure>.png."""
  if out is None:
    return default_out(workdirs) / f"{figure}.png"
  path = pathlib.Path(out)
  if path.suffix.lower() == ".png":
    if figure == "all":
      raise figures.FigureError(f"--out={out}: 'all' writes three figures; pass a folder.")
    return path
  if path.suffix:
    raise figures.FigureError(f"--out={out}: pass a .png file or a folder.")
  return path / f"{figure}.png"


def parse_workdirs(text: str) -> list[pathlib.Path]:
  workdirs = [pathlib.Path(w.strip()) for w in text.split(",") if w.strip()]
  if not workdirs:
    raise figures.FigureError("--workdirs: name at least one finished run's workdir.")
  return workdirs


def draw(figure: str, workdirs: Sequence[str | os.PathLike], *, out: str | None = None,
         max_points: int = 1000, perplexity: float = 30.0, tsne_iterations: int = 1000,
         seed: int = 0, tsne_threads: int = 1, domains: str = "own", rows: int | None = None,
         private_split: str = "train",
         echo: Callable[[str], None] = print) -> dict[str, pathlib.Path]:
  """Draws `figure` ("tsne", "heatmaps", "local_loss" or "all") of the runs in `workdirs`.

  Returns:
    {figure: the PNG written}.
  """
  if figure not in (*FIGURES, "all"):
    raise figures.FigureError(f"the figure must be one of {(*FIGURES, 'all')}, got {figure!r}.")
  if domains not in figures.TSNE_DOMAINS:
    raise figures.FigureError(f"--domains must be one of {figures.TSNE_DOMAINS}, got "
                              f"{domains!r}.")
  if private_split not in ("train", "test"):
    raise figures.FigureError(f"--private_split must be 'train' or 'test', got "
                              f"{private_split!r}.")
  paths = [pathlib.Path(w) for w in workdirs]
  if not paths:
    raise figures.FigureError("--workdirs: name at least one finished run's workdir.")
  wanted = FIGURES if figure == "all" else (figure,)
  if figure == "all":
    folder = output_path(out, "all", paths).parent
    targets = {f: folder / f"{f}.png" for f in wanted}
  else:
    targets = {figure: output_path(out, figure, paths)}
  written = {}
  if "local_loss" in wanted:
    series = []
    for path in paths:
      label, records = figures.read_records(path)
      rounds, terms = figures.local_loss_series(records, source=path / "metrics.jsonl")
      series.append((label, rounds, terms))
    written["local_loss"] = figures.save(figures.local_loss_figure(series),
                                         targets["local_loss"])
    echo(f"wrote {written['local_loss']}")
  if "tsne" in wanted or "heatmaps" in wanted:
    if "tsne" in wanted:
      figures.check_tsne_available()
    runs = []
    for path in paths:
      echo(f"restoring {path}")
      runs.append(figures.load_run(path))
    if "heatmaps" in wanted:
      for run in runs:
        figures.check_heatmap_run(run)
      data = [figures.heatmap_data(run, rows=rows, split=private_split) for run in runs]
      written["heatmaps"] = figures.save(figures.heatmap_figure(data), targets["heatmaps"])
      echo(f"wrote {written['heatmaps']}")
    if "tsne" in wanted:
      tick = time.perf_counter()
      panels = figures.tsne_panels(runs, max_points=max_points, seed=seed, domains=domains)
      figures.embed(panels, seed=seed, iterations=tsne_iterations, perplexity=perplexity,
                    threads=tsne_threads or None)
      num_classes = int(runs[0].experiment.setup.num_classes)
      written["tsne"] = figures.save(figures.tsne_figure(panels, num_classes=num_classes),
                                     targets["tsne"])
      echo(f"wrote {written['tsne']} (t-SNE of {sum(len(r) for r in panels)} panels in "
           f"{time.perf_counter() - tick:.1f} s)")
  return written


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=__doc__.split("\n\n", 1)[1])
  parser.add_argument("figure", choices=(*FIGURES, "all"))
  parser.add_argument("--workdirs", required=True,
                      help="comma-separated workdirs of finished runs (side by side)")
  parser.add_argument("--out", default=None, help="a .png file, or a folder")
  parser.add_argument("--max_points", type=int, default=1000,
                      help="tsne: test images per panel (0: all)")
  parser.add_argument("--perplexity", type=float, default=30.0, help="tsne: t-SNE perplexity")
  parser.add_argument("--tsne_iterations", type=int, default=1000,
                      help="tsne: optimisation steps (at least 250)")
  parser.add_argument("--seed", type=int, default=0, help="tsne: image sample and t-SNE seed")
  parser.add_argument("--tsne_threads", type=int, default=1,
                      help="tsne: OpenMP threads of the t-SNE gradient (0: every core)")
  parser.add_argument("--domains", default="own", choices=figures.TSNE_DOMAINS,
                      help="tsne: each participant's own domain's test set, the next "
                           "domain's (FCCL Fig. 4's inter-domain row), or both")
  parser.add_argument("--rows", type=int, default=None,
                      help="heatmaps: private images per participant (default: the public "
                           "panel's batch, collaborative.batch_size)")
  parser.add_argument("--private_split", default="train", choices=("train", "test"),
                      help="heatmaps: each participant's private training data or its "
                           "domain's test set")
  parser.add_argument("--verbose", action="store_true", help="show tracebacks of user errors")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    draw(args.figure, parse_workdirs(args.workdirs), out=args.out, max_points=args.max_points,
         perplexity=args.perplexity, tsne_iterations=args.tsne_iterations, seed=args.seed,
         tsne_threads=args.tsne_threads, domains=args.domains,
         rows=args.rows, private_split=args.private_split)
  except UserError as error:
    if wants_traceback(args.verbose):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

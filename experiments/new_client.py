"""A newly joining client's local epochs to converge from each method's global model (Fig. 6).

  python experiments/new_client.py --runs=runs/mnist_fedavg_permuted \\
      [--runs=...,runs/mnist_fedfusion_permuted_conv,runs/mnist_fedmmd_permuted] \\
      [--max_epochs=20] [--tolerance=0.5] [--target=auto|none|<percent>] \\
      [--lr=config|last|<rate>] [--seed=<split/order seed>] [--out=<dir>]

Yao et al. (FedFusion / FedMMD paper, Sec. 4.3.2, Fig. 6) let a new client
join a trained federation and count the local epochs it needs to converge,
starting from each method's global model. For every FINISHED run given in
--runs (a workdir of experiments/train.py; the final checkpoint is restored
with the run's own config from its run.json, `fedjax_het.studies.new_client`):

  * the new client starts from the run's global model (FedAvg / FedMMD: the
    server model; FedFusion: the fused model with its frozen global trunk
    loaded from the server's trunk, trunk / fusion / classifier trained,
    weight decay off the frozen trunk; FedMMD trains on its own local
    objective with the received model as the frozen global stream) and
    trains locally for --max_epochs epochs with the run's local optimiser
    (`config.local`: optimiser, momentum, weight decay, batch size) at one
    constant rate: --lr=config (default) `local.lr`, the rate a run starts
    with; --lr=last the rate of the run's last round; or a number;
  * a reference client starts from a RANDOM initialisation of the run's plain
    model (cross-entropy, same optimiser, same rate, same batch orders); one
    reference per distinct (data, model, optimiser) among the runs;
  * the new client's data is data the federation never trained on: the
    run's test data split at random into halves (train on one, evaluate on
    the other); in the `permuted` setting, un-permuted and given a NEW pixel
    permutation (client index = the run's number of clients);
  * accuracy on the evaluation half before training (epoch 0) and after
    every epoch.

Convergence: "epochs to converge" is the first epoch whose accuracy is within
--tolerance points of the curve's best accuracy over epochs 0 ... max_epochs;
"epochs to target" the first epoch reaching --target percent (auto: the first
run's first `eval.targets`, e.g. 94 for the permuted-MNIST setting; none: off).

Outputs (into --out, default <run>/new_client/ for one run and
<common parent of the runs>/new_client/ for several):
  new_client.json  every curve (accuracy per epoch, training loss), the
                   convergence numbers, the data and learning-rate choices
  new_client.md    the table (one row per start) and accuracy per epoch
  new_client.png   accuracy vs local epochs, one line per method (like Fig. 6)

Expected (permuted MNIST, real data, after 300 rounds): the paper reports that
FedFusion-conv's model gives the new client the best start, converging in
fewer local epochs than FedAvg's; a random start needs the most.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/new_client.py` from a source checkout
  sys.path.insert(0, str(REPO))

from fedjax_het.studies import new_client as nc  # noqa: E402  pylint: disable=g-import-not-at-top
from fedjax_het.errors import UserError, wants_traceback  # noqa: E402  pylint: disable=g-import-not-at-top


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--runs", required=True,
                      help="comma-separated workdirs of finished runs (FedAvg, FedMMD, FedFusion)")
  parser.add_argument("--max_epochs", type=int, default=20)
  parser.add_argument("--tolerance", type=float, default=0.5,
                      help="points below the best accuracy counted as converged")
  parser.add_argument("--target", default="auto",
                      help="accuracy target (percent), 'auto' (the first run's first "
                           "eval.targets) or 'none'")
  parser.add_argument("--lr", default="config",
                      help="'config' (local.lr), 'last' (the run's last-round rate) or a number")
  parser.add_argument("--seed", type=int, default=None,
                      help="seed of the data halves and batch orders (default: the run's seed)")
  parser.add_argument("--out", default=None, help="output directory")
  parser.add_argument("--no_plot", action="store_true")
  parser.add_argument("--verbose", action="store_true", help="show tracebacks of user errors")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  runs = [r.strip() for r in args.runs.split(",") if r.strip()]
  try:
    results = nc.run_experiment(runs, out=args.out, max_epochs=args.max_epochs,
                             tolerance=args.tolerance, target=args.target, lr=args.lr,
                             seed=args.seed, plot=not args.no_plot)
  except UserError as error:
    if wants_traceback(args.verbose):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  print(nc.markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())

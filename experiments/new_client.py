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
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/new_client.py` from a source checkout
  sys.path.insert(0, str(REPO))

from fedjax_het.studies import new_client as nc  # noqa: E402  pylint: disable=g-import-not-at-top
from fedjax_het import workdir as workdir_lib  # noqa: E402  pylint: disable=g-import-not-at-top
from fedjax_het.errors import (  # noqa: E402  pylint: disable=g-import-not-at-top
    ConfigError, UserError, wants_traceback)

RANDOM_LABEL = "random init"


def default_out(run_dirs: Sequence[pathlib.Path]) -> pathlib.Path:
  """<run>/new_client for one run, <common parent>/new_client for several."""
  if len(run_dirs) == 1:
    return run_dirs[0] / "new_client"
  return pathlib.Path(os.path.commonpath([str(p.absolute()) for p in run_dirs])) / "new_client"


def resolve_target(target: str | float | None, runs: Sequence[nc.FinishedRun]) -> float | None:
  """--target: a percent, "none", or "auto" (the first run's first eval.targets, else none)."""
  if target is None or (isinstance(target, str) and target.lower() == "none"):
    return None
  if isinstance(target, str) and target.lower() == "auto":
    targets = tuple(runs[0].config.eval.targets)
    return float(targets[0]) if targets else None
  value = float(target)
  if not 0 < value <= 100:
    raise ConfigError(f"--target must be a percent in (0, 100], 'auto' or 'none', got "
                         f"{target!r}.")
  return value


def _unique_labels(labels: list[str], runs: Sequence[nc.FinishedRun]) -> list[str]:
  """Method labels, suffixed with the run's directory name where two are equal."""
  return [f"{label} ({run.workdir.name})" if labels.count(label) > 1 else label
          for label, run in zip(labels, runs)]


def run_experiment(run_dirs: Sequence[str | os.PathLike], *, out: str | os.PathLike | None = None,
                   max_epochs: int = 20, tolerance: float = 0.5,
                   target: str | float | None = "auto", lr: str | float = "config",
                   seed: int | None = None, plot: bool = True,
                   echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the new-client experiment on finished runs; writes and returns the results.

  Args:
    run_dirs: workdirs of finished runs (FedAvg, FedMMD or FedFusion).
    out: output directory (default: `default_out`).
    max_epochs: local epochs of every new client.
    tolerance: points below the best accuracy that count as converged.
    target: accuracy target in percent, "auto" or "none" (`resolve_target`).
    lr: "config", "last" or a rate (`new_client.new_client_lr`).
    seed: seed of the data halves and batch orders (default: each run's seed).
    plot: write new_client.png (needs matplotlib).
    echo: progress lines.

  Returns:
    The contents of new_client.json.
  """
  tick = time.perf_counter()
  if not run_dirs:
    raise ConfigError("--runs: name at least one finished run's workdir.")
  if int(max_epochs) < 1:
    raise ConfigError(f"--max_epochs must be >= 1, got {max_epochs!r}.")
  if not float(tolerance) >= 0:
    raise ConfigError(f"--tolerance must be >= 0, got {tolerance!r}.")
  paths = [pathlib.Path(p) for p in run_dirs]
  runs = []
  for path in paths:
    echo(f"restoring {path}")
    run = nc.restore_finished_run(path)
    nc.check_method(run.config)
    runs.append(run)
  target_value = resolve_target(target, runs)
  labels = _unique_labels([nc.method_label(r.config) for r in runs], runs)
  curves, references, datasets = [], {}, {}
  for run, label in zip(runs, labels):
    config, setup = run.config, run.experiment.setup
    data = nc.new_client_data(config, run.experiment.scenario, seed=seed)
    fingerprint = nc.data_fingerprint(data)
    datasets[fingerprint] = data.description
    rate = nc.new_client_lr(config, lr)
    start = nc.global_start(config, setup, run.server)
    echo(f"{label}: {max_epochs} local epochs from the global model at lr {rate:g}")
    began = time.perf_counter()
    curve = nc.train_curve(start, data, config, setup, max_epochs=max_epochs,
                           learning_rate=rate, seed=seed)
    # The server model exactly as the run evaluated it, on the new client's evaluation half
    # (FedFusion: before its frozen trunk is reloaded, so it may differ from epoch 0).
    accuracy = jax_accuracy(start, data, config, setup)
    curves.append({
        "label": label, "kind": "global", "run": str(run.workdir), "config_name": config.name,
        "method": str(config.algorithm), "start": start.description, "learning_rate": rate,
        "rounds_trained": run.round, "data_fingerprint": fingerprint,
        "federation_accuracy": run.recorded_accuracy(),
        "server_model_accuracy": float(accuracy(run.server)),
        "accuracy": curve.accuracy, "loss": curve.loss,
        "seconds": time.perf_counter() - began,
        **nc.summarize(curve.accuracy, tolerance=float(tolerance), target=target_value)})
    key = json.dumps([fingerprint, config.models.to_dict(), config.local.to_dict(),
                      config.eval.to_dict(), rate, seed if seed is not None else int(config.seed)],
                     sort_keys=True, default=str)
    if key not in references:
      references[key] = (run, data, rate, fingerprint)
  for run, data, rate, fingerprint in references.values():
    label = RANDOM_LABEL if len(references) == 1 else f"{RANDOM_LABEL} ({labels[runs.index(run)]})"
    start = nc.random_start(run.config, run.experiment.setup)
    echo(f"{label}: {max_epochs} local epochs from a random initialisation at lr {rate:g}")
    began = time.perf_counter()
    curve = nc.train_curve(start, data, run.config, run.experiment.setup,
                           max_epochs=max_epochs, learning_rate=rate, seed=seed)
    curves.append({
        "label": label, "kind": "random", "run": str(run.workdir),
        "config_name": run.config.name, "method": "random", "start": start.description,
        "learning_rate": rate, "data_fingerprint": fingerprint,
        "accuracy": curve.accuracy, "loss": curve.loss,
        "seconds": time.perf_counter() - began,
        **nc.summarize(curve.accuracy, tolerance=float(tolerance), target=target_value)})
  out_dir = pathlib.Path(out) if out is not None else default_out(paths)
  out_dir.mkdir(parents=True, exist_ok=True)
  results = {
      "experiment": "new_client (FedFusion paper Sec. 4.3.2, Fig. 6)",
      "runs": [str(p) for p in paths], "max_epochs": int(max_epochs),
      "tolerance": float(tolerance), "target": target_value, "lr": str(lr),
      "seed": seed, "data": sorted(datasets.values()),
      "definitions": {
          "epoch 0": "the starting model, before any local training",
          "epochs_to_converge": f"the first epoch whose accuracy is within {tolerance:g} points "
                                f"of the curve's best accuracy over epochs 0-{max_epochs}",
          "epochs_to_target": "the first epoch whose accuracy reaches the target (null: never)",
          "federation_accuracy": "the run's last recorded mean (intra-domain) test accuracy",
          "server_model_accuracy": "the server model as the run evaluates it, on the new "
                                   "client's evaluation half",
      },
      "curves": curves, "wall_seconds": time.perf_counter() - tick}
  workdir_lib.write_atomic(out_dir / "new_client.json", json.dumps(results, indent=2) + "\n")
  workdir_lib.write_atomic(out_dir / "new_client.md", markdown(results))
  if plot:
    plot_curves(results, out_dir / "new_client.png")
  echo(f"wrote {out_dir / 'new_client.md'}")
  return results


def jax_accuracy(start: nc.ClientStart, data: nc.NewClientData, config: Any,
                 setup: Any) -> Callable[[Any], float]:
  """variables -> accuracy (percent) of `start`'s model on the new client's evaluation half."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_het.data.augment import normalizer  # pylint: disable=g-import-not-at-top
  accuracy = jax.jit(nc.make_accuracy(start.group.model, size=len(data.test),
                                      batch_size=int(config.eval.batch_size),
                                      top_k=int(config.eval.top_k),
                                      preprocess=normalizer(setup.private_mean,
                                                            setup.private_std)))
  images, labels = jnp.asarray(data.test.images), jnp.asarray(data.test.labels)
  return lambda variables: float(accuracy(variables, images, labels))


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
  if value is None:
    return "—"
  return fmt.format(value) if isinstance(value, float) else str(value)


def markdown(results: dict[str, Any]) -> str:
  """new_client.md: the summary table and the accuracy per epoch."""
  target, tolerance = results["target"], results["tolerance"]
  lines = ["# New client: local epochs to converge from each method's global model",
           "", "FedFusion paper Sec. 4.3.2 / Fig. 6. Runs: "
           + ", ".join(f"`{r}`" for r in results["runs"]) + ".", ""]
  lines += [f"Data: {d}" for d in results["data"]]
  lines += ["", f"Local training: {results['max_epochs']} epochs with each run's local optimiser "
            f"(config.local) at a constant learning rate (--lr={results['lr']}: "
            + ", ".join(sorted({f"{c['learning_rate']:g}" for c in results["curves"]})) + ").",
            f"Epochs to converge: the first epoch within {tolerance:g} points of the curve's best "
            f"accuracy (epochs 0-{results['max_epochs']}; epoch 0 = before training)."
            + (f" Epochs to target: the first epoch reaching {target:g}%." if target else ""), ""]
  header = ["start", "epoch 0", "best", "final", f"epochs to converge (±{tolerance:g})"]
  if target:
    header.append(f"epochs to {target:g}%")
  header += ["federation accuracy (run)", "server model on new client"]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for c in results["curves"]:
    row = [c["label"], _cell(c["accuracy"][0]), _cell(c["best"]), _cell(c["final"]),
           _cell(c["epochs_to_converge"])]
    if target:
      row.append(_cell(c.get("epochs_to_target")) if c.get("epochs_to_target") is not None
                 else f"not in {results['max_epochs']}")
    row += [_cell(c.get("federation_accuracy")), _cell(c.get("server_model_accuracy"))]
    lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Accuracy (%) on the new client's evaluation half after each local epoch:", ""]
  names = [c["label"] for c in results["curves"]]
  lines += ["| epoch | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
  for epoch in range(results["max_epochs"] + 1):
    lines.append(f"| {epoch} | " + " | ".join(f"{c['accuracy'][epoch]:.2f}"
                                              for c in results["curves"]) + " |")
  lines += ["", "Starts:", *[f"- {c['label']}: {c['start']}." for c in results["curves"]], ""]
  return "\n".join(lines)


def plot_curves(results: dict[str, Any], path: pathlib.Path) -> bool:
  """Accuracy vs local epochs, one line per start (reference dashed). False without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib is not installed (pip install 'fedjax_het[viz]'): no plot.")
    return False
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for c in results["curves"]:
    epochs = range(len(c["accuracy"]))
    ax.plot(epochs, c["accuracy"], "--" if c["kind"] == "random" else "-", marker="o",
            markersize=3, label=f"{c['label']} (converged at {c['epochs_to_converge']})")
  if results["target"]:
    ax.axhline(results["target"], color="grey", linestyle=":", linewidth=1,
               label=f"target {results['target']:g}%")
  ax.set_xlabel("local epochs of the new client")
  ax.set_ylabel("test accuracy (%)")
  ax.set_title("New client: accuracy vs local epochs from each method's start")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


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
    results = run_experiment(runs, out=args.out, max_epochs=args.max_epochs,
                             tolerance=args.tolerance, target=args.target, lr=args.lr,
                             seed=args.seed, plot=not args.no_plot)
  except UserError as error:
    if wants_traceback(args.verbose):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  print(markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())

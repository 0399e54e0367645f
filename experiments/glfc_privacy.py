"""GLFC privacy report: does the prototype perturbation protect, and keep usefulness?

  FEDJAX_HET_DATA_DIR=<bundle> python experiments/glfc_privacy.py \\
      [--samples=8] [--steps=2000] [--model=simple_cnn] [--epochs=30] [--out=runs/glfc_privacy]

GLFC (Dong et al., CVPR 2022, Sec. 4.2, Eq. 8-11) has each client send the
proxy server, per new class, the gradient of a fixed random LeNet encoder on a
PERTURBED prototype image; the server infers the label, reconstructs the
image by gradient matching, and picks the old global model with the best
accuracy on the reconstructions. The paper claims the perturbation protects
the prototype from an attacker holding the encoder and the gradient while
keeping the reconstructions useful. This script measures both:

  1. a local classifier (--model, --epochs; default simple_cnn, 30 epochs,
     ~0.5 min on 2 CPU cores, ~60% on the 10 classes of the bundle's first
     task) is trained on all training images of the FIRST task's classes of
     the class-incremental stream: a stand-in for a client's local model (a
     client holding every class of the task);
  2. for --samples classes of that task (seeded): the prototype (the image
     nearest the class mean in the classifier's feature space), its feature
     variance sigma^2, the perturbed prototype (`perturb_prototype`, GLFC's 50
     SGD steps at lr 0.2, gamma 0.1, noise in feature space), and the LeNet
     gradients of the RAW and of the PERTURBED prototype;
  3. the server side on both: labels inferred from the gradients, images
     reconstructed with `reconstruct_batch` (L-BFGS, --steps iterations, the
     same N(0, 1) dummy for the raw and the perturbed gradient of a sample);
  4. PSNR / SSIM of both reconstructions and of the perturbed prototype
     against the ORIGINAL prototype, label-inference accuracy, and the
     classifier's top-1 accuracy on the originals and on both
     reconstructions (the server's selection criterion).

Outputs (into --out): privacy.md (per-sample table + means, settings, the
plain-language conclusion with the criteria it uses), privacy.json (the
same numbers), privacy_grid.png (rows = samples; columns = original,
perturbed prototype, reconstruction from the raw gradient, reconstruction
from the perturbed gradient).

Without the bundle pass --synthetic_fallback --num_classes=20 --num_tasks=4
(a loud warning; the report is marked SYNTHETIC and says nothing about
CIFAR-100).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/glfc_privacy.py` from a source checkout
  sys.path.insert(0, str(REPO))

from fedjax_het.errors import (  # noqa: E402  pylint: disable=g-import-not-at-top
    ConfigError, UserError, wants_traceback)

DEFAULT_OUT = "runs/glfc_privacy"
PERTURB_INPUTS = ("normalized", "raw")
COLUMNS = ("original", "perturbed prototype", "rec. from raw gradient",
           "rec. from perturbed gradient")


def _check(args: argparse.Namespace) -> None:
  for name, minimum in (("samples", 1), ("steps", 1), ("epochs", 1), ("batch_size", 1),
                        ("perturb_steps", 0), ("num_tasks", 1)):
    if getattr(args, name) < minimum:
      raise ConfigError(f"--{name} must be >= {minimum}, got {getattr(args, name)}.")
  if args.perturb_input not in PERTURB_INPUTS:
    raise ConfigError(f"--perturb_input must be one of {PERTURB_INPUTS}, got "
                      f"{args.perturb_input!r}.")
  if args.perturb_loss not in ("bce", "ce"):
    raise ConfigError(f"--perturb_loss must be 'bce' or 'ce', got {args.perturb_loss!r}.")


def run_report(args: argparse.Namespace, *, command: str = "",
               echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the whole report (module docstring); writes and returns privacy.json's content."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_het import models  # pylint: disable=g-import-not-at-top
  from fedjax_het import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from fedjax_het.cil import gradient_inversion as gi  # pylint: disable=g-import-not-at-top
  from fedjax_het.studies import privacy  # pylint: disable=g-import-not-at-top
  from fedjax_het.data.augment import normalizer  # pylint: disable=g-import-not-at-top
  from fedjax_het.data.incremental import (  # pylint: disable=g-import-not-at-top
      build_class_incremental_stream)

  _check(args)
  tick = time.perf_counter()
  timings = {}
  stream = build_class_incremental_stream(
      "cifar100", num_tasks=args.num_tasks, num_classes=args.num_classes, source=args.source,
      data_dir=args.data_dir, synthetic_fallback=args.synthetic_fallback, seed=args.seed)
  k = stream.classes_per_task
  if args.samples > k:
    raise ConfigError(f"--samples={args.samples} exceeds the {k} classes of the first task "
                      f"(--num_tasks={args.num_tasks} of {stream.num_classes} classes).")
  train = stream.labels < k
  images, labels = stream.images[train], stream.labels[train]
  test = stream.test_labels < k
  preprocess = normalizer(stream.mean, stream.std)
  key = jax.random.key(args.seed)

  # 1. The local classifier.
  echo(f"training {args.model} (width {args.width:g}) on {len(labels)} images of the first "
       f"task's {k} classes, {args.epochs} epochs")
  began = time.perf_counter()
  model = models.get_model(args.model, k, width=args.width, conv_impl=args.conv_impl)
  variables, epoch_losses = privacy.train_classifier(
      model, images, labels, jax.random.fold_in(key, 1), epochs=args.epochs,
      batch_size=min(args.batch_size, len(labels)), learning_rate=args.lr,
      preprocess=preprocess)
  timings["training"] = time.perf_counter() - began
  test_accuracy = float(np.mean(privacy.predict(model, variables, stream.test_images[test],
                                                preprocess=preprocess)
                                == stream.test_labels[test]))
  train_features, train_logits = privacy.model_outputs(model, variables, images,
                                                       preprocess=preprocess)
  train_accuracy = float(np.mean(np.argmax(train_logits, -1) == labels))
  echo(f"  {timings['training']:.0f} s; test accuracy {100 * test_accuracy:.1f}% (chance "
       f"{100 / k:.1f}%), training accuracy {100 * train_accuracy:.1f}%")

  # 2. Prototypes, perturbation, shared gradients.
  rng = np.random.default_rng(np.random.SeedSequence([args.seed, 0x9121]))
  classes = np.sort(rng.choice(k, args.samples, replace=False))
  rows, variances = privacy.class_prototypes(train_features, labels, classes)
  originals = jnp.asarray(images[rows], jnp.float32) / 255.0
  class_labels = jnp.asarray(classes, jnp.int32)
  began = time.perf_counter()
  perturb_pre = preprocess if args.perturb_input == "normalized" else None
  perturb = jax.jit(jax.vmap(lambda x, y, kk, var: gi.perturb_prototype(
      model, variables, x, y, kk, feature_variance=var, steps=args.perturb_steps,
      learning_rate=args.perturb_lr, weight_decay=args.perturb_weight_decay, gamma=args.gamma,
      kind=args.perturb_loss, preprocess=perturb_pre)))
  perturbed, perturb_losses = perturb(
      originals, class_labels, jax.random.split(jax.random.fold_in(key, 2), args.samples),
      jnp.asarray(variances))
  timings["perturbation"] = time.perf_counter() - began
  encoder = models.get_model("lenet_encoder", 100)
  encoder_variables = models.init_variables(encoder, jax.random.key(args.encoder_seed))
  share = jax.jit(jax.vmap(lambda x, y: gi.prototype_gradient(encoder, encoder_variables, x, y)))
  grads_raw = share(originals, class_labels)
  grads_perturbed = share(perturbed, class_labels)

  # 3. The server (or an attacker with the encoder): labels and reconstructions.
  labels_raw, labels_perturbed = gi.infer_label(grads_raw), gi.infer_label(grads_perturbed)
  echo(f"reconstructing {2 * args.samples} images ({args.steps} L-BFGS iterations each)")
  began = time.perf_counter()
  reconstruct = jax.jit(lambda g, y: gi.reconstruct_batch(
      encoder, encoder_variables, g, y, jax.random.key(args.reconstruction_seed),
      steps=args.steps))
  rec_raw, history_raw = reconstruct(grads_raw, labels_raw)
  rec_perturbed, history_perturbed = reconstruct(grads_perturbed, labels_perturbed)
  rec_raw, rec_perturbed = rec_raw[:, -1], rec_perturbed[:, -1]
  jax.block_until_ready((rec_raw, rec_perturbed))
  timings["reconstruction"] = time.perf_counter() - began
  echo(f"  {timings['reconstruction']:.0f} s")

  # 4. Scores.
  scores = privacy.image_scores(originals, perturbed, rec_raw, rec_perturbed)
  pred = {name: privacy.predict(model, variables, privacy.quantize(x), preprocess=preprocess)
          for name, x in (("original", originals), ("perturbed", perturbed),
                          ("rec_raw", rec_raw), ("rec_perturbed", rec_perturbed))}
  names = stream.class_names
  samples = []
  for i, c in enumerate(classes):
    c = int(c)
    samples.append({
        "class_index": c, "class_name": names[c] if names else str(c),
        "original_label": int(stream.class_order[c]), "prototype_row": int(rows[i]),
        "inferred_label_raw": int(labels_raw[i]),
        "inferred_label_perturbed": int(labels_perturbed[i]),
        "label_raw_ok": bool(int(labels_raw[i]) == c),
        "label_perturbed_ok": bool(int(labels_perturbed[i]) == c),
        **{key_: float(v[i]) for key_, v in scores.items()},
        "max_abs_perturbation": float(jnp.max(jnp.abs(perturbed[i] - originals[i]))),
        "perturbation_loss_first": float(perturb_losses[i, 0]) if args.perturb_steps else None,
        "perturbation_loss_last": float(perturb_losses[i, -1]) if args.perturb_steps else None,
        "matching_loss_raw": float(history_raw[i, -1]),
        "matching_loss_perturbed": float(history_perturbed[i, -1]),
        **{f"prediction_{n}": int(p[i]) for n, p in pred.items()},
        **{f"correct_{n}": bool(int(p[i]) == c) for n, p in pred.items()},
    })
  means = privacy.summarize(samples)
  verdict = privacy.verdict(means, chance=1.0 / k)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  report = privacy.json_safe({
      "experiment": "GLFC prototype-gradient privacy (Dong et al. CVPR 2022, Sec. 4.2, "
                    "Eq. 8-11)",
      "command": command,
      "data": {"sources": dict(stream.sources), "substituted": list(stream.substituted),
               "num_tasks": stream.num_tasks, "num_classes": stream.num_classes,
               "classes_per_task": k, "class_order": [int(x) for x in stream.class_order]},
      "classifier": {"model": args.model, "width": args.width, "conv_impl": args.conv_impl,
                     "epochs": args.epochs, "batch_size": min(args.batch_size, len(labels)),
                     "learning_rate": args.lr, "num_classes": k, "train_size": int(len(labels)),
                     "test_size": int(np.sum(test)), "test_accuracy": test_accuracy,
                     "train_accuracy": train_accuracy,
                     "epoch_losses": [float(v) for v in epoch_losses],
                     "seconds": timings["training"]},
      "settings": {"samples": args.samples, "steps": args.steps,
                   "perturb_steps": args.perturb_steps, "perturb_lr": args.perturb_lr,
                   "perturb_weight_decay": args.perturb_weight_decay, "gamma": args.gamma,
                   "perturb_loss": args.perturb_loss, "perturb_input": args.perturb_input,
                   "seed": args.seed, "encoder_seed": args.encoder_seed,
                   "reconstruction_seed": args.reconstruction_seed,
                   "criteria": {"leak_psnr_db": privacy.LEAK_PSNR_DB,
                                "protect_psnr_drop_db": privacy.PROTECT_PSNR_DROP_DB,
                                "protect_ssim": privacy.PROTECT_SSIM,
                                "useful_tolerance": privacy.USEFUL_TOLERANCE,
                                "psnr_cap_db": privacy.PSNR_CAP_DB}},
      "samples": samples, "means": means,
      "accuracy": {"label_inference_raw": means["label_raw_ok"],
                   "label_inference_perturbed": means["label_perturbed_ok"],
                   "classifier_on_originals": means["correct_original"],
                   "classifier_on_perturbed_prototypes": means["correct_perturbed"],
                   "classifier_on_rec_raw": means["correct_rec_raw"],
                   "classifier_on_rec_perturbed": means["correct_rec_perturbed"]},
      "verdict": verdict, "timings": timings,
      "wall_seconds": time.perf_counter() - tick})
  workdir_lib.write_atomic(out / "privacy.json", json.dumps(report, indent=2) + "\n")
  workdir_lib.write_atomic(out / "privacy.md", privacy.markdown(report))
  if not args.no_plot:
    plot_grid(np.stack([np.asarray(privacy.quantize(x))
                        for x in (originals, perturbed, rec_raw, rec_perturbed)], axis=1),
              samples, out / "privacy_grid.png")
  echo(f"wrote {out / 'privacy.md'}")
  return report


def plot_grid(images: Any, samples: Sequence[dict[str, Any]], path: pathlib.Path) -> None:
  """privacy_grid.png: rows = samples, columns = `COLUMNS`; images (N, 4, H, W, C) in [0, 1]."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  n = len(samples)
  fig, axes = plt.subplots(n, 4, figsize=(4 * 2.1, n * 2.3 + 0.4), squeeze=False)
  for i, s in enumerate(samples):
    notes = ("", f"{s['psnr_perturbed']:.1f} dB / {s['ssim_perturbed']:.2f}",
             f"{s['psnr_rec_raw']:.1f} dB / {s['ssim_rec_raw']:.2f}",
             f"{s['psnr_rec_perturbed']:.1f} dB / {s['ssim_rec_perturbed']:.2f}")
    for j in range(4):
      ax = axes[i, j]
      ax.imshow(images[i, j], interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
      ax.set_xlabel(notes[j], fontsize=7)
      if i == 0:
        ax.set_title(COLUMNS[j], fontsize=8)
    axes[i, 0].set_ylabel(f"{s['class_index']}: {s['class_name']}", fontsize=7)
  fig.suptitle("GLFC prototypes (PSNR / SSIM vs the original)", fontsize=9)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (n * 2.3 + 0.4)))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from fedjax_het.cil import gradient_inversion as gi  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
  parser.add_argument("--samples", type=int, default=8, help="classes (prototypes) to test")
  parser.add_argument("--steps", type=int, default=gi.RECONSTRUCTION_STEPS,
                      help="L-BFGS iterations of each reconstruction (>= 2000 to converge)")
  parser.add_argument("--model", default="simple_cnn", help="local classifier (zoo name)")
  parser.add_argument("--width", type=float, default=1.0)
  parser.add_argument("--conv_impl", default="im2col",
                      help="xla, im2col or custom_vjp (im2col is fast on CPU)")
  parser.add_argument("--epochs", type=int, default=30)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--lr", type=float, default=0.05, help="peak SGD rate (cosine)")
  parser.add_argument("--perturb_steps", type=int, default=gi.PERTURBATION_STEPS)
  parser.add_argument("--perturb_lr", type=float, default=gi.PERTURBATION_LEARNING_RATE)
  parser.add_argument("--perturb_weight_decay", type=float,
                      default=gi.PERTURBATION_WEIGHT_DECAY)
  parser.add_argument("--gamma", type=float, default=0.1, help="feature-noise scale (Eq. 10)")
  parser.add_argument("--perturb_loss", default="bce", help="bce (the code) or ce (the paper)")
  parser.add_argument("--perturb_input", default="normalized",
                      help="what the classifier sees during the perturbation: 'normalized' "
                           "(as in training) or 'raw' (the authors' code: [0, 1] pixels)")
  parser.add_argument("--num_tasks", type=int, default=10)
  parser.add_argument("--num_classes", type=int, default=None,
                      help="classes of the stream (default: all 100)")
  parser.add_argument("--source", default="real", help="real (the bundle), tfds, synthetic")
  parser.add_argument("--data_dir", default=None, help="default: $FEDJAX_HET_DATA_DIR")
  parser.add_argument("--synthetic_fallback", action="store_true",
                      help="use synthetic data if the source is unavailable (loud warning)")
  parser.add_argument("--seed", type=int, default=0, help="data, classifier, class sample")
  parser.add_argument("--encoder_seed", type=int, default=0)
  parser.add_argument("--reconstruction_seed", type=int, default=1)
  parser.add_argument("--no_plot", action="store_true")
  parser.add_argument("--verbose", action="store_true", help="show tracebacks of user errors")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  command = " ".join(["python experiments/glfc_privacy.py", *map(shlex.quote, argv)])
  try:
    report = run_report(args, command=command)
  except UserError as error:
    if wants_traceback(args.verbose):
      raise
    print(f"error: {error}", file=sys.stderr)
    return 1
  print(report["verdict"]["text"])
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""GLFC's privacy claim, measured: reconstructions from raw vs perturbed prototype gradients.

GLFC (Sec. 4.2, "Perturbed Prototype Samples Construction") claims that the
perturbation of Eq. 10-11 protects the client's prototype image: an attacker
who steals the LeNet gradient encoder and a shared gradient "can get little
useful information" from the reconstruction, while the proxy server can
still use the reconstructions to select the best old global model (highest
accuracy on them). The pieces here measure both halves of that claim for a
sample of prototypes (`experiments/glfc_privacy.py` runs the whole report):

  * `train_classifier`, `predict`: a briefly trained local classifier (the
    client's local model in the protocol; also the model whose accuracy on
    the reconstructions stands for the proxy server's selection criterion).
  * `class_prototypes`: per class, the prototype index (`select_prototype`)
    and the feature variance sigma^2 of Eq. 10 (`class_feature_variance`).
  * `image_scores`: PSNR / SSIM of the perturbed prototype and of the two
    reconstructions against the ORIGINAL prototype (and of the perturbed
    reconstruction against the perturbed prototype: did the attack recover
    what was sent?).
  * `summarize`, `verdict`, `markdown`: means, the plain-language
    conclusion (thresholds below, stated in the report) and privacy.md.

Image space. Every image is scored as the uint8 image it would be stored
and shown as (`quantize`: `gradient_inversion.to_uint8` / 255, i.e. clipped to
[0, 1] and rounded): the proxy server's monitor set holds exactly these
images, and it is what an attacker would look at. PSNR and SSIM use
data_range 1. Identical images (PSNR = +inf) are reported as
`PSNR_CAP_DB` so that means and JSON stay finite.

References:
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022,
    Sec. 4.2, Eq. 8-11, Fig. 2.
  [DLG] L. Zhu, Z. Liu, S. Han. Deep Leakage from Gradients. NeurIPS 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import losses
from fedjax_het.cil import gradient_inversion as gi
from fedjax_het.cil import image_metrics
from fedjax_het.data import augment
from fedjax_het.engine import optim
from fedjax_het.models import apply_model, init_variables

#: PSNR reported for identical images (+inf): above the largest finite PSNR of two
#: distinct 32x32x3 uint8 images (~83 dB, one pixel off by 1/255).
PSNR_CAP_DB = 100.0
#: The raw-gradient attack "works" when its reconstructions reach this mean PSNR
#: against the original (RMSE <= 0.1 = 25/255 per pixel: a close, recognisable copy).
#: Below it the report is inconclusive (the attack, not the perturbation, failed).
LEAK_PSNR_DB = 20.0
#: The perturbation "protects" when the perturbed-gradient reconstructions are on
#: average at least this many dB below the raw-gradient ones (10 dB: 10x the MSE) ...
PROTECT_PSNR_DROP_DB = 10.0
#: ... and their mean SSIM against the original is below this (little structure left).
PROTECT_SSIM = 0.5
#: Usefulness is kept when the classifier's accuracy on the perturbed-gradient
#: reconstructions is at most this far (fraction) below its accuracy on the originals.
USEFUL_TOLERANCE = 0.1

# Per-sample fields of the report, in table order: (key, column header, format).
SAMPLE_COLUMNS = (
    ("class_index", "class", "{}"),
    ("class_name", "name", "{}"),
    ("label_raw_ok", "label (raw)", "{}"),
    ("label_perturbed_ok", "label (pert.)", "{}"),
    ("psnr_perturbed", "PSNR pert. proto", "{:.2f}"),
    ("ssim_perturbed", "SSIM pert. proto", "{:.3f}"),
    ("psnr_rec_raw", "PSNR rec. raw", "{:.2f}"),
    ("ssim_rec_raw", "SSIM rec. raw", "{:.3f}"),
    ("psnr_rec_perturbed", "PSNR rec. pert.", "{:.2f}"),
    ("ssim_rec_perturbed", "SSIM rec. pert.", "{:.3f}"),
    ("psnr_rec_perturbed_vs_sent", "PSNR rec. pert. vs pert. proto", "{:.2f}"),
    ("correct_original", "clf: original", "{}"),
    ("correct_rec_raw", "clf: rec. raw", "{}"),
    ("correct_rec_perturbed", "clf: rec. pert.", "{}"),
)
#: Per-sample scores averaged in `summarize` (booleans become fractions).
MEAN_KEYS = ("psnr_perturbed", "ssim_perturbed", "psnr_rec_raw", "ssim_rec_raw",
             "psnr_rec_perturbed", "ssim_rec_perturbed", "psnr_rec_perturbed_vs_sent",
             "label_raw_ok", "label_perturbed_ok", "correct_original", "correct_perturbed",
             "correct_rec_raw", "correct_rec_perturbed", "max_abs_perturbation")


# ----------------------------------------------------------------------------
# The local classifier.
# ----------------------------------------------------------------------------


def train_classifier(model: nn.Module, images: np.ndarray, labels: np.ndarray,
                     key: jax.Array, *, epochs: int, batch_size: int = 64,
                     learning_rate: float = 0.05, momentum: float = 0.9,
                     weight_decay: float = 5e-4,
                     preprocess: Callable[[jax.Array], jax.Array],
                     augmentation: bool = True) -> tuple[dict[str, Any], np.ndarray]:
  """Trains `model` from scratch with softmax cross-entropy (a client's local model).

  SGD with momentum and L2 weight decay (torch semantics, `engine.optim`), a
  cosine learning-rate decay over the epochs, random crop + flip
  (`augment.weak_augment`) before `preprocess`. Each epoch visits a fresh
  permutation in floor(n / batch_size) full batches (the remainder is
  dropped); the whole run is one jitted `lax.scan` over the epochs.

  Args:
    model: a zoo classifier (its head spans the classes of `labels`).
    images: (n, 32, 32, 3) uint8.
    labels: (n,) int in [0, model.num_classes).
    key: PRNG key (initialisation, orders, augmentation).
    epochs: passes over the data (>= 1).
    batch_size: examples per step (<= n).
    learning_rate, momentum, weight_decay: SGD settings (peak rate).
    preprocess: [0, 1] float images -> the model's input (normalisation).
    augmentation: random crop + flip.

  Returns:
    (variables, mean training loss per epoch (epochs,)).
  """
  n = int(images.shape[0])
  epochs, batch_size = int(epochs), int(batch_size)
  if epochs < 1:
    raise ValueError(f"train_classifier: `epochs` must be >= 1, got {epochs}.")
  if not 1 <= batch_size <= n:
    raise ValueError(f"train_classifier: `batch_size` must be in [1, n={n}], got {batch_size}.")
  steps = n // batch_size
  k_init, k_train = jax.random.split(key)
  variables = init_variables(model, k_init)
  tx = optim.make_optimizer("sgd", momentum=momentum, weight_decay=weight_decay)
  rates = optim.cosine_epoch_rates(learning_rate, 0.0, epochs)
  x_all, y_all = jnp.asarray(images), jnp.asarray(labels, jnp.int32)

  def loss_fn(params, state, x, y, rng):
    _, logits, new_vars = apply_model(model, {**state, "params": params}, x, train=True, rng=rng)
    return losses.softmax_cross_entropy(logits=logits, labels=y), new_vars

  def epoch(carry, inputs):
    variables, opt_state = carry
    rate, k = inputs
    k_perm, k_aug = jax.random.split(k)
    order = jax.random.permutation(k_perm, n)[:steps * batch_size].reshape(steps, batch_size)

    def step(carry, s):
      variables, opt_state = carry
      idx = order[s]
      k_s = jax.random.fold_in(k_aug, s)
      x = x_all[idx].astype(jnp.float32) / 255.0
      if augmentation:
        x = augment.weak_augment(jax.random.fold_in(k_s, 0), x)
      (loss, new_vars), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          variables["params"], variables, preprocess(x), y_all[idx], jax.random.fold_in(k_s, 1))
      params, opt_state = optim.apply_updates(tx, variables["params"], grads, opt_state, rate)
      return ({**new_vars, "params": params}, opt_state), loss

    (variables, opt_state), step_losses = jax.lax.scan(step, (variables, opt_state),
                                                       jnp.arange(steps))
    return (variables, opt_state), jnp.mean(step_losses)

  @jax.jit
  def run(variables, keys):
    (variables, _), epoch_losses = jax.lax.scan(
        epoch, (variables, tx.init(variables["params"])), (rates, keys))
    return variables, epoch_losses

  variables, epoch_losses = run(variables, jax.random.split(k_train, epochs))
  return variables, np.asarray(epoch_losses)


def model_outputs(model: nn.Module, variables: dict[str, Any], images: jax.Array, *,
                  preprocess: Callable[[jax.Array], jax.Array],
                  batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """Eval-mode (features, logits) of uint8 or [0, 1] float images, in batches.

  Returns:
    (features (n, feature_dim), logits (n, num_classes)) as float32 NumPy.
  """
  images = jnp.asarray(images)
  scale = 1.0 / 255.0 if images.dtype == jnp.uint8 else 1.0
  features, logits = [], []
  for start in range(0, images.shape[0], batch_size):
    x = preprocess(images[start:start + batch_size].astype(jnp.float32) * scale)
    f, z, _ = apply_model(model, variables, x, train=False)  # jitted once per model and shape
    features.append(np.asarray(f))
    logits.append(np.asarray(z))
  return np.concatenate(features), np.concatenate(logits)


def predict(model: nn.Module, variables: dict[str, Any], images: jax.Array, *,
            preprocess: Callable[[jax.Array], jax.Array]) -> np.ndarray:
  """Top-1 predictions (n,) int of uint8 or [0, 1] float images (eval mode)."""
  return np.argmax(model_outputs(model, variables, images, preprocess=preprocess)[1], axis=-1)


def class_prototypes(features: np.ndarray, labels: np.ndarray,
                     classes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
  """Per class: the prototype row (GLFC Sec. 4.2) and sigma^2 of Eq. 10.

  Args:
    features: (n, d) eval-mode features Phi(x) of the client's images.
    labels: (n,) their classes.
    classes: the classes to take a prototype of (each must occur in labels).

  Returns:
    (rows (len(classes),) int: indices into `features` of the prototypes,
    variances (len(classes), d) float32: `class_feature_variance` per class).
  """
  features = jnp.asarray(features, jnp.float32)
  labels = np.asarray(labels)
  classes = np.asarray(classes, np.int64).reshape(-1)
  missing = [int(c) for c in classes if not np.any(labels == c)]
  if missing:
    raise ValueError(f"class_prototypes: no example of class(es) {missing}.")
  masks = jnp.asarray(labels[None, :] == classes[:, None])
  rows = jax.vmap(lambda m: gi.select_prototype(features, m))(masks)
  variances = jax.vmap(lambda m: gi.class_feature_variance(features, m))(masks)
  return np.asarray(rows), np.asarray(variances)


# ----------------------------------------------------------------------------
# Scores, summary, verdict, report.
# ----------------------------------------------------------------------------


def quantize(images: jax.Array) -> jax.Array:
  """[0, 1]-space float images -> the stored uint8 image, as float in [0, 1]."""
  return gi.to_uint8(images).astype(jnp.float32) / 255.0


def _capped_psnr(a: jax.Array, b: jax.Array) -> np.ndarray:
  value = np.asarray(image_metrics.psnr(a, b, data_range=1.0), np.float64)
  return np.where(np.isposinf(value), PSNR_CAP_DB, value)


def image_scores(original: jax.Array, perturbed: jax.Array, rec_raw: jax.Array,
                 rec_perturbed: jax.Array) -> dict[str, np.ndarray]:
  """PSNR (dB) and SSIM per sample, every image `quantize`d first.

  Args:
    original: (N, H, W, C) original prototypes, uint8 or [0, 1] float.
    perturbed: (N, H, W, C) perturbed prototypes ([0, 1] space, may leave it).
    rec_raw: (N, H, W, C) reconstructions from the raw prototype's gradient.
    rec_perturbed: (N, H, W, C) reconstructions from the perturbed one's.

  Returns:
    {"psnr_perturbed", "ssim_perturbed" (perturbed vs original),
     "psnr_rec_raw", "ssim_rec_raw", "psnr_rec_perturbed", "ssim_rec_perturbed"
     (reconstructions vs original), "psnr_rec_perturbed_vs_sent" (the
     perturbed reconstruction vs the perturbed prototype)}: (N,) float64.
  """
  original = jnp.asarray(original)
  if original.dtype == jnp.uint8:
    original = original.astype(jnp.float32) / 255.0
  x, p, r, q = (quantize(a) for a in (original, perturbed, rec_raw, rec_perturbed))
  ssim = lambda a, b: np.asarray(image_metrics.ssim(a, b, data_range=1.0), np.float64)  # noqa: E731
  return {
      "psnr_perturbed": _capped_psnr(p, x), "ssim_perturbed": ssim(p, x),
      "psnr_rec_raw": _capped_psnr(r, x), "ssim_rec_raw": ssim(r, x),
      "psnr_rec_perturbed": _capped_psnr(q, x), "ssim_rec_perturbed": ssim(q, x),
      "psnr_rec_perturbed_vs_sent": _capped_psnr(q, p),
  }


def summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Means over the samples of every `MEAN_KEYS` field present (bools -> fractions)."""
  if not samples:
    raise ValueError("summarize: no samples.")
  return {key: float(np.mean([float(s[key]) for s in samples]))
          for key in MEAN_KEYS if key in samples[0]}


def verdict(means: Mapping[str, float], *, chance: float | None = None) -> dict[str, Any]:
  """The plain-language conclusion from the means (`summarize`).

  Rules (module constants, also written into the report):
    * attack_works: mean PSNR(raw-gradient reconstruction, original) >=
      LEAK_PSNR_DB; otherwise the privacy question is inconclusive.
    * protects: attack_works, the perturbed-gradient reconstructions are on
      average >= PROTECT_PSNR_DROP_DB below the raw ones, and their mean SSIM
      against the original is < PROTECT_SSIM.
    * useful: accuracy on the perturbed-gradient reconstructions >= accuracy
      on the originals - USEFUL_TOLERANCE; None (cannot be judged) when the
      accuracy on the originals is itself within USEFUL_TOLERANCE of `chance`.

  Args:
    means: `summarize` output (needs the psnr/ssim_rec_*, psnr/ssim_perturbed
      and correct_original / correct_rec_* keys).
    chance: the classifier's chance accuracy (1 / classes), if known.

  Returns:
    {"attack_works", "protects" (None if inconclusive), "useful" (None if
     the classifier is too weak to judge), "psnr_drop_db", "accuracy_drop",
     "text"}.
  """
  raw, pert = means["psnr_rec_raw"], means["psnr_rec_perturbed"]
  drop = raw - pert
  attack_works = raw >= LEAK_PSNR_DB
  protects = (attack_works and drop >= PROTECT_PSNR_DROP_DB
              and means["ssim_rec_perturbed"] < PROTECT_SSIM) if attack_works else None
  acc_drop = means["correct_original"] - means["correct_rec_perturbed"]
  useful = acc_drop <= USEFUL_TOLERANCE + 1e-12
  weak = chance is not None and means["correct_original"] <= chance + USEFUL_TOLERANCE + 1e-12
  if weak:
    useful = None
  parts = []
  if not attack_works:
    parts.append(
        f"Inconclusive on privacy: even the RAW gradient's reconstructions stay at "
        f"{raw:.1f} dB / SSIM {means['ssim_rec_raw']:.2f} from the original (below the "
        f"{LEAK_PSNR_DB:g} dB at which the attack counts as working), so the attack, not the "
        f"perturbation, is what fails here; more L-BFGS steps (--steps) are needed before the "
        f"perturbation can be judged.")
  else:
    parts.append(
        f"The attack works: from the raw prototype's gradient the L-BFGS gradient matching "
        f"recovers the prototype at {raw:.1f} dB PSNR / SSIM {means['ssim_rec_raw']:.2f} "
        f"(mean).")
    sent = means.get("psnr_rec_perturbed_vs_sent")
    tail = (f"; it is {sent:.1f} dB from the perturbed image actually sent, so the attacker "
            f"recovers what was sent" if sent is not None and sent >= LEAK_PSNR_DB else
            (f"; it is only {sent:.1f} dB from the perturbed image actually sent"
             if sent is not None else ""))
    parts.append(
        f"The perturbation changes the prototype itself to {means['psnr_perturbed']:.1f} dB / "
        f"SSIM {means['ssim_perturbed']:.2f} from the original, and the reconstruction from the "
        f"perturbed gradient is {pert:.1f} dB / SSIM {means['ssim_rec_perturbed']:.2f} from "
        f"the original ("
        + (f"{drop:.1f} dB below" if drop >= 0 else f"{-drop:.1f} dB above")
        + f" the raw reconstruction){tail}.")
    if protects:
      parts.append(
          f"By the criteria of this report (>= {PROTECT_PSNR_DROP_DB:g} dB lower PSNR and "
          f"SSIM < {PROTECT_SSIM:g}) the perturbation PROTECTS the prototype: the attacker's "
          f"image is much further from the original than without perturbation.")
    else:
      failed = []
      if drop < PROTECT_PSNR_DROP_DB:
        failed.append(f"the PSNR drop is only {drop:.1f} dB")
      if means["ssim_rec_perturbed"] >= PROTECT_SSIM:
        failed.append(f"the SSIM stays at {means['ssim_rec_perturbed']:.2f}")
      parts.append(
          f"By the criteria of this report (>= {PROTECT_PSNR_DROP_DB:g} dB lower PSNR and "
          f"SSIM < {PROTECT_SSIM:g}) the perturbation does NOT protect the prototype ("
          + " and ".join(failed) + "): the attacker's reconstruction from the perturbed "
          "gradient is still close to the client's original image.")
  pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
  parts.append(
      f"Usefulness: the local classifier is right on {pct(means['correct_original'])} of the "
      f"original prototypes, {pct(means['correct_rec_raw'])} of the raw-gradient "
      f"reconstructions and {pct(means['correct_rec_perturbed'])} of the perturbed-gradient "
      f"reconstructions (the proxy server's selection criterion), so "
      + (f"usefulness CANNOT BE JUDGED: the classifier is within {USEFUL_TOLERANCE * 100:g} "
         f"points of chance ({pct(chance)}) on the originals; train it longer (--epochs)."
         if weak else
         ("usefulness is KEPT" if useful else "usefulness is NOT kept")
         + f" (tolerance {USEFUL_TOLERANCE * 100:g} points below the originals)."))
  if "label_perturbed_ok" in means:
    parts.append(f"Label inference from the shared gradient: "
                 f"{pct(means['label_raw_ok'])} (raw), {pct(means['label_perturbed_ok'])} "
                 f"(perturbed).")
  return {"attack_works": bool(attack_works),
          "protects": None if protects is None else bool(protects),
          "useful": None if useful is None else bool(useful),
          "psnr_drop_db": float(drop), "accuracy_drop": float(acc_drop),
          "text": " ".join(parts)}


def _cell(value: Any, fmt: str) -> str:
  if isinstance(value, (bool, np.bool_)):
    return "yes" if value else "no"
  if value is None:
    return "—"
  return fmt.format(value)


def samples_table(samples: Sequence[Mapping[str, Any]], means: Mapping[str, float]) -> list[str]:
  """Markdown rows: one per sample, then the means (booleans as fractions)."""
  header = [title for _, title, _ in SAMPLE_COLUMNS]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for s in samples:
    lines.append("| " + " | ".join(_cell(s.get(key), fmt) for key, _, fmt in SAMPLE_COLUMNS)
                 + " |")
  cells = []
  for key, _, fmt in SAMPLE_COLUMNS:
    if key == "class_index":
      cells.append("**mean**")
    elif key in means:
      value = means[key]
      is_flag = isinstance(samples[0].get(key), (bool, np.bool_))
      cells.append(f"{value:.2f}" if is_flag else fmt.format(value))
    else:
      cells.append("")
  lines.append("| " + " | ".join(cells) + " |")
  return lines


def markdown(report: Mapping[str, Any]) -> str:
  """privacy.md from the report dict (the content of privacy.json)."""
  s, c, m = report["settings"], report["classifier"], report["means"]
  v = report["verdict"]
  lines = ["# GLFC privacy check: reconstructions from raw vs perturbed prototype gradients", ""]
  if report["data"].get("substituted"):
    lines += [f"**SYNTHETIC DATA**: {', '.join(report['data']['substituted'])} was unavailable "
              f"and replaced by synthetic data; the numbers say "
              f"nothing about CIFAR-100.", ""]
  lines += ["## Conclusion", "", v["text"], "",
            f"{len(report['samples'])} samples: every fraction below moves in steps of "
            f"{100 / len(report['samples']):.1f} points.", "",
            "## Per sample", "",
            "PSNR (dB) / SSIM against the ORIGINAL prototype unless stated; all images as the "
            "stored uint8 image (clipped to [0, 1], rounded). `label`: the label inferred from "
            "the shared gradient is right. `clf`: the trained local classifier's top-1 is "
            "right. `rec. raw` / `rec. pert.`: reconstruction from the gradient of the raw / "
            "perturbed prototype.", ""]
  lines += samples_table(report["samples"], m)
  extra = []
  if "correct_perturbed" in m:
    extra.append(f"Classifier accuracy on the perturbed prototypes themselves: "
                 f"{100 * m['correct_perturbed']:.0f}%.")
  if "max_abs_perturbation" in m:
    extra.append(f"Largest pixel change made by the perturbation (mean over samples): "
                 f"{255 * m['max_abs_perturbation']:.2f} / 255.")
  lines += ["", *extra, "",
            "## Settings", "",
            "- Data: " + "; ".join(f"{k}: {v}" for k, v in report["data"]["sources"].items())
            + f" — class-incremental stream, first task's "
            f"{c['num_classes']} classes; {c['train_size']} training images of them.",
            f"- Local classifier: `{c['model']}` (width {c['width']:g}), {c['epochs']} epochs, "
            f"SGD lr {c['learning_rate']:g} (cosine), batch {c['batch_size']}; test accuracy "
            f"on the first task's classes {100 * c['test_accuracy']:.1f}% (chance "
            f"{100 / c['num_classes']:.1f}%), training {c['seconds']:.0f} s.",
            "- Prototype: per class, the training image nearest the class mean of the "
            "L2-normalised eval features (`select_prototype`); sigma^2 = the class's feature "
            "variance (`class_feature_variance`).",
            f"- Perturbation (GLFC Eq. 10-11): {s['perturb_steps']} SGD steps on the image, lr "
            f"{s['perturb_lr']:g}, weight decay {s['perturb_weight_decay']:g}, gamma "
            f"{s['gamma']:g}, loss `{s['perturb_loss']}`, model input "
            f"`{s['perturb_input']}`.",
            f"- Gradient encoder: `lenet_encoder` (100 outputs), init seed {s['encoder_seed']}; "
            f"shared gradient = grad_W CE(Gamma(x), y) (`prototype_gradient`).",
            f"- Reconstruction (GLFC Eq. 8-9): `reconstruct_batch`, {s['steps']} L-BFGS "
            f"iterations (zoom line search), N(0, 1) dummy, seed {s['reconstruction_seed']}, "
            f"labels inferred from the gradients; {report['timings']['reconstruction']:.0f} s.",
            f"- Criteria: attack works if mean PSNR(rec. raw) >= {LEAK_PSNR_DB:g} dB; protects "
            f"if additionally mean PSNR(rec. pert.) <= PSNR(rec. raw) - "
            f"{PROTECT_PSNR_DROP_DB:g} dB and mean SSIM(rec. pert.) < {PROTECT_SSIM:g}; useful "
            f"if classifier accuracy on rec. pert. >= accuracy on originals - "
            f"{100 * USEFUL_TOLERANCE:g} points. Identical images: PSNR reported as "
            f"{PSNR_CAP_DB:g} dB.",
            f"- Classes sampled: {[x['class_index'] for x in report['samples']]} (seed "
            f"{s['seed']}).",
            f"- Wall time: {report['wall_seconds']:.0f} s. Command: `{report['command']}`", ""]
  return "\n".join(lines)


def json_safe(value: Any) -> Any:
  """JSON-safe: NumPy scalars -> Python, non-finite floats -> None."""
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  if isinstance(value, (np.bool_, bool)):
    return bool(value)
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(float(value)) else None
  return value


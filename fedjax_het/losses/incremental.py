"""Class-incremental baselines' losses (GLFC Table 1): iCaRL's KD, SS-IL, BiC, PODNet.

Every loss works on a fixed-size head of C columns whose classes arrive in
order: the old classes are the prefix [0, num_old_classes), the classes seen
so far the prefix [0, num_seen_classes) (both may be traced, so one compiled
program serves a whole task stream). Columns outside a loss's classes are
selected away before any arithmetic: they get no value and no gradient.

  * `old_class_distillation_loss`: iCaRL's distillation [iCaRL Alg. 3]
    alone, sigmoid BCE of the old-class logits against the old model's
    sigmoid outputs (GLFC's ablation without L_RD).
  * `separated_softmax_cross_entropy`: SS-IL's separated softmax: a sample
    of a new class is classified among the new classes, a sample of an old
    class (an exemplar) among the old classes.
  * `task_wise_distillation_loss`: SS-IL's task-wise KD: per past task, the
    KL divergence between the old and the current model's temperature
    softmax over that task's classes.
  * `bic_distillation_loss`: BiC's distillation loss L_d: the soft
    cross-entropy between the old and the current model's temperature
    softmax over the old classes.
  * `bias_corrected_logits`: BiC's bias correction layer, alpha_s * o +
    beta_s on the logits of task s's classes.
  * `pod_spatial_loss`, `pod_flat_loss`: PODNet's pooled-outputs
    distillation of the backbone's stage outputs (width and height pooling)
    and of the final embedding.
  * `local_similarity_scores`, `nca_loss`: PODNet's local similarity
    classifier (K proxies per class) and its NCA loss with margin.

References:
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017.
  [SS-IL] H. Ahn, J. Kwak, S. Lim, H. Bang, H. Kim, T. Moon. SS-IL: Separated
    Softmax for Incremental Learning. ICCV 2021.
  [BiC] Y. Wu, Y. Chen, L. Wang, Y. Ye, Z. Liu, Y. Guo, Y. Fu. Large Scale
    Incremental Learning. CVPR 2019.
  [PODNet] A. Douillard, M. Cord, C. Ollion, T. Robert, E. Valle. PODNet:
    Pooled Outputs Distillation for Small-Tasks Incremental Learning. ECCV
    2020 (code: arthurdouillard/incremental_learning.pytorch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (check_labels, check_rank, loss_function, masked_mean,
                                     sigmoid_binary_cross_entropy_elementwise)

#: SS-IL's and BiC's distillation temperature (both papers: T = 2).
DISTILLATION_TEMPERATURE = 2.0


def _check_teacher(fn: str, logits: jax.Array, old_logits: jax.Array) -> None:
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  if old_logits.shape != logits.shape:
    raise ValueError(f"{fn}: `old_logits` must have the shape of `logits` {logits.shape}, "
                     f"got {old_logits.shape}.")


def _masked_log_softmax(logits: jax.Array, columns: jax.Array) -> jax.Array:
  """log softmax over the True `columns` of each row ((B, C) bool); 0 elsewhere.

  A row without columns gives 0 (its masked-away inputs are 0, not -inf: no NaN).
  """
  fill = jnp.where(jnp.any(columns, axis=-1, keepdims=True), -jnp.inf, 0.0)
  log_probs = jax.nn.log_softmax(jnp.where(columns, logits, fill), axis=-1)
  return jnp.where(columns, log_probs, 0.0)


@loss_function()
def old_class_distillation_loss(*, logits: jax.Array, old_logits: jax.Array,
                                num_old_classes: int | jax.Array,
                                mask: jax.Array | None = None) -> jax.Array:
  """iCaRL's distillation term on the old classes, sigmoid form [iCaRL Alg. 3].

  L = mean_b mean_{c < C_old} BCE(z_bc, sigmoid(z^old_bc)): the old model's
  sigmoid outputs are the targets of the current logits on the old classes
  [0, C_old) only (no term on the new classes: that is what GLFC's L_RD
  adds, GLFC Eq. 5). 0 when there are no old classes.

  Args:
    logits: (B, C) current model outputs.
    old_logits: (B, C) the old model's outputs (constant).
    num_old_classes: C_old (may be traced).
    mask: optional (B,) validity mask: the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "old_class_distillation_loss"
  _check_teacher(fn, logits, old_logits)
  old = (jnp.arange(logits.shape[-1]) < num_old_classes)[None, :]
  target = jax.nn.sigmoid(jax.lax.stop_gradient(old_logits))
  bce = sigmoid_binary_cross_entropy_elementwise(jnp.where(old, logits, 0.0),
                                                 jnp.where(old, target, 0.0))
  rows = jnp.sum(jnp.where(old, bce, 0.0), axis=-1)
  rows = rows / jnp.maximum(jnp.asarray(num_old_classes), 1).astype(rows.dtype)
  return masked_mean(fn, rows, mask)


@loss_function()
def separated_softmax_cross_entropy(*, logits: jax.Array, labels: jax.Array,
                                    num_old_classes: int | jax.Array,
                                    num_seen_classes: int | jax.Array,
                                    mask: jax.Array | None = None) -> jax.Array:
  """SS-IL's separated-softmax cross-entropy L_ce-ss [SS-IL, separated softmax].

  A sample of a new class (label in [C_old, C_seen)) gets the cross-entropy
  of the softmax over the new classes [C_old, C_seen) only; a sample of an
  old class (label < C_old: an exemplar) the cross-entropy of the softmax
  over the old classes [0, C_old) only. The new samples' gradient therefore
  never pushes the old classes' logits down. Mean over the (valid) samples
  (the SS-IL code sums both groups' losses and divides by the batch size).
  With C_old = 0 it is the softmax cross-entropy over the seen classes.

  Args:
    logits: (B, C) outputs.
    labels: (B,) integer labels in [0, C_seen).
    num_old_classes: C_old (may be traced).
    num_seen_classes: C_seen (may be traced).
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "separated_softmax_cross_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  cls = jnp.arange(logits.shape[-1])[None, :]
  old_sample = (labels < num_old_classes)[:, None]
  new_columns = (cls >= num_old_classes) & (cls < num_seen_classes)
  columns = jnp.where(old_sample, cls < num_old_classes, new_columns)
  log_probs = _masked_log_softmax(logits, columns)
  onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  return masked_mean(fn, -jnp.sum(onehot * log_probs, axis=-1), mask)


@loss_function(static_argnames=("classes_per_task",), positive=("temperature",))
def task_wise_distillation_loss(*, logits: jax.Array, old_logits: jax.Array,
                                classes_per_task: int, num_old_tasks: int | jax.Array,
                                temperature: float = DISTILLATION_TEMPERATURE,
                                mask: jax.Array | None = None) -> jax.Array:
  """SS-IL's task-wise knowledge distillation L_tkd [SS-IL, task-wise KD].

  L = T^2 * mean_b sum_{s < t} KL(softmax(z^old_b[C_s] / T) || softmax(z_b[C_s] / T))
  over the past tasks s < t = `num_old_tasks`, C_s = [s*k, (s+1)*k) the
  classes of task s (k = `classes_per_task`): each old task's logits are
  distilled with their own softmax, so the old model's scale differences
  between tasks are not transferred. The T^2 factor and the batch mean are
  the SS-IL code's (`kl_div(..., reduction='batchmean') * T**2` per task).

  Args:
    logits: (B, C) current model outputs; C a multiple of k.
    old_logits: (B, C) the old model's outputs (constant).
    classes_per_task: k (static).
    num_old_tasks: t (may be traced; 0 gives 0).
    temperature: T (SS-IL: 2).
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "task_wise_distillation_loss"
  _check_teacher(fn, logits, old_logits)
  batch, width = logits.shape
  if classes_per_task < 1 or width % classes_per_task:
    raise ValueError(f"{fn}: `classes_per_task` must be >= 1 and divide the {width} classes, "
                     f"got {classes_per_task}.")
  tasks = width // classes_per_task
  z = (logits / temperature).reshape(batch, tasks, classes_per_task)
  z_old = (jax.lax.stop_gradient(old_logits) / temperature).reshape(batch, tasks,
                                                                    classes_per_task)
  old_log_probs = jax.nn.log_softmax(z_old, axis=-1)
  kl = jnp.sum(jnp.exp(old_log_probs) * (old_log_probs - jax.nn.log_softmax(z, axis=-1)),
               axis=-1)                                                # (B, tasks)
  past = jnp.arange(tasks)[None, :] < num_old_tasks
  rows = jnp.sum(jnp.where(past, kl, 0.0), axis=-1) * temperature**2
  return masked_mean(fn, rows, mask)


@loss_function(positive=("temperature",))
def bic_distillation_loss(*, logits: jax.Array, old_logits: jax.Array,
                          num_old_classes: int | jax.Array,
                          temperature: float = DISTILLATION_TEMPERATURE,
                          mask: jax.Array | None = None) -> jax.Array:
  """BiC's distillation loss L_d [BiC, distillation loss].

  L_d = mean_b sum_{c < C_old} -pi^old_bc log pi_bc with pi = softmax(z / T)
  over the old classes [0, C_old) for both models (the soft cross-entropy of
  the paper; its gradient is the KL divergence's). No T^2 factor (the paper's
  L = lambda L_d + (1 - lambda) L_c has none). 0 when there are no old
  classes.

  Args:
    logits: (B, C) current model outputs.
    old_logits: (B, C) the old model's outputs (BiC: after its bias layer; constant).
    num_old_classes: C_old (may be traced).
    temperature: T (BiC: 2).
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "bic_distillation_loss"
  _check_teacher(fn, logits, old_logits)
  old = jnp.broadcast_to((jnp.arange(logits.shape[-1]) < num_old_classes)[None, :],
                         logits.shape)
  log_probs = _masked_log_softmax(logits / temperature, old)
  old_log_probs = _masked_log_softmax(jax.lax.stop_gradient(old_logits) / temperature, old)
  rows = -jnp.sum(jnp.where(old, jnp.exp(old_log_probs) * log_probs, 0.0), axis=-1)
  return masked_mean(fn, rows, mask)


def bias_corrected_logits(logits: jax.Array, alpha: jax.Array, beta: jax.Array,
                          classes_per_task: int) -> jax.Array:
  """BiC's bias correction [BiC, bias correction layer]: alpha_s * o + beta_s on task s's logits.

  `logits` (..., C), `alpha` and `beta` (T,) one pair per task (C = T * k,
  k = `classes_per_task`); a task whose pair is (1, 0) is left unchanged.
  """
  width = logits.shape[-1]
  if classes_per_task < 1 or width != alpha.shape[-1] * classes_per_task:
    raise ValueError(f"bias_corrected_logits: `alpha` must hold one entry per task "
                     f"({width} classes / classes_per_task {classes_per_task}), got "
                     f"{alpha.shape}.")
  group = jnp.arange(width) // classes_per_task
  shape = (1,) * (logits.ndim - 1) + (width,)
  return logits * alpha[group].reshape(shape) + beta[group].reshape(shape)


__all__ = ["DISTILLATION_TEMPERATURE", "bias_corrected_logits", "bic_distillation_loss",
           "old_class_distillation_loss", "separated_softmax_cross_entropy",
           "task_wise_distillation_loss"]


def _safe_norm(x: jax.Array) -> jax.Array:
  """||x||_2 over the last axis with a zero (not NaN) gradient at x = 0."""
  squared = jnp.sum(jnp.square(x), axis=-1)
  positive = squared > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def _l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||_2, eps) over the last axis (PyTorch's F.normalize), NaN-free at 0."""
  return x / jnp.maximum(_safe_norm(x), eps)[..., None]


def pod_spatial_embedding(feature_map: jax.Array) -> jax.Array:
  """PODNet's POD-spatial statistics of one (B, H, W, C) map: (B, (H + W) * C).

  The squared activations summed over the width (one value per row and
  channel, (B, H * C)) followed by those summed over the height (B, W * C),
  L2-normalised per example [PODNet, POD-spatial; as the PODNet code,
  the activations are squared first].
  """
  check_rank("pod_spatial_embedding", "feature_map", feature_map, 4,
             "(batch, height, width, channels)")
  squared = jnp.square(feature_map)
  batch = feature_map.shape[0]
  width_pooled = jnp.sum(squared, axis=2).reshape(batch, -1)    # (B, H * C)
  height_pooled = jnp.sum(squared, axis=1).reshape(batch, -1)   # (B, W * C)
  return _l2_normalize(jnp.concatenate([width_pooled, height_pooled], axis=-1))


@loss_function()
def pod_spatial_loss(*, feature_maps: tuple[jax.Array, ...],
                     old_feature_maps: tuple[jax.Array, ...],
                     mask: jax.Array | None = None) -> jax.Array:
  """PODNet's POD-spatial distillation L_POD-spatial [PODNet, POD-spatial].

  For every stage l of the backbone: the Euclidean distance between the old
  and the current model's `pod_spatial_embedding` (width- and height-pooled
  squared activations, L2-normalised), averaged over the (valid) examples;
  the mean over the L stages.

  Args:
    feature_maps: L arrays (B, H_l, W_l, C_l), the current model's stage
      outputs.
    old_feature_maps: the old model's, same shapes.
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "pod_spatial_loss"
  if len(feature_maps) != len(old_feature_maps) or not feature_maps:
    raise ValueError(f"{fn}: `feature_maps` and `old_feature_maps` must hold the same number "
                     f"(>= 1) of stages, got {len(feature_maps)} and {len(old_feature_maps)}.")
  total = 0.0
  for new, old in zip(feature_maps, old_feature_maps):
    if new.shape != old.shape:
      raise ValueError(f"{fn}: a stage of `old_feature_maps` has shape {old.shape}, the "
                       f"current one {new.shape}; they must match.")
    distance = _safe_norm(pod_spatial_embedding(new) - pod_spatial_embedding(old))
    total = total + masked_mean(fn, distance, mask)
  return total / len(feature_maps)


@loss_function()
def pod_flat_loss(*, features: jax.Array, old_features: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
  """PODNet's POD-flat distillation of the final embedding [PODNet, POD-flat].

  1 - cos(h_old, h) per example, averaged over the (valid) examples: the
  form of the PODNet code (`embeddings_similarity`, PyTorch's
  `cosine_embedding_loss` with target 1; cosine with a 1e-12 floor on the
  norms).

  Args:
    features: (B, D) the current model's embedding.
    old_features: (B, D) the old model's.
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "pod_flat_loss"
  check_rank(fn, "features", features, 2, "(batch, dim)")
  if old_features.shape != features.shape:
    raise ValueError(f"{fn}: `old_features` must have the shape of `features` "
                     f"{features.shape}, got {old_features.shape}.")
  cosine = jnp.sum(_l2_normalize(features) * _l2_normalize(old_features), axis=-1)
  return masked_mean(fn, 1.0 - cosine, mask)


def local_similarity_scores(*, features: jax.Array, proxies: jax.Array) -> jax.Array:
  """PODNet's local similarity classifier (LSC) [PODNet, LSC]: (B, C) class similarities.

  With s_{c,k} = cos(theta_{c,k}, h) for the K proxies theta_{c,k} of class c
  (`proxies` (C, K, D)), the class similarity is sum_k softmax_k(s_{c,.})_k
  s_{c,k} (a softmax over the proxies of one class, temperature 1 as the
  PODNet code's `merging="softmax"`, gamma 1). Values in [-1, 1]; the
  learned scale eta multiplies them in `nca_loss`.

  Args:
    features: (B, D) embeddings h.
    proxies: (C, K, D) proxies.
  """
  check_rank("local_similarity_scores", "features", features, 2, "(batch, dim)")
  check_rank("local_similarity_scores", "proxies", proxies, 3, "(classes, proxies, dim)")
  similarities = jnp.einsum("bd,ckd->bck", _l2_normalize(features), _l2_normalize(proxies))
  attention = jax.nn.softmax(similarities, axis=-1)
  return jnp.sum(attention * similarities, axis=-1)


@loss_function(nonnegative=("margin",))
def nca_loss(*, similarities: jax.Array, labels: jax.Array, scale: jax.Array | float,
             margin: float, num_seen_classes: int | jax.Array,
             mask: jax.Array | None = None) -> jax.Array:
  """PODNet's NCA loss with margin [PODNet, NCA loss].

  [ -log( exp(eta (y_hat_y - delta)) / sum_{i != y} exp(eta y_hat_i) ) ]_+
  per example, i over the seen classes [0, C_seen) other than the label,
  averaged over the (valid) examples. The margin delta acts on the true
  class only (the paper's equation; the PODNet code subtracts it from every
  similarity, where it cancels). With a single seen class the denominator is
  empty and the loss 0.

  The value is the paper's; the gradient with respect to eta leaves out the
  margin term (eta delta is differentiated with eta held fixed). With it, a
  learned eta is pushed down by delta while the classes are not yet
  separated and crosses 0, where the hinge is met by anti-aligned features
  (measured on cifar100_podnet_fl_quick: eta fell to -4.9 and every task
  ended at chance accuracy); the code's cancelling margin leaves eta the
  same margin-free gradient.

  Args:
    similarities: (B, C) class similarities y_hat (`local_similarity_scores`).
    labels: (B,) integer labels in [0, C_seen).
    scale: eta, the learned scale (a scalar, possibly traced).
    margin: delta >= 0 (PODNet on CIFAR-100: 0.6).
    num_seen_classes: C_seen (may be traced).
    mask: optional (B,) validity mask.

  Returns:
    Scalar loss.
  """
  fn = "nca_loss"
  check_rank(fn, "similarities", similarities, 2, "(batch, num_classes)")
  check_labels(fn, labels, similarities.shape[0])
  columns = jnp.arange(similarities.shape[-1])[None, :]
  onehot = columns == labels[:, None]
  others = (columns < num_seen_classes) & ~onehot
  z = scale * similarities
  # The margin does not train the scale (module docstring of `nca_loss`).
  positive = (jnp.sum(jnp.where(onehot, z, 0.0), axis=-1)
              - jax.lax.stop_gradient(scale) * margin)
  any_other = jnp.any(others, axis=-1)
  peak = jnp.max(jnp.where(others, z, -jnp.inf), axis=-1)
  peak = jnp.where(any_other, peak, 0.0)
  shifted = jnp.where(others, z - peak[:, None], 0.0)   # no overflow outside `others`
  total = jnp.sum(jnp.where(others, jnp.exp(shifted), 0.0), axis=-1)
  log_denominator = peak + jnp.log(jnp.where(any_other, total, 1.0))
  losses = jnp.where(any_other, jnp.maximum(log_denominator - positive, 0.0), 0.0)
  return masked_mean(fn, losses, mask)

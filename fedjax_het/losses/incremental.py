"""Class-incremental baselines' losses (GLFC Table 1): iCaRL's KD, SS-IL, BiC.

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

References:
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017.
  [SS-IL] H. Ahn, J. Kwak, S. Lim, H. Bang, H. Kim, T. Moon. SS-IL: Separated
    Softmax for Incremental Learning. ICCV 2021.
  [BiC] Y. Wu, Y. Chen, L. Wang, Y. Ye, Z. Liu, Y. Guo, Y. Fu. Large Scale
    Incremental Learning. CVPR 2019.
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

"""Class masks for class-incremental learning with a fixed-size classifier.

GLFC's model grows its head by k outputs per task [GLFC Sec. 5; the authors'
code `Incremental_learning`]. A jitted round cannot change shapes without
recompiling, so here the classifier has all C outputs from the start and a
boolean class mask hides the classes not seen yet: after task t the seen
classes are the prefix [0, (t + 1) * k) of the class-order indices
(`fedjax_het.data.incremental`). `num_seen` is an ordinary (possibly traced)
integer, so one compiled function serves every task.

  * `seen_class_mask(num_seen, num_classes)`: (C,) bool, True on [0, num_seen).
  * `mask_logits(logits, class_mask)`: unseen logits replaced by
    `unseen_logit(dtype)` (-1e9 in float32/bfloat16/float64), so softmax and
    sigmoid give them probability exactly 0 and argmax never picks them
    (unless a seen logit is itself <= -1e9). The value is finite on purpose:
    with -inf, `0 * -inf` = NaN appears in BCE's `z * y` and in the
    `p * log p` terms of distillation even where the weight is 0, a row with
    every class masked gives a NaN softmax, and the NaN poisons sums and
    gradients; `finfo.min` would overflow to -inf under a temperature (z / T
    with T < 1) or when two masked logits are added. Gradients w.r.t. the
    masked entries are exactly 0 (`jnp.where`).
  * `masked_sigmoid_bce(*, logits, targets, class_mask, mask=None)`: GLFC's
    sigmoid binary cross-entropy over the seen columns only (the code applies
    BCE to the outputs of the current, grown head, i.e. to the seen classes):
    per row the mean over seen columns, then the mean over valid rows.
    Unseen columns contribute neither value nor gradient, whatever their
    logits or targets (even inf or NaN).
  * `masked_predictions`, `masked_accuracy`, `masked_class_counts`: top-1
    predictions restricted to the seen classes (-inf fill inside argmax, so
    an unseen class is unreachable for any seen logits), accuracy over valid
    examples, and per-class (correct, total) counts for
    `fedjax_het.cil.metrics.accuracy_matrix`.

Conventions follow `fedjax_het.losses`: the loss is keyword-only, jitted, and
its `mask` is a (B,) validity mask or weights (padded rows get 0; an all-zero
mask gives 0). With `class_mask` all True, `masked_sigmoid_bce` equals
`fedjax_het.losses.sigmoid_binary_cross_entropy`. Class masks may be (C,)
(shared by the batch) or (B, C) (per example; broadcast explicitly, so this
works under jax_numpy_rank_promotion="raise").

References:
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.losses._core import (check_labels, check_rank, check_same_shape, loss_function,
                                     masked_mean, sigmoid_binary_cross_entropy_elementwise)

#: The fill value of masked logits in dtypes that can hold it (float32,
#: bfloat16, float64); float16 uses half its most negative finite value.
UNSEEN_LOGIT = -1e9


def unseen_logit(dtype) -> float:
  """The finite fill value of masked logits for a floating `dtype`."""
  return max(UNSEEN_LOGIT, 0.5 * float(jnp.finfo(dtype).min))


def _concrete_int(value) -> int | None:
  try:
    if np.ndim(value) != 0:
      return None
    return int(value)
  except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerIntegerConversionError):
    return None


def seen_class_mask(num_seen: int | jax.Array, num_classes: int) -> jax.Array:
  """(num_classes,) bool mask, True on the seen classes [0, num_seen).

  Args:
    num_seen: number of seen classes, a Python int or an integer scalar
      (possibly traced: changing it does not recompile a jitted caller).
      Checked to lie in [0, num_classes] when concrete.
    num_classes: C, a static Python int >= 1 (the classifier width).

  Returns:
    bool array (C,).
  """
  if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or (
      num_classes < 1):
    raise ValueError(f"seen_class_mask: `num_classes` must be a Python int >= 1 (static), got "
                     f"{num_classes!r}.")
  if jnp.ndim(num_seen) != 0 or not jnp.issubdtype(jnp.result_type(num_seen), jnp.integer):
    raise ValueError(f"seen_class_mask: `num_seen` must be an integer scalar, got "
                     f"{num_seen!r}.")
  concrete = _concrete_int(num_seen)
  if concrete is not None and not 0 <= concrete <= num_classes:
    raise ValueError(f"seen_class_mask: `num_seen` must lie in [0, {num_classes}], got "
                     f"{concrete}.")
  return jnp.arange(num_classes) < num_seen


def _broadcast_mask(fn: str, class_mask: jax.Array, logits: jax.Array) -> jax.Array:
  """`class_mask` (C,) or logits-shaped, as a bool array of logits' shape."""
  class_mask = jnp.asarray(class_mask)
  if class_mask.dtype != jnp.bool_:
    raise ValueError(f"{fn}: `class_mask` must be a boolean array, got dtype "
                     f"{class_mask.dtype}.")
  shape = jnp.shape(logits)
  if class_mask.shape not in (shape[-1:], shape):
    raise ValueError(f"{fn}: `class_mask` must have shape (num_classes,) = {shape[-1:]} or the "
                     f"logits' shape {shape}, got {class_mask.shape}.")
  return jnp.broadcast_to(class_mask, shape)


def _check_float(fn: str, logits: jax.Array) -> None:
  if not jnp.issubdtype(jnp.result_type(logits), jnp.floating):
    raise ValueError(f"{fn}: `logits` must be floating point, got dtype "
                     f"{jnp.result_type(logits)}.")


def mask_logits(logits: jax.Array, class_mask: jax.Array) -> jax.Array:
  """Replaces unseen-class logits by the finite `unseen_logit(dtype)`.

  Args:
    logits: (..., C) floating logits.
    class_mask: (C,) or (..., C) bool, True on seen classes.

  Returns:
    Logits of the same shape and dtype; masked entries equal
    `unseen_logit(logits.dtype)` (-1e9 in float32) and have zero gradient.
  """
  fn = "mask_logits"
  _check_float(fn, logits)
  if jnp.ndim(logits) < 1:
    raise ValueError(f"{fn}: `logits` must have shape (..., num_classes), got a scalar.")
  m = _broadcast_mask(fn, class_mask, logits)
  fill = jnp.asarray(unseen_logit(jnp.result_type(logits)), jnp.result_type(logits))
  return jnp.where(m, logits, fill)


@loss_function()
def masked_sigmoid_bce(*, logits: jax.Array, targets: jax.Array, class_mask: jax.Array,
                       mask: jax.Array | None = None) -> jax.Array:
  """Sigmoid binary cross-entropy over the seen classes only (GLFC's classifier loss).

  Per element softplus(z) - z * y (exact for soft targets, finite for any
  finite z); per row the mean over the seen columns (rows with no seen class
  give 0); then the mean over the valid rows. With the seen classes the
  prefix [0, s), this is BCE on `logits[:, :s]`, what the GLFC code computes
  on its grown head [GLFC Eq. 4-5, code: `binary_cross_entropy_with_logits`
  on the current outputs].

  Args:
    logits: (B, C).
    targets: (B, C) in [0, 1]; unseen columns are ignored.
    class_mask: (C,) or (B, C) bool, True on seen classes.
    mask: optional (B,) validity mask or weights (see `losses.masked_mean`).

  Returns:
    Scalar loss; exactly zero gradient w.r.t. unseen logits and targets.
  """
  fn = "masked_sigmoid_bce"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "targets"), (logits, targets))
  _check_float(fn, logits)
  m = _broadcast_mask(fn, class_mask, logits)
  # Inputs are selected first so that an inf/NaN in an unseen column never
  # reaches the arithmetic (and its gradient is exactly 0).
  z = jnp.where(m, logits, 0)
  y = jnp.where(m, targets, 0)
  elementwise = jnp.where(m, sigmoid_binary_cross_entropy_elementwise(z, y), 0)
  count = jnp.sum(m, axis=-1).astype(elementwise.dtype)
  rows = jnp.sum(elementwise, axis=-1) / jnp.maximum(count, 1)
  return masked_mean(fn, rows, mask)


def masked_predictions(logits: jax.Array, class_mask: jax.Array) -> jax.Array:
  """(...,) int32 argmax over the seen classes only.

  Unseen entries are replaced by -inf before the argmax (no gradient flows
  through an argmax), so an unseen class is never predicted, whatever the
  seen logits (and even if unseen logits are NaN). With no seen class at all
  the result is 0.
  """
  fn = "masked_predictions"
  _check_float(fn, logits)
  m = _broadcast_mask(fn, class_mask, logits)
  return jnp.argmax(jnp.where(m, logits, -jnp.inf), axis=-1).astype(jnp.int32)


def _valid_weights(fn: str, valid: jax.Array | None, batch: int, dtype) -> jax.Array:
  if valid is None:
    return jnp.ones((batch,), dtype)
  if jnp.shape(valid) != (batch,):
    raise ValueError(f"{fn}: `valid` must have shape (batch,) = ({batch},), got "
                     f"{jnp.shape(valid)}.")
  return jnp.asarray(valid).astype(dtype)


def masked_accuracy(logits: jax.Array, labels: jax.Array, class_mask: jax.Array,
                    valid: jax.Array | None = None) -> jax.Array:
  """Top-1 accuracy with predictions restricted to the seen classes.

  The mean of `masked_predictions(logits, class_mask) == labels` over the
  examples where `valid` is set (None: all). An example whose label is an
  unseen class counts as wrong: for the paper's metric (accuracy on the test
  examples of all seen classes) pass `valid = class_mask[labels]` (or the
  stream's `TaskArrays.test_valid`). An all-false `valid` gives 0.

  Args:
    logits: (B, C).
    labels: (B,) integer class indices.
    class_mask: (C,) or (B, C) bool.
    valid: optional (B,) bool (or non-negative weights).

  Returns:
    float32 scalar in [0, 1].
  """
  fn = "masked_accuracy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  correct = (masked_predictions(logits, class_mask) == labels).astype(jnp.float32)
  weights = _valid_weights(fn, valid, logits.shape[0], jnp.float32)
  total = jnp.sum(weights)
  return jnp.sum(weights * correct) / jnp.where(total > 0, total, 1.0)


def masked_class_counts(logits: jax.Array, labels: jax.Array, class_mask: jax.Array,
                        valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Per-class (correct, total) counts of masked top-1 predictions.

  Sum them over test batches (fixed shapes: a scan or a loop of one jitted
  call) and pass them, one row per task, to `metrics.accuracy_matrix`.

  Args:
    logits: (B, C).
    labels: (B,) integer class indices in [0, C).
    class_mask: (C,) or (B, C) bool.
    valid: optional (B,) bool; padded rows get False.

  Returns:
    (correct, total): int32 (C,) each; total[c] counts the valid examples of
    true class c, correct[c] those predicted as c.
  """
  fn = "masked_class_counts"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  if valid is not None and jnp.asarray(valid).dtype != jnp.bool_:
    raise ValueError(f"{fn}: `valid` must be a boolean (batch,) mask, got dtype "
                     f"{jnp.asarray(valid).dtype}.")
  weights = _valid_weights(fn, valid, logits.shape[0], jnp.int32)
  one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.int32) * weights[:, None]
  hit = (masked_predictions(logits, class_mask) == labels).astype(jnp.int32)
  return jnp.sum(one_hot * hit[:, None], axis=0), jnp.sum(one_hot, axis=0)

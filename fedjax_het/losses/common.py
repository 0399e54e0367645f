"""Supervised losses shared by every method (the CE of FCCL+ Eq. 9, GLFC's BCE)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (check_labels, check_rank, check_same_shape, loss_function,
                                     masked_mean, sigmoid_binary_cross_entropy_elementwise)


def _softmax_cross_entropy_rows(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example -log softmax(logits)[label], shape (batch,)."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]


@loss_function()
def softmax_cross_entropy(*, logits: jax.Array, labels: jax.Array,
                          mask: jax.Array | None = None) -> jax.Array:
  """Cross-entropy with integer labels, batch mean (FCCL+ Eq. 9, FCCL Eq. 3).

  Args:
    logits: (B, C).
    labels: (B,) integer class indices in [0, C).
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar mean of -log softmax(logits)[label].
  """
  fn = "softmax_cross_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  return masked_mean(fn, _softmax_cross_entropy_rows(logits, labels), mask)


@loss_function()
def sigmoid_binary_cross_entropy(*, logits: jax.Array, targets: jax.Array,
                                 mask: jax.Array | None = None) -> jax.Array:
  """Binary cross-entropy with logits, mean over all elements.

  `softplus(z) - z * y`, exact for soft targets y in [0, 1] and finite for any
  finite z (torch `binary_cross_entropy_with_logits`, reduction 'mean').

  Args:
    logits: (B, C).
    targets: (B, C) in [0, 1].
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "sigmoid_binary_cross_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "targets"), (logits, targets))
  rows = jnp.mean(sigmoid_binary_cross_entropy_elementwise(logits, targets), axis=-1)
  return masked_mean(fn, rows, mask)

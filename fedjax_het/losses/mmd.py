"""FedMMD losses: the two-stream constraint between global and local outputs.

  * `gaussian_kernel_matrix`: the multi-kernel Gaussian (RBF) kernel.
  * `multi_kernel_mmd_squared`: squared MK-MMD, FedMMD Eq. 1-2, 5 (biased
    estimator, clipped at 0, or floored at 1e-4 as the authors' code does).
  * `two_stream_l2_loss`: the L2 alternative the authors' code switched to,
    with TensorFlow's `tf.nn.l2_loss` reduction (half the squared sum).

The FedMMD local objective is CE + lambda * MMD^2(theta_G(X), theta_L(X))
(Eq. 3-5), lambda = 0.1; `fedjax_het.algorithms.fedmmd` trains it.

Reference:
  [FedMMD] X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun. Federated Learning
    with Additional Mechanisms on Clients to Reduce Communication Costs
    (FedMMD and FedFusion).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import check_rank, check_same_shape, loss_function, masked_mean

#: The 19 Gaussian bandwidths (as variances) of the authors' code.
MMD_BANDWIDTHS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 5.0, 10.0, 15.0, 20.0, 25.0,
                  30.0, 35.0, 100.0, 1e3, 1e4, 1e5, 1e6)


def _kernel(x: jax.Array, y: jax.Array, bandwidths: jax.Array) -> jax.Array:
  # Differences rather than |x|^2 + |y|^2 - 2 x.y: exact zeros on identical rows
  # (the cancellation form loses them for large activations). Memory O(N M d).
  squared_distance = jnp.sum(jnp.square(x[:, None, :] - y[None, :, :]), axis=-1)
  betas = 1.0 / (2.0 * bandwidths)
  return jnp.sum(jnp.exp(-betas[:, None, None] * squared_distance[None, :, :]), axis=0)


def _check_bandwidths(fn: str, bandwidths: Sequence[float] | jax.Array) -> jax.Array:
  values = jnp.asarray(bandwidths, dtype=jnp.float32)
  if values.ndim != 1 or values.shape[0] == 0:
    raise ValueError(f"{fn}: `bandwidths` must be a non-empty 1-D sequence, got "
                     f"shape {values.shape}.")
  return values


def _check_samples(fn: str, x: jax.Array, y: jax.Array) -> None:
  check_rank(fn, "x", x, 2, "(num_samples, dim)")
  check_rank(fn, "y", y, 2, "(num_samples, dim)")
  if x.shape[-1] != y.shape[-1]:
    raise ValueError(f"{fn}: `x` and `y` must share the last dimension, got {x.shape} "
                     f"and {y.shape}.")


@loss_function()
def gaussian_kernel_matrix(*, x: jax.Array, y: jax.Array,
                           bandwidths: Sequence[float] | jax.Array = MMD_BANDWIDTHS) -> jax.Array:
  """Multi-kernel Gaussian kernel, K[i, j] = sum_s exp(-|x_i - y_j|^2 / (2 s)).

  The bandwidths s are variances, and the kernels are summed, not averaged
  (the domain-separation-networks MMD code FedMMD follows).

  Args:
    x: (N, d).
    y: (M, d).
    bandwidths: 1-D sequence of variances (default: the 19 of
      the authors' code). Must be positive.

  Returns:
    (N, M) kernel matrix.
  """
  fn = "gaussian_kernel_matrix"
  _check_samples(fn, x, y)
  return _kernel(x, y, _check_bandwidths(fn, bandwidths))


#: The authors' code floors MMD^2 at this value (`tf.maximum(1e-4, mmd)` of the
#: domain-separation-networks loss it follows); below it the loss has no gradient.
MMD_CODE_FLOOR = 1e-4


@loss_function(nonnegative=("floor",))
def multi_kernel_mmd_squared(*, x: jax.Array, y: jax.Array,
                             bandwidths: Sequence[float] | jax.Array = MMD_BANDWIDTHS,
                             floor: float = 0.0,
                             mask: jax.Array | None = None) -> jax.Array:
  """Squared multi-kernel MMD, FedMMD Eq. 2 (and Eq. 5 without lambda).

  MMD^2 = mean K(x, x) + mean K(y, y) - 2 mean K(x, y): the biased V-statistic
  (diagonals included), then max(MMD^2, floor). It is 0 (floor) for identical
  samples and grows as the distributions move apart. `floor=0` clips the
  estimator at 0 (the paper's MMD^2 >= 0); the authors' code floors it at
  `MMD_CODE_FLOOR` = 1e-4, which also zeroes the gradient once the two
  streams agree that closely.

  Args:
    x: (N, d), e.g. the frozen global model's outputs on a batch.
    y: (M, d), e.g. the local model's outputs on the same batch.
    bandwidths: kernel variances (default: the 19 of the authors' code).
    mask: optional (N,) validity mask when x and y are two views of the same
      (padded) batch (requires N == M): the estimate uses the valid rows only.

  Returns:
    Scalar MMD^2 >= 0.
  """
  fn = "multi_kernel_mmd_squared"
  _check_samples(fn, x, y)
  b = _check_bandwidths(fn, bandwidths)
  if mask is None:
    value = (jnp.mean(_kernel(x, x, b)) + jnp.mean(_kernel(y, y, b))
             - 2.0 * jnp.mean(_kernel(x, y, b)))
  else:
    if x.shape[0] != y.shape[0] or jnp.shape(mask) != (x.shape[0],):
      raise ValueError(f"{fn}: `mask` needs x and y of equal length and shape ({x.shape[0]},), "
                       f"got x {x.shape}, y {y.shape}, mask {jnp.shape(mask)}.")
    w = jnp.asarray(mask).astype(x.dtype)
    pair = w[:, None] * w[None, :]
    total = jnp.sum(pair)
    total = jnp.where(total > 0, total, 1.0)
    value = jnp.sum(pair * (_kernel(x, x, b) + _kernel(y, y, b) - 2.0 * _kernel(x, y, b))) / total
  return jnp.maximum(value, jnp.asarray(floor, value.dtype))


#: Reductions of `two_stream_l2_loss`.
L2_REDUCTIONS = ("tf_l2_loss", "batch_mean")


@loss_function(static_argnames=("reduction",))
def two_stream_l2_loss(*, local_outputs: jax.Array, global_outputs: jax.Array,
                       reduction: str = "tf_l2_loss",
                       mask: jax.Array | None = None) -> jax.Array:
  """L2 two-stream constraint between the local and the frozen global outputs.

  The FedMMD authors' final code replaced MMD by an L2 penalty between the two
  streams' logits, `0.001 * tf.nn.l2_loss(local - global)` on MNIST (0.01 on
  CIFAR-10). `tf.nn.l2_loss(t)` is sum(t ** 2) / 2 over every element, batch
  included, so:

    * "tf_l2_loss" (default): 0.5 * sum_b sum_d (local_bd - global_bd)^2, the
      code's reduction, with which the paper's lambda values transfer (the
      penalty grows with the batch size);
    * "batch_mean": mean_b sum_d (local_bd - global_bd)^2, independent of the
      batch size (2 / B times "tf_l2_loss").

  The global stream is frozen: `global_outputs` gets no gradient.

  Args:
    local_outputs: (B, d).
    global_outputs: (B, d).
    reduction: one of `L2_REDUCTIONS`.
    mask: optional (B,) validity mask or weights; padded rows get 0 ("tf_l2_loss"
      sums the valid rows, "batch_mean" averages them).

  Returns:
    Scalar loss.
  """
  fn = "two_stream_l2_loss"
  check_rank(fn, "local_outputs", local_outputs, 2, "(batch, dim)")
  check_same_shape(fn, ("local_outputs", "global_outputs"), (local_outputs, global_outputs))
  if reduction not in L2_REDUCTIONS:
    raise ValueError(f"{fn}: `reduction` must be one of {L2_REDUCTIONS}, got {reduction!r}.")
  difference = local_outputs - jax.lax.stop_gradient(global_outputs)
  per_example = jnp.sum(jnp.square(difference), axis=-1)
  if reduction == "batch_mean":
    return masked_mean(fn, per_example, mask)
  if mask is None:
    return 0.5 * jnp.sum(per_example)
  if jnp.shape(mask) != per_example.shape:
    raise ValueError(f"{fn}: `mask` must have shape (batch,) = {per_example.shape}, got "
                     f"{jnp.shape(mask)}.")
  return 0.5 * jnp.sum(jnp.asarray(mask).astype(per_example.dtype) * per_example)

"""Elastic weight consolidation (EWC, Kirkpatrick et al., PNAS 2017): Fisher diagonal, penalty.

EWC keeps the parameters that mattered to an earlier model theta* close to it:

    L(theta) = L_task(theta) + sum_i (lambda / 2) F_i (theta_i - theta*_i)^2     (EWC Eq. 3)

with F the diagonal of the Fisher information of theta*,

    F_i = E_x E_{y ~ p(y|x; theta*)} [(d log p(y|x; theta) / d theta_i)^2] at theta = theta*,

estimated on N examples as the mean of squared per-example gradients of the log-likelihood.
FCCL+ (TPAMI) Table XVI puts this penalty in place of FNTD in the local updating phase
(`algorithms/fcclplus.py`, `fcclplus.local_distillation="ewc"`).

  * `fisher_diagonal`: the mean over valid examples of the squared per-example gradient of
    log p(y_n | x_n; theta) at `params`, y_n either given (`labels`: the "empirical Fisher")
    or drawn from the model's own predictive distribution (`key`: one label per example,
    `sample_labels`; a one-sample Monte-Carlo estimate of the Fisher information EWC
    defines, Kirkpatrick et al. 2017 Sec. 2 and Supplementary; Kunstner, Hennig, Balles,
    "Limitations of the empirical Fisher approximation", NeurIPS 2019, for why the two
    differ).
  * `sample_labels`: the labels `fisher_diagonal(key=...)` draws.
  * `ewc_penalty`: (lambda / 2) sum_i F_i (theta_i - theta*_i)^2 over every leaf.

Both functions take keyword arguments only; the anchor and the Fisher are constants
(`stop_gradient`). They work under `jax.jit` and `jax.vmap` over a leading client axis.

Reference: J. Kirkpatrick, R. Pascanu, N. Rabinowitz, J. Veness, G. Desjardins, A. A. Rusu,
K. Milan, J. Quan, T. Ramalho, A. Grabska-Barwinska, et al. Overcoming catastrophic
forgetting in neural networks. PNAS 114(13):3521-3526, 2017.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import check_same_structure, loss_function

#: Examples per vmapped chunk of `fisher_diagonal` (the per-example gradients of a chunk are
#: held at once: chunk_size times the parameter count).
FISHER_CHUNK_SIZE = 32


def _example_label(logits: jax.Array, key: jax.Array, row: jax.Array) -> jax.Array:
  return jax.random.categorical(jax.random.fold_in(key, row), logits)


def sample_labels(*, logits: jax.Array, key: jax.Array) -> jax.Array:
  """One label per row drawn from softmax(logits): y_n ~ Categorical(softmax(logits_n)).

  Row n draws with `jax.random.fold_in(key, n)`, so a row's label does not depend on the
  other rows or on how `fisher_diagonal` chunks them.

  Args:
    logits: (B, C).
    key: PRNG key.

  Returns:
    (B,) int32 labels.
  """
  if jnp.ndim(logits) != 2:
    raise ValueError(f"sample_labels: `logits` must have shape (batch, num_classes) "
                     f"(rank 2), got shape {jnp.shape(logits)}.")
  rows = jnp.arange(logits.shape[0])
  return jax.vmap(_example_label, in_axes=(0, None, 0))(logits, key, rows).astype(jnp.int32)


def fisher_diagonal(*, logits_fn: Callable[[Any, jax.Array], jax.Array], params: Any,
                    inputs: jax.Array, labels: jax.Array | None = None,
                    key: jax.Array | None = None, mask: jax.Array | None = None,
                    chunk_size: int = FISHER_CHUNK_SIZE) -> Any:
  """Diagonal Fisher of the model at `params`: mean over examples of squared log-lik gradients.

  F = 1/n sum_{n valid} (grad_theta log softmax(logits_fn(theta, x_n))[y_n])^2 at
  theta = `params` (EWC Eq. 3's F, estimated per example).

  Args:
    logits_fn: (params, x) -> (C,) logits of ONE example x (no batch axis); the model in the
      mode the Fisher is taken in (deterministic: eval mode).
    params: the parameter pytree theta* the gradients are taken at.
    inputs: (N, ...) examples.
    labels: (N,) int class indices (the empirical Fisher). Exactly one of `labels`, `key`.
    key: PRNG key: y_n drawn from the model's softmax at theta* (`sample_labels`: row n
      uses fold_in(key, n)).
    mask: optional (N,) bool (or 0/1) of the valid rows (padding rows add nothing); None:
      every row.
    chunk_size: examples whose per-example gradients are computed at once (vmapped); the
      rows run in chunks under `lax.scan`, the last chunk padded and masked.

  Returns:
    A pytree like `params` of non-negative values: the Fisher diagonal (0 everywhere when no
    row is valid).
  """
  if (labels is None) == (key is None):
    raise ValueError("fisher_diagonal: pass exactly one of `labels` (the empirical Fisher) and "
                     "`key` (labels drawn from the model).")
  n = jnp.shape(inputs)[0]
  if labels is not None and jnp.shape(labels) != (n,):
    raise ValueError(f"fisher_diagonal: `labels` must have shape (N,) = ({n},), got "
                     f"{jnp.shape(labels)}.")
  if mask is not None and jnp.shape(mask) != (n,):
    raise ValueError(f"fisher_diagonal: `mask` must have shape (N,) = ({n},), got "
                     f"{jnp.shape(mask)}.")
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"fisher_diagonal: `chunk_size` must be an int >= 1, got {chunk_size!r}.")
  params = jax.lax.stop_gradient(params)
  weights = (jnp.ones((n,), jnp.float32) if mask is None
             else jnp.asarray(mask).astype(jnp.float32))
  chunk = min(chunk_size, max(n, 1))
  chunks = -(-n // chunk)
  pad = chunks * chunk - n
  rows = jnp.arange(chunks * chunk).reshape(chunks, chunk)
  padded = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(  # noqa: E731
      (chunks, chunk) + a.shape[1:])
  xs = {"inputs": padded(jnp.asarray(inputs)), "weights": padded(weights), "rows": rows}
  if labels is not None:
    xs["labels"] = padded(jnp.asarray(labels, jnp.int32))

  def log_likelihood(theta, x, label, row):
    logits = logits_fn(theta, x)
    if label is None:
      label = _example_label(jax.lax.stop_gradient(logits), key, row)
    return jax.nn.log_softmax(logits)[label]

  def example_square(x, label, row, weight):
    grad = jax.grad(log_likelihood)(params, x, label, row)
    return jax.tree_util.tree_map(lambda g: weight * jnp.square(g), grad)

  def step(total, batch):
    labels_in = batch.get("labels")
    squares = jax.vmap(example_square, in_axes=(0, None if labels_in is None else 0, 0, 0))(
        batch["inputs"], labels_in, batch["rows"], batch["weights"])
    return jax.tree_util.tree_map(lambda t, s: t + jnp.sum(s, axis=0), total, squares), None

  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  total, _ = jax.lax.scan(step, zeros, xs)
  count = jnp.sum(weights)
  return jax.tree_util.tree_map(lambda t: t / jnp.where(count > 0, count, 1.0), total)


@loss_function(nonnegative=("weight",))
def ewc_penalty(*, params: Any, anchor_params: Any, fisher: Any,
                weight: float = 1.0) -> jax.Array:
  """EWC's penalty, (weight / 2) sum_i F_i (theta_i - theta*_i)^2 (EWC Eq. 3).

  Args:
    params: the trained parameters theta (any pytree).
    anchor_params: theta*, the same structure and shapes (stop-gradient).
    fisher: F, the same structure and shapes (`fisher_diagonal`; stop-gradient).
    weight: lambda >= 0.

  Returns:
    Scalar penalty; its gradient is weight * F * (theta - theta*).
  """
  fn = "ewc_penalty"
  check_same_structure(fn, ("params", "anchor_params"), (params, anchor_params))
  check_same_structure(fn, ("params", "fisher"), (params, fisher))
  anchor = jax.lax.stop_gradient(anchor_params)
  fisher = jax.lax.stop_gradient(fisher)
  terms = jax.tree_util.tree_map(lambda p, a, f: jnp.sum(f * jnp.square(p - a)),
                                 params, anchor, fisher)
  return 0.5 * weight * sum(jax.tree_util.tree_leaves(terms), jnp.zeros((), jnp.float32))

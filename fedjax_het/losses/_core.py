"""Shared machinery of the loss library.

* `loss_function`: the decorator every public loss wears. It jit-compiles the
  function (so `from fedjax_het.losses import ...` gives jitted callables that
  also trace cleanly inside a caller's own `jit`/`vmap`/`scan`), insists on
  keyword arguments, and checks numeric hyper-parameters whenever they are
  concrete Python/NumPy numbers (traced values, e.g. a per-round schedule inside
  the engine's jit, pass through unchecked).
* Shape checks with errors that name the function, the argument and the shape
  that was expected.
* Numerically stable primitives shared by several papers: row-wise KL between
  two sets of logits, sigmoid binary cross-entropy, L2 normalisation with an
  epsilon.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Precision of the small similarity matmuls (C x C, B x B). On TPU the default
# precision would run them in bfloat16 passes; these products are tiny, so the
# full-precision form costs nothing and keeps the losses faithful.
MATMUL_PRECISION = jax.lax.Precision.HIGHEST


def _concrete_scalar(value: Any) -> float | None:
  """Returns `value` as a float if it is a concrete scalar, else None."""
  if isinstance(value, bool):
    return float(value)
  try:
    if np.ndim(value) != 0:
      return None
    return float(value)
  except (TypeError, jax.errors.ConcretizationTypeError,
          jax.errors.TracerArrayConversionError):
    return None


_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "positive": (lambda v: v > 0, "> 0"),
    "nonnegative": (lambda v: v >= 0, ">= 0"),
    "unit_interval": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def loss_function(
    *,
    static_argnames: Sequence[str] = (),
    positive: Sequence[str] = (),
    nonnegative: Sequence[str] = (),
    unit_interval: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Decorates a keyword-only loss: jit-compiles it and validates arguments.

  Args:
    static_argnames: arguments that select a code path (bools, strings); they
      are static under `jax.jit`.
    positive, nonnegative, unit_interval: names of numeric hyper-parameters and
      the range they must lie in. Checked when the value is concrete.

  Returns:
    A decorator. The decorated function keeps its name and docstring and
    exposes the un-jitted original as `.raw` (useful for `jax.make_jaxpr`
    inspection or for composing inside custom transformations).
  """
  checks = [(name, kind) for kind, names in (("positive", positive),
                                             ("nonnegative", nonnegative),
                                             ("unit_interval", unit_interval))
            for name in names]

  def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
    jitted = jax.jit(fn, static_argnames=tuple(static_argnames))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      if args:
        raise TypeError(
            f"{fn.__name__}() takes keyword arguments only (got {len(args)} "
            f"positional); call it as {fn.__name__}(name=value, ...).")
      for name, kind in checks:
        if name not in kwargs:
          continue
        value = _concrete_scalar(kwargs[name])
        predicate, text = _RANGES[kind]
        if value is not None and not (math.isfinite(value) and predicate(value)):
          raise ValueError(
              f"{fn.__name__}: `{name}` must be finite and {text}, got "
              f"{kwargs[name]!r}.")
      return jitted(**kwargs)

    wrapper.raw = fn  # type: ignore[attr-defined]
    return wrapper

  return decorate


# ----------------------------------------------------------------------------
# Shape checks (run at trace time: shapes are static under jit).
# ----------------------------------------------------------------------------


def check_rank(fn: str, name: str, x: jax.Array, rank: int, layout: str) -> None:
  """Raises ValueError unless `x` has `rank` dimensions."""
  if jnp.ndim(x) != rank:
    raise ValueError(
        f"{fn}: `{name}` must have shape {layout} (rank {rank}), got shape "
        f"{jnp.shape(x)}.")


def check_same_shape(fn: str, names: Sequence[str], arrays: Sequence[jax.Array]) -> None:
  """Raises ValueError unless all arrays share one shape."""
  shapes = [jnp.shape(a) for a in arrays]
  if any(s != shapes[0] for s in shapes[1:]):
    listing = ", ".join(f"`{n}` {s}" for n, s in zip(names, shapes))
    raise ValueError(f"{fn}: arguments must have the same shape, got {listing}.")


def check_labels(fn: str, labels: jax.Array, batch_size: int, name: str = "labels") -> None:
  """Raises ValueError unless `labels` is an integer vector of `batch_size`."""
  if jnp.ndim(labels) != 1 or jnp.shape(labels)[0] != batch_size:
    raise ValueError(
        f"{fn}: `{name}` must have shape (batch,) = ({batch_size},), got "
        f"{jnp.shape(labels)}.")
  if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
    raise ValueError(
        f"{fn}: `{name}` must hold integer class indices, got dtype "
        f"{jnp.result_type(labels)}.")


def check_min_batch(fn: str, name: str, x: jax.Array, minimum: int, why: str) -> None:
  """Raises ValueError if the leading (batch) dimension is below `minimum`."""
  if jnp.shape(x)[0] < minimum:
    raise ValueError(
        f"{fn}: `{name}` needs a batch of at least {minimum} examples ({why}); "
        f"got batch size {jnp.shape(x)[0]}.")


def check_same_structure(fn: str, names: Sequence[str], trees: Sequence[Any]) -> None:
  """Raises ValueError unless the pytrees share structure and leaf shapes."""
  structures = [jax.tree_util.tree_structure(t) for t in trees]
  if any(s != structures[0] for s in structures[1:]):
    raise ValueError(
        f"{fn}: `{names[0]}` and `{names[1]}` must be pytrees of the same "
        f"structure, got {structures[0]} and {structures[1]}.")
  for i, (a, b) in enumerate(zip(jax.tree_util.tree_leaves(trees[0]),
                                 jax.tree_util.tree_leaves(trees[1]))):
    if jnp.shape(a) != jnp.shape(b):
      raise ValueError(
          f"{fn}: leaf {i} of `{names[0]}` has shape {jnp.shape(a)} but the "
          f"matching leaf of `{names[1]}` has shape {jnp.shape(b)}.")


# ----------------------------------------------------------------------------
# Stable primitives.
# ----------------------------------------------------------------------------


def kl_divergence_rows(target_logits: jax.Array, logits: jax.Array) -> jax.Array:
  """Per-row KL(softmax(target_logits) || softmax(logits)), shape (batch,).

  Computed from log-softmax on both sides, so it is finite for logits of any
  finite magnitude (an underflowed target probability contributes exactly 0).
  """
  target_log_probs = jax.nn.log_softmax(target_logits, axis=-1)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return jnp.sum(jnp.exp(target_log_probs) * (target_log_probs - log_probs), axis=-1)


def sigmoid_binary_cross_entropy_elementwise(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Elementwise BCE with logits, softplus(z) - z * y (targets may be soft)."""
  return jax.nn.softplus(logits) - logits * targets


def l2_normalize(x: jax.Array, eps: float, axis: int = -1) -> jax.Array:
  """x / sqrt(sum(x^2) + eps): finite value and gradient at x = 0."""
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + eps)


def masked_mean(fn: str, values: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Mean of per-example `values` (B,) over the examples where `mask` is set.

  `mask` is None (all examples), or a (B,) boolean or non-negative weight
  vector. Padding rows of a partial batch get 0, so a padded batch gives
  exactly the loss of its valid rows; an all-zero mask gives 0.
  """
  if mask is None:
    return jnp.mean(values)
  if jnp.shape(mask) != values.shape:
    raise ValueError(f"{fn}: `mask` must have shape (batch,) = {values.shape}, got "
                     f"{jnp.shape(mask)}.")
  weights = jnp.asarray(mask).astype(values.dtype)
  total = jnp.sum(weights)
  return jnp.sum(weights * values) / jnp.where(total > 0, total, 1.0)

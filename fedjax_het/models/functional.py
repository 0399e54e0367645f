"""Pure functional use of the zoo: init, apply, summary, classifier growth.

All functions take and return plain dicts {"params", "batch_stats"}, never
hide state, and work under `jax.jit`, `jax.vmap` (over keys / stacked
variables and images) and inside `jax.lax.scan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.models.layers import (Conv, torch_bias_init, torch_kernel_init,
                                      uniform_stream)
from fedjax_het.models.registry import get_model

Variables = dict[str, Any]

#: Shape of one input image batch used for initialisation and summaries.
DEFAULT_INPUT_SHAPE = (1, 32, 32, 3)


def _check_variables(fn: str, variables: Any) -> None:
  if not isinstance(variables, dict) or "params" not in variables:
    keys = list(variables) if isinstance(variables, dict) else type(variables).__name__
    raise ValueError(f"{fn}: `variables` must be a dict with 'params' and 'batch_stats' "
                     f"(from init_variables), got {keys}.")


def _init_impl(model: nn.Module, key: jax.Array, input_shape: tuple[int, ...]) -> Variables:
  dummy = jnp.zeros(input_shape, jnp.float32)

  def init(k):
    return model.init({"params": k}, dummy, train=False)

  with uniform_stream(None) as counter:
    jax.eval_shape(init, key)
  pool = jax.random.uniform(jax.random.fold_in(key, _POOL_STREAM), (counter.offset,))
  with uniform_stream(pool) as stream:
    variables = init(key)
  if stream.offset != counter.offset:
    raise RuntimeError("init_variables: the model drew a different number of random values "
                       "in its two initialisation passes.")
  return {"params": dict(variables["params"]),
          "batch_stats": dict(variables.get("batch_stats", {}))}


_init_jit = jax.jit(_init_impl, static_argnums=(0, 2))
_POOL_STREAM = 0x5EED


def init_variables(model: nn.Module, key: jax.Array, *,
                   input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE) -> Variables:
  """Initialises a model's parameters and BatchNorm statistics (eval mode).

  Distributions are PyTorch's defaults (see `layers`). All random parameters
  are slices of ONE `jax.random.uniform(fold_in(key, 0x5EED), (P,))` draw
  (`layers.uniform_stream`), which compiles in about a second even for
  GoogLeNet (one threefry kernel per leaf took 30+ s on CPU); the values thus
  differ from `model.init(key, ...)`, which draws leaf by leaf.

  Args:
    model: a zoo model (`get_model`).
    key: PRNG key (typed `jax.random.key` or raw uint32); vmap over a stack of
      keys to initialise a stack of clients. The function is jitted
      internally (cached per model), so eager calls are fast too.
    input_shape: (B, H, W, C) of the dummy input.

  Returns:
    {"params": ..., "batch_stats": ...} as plain dicts; "batch_stats" is {}
    for models without BatchNorm.
  """
  input_shape = tuple(int(d) for d in input_shape)
  if len(input_shape) != 4:
    raise ValueError(f"init_variables: `input_shape` must be (batch, height, width, "
                     f"channels), got {input_shape}.")
  return _maybe_jit(_init_jit, _init_impl, model, key, input_shape)


def apply_model(model: nn.Module, variables: Variables, images: jax.Array, *, train: bool,
                rng: jax.Array | None = None,
                mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array, Variables]:
  """Runs a model as a pure function.

  Args:
    model: a zoo model.
    variables: {"params", "batch_stats"} from `init_variables`.
    images: (B, 32, 32, 3) float32, normalised.
    train: True: BatchNorm uses batch statistics and its running statistics
      are updated (running = 0.9 running + 0.1 batch), dropout is active.
      False: running statistics, no dropout, nothing updated.
    rng: PRNG key of dropout (and drop-connect); required in train mode for
      models with dropout (`model.needs_dropout_rng`), ignored otherwise.
    mask: optional (B,) bool validity mask of a padded partial batch. In train
      mode every BatchNorm layer then computes its batch statistics (and its
      running-statistics update) over the valid rows only, so the valid rows'
      outputs equal those of the smaller unpadded batch PyTorch would use; the
      models take it as `model(images, train=..., mask=...)` and hand it to
      `layers.batch_norm`. Outputs of padded rows are still computed. Ignored
      in eval mode.

  Returns:
    (features (B, feature_dim), logits (B, num_classes), new_variables).
    In eval mode `new_variables` is `variables` itself; in train mode it is a
    new dict with the updated "batch_stats" (same pytree structure).
  """
  return _apply("apply_model", model, variables, images, train, rng, mask, with_trunk=False)


def apply_model_with_trunk(model: nn.Module, variables: Variables, images: jax.Array, *,
                           train: bool, rng: jax.Array | None = None,
                           mask: jax.Array | None = None
                           ) -> tuple[jax.Array, jax.Array, jax.Array, Variables]:
  """`apply_model` that also returns the trunk's feature map (B, h, w, c), float32.

  The feature map is the output of the model's `trunk` submodule (see `base`): what the
  tail pools or flattens, before the tail's fully connected layers and their dropout. It
  is captured from the same forward pass (Flax's `capture_intermediates`), so features,
  logits and the BatchNorm update are those of `apply_model` with the same arguments.

  Returns:
    (feature map, features, logits, new_variables), as `apply_model`.

  Raises:
    ValueError: a model without a `trunk` submodule (the zoo's `Classifier`s have one).
  """
  if not isinstance(getattr(model, "trunk", None), nn.Module):
    raise ValueError(f"apply_model_with_trunk: needs a model with a `trunk` submodule (the "
                     f"zoo's Classifier), got {type(model).__name__}.")
  features, logits, new_variables, feature_map = _apply(
      "apply_model_with_trunk", model, variables, images, train, rng, mask, with_trunk=True)
  return feature_map, features, logits, new_variables


def _apply(fn: str, model: nn.Module, variables: Variables, images: jax.Array, train: bool,
           rng: jax.Array | None, mask: jax.Array | None, *, with_trunk: bool) -> tuple:
  """(features, logits, new_variables[, trunk feature map]) of `apply_model` and
  `apply_model_with_trunk`, the jitted pass of the mode (cached per model)."""
  _check_variables(fn, variables)
  if not train:
    features, logits, *trunk = _maybe_jit(_apply_eval_jit, _apply_eval, model, variables,
                                          images, with_trunk)
    return (features, logits, variables, *trunk)
  if rng is None and getattr(model, "needs_dropout_rng", False):
    raise ValueError(f"{fn}: {type(model).__name__} uses dropout in train mode; pass "
                     f"`rng` (a PRNG key) when train=True.")
  features, logits, batch_stats, *trunk = _maybe_jit(_apply_train_jit, _apply_train, model,
                                                     variables, images, rng, mask, with_trunk)
  new_variables = dict(variables)
  new_variables["batch_stats"] = batch_stats
  return (features, logits, new_variables, *trunk)


def _in_compute_dtype(model, variables, images):
  """Parameters and images cast to the model's compute dtype (BatchNorm statistics are not).

  The cast is differentiable, so gradients reach the float32 parameters as float32.
  """
  dtype = jnp.dtype(getattr(model, "compute_dtype", "float32"))
  if dtype == jnp.float32:
    return variables, images
  cast = lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
  variables = dict(variables)
  variables["params"] = jax.tree_util.tree_map(cast, variables["params"])
  return variables, images.astype(dtype)


def _float32(*arrays):
  return tuple(a.astype(jnp.float32) for a in arrays)


def _is_trunk(module: nn.Module, method_name: str) -> bool:
  """Flax `capture_intermediates` filter: the call of the model's `trunk` submodule."""
  return method_name == "__call__" and module.scope.path == ("trunk",)


def _trunk_capture(with_trunk: bool) -> tuple[list[str], dict[str, Any]]:
  """(extra mutable collections, extra `apply` keywords) that capture the trunk's output."""
  return (["intermediates"], {"capture_intermediates": _is_trunk}) if with_trunk else ([], {})


def _trunk_output(updates: Any) -> tuple[jax.Array]:
  return _float32(updates["intermediates"]["trunk"]["__call__"][0])


def _apply_eval(model, variables, images, with_trunk=False):
  variables, images = _in_compute_dtype(model, variables, images)
  if not with_trunk:
    return _float32(*model.apply(variables, images, train=False))
  mutable, capture = _trunk_capture(with_trunk)
  outputs, updates = model.apply(variables, images, train=False, mutable=mutable, **capture)
  return _float32(*outputs) + _trunk_output(updates)


def _apply_train(model, variables, images, rng, mask, with_trunk=False):
  rngs = {} if rng is None else {"dropout": rng}
  kwargs = {} if mask is None else {"mask": mask}
  compute_variables, images = _in_compute_dtype(model, variables, images)
  mutable, capture = _trunk_capture(with_trunk)
  (features, logits), updates = model.apply(compute_variables, images, train=True, rngs=rngs,
                                            mutable=["batch_stats", *mutable], **capture,
                                            **kwargs)
  features, logits = _float32(features, logits)
  batch_stats = dict(updates.get("batch_stats", variables.get("batch_stats", {})))
  return (features, logits, batch_stats) + (_trunk_output(updates) if with_trunk else ())


# Jitted once per model and trunk flag (modules hash by their fields): fast eager calls; a
# no-op wrapper when called inside the caller's own jit/vmap/scan.
_apply_eval_jit = jax.jit(_apply_eval, static_argnums=(0, 3))
_apply_train_jit = jax.jit(_apply_train, static_argnums=(0, 5))


def _maybe_jit(jitted, plain, model, *args):
  """`jitted(model, *args)` (cached per model), or `plain` for unhashable modules."""
  try:
    hash(model)
  except TypeError:
    return plain(model, *args)
  return jitted(model, *args)


def count_parameters(tree: Any) -> int:
  """Number of scalars in a pytree of arrays or `ShapeDtypeStruct`s."""
  return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)))


def _analytic_macs(model: nn.Module, shapes: Variables, input_shape: Sequence[int]) -> int:
  """Multiply-accumulates of every Conv and Dense call of one eval forward pass."""
  macs = []

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    module = context.module
    if context.method_name == "__call__" and isinstance(module, Conv):
      kh, kw = (module.kernel_size,) * 2 if isinstance(module.kernel_size, int) else \
          module.kernel_size
      cin_g = args[0].shape[-1] // module.feature_group_count
      macs.append(math.prod(out.shape) * kh * kw * cin_g)
    elif context.method_name == "__call__" and isinstance(module, nn.Dense):
      macs.append(math.prod(out.shape) * args[0].shape[-1])
    return out

  with nn.intercept_methods(interceptor):
    jax.eval_shape(lambda v, x: model.apply(v, x, train=False), shapes,
                   jax.ShapeDtypeStruct(tuple(input_shape), jnp.float32))
  return int(sum(macs)) // input_shape[0]


def model_summary(name: str, num_classes: int = 10, *, width: float = 1.0,
                  conv_impl: str = "xla", flops_method: str = "analytic",
                  **kwargs: Any) -> dict[str, Any]:
  """Parameter count and forward FLOPs per example of a registry model.

  Runs only abstract evaluation (`jax.eval_shape`, or lowering without
  compiling for "xla"), so it is fast even for the big models.

  Args:
    name, num_classes, width, conv_impl, **kwargs: as `get_model`.
    flops_method: "analytic": 2 x the multiply-accumulates of every conv and
      dense layer (the usual "MACs x 2" convention; BatchNorm, activations,
      pooling and additions are not counted). "xla": XLA's HLO cost analysis
      of the lowered eval forward at batch 1 (counts elementwise ops too).

  Returns:
    {"name", "num_classes", "width", "params" (trainable, PyTorch's count),
    "batch_stats" (running-statistic scalars), "flops" (per example),
    "feature_dim"}.
  """
  if flops_method not in ("analytic", "xla"):
    raise ValueError(f"model_summary: `flops_method` must be 'analytic' or 'xla', got "
                     f"{flops_method!r}.")
  model = get_model(name, num_classes, width=width, conv_impl=conv_impl, **kwargs)
  shapes = jax.eval_shape(lambda key: init_variables(model, key), jax.random.key(0))
  if flops_method == "analytic":
    flops = 2 * _analytic_macs(model, shapes, DEFAULT_INPUT_SHAPE)
  else:
    lowered = jax.jit(lambda v, x: model.apply(v, x, train=False)).lower(
        shapes, jax.ShapeDtypeStruct(DEFAULT_INPUT_SHAPE, jnp.float32))
    cost = lowered.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = int(cost["flops"])
  return {"name": name, "num_classes": num_classes, "width": width,
          "params": count_parameters(shapes["params"]),
          "batch_stats": count_parameters(shapes["batch_stats"]),
          "flops": flops, "feature_dim": int(model.feature_dim)}


def grow_classifier(variables: Variables, *, num_new_classes: int, key: jax.Array,
                    init_bound: float | None = None) -> Variables:
  """Adds `num_new_classes` outputs to the "head" Dense, keeping the old ones.

  GLFC's `Incremental_learning`: the new head has C_old + k outputs; the old
  C_old kernel columns and bias entries are copied exactly, the new ones drawn
  fresh (PyTorch's default Linear init, U(-1/sqrt(d), 1/sqrt(d)), as the
  new `nn.Linear` of the code; or U(-init_bound, init_bound)). Apply the
  result with `get_model(name, C_old + k, ...)`. Works for any zoo model; vmap
  it (with one key per client) for stacked clients.

  Args:
    variables: {"params": {..., "head": {"kernel" (d, C_old), "bias" (C_old,)}}, ...}.
    num_new_classes: k >= 1.
    key: PRNG key for the new rows.
    init_bound: optional uniform bound instead of PyTorch's default.

  Returns:
    New variables (other entries shared, not copied).
  """
  _check_variables("grow_classifier", variables)
  if (isinstance(num_new_classes, bool) or not isinstance(num_new_classes, (int, np.integer))
      or num_new_classes < 1):
    raise ValueError(f"grow_classifier: `num_new_classes` must be an int >= 1, got "
                     f"{num_new_classes!r}.")
  head = variables["params"].get("head")
  if not isinstance(head, dict) or "kernel" not in head or "bias" not in head:
    raise ValueError("grow_classifier: variables['params'] has no Dense 'head' with "
                     "'kernel' and 'bias'.")
  kernel, bias = head["kernel"], head["bias"]
  if kernel.ndim != 2 or bias.ndim != 1:
    raise ValueError(f"grow_classifier: head kernel must be (d, C) and bias (C,), got "
                     f"{kernel.shape} and {bias.shape}; use jax.vmap for stacked clients.")
  fan_in = kernel.shape[0]
  key_kernel, key_bias = jax.random.split(key)
  shape = (fan_in, int(num_new_classes))
  if init_bound is None:
    new_kernel = torch_kernel_init(key_kernel, shape, kernel.dtype)
    new_bias = torch_bias_init(fan_in)(key_bias, (int(num_new_classes),), bias.dtype)
  else:
    new_kernel = jax.random.uniform(key_kernel, shape, kernel.dtype, -init_bound, init_bound)
    new_bias = jax.random.uniform(key_bias, (int(num_new_classes),), bias.dtype, -init_bound,
                                  init_bound)
  params = dict(variables["params"])
  params["head"] = {**head, "kernel": jnp.concatenate([kernel, new_kernel], axis=1),
                    "bias": jnp.concatenate([bias, new_bias], axis=0)}
  return {**variables, "params": params}

"""FedFusion: a frozen global trunk beside the local trunk, fused feature maps.

The model runs the base network's trunk twice, the trainable "local_trunk"
and the frozen "global_trunk" (a copy of the last global model's trunk), fuses
the two feature maps with the "fusion" operator and finishes with the base
network's "tail" and "head":

  * "conv": 1x1 convolution (with bias) of concat([local, global], channels),
    2C -> C; `conv_init="torch"` (default, the authors' code: PyTorch's default
    initialisation) or "identity" (kernel [I; 0], bias 0: the fused map starts
    as the local map, so the model starts as the base network, as "multi" and
    "single" do; an option of this library, not of the paper).
  * "multi": per-channel gamma of shape (C,), initialised to 0:
    fused = gamma * global + (1 - gamma) * local.
  * "single": the same with one scalar gamma (shape ()).

With gamma = 0 ("multi"/"single") the model is exactly the base network made
of (local_trunk, tail, head). The global trunk's output is wrapped in
`jax.lax.stop_gradient` and it always runs in eval mode (running BatchNorm
statistics, no update), so it is frozen even if an optimiser sees it; use
`fedfusion_trainable_mask` with `optax.masked` (or `optax.multi_transform`) to
keep weight decay off it too. The server averages everything, fusion
parameters included (the EMA of gamma across rounds, FedFusion Sec. 3, is the
algorithm's job).

Helpers:
  * `fedfusion_trainable_mask(params)`: pytree of bools, False on the global trunk.
  * `fedfusion_local_variables(variables)`: the (local_trunk, tail, head)
    variables as a plain base-model variable dict (trunk/tail/head).
  * `fedfusion_set_global(variables, base_variables, *, also_local=False)`:
    load the global trunk (and optionally the local branch) from a base model.

References:
  [FedFusion] X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun. Towards Faster and
    Better Federated Learning: A Feature Fusion Approach. ICIP 2019.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.base import check_feature_dim, check_images, classifier_head
from fedjax_het.models.layers import Conv

#: Fusion operators of FedFusion.
FUSION_OPERATORS = ("conv", "multi", "single")
#: Initialisations of the "conv" fusion operator.
CONV_INITS = ("torch", "identity")


def _identity_fusion_kernel(key, shape, dtype=jnp.float32):
  """(1, 1, 2C, C) kernel [I; 0]: the local half passes through, the global half is ignored."""
  del key
  _, _, cin, cout = shape
  return jnp.concatenate([jnp.eye(cout, dtype=dtype), jnp.zeros((cin - cout, cout), dtype)]
                         )[None, None]


class FusionOperator(nn.Module):
  """Fuses the local and global feature maps (B, h, w, C) -> (B, h, w, C).

  Attributes:
    kind: one of `FUSION_OPERATORS`.
    conv_impl: convolution implementation of the "conv" operator.
    conv_init: initialisation of the "conv" operator, one of `CONV_INITS`.
  """
  kind: str
  conv_impl: str = "xla"
  conv_init: str = "torch"

  @nn.compact
  def __call__(self, local: jax.Array, global_: jax.Array) -> jax.Array:
    if self.kind not in FUSION_OPERATORS:
      raise ValueError(f"`fusion` must be one of {FUSION_OPERATORS}, got {self.kind!r}.")
    if local.shape != global_.shape or local.ndim != 4:
      raise ValueError(f"FusionOperator: local and global feature maps must share a "
                       f"(B, h, w, C) shape, got {local.shape} and {global_.shape}.")
    channels = local.shape[-1]
    if self.kind == "conv":
      if self.conv_init not in CONV_INITS:
        raise ValueError(f"`conv_init` must be one of {CONV_INITS}, got {self.conv_init!r}.")
      identity = self.conv_init == "identity"
      return Conv(channels, 1, impl=self.conv_impl, name="conv",
                  kernel_init=_identity_fusion_kernel if identity else None,
                  bias_init=nn.initializers.zeros if identity else None)(
                      jnp.concatenate([local, global_], axis=-1))
    if self.kind == "multi":
      gamma = self.param("gamma", nn.initializers.zeros, (channels,), jnp.float32)
      gamma = gamma[None, None, None, :]
    else:
      gamma = self.param("gamma", nn.initializers.zeros, (), jnp.float32)
      gamma = gamma[None, None, None, None]
    return gamma * global_ + (1.0 - gamma) * local


class FedFusion(nn.Module):
  """local trunk + frozen global trunk -> fusion -> tail -> Dense "head".

  Attributes:
    local_trunk: trainable trunk (a base model's trunk).
    global_trunk: frozen trunk of the same architecture.
    fusion: `FusionOperator`.
    tail: the base model's tail (with `feature_dim`).
    num_classes: outputs of the head.
    head_init_bound: as `Classifier`.
    compute_dtype: as `Classifier`.
  """
  local_trunk: nn.Module
  global_trunk: nn.Module
  fusion: nn.Module
  tail: nn.Module
  num_classes: int
  head_init_bound: float | None = None
  compute_dtype: str = "float32"

  @property
  def feature_dim(self) -> int:
    return self.tail.feature_dim

  @property
  def needs_dropout_rng(self) -> bool:
    return any(getattr(m, "needs_dropout_rng", False) for m in (self.local_trunk, self.tail))

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Returns (features, logits) computed from the fused feature map.

    `mask` is as `Classifier`'s (it only affects the local trunk's BatchNorm).
    """
    check_images("FedFusion", images, mask)
    local = self.local_trunk(images, train=train, mask=mask)
    global_ = jax.lax.stop_gradient(self.global_trunk(images, train=False))
    features = self.tail(self.fusion(local, global_), train=train)
    check_feature_dim("FedFusion", features, self.feature_dim)
    return features, classifier_head(features, self.num_classes, self.head_init_bound)


def _check_fedfusion(fn: str, tree: Any, what: str) -> None:
  if not isinstance(tree, dict) or "global_trunk" not in tree or "local_trunk" not in tree:
    keys = list(tree) if isinstance(tree, dict) else type(tree).__name__
    raise ValueError(f"{fn}: `{what}` must be FedFusion {what} with 'local_trunk' and "
                     f"'global_trunk' entries, got {keys}.")


def fedfusion_trainable_mask(params: dict[str, Any]) -> dict[str, Any]:
  """Pytree of bools matching `params`: False on the global trunk, True elsewhere.

  Works on single-client or stacked (client-leading) parameters alike.

  Args:
    params: FedFusion parameters (variables["params"]).

  Returns:
    Mask for `optax.masked(tx, mask)`.
  """
  _check_fedfusion("fedfusion_trainable_mask", params, "params")
  return {key: jax.tree_util.tree_map(lambda _, k=key: k != "global_trunk", value)
          for key, value in params.items()}


def fedfusion_local_variables(variables: dict[str, Any]) -> dict[str, Any]:
  """The FedFusion local branch as base-model variables (trunk, tail, head).

  With gamma = 0 ("multi"/"single"), the base model applied to these variables
  gives exactly the FedFusion outputs.

  Args:
    variables: FedFusion variables {"params", "batch_stats"}.

  Returns:
    {"params": {"trunk", "tail"?, "head"}, "batch_stats": {"trunk"?, "tail"?}}.
  """
  out = {}
  for collection in ("params", "batch_stats"):
    tree = variables.get(collection, {})
    if collection == "params":
      _check_fedfusion("fedfusion_local_variables", tree, "params")
    mapped = {"trunk": tree["local_trunk"]} if "local_trunk" in tree else {}
    mapped.update({k: v for k, v in tree.items() if k in ("tail", "head")})
    out[collection] = mapped
  return out


def fedfusion_set_global(variables: dict[str, Any], base_variables: dict[str, Any], *,
                         also_local: bool = False) -> dict[str, Any]:
  """Loads the global trunk (and optionally the local branch) from a base model.

  Args:
    variables: FedFusion variables.
    base_variables: variables of the base model (trunk/tail/head), e.g. the
      received global model.
    also_local: also copy the trunk into the local trunk and the tail and head
      (FedMMD/FedFusion initialise the local stream from the global model).

  Returns:
    New FedFusion variables (the fusion parameters are kept).
  """
  _check_fedfusion("fedfusion_set_global", variables.get("params"), "variables['params']")
  out = {}
  for collection in ("params", "batch_stats"):
    tree = dict(variables.get(collection, {}))
    base = base_variables.get(collection, {})
    if "trunk" in base:
      tree["global_trunk"] = base["trunk"]
      if also_local:
        tree["local_trunk"] = base["trunk"]
    if also_local:
      tree.update({k: v for k, v in base.items() if k in ("tail", "head")})
    out[collection] = tree
  return out

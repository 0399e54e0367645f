"""The trunk -> tail -> head structure every model of the zoo shares.

A model is `Classifier(trunk=..., tail=..., num_classes=...)`:

  * trunk: images (B, 32, 32, 3) -> feature map (B, h, w, c): the
    convolutional body (stem, stages, blocks, pooling layers in between).
  * tail: feature map -> pooled features (B, d): global average pooling
    (ResNet, MobileNetV2, GoogLeNet; plus dropout for EfficientNet) or
    flatten + fully connected layers (the small CNNs). `tail.feature_dim` is d.
  * head: `nn.Dense(num_classes)` named "head", features -> logits.

Variables are {"params": {"trunk", "tail", "head"}, "batch_stats": {"trunk"}}
(a part without parameters has no entry). The split lets FedFusion put its
fusion operator between the trunk and the tail of ANY zoo model, and lets the
FedFusion local branch be mapped back to a plain model exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.layers import dense

#: The Flax collection the CIL trunks (`resnet.ResNetTrunk`, `small_cnns.SimpleCNNTrunk`) sow
#: their stage outputs into, as "stage1", "stage2", ... Nothing is kept unless a caller
#: applies the model with this collection mutable (PODNet's POD-spatial reads them,
#: `algorithms.podnet_fl.apply_with_stages`); outputs and parameters do not change.
STAGE_COLLECTION = "intermediates"  # Flax's init leaves it out (DenyList default)


def check_images(module_name: str, images: jax.Array, mask: jax.Array | None = None) -> None:
  """Raises ValueError unless `images` is a rank-4 NHWC batch and `mask` is (batch,)."""
  if images.ndim != 4:
    raise ValueError(f"{module_name}: `images` must have shape (batch, height, width, "
                     f"channels), got shape {images.shape}.")
  if mask is not None and (mask.shape != images.shape[:1] or mask.dtype != jnp.bool_):
    raise ValueError(f"{module_name}: `mask` must be a bool array of shape (batch,) = "
                     f"({images.shape[0]},), got {mask.dtype} {mask.shape}.")


def classifier_head(features: jax.Array, num_classes: int,
                    init_bound: float | None = None) -> jax.Array:
  """The final `nn.Dense` named "head" (must be called inside a compact method)."""
  return dense(num_classes, features.shape[-1], name="head", init_bound=init_bound)(features)


def check_feature_dim(module_name: str, features: jax.Array, feature_dim: int) -> None:
  if features.ndim != 2 or features.shape[-1] != feature_dim:
    raise ValueError(f"{module_name}: the tail produced features of shape {features.shape}, "
                     f"expected (batch, {feature_dim}); the input is probably not "
                     f"32x32 (the zoo is built for 32x32 inputs).")


class GlobalPoolTail(nn.Module):
  """Global average pooling (and optional dropout) of a feature map.

  Attributes:
    feature_dim: channels of the incoming feature map = output dimension.
    dropout_rate: dropout on the pooled feature in train mode (EfficientNet:
      0.2); needs the "dropout" RNG when > 0.
  """
  feature_dim: int
  dropout_rate: float = 0.0

  @property
  def needs_dropout_rng(self) -> bool:
    return self.dropout_rate > 0

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del mask  # no batch statistics here
    features = jnp.mean(x, axis=(1, 2))
    if self.dropout_rate > 0:
      features = nn.Dropout(self.dropout_rate, deterministic=not train)(features)
    return features


class MLPTail(nn.Module):
  """Flatten, then fully connected layers (ReLU between them).

  Attributes:
    input_dim: size of the flattened feature map (checked at call time).
    hidden: output sizes of the Dense layers; empty for a plain flatten.
    names: names of the Dense layers (default "fc1", "fc2", ...).
    activate_last: ReLU after the last Dense layer too.
    dropout_rate: dropout after every Dense layer (after its ReLU) in train
      mode, so the features reaching the head are dropped out too (the FedAvg
      CNNs of FedMMD/FedFusion: "a fully connected layer with 512 units (with
      a ReLU activation and random dropout)", rate 0.2 in the authors' code);
      needs the "dropout" RNG when > 0. 0 (default): no dropout layer at all.
  """
  input_dim: int
  hidden: Sequence[int] = ()
  names: Sequence[str] | None = None
  activate_last: bool = True
  dropout_rate: float = 0.0

  @property
  def feature_dim(self) -> int:
    return self.hidden[-1] if self.hidden else self.input_dim

  @property
  def needs_dropout_rng(self) -> bool:
    return self.dropout_rate > 0 and bool(self.hidden)

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del mask
    x = x.reshape(x.shape[0], -1)
    if x.shape[-1] != self.input_dim:
      raise ValueError(f"MLPTail: flattened feature map has {x.shape[-1]} entries, expected "
                       f"{self.input_dim} (the zoo is built for 32x32 inputs).")
    names = self.names or [f"fc{i + 1}" for i in range(len(self.hidden))]
    for i, (size, name) in enumerate(zip(self.hidden, names)):
      x = dense(size, x.shape[-1], name=name)(x)
      if i < len(self.hidden) - 1 or self.activate_last:
        x = nn.relu(x)
      if self.dropout_rate > 0:
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return x


def with_dropout(model: nn.Module, rate: float) -> nn.Module:
  """`model` (a `Classifier` or a `FedFusion` model) with its tail's dropout set to `rate`.

  The tail is an `MLPTail` (dropout after every hidden Dense layer) or a
  `GlobalPoolTail` (dropout on the pooled feature). Dropout acts in train mode
  only (`apply_model(train=True, rng=...)`); the variables are unchanged.

  Raises:
    ValueError: `rate` outside [0, 1), or a model without such a tail.
  """
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
    raise ValueError(f"with_dropout: `rate` must be a number in [0, 1), got {rate!r}.")
  tail = getattr(model, "tail", None)
  if not isinstance(tail, (MLPTail, GlobalPoolTail)):
    raise ValueError(f"with_dropout: needs a model whose tail is an MLPTail or a "
                     f"GlobalPoolTail (the zoo's Classifier and FedFusion models), got "
                     f"{type(model).__name__} with tail {type(tail).__name__}.")
  return model.clone(tail=tail.clone(dropout_rate=float(rate)))


class Classifier(nn.Module):
  """trunk -> tail -> Dense "head"; returns (features, logits).

  Attributes:
    trunk: module `(images, *, train) -> feature map`.
    tail: module `(feature map, *, train) -> features (B, feature_dim)` with a
      `feature_dim` attribute.
    num_classes: outputs of the head.
    head_init_bound: None for PyTorch's default Dense init, else
      U(-bound, bound) for the head's kernel and bias (LeNet encoder).
    compute_dtype: "float32", or "bfloat16" for mixed precision: `apply_model`
      casts the parameters and images to bfloat16 for the forward (and hence
      backward) pass and returns float32 features and logits; the stored
      parameters, BatchNorm statistics, optimiser state and losses stay float32.
  """
  trunk: nn.Module
  tail: nn.Module
  num_classes: int
  head_init_bound: float | None = None
  compute_dtype: str = "float32"

  @property
  def feature_dim(self) -> int:
    """Dimension of the pooled features (after width scaling)."""
    return self.tail.feature_dim

  @property
  def needs_dropout_rng(self) -> bool:
    """Whether train mode draws from the "dropout" RNG."""
    return any(getattr(m, "needs_dropout_rng", False) for m in (self.trunk, self.tail))

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Runs the model.

    Args:
      images: (B, 32, 32, 3) float32, normalised, NHWC.
      train: batch statistics (and dropout) if True, running statistics if False.
      mask: optional (B,) bools marking the real rows of a padded batch: train-
        mode BatchNorm statistics use only those rows (see `layers.batch_norm`).
        Outputs are computed for every row.

    Returns:
      (features (B, feature_dim), logits (B, num_classes)).
    """
    check_images(type(self).__name__, images, mask)
    feature_map = self.trunk(images, train=train, mask=mask)
    features = self.tail(feature_map, train=train)
    check_feature_dim(type(self).__name__, features, self.feature_dim)
    return features, classifier_head(features, self.num_classes, self.head_init_bound)

"""HtFLlib's backbone pieces: its 4-layer CNN and the pooled feature head of `BaseHeadSplit`.

* `htfl_cnn` (registry name "htfl_cnn"): HtFLlib's `FedAvgCNN(in_features=3, dim=1600)`,
  the "4-layer CNN" of the HtFE model groups (FedTGP, FedKTL, HtFLlib): conv5x5 3 -> 32
  VALID (with bias) + ReLU + max-pool 2, conv5x5 32 -> 64 VALID + ReLU + max-pool 2,
  flatten 5 * 5 * 64 = 1600, Dense 512 + ReLU ("fc1") = features, head 512 -> C. No
  BatchNorm, no dropout. 878,538 parameters with 10 classes. (The zoo's
  `fedavg_mnist_cnn` is McMahan's CNN with SAME convolutions: 4096 flattened inputs.)
  Flattening is NHWC (torch flattens NCHW): a fixed permutation of fc1's input rows.
* `with_feature_dim(model, dim)`: the model whose features are pooled to `dim` entries
  before the head, as HtFLlib's `BaseHeadSplit` replaces every backbone's classifier by
  `nn.AdaptiveAvgPool1d(feature_dim)` (feature_dim 512 in every published setting) and
  puts a fresh `nn.Linear(feature_dim, C)` head on it: output j is the mean of the input
  entries [floor(j L / dim), ceil((j + 1) L / dim)) of the L backbone features (windows of
  2 for GoogLeNet's 1024, of 2 or 3, overlapping, for MobileNetV2's 1280, of 4 for a
  bottleneck ResNet's 2048; the identity for 512). So every architecture shares one feature
  space of `dim` entries, which prototypes (FedProto, FedTGP, FedGH) and shared heads
  (LG-FedAvg, FedGH) need. The pooling is a constant matrix (`adaptive_pool_matrix`), no
  parameters.

References:
  J. Zhang et al. HtFLlib: A Comprehensive Heterogeneous Federated Learning Library and
    Benchmark. KDD 2025 (TsingZ0/HtFLlib system/flcore/trainmodel/models.py: FedAvgCNN,
    BaseHeadSplit).
  J. Zhang, Y. Liu, Y. Hua, J. Cao. FedTGP: Trainable Global Prototypes with
    Adaptive-Margin-Enhanced Contrastive Learning for Data and Model Heterogeneity in
    Federated Learning. AAAI 2024 (Sec. 5.1: the HtFE model groups).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.models.base import Classifier, MLPTail
from fedjax_het.models.layers import Conv, max_pool, scale_width

#: HtFLlib's feature dimension (`-fd 512` in every published command line).
HTFL_FEATURE_DIM = 512


class HtFLCNNTrunk(nn.Module):
  """Two VALID 5x5 convs (with bias) with ReLU and 2x2 max-pools; (B, 5, 5, 64 * width)."""
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return scale_width(64, self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del train, mask
    x = images
    for i, channels in enumerate((scale_width(32, self.width), self.out_channels)):
      x = nn.relu(Conv(channels, 5, padding=0, impl=self.conv_impl, name=f"conv{i + 1}")(x))
      x = max_pool(x, 2, strides=2, impl=self.conv_impl)
    return x


def htfl_cnn(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla") -> Classifier:
  """HtFLlib's 4-layer CNN (`FedAvgCNN(dim=1600)`, module docstring)."""
  trunk = HtFLCNNTrunk(width, conv_impl)
  tail = MLPTail(5 * 5 * trunk.out_channels, (scale_width(512, width),))
  return Classifier(trunk=trunk, tail=tail, num_classes=num_classes)


def adaptive_pool_matrix(in_dim: int, out_dim: int) -> np.ndarray:
  """(in_dim, out_dim) float32 matrix M with x @ M = torch's AdaptiveAvgPool1d(out_dim)(x).

  Column j averages the entries [floor(j in / out), ceil((j + 1) in / out)) of x.
  """
  if min(in_dim, out_dim) < 1:
    raise ValueError(f"adaptive_pool_matrix: dimensions must be >= 1, got {in_dim} -> "
                     f"{out_dim}.")
  matrix = np.zeros((in_dim, out_dim), np.float32)
  for j in range(out_dim):
    start = (j * in_dim) // out_dim
    end = -((-(j + 1) * in_dim) // out_dim)
    matrix[start:end, j] = 1.0 / (end - start)
  return matrix


class PooledTail(nn.Module):
  """A tail followed by adaptive average pooling of its features to `feature_dim` entries.

  Attributes:
    inner: the backbone's own tail (its parameters stay under "inner").
    feature_dim: the pooled dimension (HtFLlib: 512).
  """
  inner: nn.Module
  feature_dim: int

  @property
  def needs_dropout_rng(self) -> bool:
    return bool(getattr(self.inner, "needs_dropout_rng", False))

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del mask
    features = self.inner(x, train=train)
    pool = jnp.asarray(adaptive_pool_matrix(int(self.inner.feature_dim), self.feature_dim))
    return jnp.dot(features, pool.astype(features.dtype), precision=jax.lax.Precision.HIGHEST)


def with_feature_dim(model: nn.Module, feature_dim: int) -> nn.Module:
  """`model` (a zoo `Classifier`) with its features pooled to `feature_dim` before the head.

  HtFLlib's `BaseHeadSplit` (module docstring). A model whose features already have
  `feature_dim` entries is returned unchanged (the pooling would be the identity).

  Raises:
    ValueError: a `feature_dim` below 1, or a model without a tail (not a `Classifier`).
  """
  if isinstance(feature_dim, bool) or not isinstance(feature_dim, (int, np.integer)) \
      or feature_dim < 1:
    raise ValueError(f"with_feature_dim: `feature_dim` must be an integer >= 1, got "
                     f"{feature_dim!r}.")
  if not isinstance(model, Classifier):
    raise ValueError(f"with_feature_dim: needs a zoo Classifier (trunk -> tail -> head), got "
                     f"{type(model).__name__}.")
  if model.feature_dim == int(feature_dim):
    return model
  return model.clone(tail=PooledTail(inner=model.tail, feature_dim=int(feature_dim)))

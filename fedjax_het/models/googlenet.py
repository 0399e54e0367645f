"""GoogLeNet, CIFAR variant (kuangliu/pytorch-cifar, FCCL+ backbone).

Pre-layer conv3x3 3 -> 192 (with bias) + BN + ReLU; Inception modules
a3, b3, max-pool 3x3 stride 2 pad 1, a4, b4, c4, d4, e4, max-pool, a5, b5;
global average pooling; Dense head 1024 -> C. An Inception(in, n1x1, n3x3red,
n3x3, n5x5red, n5x5, pool_planes) module concatenates four branches: 1x1;
1x1 -> 3x3; 1x1 -> 3x3 -> 3x3 (the "5x5" branch as two 3x3 convolutions);
max-pool 3x3 stride 1 pad 1 -> 1x1. Every conv has a bias and is followed by
BN + ReLU. 6,166,250 parameters with 10 classes. Feature dim 1024 * width
(the sum of b5's four scaled branch widths).

References:
  C. Szegedy et al. Going Deeper with Convolutions. CVPR 2015.
  kuangliu/pytorch-cifar models/googlenet.py; WenkeHuang/FCCL
    fccl+/backbone/googlenet.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.base import Classifier, GlobalPoolTail
from fedjax_het.models.layers import Conv, batch_norm, max_pool, scale_width

#: (name, n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes); "pool" = max-pool 3/2.
GOOGLENET_LAYOUT = (
    ("a3", 64, 96, 128, 16, 32, 32),
    ("b3", 128, 128, 192, 32, 96, 64),
    ("pool",),
    ("a4", 192, 96, 208, 16, 48, 64),
    ("b4", 160, 112, 224, 24, 64, 64),
    ("c4", 128, 128, 256, 24, 64, 64),
    ("d4", 112, 144, 288, 32, 64, 64),
    ("e4", 256, 160, 320, 32, 128, 128),
    ("pool",),
    ("a5", 256, 160, 320, 32, 128, 128),
    ("b5", 384, 192, 384, 48, 128, 128),
)


class ConvBNReLU(nn.Module):
  """Conv (with bias) + BN + ReLU, torch padding (k - 1) // 2."""
  features: int
  kernel_size: int
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    x = Conv(self.features, self.kernel_size, padding=(self.kernel_size - 1) // 2,
             impl=self.conv_impl, name="conv")(x)
    return nn.relu(batch_norm(x, train=train, mask=mask, name="bn"))


class Inception(nn.Module):
  """GoogLeNet Inception module (four concatenated branches)."""
  n1x1: int
  n3x3red: int
  n3x3: int
  n5x5red: int
  n5x5: int
  pool_planes: int
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return self.n1x1 + self.n3x3 + self.n5x5 + self.pool_planes

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    impl = self.conv_impl
    y1 = ConvBNReLU(self.n1x1, 1, impl, name="b1_0")(x, train=train, mask=mask)
    y2 = ConvBNReLU(self.n3x3red, 1, impl, name="b2_0")(x, train=train, mask=mask)
    y2 = ConvBNReLU(self.n3x3, 3, impl, name="b2_1")(y2, train=train, mask=mask)
    y3 = ConvBNReLU(self.n5x5red, 1, impl, name="b3_0")(x, train=train, mask=mask)
    y3 = ConvBNReLU(self.n5x5, 3, impl, name="b3_1")(y3, train=train, mask=mask)
    y3 = ConvBNReLU(self.n5x5, 3, impl, name="b3_2")(y3, train=train, mask=mask)
    y4 = max_pool(x, 3, strides=1, padding=1, impl=impl)
    y4 = ConvBNReLU(self.pool_planes, 1, impl, name="b4_0")(y4, train=train, mask=mask)
    return jnp.concatenate([y1, y2, y3, y4], axis=-1)


class GoogLeNetTrunk(nn.Module):
  """Pre-layer and the Inception stages; output (B, 8, 8, 1024 * width)."""
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    last = GOOGLENET_LAYOUT[-1]
    return sum(scale_width(last[i], self.width) for i in (1, 3, 5, 6))

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    x = ConvBNReLU(scale_width(192, self.width), 3, self.conv_impl,
                   name="pre_layers")(images, train=train, mask=mask)
    for spec in GOOGLENET_LAYOUT:
      if spec[0] == "pool":
        x = max_pool(x, 3, strides=2, padding=1, impl=self.conv_impl)
        continue
      name, *planes = spec
      x = Inception(*(scale_width(p, self.width) for p in planes), conv_impl=self.conv_impl,
                    name=name)(x, train=train, mask=mask)
    return x


def googlenet(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla") -> Classifier:
  """GoogLeNet CIFAR variant (see module docstring)."""
  trunk = GoogLeNetTrunk(width, conv_impl)
  return Classifier(trunk=trunk, tail=GlobalPoolTail(trunk.out_channels),
                    num_classes=num_classes)

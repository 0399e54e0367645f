"""MobileNetV2, CIFAR variant (kuangliu/pytorch-cifar, FCCL+ backbone).

Stem conv3x3 stride 1, 32 channels (no bias) + BN + ReLU; inverted residual
blocks (t, c, n, s) = (1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2),
(6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1), the stride on
the first block of a stage; block = expand 1x1 (also for t = 1) + BN + ReLU,
depthwise 3x3 + BN + ReLU, project 1x1 + BN, plus a residual when the stride is
1: identity if in == out, else (kuangliu's choice, kept here) a 1x1 conv + BN
shortcut. Then 1x1 conv 320 -> 1280 + BN + ReLU, global average pooling,
Dense head 1280 -> C. 2,296,922 parameters with 10 classes. Feature dim
1280 * width (the width multiplier scales the last conv too). Under a width
multiplier every channel count is rounded to a multiple of 8, at least 8
(`layers.divisible_width`, the rule of the MobileNetV2 reference code), so
width 1/8 has 8-channel early blocks, not 2-4.

References:
  M. Sandler, A. Howard, M. Zhu, A. Zhmoginov, L.-C. Chen. MobileNetV2:
    Inverted Residuals and Linear Bottlenecks. CVPR 2018.
  kuangliu/pytorch-cifar models/mobilenetv2.py; WenkeHuang/FCCL
    fccl+/backbone/mobilnet_v2.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_het.models.base import Classifier, GlobalPoolTail
from fedjax_het.models.layers import Conv, batch_norm, divisible_width

#: (expansion t, out_channels c, num_blocks n, stride s) per stage.
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
LAST_CHANNELS = 1280


class InvertedResidual(nn.Module):
  """expand 1x1 -> depthwise 3x3 -> project 1x1, residual when stride 1."""
  out_channels: int
  expansion: int
  strides: int
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    in_channels = x.shape[-1]
    planes = self.expansion * in_channels
    y = Conv(planes, 1, use_bias=False, impl=self.conv_impl, name="expand_conv")(x)
    y = nn.relu(batch_norm(y, train=train, mask=mask, name="expand_bn"))
    y = Conv(planes, 3, self.strides, padding=1, feature_group_count=planes, use_bias=False,
             impl=self.conv_impl, name="depthwise_conv")(y)
    y = nn.relu(batch_norm(y, train=train, mask=mask, name="depthwise_bn"))
    y = Conv(self.out_channels, 1, use_bias=False, impl=self.conv_impl, name="project_conv")(y)
    y = batch_norm(y, train=train, mask=mask, name="project_bn")
    if self.strides != 1:
      return y
    shortcut = x
    if in_channels != self.out_channels:
      shortcut = Conv(self.out_channels, 1, use_bias=False, impl=self.conv_impl,
                      name="shortcut_conv")(x)
      shortcut = batch_norm(shortcut, train=train, mask=mask, name="shortcut_bn")
    return y + shortcut


class MobileNetV2Trunk(nn.Module):
  """Stem, the 17 blocks and the 1x1 conv to 1280; (B, 4, 4, 1280 * width)."""
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return divisible_width(LAST_CHANNELS, self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    x = Conv(divisible_width(32, self.width), 3, 1, padding=1, use_bias=False,
             impl=self.conv_impl, name="conv1")(images)
    x = nn.relu(batch_norm(x, train=train, mask=mask, name="bn1"))
    b = 0
    for expansion, channels, num_blocks, stride in MOBILENET_V2_STAGES:
      for i in range(num_blocks):
        x = InvertedResidual(divisible_width(channels, self.width), expansion,
                             stride if i == 0 else 1, self.conv_impl,
                             name=f"block{b}")(x, train=train, mask=mask)
        b += 1
    x = Conv(self.out_channels, 1, use_bias=False, impl=self.conv_impl, name="conv2")(x)
    return nn.relu(batch_norm(x, train=train, mask=mask, name="bn2"))


def mobilenet_v2(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla") -> Classifier:
  """MobileNetV2 CIFAR variant (see module docstring)."""
  trunk = MobileNetV2Trunk(width, conv_impl)
  return Classifier(trunk=trunk, tail=GlobalPoolTail(trunk.out_channels),
                    num_classes=num_classes)

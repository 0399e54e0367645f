"""EfficientNet-B0, CIFAR variant (kuangliu/pytorch-cifar, FCCL+ backbone).

Stem conv3x3 stride 1, 32 channels (no bias) + BN + swish; 16 MBConv blocks
with expansion [1, 6, 6, 6, 6, 6, 6], output channels
[16, 24, 40, 80, 112, 192, 320], repeats [1, 2, 2, 3, 3, 4, 1], kernels
[3, 3, 5, 3, 5, 5, 3] and strides [1, 2, 2, 2, 1, 2, 1] (the stride on the
first block of a stage). MBConv: expand 1x1 + BN + swish (skipped when the
expansion is 1), depthwise kxk (padding k // 2) + BN + swish, squeeze-excite
with int(0.25 * block input channels) channels (at least 1 under narrow
widths; two 1x1 convolutions WITH bias; swish, then sigmoid), project 1x1 + BN; identity skip when stride 1 and
in == out. Global average pooling, dropout 0.2 on the pooled feature in train
mode (the FCCL+ code's `features()` returns the feature AFTER this dropout, so
do we), Dense head 320 -> C. There is no 1280-channel head conv. Feature dim
320 * width. Under a width multiplier every block's channel count is rounded
to a multiple of 8, at least 8 (`layers.divisible_width`, the `round_filters`
rule of the EfficientNet reference code).

Deviations from the torch code, both parameter-free:
  * The torch Block creates the expansion conv1/bn1 even when the expansion is
    1 and never uses them (1,088 dead parameters in block 1); they are not
    created here, so this model has 1,088 parameters fewer than
    `sum(p.numel())` of the torch model with identical computation.
  * Drop-connect: the torch code computes drop_rate = 0.2 * b / blocks but
    never increments b, so every block has drop rate 0 and drop-connect never
    runs. `drop_connect_rate` defaults to 0.0 to match; a positive value
    enables the intended schedule, rate * b / 16 for block b (0-based), on the
    residual branch of blocks with an identity skip, in train mode.

References:
  M. Tan, Q. V. Le. EfficientNet: Rethinking Model Scaling for Convolutional
    Neural Networks. ICML 2019.
  kuangliu/pytorch-cifar models/efficientnet.py; WenkeHuang/FCCL
    fccl+/backbone/efficientnet.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_het.models.base import Classifier, GlobalPoolTail
from fedjax_het.models.layers import Conv, batch_norm, divisible_width, swish

#: (expansion, out_channels, num_blocks, kernel_size, stride) per stage.
EFFICIENTNET_B0_STAGES = (
    (1, 16, 1, 3, 1),
    (6, 24, 2, 3, 2),
    (6, 40, 2, 5, 2),
    (6, 80, 3, 3, 2),
    (6, 112, 3, 5, 1),
    (6, 192, 4, 5, 2),
    (6, 320, 1, 3, 1),
)
SE_RATIO = 0.25


class SqueezeExcite(nn.Module):
  """x * sigmoid(W2 swish(W1 mean_hw(x) + b1) + b2)."""
  se_channels: int
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    s = swish(Conv(self.se_channels, 1, impl=self.conv_impl, name="se_reduce")(s))
    s = jax.nn.sigmoid(Conv(x.shape[-1], 1, impl=self.conv_impl, name="se_expand")(s))
    return x * s


class MBConv(nn.Module):
  """Mobile inverted bottleneck with squeeze-excite (EfficientNet block)."""
  out_channels: int
  kernel_size: int
  strides: int
  expansion: int
  se_channels: int
  drop_rate: float = 0.0
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    in_channels = x.shape[-1]
    channels = self.expansion * in_channels
    y = x
    if self.expansion != 1:
      y = Conv(channels, 1, use_bias=False, impl=self.conv_impl, name="expand_conv")(y)
      y = swish(batch_norm(y, train=train, mask=mask, name="expand_bn"))
    y = Conv(channels, self.kernel_size, self.strides, padding=self.kernel_size // 2,
             feature_group_count=channels, use_bias=False, impl=self.conv_impl,
             name="depthwise_conv")(y)
    y = swish(batch_norm(y, train=train, mask=mask, name="depthwise_bn"))
    y = SqueezeExcite(self.se_channels, self.conv_impl, name="se")(y)
    y = Conv(self.out_channels, 1, use_bias=False, impl=self.conv_impl, name="project_conv")(y)
    y = batch_norm(y, train=train, mask=mask, name="project_bn")
    if self.strides == 1 and in_channels == self.out_channels:
      if train and self.drop_rate > 0:
        keep = 1.0 - self.drop_rate
        mask = jax.random.bernoulli(self.make_rng("dropout"), keep, (y.shape[0], 1, 1, 1))
        y = jnp.where(mask, y / keep, 0.0)
      y = y + x
    return y


class EfficientNetTrunk(nn.Module):
  """Stem and the 16 MBConv blocks; output (B, 2, 2, 320 * width) on 32x32.

  Attributes:
    width: width multiplier of every channel count, rounded by
      `divisible_width` (the expanded channels are
      expansion * scaled input channels, so depthwise groups stay valid).
    drop_connect_rate: see the module docstring (default 0, as the code runs).
    conv_impl: convolution implementation.
  """
  width: float = 1.0
  drop_connect_rate: float = 0.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return divisible_width(EFFICIENTNET_B0_STAGES[-1][1], self.width)

  @property
  def needs_dropout_rng(self) -> bool:
    return self.drop_connect_rate > 0

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    x = Conv(divisible_width(32, self.width), 3, 1, padding=1, use_bias=False,
             impl=self.conv_impl, name="conv1")(images)
    x = swish(batch_norm(x, train=train, mask=mask, name="bn1"))
    total = sum(stage[2] for stage in EFFICIENTNET_B0_STAGES)
    b = 0
    for expansion, channels, num_blocks, kernel, stride in EFFICIENTNET_B0_STAGES:
      for i in range(num_blocks):
        se_channels = max(1, int(x.shape[-1] * SE_RATIO))
        x = MBConv(divisible_width(channels, self.width), kernel, stride if i == 0 else 1,
                   expansion, se_channels, self.drop_connect_rate * b / total,
                   self.conv_impl, name=f"block{b}")(x, train=train, mask=mask)
        b += 1
    return x


def efficientnet_b0(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla",
                    dropout_rate: float = 0.2, drop_connect_rate: float = 0.0) -> Classifier:
  """EfficientNet-B0 CIFAR variant (see module docstring)."""
  for name, value in (("dropout_rate", dropout_rate), ("drop_connect_rate", drop_connect_rate)):
    if not 0.0 <= value < 1.0:
      raise ValueError(f"efficientnet_b0: `{name}` must be in [0, 1), got {value!r}.")
  trunk = EfficientNetTrunk(width, drop_connect_rate, conv_impl)
  return Classifier(trunk=trunk, tail=GlobalPoolTail(trunk.out_channels, dropout_rate),
                    num_classes=num_classes)

"""CIFAR-style ResNets (BasicBlock): ResNet10/12/18/34, and GLFC's ResNet-18.

kuangliu/pytorch-cifar layout, as in the FCCL+ backbone code (mammoth
`ResNet` with nf = 64): conv3x3 stride 1 (no bias) + BN + ReLU, no max-pool;
four stages of 64/128/256/512 channels with strides 1/2/2/2; BasicBlock =
conv3x3 (stride s) + BN + ReLU, conv3x3 + BN, plus the shortcut (identity, or
conv1x1 stride s + BN when the stride or the channel count changes), then
ReLU; global average pooling; Dense head. Feature dim 512 * width. The trunk
sows each stage's output into `base.STAGE_COLLECTION` (kept only on request).

Stems (`stem`, `STEMS`): "cifar" (above: conv3x3 stride 1, no max-pool; the
last stage works at 1/8 of the input side) or "imagenet" (He et al.'s and
torchvision's: conv7x7 stride 2 padding 3 (no bias) + BN + ReLU, then a 3x3
max-pool stride 2 padding 1; the last stage at 1/32 of the side). GLFC trains
one ResNet-18 on every dataset; the library's choice per input side (the
class-incremental configs' `models.stem = "auto"`, `cil.stream.stem_for`):
  * 32 px (CIFAR-100): the CIFAR stem (4x4 maps at the last stage), the
    standard CIFAR ResNet-18 of iCaRL's and PODNet's CIFAR-100 experiments;
  * 64 px (Tiny-ImageNet): the CIFAR stem as well (8x8 maps at the last
    stage, 4x the compute of 32 px); the ImageNet stem would leave 2x2 maps;
  * 224 px (ImageNet-Subset): the ImageNet stem (7x7 maps at the last
    stage), the ResNet-18 of ImageNet-Subset class-incremental work; the CIFAR
    stem would run every stage at 16x the resolution and compute.
The parameters do not depend on the input side (global average pooling), and
the two stems differ only in conv1's kernel (3x3 or 7x7).

ResNet10 = [1, 1, 1, 1], ResNet12 = [2, 1, 1, 1], ResNet18 = [2, 2, 2, 2],
ResNet34 = [3, 4, 6, 3] blocks per stage. With 10 classes ResNet18 has
11,173,962 parameters and ResNet34 21,282,122 (as in PyTorch).

References:
  K. He, X. Zhang, S. Ren, J. Sun. Deep Residual Learning for Image
    Recognition. CVPR 2016.
  kuangliu/pytorch-cifar models/resnet.py; WenkeHuang/FCCL fccl+/backbone/ResNet.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from fedjax_het.models.base import STAGE_COLLECTION, Classifier, GlobalPoolTail
from fedjax_het.models.layers import Conv, batch_norm, scale_width

#: Blocks per stage of the registered depths.
RESNET_STAGE_SIZES = {
    "resnet10": (1, 1, 1, 1),
    "resnet12": (2, 1, 1, 1),
    "resnet18": (2, 2, 2, 2),
    "resnet34": (3, 4, 6, 3),
}
#: Stems of `ResNetTrunk` (module docstring).
STEMS = ("cifar", "imagenet")
_STAGE_CHANNELS = (64, 128, 256, 512)
_STAGE_STRIDES = (1, 2, 2, 2)


class BasicBlock(nn.Module):
  """ResNet BasicBlock (two 3x3 convolutions and a shortcut)."""
  features: int
  strides: int = 1
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    y = Conv(self.features, 3, self.strides, padding=1, use_bias=False, impl=self.conv_impl,
             name="conv1")(x)
    y = nn.relu(batch_norm(y, train=train, mask=mask, name="bn1"))
    y = Conv(self.features, 3, 1, padding=1, use_bias=False, impl=self.conv_impl,
             name="conv2")(y)
    y = batch_norm(y, train=train, mask=mask, name="bn2")
    shortcut = x
    if self.strides != 1 or x.shape[-1] != self.features:
      shortcut = Conv(self.features, 1, self.strides, padding=0, use_bias=False,
                      impl=self.conv_impl, name="shortcut_conv")(x)
      shortcut = batch_norm(shortcut, train=train, mask=mask, name="shortcut_bn")
    return nn.relu(y + shortcut)


class ResNetTrunk(nn.Module):
  """Stem and the four stages; output (B, 4, 4, 512 * width) for 32x32 inputs (CIFAR stem).

  Attributes:
    stage_sizes: BasicBlocks per stage, e.g. (2, 2, 2, 2) for ResNet18.
    width: width multiplier of every channel count.
    conv_impl: convolution implementation (`layers.CONV_IMPLS`).
    stem: one of `STEMS` (module docstring).
  """
  stage_sizes: Sequence[int]
  width: float = 1.0
  conv_impl: str = "xla"
  stem: str = "cifar"

  @property
  def out_channels(self) -> int:
    return scale_width(_STAGE_CHANNELS[-1], self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    if self.stem == "imagenet":
      x = Conv(scale_width(64, self.width), 7, 2, padding=3, use_bias=False,
               impl=self.conv_impl, name="conv1")(images)
    else:
      x = Conv(scale_width(64, self.width), 3, 1, padding=1, use_bias=False,
               impl=self.conv_impl, name="conv1")(images)
    x = nn.relu(batch_norm(x, train=train, mask=mask, name="bn1"))
    if self.stem == "imagenet":
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, (num_blocks, channels, stride) in enumerate(
        zip(self.stage_sizes, _STAGE_CHANNELS, _STAGE_STRIDES)):
      for block in range(num_blocks):
        x = BasicBlock(scale_width(channels, self.width), stride if block == 0 else 1,
                       self.conv_impl, name=f"layer{stage + 1}_{block}")(x, train=train, mask=mask)
      self.sow(STAGE_COLLECTION, f"stage{stage + 1}", x)  # kept only if asked (base.py)
    return x


def resnet(stage_sizes: Sequence[int], num_classes: int, *, width: float = 1.0,
           conv_impl: str = "xla", stem: str = "cifar") -> Classifier:
  """A ResNet with the given blocks per stage and stem (see module docstring)."""
  if stem not in STEMS:
    raise ValueError(f"resnet: `stem` must be one of {STEMS}, got {stem!r}.")
  trunk = ResNetTrunk(tuple(stage_sizes), width, conv_impl, stem)
  return Classifier(trunk=trunk, tail=GlobalPoolTail(trunk.out_channels),
                    num_classes=num_classes)

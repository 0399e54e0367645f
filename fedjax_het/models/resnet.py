"""CIFAR-style ResNets: BasicBlock ResNet10/12/18/34 (and GLFC's ResNet-18), Bottleneck
ResNet-50/101/152.

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

Bottleneck ResNets (`block="bottleneck"`): torchvision's `resnet50`, `resnet101` and
`resnet152`, the deep members of HtFLlib's HtFE8 group (`torchvision.models.resnet*(
pretrained=False)`), with [3, 4, 6, 3], [3, 4, 23, 3] and [3, 8, 36, 3] blocks per stage.
Bottleneck (torchvision's "ResNet v1.5") = conv1x1 (planes) + BN + ReLU, conv3x3 stride s
(planes) + BN + ReLU, conv1x1 (4 planes) + BN, plus the shortcut (conv1x1 stride s + BN when
the stride or the channel count changes: the first block of every stage), then ReLU; stage
outputs 256/512/1024/2048 channels, features 2048 * width. Every convolution, the stem's
included, starts from torchvision's init, He normal with fan-out (`kaiming_normal_(mode=
"fan_out")`); the BasicBlock nets keep PyTorch's default conv init (kuangliu's code). With
the ImageNet stem and a 1000-class head the counts are torchvision's: 25,557,032 (ResNet-50),
44,549,160 (ResNet-101), 60,192,808 (ResNet-152). The registry builds them with the CIFAR stem
by default (conv1 3x3: 7,680 parameters fewer), like the BasicBlock nets; HtFLlib runs the
ImageNet stem on 32x32 images (1x1 maps at the last stage), `stem="imagenet"` here.

References:
  K. He, X. Zhang, S. Ren, J. Sun. Deep Residual Learning for Image
    Recognition. CVPR 2016.
  kuangliu/pytorch-cifar models/resnet.py; WenkeHuang/FCCL fccl+/backbone/ResNet.py.
  torchvision models/resnet.py (Bottleneck, the ResNet-50/101/152 layouts and init).
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
    "resnet50": (3, 4, 6, 3),
    "resnet101": (3, 4, 23, 3),
    "resnet152": (3, 8, 36, 3),
}
#: The residual block of each registered depth (module docstring).
RESNET_BLOCKS = {name: "bottleneck" if name in ("resnet50", "resnet101", "resnet152")
                 else "basic" for name in RESNET_STAGE_SIZES}
#: Stems of `ResNetTrunk` (module docstring).
STEMS = ("cifar", "imagenet")
#: Residual blocks of `ResNetTrunk`: name -> channel expansion of a block's output.
BLOCK_EXPANSION = {"basic": 1, "bottleneck": 4}
#: torchvision's ResNet conv init, `kaiming_normal_(mode="fan_out", nonlinearity="relu")`.
he_normal_fan_out = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
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


class Bottleneck(nn.Module):
  """torchvision's Bottleneck: 1x1, 3x3 (stride), 1x1 to 4 x `planes`, and a shortcut."""
  planes: int
  strides: int = 1
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    out = BLOCK_EXPANSION["bottleneck"] * self.planes

    def conv(y, features, kernel, strides, name):
      return Conv(features, kernel, strides, padding=kernel // 2, use_bias=False,
                  impl=self.conv_impl, kernel_init=he_normal_fan_out, name=name)(y)

    y = nn.relu(batch_norm(conv(x, self.planes, 1, 1, "conv1"), train=train, mask=mask,
                           name="bn1"))
    y = nn.relu(batch_norm(conv(y, self.planes, 3, self.strides, "conv2"), train=train,
                           mask=mask, name="bn2"))
    y = batch_norm(conv(y, out, 1, 1, "conv3"), train=train, mask=mask, name="bn3")
    shortcut = x
    if self.strides != 1 or x.shape[-1] != out:
      shortcut = batch_norm(conv(x, out, 1, self.strides, "shortcut_conv"), train=train,
                            mask=mask, name="shortcut_bn")
    return nn.relu(y + shortcut)


class ResNetTrunk(nn.Module):
  """Stem and the four stages; output (B, 4, 4, 512 * expansion * width) for 32x32 inputs
  (CIFAR stem).

  Attributes:
    stage_sizes: blocks per stage, e.g. (2, 2, 2, 2) for ResNet18.
    width: width multiplier of every channel count.
    conv_impl: convolution implementation (`layers.CONV_IMPLS`).
    stem: one of `STEMS` (module docstring).
    block: one of `BLOCK_EXPANSION`: "basic" (BasicBlock) or "bottleneck" (module docstring).
  """
  stage_sizes: Sequence[int]
  width: float = 1.0
  conv_impl: str = "xla"
  stem: str = "cifar"
  block: str = "basic"

  @property
  def out_channels(self) -> int:
    return scale_width(_STAGE_CHANNELS[-1], self.width) * BLOCK_EXPANSION[self.block]

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    kernel_init = he_normal_fan_out if self.block == "bottleneck" else None
    if self.stem == "imagenet":
      x = Conv(scale_width(64, self.width), 7, 2, padding=3, use_bias=False,
               impl=self.conv_impl, kernel_init=kernel_init, name="conv1")(images)
    else:
      x = Conv(scale_width(64, self.width), 3, 1, padding=1, use_bias=False,
               impl=self.conv_impl, kernel_init=kernel_init, name="conv1")(images)
    x = nn.relu(batch_norm(x, train=train, mask=mask, name="bn1"))
    if self.stem == "imagenet":
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, (num_blocks, channels, stride) in enumerate(
        zip(self.stage_sizes, _STAGE_CHANNELS, _STAGE_STRIDES)):
      block_type = Bottleneck if self.block == "bottleneck" else BasicBlock
      for block in range(num_blocks):
        x = block_type(scale_width(channels, self.width), stride if block == 0 else 1,
                       self.conv_impl, name=f"layer{stage + 1}_{block}")(x, train=train, mask=mask)
      self.sow(STAGE_COLLECTION, f"stage{stage + 1}", x)  # kept only if asked (base.py)
    return x


def resnet(stage_sizes: Sequence[int], num_classes: int, *, width: float = 1.0,
           conv_impl: str = "xla", stem: str = "cifar", block: str = "basic") -> Classifier:
  """A ResNet with the given blocks per stage, stem and block (see module docstring)."""
  if stem not in STEMS:
    raise ValueError(f"resnet: `stem` must be one of {STEMS}, got {stem!r}.")
  if block not in BLOCK_EXPANSION:
    raise ValueError(f"resnet: `block` must be one of {tuple(BLOCK_EXPANSION)}, got {block!r}.")
  trunk = ResNetTrunk(tuple(stage_sizes), width, conv_impl, stem, block)
  return Classifier(trunk=trunk, tail=GlobalPoolTail(trunk.out_channels),
                    num_classes=num_classes)

"""Small CNNs: FCCL+'s SimpleCNN, the FedAvg MNIST and CIFAR CNNs, GLFC's LeNet.

All are `Classifier(trunk, tail, head)` models on 32x32x3 inputs; the trunk is
the convolutional part up to and including the last pooling layer (the
feature map FedFusion fuses), the tail flattens and applies the fully
connected layers.

* SimpleCNN (FCCL+ Table XVIII; RethinkFL backbone/SimpleCNN.py): conv5x5
  3 -> 6 VALID + ReLU + max-pool 2, conv5x5 6 -> 16 VALID + ReLU + max-pool 2,
  flatten 400, Dense 120 + ReLU, Dense 84 + ReLU ("fc1", "fc2"), projection
  Dense 84 ("l1") + ReLU, Dense 256 ("l2") = features (no ReLU after l2), head
  256 -> C. 92,626 parameters with 10 classes.
* FedAvg MNIST CNN (McMahan et al. 2017, "CNN" of Sec. 3), here on 32x32x3:
  conv5x5 32 SAME + ReLU + max-pool 2, conv5x5 64 SAME + ReLU + max-pool 2,
  flatten 8*8*64, Dense 512 + ReLU = features, head 512 -> C.
* FedAvg CIFAR CNN (McMahan et al. 2017, the TensorFlow CIFAR-10 tutorial
  model without local response normalisation): conv5x5 64 SAME + ReLU +
  max-pool 3x3 stride 2 SAME, twice, flatten 8*8*64, Dense 384 + ReLU, Dense
  192 + ReLU = features, head 192 -> C.
* Both FedAvg CNNs take `dropout_rate` (default 0: none): dropout after the
  ReLU of every fully connected layer in train mode, as FedMMD/FedFusion
  (Yao et al. 2019, Sec. 4.1) describe them ("with a ReLU activation and
  random dropout"); the authors' FedFusion code uses p = 0.2 (after fc 512 of
  the MNIST CNN, after fc 384 and fc 192 of the CIFAR CNN). The FedFusion
  code's MNIST CNN differs from McMahan's otherwise too (3x3 second conv,
  3x3 stride-2 pools on 28x28 inputs); the trunk here stays McMahan's.
* LeNet gradient encoder (DLG, used by GLFC's proxy server): conv5x5 3 -> 12
  stride 2 pad 2 + sigmoid, conv5x5 12 -> 12 stride 2 pad 2 + sigmoid,
  conv5x5 12 -> 12 stride 1 pad 2 + sigmoid, flatten 12*8*8 = 768 = features,
  head 768 -> C (C = 100 in GLFC). Every weight and bias is U(-0.5, 0.5) (DLG's
  `weights_init`). It is a fixed encoder (never trained) but differentiable
  w.r.t. its input and parameters. Flattening is NHWC (torch flattens NCHW):
  a permutation of the head's input rows, irrelevant for a random encoder.

The width multiplier scales every conv and hidden layer, so feature dims are
scaled too (e.g. SimpleCNN 256 * width).

References:
  [FedAvg] H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Aguera y Arcas.
    Communication-Efficient Learning of Deep Networks from Decentralized Data.
    AISTATS 2017.
  [DLG] L. Zhu, Z. Liu, S. Han. Deep Leakage from Gradients. NeurIPS 2019.
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022.
  WenkeHuang/RethinkFL backbone/SimpleCNN.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_het.models.base import STAGE_COLLECTION, Classifier, MLPTail
from fedjax_het.models.layers import Conv, max_pool, scale_width, uniform_init

#: Bound of LeNet's uniform initialisation (weights and biases).
LENET_INIT_BOUND = 0.5


class SimpleCNNTrunk(nn.Module):
  """Two VALID 5x5 convs with ReLU and 2x2 max-pools; (B, 5, 5, 16 * width).

  Each conv + pool stage's output is sown into `base.STAGE_COLLECTION` (kept
  only on request).
  """
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return scale_width(16, self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del train, mask
    x = images
    for i, channels in enumerate((scale_width(6, self.width), self.out_channels)):
      x = nn.relu(Conv(channels, 5, padding=0, impl=self.conv_impl, name=f"conv{i + 1}")(x))
      x = max_pool(x, 2, strides=2, impl=self.conv_impl)
      self.sow(STAGE_COLLECTION, f"stage{i + 1}", x)  # kept only if asked (base.py)
    return x


class FedAvgCNNTrunk(nn.Module):
  """Two SAME 5x5 convs with ReLU and max-pools; (B, 8, 8, 64 * width).

  Attributes:
    channels: output channels of the two convs ((32, 64) MNIST CNN, (64, 64)
      CIFAR CNN), before width scaling.
    pool_window: 2 (MNIST CNN: 2x2 stride 2) or 3 (CIFAR CNN: 3x3 stride 2
      SAME).
  """
  channels: tuple[int, int]
  pool_window: int
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return scale_width(self.channels[-1], self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del train, mask
    x = images
    for i, channels in enumerate(self.channels):
      x = Conv(scale_width(channels, self.width), 5, padding=2, impl=self.conv_impl,
               name=f"conv{i + 1}")(x)
      x = max_pool(nn.relu(x), self.pool_window, strides=2, padding="SAME",
                   impl=self.conv_impl)
    return x


class LeNetTrunk(nn.Module):
  """DLG's LeNet body: three 5x5 convs with sigmoid; (B, 8, 8, 12 * width)."""
  width: float = 1.0
  conv_impl: str = "xla"

  @property
  def out_channels(self) -> int:
    return scale_width(12, self.width)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool,
               mask: jax.Array | None = None) -> jax.Array:
    del train, mask
    init = uniform_init(LENET_INIT_BOUND)
    x = images
    for i, stride in enumerate((2, 2, 1)):
      x = Conv(self.out_channels, 5, stride, padding=2, impl=self.conv_impl, kernel_init=init,
               bias_init=init, name=f"conv{i + 1}")(x)
      x = jax.nn.sigmoid(x)
    return x


def simple_cnn(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla") -> Classifier:
  """FCCL+ SimpleCNN (see module docstring)."""
  trunk = SimpleCNNTrunk(width, conv_impl)
  tail = MLPTail(5 * 5 * trunk.out_channels,
                 tuple(scale_width(c, width) for c in (120, 84, 84, 256)),
                 names=("fc1", "fc2", "l1", "l2"), activate_last=False)
  return Classifier(trunk=trunk, tail=tail, num_classes=num_classes)


def _check_dropout_rate(fn: str, rate: float) -> float:
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
    raise ValueError(f"{fn}: `dropout_rate` must be a number in [0, 1), got {rate!r}.")
  return float(rate)


def fedavg_mnist_cnn(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla",
                     dropout_rate: float = 0.0) -> Classifier:
  """FedAvg MNIST CNN on 32x32x3 inputs (see module docstring); `dropout_rate` after fc 512."""
  trunk = FedAvgCNNTrunk((32, 64), 2, width, conv_impl)
  tail = MLPTail(8 * 8 * trunk.out_channels, (scale_width(512, width),),
                 dropout_rate=_check_dropout_rate("fedavg_mnist_cnn", dropout_rate))
  return Classifier(trunk=trunk, tail=tail, num_classes=num_classes)


def fedavg_cifar_cnn(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla",
                     dropout_rate: float = 0.0) -> Classifier:
  """FedAvg CIFAR CNN (see module docstring); `dropout_rate` after fc 384 and fc 192."""
  trunk = FedAvgCNNTrunk((64, 64), 3, width, conv_impl)
  tail = MLPTail(8 * 8 * trunk.out_channels, (scale_width(384, width), scale_width(192, width)),
                 dropout_rate=_check_dropout_rate("fedavg_cifar_cnn", dropout_rate))
  return Classifier(trunk=trunk, tail=tail, num_classes=num_classes)


def lenet_encoder(num_classes: int, *, width: float = 1.0, conv_impl: str = "xla",
                  image_size: int = 32) -> Classifier:
  """GLFC/DLG LeNet gradient encoder (see module docstring) for image_size x image_size inputs.

  The two stride-2 convolutions leave ceil(image_size / 4) squared positions (8 x 8 at 32 px,
  16 x 16 at 64 px) for the linear layer.
  """
  if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
    raise ValueError(f"lenet_encoder: `image_size` must be an integer >= 1, got {image_size!r}.")
  side = -(-(-(-image_size // 2)) // 2)
  trunk = LeNetTrunk(width, conv_impl)
  return Classifier(trunk=trunk, tail=MLPTail(side * side * trunk.out_channels),
                    num_classes=num_classes, head_init_bound=LENET_INIT_BOUND)

"""Model registry: `get_model(name, num_classes, *, width, conv_impl, **kwargs)`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn

from fedjax_het.models.base import Classifier
from fedjax_het.models.efficientnet import efficientnet_b0
from fedjax_het.models.fedfusion import FUSION_OPERATORS, FedFusion, FusionOperator
from fedjax_het.models.googlenet import googlenet
from fedjax_het.models.htfl import htfl_cnn
from fedjax_het.models.layers import check_compute_dtype, check_conv_impl
from fedjax_het.models.mobilenet import mobilenet_v2
from fedjax_het.models.resnet import RESNET_BLOCKS, RESNET_STAGE_SIZES, resnet
from fedjax_het.models.small_cnns import (fedavg_cifar_cnn, fedavg_mnist_cnn, lenet_encoder,
                                          simple_cnn)


def _resnet_builder(name: str) -> Callable[..., Classifier]:
  def build(num_classes: int, *, width: float, conv_impl: str, stem: str = "cifar") -> Classifier:
    return resnet(RESNET_STAGE_SIZES[name], num_classes, width=width, conv_impl=conv_impl,
                  stem=stem, block=RESNET_BLOCKS[name])
  return build


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "resnet10": _resnet_builder("resnet10"),
    "resnet12": _resnet_builder("resnet12"),
    "resnet18": _resnet_builder("resnet18"),
    "resnet34": _resnet_builder("resnet34"),
    # torchvision's Bottleneck ResNets (HtFLlib's HtFE8 group): CIFAR stem by default.
    "resnet50": _resnet_builder("resnet50"),
    "resnet101": _resnet_builder("resnet101"),
    "resnet152": _resnet_builder("resnet152"),
    "efficientnet_b0": efficientnet_b0,
    "mobilenet_v2": mobilenet_v2,
    "googlenet": googlenet,
    "simple_cnn": simple_cnn,
    "fedavg_mnist_cnn": fedavg_mnist_cnn,
    "fedavg_cifar_cnn": fedavg_cifar_cnn,
    # GLFC: the CIFAR ResNet-18; its head grows with `grow_classifier`.
    "glfc_resnet18": _resnet_builder("resnet18"),
    "lenet_encoder": lenet_encoder,
    # HtFLlib's 4-layer CNN (FedAvgCNN, dim 1600): the first backbone of its HtFE groups.
    "htfl_cnn": htfl_cnn,
}

#: Extra keyword arguments (and their defaults) accepted per model.
MODEL_KWARGS: dict[str, dict[str, Any]] = {
    "efficientnet_b0": {"dropout_rate": 0.2, "drop_connect_rate": 0.0},
    "fedavg_mnist_cnn": {"dropout_rate": 0.0},
    "fedavg_cifar_cnn": {"dropout_rate": 0.0},
    "fedfusion": {"base": "fedavg_cifar_cnn", "fusion": "multi"},
    # GLFC's ResNet-18 at 32, 64 or 224 px: "cifar" or "imagenet" stem (models/resnet.py).
    "glfc_resnet18": {"stem": "cifar"},
    # torchvision's ResNet-50/101/152: "imagenet" is HtFLlib's stem (models/resnet.py).
    "resnet50": {"stem": "cifar"},
    "resnet101": {"stem": "cifar"},
    "resnet152": {"stem": "cifar"},
    # GLFC's LeNet encoder: its linear layer's input follows the image side.
    "lenet_encoder": {"image_size": 32},
}

#: Every name `get_model` accepts ("fedfusion" wraps any of the others).
MODEL_NAMES = tuple(_BUILDERS) + ("fedfusion",)


def _check_common(name: str, num_classes: Any, width: Any, conv_impl: Any) -> None:
  if not isinstance(name, str) or name not in MODEL_NAMES:
    raise ValueError(f"Unknown model name {name!r}; valid names are {MODEL_NAMES}.")
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f"`num_classes` must be an int >= 1, got {num_classes!r}.")
  if (isinstance(width, bool) or not isinstance(width, (int, float))
      or not math.isfinite(width) or width <= 0):
    raise ValueError(f"`width` must be a finite number > 0, got {width!r}.")
  check_conv_impl(conv_impl)


def get_model(name: str, num_classes: int, *, width: float = 1.0, conv_impl: str = "xla",
              compute_dtype: str = "float32", **kwargs: Any) -> nn.Module:
  """Builds a zoo model for 32x32x3 inputs.

  Every model is called as `model(images, *, train) -> (features, logits)`,
  has a `feature_dim` attribute (after width scaling) and a final
  `nn.Dense` named "head"; see `init_variables` and `apply_model`.

  Args:
    name: one of `MODEL_NAMES`.
    num_classes: outputs of the head.
    width: width multiplier; every channel / hidden count c becomes
      max(1, round(c * width)).
    conv_impl: one of `layers.CONV_IMPLS`: "xla" (stock convolution, best on
      GPU/TPU), "im2col" or "custom_vjp" (fast inside `lax.scan` on XLA:CPU).
    compute_dtype: one of `layers.COMPUTE_DTYPES`: "float32", or "bfloat16"
      for a bfloat16 forward/backward pass with float32 parameters, BatchNorm
      statistics, features and logits (see `Classifier`).
    **kwargs: model-specific options, see `MODEL_KWARGS`:
      efficientnet_b0: dropout_rate (0.2), drop_connect_rate (0.0);
      fedavg_mnist_cnn, fedavg_cifar_cnn: dropout_rate (0.0; FedFusion's code: 0.2);
      fedfusion: base (a registry name other than "fedfusion", default
      "fedavg_cifar_cnn"), fusion ("conv", "multi" or "single"; default "multi").

  Returns:
    An unbound `flax.linen.Module`.

  Raises:
    ValueError: unknown name, keyword or value (the message lists the valid ones).
  """
  _check_common(name, num_classes, width, conv_impl)
  check_compute_dtype(compute_dtype)
  model = _build(name, num_classes, width, conv_impl, kwargs)
  return model if compute_dtype == "float32" else model.clone(compute_dtype=compute_dtype)


def _build(name: str, num_classes: int, width: float, conv_impl: str,
           kwargs: dict[str, Any]) -> nn.Module:
  allowed = MODEL_KWARGS.get(name, {})
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"get_model({name!r}): unknown keyword argument(s) {unknown}; valid "
                     f"extra keywords for {name!r} are {tuple(allowed)}.")
  if name != "fedfusion":
    return _BUILDERS[name](num_classes, width=width, conv_impl=conv_impl, **kwargs)
  options = {**allowed, **kwargs}
  base_name, fusion = options["base"], options["fusion"]
  bases = tuple(_BUILDERS)
  if base_name not in bases:
    raise ValueError(f"get_model('fedfusion'): `base` must be one of {bases}, got "
                     f"{base_name!r}.")
  if fusion not in FUSION_OPERATORS:
    raise ValueError(f"get_model('fedfusion'): `fusion` must be one of {FUSION_OPERATORS}, "
                     f"got {fusion!r}.")
  local = _BUILDERS[base_name](num_classes, width=width, conv_impl=conv_impl)
  frozen = _BUILDERS[base_name](num_classes, width=width, conv_impl=conv_impl)
  return FedFusion(local_trunk=local.trunk, global_trunk=frozen.trunk,
                   fusion=FusionOperator(fusion, conv_impl), tail=local.tail,
                   num_classes=num_classes, head_init_bound=local.head_init_bound)

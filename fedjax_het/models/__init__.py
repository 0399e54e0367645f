"""Model zoo for 32x32 RGB inputs, as pure functions the engine can vmap.

Why Flax Linen (not NNX): a Linen module is a stateless description; its
variables are an explicit dict {"params", "batch_stats"} passed into
`init`/`apply` and returned out of them. `init_variables` and `apply_model`
are therefore pure functions of (key) and (variables, images), and
`jax.vmap` over a stack of client keys or client variables, `jax.lax.scan`
over local steps and `jax.jit` apply to them directly, with the BatchNorm
update returned rather than mutated in place. NNX modules own their state as
Python objects: every jit/vmap/scan boundary would need `nnx.split`/
`nnx.merge` (or the nnx.* transform wrappers) to get the same pytrees.

Models (`get_model(name, num_classes, *, width=1.0, conv_impl="xla", **kw)`):

  name               feature dim  architecture
  resnet10/12/18/34  512          CIFAR ResNet, BasicBlock [1,1,1,1]/[2,1,1,1]/[2,2,2,2]/[3,4,6,3]
  resnet50/101/152   2048         torchvision's Bottleneck ResNet [3,4,6,3]/[3,4,23,3]/[3,8,36,3]
                                  (CIFAR stem by default; stem="imagenet" is torchvision's)
  efficientnet_b0    320          CIFAR EfficientNet-B0 (SE, dropout 0.2 on the pooled feature)
  mobilenet_v2       1280         CIFAR MobileNetV2
  googlenet          1024         CIFAR GoogLeNet
  simple_cnn         256          FCCL+ SimpleCNN (Table XVIII)
  fedavg_mnist_cnn   512          FedAvg MNIST CNN (on 32x32x3; dropout_rate, default 0)
  fedavg_cifar_cnn   192          FedAvg CIFAR CNN (dropout_rate, default 0)
  glfc_resnet18      512          GLFC's CIFAR ResNet-18 (grow its head with grow_classifier)
  lenet_encoder      768          DLG/GLFC LeNet gradient encoder (sigmoid, U(-0.5, 0.5) init)
  htfl_cnn           512          HtFLlib's 4-layer CNN (FedAvgCNN, dim 1600)
  fedfusion          base's       FedFusion wrapper: base=<name above>, fusion=conv|multi|single

Feature dims scale with `width` (channel counts c -> max(1, round(c * width)); MobileNetV2 and
EfficientNet-B0 round to a multiple of 8, at least 8, as their reference code does).

Contract of every model: `model(images, *, train, mask=None) -> (features,
logits)` with images (B, 32, 32, 3) float32 NHWC (normalised), an optional
(B,) bool mask of the real rows of a padded batch (train-mode BatchNorm
statistics use only those rows), features (B, feature_dim) the pooled
features fed to the classifier, logits (B, num_classes); the
classifier is `nn.Dense` named "head"; `model.feature_dim` is known before
init; BatchNorm is `nn.BatchNorm(momentum=0.9, epsilon=1e-5)` (torch's
0.1 / 1e-5) with batch statistics iff `train`; dropout is active iff `train`.
Every model is `trunk -> tail -> head` (see `base`), so FedFusion can fuse the
trunk feature maps of any base model.

All convolutions go through `layers.Conv`; `conv_impl` chooses the
implementation ("xla" stock conv, best on GPU/TPU; "im2col" or "custom_vjp",
which avoid the 22-37x slowdown of conv gradients inside `lax.scan` on
XLA:CPU). Parameters are identical across implementations.

Mixed precision: `get_model(..., compute_dtype="bfloat16")` runs the forward and
backward passes in bfloat16 (parameters and images cast inside `apply_model`)
while parameters, BatchNorm statistics, features, logits, losses and optimiser
state stay float32. Measured on one H100 (benchmarks/arch_steps.py, batch 256,
a local Adam step inside `lax.scan`): 1.7x faster for ResNet10/12, 1.4x for
MobileNetV2, 1.08x for EfficientNet-B0; slower on CPU (no bfloat16 units).

Functional API:
  init_variables(model, key, *, input_shape=(1, 32, 32, 3)) -> variables
  apply_model(model, variables, images, *, train, rng=None, mask=None)
      -> (features, logits, new_variables)
  apply_model_with_trunk(...same...) -> (trunk feature map, features, logits, new_variables)
  model_summary(name, num_classes=10, *, width=1.0) -> {"params", "flops", "feature_dim", ...}
  grow_classifier(variables, *, num_new_classes, key) -> variables (GLFC)
  with_feature_dim(model, dim) -> the model with its features pooled to dim (HtFLlib's
      BaseHeadSplit: AdaptiveAvgPool1d(512) before the head)
  with_dropout(model, rate) -> the model with dropout in its tail (train mode only)
  fedfusion_trainable_mask(params), fedfusion_local_variables(variables),
  fedfusion_set_global(variables, base_variables, *, also_local=False)
"""

from fedjax_het.models.base import Classifier, GlobalPoolTail, MLPTail, with_dropout
from fedjax_het.models.fedfusion import (FUSION_OPERATORS, FedFusion, FusionOperator,
                                         fedfusion_local_variables, fedfusion_set_global,
                                         fedfusion_trainable_mask)
from fedjax_het.models.functional import (apply_model, apply_model_with_trunk, count_parameters,
                                          grow_classifier, init_variables, model_summary)
from fedjax_het.models.htfl import (HTFL_FEATURE_DIM, PooledTail, adaptive_pool_matrix,
                                    with_feature_dim)
from fedjax_het.models.layers import (COMPUTE_DTYPES, CONV_IMPLS, Conv, batch_norm, conv2d,
                                      divisible_width, max_pool, scale_width)
from fedjax_het.models.registry import MODEL_KWARGS, MODEL_NAMES, get_model

__all__ = [
    "COMPUTE_DTYPES", "CONV_IMPLS", "FUSION_OPERATORS", "HTFL_FEATURE_DIM", "MODEL_KWARGS",
    "MODEL_NAMES", "PooledTail", "adaptive_pool_matrix", "with_feature_dim",
    "Classifier", "Conv", "FedFusion", "FusionOperator", "GlobalPoolTail", "MLPTail",
    "apply_model", "apply_model_with_trunk", "batch_norm", "conv2d", "count_parameters", "divisible_width",
    "fedfusion_local_variables", "fedfusion_set_global", "fedfusion_trainable_mask", "get_model", "grow_classifier",
    "init_variables", "max_pool", "model_summary", "scale_width", "with_dropout",
]

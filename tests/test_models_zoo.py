"""The model zoo: registry, parameter counts, shapes, BatchNorm, vmap/scan/jit use."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.models import layers

TINY = 0.125  # width of the default-suite models
BATCH = 2
NC = 4  # classes of the default-suite models (one shape per model: jit caches are reused)

# ---------------------------------------------------------------------------
# Parameter counts by hand: PyTorch's count (conv/linear weights and biases,
# BatchNorm scale and shift; running statistics are state). These helpers
# multiply layer shapes from the architecture tables, independently of the
# Flax code; `w` scales channel counts like the zoo (max(1, round(c * w)), and
# for MobileNetV2 / EfficientNet-B0 the multiple-of-8 rounding of `_c8`).
# ---------------------------------------------------------------------------


def _c(channels, w):
  return max(1, int(round(channels * w)))


def _c8(channels, w):
  """MobileNetV2 / EfficientNet widths: nearest multiple of 8, at least 8, +8 if >10% lost."""
  value = channels * w
  down = max(8, 8 * int((value + 4) // 8))
  return down + 8 if down < 0.9 * value else down


def conv(k, cin, cout, bias=False, groups=1):
  return k * k * (cin // groups) * cout + (cout if bias else 0)


def bn(c):
  return 2 * c


def linear(i, o):
  return i * o + o


def resnet_params(blocks, num_classes=10, w=1.0):
  total = conv(3, 3, _c(64, w)) + bn(_c(64, w))
  cin = _c(64, w)
  for n, planes, stride in zip(blocks, (64, 128, 256, 512), (1, 2, 2, 2)):
    planes = _c(planes, w)
    for i in range(n):
      s = stride if i == 0 else 1
      total += conv(3, cin, planes) + bn(planes) + conv(3, planes, planes) + bn(planes)
      if s != 1 or cin != planes:
        total += conv(1, cin, planes) + bn(planes)
      cin = planes
  return total + linear(cin, num_classes)


def bottleneck_resnet_params(blocks, num_classes=10, w=1.0):
  total = conv(3, 3, _c(64, w)) + bn(_c(64, w))
  cin = _c(64, w)
  for n, planes in zip(blocks, (64, 128, 256, 512)):
    planes = _c(planes, w)
    for i in range(n):
      total += conv(1, cin, planes) + bn(planes) + conv(3, planes, planes) + bn(planes)
      total += conv(1, planes, 4 * planes) + bn(4 * planes)
      if i == 0:
        total += conv(1, cin, 4 * planes) + bn(4 * planes)
      cin = 4 * planes
  return total + linear(cin, num_classes)


def efficientnet_b0_params(num_classes=10, w=1.0):
  stages = [(1, 16, 1, 3, 1), (6, 24, 2, 3, 2), (6, 40, 2, 5, 2), (6, 80, 3, 3, 2),
            (6, 112, 3, 5, 1), (6, 192, 4, 5, 2), (6, 320, 1, 3, 1)]
  total = conv(3, 3, _c8(32, w)) + bn(_c8(32, w))
  cin = _c8(32, w)
  for t, c, n, k, _ in stages:
    for _ in range(n):
      out, mid, se = _c8(c, w), t * cin, max(1, int(cin * 0.25))
      if t != 1:
        total += conv(1, cin, mid) + bn(mid)
      total += conv(k, mid, mid, groups=mid) + bn(mid)
      total += conv(1, mid, se, bias=True) + conv(1, se, mid, bias=True)
      total += conv(1, mid, out) + bn(out)
      cin = out
  return total + linear(cin, num_classes)


def mobilenet_v2_params(num_classes=10, w=1.0):
  stages = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]
  total = conv(3, 3, _c8(32, w)) + bn(_c8(32, w))
  cin = _c8(32, w)
  for t, c, n, s in stages:
    for i in range(n):
      out, mid, stride = _c8(c, w), t * cin, s if i == 0 else 1
      total += conv(1, cin, mid) + bn(mid) + conv(3, mid, mid, groups=mid) + bn(mid)
      total += conv(1, mid, out) + bn(out)
      if stride == 1 and cin != out:
        total += conv(1, cin, out) + bn(out)
      cin = out
  last = _c8(1280, w)
  return total + conv(1, cin, last) + bn(last) + linear(last, num_classes)


def googlenet_params(num_classes=10, w=1.0):
  cells = [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), (192, 96, 208, 16, 48, 64),
           (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
           (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128),
           (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)]
  cbr = lambda k, i, o: conv(k, i, o, bias=True) + bn(o)  # noqa: E731
  total = cbr(3, 3, _c(192, w))
  cin = _c(192, w)
  for cell in cells:
    n1, r3, n3, r5, n5, pp = (_c(c, w) for c in cell)
    total += cbr(1, cin, n1) + cbr(1, cin, r3) + cbr(3, r3, n3)
    total += cbr(1, cin, r5) + cbr(3, r5, n5) + cbr(3, n5, n5) + cbr(1, cin, pp)
    cin = n1 + n3 + n5 + pp
  return total + linear(cin, num_classes)


def simple_cnn_params(num_classes=10, w=1.0):
  c1, c2 = _c(6, w), _c(16, w)
  h = [_c(x, w) for x in (120, 84, 84, 256)]
  return (conv(5, 3, c1, bias=True) + conv(5, c1, c2, bias=True) + linear(25 * c2, h[0])
          + linear(h[0], h[1]) + linear(h[1], h[2]) + linear(h[2], h[3])
          + linear(h[3], num_classes))


def fedavg_mnist_cnn_params(num_classes=10, w=1.0):
  c1, c2, f = _c(32, w), _c(64, w), _c(512, w)
  return (conv(5, 3, c1, bias=True) + conv(5, c1, c2, bias=True) + linear(64 * c2, f)
          + linear(f, num_classes))


def fedavg_cifar_cnn_params(num_classes=10, w=1.0):
  c, f1, f2 = _c(64, w), _c(384, w), _c(192, w)
  return (conv(5, 3, c, bias=True) + conv(5, c, c, bias=True) + linear(64 * c, f1)
          + linear(f1, f2) + linear(f2, num_classes))


def htfl_cnn_params(num_classes=10, w=1.0):
  c1, c2, f = _c(32, w), _c(64, w), _c(512, w)
  return (conv(5, 3, c1, bias=True) + conv(5, c1, c2, bias=True) + linear(25 * c2, f)
          + linear(f, num_classes))


def lenet_params(num_classes=10, w=1.0):
  c = _c(12, w)
  return (conv(5, 3, c, bias=True) + 2 * conv(5, c, c, bias=True)
          + linear(64 * c, num_classes))


HAND_COUNTS = {
    "resnet10": lambda nc, w: resnet_params((1, 1, 1, 1), nc, w),
    "resnet12": lambda nc, w: resnet_params((2, 1, 1, 1), nc, w),
    "resnet18": lambda nc, w: resnet_params((2, 2, 2, 2), nc, w),
    "resnet34": lambda nc, w: resnet_params((3, 4, 6, 3), nc, w),
    "resnet50": lambda nc, w: bottleneck_resnet_params((3, 4, 6, 3), nc, w),
    "resnet101": lambda nc, w: bottleneck_resnet_params((3, 4, 23, 3), nc, w),
    "resnet152": lambda nc, w: bottleneck_resnet_params((3, 8, 36, 3), nc, w),
    "glfc_resnet18": lambda nc, w: resnet_params((2, 2, 2, 2), nc, w),
    "efficientnet_b0": efficientnet_b0_params,
    "mobilenet_v2": mobilenet_v2_params,
    "googlenet": googlenet_params,
    "simple_cnn": simple_cnn_params,
    "fedavg_mnist_cnn": fedavg_mnist_cnn_params,
    "fedavg_cifar_cnn": fedavg_cifar_cnn_params,
    "lenet_encoder": lenet_params,
    "htfl_cnn": htfl_cnn_params,
    # FedFusion(fedavg_cifar_cnn, multi): the base + the frozen trunk copy + gamma (C,).
    "fedfusion": lambda nc, w: (fedavg_cifar_cnn_params(nc, w) + conv(5, 3, _c(64, w), True)
                                + conv(5, _c(64, w), _c(64, w), True) + _c(64, w)),
}

# Width 1, 10 classes (PyTorch `sum(p.numel() for p in model.parameters())`).
EXPECTED_PARAMS = {
    "resnet10": 4_903_242,
    "resnet12": 4_977_226,
    "resnet18": 11_173_962,  # the known CIFAR ResNet-18 count
    "resnet34": 21_282_122,  # the known CIFAR ResNet-34 count
    # torchvision's totals (1000 classes, 7x7 stem) - 2,049,000 (fc) - 7,680 (7x7 -> 3x3
    # stem) + 20,490 (a 10-class head).
    "resnet50": 23_520_842,  # 25,557,032
    "resnet101": 42_512_970,  # 44,549,160
    "resnet152": 58_156_618,  # 60,192,808
    "glfc_resnet18": 11_173_962,
    # torch counts 3,599,686: its block 1 also builds an unused 32->32 expansion
    # conv + BN (1,024 + 64 parameters) that this model does not create.
    "efficientnet_b0": 3_598_598,
    "mobilenet_v2": 2_296_922,  # the known kuangliu count
    "googlenet": 6_166_250,  # the known kuangliu count
    "simple_cnn": 92_626,  # 456 + 2416 + 48120 + 10164 + 7140 + 21760 + 2570
    "fedavg_mnist_cnn": 2_156_490,  # 2432 + 51264 + 2097664 + 5130
    "fedavg_cifar_cnn": 1_756_426,  # 4864 + 102464 + 1573248 + 73920 + 1930
    "lenet_encoder": 15_826,  # 912 + 3612 + 3612 + 7690
    "htfl_cnn": 878_538,  # 2432 + 51264 + 819712 + 5130 (HtFLlib's FedAvgCNN, dim 1600)
    "fedfusion": 1_863_818,  # 1756426 + 4864 + 102464 + 64
}

EXPECTED_FEATURE_DIM = {
    "resnet10": 512, "resnet12": 512, "resnet18": 512, "resnet34": 512, "glfc_resnet18": 512,
    "resnet50": 2048, "resnet101": 2048, "resnet152": 2048,
    "efficientnet_b0": 320, "mobilenet_v2": 1280, "googlenet": 1024, "simple_cnn": 256,
    "fedavg_mnist_cnn": 512, "fedavg_cifar_cnn": 192, "lenet_encoder": 768, "fedfusion": 192,
    "htfl_cnn": 512,
}


def _images(batch=BATCH, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, 32, 32, 3)), jnp.float32)


def _param_count(model):
  shapes = jax.eval_shape(lambda k: models.init_variables(model, k), jax.random.key(0))
  return models.count_parameters(shapes["params"])


def test_registry_lists_every_model():
  assert set(models.MODEL_NAMES) == set(EXPECTED_PARAMS)
  assert len(models.MODEL_NAMES) == len(set(models.MODEL_NAMES))


def test_hand_counts_match_the_literals():
  for name, expected in EXPECTED_PARAMS.items():
    assert HAND_COUNTS[name](10, 1.0) == expected, name


# Slow: ResNet-101's and ResNet-152's abstract inits (3-6 s each on a 2-core CPU);
# tests/test_htfl_models.py::test_parameter_counts_are_torchvisions keeps their full-width
# counts (torchvision's, ImageNet stem) and feature dimension in the default suite, and
# ResNet-50 here the CIFAR stem of the Bottleneck ResNets.
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in ("resnet101", "resnet152") else n
    for n in sorted(EXPECTED_PARAMS)])
def test_parameter_count_full_width_matches_hand_count(name):
  model = models.get_model(name, 10)
  assert _param_count(model) == EXPECTED_PARAMS[name]
  assert model.feature_dim == EXPECTED_FEATURE_DIM[name]


# ResNet-101's and ResNet-152's abstract inits take 3-6 s each on a 2-core CPU: slow suite
# under a width multiplier (ResNet-50 checks the scaled bottleneck blocks;
# tests/test_htfl_models.py their full-width and width-1/8 counts in the default suite).
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in ("resnet101", "resnet152") else n
    for n in sorted(EXPECTED_PARAMS)])
@pytest.mark.parametrize("width,num_classes", [(0.25, 7), (0.125, 100)])
def test_parameter_count_under_width_multiplier(name, width, num_classes):
  model = models.get_model(name, num_classes, width=width)
  assert _param_count(model) == HAND_COUNTS[name](num_classes, width)
  if name == "googlenet":  # the sum of b5's four scaled branches
    expected_dim = sum(_c(c, width) for c in (384, 384, 128, 128))
  elif name == "lenet_encoder":  # flatten of the 8x8 map of 12 scaled channels
    expected_dim = 64 * _c(12, width)
  else:
    expected_dim = _c(EXPECTED_FEATURE_DIM[name], width)
  assert model.feature_dim == expected_dim


# The Bottleneck ResNets' init and forward compile for half a minute to minutes on a 2-core
# CPU (their counts and shapes are checked without compiling, tests/test_htfl_models.py).
DEEP_MODELS = ("resnet50", "resnet101", "resnet152")


def every_model_slow_for(*names: str) -> list:
  """Every registry model as a parameter, `names` and the deep models in the slow suite."""
  return [pytest.param(n, marks=pytest.mark.slow) if n in names or n in DEEP_MODELS else n
          for n in models.MODEL_NAMES]


# GoogLeNet's train-and-eval forward compiles for about 10 s on a 2-core CPU: slow suite;
# ResNet-34 too (5-8 s), whose basic blocks ResNet-10 and ResNet-18 check here.
@pytest.mark.parametrize("name", every_model_slow_for("googlenet", "resnet34"))
def test_output_shapes_feature_dims_and_head(name):
  model = models.get_model(name, NC, width=TINY)
  variables = models.init_variables(model, jax.random.key(0))
  assert set(variables) == {"params", "batch_stats"}
  d = model.feature_dim
  head = variables["params"]["head"]
  assert head["kernel"].shape == (d, NC) and head["bias"].shape == (NC,)
  for train in (False, True):
    features, logits, _ = models.apply_model(model, variables, _images(), train=train,
                                             rng=jax.random.key(1))
    assert features.shape == (BATCH, d) and logits.shape == (BATCH, NC)
    assert features.dtype == jnp.float32 and logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))
    # The logits are the head applied to the returned features.
    np.testing.assert_allclose(logits, features @ head["kernel"] + head["bias"][None, :],
                               rtol=1e-5, atol=1e-5)


BN_MODELS = ("resnet10", "resnet12", "resnet18", "resnet34", "glfc_resnet18",
             "efficientnet_b0", "mobilenet_v2", "googlenet") + DEEP_MODELS


# GoogLeNet's train and eval forward passes compile for about 12 s on a 2-core CPU: slow suite
# (the default suite checks its parameter counts and feature dimension without compiling);
# ResNet-34's too (its forward is slow in test_output_shapes_feature_dims_and_head), whose
# basic blocks' BatchNorm ResNet-10, ResNet-12 and ResNet-18 check here.
@pytest.mark.parametrize("name", every_model_slow_for("googlenet", "resnet34"))
def test_batch_norm_state_changes_in_train_mode_only(name):
  model = models.get_model(name, NC, width=TINY)
  variables = models.init_variables(model, jax.random.key(0))
  images = _images() * 2.0 + 1.0
  _, _, same = models.apply_model(model, variables, images, train=False)
  assert same is variables
  _, _, new = models.apply_model(model, variables, images, train=True, rng=jax.random.key(1))
  assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(variables)
  assert new["params"] is variables["params"]
  old_stats = jax.tree_util.tree_leaves_with_path(variables["batch_stats"])
  new_stats = jax.tree_util.tree_leaves(new["batch_stats"])
  assert bool(old_stats) == (name in BN_MODELS)
  changed_means = 0
  for (path, old), updated in zip(old_stats, new_stats):
    if jax.tree_util.keystr(path).endswith("['var']"):
      assert not np.allclose(old, updated), jax.tree_util.keystr(path)
    else:
      # A BN fed by BN -> bias-free 1x1 conv sees batch mean exactly 0 (e.g. the
      # expansion BNs of MobileNetV2/EfficientNet), so not every mean moves.
      changed_means += not np.allclose(old, updated)
  assert changed_means > 0 or name not in BN_MODELS


def test_batch_norm_uses_torch_momentum_and_biased_batch_variance():
  model = models.get_model("resnet10", NC, width=TINY)
  variables = models.init_variables(model, jax.random.key(0))
  images = _images() * 2.0 + 1.0
  _, _, new = models.apply_model(model, variables, images, train=True)
  stem = layers.conv2d(images, variables["params"]["trunk"]["conv1"]["kernel"], padding=1)
  stats = new["batch_stats"]["trunk"]["bn1"]
  # running = 0.9 * running + 0.1 * batch, from mean 0 and var 1.
  np.testing.assert_allclose(stats["mean"], 0.1 * jnp.mean(stem, axis=(0, 1, 2)), rtol=1e-4,
                             atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * jnp.var(stem, axis=(0, 1, 2)), rtol=1e-4)


def _ce(logits, labels):
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))


def _make_train_step(model, lr):
  def loss_fn(params, variables, images, labels, rng):
    features, logits, new = models.apply_model(model, {**variables, "params": params}, images,
                                               train=True, rng=rng)
    return _ce(logits, labels), new

  @jax.jit
  def step(variables, images, labels, rng):
    (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"],
                                                                   variables, images, labels, rng)
    params = jax.tree_util.tree_map(lambda p, g: p - lr * g, variables["params"], grads)
    return {**new, "params": params}, loss, grads

  return step


# GoogLeNet's, EfficientNet-B0's, MobileNetV2's, ResNet-34's and ResNet-12's jitted steps compile
# for 4-15 s on a 2-core CPU: slow suite (ResNet-10/18 keep the basic-block step in the default
# suite; ResNet-12 is their block with 2, 1, 1, 1 blocks a stage).
@pytest.mark.parametrize("name", every_model_slow_for("googlenet", "efficientnet_b0",
                                                     "mobilenet_v2", "resnet34", "resnet12"))
def test_jitted_sgd_train_step_reduces_the_loss(name):
  model = models.get_model(name, NC, width=TINY)
  variables = models.init_variables(model, jax.random.key(0))
  images, labels = _images(), jnp.array([0, 3])
  step = _make_train_step(model, lr=0.05)
  rng = jax.random.key(3)  # same dropout mask every step: a deterministic objective
  losses = []
  for _ in range(3):
    variables, loss, grads = step(variables, images, labels, rng)
    losses.append(float(loss))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0], losses
  assert float(jnp.max(jnp.abs(grads["head"]["kernel"]))) > 0


VMAP_MODELS = ["resnet10", pytest.param("efficientnet_b0", marks=pytest.mark.slow),
               "simple_cnn", "fedavg_cifar_cnn", "lenet_encoder",
               "fedfusion", pytest.param("mobilenet_v2", marks=pytest.mark.slow),
               pytest.param("googlenet", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", VMAP_MODELS)
def test_vmap_over_three_clients_equals_three_separate_calls(name):
  model = models.get_model(name, NC, width=TINY)
  keys = jax.random.split(jax.random.key(0), 3)
  stacked = jax.jit(jax.vmap(lambda k: models.init_variables(model, k)))(keys)
  # Init under vmap: client i equals a separate init with key i, clients differ.
  for i in (0, 2):
    single = models.init_variables(model, keys[i])
    jax.tree_util.tree_map(lambda a, b, i=i: np.testing.assert_allclose(a[i], b, rtol=1e-6),
                           stacked, single)
  k0 = stacked["params"]["head"]["kernel"]
  assert not np.allclose(k0[0], k0[1]) and not np.allclose(k0[1], k0[2])
  kernels = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(stacked["params"])
             if jax.tree_util.keystr(path).endswith("['kernel']")]
  assert len(kernels) > 1 and all(not np.allclose(k[0], k[1]) for k in kernels)

  images = jnp.stack([_images(BATCH, seed) for seed in range(3)])
  rngs = jax.random.split(jax.random.key(1), 3)
  features, logits, new = jax.jit(jax.vmap(
      lambda v, x, r: models.apply_model(model, v, x, train=True, rng=r)))(stacked, images, rngs)
  assert features.shape == (3, BATCH, model.feature_dim) and logits.shape == (3, BATCH, NC)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # noqa: E731
  for i in range(3):
    client = jax.tree_util.tree_map(lambda a, i=i: a[i], stacked)
    f_i, l_i, new_i = models.apply_model(model, client, images[i], train=True, rng=rngs[i])
    close(features[i], f_i)
    close(logits[i], l_i)
    jax.tree_util.tree_map(lambda a, b, i=i: close(a[i], b), new, new_i)


@pytest.mark.parametrize("conv_impl", models.CONV_IMPLS)
def test_apply_inside_scan_equals_python_loop(conv_impl):
  model = models.get_model("resnet10", NC, width=TINY, conv_impl=conv_impl)
  variables = models.init_variables(model, jax.random.key(0))
  xs = jnp.stack([_images(BATCH, s) for s in range(3)])

  def body(v, x):
    _, logits, v = models.apply_model(model, v, x, train=True)
    return v, logits

  final, logits = jax.jit(lambda v, xs: jax.lax.scan(body, v, xs))(variables, xs)
  v = variables
  for t in range(3):
    v, logits_t = body(v, xs[t])
    np.testing.assert_allclose(logits[t], logits_t, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         final, v)


@pytest.mark.parametrize("name", ["resnet10", "fedavg_cifar_cnn",
                                  pytest.param("mobilenet_v2", marks=pytest.mark.slow),
                                  pytest.param("efficientnet_b0", marks=pytest.mark.slow),
                                  pytest.param("googlenet", marks=pytest.mark.slow)])
@pytest.mark.parametrize("conv_impl", ["im2col", "custom_vjp"])
def test_conv_impls_give_the_same_model_outputs_and_gradients(name, conv_impl):
  ref_model = models.get_model(name, NC, width=TINY)
  model = models.get_model(name, NC, width=TINY, conv_impl=conv_impl)
  variables = models.init_variables(ref_model, jax.random.key(0))
  images, labels = _images(), jnp.array([0, 2])

  def loss(params, m):
    _, logits, _ = models.apply_model(m, {**variables, "params": params}, images, train=True,
                                      rng=jax.random.key(0))
    return _ce(logits, labels)

  ref_loss, ref_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, ref_model)))(
      variables["params"])
  got_loss, got_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, model)))(
      variables["params"])
  np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5)
  # Whole-network gradients: float rounding of the conv is amplified by
  # train-mode BatchNorm on tiny batches (2 x 2 x 2 values per channel at the
  # end of MobileNetV2), so the bound is looser than the per-layer 1e-5.
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4 * max(1.0, float(
          jnp.max(jnp.abs(b))))), got_grads, ref_grads)


def test_dropout_needs_rng_in_train_mode_and_is_off_in_eval():
  model = models.get_model("efficientnet_b0", NC, width=TINY)
  assert model.needs_dropout_rng
  assert not models.get_model("resnet10", 3).needs_dropout_rng
  variables = models.init_variables(model, jax.random.key(0))
  images = _images()
  with pytest.raises(ValueError, match="rng"):
    models.apply_model(model, variables, images, train=True)
  f1, _, _ = models.apply_model(model, variables, images, train=True, rng=jax.random.key(1))
  f2, _, _ = models.apply_model(model, variables, images, train=True, rng=jax.random.key(2))
  assert not np.allclose(f1, f2)  # dropout on the pooled feature
  assert np.mean(np.asarray(f1) == 0.0) > 0.05  # ~20% dropped
  e1, _, _ = models.apply_model(model, variables, images, train=False, rng=jax.random.key(1))
  e2, _, _ = models.apply_model(model, variables, images, train=False)
  np.testing.assert_array_equal(e1, e2)
  # No dropout: the tail returns exactly the pooled feature.
  plain = models.get_model("efficientnet_b0", NC, width=TINY, dropout_rate=0.0)
  assert not plain.needs_dropout_rng
  p1, _, _ = models.apply_model(plain, variables, images, train=True)
  assert np.all(np.asarray(p1) != 0.0)


def test_drop_connect_option_is_stochastic_per_example():
  model = models.get_model("efficientnet_b0", NC, width=TINY, dropout_rate=0.0,
                           drop_connect_rate=0.5)
  assert model.needs_dropout_rng
  variables = models.init_variables(model, jax.random.key(0))
  outs = [models.apply_model(model, variables, _images(), train=True, rng=jax.random.key(s))[0]
          for s in (1, 2)]
  assert not np.allclose(outs[0], outs[1])


def test_unknown_name_lists_the_valid_names():
  with pytest.raises(ValueError) as info:
    models.get_model("resnet51", 10)
  for name in models.MODEL_NAMES:
    assert name in str(info.value)


@pytest.mark.parametrize("kwargs,match", [
    ({"width": 0.0}, "width"),
    ({"width": float("nan")}, "width"),
    ({"conv_impl": "fft"}, r"'xla', 'im2col', 'custom_vjp'"),
    ({"dropout": 0.1}, "unknown keyword"),
])
def test_bad_arguments_raise_with_valid_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    models.get_model("resnet10", 10, **kwargs)


def test_bad_num_classes_and_model_kwargs():
  with pytest.raises(ValueError, match="num_classes"):
    models.get_model("resnet10", 0)
  with pytest.raises(ValueError, match="dropout_rate"):
    models.get_model("efficientnet_b0", 10, dropout_rate=1.5)
  with pytest.raises(ValueError, match=r"'conv', 'multi', 'single'"):
    models.get_model("fedfusion", 10, fusion="sum")
  with pytest.raises(ValueError, match="fedavg_cifar_cnn"):
    models.get_model("fedfusion", 10, base="fedfusion")
  model = models.get_model("resnet10", NC, width=TINY)
  with pytest.raises(ValueError, match="params"):
    models.apply_model(model, {"batch_stats": {}}, _images(), train=False)
  with pytest.raises(ValueError, match="input_shape"):
    models.init_variables(model, jax.random.key(0), input_shape=(32, 32, 3))


def test_model_summary_numbers():
  summary = models.model_summary("resnet18")
  assert summary["params"] == 11_173_962 and summary["feature_dim"] == 512
  # Known: ~0.556 GMACs for CIFAR ResNet-18, i.e. ~1.11e9 FLOPs.
  assert abs(summary["flops"] - 1.11e9) < 0.1 * 1.11e9
  assert summary["batch_stats"] == 9_600  # running mean + var of every BN channel
  # FedAvg CIFAR CNN by hand: 2 x MACs of conv1, conv2, fc1, fc2, head.
  macs = (32 * 32 * 64 * 25 * 3 + 16 * 16 * 64 * 25 * 64 + 4096 * 384 + 384 * 192 + 192 * 10)
  assert models.model_summary("fedavg_cifar_cnn")["flops"] == 2 * macs
  narrow = models.model_summary("resnet18", 100, width=0.25)
  assert narrow["feature_dim"] == 128 and narrow["params"] == resnet_params((2, 2, 2, 2), 100,
                                                                            0.25)
  assert narrow["flops"] < summary["flops"] / 10
  # XLA's own cost analysis agrees in order of magnitude.
  xla = models.model_summary("simple_cnn", flops_method="xla")
  analytic = models.model_summary("simple_cnn")
  assert 0.5 < xla["flops"] / analytic["flops"] < 2.0
  with pytest.raises(ValueError, match="flops_method"):
    models.model_summary("simple_cnn", flops_method="thop")


def test_models_are_pure_linen_modules_with_static_feature_dim():
  for name in models.MODEL_NAMES:
    model = models.get_model(name, 10, width=0.25)
    assert isinstance(model.feature_dim, int) and model.feature_dim > 0
    assert model.num_classes == 10
    hash(model)  # usable as a static argument of jax.jit
  assert math.isclose(models.get_model("mobilenet_v2", 10, width=0.125).feature_dim, 160)


@pytest.mark.parametrize("name", ["resnet10", "fedfusion",
                                  pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_mask_makes_a_padded_batch_equal_the_smaller_batch(name):
  kwargs = {"base": "resnet10"} if name == "fedfusion" else {}
  model = models.get_model(name, NC, width=TINY, **kwargs)
  variables = models.init_variables(model, jax.random.key(0))
  real = _images(2) * 1.5 + 0.5
  padded = jnp.concatenate([real, 100.0 * jnp.ones((1, 32, 32, 3))])  # a garbage row
  f_small, l_small, new_small = models.apply_model(model, variables, real, train=True)
  f_pad, l_pad, new_pad = models.apply_model(model, variables, padded, train=True,
                                             mask=jnp.array([True, True, False]))
  np.testing.assert_allclose(f_pad[:2], f_small, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(l_pad[:2], l_small, rtol=1e-4, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                         new_pad, new_small)
  # Without the mask the garbage row changes the statistics of the real rows.
  _, l_unmasked, _ = models.apply_model(model, variables, padded, train=True)
  assert not np.allclose(l_unmasked[:2], l_small, atol=1e-3)
  # A padding-only batch stays finite; eval mode ignores the mask.
  _, l_empty, new_empty = models.apply_model(model, variables, padded, train=True,
                                             mask=jnp.zeros(3, bool))
  assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves((l_empty, new_empty)))
  _, l_eval, _ = models.apply_model(model, variables, padded, train=False)
  np.testing.assert_array_equal(l_eval, models.apply_model(model, variables, padded,
                                                           train=False)[1])


def test_mask_must_be_a_bool_vector_of_the_batch():
  model = models.get_model("resnet10", NC, width=TINY)
  variables = models.init_variables(model, jax.random.key(0))
  with pytest.raises(ValueError, match="mask"):
    models.apply_model(model, variables, _images(), train=True, mask=jnp.ones(3, bool))
  with pytest.raises(ValueError, match="mask"):
    models.apply_model(model, variables, _images(), train=True, mask=jnp.ones(2))

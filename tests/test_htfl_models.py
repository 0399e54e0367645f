"""torchvision's Bottleneck ResNet-50/101/152 (HtFLlib's HtFE8 group): parameter counts,
output shapes, the block against a hand computation, a forward pass at tiny width."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.config import load_module, validate_config
from fedjax_het.models import layers, resnet

htfl = load_module("fedjax_het/configs/htfl.py")

LAYOUTS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3)}
#: torchvision's published totals (`sum(p.numel() for p in resnetN().parameters())`, 1000
#: classes, ImageNet stem).
TORCHVISION_PARAMS = {"resnet50": 25_557_032, "resnet101": 44_549_160,
                      "resnet152": 60_192_808}


def _c(channels, w):
  return max(1, int(round(channels * w)))


def bottleneck_trunk_params(blocks, w=1.0, stem_kernel=3):
  """Conv weights and BatchNorm scale + shift of the trunk, from the layer shapes."""
  conv = lambda k, cin, cout: k * k * cin * cout  # noqa: E731
  bn = lambda c: 2 * c  # noqa: E731
  cin = _c(64, w)
  total = conv(stem_kernel, 3, cin) + bn(cin)
  for n, planes in zip(blocks, (64, 128, 256, 512)):
    planes = _c(planes, w)
    for i in range(n):
      total += conv(1, cin, planes) + bn(planes) + conv(3, planes, planes) + bn(planes)
      total += conv(1, planes, 4 * planes) + bn(4 * planes)
      if i == 0:  # every stage's first block changes the stride or the channel count
        total += conv(1, cin, 4 * planes) + bn(4 * planes)
      cin = 4 * planes
  return total


@functools.lru_cache(maxsize=None)
def _shapes(model):
  return jax.eval_shape(lambda k: models.init_variables(model, k), jax.random.key(0))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_parameter_counts_are_torchvisions(name):
  imagenet = models.get_model(name, 1000, stem="imagenet")
  assert models.count_parameters(_shapes(imagenet)["params"]) == TORCHVISION_PARAMS[name]
  # torchvision's total minus its fc (2048 x 1000 + 1000) is the trunk's count by hand.
  assert (bottleneck_trunk_params(LAYOUTS[name], stem_kernel=7)
          == TORCHVISION_PARAMS[name] - (2048 * 1000 + 1000))
  # The registry's default: the CIFAR stem (3x3 conv1).
  assert models.get_model(name, 10).feature_dim == 2048
  narrow = models.get_model(name, 7, width=0.125)
  assert narrow.feature_dim == 256
  assert (models.count_parameters(_shapes(narrow)["params"])
          == bottleneck_trunk_params(LAYOUTS[name], 0.125) + 256 * 7 + 7)


def test_pooled_to_512_as_base_head_split():
  """HtFLlib's BaseHeadSplit: torchvision's fc becomes AdaptiveAvgPool1d(512) (windows of 4
  of the 2048 features, no parameters) and the head Linear(512, C)."""
  name = "resnet50"
  model = models.with_feature_dim(models.get_model(name, 10), 512)
  assert model.feature_dim == 512
  shapes = _shapes(model)
  assert shapes["params"]["head"]["kernel"].shape == (512, 10)
  assert (models.count_parameters(shapes["params"])
          == bottleneck_trunk_params(LAYOUTS[name]) + 512 * 10 + 10)
  images = jax.ShapeDtypeStruct((3, 32, 32, 3), jnp.float32)
  features, logits, _ = jax.eval_shape(
      lambda v, x: models.apply_model(model, v, x, train=False), shapes, images)
  assert features.shape == (3, 512) and logits.shape == (3, 10)
  trunk = jax.eval_shape(lambda v, x: model.trunk.apply(
      {"params": v["params"]["trunk"], "batch_stats": v["batch_stats"]["trunk"]}, x,
      train=False), shapes, images)
  assert trunk.shape == (3, 4, 4, 2048)  # CIFAR stem: 1/8 of the side at the last stage
  np.testing.assert_array_equal(models.adaptive_pool_matrix(2048, 512)[:8, :2],
                                np.kron(np.eye(2), np.full((4, 1), 0.25)))


def test_bottleneck_block_matches_a_hand_computation_and_torchvisions_init():
  """One strided block in eval mode (fresh statistics: BN(x) = x / sqrt(1 + eps))."""
  block = resnet.Bottleneck(planes=32, strides=2)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 8, 24)), jnp.float32)
  variables = block.init(jax.random.key(0), x, train=False)
  p = variables["params"]
  assert set(p) == {"conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "shortcut_conv",
                    "shortcut_bn"}
  assert p["conv3"]["kernel"].shape == (1, 1, 32, 128)
  scale = 1.0 / np.sqrt(1.0 + 1e-5)  # gamma 1, beta 0, mean 0, var 1

  def conv(y, name, stride, pad):
    return layers.conv2d(y, p[name]["kernel"], strides=stride, padding=pad) * scale

  y = jax.nn.relu(conv(x, "conv1", 1, 0))
  y = jax.nn.relu(conv(y, "conv2", 2, 1))  # torchvision's v1.5: the stride on the 3x3 conv
  expected = jax.nn.relu(conv(y, "conv3", 1, 0) + conv(x, "shortcut_conv", 2, 0))
  out = block.apply(variables, x, train=False)
  assert out.shape == (2, 4, 4, 128)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  # torchvision's conv init: N(0, 2 / (k * k * out channels)), untruncated.
  kernel = np.asarray(p["conv2"]["kernel"])
  std = np.sqrt(2.0 / (3 * 3 * 32))
  assert abs(kernel.std() / std - 1.0) < 0.05 and abs(kernel.mean()) < 0.05 * std
  assert np.abs(kernel).max() > 3.0 * std  # not truncated at 2 std


def _random_variables(shapes, seed=0):
  """Variables of the given shapes without the model's init (whose He-normal sampling of
  every conv compiles for seconds on a CPU): kernels N(0, 2 / fan-out), biases 0, BatchNorm
  scale 1, shift 0, mean 0, var 1."""
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if name.endswith("['kernel']"):
      fan_out = int(np.prod(shape.shape[:-2])) * shape.shape[-1]
      return jnp.asarray(rng.normal(0.0, np.sqrt(2.0 / fan_out), shape.shape), jnp.float32)
    one = name.endswith("['scale']") or name.endswith("['var']")
    return jnp.full(shape.shape, 1.0 if one else 0.0, jnp.float32)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def test_a_small_bottleneck_net_runs_at_tiny_width():
  """One bottleneck block per stage at width 1/16, pooled to 32: forward in both modes."""
  model = models.with_feature_dim(
      resnet.resnet((1, 1, 1, 1), 3, width=0.0625, block="bottleneck"), 32)
  variables = _random_variables(_shapes(model))
  images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
  for train in (False, True):
    features, logits, new = models.apply_model(model, variables, images, train=train)
    assert features.shape == (2, 32) and logits.shape == (2, 3)
    assert np.all(np.isfinite(logits)) and (new is variables) == (not train)
  stats = new["batch_stats"]["trunk"]["layer4_0"]["bn3"]
  assert stats["mean"].shape == (128,) and not np.allclose(stats["var"], 1.0)


@pytest.mark.slow  # ResNet-50 at width 1/8 initialises and compiles for about a minute
def test_resnet50_forward_at_tiny_width():
  model = models.get_model("resnet50", 4, width=0.125)
  variables = models.init_variables(model, jax.random.key(0))
  images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
  for train in (False, True):
    features, logits, new = models.apply_model(model, variables, images, train=train)
    assert features.shape == (2, 256) and logits.shape == (2, 4)
    assert np.all(np.isfinite(logits)) and (new is variables) == (not train)


def test_htfe8_group_gives_client_i_architecture_i_mod_8():
  config = htfl.get_config("cifar10_practical_htfe8_fedproto")
  validate_config(config)
  group = ("htfl_cnn", "googlenet", "mobilenet_v2", "resnet18", "resnet34", "resnet50",
           "resnet101", "resnet152")
  assert htfl.GROUPS["htfe8"] == group
  assert tuple(config.models.architectures) == tuple(group[i % 8] for i in range(20))
  for name in group:
    assert name in models.MODEL_NAMES

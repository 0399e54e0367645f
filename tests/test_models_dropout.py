"""Dropout of the FedAvg CNNs (FedMMD/FedFusion Sec. 4.1; p = 0.2 in the FedFusion code).

`get_model(..., dropout_rate=p)`, `models.with_dropout`, and `config.models.dropout_rate` read
by every FedAvg-family method (0.2 in the FedMMD / FedFusion paper settings; the configs and
FedAvg's own dropout are tested in tests/test_two_stream_table1.py): dropout in local training
only, off in evaluation and in the frozen global stream.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedfusion, fedmmd
from fedjax_het.config import validate_config
from fedjax_het.evaluation import stack_test_sets
from fedjax_het.models.base import Classifier, MLPTail
from tests.test_fedmmd_fedfusion import TinyTrunk
from tests.tiny_federation import tiny_config, tiny_data, tiny_setup


def _images(n=16, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(n, 32, 32, 3)), jnp.float32)


def _fc_input_and_hidden(variables, images):
  """The MNIST CNN's flattened trunk output and relu(fc1), in float64 NumPy."""
  trunk = models.get_model("fedavg_mnist_cnn", 10).trunk
  x = np.asarray(trunk.apply({"params": variables["params"]["trunk"]}, images, train=False),
                 np.float64).reshape(images.shape[0], -1)
  fc1 = variables["params"]["tail"]["fc1"]
  return x, np.maximum(x @ np.asarray(fc1["kernel"], np.float64)
                       + np.asarray(fc1["bias"], np.float64)[None], 0.0)


def test_mnist_cnn_dropout_zeroes_and_rescales_fc512_only_in_training():
  rate = 0.2
  plain = models.get_model("fedavg_mnist_cnn", 10)
  dropped = models.get_model("fedavg_mnist_cnn", 10, dropout_rate=rate)
  assert not plain.needs_dropout_rng and dropped.needs_dropout_rng
  variables = models.init_variables(plain, jax.random.key(0))
  # Dropout has no variables: the same initialisation.
  jax.tree_util.tree_map(np.testing.assert_array_equal, variables,
                         models.init_variables(dropped, jax.random.key(0)))
  images = _images()
  _, hidden = _fc_input_and_hidden(variables, images)
  # Evaluation: deterministic, the model without dropout.
  eval_features, eval_logits, _ = models.apply_model(dropped, variables, images, train=False)
  np.testing.assert_allclose(eval_features, hidden, rtol=1e-4, atol=1e-5)
  plain_logits = models.apply_model(plain, variables, images, train=False)[1]
  np.testing.assert_array_equal(eval_logits, plain_logits)
  # Training: every feature is 0 or relu(fc1) / (1 - p); the logits are the head of them.
  features, logits, _ = models.apply_model(dropped, variables, images, train=True,
                                           rng=jax.random.key(1))
  features = np.asarray(features, np.float64)
  kept = features != 0
  np.testing.assert_allclose(features[kept], hidden[kept] / (1 - rate), rtol=1e-4, atol=1e-5)
  active = hidden > 1e-6
  dropped_share = 1.0 - kept[active].mean()
  assert 0.15 < dropped_share < 0.25, dropped_share  # ~ p over thousands of units
  head = variables["params"]["head"]
  np.testing.assert_allclose(logits, features @ np.asarray(head["kernel"], np.float64)
                             + np.asarray(head["bias"], np.float64)[None], rtol=1e-4, atol=1e-4)
  # The same key gives the same masks (resumption), another key other masks.
  again = models.apply_model(dropped, variables, images, train=True, rng=jax.random.key(1))[0]
  np.testing.assert_array_equal(again, features.astype(np.float32))
  other = models.apply_model(dropped, variables, images, train=True, rng=jax.random.key(2))[0]
  assert not np.array_equal(np.asarray(other) != 0, kept)
  with pytest.raises(ValueError, match="uses dropout in train mode; pass `rng`"):
    models.apply_model(dropped, variables, images, train=True)


def test_cifar_cnn_drops_after_both_hidden_layers_and_the_default_has_none():
  plain = models.get_model("fedavg_cifar_cnn", 10)
  explicit = models.get_model("fedavg_cifar_cnn", 10, dropout_rate=0.0)
  assert plain == explicit and not plain.needs_dropout_rng
  dropped = models.get_model("fedavg_cifar_cnn", 10, dropout_rate=0.5)
  variables = models.init_variables(plain, jax.random.key(0))
  images = _images(8)
  np.testing.assert_array_equal(models.apply_model(dropped, variables, images, train=False)[1],
                                models.apply_model(plain, variables, images, train=False)[1])
  train = lambda m, k: models.apply_model(m, variables, images, train=True, rng=k)[0]  # noqa
  np.testing.assert_array_equal(train(plain, jax.random.key(3)), train(plain, jax.random.key(4)))
  features = np.asarray(train(dropped, jax.random.key(3)))
  assert 0.35 < (features == 0).mean() < 0.8  # fc 192's own dropout, on top of the ReLU zeros
  # Two Dropout layers: fc 384's and fc 192's.
  rates = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
      rates.append(context.module.rate)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    dropped.apply(variables, images, train=True, rngs={"dropout": jax.random.key(0)})
  assert rates == [0.5, 0.5]
  for bad in (-0.1, 1.0, True):
    with pytest.raises(ValueError, match=r"`dropout_rate` must be a number in \[0, 1\)"):
      models.get_model("fedavg_cifar_cnn", 10, dropout_rate=bad)
  with pytest.raises(ValueError, match="unknown keyword"):
    models.get_model("resnet10", 10, dropout_rate=0.2)


def test_with_dropout_sets_the_tail_of_classifiers_and_fedfusion_models():
  base = models.get_model("fedavg_mnist_cnn", 10)
  assert models.with_dropout(base, 0.2) == models.get_model("fedavg_mnist_cnn", 10,
                                                            dropout_rate=0.2)
  fused = fedfusion.fuse(base, "conv")
  assert models.with_dropout(fused, 0.2).needs_dropout_rng and not fused.needs_dropout_rng
  assert models.with_dropout(models.get_model("resnet10", 10), 0.3).tail.dropout_rate == 0.3
  with pytest.raises(ValueError, match=r"`rate` must be a number in \[0, 1\)"):
    models.with_dropout(base, 1.5)
  with pytest.raises(ValueError, match="needs a model whose tail is an MLPTail"):
    models.with_dropout(TinyTrunk(), 0.2)


def _tiny_classifier():
  return Classifier(trunk=TinyTrunk(), tail=MLPTail(input_dim=32, hidden=(16,)), num_classes=3)


# FedMMD's variant compiles the two-stream round too (about 18 s on a 2-core CPU): slow.
@pytest.mark.parametrize("method", [pytest.param("fedmmd", marks=pytest.mark.slow), "fedfusion"])
def test_the_methods_drop_out_in_local_training_only_and_repeat_their_masks(method):
  setup = tiny_setup(2, _tiny_classifier())
  make = {"fedmmd": fedmmd.make_fedmmd, "fedfusion": fedfusion.make_fedfusion}[method]
  data, _, _ = tiny_data(setup)
  runs = {}
  for rate in (0.0, 0.5):
    config = tiny_config(method, **{"fedavg.evaluate": "global", "local.epochs": 2})
    if rate:
      config.models.dropout_rate = rate
    validate_config(config)
    algorithm = make(config, setup)
    state = algorithm.init(jax.random.key(0), data)
    round_fn = jax.jit(algorithm.round)
    first, _ = round_fn(state, data, jax.random.key(1), jnp.int32(0))
    again, _ = round_fn(state, data, jax.random.key(1), jnp.int32(0))
    runs[rate] = (algorithm, state, first, again)
  algorithm, state, first, again = runs[0.5]
  # Deterministic given the round key (a resumed run draws the same masks) ...
  jax.tree_util.tree_map(np.testing.assert_array_equal, first, again)
  # ... and dropout changed local training (the first step already: dropped hidden units).
  assert not np.allclose(first["server"]["params"]["head"]["kernel"],
                         runs[0.0][2]["server"]["params"]["head"]["kernel"])
  # Evaluation has no dropout: the same numbers as the algorithm without it on the same state.
  rng = np.random.default_rng(7)
  test = jax.device_put(stack_test_sets(
      ["d"], {"d": rng.integers(0, 255, (5, 32, 32, 3), dtype=np.uint8)},
      {"d": rng.integers(0, 3, 5).astype(np.int32)}))
  jax.tree_util.tree_map(np.testing.assert_array_equal, algorithm.evaluate(first, test),
                         runs[0.0][0].evaluate(first, test))
  assert setup.groups[0].model.tail.dropout_rate == 0.0  # the caller's setup is unchanged


def test_apply_model_with_trunk_adds_the_trunk_map_of_the_same_forward_pass():
  images = _images(4)
  mask = jnp.array([True, True, True, False])
  resnet = models.get_model("resnet10", 10, width=0.125)   # BatchNorm: train mode updates it
  variables = models.init_variables(resnet, jax.random.key(0))
  feature_map, features, logits, new = models.apply_model_with_trunk(
      resnet, variables, images, train=True, mask=mask)
  want_features, want_logits, want_new = models.apply_model(resnet, variables, images,
                                                            train=True, mask=mask)
  np.testing.assert_allclose(features, want_features, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         new["batch_stats"], want_new["batch_stats"])
  assert feature_map.shape == (4, 4, 4, 64) and feature_map.dtype == jnp.float32
  # Eval mode: the trunk alone on the running statistics; the variables come back unchanged.
  eval_map, _, _, same = models.apply_model_with_trunk(resnet, variables, images, train=False)
  trunk_alone = resnet.trunk.apply({"params": variables["params"]["trunk"],
                                    "batch_stats": variables["batch_stats"]["trunk"]},
                                   images, train=False)
  np.testing.assert_allclose(eval_map, trunk_alone, rtol=1e-5, atol=1e-6)
  assert same is variables
  # Dropout sits in the tail: the trunk map is the same for every dropout mask.
  cnn = models.get_model("fedavg_cifar_cnn", 10, dropout_rate=0.2)
  cnn_variables = models.init_variables(cnn, jax.random.key(0))
  maps = [models.apply_model_with_trunk(cnn, cnn_variables, images, train=True,
                                        rng=jax.random.key(seed)) for seed in (1, 2)]
  np.testing.assert_array_equal(maps[0][0], maps[1][0])
  assert not np.array_equal(maps[0][1], maps[1][1])   # the features are dropped out
  with pytest.raises(ValueError, match="pass `rng`"):
    models.apply_model_with_trunk(cnn, cnn_variables, images, train=True)
  with pytest.raises(ValueError, match="needs a model with a `trunk` submodule"):
    models.apply_model_with_trunk(TinyTrunk(), {"params": {}, "batch_stats": {}}, images,
                                  train=False)

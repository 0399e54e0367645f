"""PODNet + FL (fedjax_het.algorithms.podnet_fl) and PODNet's losses."""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import podnet_fl
from fedjax_het.config import load_module, validate_config
from fedjax_het.losses import incremental
from fedjax_het.models.base import STAGE_COLLECTION
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                  train_tiny_and_check_table1)
from tests.tiny_models import TinyLinear
from tests.tiny_runs import evaluate_seen, rounds_across_a_task_change, tiny_replay

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "fedjax_het" / "configs" / "cifar100.py"


class TinyStaged(nn.Module):
  """Two strided convs that sow their outputs as stages; mean-pooled features, Dense head."""
  num_classes: int = 4

  @property
  def feature_dim(self):
    return 8

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    del train, mask
    h = nn.relu(nn.Conv(4, (3, 3), strides=4, name="conv1")(x))
    self.sow(STAGE_COLLECTION, "stage1", h)
    h = nn.relu(nn.Conv(8, (3, 3), strides=2, name="conv2")(h))
    self.sow(STAGE_COLLECTION, "stage2", h)
    features = jnp.mean(h, axis=(1, 2))
    return features, nn.Dense(self.num_classes, name="head")(features)


# ----------------------------------------------------------------------------- NumPy references


def _normalize(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _pod_spatial(maps, old_maps, valid):
  total = 0.0
  for a, b in zip(maps, old_maps):
    def embed(h):
      h = np.square(h.astype(np.float64))
      n = h.shape[0]
      return _normalize(np.concatenate([h.sum(2).reshape(n, -1), h.sum(1).reshape(n, -1)], -1))
    distance = np.linalg.norm(embed(a) - embed(b), axis=-1)
    total += (distance * valid).sum() / valid.sum()
  return total / len(maps)


def _lsc(features, proxies):
  s = np.einsum("bd,ckd->bck", _normalize(features.astype(np.float64)),
                _normalize(proxies.astype(np.float64)))
  att = np.exp(s - s.max(-1, keepdims=True))
  att /= att.sum(-1, keepdims=True)
  return (att * s).sum(-1)


def _nca(sim, labels, scale, margin, seen, valid):
  out = []
  for row, y in zip(sim.astype(np.float64), labels):
    others = [scale * row[i] for i in range(seen) if i != y]
    top = max(others)
    lse = top + np.log(np.sum(np.exp(np.asarray(others) - top)))
    out.append(max(0.0, lse - scale * (row[y] - margin)))
  return (np.asarray(out) * valid).sum() / valid.sum()


# ----------------------------------------------------------------------------- losses


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_pod_spatial_matches_numpy(scale):
  rng = np.random.default_rng(0)
  shapes = [(5, 6, 4, 3), (5, 3, 2, 7)]
  maps = [scale * rng.normal(size=s).astype(np.float32) for s in shapes]
  old = [scale * rng.normal(size=s).astype(np.float32) for s in shapes]
  valid = np.array([1, 1, 0, 1, 1], bool)
  got = incremental.pod_spatial_loss(feature_maps=tuple(map(jnp.asarray, maps)),
                                     old_feature_maps=tuple(map(jnp.asarray, old)),
                                     mask=jnp.asarray(valid))
  assert np.isfinite(float(got))
  np.testing.assert_allclose(float(got), _pod_spatial(maps, old, valid), rtol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_pod_flat_matches_numpy(scale):
  rng = np.random.default_rng(1)
  h, h_old = (scale * rng.normal(size=(6, 5)).astype(np.float32) for _ in range(2))
  got = incremental.pod_flat_loss(features=jnp.asarray(h), old_features=jnp.asarray(h_old))
  expected = np.mean(1.0 - np.sum(_normalize(h.astype(np.float64))
                                  * _normalize(h_old.astype(np.float64)), -1))
  np.testing.assert_allclose(float(got), expected, rtol=1e-5, atol=1e-6)


def test_distillation_gradients_are_finite_where_old_equals_new():
  maps = (jnp.ones((2, 3, 3, 2)), jnp.zeros((2, 2, 2, 2)))   # a zero map: zero statistics
  grads = jax.grad(lambda m: incremental.pod_spatial_loss(feature_maps=m,
                                                          old_feature_maps=maps))(maps)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  h = jnp.asarray([[1.0, 2.0], [0.0, 0.0]])
  g = jax.grad(lambda x: incremental.pod_flat_loss(features=x, old_features=h))(h)
  assert np.isfinite(np.asarray(g)).all()
  assert abs(float(incremental.pod_spatial_loss(feature_maps=maps, old_feature_maps=maps))) < 1e-6


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_local_similarity_scores_match_numpy(scale):
  rng = np.random.default_rng(2)
  features = scale * rng.normal(size=(4, 6)).astype(np.float32)
  proxies = scale * rng.normal(size=(5, 3, 6)).astype(np.float32)
  got = incremental.local_similarity_scores(features=jnp.asarray(features),
                                            proxies=jnp.asarray(proxies))
  np.testing.assert_allclose(np.asarray(got), _lsc(features, proxies), rtol=1e-5, atol=1e-6)
  assert np.all(np.abs(np.asarray(got)) <= 1.0 + 1e-6)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_nca_matches_numpy_and_ignores_unseen_classes(scale):
  rng = np.random.default_rng(3)
  sim = rng.uniform(-1, 1, size=(6, 5)).astype(np.float32)
  labels = np.array([0, 1, 2, 3, 1, 0])
  valid = np.array([1, 1, 1, 1, 0, 1], bool)
  got = incremental.nca_loss(similarities=jnp.asarray(sim), labels=jnp.asarray(labels),
                             scale=scale, margin=0.6, num_seen_classes=4,
                             mask=jnp.asarray(valid))
  assert np.isfinite(float(got))
  np.testing.assert_allclose(float(got), _nca(sim, labels, scale, 0.6, 4, valid), rtol=1e-5)
  shifted = sim.copy()
  shifted[:, 4] = 1e3    # the unseen class: no effect
  again = incremental.nca_loss(similarities=jnp.asarray(shifted), labels=jnp.asarray(labels),
                               scale=scale, margin=0.6, num_seen_classes=4,
                               mask=jnp.asarray(valid))
  assert float(again) == float(got)
  grad = jax.grad(lambda s: incremental.nca_loss(similarities=s, labels=jnp.asarray(labels),
                                                 scale=scale, margin=0.6,
                                                 num_seen_classes=4))(jnp.asarray(sim))
  assert np.isfinite(np.asarray(grad)).all() and np.all(np.asarray(grad)[:, 4] == 0)


def test_nca_margin_does_not_train_the_scale():
  sim = jnp.asarray([[0.2, 0.1, -0.3], [0.0, 0.4, 0.1]])
  labels = jnp.asarray([0, 2])

  def loss(scale, margin):
    return incremental.nca_loss(similarities=sim, labels=labels, scale=scale, margin=margin,
                                num_seen_classes=3)

  with_margin, without = jax.grad(loss)(2.0, 0.05), jax.grad(loss)(2.0, 0.0)
  # Both rows stay inside the hinge; d/d_eta = mean(E_softmax[s_others] - s_y) either way.
  assert float(loss(2.0, 0.05)) > 0 and float(loss(2.0, 0.0)) > 0
  np.testing.assert_allclose(float(with_margin), float(without), rtol=1e-6)
  np.testing.assert_allclose(float(loss(2.0, 0.05)) - float(loss(2.0, 0.0)), 2.0 * 0.05,
                             rtol=1e-5)


def test_nca_hinge_and_a_single_seen_class():
  sim = jnp.asarray([[1.0, -1.0, 0.0]])
  # Well separated with a large scale: the hinge is at 0.
  assert float(incremental.nca_loss(similarities=sim, labels=jnp.asarray([0]), scale=100.0,
                                    margin=0.1, num_seen_classes=2)) == 0.0
  assert float(incremental.nca_loss(similarities=sim, labels=jnp.asarray([0]), scale=1.0,
                                    margin=0.0, num_seen_classes=1)) == 0.0


# ----------------------------------------------------------------------------- stage outputs


@pytest.mark.parametrize("name", [
    "simple_cnn",
    pytest.param("glfc_resnet18", marks=pytest.mark.slow)])  # compiles a ResNet-18
def test_zoo_trunks_give_their_stages_without_changing_outputs(name):
  model = models.get_model(name, 10, width=0.125)
  variables = models.init_variables(model, jax.random.key(0))
  assert set(variables) == {"params", "batch_stats"}   # nothing sown at init
  x = jax.random.normal(jax.random.key(1), (3, 32, 32, 3))
  features, stages, _ = jax.jit(lambda v, x: podnet_fl.apply_with_stages(
      model, v, x, train=False))(variables, x)
  plain, _, _ = jax.jit(lambda v, x: models.apply_model(model, v, x, train=False))(variables, x)
  np.testing.assert_array_equal(np.asarray(features), np.asarray(plain))
  if name == "glfc_resnet18":
    assert [s.shape[1] for s in stages] == [32, 16, 8, 4]
    # The global pooling of the last stage is the embedding.
    np.testing.assert_allclose(np.asarray(stages[-1].mean(axis=(1, 2))), np.asarray(features),
                               rtol=1e-5, atol=1e-6)
  else:
    assert [s.shape[1:3] for s in stages] == [(14, 14), (5, 5)]


def test_models_without_stages_are_refused():
  model = TinyLinear(num_classes=4)
  variables = models.init_variables(model, jax.random.key(0))
  with pytest.raises(ValueError, match="sows no stage outputs"):
    podnet_fl.apply_with_stages(model, variables, jnp.zeros((1, 32, 32, 3)), train=False)


# ----------------------------------------------------------------------------- training


@pytest.mark.slow  # compiles the whole round (herding, two models' stages): 68 s on a loaded CPU
def test_rounds_train_distil_and_evaluate_across_a_task_change():
  stream = tiny_stream()
  settings = tiny_settings(batch_size=16)
  model = TinyStaged(num_classes=stream.num_classes)
  replay = tiny_replay(stream)
  algorithm = podnet_fl.make_podnet_fl(settings, replay, model, stream.mean, stream.std,
                                       stream.max_client_size, proxies_per_class=2,
                                       eval_batch_size=16)
  state, history = rounds_across_a_task_change(algorithm, stream)
  assert state["server"]["params"][podnet_fl.LSC]["proxies"].shape == (4, 2, 8)
  assert [int(h["task"]) for h in history] == [0, 0, 1, 1]
  assert all(np.isfinite(float(h["train/loss"])) for h in history)
  for h in history[:2]:   # task 0: no distillation term in the loss
    np.testing.assert_allclose(float(h["train/loss"]), float(h["train/nca"]), rtol=1e-6)
  assert float(history[3]["train/flat"]) > 0 and float(history[3]["train/spatial"]) > 0
  assert float(history[3]["train/loss"]) > float(history[3]["train/nca"])
  assert float(history[3]["podnet/exemplars"]) > 0
  assert sum(int(h["podnet/transitions"]) for h in history) >= 1
  stored = np.asarray(state["clients"].memory.labels)[np.asarray(state["clients"].memory.valid)]
  assert stored.size and (stored < 2).all()
  assert float(history[-1]["podnet/scale"]) != 1.0   # the scale is learned
  size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state["server"]))
  assert [float(h["train/server/bytes_down"]) for h in history] == [2 * size] * 2 + [4 * size] * 2
  assert all(float(h["train/server/bytes_up"]) == 2 * size for h in history)
  correct, total, predicted = evaluate_seen(algorithm, state, stream)
  assert int(np.sum(total)) == len(stream.test_labels)
  assert int(np.sum(predicted)) == len(stream.test_labels) and int(np.sum(correct)) >= 0


@pytest.mark.slow  # the trainer end to end (simple_cnn compiles)
def test_end_to_end_writes_table1(tmp_path):
  c = tiny_cil_config("podnet_fl")
  c.podnet.memory_size = 8
  c.podnet.proxies_per_class = 2
  _, results, records, _ = train_tiny_and_check_table1(c, tmp_path / "run")
  assert len(results["seen_accuracy"]) == 2
  assert all("train/spatial" in r and "podnet/exemplars" in r for r in records)


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for variant, tasks in (("podnet_fl", 10), ("podnet_fl_tasks5", 5), ("podnet_fl_tasks20", 20),
                         ("podnet_fl_quick", 4)):
    config = module.get_config(variant)
    validate_config(config)
    assert config.algorithm == "podnet_fl" and config.scenario.num_tasks == tasks
    assert config.local.lr == 0.1 and config.podnet.margin == 0.6
    assert config.scenario.class_order == ("seeded" if variant.endswith("_quick") else "icarl")
  assert module.get_config("podnet_fl").podnet.memory_size == 2000
  assert module.get_config("podnet_fl_quick").podnet.memory_size == 90
  broken = module.get_config("podnet_fl")
  broken.podnet.proxies_per_class = 0
  with pytest.raises(Exception, match="config.podnet.proxies_per_class"):
    validate_config(broken)

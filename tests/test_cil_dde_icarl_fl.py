"""DDE + iCaRL + FL (`algorithms.dde_icarl_fl`) and its losses (`losses.causal_distillation`)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import cil_replay, dde_icarl_fl
from fedjax_het.config import load_module, validate_config
from fedjax_het.losses import causal_distillation as cd
from fedjax_het.losses import glfc as glfc_losses
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                  train_tiny_and_check_table1)
from tests.tiny_models import TinyLinear
from tests.tiny_runs import evaluate_seen, rounds_across_a_task_change, tiny_replay

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "fedjax_het" / "configs" / "cifar100.py"


# ----------------------------------------------------------------------------- NumPy references


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))


def _normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _neighbours(old_features, labels, num_old, k, w0, valid):
  """Per row: the ordered list of its neighbours and their weights, by hand."""
  f = _normalize(old_features)
  distance = np.sqrt(((f[:, None, :] - f[None, :, :]) ** 2).sum(-1))
  out = []
  for b in range(len(labels)):
    candidates = [j for j in range(len(labels))
                  if j != b and valid[j] and labels[j] >= num_old and num_old > 0]
    chosen = sorted(candidates, key=lambda j: distance[b, j])[:k]
    if chosen:
      out.append((chosen, w0, [(1.0 - w0) / len(chosen)] * len(chosen)))
    else:
      out.append(([], 1.0, []))
  return out


def _colliding_loss(z, labels, z_old, hand, num_old, num_seen, valid):
  """iCaRL's BCE with the colliding effect on the new-class columns, float64 by hand."""
  rows = []
  for b, (chosen, w0, wk) in enumerate(hand):
    total = 0.0
    for c in range(num_seen):
      if c < num_old:
        t = _sigmoid(z_old[b, c])
        total += np.log1p(np.exp(z[b, c])) - z[b, c] * t
      else:
        q = w0 * _sigmoid(z[b, c]) + sum(w * _sigmoid(z[j, c]) for j, w in zip(chosen, wk))
        y = float(labels[b] == c)
        total += -(y * np.log(q) + (1 - y) * np.log(1 - q))
    rows.append(total / num_seen)
  rows = np.asarray(rows)
  return float(np.sum(rows * valid) / np.sum(valid))


# A batch of 7 rows in task 1 of 3-class tasks: old classes 0-2, new classes 3-5 (seen 6 of 8
# columns). Row 5 is padding; new rows: 1, 3, 4, 6 (valid), so a new row has 3 candidates and
# an old row 4.
LABELS = np.array([0, 3, 2, 4, 5, 3, 4])
VALID = np.array([1, 1, 1, 1, 1, 0, 1], bool)
NUM_OLD, NUM_SEEN, C = 3, 6, 8


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  return {"old_features": rng.normal(size=(7, 5)).astype(np.float32) * 3.0,
          "logits": rng.normal(size=(7, C)).astype(np.float32),
          "old_logits": rng.normal(size=(7, C)).astype(np.float32)}


# ----------------------------------------------------------------------------- losses


@pytest.mark.parametrize("k", [2, 4])
def test_neighbours_are_the_nearest_new_rows_in_the_old_feature_space(batch, k):
  neighbours, weights = cd.colliding_neighbours(
      old_features=jnp.asarray(batch["old_features"]), labels=jnp.asarray(LABELS),
      num_old_classes=NUM_OLD, num_neighbours=k, self_weight=0.5, mask=jnp.asarray(VALID))
  neighbours, weights = np.asarray(neighbours), np.asarray(weights)
  assert neighbours.shape == (7, k) and weights.shape == (7, k + 1)
  hand = _neighbours(batch["old_features"], LABELS, NUM_OLD, k, 0.5, VALID)
  for b, (chosen, w0, wk) in enumerate(hand):
    used = weights[b, 1:] > 0
    assert list(neighbours[b][used]) == chosen, b
    np.testing.assert_allclose(weights[b, 0], w0, rtol=1e-6)
    np.testing.assert_allclose(weights[b, 1:][used], wk, rtol=1e-6)
    np.testing.assert_allclose(weights[b].sum(), 1.0, rtol=1e-6)
  # k = 4: a new row has only 3 candidates (weights 1/6), an old row all 4 (weights 1/8).
  if k == 4:
    np.testing.assert_allclose(weights[1, 1:], [1 / 6, 1 / 6, 1 / 6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(weights[0, 1:], [1 / 8] * 4, rtol=1e-6)
    assert 5 not in neighbours[weights[:, 1:] > 0]     # padding is never a neighbour
  # The first task has no old model: no neighbour, W_0 = 1.
  _, first = cd.colliding_neighbours(
      old_features=jnp.asarray(batch["old_features"]), labels=jnp.asarray(LABELS),
      num_old_classes=0, num_neighbours=k, self_weight=0.5, mask=jnp.asarray(VALID))
  np.testing.assert_array_equal(np.asarray(first), np.eye(1, k + 1).repeat(7, 0))


@jax.jit
def _loss_and_grad(z, z_old, neighbours, weights, mask):
  """The loss of the task-1 batch above and its gradient in the logits (one compile)."""
  return jax.value_and_grad(lambda x: cd.colliding_effect_bce_loss(
      logits=x, labels=jnp.asarray(LABELS), old_logits=z_old, neighbours=neighbours,
      weights=weights, num_old_classes=NUM_OLD, class_mask=jnp.arange(C) < NUM_SEEN,
      mask=mask))(z)


def _batch_neighbours(old_features):
  return cd.colliding_neighbours(old_features=jnp.asarray(old_features),
                                 labels=jnp.asarray(LABELS), num_old_classes=NUM_OLD,
                                 num_neighbours=2, self_weight=0.5, mask=jnp.asarray(VALID))


@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_colliding_effect_loss_matches_numpy(batch, scale):
  z, z_old = batch["logits"] * scale, batch["old_logits"] * scale
  neighbours, weights = _batch_neighbours(batch["old_features"])
  loss, _ = _loss_and_grad(jnp.asarray(z), jnp.asarray(z_old), neighbours, weights,
                           jnp.asarray(VALID))
  hand = _neighbours(batch["old_features"], LABELS, NUM_OLD, 2, 0.5, VALID)
  expect = _colliding_loss(z, LABELS, z_old, hand, NUM_OLD, NUM_SEEN, VALID)
  np.testing.assert_allclose(float(loss), expect, rtol=1e-5)


def test_without_neighbours_the_loss_is_icarls(batch):
  z, z_old = jnp.asarray(batch["logits"]), jnp.asarray(batch["old_logits"])
  alone = jnp.concatenate([jnp.ones((7, 1)), jnp.zeros((7, 2))], axis=1)
  loss, _ = _loss_and_grad(z, z_old, jnp.zeros((7, 2), jnp.int32), alone, jnp.asarray(VALID))
  icarl = glfc_losses.class_semantic_relation_distillation_loss(
      logits=z, labels=jnp.asarray(LABELS), old_logits=z_old, num_old_classes=NUM_OLD,
      class_mask=jnp.arange(C) < NUM_SEEN, mask=jnp.asarray(VALID))
  np.testing.assert_allclose(float(loss), float(icarl), rtol=1e-6)


def test_gradients_reach_only_the_rows_own_seen_logits(batch):
  neighbours, weights = _batch_neighbours(batch["old_features"])
  only_row0 = jnp.arange(7) == 0    # row 0 alone in the mean: its neighbours get no gradient
  _, grad = _loss_and_grad(jnp.asarray(batch["logits"]), jnp.asarray(batch["old_logits"]),
                           neighbours, weights, only_row0)
  grad = np.asarray(grad)
  assert np.abs(grad[0, :NUM_SEEN]).min() > 0
  assert not grad[1:].any() and not grad[:, NUM_SEEN:].any()


@pytest.mark.parametrize("scale", [1e2, 1e4])
def test_saturated_float32_logits_stay_finite(batch, scale):
  z = jnp.asarray(np.sign(batch["logits"]) * scale, jnp.float32)
  z_old = jnp.asarray(-np.sign(batch["old_logits"]) * scale, jnp.float32)
  neighbours, weights = _batch_neighbours(batch["old_features"] * scale)
  # sigmoid(+-1e4) is exactly 1 or 0 in float32: log q and log(1 - q) come from log-sigmoids.
  value, grad = _loss_and_grad(z, z_old, neighbours, weights, jnp.asarray(VALID))
  assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
  assert float(value) > 0


# ----------------------------------------------------------------------------- classifier


def test_momentum_removed_nme_matches_the_hand_computation():
  rng = np.random.default_rng(3)
  features = rng.normal(size=(5, 4)).astype(np.float32) * 7.0
  sums = rng.normal(size=(6, 4)).astype(np.float32)
  counts = np.array([3, 2, 0, 4, 1, 5], np.int32)   # class 2 has no mean; 5 is unseen
  h = rng.normal(size=(4,)).astype(np.float32) * 30.0
  alpha = 0.5
  removed_scores = jax.jit(dde_icarl_fl.momentum_removed_nme_scores)   # one compile
  scores, available = removed_scores(jnp.asarray(features), jnp.asarray(h), alpha,
                                     jnp.asarray(sums), jnp.asarray(counts), jnp.int32(5))
  x, hh = _normalize(features), _normalize(h[None])[0]
  mu = _normalize(sums / np.maximum(counts, 1)[:, None])
  removed = x - alpha * (x @ hh)[:, None] * hh[None]
  expect = -((_normalize(removed)[:, None, :] - mu[None]) ** 2).sum(-1)
  np.testing.assert_allclose(np.asarray(scores), expect, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(available), [True, True, False, True, True, False])
  # The ranking is DDE's: cos(x, mu_c) - alpha cos(x, h) cos(h, mu_c).
  dde = x @ mu.T - alpha * (x @ hh)[:, None] * (mu @ hh)[None]
  ok = np.asarray(available)
  np.testing.assert_array_equal(np.argmax(np.where(ok, np.asarray(scores), -np.inf), -1),
                                np.argmax(np.where(ok, dde, -np.inf), -1))
  # alpha = 0 or h = 0: iCaRL + FL's classifier.
  plain, _ = jax.jit(cil_replay.nme_scores)(jnp.asarray(features), jnp.asarray(sums),
                                            jnp.asarray(counts), jnp.int32(5))
  for momentum, a in ((h, 0.0), (np.zeros(4, np.float32), 0.5)):
    got, _ = removed_scores(jnp.asarray(features), jnp.asarray(momentum), a, jnp.asarray(sums),
                            jnp.asarray(counts), jnp.int32(5))
    np.testing.assert_allclose(np.asarray(got), np.asarray(plain), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- local loss


def test_local_loss_and_momentum_update():
  model = TinyLinear(num_classes=4, input_dim=12)   # features: the flattened input
  variables = models.init_variables(model, jax.random.key(0), input_shape=(1, 2, 2, 3))
  old = models.init_variables(model, jax.random.key(1), input_shape=(1, 2, 2, 3))
  images = jnp.asarray(np.random.default_rng(4).normal(size=(6, 2, 2, 3)), jnp.float32)
  labels = jnp.asarray([0, 2, 3, 2, 1, 3])
  mask = jnp.asarray([True, True, True, True, True, False])
  h0 = jnp.linspace(-1.0, 1.0, 12)
  loss_fn = dde_icarl_fl.dde_local_loss(model, num_neighbours=2, self_weight=0.5, momentum=0.9)

  @jax.jit
  def run(num_old):
    aux = {"class_mask": jnp.arange(4) < 4, "num_old": num_old,
           "old_model": dde_icarl_fl.with_momentum(old, jnp.zeros(12))}
    stats = dde_icarl_fl.with_momentum(variables, h0)["batch_stats"]
    loss, (new_stats, parts) = loss_fn(variables["params"], stats, images, labels, mask,
                                       jax.random.key(1), aux)
    _, z, _ = models.apply_model(model, variables, images, train=False)
    _, z_old, _ = models.apply_model(model, old, images, train=False)
    neighbours, weights = cd.colliding_neighbours(
        old_features=images.reshape(6, -1), labels=labels, num_old_classes=num_old,
        num_neighbours=2, self_weight=0.5, mask=mask)
    expect = cd.colliding_effect_bce_loss(
        logits=z, labels=labels, old_logits=z_old, neighbours=neighbours, weights=weights,
        num_old_classes=num_old, mask=mask)
    return loss, expect, new_stats[dde_icarl_fl.MOMENTUM], parts["neighbours"]

  features = np.asarray(images).reshape(6, -1)
  for num_old, expect_h in ((2, 0.9 * np.asarray(h0) + features[:5].mean(0)),
                            (0, np.asarray(h0))):
    loss, expect, h, used = run(jnp.int32(num_old))
    np.testing.assert_allclose(np.asarray(h), expect_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), float(expect), rtol=1e-6)
    # Task 1 (num_old = 2): every valid row has 2 neighbours among the new rows 1, 2, 3.
    assert float(used) == (2.0 if num_old else 0.0)


# ----------------------------------------------------------------------------- training


@pytest.mark.slow  # compiles the whole round (herding, NME statistics): tens of seconds on 2 cores
def test_rounds_train_and_evaluate_across_a_task_change():
  stream = tiny_stream()
  settings = tiny_settings(batch_size=16)
  model = TinyLinear(num_classes=stream.num_classes)
  replay = tiny_replay(stream)
  algorithm = dde_icarl_fl.make_dde_icarl_fl(settings, replay, model, stream.mean, stream.std,
                                             stream.max_client_size, neighbours=3,
                                             eval_batch_size=16)
  state, history = rounds_across_a_task_change(algorithm, stream)
  assert [int(h["task"]) for h in history] == [0, 0, 1, 1]
  assert all(np.isfinite(float(h["train/loss"])) for h in history)
  # Task 0: no old model, no neighbours, no momentum; task 1: both.
  assert [float(h["train/neighbours"]) for h in history[:2]] == [0.0, 0.0]
  assert [float(h["dde/momentum_norm"]) for h in history[:2]] == [0.0, 0.0]
  assert float(history[3]["train/neighbours"]) > 0 and float(history[3]["dde/momentum_norm"]) > 0
  assert float(history[3]["dde/exemplars"]) > 0
  assert sum(int(h["dde/transitions"]) for h in history) >= 1
  stored = np.asarray(state["clients"].memory.labels)[np.asarray(state["clients"].memory.valid)]
  assert stored.size and (stored < 2).all()
  correct, total, predicted = evaluate_seen(algorithm, state, stream)
  assert int(np.sum(total)) == len(stream.test_labels) == int(np.sum(predicted))
  assert 0 <= int(np.sum(correct))


@pytest.mark.slow  # the trainer end to end (simple_cnn compiles)
def test_end_to_end_writes_table1(tmp_path):
  c = tiny_cil_config("dde_icarl_fl")
  c.dde.memory_size = 8
  c.dde.neighbours = 3
  _, results, records, _ = train_tiny_and_check_table1(c, tmp_path / "run")
  assert len(results["seen_accuracy"]) == 2
  assert all("train/neighbours" in r and "dde/exemplars" in r for r in records)
  assert records[-1]["train/neighbours"] > 0 and records[-1]["dde/momentum_norm"] > 0


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for variant, tasks in (("dde_icarl_fl", 10), ("dde_icarl_fl_tasks5", 5),
                         ("dde_icarl_fl_tasks20", 20), ("dde_icarl_fl_quick", 4)):
    config = module.get_config(variant)
    validate_config(config)
    assert config.algorithm == "dde_icarl_fl" and config.scenario.num_tasks == tasks
    assert config.dde.neighbours == 10 and config.dde.alpha == 0.5
    assert config.local.lr == (0.5 if variant.endswith("_quick") else 2.0)
    assert config.local.lr == module.get_config(
        "icarl_fl_quick" if variant.endswith("_quick") else "icarl_fl").local.lr
  assert module.get_config("dde_icarl_fl").dde.memory_size == 2000
  assert module.get_config("dde_icarl_fl_quick").dde.memory_size == 90
  for field, value in (("neighbours", 0), ("self_weight", 0.0), ("momentum", 1.0),
                       ("alpha", 1.5)):
    broken = module.get_config("dde_icarl_fl")
    broken.dde[field] = value
    with pytest.raises(Exception, match=f"config.dde.{field}"):
      validate_config(broken)

"""Tests of BiC + FL (`fedjax_het.algorithms.bic_fl`) and its losses (`losses.incremental`)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import bic_fl
from fedjax_het.cil import exemplars, masking
from fedjax_het.config import load_module, validate_config
from fedjax_het.losses import incremental
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                   train_tiny_and_check_table1)
from tests.tiny_models import TinyLinear
from tests.tiny_runs import evaluate_seen, rounds_across_a_task_change, tiny_replay

CONFIGS = pathlib.Path(__file__).parents[1] / "fedjax_het/configs/cifar100.py"


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  shifted = z - z.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _bic_kd(z, z_old, num_old, temperature, valid):
  p_old = np.exp(_log_softmax(np.asarray(z_old)[:, :num_old] / temperature))
  rows = -np.sum(p_old * _log_softmax(np.asarray(z)[:, :num_old] / temperature), -1)
  return float(np.sum(rows * valid) / np.sum(valid))


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_bic_distillation_matches_numpy(scale):
  rng = np.random.default_rng(2)
  z = (rng.standard_normal((4, 6)) * scale).astype(np.float32)
  z_old = (rng.standard_normal((4, 6)) * scale).astype(np.float32)
  valid = np.asarray([1, 0, 1, 1], np.float32)
  loss = incremental.bic_distillation_loss(
      logits=jnp.asarray(z), old_logits=jnp.asarray(z_old), num_old_classes=4,
      temperature=2.0, mask=jnp.asarray(valid, bool))
  assert np.isfinite(float(loss))
  np.testing.assert_allclose(float(loss), _bic_kd(z, z_old, 4, 2.0, valid), rtol=1e-5, atol=1e-4)
  grads = np.asarray(jax.grad(lambda x: incremental.bic_distillation_loss(
      logits=x, old_logits=jnp.asarray(z_old), num_old_classes=4))(jnp.asarray(z)))
  assert np.isfinite(grads).all() and not grads[:, 4:].any()
  no_old = jax.grad(lambda x: incremental.bic_distillation_loss(
      logits=x, old_logits=jnp.asarray(z_old), num_old_classes=0))(jnp.asarray(z))
  assert float(incremental.bic_distillation_loss(
      logits=jnp.asarray(z), old_logits=jnp.asarray(z_old), num_old_classes=0)) == 0.0
  assert not np.asarray(no_old).any()


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_old_class_distillation_matches_numpy(scale):
  rng = np.random.default_rng(3)
  z = (rng.standard_normal((3, 5)) * scale).astype(np.float32)
  z_old = (rng.standard_normal((3, 5)) * scale).astype(np.float32)
  loss = incremental.old_class_distillation_loss(logits=jnp.asarray(z),
                                                 old_logits=jnp.asarray(z_old),
                                                 num_old_classes=2)
  z64, t = np.asarray(z, np.float64)[:, :2], 1 / (1 + np.exp(-np.asarray(z_old, np.float64)[:, :2]))
  expect = np.mean(np.logaddexp(0.0, z64) - z64 * t)
  assert np.isfinite(float(loss))
  np.testing.assert_allclose(float(loss), expect, rtol=1e-5, atol=1e-4)


def test_bias_correction_scales_each_task_group():
  z = jnp.arange(6, dtype=jnp.float32)[None, :]
  q = incremental.bias_corrected_logits(z, jnp.asarray([1.0, 2.0, 0.5]),
                                        jnp.asarray([0.0, -1.0, 3.0]), 2)
  np.testing.assert_allclose(q, [[0.0, 1.0, 3.0, 5.0, 5.0, 5.5]])


def test_latest_layer_keeps_one_pair():
  bias = {"alpha": jnp.asarray([0.5, 0.8, 1.0]), "beta": jnp.asarray([1.0, -2.0, 0.0])}
  alpha, beta = bic_fl.latest_layer(bias, jnp.int32(1))
  np.testing.assert_allclose(alpha, [1.0, 0.8, 1.0])
  np.testing.assert_allclose(beta, [0.0, -2.0, 0.0])
  alpha, beta = bic_fl.latest_layer(bias, jnp.int32(-1))
  np.testing.assert_allclose(alpha, [1.0, 1.0, 1.0])
  np.testing.assert_allclose(beta, [0.0, 0.0, 0.0])


def test_local_loss_is_lambda_weighted_kd_plus_ce_with_a_corrected_teacher():
  model = TinyLinear(num_classes=6)
  keys = jax.random.split(jax.random.key(0), 3)
  variables = models.init_variables(model, keys[0])
  old = models.init_variables(model, keys[1])
  images = jax.random.normal(keys[2], (4, 32, 32, 3))
  labels = jnp.asarray([0, 2, 3, 1], jnp.int32)
  mask = jnp.asarray([True, True, True, False])
  alpha, beta = jnp.asarray([0.8, 1.0, 1.0]), jnp.asarray([0.3, 0.0, 0.0])  # task 0's pair
  aux = {"class_mask": masking.seen_class_mask(4, 6), "old_model": old, "old_alpha": alpha,
         "old_beta": beta, "task": jnp.int32(1)}
  loss_fn = jax.jit(bic_fl.bic_local_loss(model, classes_per_task=2, temperature=2.0))
  loss, (_, parts) = loss_fn(variables["params"], variables["batch_stats"], images, labels,
                             mask, jax.random.key(1), aux)
  _, z, _ = models.apply_model(model, variables, images, train=False)
  _, z_old, _ = models.apply_model(model, old, images, train=False)
  fix = np.asarray([0.8, 0.8, 1, 1, 1, 1]), np.asarray([0.3, 0.3, 0, 0, 0, 0])
  q, q_old = np.asarray(z), np.asarray(z_old) * fix[0] + fix[1]  # the teacher is corrected
  valid = np.asarray([1, 1, 1, 0], np.float32)
  ce_rows = -_log_softmax(q[:, :4])[np.arange(4), np.asarray(labels)]
  ce = float(np.sum(ce_rows * valid) / 3)
  kd = _bic_kd(q, q_old, 2, 2.0, valid)
  np.testing.assert_allclose(float(parts["ce"]), ce, rtol=1e-5)
  np.testing.assert_allclose(float(parts["kd"]), kd, rtol=1e-5)
  np.testing.assert_allclose(float(loss), 0.5 * kd + 0.5 * ce, rtol=1e-5)


def test_validation_split_is_class_balanced():
  memory = exemplars.init_memory(12, (4,))
  labels = jnp.asarray([0] * 6 + [1] * 6, jnp.int32)
  memory = memory._replace(labels=labels, valid=jnp.ones((12,), bool),
                           ranks=jnp.tile(jnp.arange(6, dtype=jnp.int32), 2),
                           num_seen=jnp.int32(2))
  current = jnp.asarray([2, 3, 2, 2, 3, 3, 3, 2], jnp.int32)
  valid = jnp.asarray([True] * 7 + [False])
  # m = 6 per class, v = floor(0.34 * 6) = 2: ranks 4, 5 of each class; first 2 of each new class.
  held_new, held_memory = bic_fl.validation_split(memory, current, valid, fraction=0.34,
                                                  num_classes=4)
  np.testing.assert_array_equal(held_memory, np.tile([0, 0, 0, 0, 1, 1], 2).astype(bool))
  np.testing.assert_array_equal(held_new, [1, 1, 1, 0, 1, 0, 0, 0])
  empty = exemplars.init_memory(12, (4,))
  held_new, held_memory = bic_fl.validation_split(empty, current, valid, fraction=0.34,
                                                  num_classes=4)
  assert not np.asarray(held_new).any() and not np.asarray(held_memory).any()


def test_fit_bias_undoes_a_new_class_bias():
  """Logits whose new group (task 1) is inflated by 3: the fitted pair lowers it."""
  rng = np.random.default_rng(4)
  labels = np.repeat(np.arange(4), 10)
  z = rng.standard_normal((40, 4)).astype(np.float32)
  z[np.arange(40), labels] += 2.0
  z[:, 2:] += 3.0
  fit = jax.jit(lambda z: bic_fl.fit_bias(
      z, jnp.asarray(labels), jnp.ones((40,), bool), jnp.int32(1), num_tasks=2,
      classes_per_task=2, class_mask=jnp.ones((4,), bool), steps=300, learning_rate=0.05))
  alpha, beta = fit(jnp.asarray(z))
  assert float(beta) < -1.0 and np.isfinite(float(alpha))
  def ce(a, b):
    q = z.astype(np.float64).copy()
    q[:, 2:] = a * q[:, 2:] + b
    return -np.mean(_log_softmax(q)[np.arange(40), labels])
  assert ce(float(alpha), float(beta)) < ce(1.0, 0.0) - 0.5


def test_rounds_learn_a_bias_pair_at_the_end_of_task_1():
  stream = tiny_stream()
  settings = tiny_settings(batch_size=16, lr=0.01)
  model = TinyLinear(num_classes=stream.num_classes)
  replay = tiny_replay(stream)
  algorithm = bic_fl.make_bic_fl(settings, replay, model, stream.mean, stream.std,
                                 stream.max_client_size, validation_fraction=0.25,
                                 bias_steps=20, eval_batch_size=16)

  def no_correction_before_the_last_round(state, history):
    if len(history) < 4:
      np.testing.assert_array_equal(state["bias"]["alpha"], [1.0, 1.0])

  state, history = rounds_across_a_task_change(
      algorithm, stream, after_round=no_correction_before_the_last_round)
  assert [int(h["task"]) for h in history] == [0, 0, 1, 1]
  assert all(np.isfinite(float(h["train/loss"])) for h in history)
  assert float(history[0]["train/kd"]) == 0.0
  assert float(history[3]["bic/validation"]) > 0   # a sampled client held data out
  assert float(state["bias"]["alpha"][1]) != 1.0 or float(state["bias"]["beta"][1]) != 0.0
  assert float(history[3]["bic/alpha"]) == float(state["bias"]["alpha"][1])
  assert float(state["bias"]["alpha"][0]) == 1.0 and float(state["bias"]["beta"][0]) == 0.0
  correct, total, _ = evaluate_seen(algorithm, state, stream)
  assert int(np.sum(total)) == len(stream.test_labels) and 0 <= int(np.sum(correct))


@pytest.mark.slow  # the trainer end to end (simple_cnn compiles): about 20 s on 2 cores
def test_end_to_end_writes_table1(tmp_path):
  c = tiny_cil_config("bic_fl")
  c.bic.memory_size = 8
  c.bic.bias_steps = 10
  _, results, records, _ = train_tiny_and_check_table1(c, tmp_path / "run")
  assert len(results["seen_accuracy"]) == 2
  assert all("bic/alpha" in r and "train/kd" in r for r in records)
  # 2 sampled clients x |theta| = 93136 bytes (simple_cnn, width 0.5, 4 classes) up, and at
  # the bias correction (round 4) each client's (alpha, beta); down the global model with the
  # bias layers (2 x 2 tasks x 4 bytes), in task 1 the old model, at the correction the
  # aggregated model.
  assert [r["train/server/bytes_up"] for r in records] == [2 * 93136.0] * 3 + [
      2 * (93136.0 + 8)]
  assert [r["train/server/bytes_down"] for r in records] == [
      2 * (k * 93136.0 + 16) for k in (1, 1, 2, 3)]


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for variant, tasks in (("bic_fl", 10), ("bic_fl_tasks5", 5), ("bic_fl_tasks20", 20),
                         ("bic_fl_quick", 4)):
    config = module.get_config(variant)
    validate_config(config)
    assert config.algorithm == "bic_fl" and config.scenario.num_tasks == tasks
    assert config.local.lr == 0.1 and config.bic.temperature == 2.0
  assert module.get_config("bic_fl_quick").bic.memory_size == 90
  broken = module.get_config("bic_fl")
  broken.bic.validation_fraction = 1.5
  with pytest.raises(Exception, match="config.bic.validation_fraction"):
    validate_config(broken)

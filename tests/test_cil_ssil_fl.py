"""Tests of SS-IL + FL (`fedjax_het.algorithms.ssil_fl`) and its losses (`losses.incremental`)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import ssil_fl
from fedjax_het.config import load_module, validate_config
from fedjax_het.data.augment import normalizer
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


def _separated_ce(z, y, num_old, num_seen, valid):
  rows = []
  for zb, yb in zip(np.asarray(z, np.float64), y):
    lo, hi = (0, num_old) if yb < num_old else (num_old, num_seen)
    rows.append(-_log_softmax(zb[lo:hi])[yb - lo])
  rows = np.asarray(rows)
  return float(np.sum(rows * valid) / np.sum(valid))


def _task_kd(z, z_old, k, tasks, temperature, valid):
  rows = np.zeros(len(z))
  for s in range(tasks):
    p_old = np.exp(_log_softmax(np.asarray(z_old)[:, s * k:(s + 1) * k] / temperature))
    rows += np.sum(p_old * (np.log(p_old) - _log_softmax(np.asarray(z)[:, s * k:(s + 1) * k]
                                                         / temperature)), -1)
  return float(np.sum(rows * temperature**2 * valid) / np.sum(valid))


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_separated_softmax_matches_numpy(scale):
  rng = np.random.default_rng(0)
  z = (rng.standard_normal((5, 8)) * scale).astype(np.float32)
  y = np.asarray([0, 3, 4, 5, 1])
  valid = np.asarray([1, 1, 1, 1, 0], np.float32)
  loss = incremental.separated_softmax_cross_entropy(
      logits=jnp.asarray(z), labels=jnp.asarray(y), num_old_classes=4, num_seen_classes=6,
      mask=jnp.asarray(valid, bool))
  expect = _separated_ce(z, y, 4, 6, valid)
  assert np.isfinite(float(loss))
  np.testing.assert_allclose(float(loss), expect, rtol=1e-5, atol=1e-4)
  grads = jax.grad(lambda x: incremental.separated_softmax_cross_entropy(
      logits=x, labels=jnp.asarray(y), num_old_classes=4, num_seen_classes=6))(jnp.asarray(z))
  grads = np.asarray(grads)
  assert np.isfinite(grads).all()
  # New samples (rows 2, 3) never touch the old columns; old samples never the new ones;
  # unseen columns [6, 8) get nothing.
  assert not grads[2:4, :4].any() and not grads[[0, 1, 4], 4:].any() and not grads[:, 6:].any()


def test_separated_softmax_without_old_classes_is_the_seen_softmax_ce():
  z = jnp.asarray([[2.0, -1.0, 5.0, 9.0], [0.5, 0.25, -3.0, 1.0]])
  loss = incremental.separated_softmax_cross_entropy(
      logits=z, labels=jnp.asarray([2, 0]), num_old_classes=0, num_seen_classes=3)
  expect = np.mean([-_log_softmax(np.asarray(z)[0, :3])[2], -_log_softmax(np.asarray(z)[1, :3])[0]])
  np.testing.assert_allclose(float(loss), expect, rtol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_task_wise_kd_matches_numpy(scale):
  rng = np.random.default_rng(1)
  z = (rng.standard_normal((4, 9)) * scale).astype(np.float32)
  z_old = (rng.standard_normal((4, 9)) * scale).astype(np.float32)
  valid = np.asarray([1, 1, 0, 1], np.float32)
  loss = incremental.task_wise_distillation_loss(
      logits=jnp.asarray(z), old_logits=jnp.asarray(z_old), classes_per_task=3,
      num_old_tasks=2, temperature=2.0, mask=jnp.asarray(valid, bool))
  expect = _task_kd(z, z_old, 3, 2, 2.0, valid)
  assert np.isfinite(float(loss))
  np.testing.assert_allclose(float(loss), expect, rtol=1e-4, atol=1e-3)
  grads = np.asarray(jax.grad(lambda x: incremental.task_wise_distillation_loss(
      logits=x, old_logits=jnp.asarray(z_old), classes_per_task=3, num_old_tasks=2))(
          jnp.asarray(z)))
  assert np.isfinite(grads).all() and not grads[:, 6:].any()
  assert float(incremental.task_wise_distillation_loss(
      logits=jnp.asarray(z), old_logits=jnp.asarray(z), classes_per_task=3,
      num_old_tasks=3)) == pytest.approx(0.0, abs=1e-5)
  assert float(incremental.task_wise_distillation_loss(
      logits=jnp.asarray(z), old_logits=jnp.asarray(z_old), classes_per_task=3,
      num_old_tasks=0)) == 0.0


def test_local_loss_is_separated_ce_plus_task_kd_on_new_rows_and_the_whole_memory():
  model = TinyLinear(num_classes=6)
  keys = jax.random.split(jax.random.key(0), 4)
  variables = models.init_variables(model, keys[0])
  old = models.init_variables(model, keys[1])
  images = jax.random.randint(keys[2], (3, 32, 32, 3), 0, 255).astype(jnp.uint8)
  memory = jax.random.randint(keys[3], (5, 32, 32, 3), 0, 255).astype(jnp.uint8)
  preprocess = normalizer(jnp.full((3,), 0.5), jnp.full((3,), 0.25))
  labels = jnp.asarray([2, 3, 2], jnp.int32)            # task 1: new classes 2, 3
  mask = jnp.asarray([True, True, False])
  memory_labels = jnp.asarray([0, 1, 0, 1, 0], jnp.int32)
  memory_valid = jnp.asarray([True, True, False, True, False])
  aux = {"replay_images": memory, "replay_labels": memory_labels, "replay_valid": memory_valid,
         "old_model": old, "task": jnp.int32(1)}
  # R = 4 >= the 3 stored exemplars: every one is drawn, whatever the key.
  loss_fn = jax.jit(ssil_fl.ssil_local_loss(model, preprocess, classes_per_task=2, replay=4,
                                            temperature=2.0))
  loss, (_, parts) = loss_fn(variables["params"], variables["batch_stats"],
                             preprocess(images), labels, mask, jax.random.key(7), aux)
  x = jnp.concatenate([preprocess(images), preprocess(memory[np.asarray([0, 1, 3])])])
  y = np.asarray([2, 3, 2, 0, 1, 1])
  valid = np.asarray([1, 1, 0, 1, 1, 1], np.float32)
  _, z, _ = models.apply_model(model, variables, x, train=False)
  _, z_old, _ = models.apply_model(model, old, x, train=False)
  ce = _separated_ce(z, y, 2, 4, valid)
  kd = _task_kd(z, z_old, 2, 1, 2.0, valid)
  np.testing.assert_allclose(float(parts["ce"]), ce, rtol=1e-4)
  np.testing.assert_allclose(float(parts["kd"]), kd, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(loss), ce + kd, rtol=1e-4)


def test_replay_batch_size_keeps_the_memory_ratio():
  assert ssil_fl.replay_batch_size(128, 2000, 720) == 356   # ceil(128 * 2000 / 720)
  assert ssil_fl.replay_batch_size(64, 90, 300) == 20
  assert ssil_fl.replay_batch_size(64, 8, 10) == 8           # at most the memory
  assert ssil_fl.replay_batch_size(64, 90, 300, requested=16) == 16


def test_rounds_train_and_evaluate_across_a_task_change():
  stream = tiny_stream()
  settings = tiny_settings(batch_size=16)
  model = TinyLinear(num_classes=stream.num_classes)
  replay = tiny_replay(stream)
  algorithm = ssil_fl.make_ssil_fl(settings, replay, model, stream.mean, stream.std,
                                   stream.max_client_size, eval_batch_size=16)
  state, history = rounds_across_a_task_change(algorithm, stream)
  assert [int(h["task"]) for h in history] == [0, 0, 1, 1]
  assert all(np.isfinite(float(h["train/loss"])) for h in history)
  assert float(history[0]["train/kd"]) == 0.0 and np.isfinite(float(history[3]["train/kd"]))
  assert sum(int(h["ssil/transitions"]) for h in history) >= 1
  assert float(history[3]["ssil/exemplars"]) > 0
  memory = state["clients"].memory
  stored = np.asarray(memory.labels)[np.asarray(memory.valid)]
  assert stored.size and (stored < 2).all()   # only task 0's classes are exemplars
  correct, total, _ = evaluate_seen(algorithm, state, stream)
  assert int(np.sum(total)) == len(stream.test_labels) and 0 <= int(np.sum(correct))


@pytest.mark.slow  # the trainer end to end (simple_cnn compiles): about 20 s on 2 cores
def test_end_to_end_writes_table1(tmp_path):
  c = tiny_cil_config("ssil_fl")
  c.ssil.memory_size = 8
  _, results, records, _ = train_tiny_and_check_table1(c, tmp_path / "run")
  assert len(results["seen_accuracy"]) == 2
  assert all("train/kd" in r and "ssil/exemplars" in r for r in records)
  # 2 sampled clients x |theta| = 93136 bytes (simple_cnn, width 0.5, 4 classes) up; down
  # the global model, and in task 1 (rounds 3 and 4) the old model too.
  assert [r["train/server/bytes_up"] for r in records] == [2 * 93136.0] * 4
  assert [r["train/server/bytes_down"] for r in records] == [2 * 93136.0] * 2 + [
      4 * 93136.0] * 2


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for variant, tasks in (("ssil_fl", 10), ("ssil_fl_tasks5", 5), ("ssil_fl_tasks20", 20),
                         ("ssil_fl_quick", 4)):
    config = module.get_config(variant)
    validate_config(config)
    assert config.algorithm == "ssil_fl" and config.scenario.num_tasks == tasks
    assert config.local.lr == 0.1 and config.ssil.temperature == 2.0
  assert module.get_config("ssil_fl").ssil.memory_size == 2000
  assert module.get_config("ssil_fl_quick").ssil.memory_size == 90
  broken = module.get_config("ssil_fl")
  broken.ssil.temperature = 0.0
  with pytest.raises(Exception, match="config.ssil.temperature"):
    validate_config(broken)

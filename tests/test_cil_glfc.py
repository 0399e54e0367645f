"""Tests of GLFC's client side on the class-incremental task stream (`fedjax_het.algorithms.glfc`)."""

import dataclasses
import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses, models
from fedjax_het.cil import exemplars
from fedjax_het.algorithms import cil_replay
from fedjax_het.algorithms import glfc as glfc_lib
from fedjax_het.cil import masking
from fedjax_het.cil import metrics as cil_metrics
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import validate_config
from fedjax_het.reports import class_incremental as cil_report
from fedjax_het.train import train_and_evaluate
from fedjax_het.config import load_module
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import rounds
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                   run_across_a_task_change, train_tiny_and_check_table1)
from tests.tiny_models import TinyLinear


@pytest.fixture(scope="module")
def stream():
  return tiny_stream()


def _settings(**overrides):
  return tiny_settings(**{"batch_size": 16, **overrides})


def _glfc(stream, memory=8, transition="stream"):
  return glfc_lib.GLFCSettings(memory_size=memory, transition=transition, threshold=1.2,
                               distinct=False, max_per_class=memory,
                               max_client_classes=int(stream.client_classes.sum(-1).max()))


def _algorithm(stream, settings, glfc):
  model = TinyLinear(num_classes=stream.num_classes)
  return model, glfc_lib.make_glfc(settings, glfc, model, stream.mean, stream.std,
                                   stream.max_client_size, eval_batch_size=16)


def test_pool_index_encoding_round_trips():
  idx = jnp.asarray([0, 1, 255, 256, 70000, 2**31 - 1], jnp.int32)
  encoded = cil_replay.encode_pool_indices(idx)
  assert encoded.shape == (6, 4) and encoded.dtype == jnp.uint8
  np.testing.assert_array_equal(cil_replay.decode_pool_indices(encoded), idx)


@pytest.mark.parametrize("use_old", [True, False])
def test_local_objective_is_half_gc_plus_half_rd(use_old):
  model = TinyLinear(num_classes=6)
  keys = jax.random.split(jax.random.key(0), 4)
  variables = models.init_variables(model, keys[0])
  old = models.init_variables(model, keys[1])
  images = jax.random.normal(keys[2], (5, 32, 32, 3))
  labels = jnp.asarray([0, 1, 2, 3, 1], jnp.int32)
  mask = jnp.asarray([True, True, True, True, False])
  class_mask = masking.seen_class_mask(4, 6)
  aux = {"class_mask": class_mask, "old_model": old, "use_old": jnp.asarray(use_old),
         "num_old": jnp.int32(2), "gc_old": jnp.int32(2)}
  loss_fn = jax.jit(glfc_lib.glfc_local_loss(model))
  loss, (_, parts) = loss_fn(variables["params"], variables["batch_stats"], images, labels,
                             mask, jax.random.key(3), aux)
  _, logits, _ = models.apply_model(model, variables, images, train=True)
  _, old_logits, _ = models.apply_model(model, old, images, train=False)
  gc = losses.glfc.class_aware_gradient_compensation_loss(
      logits=logits, labels=labels, num_old_classes=2, class_mask=class_mask, mask=mask)
  rd = losses.glfc.class_semantic_relation_distillation_loss(
      logits=logits, labels=labels, old_logits=old_logits, num_old_classes=2,
      class_mask=class_mask, mask=mask)
  # The same on the seen columns of a grown head (the authors' layout).
  rd_small = losses.glfc.class_semantic_relation_distillation_loss(
      logits=logits[:, :4], labels=labels, old_logits=old_logits[:, :2], mask=mask)
  np.testing.assert_allclose(rd, rd_small, rtol=1e-6)
  np.testing.assert_allclose(parts["gc"], gc, rtol=1e-6)
  np.testing.assert_allclose(parts["rd"], rd, rtol=1e-6)
  np.testing.assert_allclose(loss, 0.5 * gc + 0.5 * rd if use_old else gc, rtol=1e-6)


def _run(stream, settings, glfc, num_rounds, key=0):
  _, algorithm = _algorithm(stream, settings, glfc)
  data = jax.device_put(cil_stream.stream_arrays(stream))
  round_fn = jax.jit(rounds.make_round_fn(algorithm))
  state = rounds.initial_state(algorithm, jax.random.key(key), data)
  history = [(state, None)]
  for _ in range(num_rounds):
    state, metrics = round_fn(state, data)
    history.append((state, metrics))
  return algorithm, data, history


def test_only_sampled_clients_update_their_state(stream):
  _, _, history = _run(stream, _settings(), _glfc(stream), 3)
  for (before, _), (after, metrics) in zip(history[:-1], history[1:]):
    sampled = np.asarray(metrics["clients"])
    others = np.setdiff1d(np.arange(stream.client_joined.shape[1]), sampled)
    chex.assert_trees_all_equal(jax.tree_util.tree_map(lambda x: x[others], before["clients"]),
                                jax.tree_util.tree_map(lambda x: x[others], after["clients"]))
    np.testing.assert_array_equal(np.asarray(after["clients"].task)[sampled],
                                  int(metrics["task"]))


def test_exemplars_after_a_transition_are_the_herding_selection(stream):
  # Every client sampled every round; task 0 in round 0, task 1 in round 1.
  settings = _settings(rounds_per_task=1, clients_per_round=3)
  glfc = _glfc(stream, memory=6)
  _, data, history = _run(stream, settings, glfc, 2)
  (state0, metrics0), (state1, metrics1) = history[1], history[2]
  np.testing.assert_array_equal(np.asarray(state1["clients"].memory.valid).sum(-1)[3:], 0)
  assert int(metrics0["glfc/transitions/true"]) == 0
  # The old model of task 1 is the global model at the end of task 0.
  chex.assert_trees_all_equal(state1["old_model"], state0["server"])
  model = TinyLinear(num_classes=stream.num_classes)
  forward = cil_replay.make_eval_forward(model, normalizer(stream.mean, stream.std), 16)
  moved = 0
  for client in np.asarray(metrics1["clients"]):
    before = stream.client_classes[0, client]
    after = stream.client_classes[1, client]
    new = np.nonzero(before & ~after)[0]
    memory = jax.tree_util.tree_map(lambda x, c=client: x[c], state1["clients"].memory)
    if not new.size:
      assert not bool(np.asarray(memory.valid).any())
      continue
    moved += 1
    n = int(stream.client_sizes[0, client])
    rows = stream.client_indices[0, client, :n]
    features, _ = forward(state0["server"], stream.images[rows])
    per_class = glfc.memory_size // new.size
    expect_rows, expect_labels = [], []
    for cls in new:  # iCaRL herding on the received global model's features
      members = rows[stream.labels[rows] == cls]
      order, ok = exemplars.herding_order(features[stream.labels[rows] == cls],
                                          max_select=per_class)
      assert bool(np.asarray(ok).all())
      expect_rows += list(members[np.asarray(order)])
      expect_labels += [cls] * per_class
    count = int(np.asarray(memory.valid).sum())
    assert count == len(expect_rows) and int(memory.num_seen) == new.size
    np.testing.assert_array_equal(
        np.asarray(cil_replay.decode_pool_indices(memory.images))[:count], expect_rows)
    np.testing.assert_array_equal(np.asarray(memory.labels)[:count], expect_labels)
    np.testing.assert_array_equal(np.asarray(memory.ranks)[:count],
                                  np.tile(np.arange(per_class), new.size))
  assert moved >= 1 and int(metrics1["glfc/transitions/hit"]) == moved
  assert int(metrics1["glfc/transitions/true"]) == moved


def test_round_traces_once_across_a_task_change(stream):
  _, algorithm = _algorithm(stream, _settings(), _glfc(stream, transition="entropy"))
  run_across_a_task_change(algorithm, stream)


def _tiny_config():
  c = tiny_cil_config("glfc")
  c.name = "tiny_glfc"
  c.local.lr = 0.5
  c.glfc.memory_size = 8
  c.glfc.proxy.reconstruction_steps = 5  # the proxy's mechanics, not its image quality
  c.glfc.proxy.monitor_images = 2
  return c


@pytest.mark.slow  # tests/test_cil_pinned.py runs GLFC end to end; its table: test_reports_*
def test_end_to_end_writes_table1(tmp_path):
  config = _tiny_config()
  _, results, records, matrix = train_tiny_and_check_table1(config, tmp_path / "full")
  table = (tmp_path / "full" / "results.md").read_text()
  assert cil_metrics.table1_row(cil_report.METHOD_LABELS["glfc"], matrix.seen, 2) in table
  assert set(results["transitions"]) == {"true", "detected", "hit", "false"}
  assert all("glfc/transitions/detected" in r and "train/rd" in r for r in records)


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
  config = _tiny_config()
  full = train_and_evaluate(config, tmp_path / "full")
  results = json.loads((tmp_path / "full" / "results.json").read_text())
  part = train_and_evaluate(config, tmp_path / "split", max_rounds=3)
  assert part["rounds_done"] == 3
  resumed = train_and_evaluate(config, tmp_path / "split")
  assert resumed["rounds_done"] == 4
  chex.assert_trees_all_equal(resumed["state"]["server"], full["state"]["server"])
  assert json.loads((tmp_path / "split" / "results.json").read_text()) == results


def test_experiment_configs_validate():
  module = load_module(pathlib.Path(__file__).parents[1] / "fedjax_het/configs/cifar100.py")
  quick, fedavg_quick = module.get_config("glfc_quick"), module.get_config("fedavg_cil_quick")
  paper = module.get_config("glfc")
  for config in (quick, paper):
    validate_config(config)
    assert config.algorithm == "glfc" and config.glfc.old_model == "proxy"
  assert quick.scenario.to_dict() == fedavg_quick.scenario.to_dict()
  assert (paper.glfc.memory_size, paper.glfc.entropy_threshold, paper.local.lr) == (
      2000, 1.2, 2.0)
  broken = module.get_config("glfc")
  broken.glfc.transition = "oracle"
  with pytest.raises(Exception, match="config.glfc.transition"):
    validate_config(broken)


@pytest.mark.parametrize("use_old", [True, False])
def test_ablated_objective_is_weighted_bce_plus_old_class_kd(use_old):
  """w/oCGC and w/oCRD with custom weights, against a NumPy computation of the objective."""
  model = TinyLinear(num_classes=6)
  keys = jax.random.split(jax.random.key(5), 4)
  variables = models.init_variables(model, keys[0])
  old = models.init_variables(model, keys[1])
  images = jax.random.normal(keys[2], (5, 32, 32, 3))
  labels = jnp.asarray([0, 1, 2, 3, 1], jnp.int32)
  mask = np.asarray([True, True, True, True, False])
  class_mask = masking.seen_class_mask(4, 6)
  aux = {"class_mask": class_mask, "old_model": old, "use_old": jnp.asarray(use_old),
         "num_old": jnp.int32(2), "gc_old": jnp.int32(0)}
  loss_fn = jax.jit(glfc_lib.glfc_local_loss(model, relation_distillation=False, gc_weight=0.3,
                                             rd_weight=0.7, first_task_gc_weight=2.0))
  loss, (_, parts) = loss_fn(variables["params"], variables["batch_stats"], images, labels,
                             mask, jax.random.key(3), aux)
  _, logits, _ = models.apply_model(model, variables, images, train=True)
  _, old_logits, _ = models.apply_model(model, old, images, train=False)
  z, z_old = np.asarray(logits, np.float64)[:4], np.asarray(old_logits, np.float64)[:4]
  bce = lambda x, t: np.logaddexp(0.0, x) - x * t  # noqa: E731
  onehot = np.eye(6)[np.asarray(labels)[:4]]
  plain = np.mean(bce(z[:, :4], onehot[:, :4]))                  # w/oCGC: plain BCE
  kd = np.mean(bce(z[:, :2], 1 / (1 + np.exp(-z_old[:, :2]))))   # w/oCRD: old classes only
  np.testing.assert_allclose(parts["gc"], plain, rtol=1e-5)
  np.testing.assert_allclose(parts["rd"], kd, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.3 * plain + 0.7 * kd if use_old else 2.0 * plain,
                             rtol=1e-5)


def test_glfc_ablations_train(stream):
  """Without CGC and CRD: the gradient compensation is off (gc_old 0) and training runs."""
  glfc = dataclasses.replace(_glfc(stream), gradient_compensation=False,
                             relation_distillation=False)
  _, _, history = _run(stream, _settings(), glfc, 4)
  for _, metrics in history[1:]:
    assert np.isfinite(float(metrics["train/loss"])) and np.isfinite(float(metrics["train/rd"]))
  assert int(history[-1][1]["task"]) == 1 and float(history[-1][1]["train/rd"]) > 0


def test_ablation_configs():
  module = load_module(pathlib.Path(__file__).parents[1] / "fedjax_het/configs/cifar100.py")
  paper = module.get_config("glfc")
  assert paper.glfc.use_gradient_compensation and paper.glfc.use_relation_distillation
  assert (paper.glfc.gc_weight, paper.glfc.rd_weight, paper.glfc.first_task_gc_weight) == (
      0.5, 0.5, 1.0)
  for name, field in (("glfc_no_cgc", "use_gradient_compensation"),
                      ("glfc_no_crd", "use_relation_distillation")):
    for variant, tasks in ((name, 10), (f"{name}_tasks20", 20), (f"{name}_quick", 4)):
      config = module.get_config(variant)
      validate_config(config)
      assert config.algorithm == "glfc" and config.name == f"cifar100_{variant}"
      assert config.glfc[field] is False and config.scenario.num_tasks == tasks
      reference = module.get_config(variant.replace(name, "glfc"))
      reference.glfc[field] = False
      reference.name = config.name
      assert config.to_dict() == reference.to_dict()
  broken = module.get_config("glfc")
  broken.glfc.rd_weight = -1.0
  with pytest.raises(Exception, match="config.glfc.rd_weight"):
    validate_config(broken)

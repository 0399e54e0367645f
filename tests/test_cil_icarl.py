"""Tests of iCaRL + FL on the class-incremental task stream (`fedjax_het.algorithms.icarl_fl`)."""

import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import cil_replay, icarl_fl
from fedjax_het.cil import masking
from fedjax_het.cil import metrics as cil_metrics
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import base_config, validate_config
from fedjax_het.train import train_and_evaluate
from fedjax_het.config import load_module
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import rounds
from fedjax_het.errors import ConfigError
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                   run_across_a_task_change, train_tiny_and_check_table1)
from tests.tiny_models import TinyLinear, TinyMLP
from tests.tiny_runs import tiny_replay

CONFIGS = pathlib.Path(__file__).parents[1] / "fedjax_het/configs/cifar100.py"


@pytest.fixture(scope="module")
def stream():
  return tiny_stream()


def _settings(**overrides):
  return tiny_settings(**{"batch_size": 16, **overrides})


def _icarl(stream, memory=8):
  return tiny_replay(stream, memory)


def _algorithm(stream, settings, icarl, model=None):
  model = model or TinyLinear(num_classes=stream.num_classes)
  return model, cil_replay.make_icarl_fl(settings, icarl, model, stream.mean, stream.std,
                                         stream.max_client_size, eval_batch_size=16)


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _numpy_icarl_loss(logits, old_logits, labels, num_old, num_seen, valid):
  """iCaRL's BCE with distillation targets in float64 (the log of each sigmoid)."""
  z = np.asarray(logits, np.float64)[:, :num_seen]
  target = np.eye(logits.shape[1])[labels][:, :num_seen]
  target[:, :num_old] = _sigmoid(np.asarray(old_logits, np.float64)[:, :num_old])
  # log(1 - sigmoid(z)) as log(sigmoid(-z)): 1 - sigmoid(30) loses its digits even in float64.
  bce = -(target * np.log(_sigmoid(z)) + (1 - target) * np.log(_sigmoid(-z)))
  return bce.mean(axis=1)[valid].mean()


def _reading_head(model, offset, num_classes):
  """TinyLinear variables whose logit j is flat input offset + j (kernel = a shifted identity)."""
  variables = models.init_variables(model, jax.random.key(0))
  kernel = np.zeros((model.input_dim, num_classes), np.float32)
  kernel[offset + np.arange(num_classes), np.arange(num_classes)] = 1.0
  variables["params"]["head"] = {"kernel": jnp.asarray(kernel),
                                 "bias": jnp.zeros((num_classes,), jnp.float32)}
  return variables


@pytest.mark.parametrize("num_old", [0, 2])
def test_local_loss_is_bce_with_distillation_targets(num_old):
  c, seen = 6, 4
  model = TinyLinear(num_classes=c)
  # Saturated logits (+-30) included: float32 must stay finite and right.
  logits = np.asarray([[30.0, -30.0, 2.0, -1.0, 50.0, 0.0],
                       [-30.0, 30.0, -30.0, 30.0, -7.0, 3.0],
                       [0.5, 1.5, -2.5, 30.0, 0.0, 0.0],
                       [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], np.float32)
  old_logits = np.asarray([[30.0, 30.0, 0.0, 0.0, 0.0, 0.0],
                           [-30.0, -30.0, 0.0, 0.0, 0.0, 0.0],
                           [0.3, -1.2, 4.0, 0.0, 0.0, 0.0],
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
  labels = np.asarray([2, 3, 0, 1], np.int32)
  valid = np.asarray([True, True, True, False])
  # The current model reads its logits from inputs [0, C), the old model from [C, 2C).
  variables, old = _reading_head(model, 0, c), _reading_head(model, c, c)
  flat = np.zeros((4, model.input_dim), np.float32)
  flat[:, :c], flat[:, c:2 * c] = logits, old_logits
  images = jnp.asarray(flat.reshape(4, 32, 32, 3))
  aux = {"class_mask": masking.seen_class_mask(seen, c), "old_model": old,
         "num_old": jnp.int32(num_old)}
  loss_fn = jax.jit(cil_replay.icarl_local_loss(model))
  loss, _ = loss_fn(variables["params"], variables["batch_stats"], images, jnp.asarray(labels),
                    jnp.asarray(valid), jax.random.key(1), aux)
  expect = _numpy_icarl_loss(logits, old_logits, labels, num_old, seen, valid)
  assert np.isfinite(float(loss)) and expect > 1.0  # the saturated wrong columns cost ~30
  np.testing.assert_allclose(float(loss), expect, rtol=1e-5)
  # Gradients are finite too, and unseen head columns get none.
  grads = jax.grad(lambda p: loss_fn(p, variables["batch_stats"], images, jnp.asarray(labels),
                                     jnp.asarray(valid), jax.random.key(1), aux)[0])(
                                         variables["params"])
  kernel_grad = np.asarray(grads["head"]["kernel"])
  assert np.isfinite(kernel_grad).all() and not kernel_grad[:, seen:].any()


def test_nme_prediction_is_the_nearest_normalised_mean():
  rng = np.random.default_rng(0)
  c, d, b = 6, 5, 40
  features = rng.normal(size=(b, d)).astype(np.float32)
  sums = rng.normal(size=(c, d)).astype(np.float32) * 3
  counts = np.asarray([4, 0, 7, 1, 2, 9], np.int32)   # class 1 has no mean; 4, 5 unseen
  num_seen = 4
  scores, available = jax.jit(cil_replay.nme_scores)(features, sums, counts, jnp.int32(num_seen))
  predicted = np.asarray(masking.masked_predictions(scores, available))
  f = features / np.linalg.norm(features, axis=1, keepdims=True)
  means = sums / np.maximum(counts, 1)[:, None]
  means /= np.linalg.norm(means, axis=1, keepdims=True)
  distance = ((f[:, None, :] - means[None]) ** 2).sum(-1)
  candidates = np.asarray([0, 2, 3])
  expect = candidates[np.argmin(distance[:, candidates], axis=1)]
  np.testing.assert_array_equal(np.asarray(available), [True, False, True, True, False, False])
  np.testing.assert_array_equal(predicted, expect)
  assert len(set(expect.tolist())) > 1


@pytest.mark.parametrize("classifier", ["head", "nme"])
def test_classifier_from_the_config_reaches_the_evaluation(stream, classifier):
  # icarl.classifier = "head": top-1 of the global model's logits among the seen classes (GLFC's
  # and FedAvg's evaluation); "nme": iCaRL's nearest mean of exemplars. NumPy predicts by hand
  # from the normalised images and a random head.
  model = TinyLinear(num_classes=stream.num_classes)
  config = base_config("icarl_fl")
  config.icarl.classifier = classifier
  setup = cil_stream.StreamSetup(
      settings=_settings(), model=model, mean=stream.mean, std=stream.std,
      max_client_size=stream.max_client_size, client_classes=stream.client_classes,
      eval_batch_size=16)
  algorithm = icarl_fl.make(config, setup)
  data = jax.device_put(cil_stream.stream_arrays(stream))
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  num_seen, rng = 3, np.random.default_rng(0)
  kernel = rng.normal(size=(model.input_dim, stream.num_classes)).astype(np.float32)
  bias = rng.normal(size=(stream.num_classes,)).astype(np.float32)
  state["server"] = {"params": {"head": {"kernel": jnp.asarray(kernel),
                                         "bias": jnp.asarray(bias)}}}
  # NME statistics whose nearest mean is always class 1 (a mean only for it).
  state["class_counts"] = jnp.zeros_like(state["class_counts"]).at[1].set(1)
  correct, total, predicted = jax.jit(algorithm.evaluate)(
      state, (stream.test_images, stream.test_labels, jnp.int32(num_seen)))
  x = np.asarray(normalizer(stream.mean, stream.std)(stream.test_images), np.float64)
  logits = x.reshape(len(stream.test_labels), -1) @ kernel + bias
  expect = (np.argmax(logits[:, :num_seen], axis=1) if classifier == "head"
            else np.ones(len(stream.test_labels), np.int64))
  labels = stream.test_labels
  assert classifier == "nme" or len(set(expect.tolist())) == num_seen
  np.testing.assert_array_equal(predicted, np.bincount(expect, minlength=stream.num_classes))
  np.testing.assert_array_equal(correct, np.bincount(labels[expect == labels],
                                                     minlength=stream.num_classes))
  np.testing.assert_array_equal(total, np.bincount(labels, minlength=stream.num_classes))


def test_round_traces_once_across_a_task_change(stream):
  _, algorithm = _algorithm(stream, _settings(lr_schedule="glfc_code"), _icarl(stream))
  _, metrics = run_across_a_task_change(algorithm, stream)
  assert float(metrics["icarl/exemplars"][0]) > 0  # the memories were used in task 1


def test_class_means_and_nme_evaluation_match_numpy(stream):
  # Every client sampled every round; task 0 in round 0, task 1 in round 1 (a transition).
  settings = _settings(rounds_per_task=1, clients_per_round=3, epochs=2, batch_size=8)
  model = TinyMLP(num_classes=stream.num_classes)
  _, algorithm = _algorithm(stream, settings, _icarl(stream, memory=6), model)
  data = jax.device_put(cil_stream.stream_arrays(stream))
  round_fn = jax.jit(rounds.make_round_fn(algorithm))
  state = rounds.initial_state(algorithm, jax.random.key(3), data)
  norm = normalizer(stream.mean, stream.std)
  stored_any = False
  for _ in range(2):
    before = state
    state, metrics = round_fn(state, data)
    task = int(metrics["task"])
    body = state["server"]["params"]["body"]
    w, bias = np.asarray(body["kernel"], np.float64), np.asarray(body["bias"], np.float64)

    def features(rows, w=w, bias=bias):
      x = np.asarray(norm(stream.images[rows]), np.float64).reshape(len(rows), -1)
      f = x @ w + bias
      return f / np.linalg.norm(f, axis=1, keepdims=True)

    sums = np.zeros(np.shape(state["class_sums"]))
    counts = np.zeros(stream.num_classes, np.int64)
    for client in np.asarray(metrics["clients"]):
      n = int(stream.client_sizes[task, client])
      rows = list(stream.client_indices[task, client, :n])
      memory = jax.tree_util.tree_map(lambda x, c=client: np.asarray(x[c]),
                                      state["clients"].memory)
      stored = np.asarray(cil_replay.decode_pool_indices(memory.images))[memory.valid]
      stored_any |= stored.size > 0
      rows += list(stored)
      np.add.at(sums, stream.labels[rows], features(np.asarray(rows)))
      np.add.at(counts, stream.labels[rows], 1)
    reported = counts > 0
    expect_sums = np.where(reported[:, None], sums, np.asarray(before["class_sums"]))
    expect_counts = np.where(reported, counts, np.asarray(before["class_counts"]))
    np.testing.assert_allclose(np.asarray(state["class_sums"]), expect_sums, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(state["class_counts"]), expect_counts)

    # NME evaluation over the test set against a NumPy nearest mean.
    num_seen = (task + 1) * settings.classes_per_task
    correct, total, predicted = jax.jit(algorithm.evaluate)(
        state, (stream.test_images, stream.test_labels, jnp.int32(num_seen)))
    means = expect_sums / np.maximum(expect_counts, 1)[:, None]
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    x = np.asarray(norm(stream.test_images), np.float64).reshape(len(stream.test_labels), -1)
    ft = x @ w + bias
    ft /= np.linalg.norm(ft, axis=1, keepdims=True)
    distance = ((ft[:, None, :] - means[None]) ** 2).sum(-1)
    distance[:, ~((np.arange(stream.num_classes) < num_seen) & (expect_counts > 0))] = np.inf
    expect = np.argmin(distance, axis=1)
    labels = stream.test_labels
    np.testing.assert_array_equal(predicted, np.bincount(expect, minlength=stream.num_classes))
    np.testing.assert_array_equal(correct, np.bincount(labels[expect == labels],
                                                       minlength=stream.num_classes))
    np.testing.assert_array_equal(total, np.bincount(labels, minlength=stream.num_classes))
  assert stored_any  # the second round's statistics include exemplars


def _tiny_config():
  c = tiny_cil_config("icarl_fl")
  c.name = "tiny_icarl"
  c.local.lr = 0.5
  c.icarl.memory_size = 8
  return c


@pytest.mark.slow  # about 20 s; test_cil_train keeps the trainer's bit-identical resume by default
def test_end_to_end_and_resume_mid_task_are_bit_identical(tmp_path):
  config = _tiny_config()
  full, results, records, matrix = train_tiny_and_check_table1(config, tmp_path / "full")
  table = (tmp_path / "full" / "results.md").read_text()
  assert cil_metrics.table1_row("iCaRL + FL", matrix.seen, 2) in table
  assert all("icarl/exemplars" in r and "train/loss" in r for r in records)
  assert max(r["icarl/exemplars"] for r in records) > 0
  ends = [r for r in records if "eval/class_correct" in r]
  assert all(r["eval/predicted_unseen"] == 0 for r in ends)

  # Stopped in the middle of task 1, then rerun: ends bit-identical, state included.
  part = train_and_evaluate(config, tmp_path / "split", max_rounds=3)
  assert part["rounds_done"] == 3
  resumed = train_and_evaluate(config, tmp_path / "split")
  assert resumed["rounds_done"] == 4
  chex.assert_trees_all_equal(resumed["state"], full["state"])
  assert int(np.asarray(full["state"]["clients"].memory.valid).sum()) > 0
  assert int(np.asarray(full["state"]["class_counts"]).sum()) > 0
  assert json.loads((tmp_path / "split" / "results.json").read_text()) == results


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for name in module.VARIANTS:
    if name.startswith("icarl_fl"):
      config = module.get_config(name)
      validate_config(config)
      assert config.algorithm == "icarl_fl" and config.local.lr_schedule == (
          "constant" if name.endswith("_quick") else "glfc_code")
  paper, quick = module.get_config("icarl_fl"), module.get_config("icarl_fl_quick")
  assert (paper.icarl.memory_size, paper.icarl.distinct_exemplars, paper.local.lr,
          paper.scenario.num_tasks) == (2000, True, 2.0, 10)
  assert (quick.icarl.memory_size, quick.local.lr) == (90, 0.5)
  assert quick.scenario.to_dict() == module.get_config("fedavg_cil_quick").scenario.to_dict()
  for t in (5, 10, 20):
    config = module.get_config(f"icarl_fl_tasks{t}")
    assert (config.scenario.num_tasks, config.scenario.new_clients_per_task,
            config.scenario.class_fraction) == (t, 10, 0.6)
  with pytest.raises(ValueError, match="icarl_fl_quick"):
    module.get_config("icarl_fl_tasks20_quick")


@pytest.mark.parametrize("field,value,allowed", [
    ("icarl.memory_size", 0, "an integer >= 1"),
    ("icarl.memory_size", -3, "an integer >= 1"),
    ("icarl.distinct_exemplars", None, "True or False"),
    ("icarl.classifier", "ncm", "one of ('nme', 'head')"),
    ("local.lr_schedule", "cosine", "('constant', 'glfc_code')"),
])
def test_bad_fields_name_the_field(field, value, allowed):
  config = base_config("icarl_fl")
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert f"config.{field}" in str(error.value) and allowed in str(error.value)


def test_missing_icarl_section_is_named():
  config = base_config("fedavg_cil")
  config.algorithm = "icarl_fl"
  with pytest.raises(ConfigError, match=r"config\.icarl must be a section"):
    validate_config(config)

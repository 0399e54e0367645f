"""Tests of FedAvg on the class-incremental task stream (`algorithms.fedavg_cil`, `cil.stream`)
trained by the one trainer (`fedjax_het.train`)."""

import dataclasses
import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.cil import metrics as cil_metrics
from fedjax_het.algorithms import fedavg_cil
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import base_config, validate_config
from fedjax_het.train import train_and_evaluate
from fedjax_het.config import load_module
from fedjax_het.data import incremental
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import rounds
from fedjax_het.errors import ConfigError, WorkdirError
from tests.tiny_models import TinyLinear


def tiny_stream():
  """4 classes in 2 tasks, 3 clients + 1 at task 1; synthetic MNIST-style digits.

  Shared with the GLFC, iCaRL and proxy tests (`stream` fixtures there).
  """
  return incremental.build_class_incremental_stream(
      num_tasks=2, num_classes=4, initial_clients=3, new_clients_per_task=1,
      source="synthetic", train_size=48, test_size=20, seed=0)


def tiny_settings(**overrides):
  """`cil_stream.StreamSettings` of `tiny_stream` (2 rounds per task, 2 clients per round)."""
  base = dict(num_tasks=2, classes_per_task=2, rounds_per_task=2, clients_per_round=2,
              optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0, epochs=1,
              batch_size=64, sequential=False)
  base.update(overrides)
  return cil_stream.StreamSettings(**base)


@pytest.fixture(scope="module")
def stream():
  return tiny_stream()


_settings = tiny_settings


def _algorithm(stream, settings, model=None):
  model = model or TinyLinear(num_classes=stream.num_classes)
  return model, fedavg_cil.make_fedavg_cil(settings, model, stream.mean, stream.std,
                                          stream.max_client_size)


def run_across_a_task_change(algorithm, stream):
  """Rounds 0-3 of `tiny_stream` (tasks 0, 0, 1, 1) through ONE trace of the jitted round.

  Returns the final state and the last round's metrics.
  """
  run = jax.jit(chex.assert_max_traces(
      rounds.make_run_rounds(rounds.make_round_fn(algorithm), 1), n=1))
  data = jax.device_put(cil_stream.stream_arrays(stream))
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  chex.clear_trace_counter()
  tasks = []
  for _ in range(4):
    state, metrics = run(state, data)
    tasks.append(int(metrics["task"][0]))
  assert tasks == [0, 0, 1, 1]
  return state, metrics


def test_round_traces_once_across_a_task_change(stream):
  _, algorithm = _algorithm(stream, _settings())
  state, _ = run_across_a_task_change(algorithm, stream)
  assert int(state["round"]) == 4


def test_unseen_classes_get_no_gradient_and_are_never_predicted(stream):
  model, algorithm = _algorithm(stream, _settings(epochs=2, batch_size=4))
  data = jax.device_put(cil_stream.stream_arrays(stream))
  state = rounds.initial_state(algorithm, jax.random.key(1), data)
  round_fn = jax.jit(rounds.make_round_fn(algorithm))
  new_state, _ = round_fn(state, data)  # round 0: task 0, classes {0, 1} seen
  old, new = state["server"]["params"]["head"], new_state["server"]["params"]["head"]
  np.testing.assert_array_equal(np.asarray(new["kernel"])[:, 2:], np.asarray(old["kernel"])[:, 2:])
  np.testing.assert_array_equal(np.asarray(new["bias"])[2:], np.asarray(old["bias"])[2:])
  assert not np.array_equal(np.asarray(new["kernel"])[:, :2], np.asarray(old["kernel"])[:, :2])

  # Push the unseen classes' logits up: still never predicted while unseen.
  variables = jax.tree_util.tree_map(lambda x: x, new_state["server"])
  variables["params"]["head"]["bias"] = jnp.asarray([0.0, 0.0, 1e6, 1e6])
  counts = jax.jit(cil_stream.make_class_counts(model, stream.mean, stream.std, 4,
                                               len(stream.test_labels), 7))
  correct, total, predicted = counts(variables, stream.test_images, stream.test_labels,
                                     jnp.int32(2))
  assert int(predicted[2:].sum()) == 0 and int(predicted.sum()) == len(stream.test_labels)
  assert int(correct[2:].sum()) == 0
  np.testing.assert_array_equal(total, np.bincount(stream.test_labels, minlength=4))
  _, _, predicted_all = counts(variables, stream.test_images, stream.test_labels, jnp.int32(4))
  assert int(predicted_all[2:].sum()) == len(stream.test_labels)  # unmasked: they win


def test_one_round_equals_a_hand_computed_fedavg(stream):
  lr = 0.5
  # One epoch, batch >= every client: each sampled client takes one full-batch GD step.
  settings = _settings(lr=lr, batch_size=stream.max_client_size)
  _, algorithm = _algorithm(stream, settings)
  data = jax.device_put(cil_stream.stream_arrays(stream))
  state = rounds.initial_state(algorithm, jax.random.key(2), data)
  new_state, metrics = jax.jit(rounds.make_round_fn(algorithm))(state, data)
  clients = np.asarray(metrics["clients"])
  assert clients.shape == (2,) and len(set(clients.tolist())) == 2
  assert stream.client_joined[0, clients].all()

  w = np.asarray(state["server"]["params"]["head"]["kernel"], np.float64)
  b = np.asarray(state["server"]["params"]["head"]["bias"], np.float64)
  norm = normalizer(stream.mean, stream.std)
  seen = 2
  new_w, new_b, sizes = [], [], []
  for c in clients:
    n = int(stream.client_sizes[0, c])
    rows = stream.client_indices[0, c, :n]
    x = np.asarray(norm(stream.images[rows]), np.float64).reshape(n, -1)
    y = stream.labels[rows]
    assert y.max() < seen
    z = x @ w[:, :seen] + b[:seen]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = (p - np.eye(seen)[y]) / n
    wc, bc = w.copy(), b.copy()
    wc[:, :seen] -= lr * x.T @ g
    bc[:seen] -= lr * g.sum(axis=0)
    new_w.append(wc)
    new_b.append(bc)
    sizes.append(n)
  weights = np.asarray(sizes, np.float64) / sum(sizes)
  expect_w = np.tensordot(weights, np.stack(new_w), axes=1)
  expect_b = np.tensordot(weights, np.stack(new_b), axes=1)
  got = new_state["server"]["params"]["head"]
  np.testing.assert_allclose(np.asarray(got["kernel"]), expect_w, atol=2e-5)
  np.testing.assert_allclose(np.asarray(got["bias"]), expect_b, atol=2e-5)


def _rates(settings, round_index):
  return np.asarray(cil_stream.epoch_learning_rates(settings, jnp.int32(round_index)))


def test_glfc_code_lr_schedule_is_the_codes_table_for_10_rounds_of_20_epochs():
  lr = 2.0
  settings = _settings(num_tasks=3, rounds_per_task=10, epochs=20, lr=lr,
                       lr_schedule="glfc_code")
  # GLFC code: lr/5 at in-task epoch 100, lr/25 at 150, lr/125 at 180; every round restarts
  # at lr. Rounds of 20 epochs: round 5 = epochs 100-119, round 7 = 140-159, round 9 = 180-199.
  table = {r: [lr] * 20 for r in range(10)}
  table[5] = [lr / 5] * 20
  table[7] = [lr] * 10 + [lr / 25] * 10
  table[9] = [lr / 125] * 20
  rates = jax.jit(chex.assert_max_traces(cil_stream.epoch_learning_rates, n=1),
                  static_argnums=0)
  chex.clear_trace_counter()
  for r in range(30):   # three tasks: the schedule restarts with every task
    got = np.asarray(rates(settings, jnp.int32(r)))
    assert got.dtype == np.float32 and got.shape == (20,)
    np.testing.assert_allclose(got, np.float32(table[r % 10]), rtol=0, atol=0)
  constant = dataclasses.replace(settings, lr_schedule="constant")
  for r in (0, 5, 7, 9):
    np.testing.assert_array_equal(_rates(constant, r), np.full(20, lr, np.float32))


def test_glfc_code_lr_schedule_generalises_by_fractions_of_the_task():
  lr = 0.5
  # 5 rounds x 5 epochs: E = 25, triggers at int(12.5) = 12, int(18.75) = 18, int(22.5) = 22.
  settings = _settings(rounds_per_task=5, epochs=5, lr=lr, lr_schedule="glfc_code")
  expect = [[lr] * 5, [lr] * 5,
            [lr, lr, lr / 5, lr / 5, lr / 5],              # epochs 10-14, trigger at 12
            [lr, lr, lr, lr / 25, lr / 25],                # epochs 15-19, trigger at 18
            [lr, lr, lr / 125, lr / 125, lr / 125]]        # epochs 20-24, trigger at 22
  for r in range(10):
    np.testing.assert_allclose(_rates(settings, r), np.float32(expect[r % 5]), rtol=0, atol=0)
  # 2 rounds x 1 epoch: every trigger is in-task epoch 1; the code's if/elif takes the first.
  tiny = _settings(rounds_per_task=2, epochs=1, lr=lr, lr_schedule="glfc_code")
  assert [float(_rates(tiny, r)[0]) for r in range(4)] == [lr, np.float32(lr / 5)] * 2
  # 1 round x 10 epochs: the three decays within one round, each from its epoch on.
  one = _settings(rounds_per_task=1, epochs=10, lr=lr, lr_schedule="glfc_code")
  np.testing.assert_allclose(_rates(one, 3), np.float32([lr] * 5 + [lr / 5, lr / 5]
                                                        + [lr / 25, lr / 25] + [lr / 125]))


def set_field(config, field, value):
  """config.<field> = value for a dotted field name ("glfc.proxy.rebuild")."""
  section, _, name = field.rpartition(".")
  target = config
  for part in filter(None, section.split(".")):
    target = target[part]
  target[name] = value


def tiny_cil_config(method="fedavg_cil"):
  """A 2-task, 4-class synthetic stream over a few clients (shared with test_cil_glfc)."""
  c = base_config(method)
  c.name = "tiny"
  c.compilation_cache_dir = ""
  c.scenario.source = "synthetic"
  c.scenario.num_tasks = 2
  c.scenario.num_classes = 4
  c.scenario.initial_clients = 3
  c.scenario.new_clients_per_task = 1
  c.scenario.train_size = 48
  c.scenario.test_size = 20
  c.cil.rounds_per_task = 2
  c.cil.clients_per_round = 2
  c.models.architectures = ("simple_cnn",)
  c.models.width = 0.5
  c.local.lr = 0.05
  c.local.epochs = 1
  c.local.batch_size = 8
  c.checkpoint.every = 1
  c.logging.progress = False
  c.logging.plots = False
  return c


def train_tiny_and_check_table1(config, workdir):
  """Trains a `tiny_cil_config`-shaped run; checks results.json against metrics.jsonl.

  The Table 1 numbers of results.json must be `cil.metrics` on the per-class
  counts recorded at the task ends (rounds 2 and 4). Returns (the trainer's
  output, results.json, the metrics records, the accuracy matrix).
  """
  full = train_and_evaluate(config, workdir)
  assert full["rounds_done"] == 4
  results = json.loads((workdir / "results.json").read_text())
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  ends = [r for r in records if "eval/class_correct" in r]
  assert [r["round"] for r in ends] == [2, 4] and [r["task"] for r in ends] == [0, 1]
  matrix = cil_metrics.accuracy_matrix(np.array([r["eval/class_correct"] for r in ends]),
                                       np.array([r["eval/class_total"] for r in ends]), 2)
  np.testing.assert_array_equal(results["seen_accuracy"], matrix.seen)
  return full, results, records, matrix


def test_results_match_metrics_and_resume_is_bit_identical(tmp_path):
  config = tiny_cil_config()
  full, results, records, matrix = train_tiny_and_check_table1(config, tmp_path / "full")
  assert results["average_incremental_accuracy"] == cil_metrics.average_incremental_accuracy(
      matrix.seen)
  assert results["forgetting"] == cil_metrics.forgetting(matrix.per_task)
  for r in (r for r in records if "eval/class_correct" in r):
    assert r["eval/accuracy/seen"] == pytest.approx(
        100 * matrix.seen[r["task"]], abs=1e-9)
    assert r["eval/predicted_unseen"] == 0
  table = (tmp_path / "full" / "results.md").read_text()
  assert cil_metrics.table1_header(2, 2) in table
  assert cil_metrics.table1_row("FedAvg (fine-tuning)", matrix.seen, 2) in table

  # Stopped after task 0, then rerun: resumes and ends bit-identical.
  part = train_and_evaluate(config, tmp_path / "split", max_rounds=2)
  assert part["rounds_done"] == 2 and part["results"]["tasks_done"] == 1
  resumed = train_and_evaluate(config, tmp_path / "split")
  assert resumed["rounds_done"] == 4
  chex.assert_trees_all_equal(resumed["state"]["server"], full["state"]["server"])
  assert json.loads((tmp_path / "split" / "results.json").read_text()) == results
  split_records = [json.loads(line) for line in
                   (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
  def strip(rs):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]
  assert strip(split_records) == strip(records)

  # A changed config is refused before anything is written.
  changed = tiny_cil_config()
  changed.local.lr = 0.1
  with pytest.raises(WorkdirError, match="config.local.lr"):
    train_and_evaluate(changed, tmp_path / "split")


@pytest.mark.parametrize("field,value,allowed", [
    ("cil.clients_per_round", 31, "scenario.initial_clients=30"),
    ("scenario.num_tasks", 7, "a divisor of the 100 classes"),
    ("local.optimizer", "rmsprop", "('adam', 'sgd')"),
    ("scenario.client_data", "mixed", "('overlap', 'disjoint')"),
    ("models.architectures", ("vgg",), "one name"),
    ("rounds_per_call", 3, "dividing cil.rounds_per_task=10"),
    ("algorithm", "fedprox", "('glfc', 'icarl_fl', 'fedavg_cil', "),
    ("local.lr_schedule", "step", "('constant', 'glfc_code')"),
])
def test_validation_errors_name_the_field(field, value, allowed):
  config = base_config("fedavg_cil")
  set_field(config, field, value)
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert f"config.{field}" in str(error.value) and allowed in str(error.value)


def test_experiment_configs_validate():
  module = load_module(pathlib.Path(__file__).parents[1] / "fedjax_het/configs/cifar100.py")
  assert len(module.VARIANTS) == 6 * len(module.METHODS)
  # every method x {T=10, _tasks5, _tasks10, _tasks20, _quick, _mid}
  for variant in module.VARIANTS:
    config = module.get_config(variant)
    validate_config(config)
    assert config.scenario.name == "class_incremental" and config.name == f"cifar100_{variant}"
    # The code's decays for the full-size settings; quick runs (25 epochs a task): constant.
    assert config.local.lr_schedule == ("constant" if variant.endswith("_quick")
                                        else "glfc_code")
    method, _, tasks = variant.removesuffix("_quick").removesuffix("_mid").partition("_tasks")
    assert config.algorithm == ("glfc" if method in module.GLFC_ABLATIONS else method)
    if tasks:
      t = int(tasks)
      assert (config.scenario.num_tasks, config.scenario.initial_clients,
              config.scenario.new_clients_per_task, config.scenario.class_fraction,
              config.cil.rounds_per_task) == (t, 30, 10, 0.6, 10)
      expect = module.get_config(method)
      expect.scenario.num_tasks, expect.name = t, config.name
      assert config.to_dict() == expect.to_dict()   # only the task count differs
  for bad in ("glfc_tasks5_quick", "glfc_tasks7", "icarl", "fedavg_cil_tasks20_quick"):
    with pytest.raises(ValueError, match="expected one of .*icarl_fl_tasks20"):
      module.get_config(bad)
  paper = module.get_config("fedavg_cil")
  assert (paper.scenario.num_tasks, paper.scenario.initial_clients,
          paper.scenario.new_clients_per_task, paper.cil.clients_per_round,
          paper.cil.rounds_per_task, paper.models.architectures, paper.local.lr,
          paper.local.epochs, paper.local.batch_size) == (10, 30, 10, 10, 10, ("glfc_resnet18",),
                                                          0.1, 20, 128)

"""The new-client experiment (FedFusion paper Fig. 6): definitions, data, training, end to end."""

import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import configs, evaluation, models
from fedjax_het.studies import new_client as nc
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import fedavg_family
from fedjax_het.config import load_module
from fedjax_het.data import partition as partition_lib
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import local
from fedjax_het.engine.clients import ClientGroup
from fedjax_het.engine.optim import make_optimizer
from fedjax_het.errors import ConfigError, WorkdirError
from fedjax_het.experiment import build_scenario
from fedjax_het.train import train_and_evaluate
from tests.tiny_models import TinyBatchNorm

ROOT = pathlib.Path(__file__).resolve().parents[1]
MNIST = configs.module("mnist")
TINY = {"num_rounds": 1, "scenario.train_size": 200, "scenario.test_size": 100,
        "local.epochs": 1, "logging.progress": False, "compilation_cache_dir": "",
        "logging.plots": False}


def tiny_config(name, **fields):
  """A FedMMD/FedFusion paper config (mnist.py) shrunk to 1 round on a few hundred images."""
  config = MNIST.get_config(name)
  config.update_from_flattened_dict({**TINY, **fields})
  return config


@pytest.fixture(autouse=True)
def _synthetic_data(monkeypatch):
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _unpermuted_pixels(images, client_index, *, seed):
  """The inverse of `partition.permuted_pixels(images, client_index, seed=seed)`, by hand."""
  images = np.asarray(images)
  n, h, w, c = images.shape
  order = partition_lib.client_permutation(client_index, seed=seed, num_pixels=h * w)
  flat = np.empty_like(images.reshape(n, h * w, c))
  flat[:, order] = images.reshape(n, h * w, c)  # pixel j of the permuted image came from order[j]
  return flat.reshape(n, h, w, c)


def _hashes(images):
  return [hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest() for x in images]


# --- Convergence definitions -------------------------------------------------------------


def test_epochs_to_converge_is_the_first_epoch_within_tolerance_of_the_best():
  curve = [10.0, 50.0, 80.0, 89.6, 90.0, 89.8]
  assert nc.epochs_to_converge(curve, 0.5) == 3    # 89.6 >= 90.0 - 0.5
  assert nc.epochs_to_converge(curve, 0.0) == 4    # the best itself
  assert nc.epochs_to_converge(curve, 10.0) == 2   # 80 >= 80
  assert nc.epochs_to_converge([70.0, 70.2, 69.9], 0.5) == 0  # the start is already there
  assert nc.epochs_to_converge([90.0, 60.0, 85.0], 0.5) == 0  # training only hurts
  assert nc.epochs_to_converge([10.0, 20.0, 30.0, 95.0], 0.5) == 3  # a late jump
  with pytest.raises(ValueError, match="empty"):
    nc.epochs_to_converge([], 0.5)
  with pytest.raises(ValueError, match="tolerance"):
    nc.epochs_to_converge([1.0], -1.0)


def test_epochs_to_target_is_the_first_epoch_reaching_it_or_none():
  curve = [10.0, 50.0, 80.0, 79.0, 90.0]
  assert nc.epochs_to_target(curve, 80.0) == 2
  assert nc.epochs_to_target(curve, 85.0) == 4
  assert nc.epochs_to_target(curve, 10.0) == 0
  assert nc.epochs_to_target(curve, 95.0) is None
  summary = nc.summarize(curve, tolerance=1.0, target=95.0)
  assert summary == {"best": 90.0, "final": 90.0, "epochs_to_converge": 4,
                     "epochs_to_target": None}
  assert "epochs_to_target" not in nc.summarize(curve, tolerance=1.0, target=None)


# --- The new client's data ---------------------------------------------------------------


def test_permuted_new_client_data_is_held_out_and_has_a_new_permutation():
  config = tiny_config("fedfusion_permuted_conv_quick")
  scenario = build_scenario(config)
  k, seed = int(config.scenario.num_clients), int(config.seed)
  data = nc.new_client_data(config, scenario)
  assert data.permutation == k == 2
  assert len(data.train) + len(data.test) == 100
  assert abs(len(data.train) - len(data.test)) <= 1
  # A permutation no training client uses (clients 0 ... K-1).
  new = partition_lib.client_permutation(k, seed=seed)
  for i in range(k):
    assert not np.array_equal(new, partition_lib.client_permutation(i, seed=seed))
  # Un-permuted, the new client's images are the run's test images, split in two halves, and
  # none of them is a training image of any client.
  train_raw = _unpermuted_pixels(data.train.images, k, seed=seed)
  test_raw = _unpermuted_pixels(data.test.images, k, seed=seed)
  np.testing.assert_array_equal(partition_lib.permuted_pixels(train_raw, k, seed=seed),
                                data.train.images)
  federation = set()
  for i, split in enumerate(scenario.train):
    federation.update(_hashes(_unpermuted_pixels(split.images, i, seed=seed)))
  mine_train, mine_test = _hashes(train_raw), _hashes(test_raw)
  assert not federation & set(mine_train)
  assert not federation & set(mine_test)
  assert not set(mine_train) & set(mine_test)
  # The halves together are the run's (unpermuted) test set: that of the same data, unpermuted.
  plain = build_scenario(tiny_config("fedavg_permuted_quick", **{"scenario.partition": "iid"}))
  assert sorted(mine_train + mine_test) == sorted(_hashes(plain.test["mnist"].images))
  assert "client 2" in data.description and "NEW pixel permutation" in data.description
  # Deterministic, and the seed picks other halves.
  again = nc.new_client_data(config, scenario)
  np.testing.assert_array_equal(again.train.images, data.train.images)
  other = nc.new_client_data(config, scenario, seed=1)
  assert set(_hashes(other.train.images)) != set(_hashes(data.train.images))


def test_unpermuted_settings_split_the_test_set_without_a_permutation():
  config = tiny_config("fedavg_binary_quick")
  scenario = build_scenario(config)
  data = nc.new_client_data(config, scenario)
  assert data.permutation is None and "permutation" not in data.description
  federation = set(h for split in scenario.train for h in _hashes(split.images))
  mine = _hashes(data.train.images) + _hashes(data.test.images)
  assert not federation & set(mine)
  assert sorted(mine) == sorted(_hashes(scenario.test["mnist"].images))
  np.testing.assert_array_equal(np.bincount(np.concatenate([data.train.labels,
                                                            data.test.labels])),
                                np.bincount(scenario.test["mnist"].labels))


# --- Config, learning rate, starts -------------------------------------------------------


def test_config_from_run_record_round_trips_and_adds_fields_the_base_lacks():
  config = tiny_config("fedmmd_permuted_l2_quick")
  flat = workdir_lib.flatten_config(config)
  rebuilt = nc.config_from_run_record({"config": json.loads(json.dumps(flat))})
  assert workdir_lib.flatten_config(rebuilt) == flat
  assert rebuilt.models.architectures == ("fedavg_mnist_cnn",)  # a tuple again
  assert rebuilt.fedmmd.constraint == "l2" and rebuilt.fedmmd.outputs == "logits"
  extra = nc.config_from_run_record({"config": {**flat, "scenario.office_test": "held_out"}})
  assert extra.scenario.office_test == "held_out"


def test_new_client_lr_config_last_or_a_number():
  config = tiny_config("fedfusion_permuted_conv_quick", num_rounds=11)
  assert nc.new_client_lr(config) == pytest.approx(0.002)
  assert nc.new_client_lr(config, "last") == pytest.approx(0.002 * 0.99 ** 10, rel=1e-5)
  assert nc.new_client_lr(config, "0.01") == 0.01
  with pytest.raises(ConfigError, match="learning rate"):
    nc.new_client_lr(config, "fast")
  with pytest.raises(ConfigError, match="> 0"):
    nc.new_client_lr(config, 0.0)


def test_only_fedavg_fedmmd_fedfusion_have_a_start():
  with pytest.raises(ConfigError, match="global model"):
    nc.check_method(MNIST.get_config("fedprox_quick"))


def test_epoch_by_epoch_training_is_the_library_local_trainer():
  """E epochs of `make_epoch_trainer`, one call per epoch, = make_local_trainer(epochs=E)."""
  model = TinyBatchNorm()
  group = ClientGroup(name="a", model=model, clients=(0,), num_slots=1)
  loss_fn = fedavg_family.cross_entropy_objective(group)
  size, batch, epochs = 13, 4, 3
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 255, (size, 32, 32, 3), dtype=np.uint8))
  labels = jnp.asarray(rng.integers(0, 3, size), jnp.int32)
  preprocess = normalizer((0.5,) * 3, (0.25,) * 3)
  optimizer = make_optimizer("sgd", weight_decay=1e-3, momentum=0.9)
  variables = models.init_variables(model, jax.random.key(1))
  key, lr = jax.random.key(7), jnp.float32(0.05)
  reference, _ = jax.jit(local.make_local_trainer(
      loss_fn=loss_fn, optimizer=optimizer, epochs=epochs, batch_size=batch, max_size=size,
      preprocess=preprocess))(variables, {}, images, labels, size, key,
                               jnp.full((epochs,), lr))
  train_epoch = jax.jit(nc.make_epoch_trainer(loss_fn, optimizer=optimizer, epochs=epochs,
                                              batch_size=batch, size=size,
                                              preprocess=preprocess))
  mine, opt_state = variables, optimizer.init(variables["params"])
  for epoch in range(epochs):
    mine, opt_state, metrics = train_epoch(mine, opt_state, {}, images, labels, key, epoch, lr)
    assert np.isfinite(float(metrics["loss"]))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                         mine, reference)


# --- From a trained run ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fedfusion_run(tmp_path_factory):
  """A finished 1-round FedFusion-conv run on permuted synthetic MNIST (200 / 100 images)."""
  workdir = tmp_path_factory.mktemp("fedfusion_run")
  with pytest.MonkeyPatch.context() as patch:
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    train_and_evaluate(tiny_config("fedfusion_permuted_conv_quick"), workdir)
  return workdir


def test_restored_run_is_the_trained_one_and_fedfusion_starts_from_its_reloaded_trunk(
    fedfusion_run):
  run = nc.restore_finished_run(fedfusion_run)
  assert run.round == 1 and run.config.algorithm == "fedfusion"
  # The restored state evaluates to what the run recorded for its last round.
  recorded = {k: v for k, v in run.records[-1].items() if k.startswith("eval/")}
  assert recorded and run.experiment.evaluation_record(run.state) == pytest.approx(recorded)
  assert run.recorded_accuracy() == recorded["eval/intra/mean"]
  server = run.server
  start = nc.global_start(run.config, run.experiment.setup, server)
  params = start.variables["params"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, params["global_trunk"],
                         server["params"]["local_trunk"])
  for part in ("local_trunk", "fusion", "tail", "head"):
    if part in server["params"]:
      jax.tree_util.tree_map(np.testing.assert_array_equal, params[part],
                             server["params"][part])
  assert start.decay_mask(params)["global_trunk"] is not None
  # Epoch 0 is the starting model's accuracy as the run's own server evaluation computes it,
  # on the new client's evaluation half; local training moves the trunk, the fusion and the
  # classifier, never the frozen trunk.
  data = nc.new_client_data(run.config, run.experiment.scenario)
  curve = nc.train_curve(start, data, run.config, run.experiment.setup, max_epochs=1,
                         learning_rate=0.05)
  assert len(curve.accuracy) == 2 and len(curve.loss) == 1
  rows = run.experiment.setup.max_test_size
  assert len(data.test) <= rows
  images = np.zeros((1, rows, 32, 32, 3), np.uint8)
  labels = np.zeros((1, rows), np.int32)
  images[0, :len(data.test)], labels[0, :len(data.test)] = data.test.images, data.test.labels
  test = evaluation.TestData(images, labels, np.array([len(data.test)], np.int32))
  server_eval = run.experiment.evaluate({**run.state, "server": start.variables}, test)
  server_accuracy = float(np.asarray(server_eval["fedavg_mnist_cnn"])[0, 0])
  assert curve.accuracy[0] == pytest.approx(server_accuracy)
  jax.tree_util.tree_map(np.testing.assert_array_equal, curve.variables["params"]["global_trunk"],
                         params["global_trunk"])
  moved = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)),
                                 curve.variables["params"]["fusion"], params["fusion"])
  assert any(jax.tree_util.tree_leaves(moved))


def test_restore_refuses_unfinished_runs_and_other_data(fedfusion_run, tmp_path, monkeypatch):
  with pytest.raises(WorkdirError, match="no run.json"):
    nc.restore_finished_run(tmp_path)
  record = json.loads((fedfusion_run / "run.json").read_text())
  longer = tmp_path / "longer"
  longer.mkdir()
  (longer / "checkpoints").symlink_to(fedfusion_run / "checkpoints")
  record["config"]["num_rounds"] = 2
  (longer / "run.json").write_text(json.dumps(record))
  with pytest.raises(WorkdirError, match="not finished"):
    nc.restore_finished_run(longer)
  record["config"]["num_rounds"] = 1
  record["data"]["fingerprint"] = "0" * 64
  (longer / "run.json").write_text(json.dumps(record))
  with pytest.raises(WorkdirError, match="data differ"):
    nc.restore_finished_run(longer)


def test_report_table_figure_and_options_from_hand_made_curves(tmp_path):
  curves = [{"label": "fedfusion_conv", "kind": "global", "start": "the fused model",
             "learning_rate": 0.002, "accuracy": [60.0, 90.0, 94.2, 94.5],
             "federation_accuracy": 95.0, "server_model_accuracy": 61.0},
            {"label": "random init", "kind": "random", "start": "random",
             "learning_rate": 0.002, "accuracy": [10.0, 40.0, 70.0, 85.0]}]
  for curve in curves:
    curve.update(nc.summarize(curve["accuracy"], tolerance=0.5, target=94.0))
  results = {"runs": ["runs/a"], "max_epochs": 3, "tolerance": 0.5, "target": 94.0,
             "lr": "config", "data": ["Held-out halves."], "curves": curves}
  table = nc.markdown(results)
  assert "| fedfusion_conv | 60.00 | 94.50 | 94.50 | 2 | 2 | 95.00 | 61.00 |" in table
  assert "| random init | 10.00 | 85.00 | 85.00 | 3 | not in 3 | — | — |" in table
  assert "| 3 | 94.50 | 85.00 |" in table
  assert nc.plot_curves(results, tmp_path / "fig.png")
  assert (tmp_path / "fig.png").stat().st_size > 0
  a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
  assert nc.default_out([a]) == a / "new_client"
  assert nc.default_out([a, b]) == tmp_path / "runs" / "new_client"
  assert nc.resolve_target("none", []) is None
  assert nc.resolve_target("72", []) == 72.0
  with pytest.raises(ConfigError, match="percent"):
    nc.resolve_target("120", [])
  with pytest.raises(ConfigError, match="max_epochs"):
    nc.run_experiment([a], max_epochs=0)


@pytest.mark.slow
def test_new_client_experiment_end_to_end(fedfusion_run, tmp_path):
  """FedFusion-conv and the random reference, 2 epochs each, one table and one figure."""
  lines = []
  results = nc.run_experiment([fedfusion_run], out=tmp_path, max_epochs=2, target=50.0,
                              echo=lines.append)
  assert [c["label"] for c in results["curves"]] == ["fedfusion_conv", "random init"]
  for curve in results["curves"]:
    assert len(curve["accuracy"]) == 3 and len(curve["loss"]) == 2
    assert curve["epochs_to_converge"] == nc.epochs_to_converge(curve["accuracy"], 0.5)
    assert curve["epochs_to_target"] == nc.epochs_to_target(curve["accuracy"], 50.0)
    assert curve["learning_rate"] == pytest.approx(0.002)
  stored = json.loads((tmp_path / "new_client.json").read_text())
  assert stored["curves"][0]["accuracy"] == results["curves"][0]["accuracy"]
  assert "NEW pixel permutation" in stored["data"][0]
  table = (tmp_path / "new_client.md").read_text()
  assert "| fedfusion_conv |" in table and "| random init |" in table
  assert "epochs to converge (±0.5)" in table and "epochs to 50%" in table
  assert (tmp_path / "new_client.png").stat().st_size > 0
  assert any("restoring" in line for line in lines)


@pytest.mark.slow
def test_compare_fedavg_fedmmd_fedfusion_in_one_table(tmp_path, fedfusion_run):
  """--runs with three methods; FedAvg's and FedMMD's epoch 0 is the server model's accuracy."""
  dirs = []
  for name in ("fedavg_permuted_quick", "fedmmd_permuted_quick"):
    dirs.append(tmp_path / name)
    train_and_evaluate(tiny_config(name), dirs[-1])
  script = load_module(ROOT / "experiments" / "new_client.py")
  out = tmp_path / "compare"
  assert script.main([f"--runs={','.join(map(str, dirs + [fedfusion_run]))}", "--max_epochs=2",
                      f"--out={out}", "--target=none"]) == 0
  results = json.loads((out / "new_client.json").read_text())
  labels = [c["label"] for c in results["curves"]]
  assert labels == ["fedavg", "fedmmd_mmd", "fedfusion_conv", "random init"]
  for curve in results["curves"][:2]:
    assert curve["accuracy"][0] == pytest.approx(curve["server_model_accuracy"])
  assert len({c["data_fingerprint"] for c in results["curves"]}) == 1  # one new client

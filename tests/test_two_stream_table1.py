"""FedMMD / FedFusion paper settings: dropout by default (FedAvg too) and FedFusion Table 1 (a)/(b).

Yao et al., "Federated Learning with Additional Mechanisms on Clients to Reduce Communication
Costs": the CNNs have "random dropout" after their fully connected layers (Sec. 4.1; p = 0.2 in
the authors' code, FedAvg's model included); Table 1 (a)/(b) in our reading are the
`classes5` / `classes2` settings, scored per client on the test images of its own classes.
"""

import dataclasses
import itertools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import data
from fedjax_het.algorithms import fedavg
from fedjax_het.config import load_module, validate_config
from fedjax_het.data import partition as partition_lib
from fedjax_het.evaluation import intra_inter, stack_test_sets
from fedjax_het.models.base import Classifier, MLPTail
from fedjax_het.reports import tables
from tests.test_fedmmd_fedfusion import TinyTrunk
from tests.tiny_federation import LR, tiny_config, tiny_data, tiny_setup
from tests.tiny_models import TinyLinear

REPO = pathlib.Path(__file__).resolve().parents[1]
MNIST = load_module(REPO / "fedjax_het" / "configs" / "mnist.py")
CIFAR10 = load_module(REPO / "fedjax_het" / "configs" / "cifar10.py")


# ----------------------------------------------------------------------------- dropout default


def test_paper_settings_have_dropout_and_nodropout_variants_do_not():
  for module, name, no_name in (
      (CIFAR10, "fedavg_iid", "fedavg_iid_nodropout"),
      (CIFAR10, "fedfusion_classes2_multi_quick", "fedfusion_classes2_multi_nodropout_quick"),
      (MNIST, "fedavg_permuted_quick", "fedavg_permuted_nodropout_quick"),
      (MNIST, "fedmmd_shards_l2", "fedmmd_shards_l2_nodropout"),
      (MNIST, "fedprox_binary", "fedprox_binary_nodropout"),
      (MNIST, "fedmmd", "fedmmd_nodropout"),
      (MNIST, "fedfusion_quick", "fedfusion_nodropout_quick")):
    config = module.get_config(name)
    validate_config(config)
    assert config.models.dropout_rate == 0.2, name
    without = module.get_config(no_name)
    validate_config(without)
    assert without.models.dropout_rate == 0.0 and without.name.endswith(no_name)
    # The variant differs in the rate (and the name) only.
    without.models.dropout_rate, without.name = 0.2, config.name
    assert without.to_dict() == config.to_dict()
  # The other FedAvg-family configs keep the CNN without dropout (no field at all).
  for module, name in ((MNIST, "fedavg"), (MNIST, "fedprox_quick"), (CIFAR10, "fedavg_quick")):
    assert "dropout_rate" not in module.get_config(name).models
  for bad in ("fedavg_nodropout", "fedmmd_dropout", "fedmmd_shards_dropout"):
    with pytest.raises(ValueError, match="expected"):
      MNIST.get_config(bad)
  config = CIFAR10.get_config("fedavg_binary")
  config.models.dropout_rate = 1.0  # FedAvg validates the field too
  with pytest.raises(ValueError, match=r"config.models.dropout_rate must be a number in \[0, 1\)"):
    validate_config(config)


def _hidden_classifier():
  """TinyTrunk (32 features) -> Dense 2 (no ReLU, so every unit is nonzero) -> head 3."""
  return Classifier(trunk=TinyTrunk(), tail=MLPTail(input_dim=32, hidden=(2,),
                                                    activate_last=False), num_classes=3)


def _head_steps(params, images, labels, rate):
  """Hand SGD steps of the head (kernel (2, 3), bias (3,)) for every dropout mask.

  The head's gradient depends only on the features reaching it: h = x W1 + b1 (x the
  trunk's 32 outputs), each entry kept (scaled by 1 / (1 - rate)) or zeroed. Returns
  (masks (M, n, 2), kernels (M, 2, 3), biases (M, 3)), one step of lr LR on the batch-mean
  cross-entropy per mask.
  """
  trunk = TinyTrunk().apply({"params": params["trunk"]},
                            jnp.asarray(images, jnp.float32) / 255.0, train=False)
  x = np.asarray(trunk, np.float64).reshape(len(labels), -1)
  fc1, head = params["tail"]["fc1"], params["head"]
  h = x @ np.asarray(fc1["kernel"], np.float64) + np.asarray(fc1["bias"], np.float64)
  w2, b2 = np.asarray(head["kernel"], np.float64), np.asarray(head["bias"], np.float64)
  n = len(labels)
  bits = 1 if rate == 0 else h.size
  masks = np.array(list(itertools.product((0.0, 1.0), repeat=bits)))
  masks = np.ones((1,) + h.shape) if rate == 0 else masks.reshape(-1, *h.shape)
  dropped = h[None] * masks / (1.0 - rate)
  logits = dropped @ w2 + b2
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  p[:, np.arange(n), labels] -= 1.0
  grad_w = np.einsum("mnh,mnc->mhc", dropped, p) / n
  grad_b = p.mean(axis=1)
  return masks, w2[None] - LR * grad_w, b2[None] - LR * grad_b


# Each rate compiles its own round (about 8 s on a 2-core CPU): the rate-0 case (the plain step
# whatever the key) is slow; the default suite keeps the dropout case.
@pytest.mark.parametrize("rate", [pytest.param(0.0, marks=pytest.mark.slow), 0.5])
def test_fedavg_local_training_applies_dropout_and_evaluation_does_not(rate):
  setup = tiny_setup(1, _hidden_classifier())
  fed, images, labels = tiny_data(setup)  # one client, 6 rows: one full-batch step
  config = tiny_config("fedavg", **{"fedavg.evaluate": "global"})
  config.models.dropout_rate = rate
  validate_config(config)
  algorithm = fedavg.make_fedavg(config, setup)
  state = algorithm.init(jax.random.key(0), fed)
  round_fn = jax.jit(algorithm.round)
  masks, kernels, biases = _head_steps(state["server"]["params"], images[0], labels[0], rate)
  matched, keys = [], range(1, 5) if rate else range(1, 3)
  for key in keys:
    new, _ = round_fn(state, fed, jax.random.key(key), jnp.int32(0))
    head = new["server"]["params"]["head"]  # one client, server SGD lr 1: its trained model
    hits = [m for m in range(len(masks))
            if np.allclose(head["kernel"], kernels[m], rtol=1e-4, atol=1e-6)
            and np.allclose(head["bias"], biases[m], rtol=1e-4, atol=1e-6)]
    assert len(hits) == 1, (key, hits)  # the step of exactly one (hand) mask
    matched.append(hits[0])
  if rate == 0:
    assert matched == [0, 0]  # no dropout: the plain step, whatever the key
  else:
    assert len(set(matched)) > 1  # the round's key draws the masks
    assert all(masks[m].mean() not in (0.0, 1.0) for m in matched)
  # Evaluation is deterministic and has no dropout: equal to the model without it.
  plain = fedavg.make_fedavg(tiny_config("fedavg", **{"fedavg.evaluate": "global"}), setup)
  rng = np.random.default_rng(7)
  test = jax.device_put(stack_test_sets(
      ["d"], {"d": rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)},
      {"d": rng.integers(0, 3, 4).astype(np.int32)}))
  evaluate = jax.jit(algorithm.evaluate)
  first = evaluate(new, test)
  jax.tree_util.tree_map(np.testing.assert_array_equal, first, evaluate(new, test))
  jax.tree_util.tree_map(np.testing.assert_array_equal, first, jax.jit(plain.evaluate)(new, test))


# ----------------------------------------------------------------------------- Table 1 (a)/(b)


def test_class_groups_and_own_class_test_sets_by_hand():
  train = np.array([3, 0, 5, 1, 4, 2, 0, 5, 2, 3, 1, 4])
  groups = partition_lib.class_groups(train, 3)
  np.testing.assert_array_equal(groups, [[0, 1], [2, 3], [4, 5]])
  parts = data.partition_indices(train, 3, "class_split_own", rng=np.random.default_rng(0))
  want = [[1, 3, 6, 10], [0, 5, 8, 9], [2, 4, 7, 11]]  # the rows of {0,1}, {2,3}, {4,5}
  assert [p.tolist() for p in parts] == want
  test = np.array([5, 5, 0, 2, 3, 1, 4, 0])
  own = partition_lib.examples_of_classes(test, groups)
  assert [o.tolist() for o in own] == [[2, 5, 7], [3, 4], [0, 1, 6]]
  with pytest.raises(ValueError, match="must divide the 6 classes"):
    partition_lib.class_groups(train, 4)


def test_class_split_own_scenario_gives_each_client_its_classes_and_their_test_images(
    tmp_path_factory, monkeypatch):
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "h6_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
  s = data.build_partitioned_scenario("mnist", num_clients=5, partition="class_split_own",
                                      source="synthetic", train_size=200, test_size=50)
  names = ("mnist_classes0-1", "mnist_classes2-3", "mnist_classes4-5", "mnist_classes6-7",
           "mnist_classes8-9")
  assert s.domains == names and tuple(s.test) == names
  whole = data.build_partitioned_scenario("mnist", num_clients=5, partition="class_split",
                                          source="synthetic", train_size=200, test_size=50)
  full = whole.test["mnist"]
  for k, name in enumerate(names):
    classes = {2 * k, 2 * k + 1}
    assert set(s.train[k].labels.tolist()) == classes
    np.testing.assert_array_equal(s.train[k].labels, whole.train[k].labels)  # same training
    rows = np.isin(full.labels, sorted(classes))
    np.testing.assert_array_equal(s.test[name].labels, full.labels[rows])
    np.testing.assert_array_equal(s.test[name].images, full.images[rows])
  assert sum(len(t.labels) for t in s.test.values()) == len(full.labels)
  with pytest.raises(ValueError, match="must divide the 10 classes"):
    data.build_partitioned_scenario("mnist", num_clients=3, partition="class_split_own",
                                    source="synthetic", train_size=200, test_size=50)


def test_local_evaluation_on_own_classes_matches_numpy_on_fixed_logits():
  k, num_classes = 3, 6
  model = TinyLinear(num_classes=num_classes)
  base = tiny_setup(k, model)
  rng = np.random.default_rng(3)
  test_labels = np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 2, 2, 5, 0, 1, 4])
  test_images = rng.integers(0, 255, (len(test_labels), 32, 32, 3), dtype=np.uint8)
  groups = partition_lib.class_groups(np.arange(num_classes), k)
  own = partition_lib.examples_of_classes(test_labels, groups)
  domains = [f"d{i}" for i in range(k)]
  test = jax.device_put(stack_test_sets(
      domains, {d: test_images[idx] for d, idx in zip(domains, own)},
      {d: test_labels[idx].astype(np.int32) for d, idx in zip(domains, own)}))
  setup = dataclasses.replace(base, max_test_size=max(len(i) for i in own),
                              test_sizes=tuple(len(i) for i in own))
  config = tiny_config("fedavg", **{"fedavg.evaluate": "local", "eval.batch_size": 4})
  algorithm = fedavg.make_fedavg(config, setup)
  fed, _, _ = tiny_data(setup)
  state = algorithm.init(jax.random.key(0), fed)
  kernels = rng.normal(size=(k, 32 * 32 * 3, num_classes)).astype(np.float32) * 0.05
  biases = rng.normal(size=(k, num_classes)).astype(np.float32)
  variables = state["groups"]["a"]["variables"]
  variables = {**variables, "params": {"head": {"kernel": jnp.asarray(kernels),
                                                "bias": jnp.asarray(biases)}}}
  state = {**state, "groups": {"a": {**state["groups"]["a"], "variables": variables}}}
  accuracy = np.asarray(jax.jit(algorithm.evaluate)(state, test)["a"])  # (clients, domains)
  intra, _ = intra_inter(accuracy, list(range(k)))
  # NumPy: each client's fixed logits on every test image, restricted to its own classes.
  x = test_images.reshape(len(test_labels), -1).astype(np.float64) / 255.0
  hand_classes = ({0, 1}, {2, 3}, {4, 5})
  want = []
  for i in range(k):
    logits = x @ kernels[i].astype(np.float64) + biases[i]
    rows = np.array([y in hand_classes[i] for y in test_labels])
    want.append(100.0 * np.mean(logits[rows].argmax(-1) == test_labels[rows]))
  np.testing.assert_allclose(intra, want, rtol=1e-6)
  np.testing.assert_allclose(intra.mean(), np.mean(want), rtol=1e-6)
  assert len(set(np.round(want, 3))) > 1  # the clients' scores differ: a real check


def test_table1_has_columns_a_to_d_and_the_quick_configs_exist():
  table = tables.get_table("fedfusion_table1")
  assert [s.key for s in table.settings] == ["mnist_permuted", "cifar10_iid",  # (c), (d)
                                             "cifar10_classes5", "cifar10_classes2"]  # (a), (b)
  a, b = table.settings[2], table.settings[3]
  assert a.paper["final"]["fedavg"] == 89.89 and b.paper["final"]["fedfusion_multi"] == 92.78
  assert any(n.startswith("(a) and (b): our reading") for n in table.notes)
  for setting, (clients, classes) in ((a, (2, 5)), (b, (5, 2))):
    for row in setting.rows:
      for variant in (row.variant, row.quick_variant):
        config = CIFAR10.get_config(variant)
        validate_config(config)
        assert (config.scenario.partition, config.scenario.num_clients) == ("class_split_own",
                                                                             clients)
        assert config.fedavg.evaluate == "local" and config.models.dropout_rate == 0.2
        assert (config.local.batch_size, config.local.lr, config.local.lr_decay_rate) == (
            64, 0.003, 0.985)
        assert 10 // config.scenario.num_clients == classes
    quick = CIFAR10.get_config(setting.rows[0].quick_variant)
    assert quick.num_rounds == 10 and quick.scenario.train_size == 2000

"""HtFLlib's scenario: PFLlib's partitions and per-client splits, the pooled feature head, the
4-layer CNN and the config family."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from fedjax_het import data, models
from fedjax_het.config import load_module, validate_config
from fedjax_het.data import partition as partition_lib
from fedjax_het.data import partitioned

htfl = load_module("fedjax_het/configs/htfl.py")


def test_pathological_partition_hands_out_classes_in_label_order():
  labels = np.repeat(np.arange(10), 60)
  parts = partition_lib.pathological_partition(labels, 20, classes_per_client=2,
                                               rng=np.random.default_rng(0), min_size=40)
  # 4 clients per class; clients 0-3 hold {0, 1}, 4-7 {2, 3}, ... (PFLlib's "pat")
  for client, idx in enumerate(parts):
    first = 2 * (client // 4)
    assert set(np.unique(labels[idx])) == {first, first + 1}
  everything = np.concatenate(parts)
  assert len(everything) == len(labels) and len(np.unique(everything)) == len(labels)
  # Unbalanced shares: every client but a class's last draws in [max(n/m/10, 40/C), n/m).
  for c in range(10):
    holders = [k for k in range(20) if np.any(labels[parts[k]] == c)]
    shares = [int(np.sum(labels[parts[k]] == c)) for k in holders]
    assert all(4 <= s < 15 for s in shares[:-1]) and sum(shares) == 60
  balanced = partition_lib.pathological_partition(labels, 20, classes_per_client=2,
                                                  rng=np.random.default_rng(0), balance=True)
  assert sorted({len(p) for p in balanced}) == [30]


def test_train_test_split_is_sklearns_floor_of_three_quarters():
  train, test = partition_lib.train_test_split_indices(10, 0.75, np.random.default_rng(0))
  assert len(train) == 7 and len(test) == 3
  assert sorted(np.concatenate([train, test]).tolist()) == list(range(10))
  with pytest.raises(ValueError, match="train_fraction"):
    partition_lib.train_test_split_indices(10, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("partition", ["dirichlet", "shards"])
def test_pfllib_scenario_pools_partitions_and_splits_every_client(partition):
  s = data.build_partitioned_scenario("mnist_pfllib", num_clients=20, partition=partition,
                                      dirichlet_alpha=0.1, shards_per_client=2,
                                      source="synthetic", train_size=2000, test_size=1000)
  assert s.domains == tuple(f"mnist_client{i}" for i in range(20)) and list(s.test) == list(
      s.domains)
  assert (s.private_mean, s.private_std) == partitioned.PFLLIB_STATS
  total = 0
  for train, domain in zip(s.train, s.domains):
    n = len(train) + len(s.test[domain])
    total += n
    assert len(train) == int(np.floor(0.75 * n))            # PFLlib's per-client 75/25
    if partition == "shards":
      assert len(np.unique(np.concatenate([train.labels, s.test[domain].labels]))) <= 2
  assert total == 3000                                       # train and test pooled
  assert "pooled" in s.sources["mnist"] and s.public.shape[0] == 0
  with pytest.raises(ValueError, match=r"`partition` must be one of \('dirichlet', 'shards', "):
    data.build_partitioned_scenario("mnist_pfllib", num_clients=4, partition="permuted",
                                    source="synthetic", train_size=100, test_size=40)


def test_adaptive_pool_matrix_is_torchs_adaptive_avg_pool():
  rng = np.random.default_rng(0)
  for length, out in ((1280, 512), (1024, 512), (2048, 512), (512, 512), (5, 3), (7, 4)):
    x = rng.normal(size=(3, length)).astype(np.float32)
    want = np.stack([x[:, (j * length) // out:-((-(j + 1) * length) // out)].mean(-1)
                     for j in range(out)], -1)
    np.testing.assert_allclose(x @ models.adaptive_pool_matrix(length, out), want, rtol=1e-5,
                               atol=1e-6)


def test_with_feature_dim_pools_the_features_before_the_head():
  base = models.get_model("mobilenet_v2", 5, width=0.125)
  pooled = models.with_feature_dim(base, 64)
  assert pooled.feature_dim == 64 and models.with_feature_dim(pooled, 64) is pooled
  variables = models.init_variables(pooled, jax.random.key(0))
  assert variables["params"]["head"]["kernel"].shape == (64, 5)
  images = jnp.asarray(np.random.default_rng(1).normal(size=(2, 32, 32, 3)), jnp.float32)
  features, logits, _ = models.apply_model(pooled, variables, images, train=False)
  # The base model with the same trunk (GlobalPoolTail has no parameters) gives the raw ones.
  raw, _, _ = models.apply_model(base, {
      "params": {"trunk": variables["params"]["trunk"],
                 "head": {"kernel": jnp.zeros((base.feature_dim, 5)), "bias": jnp.zeros(5)}},
      "batch_stats": variables["batch_stats"]}, images, train=False)
  np.testing.assert_allclose(features, raw @ models.adaptive_pool_matrix(base.feature_dim, 64),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits, features @ variables["params"]["head"]["kernel"]
                             + variables["params"]["head"]["bias"][None, :], rtol=1e-5,
                             atol=1e-5)
  with pytest.raises(ValueError, match="feature_dim"):
    models.with_feature_dim(base, 0)


def test_htfl_cnn_is_htfllibs_fedavg_cnn():
  model = models.get_model("htfl_cnn", 10)
  assert model.feature_dim == 512
  assert models.model_summary("htfl_cnn")["params"] == 2432 + 51264 + 1600 * 512 + 512 + 5130


@pytest.mark.parametrize("method", htfl.methods())
def test_quick_configs_validate(method):
  for skew in htfl.SKEWS:
    for group in ("htfe2", "htfe3", "htfe4"):
      c = htfl.get_config(f"cifar10_{skew}_{group}_{method}_quick")
      validate_config(c)
      assert c.scenario.dataset == "cifar10_pfllib" and c.scenario.num_clients == 20
      assert c.models.architectures[5] == htfl.GROUPS[group][5 % len(htfl.GROUPS[group])]
      assert c.eval.every == 1 and c.eval.last_rounds == 3
  paper = htfl.get_config(f"cifar100_pathological_htfe4_{method}")
  validate_config(paper)
  assert paper.scenario.partition == "shards" and paper.scenario.shards_per_client == 10
  assert paper.num_rounds == 2000 and paper.models.width == 1.0
  assert paper.local.lr == 0.01 and paper.local.batch_size == 10 and paper.local.epochs == 1
  if method in htfl.PUBLIC_METHODS:  # CIFAR-100 clients: Tiny-ImageNet public images
    assert (paper.scenario.public_name, paper.scenario.public_size) == ("tinyimagenet", 5000)
    assert "htfl" not in paper
  else:
    assert paper.scenario.public_size == 0
    if method != "fml":
      assert paper.htfl.feature_dim == 512


def test_bad_variants_name_the_allowed_values():
  with pytest.raises(ValueError, match=r"skew in \('practical', 'pathological'\)"):
    htfl.get_config("cifar10_weird_htfe2_fml")

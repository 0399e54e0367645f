"""Partitioned scenarios: one dataset over many clients (iid, Dirichlet, shards, class split, permuted)."""

import dataclasses
import json
import logging

import numpy as np
import pytest

from fedjax_het import data
from tests import real_data
from tests.real_data import real_data_dir

N_TRAIN, N_TEST = 400, 100  # synthetic pool sizes of most tests (40 / 10 per class)


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
  """Shared tmp cache for generated data; no data directory from the environment."""
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "partition_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)


REAL_DIR = real_data_dir()  # read before the autouse fixture clears the variable


@pytest.fixture
def real_dir():
  if REAL_DIR is None or not all((REAL_DIR / f).is_file() for f in ("digits.npz", "cifar10.npz")):
    pytest.skip(real_data.missing("digits.npz", "cifar10.npz"))
  return REAL_DIR


def _build(partition="iid", **kwargs):
  args = dict(num_clients=8, partition=partition, source="synthetic", train_size=N_TRAIN,
              test_size=N_TEST)
  args.update(kwargs)
  return data.build_partitioned_scenario(args.pop("dataset", "mnist"), **args)


def _pool(n=N_TRAIN, split="train", seed=0):
  return data.synthetic_digits("mnist", n, seed=seed, split=split, cache=True)


def _rows(images):
  """Sorted list of image byte strings: a multiset for comparing image sets."""
  return sorted(x.tobytes() for x in images)


def _unpermute(images, client, seed=0):
  """Inverse of `permuted_pixels(images, client, seed=seed)`."""
  n, h, w, c = images.shape
  inverse = np.argsort(data.client_permutation(client, seed=seed, num_pixels=h * w))
  return images.reshape(n, h * w, c)[:, inverse].reshape(images.shape)


def _fake_bundle(directory, n_train=60, n_test=30, domains=("mnist",)):
  """A tiny valid digits.npz of `domains`: unique random images, balanced labels."""
  rng = np.random.default_rng(0)
  arrays = {}
  for domain in domains:
    for split, n in (("train", n_train), ("test", n_test)):
      arrays[f"{domain}_{split}_x"] = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
      arrays[f"{domain}_{split}_y"] = np.arange(n) % 10
  directory.mkdir(parents=True, exist_ok=True)
  np.savez(directory / "digits.npz", **arrays)
  return arrays


# ----------------------------------------------------------------------------- structure


@pytest.mark.parametrize("partition", data.PARTITIONS)
def test_clients_are_disjoint_and_cover_the_pool(partition):
  labels = _pool().labels
  # The class splits: k divides the 10 classes.
  k = 5 if partition.startswith("class_split") or partition == "permuted_classes" else 8
  parts = data.partition_indices(labels, k, partition, rng=np.random.default_rng(0))
  joined = np.concatenate(parts)
  assert len(parts) == k and len(joined) == N_TRAIN
  np.testing.assert_array_equal(np.sort(joined), np.arange(N_TRAIN))  # disjoint and covering

  s = _build(partition, num_clients=k)
  pool = _pool()
  images = [_unpermute(t.images, i) if partition in data.PERMUTED_PARTITIONS else t.images
            for i, t in enumerate(s.train)]
  assert _rows(np.concatenate(images)) == _rows(pool.images)
  assert sorted(np.concatenate([t.labels for t in s.train])) == sorted(pool.labels)
  for split in s.train:
    assert split.images.dtype == np.uint8 and split.images.shape[1:] == (32, 32, 3)
    assert split.labels.dtype == np.int32


def test_scenario_fields_per_partition():
  for partition in ("iid", "dirichlet", "shards"):
    s = _build(partition)
    assert s.name == f"mnist_{partition}" and s.num_classes == 10 and s.num_clients == 8
    assert s.domains == ("mnist",) * 8 and list(s.test) == ["mnist"]
    assert _rows(s.test["mnist"].images) == _rows(_pool(N_TEST, "test").images)
  p = _build("permuted")
  assert p.name == "mnist_permuted"
  assert p.domains == tuple(f"mnist_perm{i}" for i in range(8)) and list(p.test) == list(p.domains)
  for s in (_build("iid"), p):
    assert s.public.shape == (0, 32, 32, 3) and s.public.dtype == np.uint8
    assert s.private_mean == (0.1307,) * 3 and s.private_std == (0.3081,) * 3
    assert (s.public_mean, s.public_std) == (s.private_mean, s.private_std)
    assert s.class_names == tuple(str(i) for i in range(10))
    assert set(s.sources) == {"mnist", "public"} and s.sources["public"] == "none"
    assert s.sources["mnist"].startswith("synthetic(seed=0)") and s.substituted == ()
    json.dumps(s.metadata())
  assert "pixels permuted" in p.sources["mnist"]
  assert data.DATASET_STATS["cifar10"] == ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
  assert set(data.DATASET_STATS) == set(data.PARTITION_DATASETS)


def test_client_sizes():
  iid = _build("iid", num_clients=7)
  sizes = [len(t) for t in iid.train]
  assert sum(sizes) == N_TRAIN and max(sizes) - min(sizes) <= 1
  shards = _build("shards", num_clients=20, shards_per_client=2)
  assert [len(t) for t in shards.train] == [N_TRAIN // 20] * 20
  dirichlet = _build("dirichlet", num_clients=10, dirichlet_alpha=0.3, min_size=15)
  sizes = [len(t) for t in dirichlet.train]
  assert sum(sizes) == N_TRAIN and min(sizes) >= 15
  one = _build("dirichlet", num_clients=1)
  assert len(one.train) == 1 and len(one.train[0]) == N_TRAIN


@pytest.mark.parametrize("shards_per_client", [1, 2, 4])
def test_shards_give_each_client_at_most_shards_per_client_classes(shards_per_client):
  # 400 balanced examples in 40 shards of 10 (80 of 5 for 4 per client): every class (40
  # examples) is a whole number of shards.
  s = _build("shards", num_clients={1: 40, 2: 20, 4: 20}[shards_per_client],
             shards_per_client=shards_per_client)
  for split in s.train:
    assert len(np.unique(split.labels)) <= shards_per_client
  classes = [len(np.unique(t.labels)) for t in s.train]
  assert max(classes) == shards_per_client  # and not trivially one class each (for > 1)
  pathological = _build("shards", num_clients=20, shards_per_client=2)
  histogram = np.stack([np.bincount(t.labels, minlength=10) for t in pathological.train])
  assert (np.count_nonzero(histogram, axis=1) <= 2).all()


def _skew(histogram):
  """Mean over clients of the largest class share (1 = one class per client)."""
  return float(np.mean(histogram.max(axis=1) / histogram.sum(axis=1)))


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha():
  labels = np.arange(2000) % 10
  skews = {}
  for alpha in (0.1, 1.0, 100.0):
    parts = data.partition_indices(labels, 10, "dirichlet", rng=np.random.default_rng(0),
                                   dirichlet_alpha=alpha)
    skews[alpha] = _skew(data.label_histogram(labels, parts, 10))
  assert skews[0.1] > skews[1.0] > skews[100.0]
  assert skews[0.1] > 0.5 and skews[100.0] < 0.2  # IID would give ~0.1
  # Through the scenario: same ordering on the synthetic pool.
  hists = {}
  for alpha in (0.1, 100.0):
    s = _build("dirichlet", num_clients=5, dirichlet_alpha=alpha)
    labels = np.concatenate([t.labels for t in s.train])
    bounds = np.cumsum([0] + [len(t) for t in s.train])
    parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    hists[alpha] = data.label_histogram(labels, parts, 10)
  assert _skew(hists[0.1]) > _skew(hists[100.0])


def test_permuted_clients_have_their_own_pixels_and_test_sets():
  s = _build("permuted", num_clients=4)
  pool = _pool()
  for i, split in enumerate(s.train):
    # Every image is a spatial permutation of a pool image: same pixels, client i's order.
    assert np.all(np.sort(split.images.reshape(len(split), -1, 3), axis=1)
                  == np.sort(_unpermute(split.images, i).reshape(len(split), -1, 3), axis=1))
    assert set(_rows(_unpermute(split.images, i))) <= set(_rows(pool.images))
    np.testing.assert_array_equal(
        split.images, data.permuted_pixels(_unpermute(split.images, i), i, seed=0))
  assert not np.array_equal(data.client_permutation(0, seed=0), data.client_permutation(1, seed=0))
  # The scenario keeps the orders its images carry, one row per client.
  pixels = s.train[0].images.shape[1] * s.train[0].images.shape[2]
  np.testing.assert_array_equal(s.pixel_permutations,
                                [data.client_permutation(i, seed=0, num_pixels=pixels)
                                 for i in range(4)])
  assert _build("iid", num_clients=4).pixel_permutations is None
  with pytest.raises(ValueError, match="3 pixel permutations for 4 clients"):
    dataclasses.replace(s, pixel_permutations=s.pixel_permutations[:3])
  # The same pool image looks different on two clients.
  a = _unpermute(s.train[0].images[:1], 0)
  assert not np.array_equal(data.permuted_pixels(a, 0, seed=0), data.permuted_pixels(a, 1, seed=0))
  # Per-client test sets ("split"): disjoint shares of the test set, each in its client's order.
  test = _pool(N_TEST, "test")
  assert [len(s.test[d]) for d in s.domains] == [N_TEST // 4] * 4
  unpermuted = [_unpermute(s.test[d].images, i) for i, d in enumerate(s.domains)]
  assert _rows(np.concatenate(unpermuted)) == _rows(test.images)
  # "full": every client gets the whole test set under its own permutation.
  full = _build("permuted", num_clients=3, permuted_test="full")
  for i, d in enumerate(full.domains):
    np.testing.assert_array_equal(full.test[d].images,
                                  data.permuted_pixels(test.images, i, seed=0))
    np.testing.assert_array_equal(full.test[d].labels, test.labels)
  assert not np.array_equal(full.test["mnist_perm0"].images, full.test["mnist_perm1"].images)
  # The permutation follows the seed.
  other = _build("permuted", num_clients=4, seed=1)
  assert set(_rows(_unpermute(other.train[0].images, 0, seed=1))) <= set(
      _rows(_pool(seed=1).images))
  assert "seed=1" in other.sources["mnist"]


def test_permuted_classes_is_the_fedfusion_codes_even_odd_split_with_permuted_pixels():
  """Two clients: the even and the odd digits (thu-media/FedFusion mnist_main.py), each its
  own pixel permutation on training and test images; the test images of its own classes."""
  np.testing.assert_array_equal(data.class_groups(np.arange(10), 2, interleaved=True),
                                [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]])
  np.testing.assert_array_equal(data.class_groups(np.arange(6), 3, interleaved=True),
                                [[0, 3], [1, 4], [2, 5]])
  with pytest.raises(ValueError, match="num_clients.*divide the 10 classes"):
    data.class_groups(np.arange(10), 3, interleaved=True)
  s = _build("permuted_classes", num_clients=2)
  pool, test = _pool(), _pool(N_TEST, "test")
  assert s.domains == ("mnist_perm0", "mnist_perm1")
  for i, parity in enumerate((0, 1)):
    split = s.train[i]
    # Every pool image of the client's classes, once, under the client's permutation.
    assert set(np.unique(split.labels) % 2) == {parity}
    mine = pool.labels % 2 == parity
    assert _rows(_unpermute(split.images, i)) == _rows(pool.images[mine])
    own = s.test[f"mnist_perm{i}"]
    assert _rows(_unpermute(own.images, i)) == _rows(test.images[test.labels % 2 == parity])
    assert set(own.labels % 2) == {parity}
  a = _unpermute(s.train[0].images[:1], 0)
  assert not np.array_equal(data.permuted_pixels(a, 0, seed=0), data.permuted_pixels(a, 1, seed=0))
  assert "classes dealt in turn" in s.sources["mnist"]
  with pytest.raises(ValueError, match="permuted_test.*must be 'split'"):
    _build("permuted_classes", num_clients=2, permuted_test="full")


def test_one_thousand_clients():
  s = _build("iid", num_clients=1000, train_size=2000, test_size=50)
  assert s.num_clients == 1000 and len(s.train) == 1000 and list(s.test) == ["mnist"]
  assert {len(t) for t in s.train} == {2}
  assert _rows(np.concatenate([t.images for t in s.train])) == _rows(_pool(2000).images)
  p = _build("permuted", num_clients=1000, train_size=2000, test_size=1000)
  assert len(p.test) == 1000 and {len(t) for t in p.test.values()} == {1}
  shards = _build("shards", num_clients=1000, shards_per_client=2, train_size=2000, test_size=50)
  assert {len(t) for t in shards.train} == {2}


def test_class_split_is_fedmmds_binary_split_with_two_clients():
  s = _build("class_split", num_clients=2)
  assert s.name == "mnist_class_split" and s.domains == ("mnist",) * 2
  assert set(s.train[0].labels) == {0, 1, 2, 3, 4} and set(s.train[1].labels) == {5, 6, 7, 8, 9}
  labels = _pool().labels
  want = data.binary_class_split(labels, num_classes=10)
  got = data.partition_indices(labels, 2, "class_split", rng=np.random.default_rng(0))
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match=r"`num_clients`=3 must divide the 10 classes"):
    data.partition_indices(labels, 3, "class_split", rng=np.random.default_rng(0))


def test_same_seed_gives_an_identical_scenario():
  for partition in data.PARTITIONS:
    by_class = partition.startswith("class_split") or partition == "permuted_classes"
    kwargs = {"num_clients": 2} if by_class else {}
    a, b = _build(partition, seed=3, **kwargs), _build(partition, seed=3, **kwargs)
    assert a.domains == b.domains and a.sources == b.sources
    for x, y in zip(a.train, b.train):
      np.testing.assert_array_equal(x.images, y.images)
      np.testing.assert_array_equal(x.labels, y.labels)
    for d in a.test:
      np.testing.assert_array_equal(a.test[d].images, b.test[d].images)
  c, d = _build("dirichlet", seed=0), _build("dirichlet", seed=1)
  assert [len(t) for t in c.train] != [len(t) for t in d.train]


# ----------------------------------------------------------------------------- sources


def test_synthetic_fallback_is_logged_and_recorded(caplog):
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    s = data.build_partitioned_scenario("mnist", num_clients=4, partition="iid",
                                        synthetic_fallback=True, train_size=N_TRAIN,
                                        test_size=N_TEST)
  assert "SYNTHETIC SUBSTITUTION" in caplog.text and "'mnist_iid'" in caplog.text
  assert s.substituted == ("mnist",)
  assert s.sources == {"mnist": "synthetic(seed=0; substituted for 'real')", "public": "none"}
  assert _rows(np.concatenate([t.images for t in s.train])) == _rows(_pool().images)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    c = data.build_partitioned_scenario("cifar10", num_clients=4, partition="dirichlet",
                                        synthetic_fallback=True, train_size=N_TRAIN,
                                        test_size=N_TEST)
  assert "SYNTHETIC SUBSTITUTION" in caplog.text and "synthetic mnist digit" in caplog.text
  assert c.substituted == ("cifar10",) and c.num_classes == 10
  assert c.sources["cifar10"] == "synthetic(seed=0; mnist digits substituted for 'real')"
  assert c.private_mean == data.DATASET_STATS["mnist"][0]  # stats of what is actually used
  assert c.class_names == tuple(str(i) for i in range(10))
  json.dumps(c.metadata())


def test_unavailable_data_is_refused_without_the_opt_in(tmp_path):
  with pytest.raises(data.DataUnavailableError,
                     match=r"(?s)'cifar10'.*FEDJAX_HET_DATA_DIR.*synthetic_fallback=True"):
    data.build_partitioned_scenario("cifar10", num_clients=4, partition="iid")
  with pytest.raises(data.DataUnavailableError, match=r"(?s)cifar10\.npz.*synthetic_fallback"):
    data.build_partitioned_scenario("cifar10", num_clients=4, partition="iid", data_dir=tmp_path)
  _fake_bundle(tmp_path)  # digits.npz without svhn keys
  with pytest.raises(data.DataUnavailableError,
                     match=r"(?s)has no 'svhn' domain.*download --data_dir <dir> svhn "
                           r"\(docs/data\.md\).*synthetic_fallback=True"):
    data.build_partitioned_scenario("svhn", num_clients=4, partition="iid", data_dir=tmp_path)


def test_real_svhn_and_fashion_mnist_from_the_downloaded_bundle(tmp_path, caplog):
  arrays = _fake_bundle(tmp_path, domains=("mnist", "svhn"))
  s = data.build_partitioned_scenario("svhn", num_clients=3, partition="iid", data_dir=tmp_path)
  assert s.sources["svhn"] == f"npz:{tmp_path / 'digits.npz'}[svhn]" and s.substituted == ()
  assert _rows(np.concatenate([t.images for t in s.train])) == _rows(arrays["svhn_train_x"])
  np.testing.assert_array_equal(s.test["svhn"].images, arrays["svhn_test_x"])
  assert (s.private_mean, s.private_std) == data.DATASET_STATS["svhn"]
  # fmnist.npz missing: the fallback's warning names the command that writes it.
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    f = data.build_partitioned_scenario("fashion_mnist", num_clients=2, partition="iid",
                                        data_dir=tmp_path, synthetic_fallback=True,
                                        train_size=N_TRAIN, test_size=N_TEST)
  assert f.substituted == ("fashion_mnist",)
  assert ("SYNTHETIC SUBSTITUTION" in caplog.text and "fmnist.npz: file not found" in caplog.text
          and "Real data: python -m fedjax_het.data.download --data_dir <dir> fmnist "
              "(docs/data.md)." in caplog.text)
  fashion = {k.replace("mnist_", ""): v for k, v in arrays.items() if k.startswith("mnist_")}
  np.savez(tmp_path / "fmnist.npz", **fashion)
  f = data.build_partitioned_scenario("fashion_mnist", num_clients=2, partition="shards",
                                      shards_per_client=1, data_dir=tmp_path)
  assert f.sources["fashion_mnist"] == f"npz:{tmp_path / 'fmnist.npz'}" and f.substituted == ()
  assert _rows(np.concatenate([t.images for t in f.train])) == _rows(fashion["train_x"])
  assert f.class_names[-1] == "Ankle boot" and f.num_classes == 10


def test_fallback_warning_names_the_download_command_and_the_source_switch(caplog):
  tfds_dir = "/nonexistent/tfds"
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    data.build_partitioned_scenario("cifar100", num_clients=2, partition="iid", source="tfds",
                                    data_dir=tfds_dir, synthetic_fallback=True,
                                    train_size=N_TRAIN, test_size=N_TEST)
  assert ("download --data_dir <dir> cifar100 and set scenario.dataset_source=real "
          "(docs/data.md)." in caplog.text)


def test_real_source_subsamples_stratified(tmp_path):
  arrays = _fake_bundle(tmp_path / "bundle")
  s = data.build_partitioned_scenario("mnist", num_clients=4, partition="shards",
                                      shards_per_client=1, data_dir=tmp_path / "bundle",
                                      train_size=40, test_size=20)
  assert s.sources["mnist"] == f"npz:{tmp_path / 'bundle' / 'digits.npz'}[mnist]"
  assert s.substituted == ()
  labels = np.concatenate([t.labels for t in s.train])
  np.testing.assert_array_equal(np.bincount(labels), [4] * 10)  # stratified: 4 per class
  assert set(_rows(np.concatenate([t.images for t in s.train]))) <= set(
      _rows(arrays["mnist_train_x"]))
  np.testing.assert_array_equal(np.bincount(s.test["mnist"].labels), [2] * 10)
  whole = data.build_partitioned_scenario("mnist", num_clients=3, partition="iid",
                                          data_dir=tmp_path / "bundle")
  assert sum(len(t) for t in whole.train) == 60 and len(whole.test["mnist"]) == 30
  with pytest.raises(ValueError, match=r"`train_size`=61 exceeds the 60 training examples"):
    data.build_partitioned_scenario("mnist", num_clients=3, partition="iid",
                                    data_dir=tmp_path / "bundle", train_size=61)


def test_tfds_datasets(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow_datasets not installed")
  with tfds.testing.mock_data(num_examples=40):
    for name in ("svhn", "fashion_mnist", "cifar10"):
      s = data.build_partitioned_scenario(name, num_clients=4, partition="permuted",
                                          source="tfds")
      assert s.sources[name].startswith("tfds:") and s.domains[0] == f"{name}_perm0"
      assert (s.private_mean, s.private_std) == data.DATASET_STATS[name]
      assert sum(len(t) for t in s.train) == 40 and len(s.class_names) == 10


def test_synthetic_source_for_usps_and_svhn():
  for name in ("usps", "svhn"):
    s = _build("iid", dataset=name, num_clients=4)
    assert s.sources[name] == "synthetic(seed=0)" and s.substituted == ()
    assert (s.private_mean, s.private_std) == data.DATASET_STATS[name]
    expected = data.synthetic_digits(name, N_TRAIN, seed=0, split="train", cache=True)
    assert _rows(np.concatenate([t.images for t in s.train])) == _rows(expected.images)


def test_real_bundle(real_dir):
  s = data.build_partitioned_scenario("mnist", num_clients=100, partition="shards",
                                      data_dir=real_dir)
  assert [len(t) for t in s.train] == [100] * 100 and len(s.test["mnist"]) == 10000
  assert s.sources["mnist"].endswith("digits.npz[mnist]") and s.substituted == ()
  # The bundle's MNIST has 1000 images per class: shards of 50 never straddle classes.
  assert all(len(np.unique(t.labels)) <= 2 for t in s.train)
  c = data.build_partitioned_scenario("cifar10", num_clients=100, partition="dirichlet",
                                      data_dir=real_dir, train_size=2000, test_size=1000)
  assert sum(len(t) for t in c.train) == 2000 and len(c.test["cifar10"]) == 1000
  assert c.class_names[:3] == ("airplane", "automobile", "bird")
  assert c.private_mean == (0.4914, 0.4822, 0.4465)
  p = data.build_partitioned_scenario("cifar10", num_clients=10, partition="permuted",
                                      data_dir=real_dir, train_size=1000, test_size=500)
  assert [len(p.test[d]) for d in p.domains] == [50] * 10


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset="imagenet"), r"`dataset` must be one of \('mnist', 'cifar10'"),
    (dict(partition="foo"), r"`partition` must be one of \('iid', 'dirichlet', 'shards', "
                            r"'class_split', 'class_split_own', 'permuted', "
                            r"'permuted_classes'\), got 'foo'\."),
    (dict(num_clients=0), r"`num_clients` must be an integer >= 1, got 0"),
    (dict(num_clients=2.5), r"`num_clients` must be an integer >= 1, got 2.5"),
    (dict(num_clients=True), r"`num_clients` must be an integer >= 1"),
    (dict(dirichlet_alpha=0.0), r"`dirichlet_alpha` must be a finite number > 0, got 0.0"),
    (dict(dirichlet_alpha=float("inf")), r"`dirichlet_alpha` must be a finite number > 0"),
    (dict(shards_per_client=0), r"`shards_per_client` must be an integer >= 1, got 0"),
    (dict(source="web"), r"`source` must be one of \('real', 'folder:<path>', 'tfds', "
                         r"'synthetic'\) for dataset 'mnist', got 'web'"),
    (dict(dataset="cifar10", source="synthetic"), r"`source` must be one of \('real', "
                                                  r"'folder:<path>', 'tfds'\)"),
    (dict(dataset="usps", source="tfds"), r"`source` must be one of"),
    (dict(synthetic_fallback="yes"), r"`synthetic_fallback` must be True or False"),
    (dict(train_size=0), r"`train_size` must be an integer >= 1 or None, got 0"),
    (dict(test_size=-3), r"`test_size` must be an integer >= 1 or None, got -3"),
    (dict(seed=-1), r"`seed` must be an integer >= 0, got -1"),
    (dict(min_size=0), r"`min_size` must be an integer >= 1, got 0"),
    (dict(permuted_test="half"), r"`permuted_test` must be one of \('split', 'full'\)"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
  args = dict(dataset="mnist", num_clients=4, partition="iid", source="synthetic",
              train_size=N_TRAIN, test_size=N_TEST)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    data.build_partitioned_scenario(args.pop("dataset"), **args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(partition="iid", num_clients=401), r"`num_clients`=401 exceeds the 400 training"),
    (dict(partition="permuted", num_clients=401), r"`num_clients`=401 exceeds the 400 training"),
    (dict(partition="shards", num_clients=300), r"600 shards exceed the 400 training examples"),
    (dict(partition="shards", num_clients=3), r"(?s)6 shards do not divide the 400 training "
                                              r"examples.*train_size=396"),
    (dict(partition="dirichlet", num_clients=50), r"`num_clients`=50 x `min_size`=10 = 500 "
                                                  r"exceeds the 400"),
    (dict(partition="dirichlet", num_clients=40, dirichlet_alpha=0.01),
     r"Dirichlet partition over `num_clients`=40 failed"),
    (dict(partition="permuted", num_clients=200), r"`num_clients`=200 exceeds the 100 test "
                                                  r"examples.*permuted_test='full'"),
])
def test_unsatisfiable_num_clients_is_a_clear_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _build(**kwargs)

"""GLFC class-incremental streams in fixed-shape arrays (fedjax_het.data.incremental)."""

import logging

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import data
from fedjax_het.data import incremental
from fedjax_het.data.partition import class_incremental_tasks
from tests import real_data
from tests.real_data import real_data_dir

REAL_DIR = real_data_dir()  # read before the autouse fixture clears the variable


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
  """Shared tmp cache for generated data; no data directory from the environment."""
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "cil_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)


def _keys(images):
  """Sorted image byte strings: a multiset for comparing image sets."""
  return sorted(x.tobytes() for x in images)


def _labelled_pool(num_classes, per_class, seed):
  """A Split with unique random images and shuffled balanced labels."""
  rng = np.random.default_rng(seed)
  n = num_classes * per_class
  images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  images[:, 0, 0, :2] = np.stack([np.arange(n) // 256, np.arange(n) % 256], axis=1)  # unique
  return data.Split(images, rng.permutation(np.arange(n) % num_classes))


# Small synthetic stream: 20 (domain, digit) classes in 4 tasks of 5, 6 + 2 clients per task.
SMALL = dict(num_tasks=4, num_classes=20, initial_clients=6, new_clients_per_task=2,
             source="synthetic", train_size=200, test_size=60)


def _small(**kwargs):
  return incremental.build_class_incremental_stream(**{**SMALL, **kwargs})


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("overlap", [True, False])
def test_indices_hold_exactly_what_class_incremental_tasks_assigned(overlap):
  # 12 classes in the pool, the stream uses 3 tasks of 3: the pool is restricted and re-indexed.
  train, test = _labelled_pool(12, 8, seed=1), _labelled_pool(12, 3, seed=2)
  tasks = class_incremental_tasks(train.labels, num_tasks=3, classes_per_task=3,
                                  initial_clients=4, new_clients_per_task=2, class_fraction=0.67,
                                  shift_fraction=0.5, overlap=overlap,
                                  rng=np.random.default_rng(3))
  s = incremental.stream_from_tasks(train, test, tasks,
                                    client_data="overlap" if overlap else "disjoint")
  order = np.concatenate([t.classes for t in tasks])
  np.testing.assert_array_equal(s.class_order, order)
  remap = {int(c): i for i, c in enumerate(order)}
  used = np.isin(train.labels, order)
  assert s.images.shape == (used.sum(), 32, 32, 3) and s.num_classes == 9
  assert _keys(s.images) == _keys(train.images[used])
  # Remapped labels travel with their images.
  original = {x.tobytes(): remap[int(y)] for x, y in zip(train.images[used], train.labels[used])}
  assert all(original[x.tobytes()] == y for x, y in zip(s.images, s.labels))
  assert sorted(s.test_labels.tolist()) == sorted(remap[int(y)] for y in test.labels
                                                  if int(y) in remap)

  k_max = 4 + 2 * 2
  assert s.client_indices.shape[:2] == (3, k_max) == s.client_classes.shape[:2]
  for t, task in enumerate(tasks):
    n_t = len(task.client_ids)
    np.testing.assert_array_equal(s.client_joined[t], np.arange(k_max) < n_t)
    np.testing.assert_array_equal(s.client_kept_old[t, :n_t], task.kept_old)
    assert not s.client_kept_old[t, n_t:].any() and not s.client_classes[t, n_t:].any()
    assert not s.client_sizes[t, n_t:].any() and not s.client_indices[t, n_t:].any()
    for k in range(n_t):
      size = s.client_sizes[t, k]
      assert size == len(task.client_indices[k])
      idx = s.client_indices[t, k, :size]
      assert not s.client_indices[t, k, size:].any()  # padding is 0
      assert _keys(s.images[idx]) == _keys(train.images[task.client_indices[k]])
      holds = np.zeros(9, bool)
      holds[[remap[int(c)] for c in task.client_classes[k]]] = True
      np.testing.assert_array_equal(s.client_classes[t, k], holds)
      assert holds[s.labels[idx]].all()
      if overlap:  # every image of each held class
        np.testing.assert_array_equal(np.sort(idx), np.nonzero(holds[s.labels])[0])
      if t > 0 and task.kept_old[k]:  # same data in the same order
        np.testing.assert_array_equal(idx, s.client_indices[t - 1, k, :size])


def test_stream_arrays_are_read_only_and_shapes_validated():
  s = _small()
  with pytest.raises(ValueError, match="read-only"):
    s.client_indices[0, 0, 0] = 1
  with pytest.raises(ValueError, match="client_sizes"):
    incremental.ClassIncrementalStream(**{**vars(s), "client_sizes": s.client_sizes[:, :-1]})


# ----------------------------------------------------------------------------- fixed shapes


def test_shapes_fixed_across_tasks_and_one_trace_serves_every_task():
  s = _small()
  k_max, n_max = 6 + 3 * 2, int(s.client_sizes.max())
  assert s.client_indices.shape == (4, k_max, n_max)
  assert s.client_classes.shape == (4, k_max, 20) and s.client_indices.dtype == np.int32
  np.testing.assert_array_equal(s.num_clients, [6, 8, 10, 12])
  specs = [jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), s.task(t))
           for t in range(4)]
  assert all(spec == specs[0] for spec in specs)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def check(labels, arrays):
    # Per client: examples whose label is one of its classes and a seen class.
    y = labels[arrays.client_indices]  # (K, n)
    valid = jnp.arange(y.shape[1])[None, :] < arrays.client_sizes[:, None]
    own = jnp.take_along_axis(arrays.client_classes, y, axis=1) & arrays.class_mask[y]
    return jnp.sum(own & valid, axis=1), jnp.sum(arrays.test_valid)

  chex.clear_trace_counter()
  labels = jnp.asarray(s.labels)
  for t in range(4):
    own, num_test = check(labels, s.task(t))
    np.testing.assert_array_equal(own, s.client_sizes[t])
    assert num_test == np.sum(s.test_labels < 5 * (t + 1))


def test_seen_classes_task_of_class_and_class_mask():
  s = _small()
  assert [s.seen_classes(t) for t in range(4)] == [5, 10, 15, 20]
  assert s.task_of_class(0) == 0 and s.task_of_class(9) == 1 and s.task_of_class(19) == 3
  np.testing.assert_array_equal(s.task_of_class(np.array([4, 5, 14])), [0, 1, 2])
  np.testing.assert_array_equal(s.class_mask(1), np.arange(20) < 10)
  arrays = s.task(2)
  assert int(arrays.num_seen) == 15 and int(arrays.task) == 2
  # Task t's classes are t*k .. (t+1)*k - 1 and only moved clients hold them.
  for t in range(4):
    holders = s.client_joined[t] & ~s.client_kept_old[t]
    assert (s.client_classes[t][holders].nonzero()[1] // 5 == t).all()
    assert s.client_classes[t][holders].sum(axis=1).tolist() == [3] * holders.sum()
  with pytest.raises(ValueError, match=r"`task` must be an integer in \[0, 4\)"):
    s.seen_classes(4)
  with pytest.raises(ValueError, match=r"`class_index` must be an integer in \[0, 20\)"):
    s.task_of_class(20)


# ----------------------------------------------------------------------------- client data


def test_overlap_gives_every_image_of_a_class_disjoint_splits_it():
  over, disj = _small(client_data="overlap"), _small(client_data="disjoint")
  np.testing.assert_array_equal(over.labels, disj.labels)  # same pool, same class order
  np.testing.assert_array_equal(over.class_order, disj.class_order)
  assert disj.client_sizes.max() < over.client_sizes.max()
  for t in range(4):
    present = np.nonzero(over.client_joined[t])[0]
    shared = 0
    for k in present:
      idx = over.client_indices[t, k, :over.client_sizes[t, k]]
      np.testing.assert_array_equal(np.sort(idx),
                                    np.nonzero(over.client_classes[t, k][over.labels])[0])
    rows = [disj.client_indices[t, k, :disj.client_sizes[t, k]] for k in present]
    joined = np.concatenate(rows)
    assert len(np.unique(joined)) == len(joined)  # no image held twice at a task
    movers = present[~disj.client_kept_old[t, present]]
    for c in range(5 * t, 5 * (t + 1)):  # a new class's images are split among its holders
      holders = movers[disj.client_classes[t, movers, c]]
      got = np.concatenate([disj.client_indices[t, k, :disj.client_sizes[t, k]]
                            for k in holders]) if len(holders) else np.zeros(0, int)
      got = got[disj.labels[got] == c]
      expected = np.nonzero(disj.labels == c)[0] if len(holders) else np.zeros(0, int)
      np.testing.assert_array_equal(np.sort(got), expected)
      shared += max(len(holders) - 1, 0)
    assert shared > 0  # some classes had several holders: the disjoint split did something


def test_train_and_test_size_are_stratified_over_the_stream_classes(tmp_path):
  _fake_cifar100(tmp_path, per_train=3, per_test=2)  # 20 classes: 60 train, 40 test images
  s = incremental.build_class_incremental_stream(num_tasks=4, num_classes=20, data_dir=tmp_path,
                                                 train_size=40, test_size=20)
  assert len(s.labels) == 40 and len(s.test_labels) == 20
  np.testing.assert_array_equal(np.bincount(s.labels, minlength=20), [2] * 20)
  np.testing.assert_array_equal(np.bincount(s.test_labels, minlength=20), [1] * 20)


# ----------------------------------------------------------------------------- determinism


def test_determinism_by_seed():
  a, b, c = _small(seed=3), _small(seed=3), _small(seed=4)
  for field in ("images", "labels", "class_order", "client_indices", "client_sizes",
                "client_joined", "client_kept_old", "client_classes", "test_images",
                "test_labels"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
  assert a.class_names == b.class_names and a.metadata() == b.metadata()
  assert not np.array_equal(a.class_order, c.class_order)
  assert not np.array_equal(a.client_kept_old, c.client_kept_old) or not np.array_equal(
      a.client_classes, c.client_classes)


# ----------------------------------------------------------------------------- sources


def _fake_cifar100(directory, per_train=3, per_test=2):
  rng = np.random.default_rng(0)
  arrays = {}
  for split, per in (("train", per_train), ("test", per_test)):
    n = 100 * per
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    x[:, 0, 0, :2] = np.stack([np.arange(n) // 256, np.arange(n) % 256], axis=1)
    arrays[f"{split}_x"], arrays[f"{split}_y"] = x, rng.permutation(np.arange(n) % 100)
  directory.mkdir(parents=True, exist_ok=True)
  np.savez(directory / "cifar100_glfc.npz", **arrays)
  return arrays


def test_bundle_source_uses_a_class_subset_with_names(tmp_path):
  arrays = _fake_cifar100(tmp_path)
  s = incremental.build_class_incremental_stream(num_tasks=4, num_classes=20, data_dir=tmp_path,
                                                 initial_clients=5, new_clients_per_task=2)
  assert s.sources == {"cifar100": f"npz:{tmp_path / 'cifar100_glfc.npz'}"}
  assert s.substituted == () and s.mean == tuple(data.CIFAR100_MEAN)
  assert s.class_names == tuple(incremental.CIFAR100_CLASS_NAMES[c] for c in s.class_order)
  used = np.isin(arrays["train_y"], s.class_order)
  assert _keys(s.images) == _keys(arrays["train_x"][used]) and len(s.images) == 60
  lookup = {x.tobytes(): int(y) for x, y in zip(arrays["train_x"], arrays["train_y"])}
  assert all(s.class_order[y] == lookup[x.tobytes()] for x, y in zip(s.images, s.labels))
  assert len(s.test_labels) == 40


def test_synthetic_fallback_warns_records_and_serves_small_streams(tmp_path, caplog):
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    s = incremental.build_class_incremental_stream(
        num_tasks=5, num_classes=10, data_dir=tmp_path, synthetic_fallback=True,
        initial_clients=4, new_clients_per_task=1, train_size=100, test_size=20)
  assert "SYNTHETIC SUBSTITUTION" in caplog.text and "cifar100" in caplog.text
  assert s.substituted == ("cifar100",)
  assert "substituted for 'real'" in s.sources["cifar100"]
  assert sorted(s.class_names) == [f"mnist_{d}" for d in range(10)]  # 10 classes: MNIST-style
  assert s.client_indices.shape[:2] == (5, 8) and s.classes_per_task == 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=100), r"at most 40 classes.*`num_classes`=100"),
    (dict(num_classes=None), r"at most 40 classes.*`num_classes`=100"),
])
def test_fallback_that_cannot_serve_the_classes_says_so(tmp_path, kwargs, match):
  with pytest.raises(data.DataUnavailableError, match=match):
    incremental.build_class_incremental_stream(data_dir=tmp_path, synthetic_fallback=True,
                                               **kwargs)


def test_unavailable_source_without_fallback_says_how_to_provide_it(tmp_path):
  with pytest.raises(data.DataUnavailableError,
                     match=r"(?s)cifar100_glfc\.npz.*synthetic_fallback"):
    incremental.build_class_incremental_stream(data_dir=tmp_path)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset="cifar10"),
     r"`dataset` must be one of \('cifar100', 'tiny_imagenet', 'imagenet_subset'\)"),
    (dict(num_tasks=7), r"`num_tasks`=7 does not divide.*\(1, 2, 4, 5, 10, 20, 25, 50, 100\)"),
    (dict(num_tasks=0), r"`num_tasks` must be an integer >= 1"),
    (dict(num_classes=101), r"`num_classes` must be an integer in \[1, 100\]"),
    (dict(client_data="shared"), r"`client_data` must be one of \('overlap', 'disjoint'\)"),
    (dict(source="web"), r"`source` must be one of \('real', 'tfds', 'folder:<path>'"),
    (dict(class_fraction=0.0), r"`class_fraction` must be a number in \(0, 1\]"),
    (dict(shift_fraction=1.5), r"`shift_fraction` must be a number in \[0, 1\]"),
    (dict(train_size=50), r"`train_size` must be an integer >= 100"),
    (dict(synthetic_fallback="yes"), r"`synthetic_fallback` must be True or False"),
    (dict(source="synthetic"), r"source='synthetic' serves at most 40 classes"),
    (dict(initial_clients=0), r"`initial_clients` must be an integer >= 1"),
])
def test_errors_name_the_argument_and_allowed_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    incremental.build_class_incremental_stream(**kwargs)


def test_train_size_larger_than_the_pool_is_an_error(tmp_path):
  _fake_cifar100(tmp_path)
  with pytest.raises(ValueError, match=r"`train_size`=61 exceeds the 60 training images"):
    incremental.build_class_incremental_stream(num_tasks=4, num_classes=20, data_dir=tmp_path,
                                               train_size=61)


# ----------------------------------------------------------------------------- real bundle


def test_real_bundle_stream_matches_the_glfc_protocol():
  if REAL_DIR is None or not (REAL_DIR / "cifar100_glfc.npz").is_file():
    pytest.skip(real_data.missing("cifar100_glfc.npz"))
  s = incremental.build_class_incremental_stream(num_tasks=10, data_dir=REAL_DIR)
  assert s.images.shape == (12000, 32, 32, 3) and s.test_images.shape == (5000, 32, 32, 3)
  assert s.client_indices.shape == (10, 120, 720)  # 30 + 9 * 10 clients, 6 classes x 120
  np.testing.assert_array_equal(s.num_clients, np.arange(30, 121, 10))
  movers = s.client_joined & ~s.client_kept_old
  assert (s.client_sizes[movers] == 720).all()
  assert (s.client_classes[movers].sum(axis=-1) == 6).all()
  assert s.client_kept_old.sum(axis=1).tolist() == [0] + [n - round(0.9 * n) for n in
                                                           range(30, 111, 10)]
  assert sorted(s.class_names) == sorted(incremental.CIFAR100_CLASS_NAMES)


@pytest.mark.parametrize("dataset", ["tiny_imagenet", "imagenet_subset"])
def test_folder_datasets_of_glfc_build_a_stream(tmp_path, dataset):
  image_module = pytest.importorskip("PIL.Image")
  rng = np.random.default_rng(0)
  names = [f"n{i:08d}" for i in range(4)]
  for split, per_class in (("train", 6), ("val", 2)):
    for name in names:
      (tmp_path / split / name).mkdir(parents=True)
      for j in range(per_class):
        image_module.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
            tmp_path / split / name / f"{j}.JPEG")
  stream = incremental.build_class_incremental_stream(
      dataset, num_tasks=2, num_classes=4, initial_clients=2, new_clients_per_task=1,
      source=f"folder:{tmp_path}", image_size=32, seed=0)
  assert stream.images.shape == (24, 32, 32, 3) and stream.num_classes == 4
  assert stream.sources[dataset] == f"folder:{tmp_path}"
  # No published statistics: normalised by the pool's own mean and std.
  np.testing.assert_allclose(stream.mean, stream.images.reshape(-1, 3).mean(0) / 255.0,
                             rtol=1e-5)
  with pytest.raises(ValueError, match=f"{dataset} is not in TFDS; use source='folder:<path>'"):
    incremental.build_class_incremental_stream(dataset, num_tasks=2, num_classes=4,
                                               source="tfds")

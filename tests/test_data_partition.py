"""Partitioners: sizes, disjointness, skew, shards, binary split, permutations, task streams."""

import numpy as np
import pytest

from fedjax_het import data
from fedjax_het.data import partition


def _labels(per_class=100, num_classes=10, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def _assert_disjoint_cover(parts, n):
  joined = np.concatenate(parts)
  assert len(joined) == len(np.unique(joined)) == n
  assert joined.min() == 0 and joined.max() == n - 1


def test_iid_sizes_disjoint_and_seeded():
  parts = data.iid_partition(1003, 10, np.random.default_rng(0))
  assert sorted(len(p) for p in parts) == [100] * 7 + [101] * 3
  _assert_disjoint_cover(parts, 1003)
  again = data.iid_partition(1003, 10, np.random.default_rng(0))
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = data.iid_partition(1003, 10, np.random.default_rng(1))
  assert not np.array_equal(parts[0], other[0])


def _mean_client_entropy(labels, parts):
  hist = data.label_histogram(labels, parts, 10).astype(float)
  p = hist / hist.sum(1, keepdims=True)
  return float(np.mean(-np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=1)))


def test_dirichlet_disjoint_min_size_and_skew_grows_as_alpha_falls():
  labels = _labels(200)
  entropies = []
  for alpha in (100.0, 1.0, 0.1):
    parts = data.dirichlet_partition(labels, 10, alpha, np.random.default_rng(0), min_size=10)
    _assert_disjoint_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 10
    entropies.append(_mean_client_entropy(labels, parts))
  # Label entropy per client: near log(10) = 2.30 for large alpha, falling with alpha.
  assert entropies[0] > 2.2 and entropies[0] > entropies[1] > entropies[2], entropies
  assert entropies[2] < 1.3


def test_dirichlet_errors():
  with pytest.raises(ValueError, match="`alpha` must be finite and > 0"):
    data.dirichlet_partition(_labels(), 5, 0.0, np.random.default_rng(0))
  with pytest.raises(ValueError, match="`min_size`"):
    data.dirichlet_partition(_labels(10), 20, 1.0, np.random.default_rng(0), min_size=10)


def test_shards_give_two_classes_per_client():
  labels = _labels(1000)  # like the offline MNIST subset: 10000 examples
  parts = data.shard_partition(labels, 100, shards_per_client=2, shard_size=50,
                               rng=np.random.default_rng(0))
  assert all(len(p) == 100 for p in parts)
  _assert_disjoint_cover(parts, 10000)
  classes = [len(np.unique(labels[p])) for p in parts]
  assert max(classes) <= 2 and np.mean(np.equal(classes, 2)) > 0.8
  # Each shard is a single class.
  for p in parts:
    assert len(np.unique(labels[p[:50]])) == 1 and len(np.unique(labels[p[50:]])) == 1


def test_shards_mcmahan_configuration_and_too_few_examples():
  labels = _labels(6000)  # 60000 like MNIST
  parts = data.shard_partition(labels, 100, rng=np.random.default_rng(0))  # 200 x 300
  assert len(parts) == 100 and all(len(p) == 600 for p in parts)
  with pytest.raises(ValueError, match="need 60000 examples, the dataset has 1000"):
    data.shard_partition(_labels(100), 100, rng=np.random.default_rng(0))


def test_binary_class_split():
  labels = _labels(30)
  first, second = data.binary_class_split(labels)
  assert set(labels[first]) == {0, 1, 2, 3, 4} and set(labels[second]) == {5, 6, 7, 8, 9}
  assert len(first) + len(second) == len(labels)
  a, b = data.binary_class_split(labels, rng=np.random.default_rng(3))
  assert not set(labels[a]) & set(labels[b]) and len(set(labels[a])) == 5


def test_permuted_pixels_per_client():
  images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
  perms = data.make_permutations(3, seed=7)
  assert perms.shape == (3, 1024)
  assert all(sorted(p) == list(range(1024)) for p in perms)
  assert not np.array_equal(perms[0], perms[1])
  out = data.permuted_pixels(images, 1, seed=7)
  np.testing.assert_array_equal(out.reshape(4, 1024, 3), images.reshape(4, 1024, 3)[:, perms[1]])
  # Fixed per client (same result twice), pixels move as a whole (channels kept together).
  np.testing.assert_array_equal(out, data.permuted_pixels(images, 1, seed=7))
  assert sorted(map(tuple, out.reshape(-1, 3))) == sorted(map(tuple, images.reshape(-1, 3)))
  # `take_pixels` with a given row: pixel j of the output is pixel perms[1][j] of the input.
  taken = partition.take_pixels(images, perms[1])
  np.testing.assert_array_equal(taken, out)
  assert np.array_equal(taken[2, 0, 5], images[2].reshape(1024, 3)[perms[1][5]])
  with pytest.raises(ValueError, match=r"`permutation` must have shape \(1024,\)"):
    partition.take_pixels(images, perms[1][:100])


@pytest.mark.parametrize("overlap", [True, False])
def test_class_incremental_stream(overlap):
  labels = _labels(100, num_classes=100)
  tasks = data.class_incremental_tasks(labels, num_tasks=10, classes_per_task=10,
                                       initial_clients=30, new_clients_per_task=10,
                                       class_fraction=0.6, shift_fraction=0.9, overlap=overlap,
                                       rng=np.random.default_rng(0))
  assert len(tasks) == 10
  order = np.concatenate([t.classes for t in tasks])
  assert sorted(order) == list(range(100))  # every class introduced once, in task order
  for t, task in enumerate(tasks):
    assert len(task.client_ids) == 30 + 10 * t
    np.testing.assert_array_equal(task.seen_classes, order[:10 * (t + 1)])
    for k, (classes, idx) in enumerate(zip(task.client_classes, task.client_indices)):
      assert set(np.unique(labels[idx])) == set(classes)
      assert set(classes) <= set(task.seen_classes)
      if task.kept_old[k]:
        np.testing.assert_array_equal(idx, tasks[t - 1].client_indices[k])
      else:
        assert len(classes) == 6 and set(classes) <= set(task.classes)  # 60% of the new task
        if overlap:  # all images of each held class
          assert len(idx) == 100 * 6
    if t > 0:
      assert task.kept_old[:30 + 10 * (t - 1)].sum() == round(0.1 * (30 + 10 * (t - 1)))
      assert not task.kept_old[30 + 10 * (t - 1):].any()  # new clients take the new task
    movers = [task.client_indices[k] for k in range(len(task.client_ids))
              if not task.kept_old[k]]
    joined = np.concatenate(movers)
    if overlap:
      assert len(np.unique(joined)) < len(joined)
    else:
      assert len(np.unique(joined)) == len(joined)  # disjoint within the task


def test_class_incremental_errors():
  with pytest.raises(ValueError, match="need 100 classes, the labels hold 10"):
    data.class_incremental_tasks(_labels(), rng=np.random.default_rng(0))
  with pytest.raises(ValueError, match="`class_fraction`"):
    data.class_incremental_tasks(_labels(), num_tasks=2, classes_per_task=5, class_fraction=0,
                                 rng=np.random.default_rng(0))

"""iCaRL herding and the fixed-shape exemplar memory against a float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.cil import exemplars

IMAGE_SHAPE = (4, 4, 3)


def ref_herding(features, mask, steps, distinct):
  """The GLFC/iCaRL greedy loop in float64 over the valid rows; original row indices."""
  rows = np.flatnonzero(mask)
  f = np.asarray(features, np.float64)[rows]
  f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
  mu, total = f.mean(axis=0), np.zeros(f.shape[1])
  available = np.ones(len(rows), bool)
  picks = []
  for k in range(steps):
    dist = np.linalg.norm(mu - (total + f) / (k + 1), axis=1)
    if distinct:
      dist[~available] = np.inf
    if not np.isfinite(dist).any():
      break
    i = int(np.argmin(dist))
    total += f[i]
    available[i] = False
    picks.append(int(rows[i]))
  return picks


def _features_with_padding(seed, n_valid=30, n_pad=10, dim=16):
  rng = np.random.default_rng(seed)
  valid = rng.normal(size=(n_valid, dim)) + 0.5  # a common direction: a class cluster
  # Padding rows sit exactly on the class mean direction: the best picks if not masked.
  pad = np.tile(valid.mean(axis=0), (n_pad, 1)) * 3.0
  features = np.concatenate([valid, pad])
  perm = rng.permutation(len(features))
  mask = np.concatenate([np.ones(n_valid, bool), np.zeros(n_pad, bool)])
  return features[perm].astype(np.float32), mask[perm]


@pytest.mark.parametrize("distinct", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_herding_matches_numpy_greedy_reference(seed, distinct):
  features, mask = _features_with_padding(seed)
  herd = jax.jit(functools.partial(exemplars.herding_order, max_select=36, distinct=distinct))
  indices, valid = herd(jnp.asarray(features), jnp.asarray(mask))
  want = ref_herding(features, mask, 36, distinct)
  indices, valid = np.asarray(indices), np.asarray(valid)
  np.testing.assert_array_equal(indices[valid], want)
  assert not np.any(~mask[indices[valid]])  # padding is never picked
  if distinct:
    # 30 valid rows: 30 distinct picks, then nothing.
    np.testing.assert_array_equal(valid, np.arange(36) < 30)
    assert len(set(indices[valid].tolist())) == 30
    np.testing.assert_array_equal(indices[~valid], 0)
  else:
    # The code's loop keeps picked rows as candidates: 36 picks from 30 rows repeat.
    assert valid.all()
    assert len(set(indices.tolist())) < 36


def test_herding_first_pick_is_nearest_to_mean_and_order_is_prefix_consistent():
  features, mask = _features_with_padding(3)
  long_run, _ = exemplars.herding_order(jnp.asarray(features), jnp.asarray(mask), max_select=20)
  short_run, _ = exemplars.herding_order(jnp.asarray(features), jnp.asarray(mask), max_select=5)
  np.testing.assert_array_equal(long_run[:5], short_run)
  f = features / np.linalg.norm(features, axis=1, keepdims=True)
  dist = np.linalg.norm(f[mask].mean(0) - f, axis=1)
  dist[~mask] = np.inf
  assert int(long_run[0]) == int(np.argmin(dist))


def test_herding_without_valid_rows_selects_nothing():
  indices, valid = exemplars.herding_order(jnp.ones((4, 3)), jnp.zeros(4, bool), max_select=3)
  assert not np.any(valid) and np.all(np.asarray(indices) == 0)


# ------------------------------------------------------------------ memory


def _task_data(seed, classes, per_class=12, n_pad=6, dim=8):
  """Images whose pixels all equal the row index, so an image names its source row."""
  rng = np.random.default_rng(seed)
  labels = np.concatenate([np.repeat(classes, per_class), np.full(n_pad, 99)])
  mask = labels != 99
  features = rng.normal(size=(len(labels), dim)).astype(np.float32)
  features += 0.7 * rng.normal(size=(100, dim)).astype(np.float32)[np.minimum(labels, 99)]
  perm = rng.permutation(len(labels))
  labels, mask, features = labels[perm], mask[perm], features[perm]
  images = np.broadcast_to(np.arange(len(labels), dtype=np.uint8)[:, None, None, None],
                           (len(labels),) + IMAGE_SHAPE).copy()
  return dict(images=images, labels=labels.astype(np.int32), features=features, mask=mask)


def _class_entries(memory, cls):
  """(source rows by rank) of class `cls` in the memory."""
  _, labels, valid = exemplars.memory_batch(memory)
  labels, valid = np.asarray(labels), np.asarray(valid)
  at = np.flatnonzero(valid & (labels == cls))
  ranks = np.asarray(memory.ranks)[at]
  rows = np.asarray(memory.images)[at, 0, 0, 0]
  np.testing.assert_array_equal(np.asarray(memory.images)[at],
                                np.broadcast_to(rows[:, None, None, None],
                                                (len(at),) + IMAGE_SHAPE))
  return rows[np.argsort(ranks)], np.sort(ranks)


def _traced_add_classes(counter):
  def add(memory, data, new_classes, num_seen):
    counter.append(1)
    return exemplars.add_classes(memory, **data, new_classes=new_classes, num_seen=num_seen,
                                 max_per_class=10)
  return jax.jit(add)


def test_memory_two_tasks_reduce_and_herd_with_one_compilation():
  capacity = 24
  traces = []
  add = _traced_add_classes(traces)
  memory = exemplars.init_memory(capacity, IMAGE_SHAPE)
  task1 = _task_data(0, [0, 1, 2], n_pad=18)
  task2 = _task_data(1, [3, 4, 5, 6])
  assert task1["labels"].shape == task2["labels"].shape  # same shapes -> same program

  memory = add(memory, task1, jnp.array([0, 1, 2, -1]), jnp.int32(3))
  assert int(memory.per_class) == 8 and int(memory.num_seen) == 3  # 24 // 3
  first_orders = {}
  for c in (0, 1, 2):
    rows, ranks = _class_entries(memory, c)
    want = ref_herding(task1["features"], task1["mask"] & (task1["labels"] == c), 8, False)
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(ranks, np.arange(8))
    first_orders[c] = want
  assert int(np.sum(memory.valid)) == 24
  assert np.all(np.asarray(memory.valid)[:24])

  memory = add(memory, task2, jnp.array([3, 4, 5, 6]), jnp.int32(7))
  m = capacity // 7
  assert int(memory.per_class) == m == 3
  for c in (0, 1, 2):  # reduce: the first m of the earlier herding order
    rows, _ = _class_entries(memory, c)
    np.testing.assert_array_equal(rows, first_orders[c][:m])
  for c in (3, 4, 5, 6):
    rows, _ = _class_entries(memory, c)
    np.testing.assert_array_equal(
        rows, ref_herding(task2["features"], task2["mask"] & (task2["labels"] == c), m, False))
  valid = np.asarray(memory.valid)
  assert valid.sum() == 7 * m and np.all(valid[:7 * m]) and not np.any(valid[7 * m:])
  np.testing.assert_array_equal(np.asarray(memory.labels)[~valid], -1)
  assert not np.any(np.asarray(memory.images)[~valid])
  assert len(traces) == 1  # one trace served both tasks although m changed 8 -> 3


def test_memory_distinct_short_class_and_relearned_class():
  # Class 0 has 12 rows: with distinct picks and m = 24 // 1 = 24 it gets 12.
  data = _task_data(2, [0])
  memory = exemplars.add_classes(exemplars.init_memory(24, IMAGE_SHAPE), **data,
                                 new_classes=jnp.array([0]), num_seen=1, distinct=True)
  rows, _ = _class_entries(memory, 0)
  assert len(rows) == 12 and len(set(rows.tolist())) == 12
  np.testing.assert_array_equal(rows, ref_herding(data["features"], data["mask"], 24, True))
  # The code's repeated picks fill all 24 slots.
  repeat = exemplars.add_classes(exemplars.init_memory(24, IMAGE_SHAPE), **data,
                                 new_classes=jnp.array([0]), num_seen=1)
  assert int(np.sum(repeat.valid)) == 24
  # Learning class 0 again replaces its entries instead of duplicating them.
  again = exemplars.add_classes(repeat, **data, new_classes=jnp.array([0]), num_seen=1)
  assert int(np.sum(again.valid)) == 24
  np.testing.assert_array_equal(again.images, repeat.images)


def test_memory_vmaps_over_clients():
  capacity = 24
  clients = [_task_data(3, [0, 1]), _task_data(4, [5, 7])]
  new = jnp.array([[0, 1], [5, 7]])
  num_seen = jnp.array([2, 4])  # client 1 also counts two classes it will learn later
  single = [exemplars.add_classes(exemplars.init_memory(capacity, IMAGE_SHAPE), **d,
                                  new_classes=new[i], num_seen=num_seen[i], max_per_class=12)
            for i, d in enumerate(clients)]
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *clients)
  memories = jax.vmap(lambda _: exemplars.init_memory(capacity, IMAGE_SHAPE))(jnp.arange(2))
  batched = jax.jit(jax.vmap(functools.partial(exemplars.add_classes, max_per_class=12)))(
      memories, images=stacked["images"], labels=stacked["labels"],
      features=stacked["features"], mask=stacked["mask"], new_classes=new, num_seen=num_seen)
  for i in range(2):
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           jax.tree_util.tree_map(lambda x: x[i], batched), single[i])
  np.testing.assert_array_equal(batched.per_class, [12, 6])


def test_memory_rejects_float_images_and_bad_shapes():
  data = _task_data(5, [0])
  memory = exemplars.init_memory(8, IMAGE_SHAPE)
  with pytest.raises(ValueError, match="`images` must be uint8"):
    exemplars.add_classes(memory, **{**data, "images": data["images"].astype(np.float32)},
                          new_classes=jnp.array([0]), num_seen=1)
  with pytest.raises(ValueError, match=r"`features` must have shape \(n, feature_dim\)"):
    exemplars.add_classes(memory, **{**data, "features": data["features"][:3]},
                          new_classes=jnp.array([0]), num_seen=1)
  with pytest.raises(ValueError, match="`capacity` must be a positive int"):
    exemplars.init_memory(0)

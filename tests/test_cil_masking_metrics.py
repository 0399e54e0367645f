"""Class masks (fedjax_het.cil.masking) and class-incremental metrics (fedjax_het.cil.metrics)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from fedjax_het.cil import masking, metrics


def _np_bce(z, y):
  """Stable float64 elementwise BCE with logits."""
  z, y = np.asarray(z, np.float64), np.asarray(y, np.float64)
  return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


def _np_masked_bce(z, y, class_mask, weights=None):
  m = np.broadcast_to(np.asarray(class_mask, bool), np.shape(z))
  per = np.where(m, _np_bce(np.where(m, z, 0), np.where(m, y, 0)), 0.0)
  rows = per.sum(axis=1) / np.maximum(m.sum(axis=1), 1)
  w = np.ones(len(rows)) if weights is None else np.asarray(weights, np.float64)
  return float((w * rows).sum() / max(w.sum(), 1e-300)) if w.sum() > 0 else 0.0


def _case(seed=0, b=8, c=6):
  rng = np.random.default_rng(seed)
  logits = rng.normal(0, 3, (b, c)).astype(np.float32)
  logits[0, :3] = [30.0, -45.0, 60.0]  # saturated logits
  logits[1, :3] = [-60.0, 52.0, -30.0]
  targets = rng.uniform(0, 1, (b, c)).astype(np.float32)
  targets[0, :3] = [1.0, 0.0, 0.3]
  targets[1, :3] = [0.0, 1.0, 1.0]
  return logits, targets


# ----------------------------------------------------------------------------- mask


def test_seen_class_mask_and_its_errors():
  np.testing.assert_array_equal(masking.seen_class_mask(3, 5), [1, 1, 1, 0, 0])
  np.testing.assert_array_equal(masking.seen_class_mask(jnp.int32(0), 3), [0, 0, 0])
  with pytest.raises(ValueError, match=r"`num_seen` must lie in \[0, 5\], got 6"):
    masking.seen_class_mask(6, 5)
  with pytest.raises(ValueError, match=r"`num_classes` must be a Python int >= 1"):
    masking.seen_class_mask(2, 0)
  with pytest.raises(ValueError, match=r"`num_seen` must be an integer scalar"):
    masking.seen_class_mask(2.0, 5)


def test_unseen_classes_are_unreachable_even_with_the_largest_logits():
  rng = np.random.default_rng(1)
  logits = rng.normal(0, 1, (16, 6)).astype(np.float32)
  logits[:, 3:] = 1e4  # unseen classes 3..5 dominate the raw logits
  logits[0, 4], logits[1, 5] = np.inf, np.nan
  labels = rng.integers(0, 3, 16).astype(np.int32)
  cm = masking.seen_class_mask(3, 6)

  masked = masking.mask_logits(logits, cm)
  assert masked.dtype == jnp.float32 and np.isfinite(masked).all()
  np.testing.assert_array_equal(masked[:, 3:], np.float32(masking.UNSEEN_LOGIT))
  np.testing.assert_array_equal(masked[:, :3], logits[:, :3])
  np.testing.assert_array_equal(jax.nn.softmax(masked)[:, 3:], 0.0)
  np.testing.assert_array_equal(jax.nn.sigmoid(masked)[:, 3:], 0.0)
  expected_pred = np.argmax(logits[:, :3], axis=1)
  np.testing.assert_array_equal(jnp.argmax(masked, axis=1), expected_pred)
  np.testing.assert_array_equal(masking.masked_predictions(logits, cm), expected_pred)
  acc = masking.masked_accuracy(logits, labels, cm)
  np.testing.assert_allclose(acc, np.mean(expected_pred == labels), rtol=1e-6)
  assert masking.masked_accuracy(logits, labels, jnp.ones(6, bool)) == 0.0  # unmasked: all wrong
  # Even seen logits below the fill value cannot lose to an unseen class in masked_predictions.
  low = np.full((2, 6), -1e12, np.float32)
  low[:, 3:] = 1e4
  assert (masking.masked_predictions(low, cm) < 3).all()


def test_per_example_class_mask_and_dtype_aware_fill():
  logits = jnp.array([[5.0, 1.0, 9.0], [5.0, 1.0, 9.0]])
  cm = jnp.array([[True, True, False], [False, True, True]])
  np.testing.assert_array_equal(masking.masked_predictions(logits, cm), [0, 2])
  half = masking.mask_logits(logits.astype(jnp.float16), jnp.array([True, False, True]))
  assert np.isfinite(np.asarray(half, np.float32)).all() and float(half[0, 1]) == -32752.0
  with pytest.raises(ValueError, match=r"`class_mask` must have shape \(num_classes,\) = \(3,\)"):
    masking.mask_logits(logits, jnp.ones(4, bool))
  with pytest.raises(ValueError, match=r"`class_mask` must be a boolean array"):
    masking.mask_logits(logits, jnp.ones(3))


def test_gradients_wrt_unseen_logits_are_exactly_zero():
  logits, targets = _case()
  logits[2, 4], logits[3, 5] = np.inf, np.nan  # garbage in unseen columns stays out
  targets[2, 4] = np.nan
  cm = masking.seen_class_mask(3, 6)

  def bce(z):
    return masking.masked_sigmoid_bce(logits=z, targets=targets, class_mask=cm)

  def softmax_ce(z):
    masked = masking.mask_logits(z, cm)
    return losses.softmax_cross_entropy(logits=masked, labels=jnp.arange(8) % 3)

  for fn in (bce, softmax_ce):
    value, grad = jax.value_and_grad(fn)(jnp.asarray(logits))
    assert np.isfinite(value) and np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[:, 3:], 0.0)
    assert np.abs(grad[2:, :3]).min() > 0  # rows 0-1 hold saturated logits
  grad_targets = jax.grad(lambda y: masking.masked_sigmoid_bce(
      logits=jnp.asarray(logits), targets=y, class_mask=cm))(jnp.asarray(targets))
  np.testing.assert_array_equal(grad_targets[:, 3:], 0.0)


# ----------------------------------------------------------------------------- masked BCE


@pytest.mark.parametrize("num_seen", [1, 3, 6])
def test_masked_bce_equals_float64_numpy_over_seen_columns(num_seen):
  logits, targets = _case()
  cm = np.arange(6) < num_seen
  weights = np.array([1, 1, 0, 1, 0.5, 1, 1, 0], np.float32)
  for w in (None, weights):
    got = masking.masked_sigmoid_bce(logits=logits, targets=targets, class_mask=jnp.asarray(cm),
                                     mask=w)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, _np_masked_bce(logits, targets, cm, w), rtol=2e-6, atol=1e-7)
  # The GLFC code's form: BCE on the grown head's outputs (the seen prefix).
  prefix = losses.sigmoid_binary_cross_entropy(logits=logits[:, :num_seen],
                                               targets=targets[:, :num_seen])
  unmasked = masking.masked_sigmoid_bce(logits=logits, targets=targets,
                                        class_mask=jnp.asarray(cm))
  np.testing.assert_allclose(unmasked, prefix, rtol=1e-6)


def test_masked_bce_per_example_mask_and_conventions():
  logits, targets = _case(seed=2)
  cm = np.random.default_rng(0).uniform(size=(8, 6)) < 0.5
  cm[0] = False  # a row without seen classes contributes 0
  got = masking.masked_sigmoid_bce(logits=logits, targets=targets, class_mask=jnp.asarray(cm))
  np.testing.assert_allclose(got, _np_masked_bce(logits, targets, cm), rtol=2e-6)
  assert masking.masked_sigmoid_bce(logits=logits, targets=targets, class_mask=jnp.ones(6, bool),
                                    mask=jnp.zeros(8)) == 0.0
  with pytest.raises(TypeError, match="keyword arguments only"):
    masking.masked_sigmoid_bce(logits, targets, jnp.ones(6, bool))  # pylint: disable=E1121
  with pytest.raises(ValueError, match=r"masked_sigmoid_bce: `mask` must have shape"):
    masking.masked_sigmoid_bce(logits=logits, targets=targets, class_mask=jnp.ones(6, bool),
                               mask=jnp.ones(7))


# ----------------------------------------------------------------------------- one trace


def test_one_jitted_function_serves_every_num_seen_with_one_trace():
  logits, targets = _case(seed=3, b=12, c=10)
  labels = np.random.default_rng(4).integers(0, 10, 12).astype(np.int32)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def evaluate(z, y, t, num_seen):
    cm = masking.seen_class_mask(num_seen, 10)
    loss = masking.masked_sigmoid_bce(logits=z, targets=t, class_mask=cm)
    return loss, masking.masked_accuracy(z, y, cm, cm[y])

  chex.clear_trace_counter()
  for num_seen in (2, 4, 6, 8, 10):
    loss, acc = evaluate(logits, labels, targets, jnp.int32(num_seen))
    cm = np.arange(10) < num_seen
    np.testing.assert_allclose(loss, _np_masked_bce(logits, targets, cm), rtol=2e-6)
    valid = labels < num_seen
    pred = np.argmax(np.where(cm, logits, -np.inf), axis=1)
    expected = np.mean(pred[valid] == labels[valid]) if valid.any() else 0.0
    np.testing.assert_allclose(acc, expected, rtol=1e-6)


def test_masked_class_counts_by_hand():
  logits = jnp.array([[3.0, 1.0, 9.0], [0.0, 2.0, 9.0], [1.0, 0.0, 9.0], [0.0, 5.0, 9.0]])
  labels = jnp.array([0, 0, 1, 2])
  correct, total = masking.masked_class_counts(logits, labels, masking.seen_class_mask(2, 3),
                                               jnp.array([True, True, True, False]))
  # predictions over classes {0, 1}: 0, 1, 0, (1: invalid row)
  np.testing.assert_array_equal(correct, [1, 0, 0])
  np.testing.assert_array_equal(total, [2, 1, 0])
  assert correct.dtype == jnp.int32


# ----------------------------------------------------------------------------- metrics


def test_accuracy_matrix_by_hand():
  # 2 tasks of 2 classes; test counts 10, 10, 5, 5.
  total = [10, 10, 5, 5]
  correct = [[8, 6, 0, 0],   # after task 0: task 0 = 14/20
             [5, 3, 4, 2]]   # after task 1: task 0 = 8/20, task 1 = 6/10, seen = 14/30
  m = metrics.accuracy_matrix(correct, total, 2)
  np.testing.assert_allclose(m.per_task, [[0.7, np.nan], [0.4, 0.6]])
  np.testing.assert_allclose(m.seen, [0.7, 14 / 30])
  assert metrics.average_incremental_accuracy(m.seen) == pytest.approx((0.7 + 14 / 30) / 2)
  assert metrics.forgetting(m.per_task) == pytest.approx(0.3)
  # Counts of unseen classes are ignored; per-row totals are accepted.
  m2 = metrics.accuracy_matrix([[8, 6, 5, 5], [5, 3, 4, 2]], [total, total], 2)
  np.testing.assert_allclose(m2.seen, m.seen)
  # A partial record (1 of 2 tasks) and a task without test examples.
  m3 = metrics.accuracy_matrix([[8, 6, 0, 0]], [10, 10, 0, 0], 2)
  assert m3.per_task.shape == (1, 2) and m3.seen[0] == pytest.approx(0.7)
  m4 = metrics.accuracy_matrix([[0, 0, 0, 0], [0, 0, 1, 0]], [0, 0, 5, 5], 2)
  assert np.isnan(m4.per_task[1, 0]) and m4.per_task[1, 1] == 0.1
  assert np.isnan(m4.seen[0]) and m4.seen[1] == 0.1


def test_forgetting_uses_the_best_earlier_accuracy():
  a = np.array([[0.6, np.nan, np.nan],
                [0.8, 0.9, np.nan],
                [0.5, 0.6, 0.95]])
  # task 0: max(0.6, 0.8) - 0.5 = 0.3; task 1: 0.9 - 0.6 = 0.3; mean 0.3. Task 2 is not old.
  assert metrics.forgetting(a) == pytest.approx(0.3)
  a[2, 0] = 0.9  # improved beyond its best: negative forgetting counts (backward transfer)
  assert metrics.forgetting(a) == pytest.approx(((0.8 - 0.9) + 0.3) / 2)
  assert metrics.forgetting(a[:2]) == pytest.approx(0.6 - 0.8)


def test_table1_row_reproduces_the_glfc_paper_row():
  # GLFC Table 1, "Ours" (CIFAR-100, T = 10): Avg. 66.9.
  seen = [0.900, 0.823, 0.770, 0.723, 0.650, 0.663, 0.597, 0.563, 0.503, 0.500]
  assert metrics.table1_row("GLFC", seen, 10) == (
      "| GLFC | 90.0 | 82.3 | 77.0 | 72.3 | 65.0 | 66.3 | 59.7 | 56.3 | 50.3 | 50.0 | 66.9 |")
  assert metrics.average_incremental_accuracy(seen) == pytest.approx(0.6692)
  assert metrics.table1_header(5, 20) == (
      "| Methods | 20 | 40 | 60 | 80 | 100 | Avg. |\n|---|---:|---:|---:|---:|---:|---:|")
  assert metrics.table1_row("x", [0.72, 0.623], 20, decimals=2) == "| x | 72.00 | 62.30 | 67.15 |"


def test_metrics_end_to_end_from_masked_counts():
  rng = np.random.default_rng(5)
  labels = np.repeat(np.arange(6), [4, 3, 5, 2, 6, 4]).astype(np.int32)
  counts = jax.jit(masking.masked_class_counts)
  correct, totals, accuracies = [], None, []
  for t in range(3):
    logits = rng.normal(0, 1, (len(labels), 6)).astype(np.float32)
    cm = masking.seen_class_mask(2 * (t + 1), 6)
    c, totals = counts(logits, labels, cm)
    correct.append(np.asarray(c))
    accuracies.append(float(masking.masked_accuracy(logits, labels, cm, cm[labels])))
  m = metrics.accuracy_matrix(np.stack(correct), totals, 2)
  np.testing.assert_allclose(m.seen, accuracies, rtol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: metrics.accuracy_matrix([[1, 0, 0]], [1, 1, 1], 2),
     r"3 classes, not a multiple of `classes_per_task`=2"),
    (lambda: metrics.accuracy_matrix([[2, 0]], [1, 1], 1), r"correct <= total"),
    (lambda: metrics.accuracy_matrix([[0, 0]] * 3, [1, 1], 1), r"3 rows .* only 2 tasks"),
    (lambda: metrics.accuracy_matrix([[0, 0]], [1, 1], 0), r"`classes_per_task` must be"),
    (lambda: metrics.forgetting([[0.5, np.nan]]), r"forgetting needs an old task"),
    (lambda: metrics.forgetting([[np.nan, np.nan], [0.5, 0.5]]), r"finite accuracies"),
    (lambda: metrics.average_incremental_accuracy([90.0, 80.0]), r"fractions in \[0, 1\]"),
    (lambda: metrics.average_incremental_accuracy([]), r"non-empty 1-D"),
    (lambda: metrics.table1_row("a|b", [0.5], 10), r"`method` must be"),
])
def test_metric_errors_name_the_problem(call, match):
  with pytest.raises(ValueError, match=match):
    call()

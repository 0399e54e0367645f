"""GLFC losses against the loop-based NumPy reference and hand-worked cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from tests import numpy_reference as ref

RTOL = 2e-5
LN2 = math.log(2.0)


def _f32(x):
  return jnp.asarray(x, jnp.float32)


# ------------------------------------------------------- gradient compensation (Eq. 2-4)


@pytest.mark.parametrize("num_old", [0, 3, 6, 10])
@pytest.mark.parametrize("compensate_first_task", [False, True])
def test_gradient_compensation_matches_reference(num_old, compensate_first_task):
  rng = np.random.default_rng(num_old)
  z, y = rng.normal(size=(24, 10)) * 3, rng.integers(0, 10, size=24)
  got = losses.class_aware_gradient_compensation_loss(
      logits=_f32(z), labels=jnp.asarray(y), num_old_classes=num_old,
      compensate_first_task=compensate_first_task)
  want = ref.ref_gradient_compensation_loss(z, y, num_old_classes=num_old,
                                            compensate_first_task=compensate_first_task)
  np.testing.assert_allclose(got, want, rtol=RTOL)


def test_gradient_compensation_hand_worked():
  # Sample 0: old class 0, z = [0, 0]. Samples 1, 2: new class 1 with
  # sigmoid(z_1) = 1/2 and 3/4, so g = 1/2 and 1/4, G_new = 3/8 and weights
  # 4/3 and 2/3; the lone old sample has weight 1.
  z = _f32([[0.0, 0.0], [0.0, 0.0], [0.0, math.log(3.0)]])
  y = jnp.array([0, 1, 1])
  got = losses.class_aware_gradient_compensation_loss(logits=z, labels=y, num_old_classes=1)
  bce_rows = [2 * LN2, 2 * LN2, LN2 + math.log(4.0 / 3.0)]  # BCE(ln3, 1) = ln(4/3)
  expected = (1.0 * bce_rows[0] + (4 / 3) * bce_rows[1] + (2 / 3) * bce_rows[2]) / 6
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  # First task, the code's rule: plain BCE.
  first = losses.class_aware_gradient_compensation_loss(logits=z, labels=y, num_old_classes=0)
  np.testing.assert_allclose(first, sum(bce_rows) / 6, rtol=1e-6)


def test_gradient_compensation_empty_group_and_zero_gradient_are_finite():
  # Every sample is old: the new group is empty.
  z = _f32(np.random.default_rng(0).normal(size=(5, 4)))
  y = jnp.array([0, 1, 0, 1, 1])
  value, grad = jax.value_and_grad(lambda x: losses.class_aware_gradient_compensation_loss(
      logits=x, labels=y, num_old_classes=2))(z)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  np.testing.assert_allclose(value, ref.ref_gradient_compensation_loss(
      np.asarray(z), np.asarray(y), num_old_classes=2), rtol=RTOL)
  # Saturated predictions: g underflows in both groups, but w = g / G = 1 (each
  # group's samples are identical); every BCE term is 0, so the loss is 0, no NaN.
  saturated = jnp.where(jax.nn.one_hot(y, 4) > 0, 1e4, -1e4)
  value, grad = jax.value_and_grad(lambda x: losses.class_aware_gradient_compensation_loss(
      logits=x, labels=y, num_old_classes=1))(saturated)
  assert float(value) == 0.0 and np.all(np.isfinite(grad))


def _gradient_compensation_float64(z, y, num_old):
  """Float64 L_GC with g = 1 / (1 + exp(z_y)) (no cancellation; both groups non-empty)."""
  z = np.asarray(z, np.float64)
  g = 1.0 / (1.0 + np.exp(z[np.arange(len(y)), y]))
  old = y < num_old
  w = np.where(old, g / g[old].mean(), g / g[~old].mean())
  bce = np.logaddexp(0.0, z) - z * np.eye(z.shape[1])[y]
  return float(np.mean(w[:, None] * bce))


def test_gradient_compensation_confident_true_class_keeps_its_weight():
  # |sigmoid(20) - 1| is 0 in float32: computed that way the lone old sample got
  # weight 0 and the loss was ~0.283 instead of ~0.514.
  z, y = np.array([[20.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), np.array([0, 2])
  got = losses.class_aware_gradient_compensation_loss(logits=_f32(z), labels=jnp.asarray(y),
                                                      num_old_classes=1)
  want = _gradient_compensation_float64(z, y, 1)
  assert want == pytest.approx(0.514, abs=1e-3)
  np.testing.assert_allclose(got, want, rtol=RTOL)
  np.testing.assert_allclose(got, ref.ref_gradient_compensation_loss(z, y, num_old_classes=1),
                             rtol=RTOL)


@pytest.mark.parametrize("low,high", [(30.0, 60.0), (100.0, 120.0)])
def test_gradient_compensation_saturated_regime_matches_float64(low, high):
  # True-class logits 30-60 (g ~ 1e-13 .. 1e-26: below the old 1e-12 floor) and
  # 100-120 (g underflows float32 entirely); the other logits are moderate, so
  # the BCE rows and hence the weights matter. Weights differ within a group.
  rng = np.random.default_rng(11)
  y = np.array([0, 1, 2, 0, 3, 4, 5, 3])
  z = rng.normal(size=(8, 6)) * 2
  z[np.arange(8), y] = rng.uniform(low, high, size=8)
  for num_old in (3, 4):
    got = losses.class_aware_gradient_compensation_loss(logits=_f32(z), labels=jnp.asarray(y),
                                                        num_old_classes=num_old)
    np.testing.assert_allclose(got, _gradient_compensation_float64(z, y, num_old), rtol=1e-4)
  # A padded row full of huge logits changes nothing.
  mask = np.ones(9, bool)
  mask[4] = False
  zp, yp = np.insert(z, 4, 1e4, axis=0), np.insert(y, 4, 0)
  got = losses.class_aware_gradient_compensation_loss(
      logits=_f32(zp), labels=jnp.asarray(yp), num_old_classes=3, mask=jnp.asarray(mask))
  np.testing.assert_allclose(got, _gradient_compensation_float64(z, y, 3), rtol=1e-4)


def test_gradient_compensation_weights_are_constants():
  # d/dz of mean(w * BCE) with w held fixed: w_b * (sigmoid(z) - onehot) / (B*C).
  rng = np.random.default_rng(1)
  z, y = rng.normal(size=(6, 3)), np.array([0, 1, 2, 0, 1, 2])
  grad = jax.grad(lambda x: losses.class_aware_gradient_compensation_loss(
      logits=x, labels=jnp.asarray(y), num_old_classes=1))(_f32(z))
  s = 1 / (1 + np.exp(-z))
  g = np.abs(s[np.arange(6), y] - 1)
  old = y < 1
  w = np.where(old, g / g[old].mean(), g / g[~old].mean())
  want = w[:, None] * (s - np.eye(3)[y]) / z.size
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_gradient_compensation_accepts_traced_num_old_classes():
  z, y = _f32(np.ones((4, 5))), jnp.array([0, 1, 3, 4])
  fn = jax.jit(lambda n: losses.class_aware_gradient_compensation_loss(
      logits=z, labels=y, num_old_classes=n))
  for n in (0, 2, 5):
    np.testing.assert_allclose(fn(n), ref.ref_gradient_compensation_loss(
        np.asarray(z), np.asarray(y), num_old_classes=n), rtol=RTOL)


# ------------------------------------------------------- relation distillation (Eq. 5)


@pytest.mark.parametrize("num_old", [0, 4, 10])
def test_relation_distillation_matches_reference(num_old):
  rng = np.random.default_rng(7)
  z, old = rng.normal(size=(12, 10)) * 2, rng.normal(size=(12, num_old)) * 2
  y = rng.integers(0, 10, size=12)
  got = losses.class_semantic_relation_distillation_loss(logits=_f32(z), labels=jnp.asarray(y),
                                                         old_logits=_f32(old))
  np.testing.assert_allclose(got, ref.ref_relation_distillation_loss(z, y, old), rtol=RTOL)


def test_relation_distillation_hand_worked():
  # Target [sigmoid(0), 1] = [1/2, 1]; BCE(ln 3, 1/2) = ln 4 - ln(3)/2, BCE(0, 1) = ln 2.
  got = losses.class_semantic_relation_distillation_loss(
      logits=_f32([[math.log(3.0), 0.0]]), labels=jnp.array([1]), old_logits=jnp.zeros((1, 1)))
  np.testing.assert_allclose(got, (math.log(4.0) - 0.5 * math.log(3.0) + LN2) / 2, rtol=1e-6)


def test_relation_distillation_rejects_more_old_classes_than_outputs():
  with pytest.raises(ValueError, match="old_logits"):
    losses.class_semantic_relation_distillation_loss(
        logits=jnp.zeros((2, 3)), labels=jnp.array([0, 1]), old_logits=jnp.zeros((2, 4)))


# ------------------------------------------------------- task transition (Eq. 7)


def test_mean_prediction_entropy_matches_reference_and_hand_case():
  rng = np.random.default_rng(3)
  z = rng.normal(size=(10, 6)) * 4
  mask = (rng.random(10) > 0.3).astype(np.float32)
  np.testing.assert_allclose(losses.mean_prediction_entropy(logits=_f32(z)),
                             ref.ref_mean_prediction_entropy(z), rtol=RTOL)
  np.testing.assert_allclose(losses.mean_prediction_entropy(logits=_f32(z), mask=jnp.asarray(mask)),
                             ref.ref_mean_prediction_entropy(z, mask), rtol=RTOL)
  # Uniform predictions over 2 and 4 classes: ln 2 and ln 4; a confident row: ~0.
  assert float(losses.mean_prediction_entropy(logits=jnp.zeros((3, 4)))) == pytest.approx(
      math.log(4.0), rel=1e-6)
  masked = losses.mean_prediction_entropy(logits=_f32([[0.0, 0.0], [50.0, -50.0]]),
                                          mask=jnp.array([1.0, 0.0]))
  assert float(masked) == pytest.approx(LN2, rel=1e-6)


def test_task_transition_detection_threshold():
  detected = losses.task_transition_detected(entropy=jnp.array([2.5, 2.0, 1.0]),
                                             previous_entropy=jnp.array([1.0, 1.0, 1.0]))
  np.testing.assert_array_equal(detected, [True, False, False])
  # New classes the global model has never seen raise the entropy past r_h.
  old_task = _f32(np.eye(10)[np.arange(10) % 5] * 20.0)  # confident on old classes
  new_task = jnp.zeros((10, 10))  # uncertain on unseen classes
  h_old = losses.mean_prediction_entropy(logits=old_task)
  h_new = losses.mean_prediction_entropy(logits=new_task)
  assert bool(losses.task_transition_detected(entropy=h_new, previous_entropy=h_old))


# ------------------------------------------------------- prototype perturbation (Eq. 10)


@pytest.mark.parametrize("kind", ["bce", "ce"])
def test_prototype_perturbation_matches_reference(kind):
  rng = np.random.default_rng(4)
  f, n = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
  var = rng.random((5, 8)) * 2
  kernel, bias = rng.normal(size=(8, 10)), rng.normal(size=10)
  y = rng.integers(0, 10, size=5)
  got = losses.prototype_perturbation_loss(features=_f32(f), labels=jnp.asarray(y), noise=_f32(n),
                                           feature_variance=_f32(var), kernel=_f32(kernel),
                                           bias=_f32(bias), gamma=0.1, kind=kind)
  want = ref.ref_prototype_perturbation_loss(f, y, n, var, kernel, bias, gamma=0.1, kind=kind)
  np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("kind", ["bce", "ce"])
def test_prototype_perturbation_class_mask_equals_the_seen_head(kind):
  # A fixed-size head with unseen columns (even saturated ones) gives the loss of the
  # seen columns alone, the authors' grown head; their gradient w.r.t. features too.
  rng = np.random.default_rng(5)
  f, n = rng.normal(size=(3, 8)), rng.normal(size=(3, 8))
  var = rng.random((3, 8))
  kernel, bias = rng.normal(size=(8, 6)), rng.normal(size=6)
  bias[4:] = [40.0, -40.0]
  y = np.array([0, 3, 2])
  seen = np.arange(6) < 4

  def loss(features, k, b, mask):
    return losses.prototype_perturbation_loss(
        features=features, labels=jnp.asarray(y), noise=_f32(n), feature_variance=_f32(var),
        kernel=k, bias=b, gamma=0.1, kind=kind, class_mask=mask)

  got, got_grad = jax.value_and_grad(loss)(_f32(f), _f32(kernel), _f32(bias), jnp.asarray(seen))
  want = ref.ref_prototype_perturbation_loss(f, y, n, var[:, :], kernel[:, :4], bias[:4],
                                             gamma=0.1, kind=kind)
  np.testing.assert_allclose(got, want, rtol=RTOL)
  small_grad = jax.grad(loss)(_f32(f), _f32(kernel[:, :4]), _f32(bias[:4]), None)
  np.testing.assert_allclose(got_grad, small_grad, rtol=1e-5, atol=1e-7)


def test_prototype_perturbation_hand_worked():
  # Feature 0 plus gamma * sqrt(4) * noise 1 = 1 at gamma 1/2: z = [0, ln 3]; CE of class 1 = ln(4/3).
  kernel = _f32([[0.0, math.log(3.0)], [5.0, 5.0]])
  got = losses.prototype_perturbation_loss(
      features=jnp.zeros((1, 2)), labels=jnp.array([1]), noise=_f32([[1.0, 0.0]]),
      feature_variance=_f32([[4.0, 0.0]]), kernel=kernel, bias=jnp.zeros(2), gamma=0.5, kind="ce")
  np.testing.assert_allclose(got, math.log(4.0 / 3.0), rtol=1e-6)


def test_prototype_perturbation_rejects_unknown_kind():
  with pytest.raises(ValueError, match=r"`kind` must be one of 'bce', 'ce', got 'mse'"):
    losses.prototype_perturbation_loss(
        features=jnp.zeros((1, 2)), labels=jnp.array([0]), noise=jnp.zeros((1, 2)),
        feature_variance=jnp.zeros((1, 2)), kernel=jnp.zeros((2, 3)), bias=jnp.zeros(3),
        kind="mse")


# ------------------------------------------------------- gradient inversion (Eq. 8)


def _lenet_like(params, x):
  """Tiny stand-in for the GLFC gradient encoder: sigmoid hidden layer + linear head."""
  h = jax.nn.sigmoid(x @ params["hidden"]["kernel"])
  return h @ params["head"]["kernel"] + params["head"]["bias"][None, :]


def _encoder_params(key, dim=6, hidden=5, classes=4):
  k1, k2 = jax.random.split(key)
  return {"hidden": {"kernel": jax.random.uniform(k1, (dim, hidden), minval=-0.5, maxval=0.5)},
          "head": {"kernel": jax.random.uniform(k2, (hidden, classes), minval=-0.5, maxval=0.5),
                   "bias": jnp.zeros(classes)}}


def _ce_gradient(params, x, label):
  return jax.grad(lambda p: losses.softmax_cross_entropy(
      logits=_lenet_like(p, x[None]), labels=jnp.array([label])))(params)


def test_gradient_matching_matches_reference_and_hand_case():
  rng = np.random.default_rng(5)
  a = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
  b = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
  got = losses.gradient_matching_loss(gradients={"w": _f32(a[0]), "b": _f32(a[1])},
                                      target_gradients={"w": _f32(b[0]), "b": _f32(b[1])})
  np.testing.assert_allclose(got, ref.ref_gradient_matching_loss(a, b), rtol=RTOL)
  hand = losses.gradient_matching_loss(
      gradients={"a": _f32([1.0, 2.0]), "b": _f32([[3.0]])},
      target_gradients={"a": jnp.zeros(2), "b": _f32([[1.0]])})
  assert float(hand) == pytest.approx(1.0 + 4.0 + 4.0)


def test_gradient_matching_is_zero_at_the_true_input_and_guides_reconstruction():
  params = _encoder_params(jax.random.key(0))
  x_true = jax.random.normal(jax.random.key(1), (6,))
  target = _ce_gradient(params, x_true, 2)

  def objective(x):
    return losses.gradient_matching_loss(gradients=_ce_gradient(params, x, 2),
                                         target_gradients=target)

  value, grad = jax.value_and_grad(objective)(x_true)
  assert float(value) == pytest.approx(0.0, abs=1e-12)
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)
  # From a different start, descent on L_RT reduces it (Eq. 9).
  x = jax.random.normal(jax.random.key(2), (6,))
  start = float(objective(x))
  step = jax.jit(lambda v: v - 1.0 * jax.grad(objective)(v))
  for _ in range(200):
    x = step(x)
  assert float(objective(x)) < 0.1 * start


def test_gradient_matching_rejects_mismatched_trees():
  with pytest.raises(ValueError, match="same structure"):
    losses.gradient_matching_loss(gradients={"a": jnp.zeros(2)},
                                  target_gradients={"b": jnp.zeros(2)})
  with pytest.raises(ValueError, match=r"leaf 0 .* shape \(2,\)"):
    losses.gradient_matching_loss(gradients={"a": jnp.zeros(2)},
                                  target_gradients={"a": jnp.zeros(3)})


def test_infer_label_from_last_layer_gradient_recovers_every_label():
  params = _encoder_params(jax.random.key(3))
  xs = jax.random.normal(jax.random.key(4), (4, 6))
  for label in range(4):
    grads = _ce_gradient(params, xs[label], label)
    kernel_grad = grads["head"]["kernel"]
    assert int(losses.infer_label_from_last_layer_gradient(kernel_gradient=kernel_grad)) == label
    assert ref.ref_infer_label_from_gradient(np.asarray(kernel_grad)) == label
  batched = jax.vmap(lambda g: losses.infer_label_from_last_layer_gradient(kernel_gradient=g))(
      jnp.stack([_ce_gradient(params, xs[i], i)["head"]["kernel"] for i in range(4)]))
  np.testing.assert_array_equal(batched, [0, 1, 2, 3])


# ------------------------------------------------ fixed-size heads (class masks)


@pytest.mark.parametrize("num_seen,num_old", [(4, 0), (6, 4), (10, 6)])
def test_class_masked_losses_equal_the_losses_on_the_seen_columns(num_seen, num_old):
  rng = np.random.default_rng(num_seen)
  logits = rng.normal(size=(7, 10)) * 3.0
  logits[:, num_seen:] = rng.choice([1e4, -1e4, 50.0], size=(7, 10 - num_seen))  # junk
  labels = rng.integers(0, num_seen, 7)
  old = rng.normal(size=(7, 10))
  seen = jnp.arange(10) < num_seen
  full, sliced = jnp.asarray(logits, jnp.float32), jnp.asarray(logits[:, :num_seen], jnp.float32)
  got = losses.class_aware_gradient_compensation_loss(
      logits=full, labels=jnp.asarray(labels), num_old_classes=num_old, class_mask=seen)
  want = losses.class_aware_gradient_compensation_loss(
      logits=sliced, labels=jnp.asarray(labels), num_old_classes=num_old)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got, ref.ref_gradient_compensation_loss(
      logits[:, :num_seen], labels, num_old_classes=num_old), rtol=1e-5)
  if num_old:
    got = losses.class_semantic_relation_distillation_loss(
        logits=full, labels=jnp.asarray(labels), old_logits=jnp.asarray(old, jnp.float32),
        num_old_classes=num_old, class_mask=seen)
    want = losses.class_semantic_relation_distillation_loss(
        logits=sliced, labels=jnp.asarray(labels),
        old_logits=jnp.asarray(old[:, :num_old], jnp.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6)
  got = losses.mean_prediction_entropy(logits=full, class_mask=seen)
  np.testing.assert_allclose(got, losses.mean_prediction_entropy(logits=sliced), rtol=1e-6)


def test_class_masked_losses_give_unseen_columns_no_gradient_and_trace_once():
  traces = []

  @jax.jit
  def total(logits, labels, old, num_seen):
    traces.append(1)
    seen = jnp.arange(logits.shape[-1]) < num_seen
    num_old = num_seen - 2
    return (losses.class_aware_gradient_compensation_loss(
        logits=logits, labels=labels, num_old_classes=num_old, class_mask=seen)
            + losses.class_semantic_relation_distillation_loss(
                logits=logits, labels=labels, old_logits=old, num_old_classes=num_old,
                class_mask=seen)
            + losses.mean_prediction_entropy(logits=logits, class_mask=seen))

  logits = jnp.asarray(np.random.default_rng(0).normal(size=(5, 8)), jnp.float32)
  logits = logits.at[:, 6:].set(jnp.inf)  # unseen columns may hold anything
  labels = jnp.asarray([0, 1, 2, 3, 5])
  for num_seen in (4, 6):
    grad = jax.grad(total)(logits, jnp.minimum(labels, num_seen - 1), logits * 0.5,
                           jnp.int32(num_seen))
    assert np.all(np.isfinite(grad[:, :num_seen]))
    np.testing.assert_array_equal(grad[:, num_seen:], 0.0)
  assert len(traces) == 1
  with pytest.raises(ValueError, match=r"`class_mask` must have shape \(num_classes,\)"):
    losses.mean_prediction_entropy(logits=logits, class_mask=jnp.ones(3, bool))

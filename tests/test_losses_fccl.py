"""FCCL / FCCL+ losses against the loop-based NumPy reference and hand-worked cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from tests import numpy_reference as ref

RTOL, ATOL = 2e-5, 2e-6


def _rng(seed=0):
  return np.random.default_rng(seed)


def _f32(x):
  return jnp.asarray(x, jnp.float32)


# --------------------------------------------------------------------- FCCM (Eq. 1-2)


@pytest.mark.parametrize("unbiased_std", [True, False])
@pytest.mark.parametrize("batch,classes", [(2, 3), (16, 10), (64, 7)])
def test_cross_correlation_matrix_matches_reference(batch, classes, unbiased_std):
  rng = _rng(batch)
  z, t = rng.normal(size=(batch, classes)) * 3, rng.normal(size=(batch, classes))
  got = losses.cross_correlation_matrix(logits=_f32(z), target_logits=_f32(t),
                                        unbiased_std=unbiased_std)
  want = ref.ref_cross_correlation_matrix(z, t, unbiased_std=unbiased_std)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("unbiased_std", [True, False])
@pytest.mark.parametrize("weight", [0.0051, 0.5])
def test_cross_correlation_loss_matches_reference(unbiased_std, weight):
  rng = _rng(1)
  z, t = rng.normal(size=(32, 10)), rng.normal(size=(32, 10)) * 5 + 2
  got = losses.cross_correlation_loss(logits=_f32(z), target_logits=_f32(t),
                                      off_diagonal_weight=weight, unbiased_std=unbiased_std)
  want = ref.ref_cross_correlation_loss(z, t, off_diagonal_weight=weight,
                                        unbiased_std=unbiased_std)
  np.testing.assert_allclose(got, want, rtol=RTOL)


def test_cross_correlation_hand_worked_2x2():
  # Columns of [[1, 0], [0, 1]] standardise (population std) to [1, -1] and
  # [-1, 1]; against the swapped target every correlation flips sign:
  # M = [[-1, 1], [1, -1]] -> loss = 2 * (1 - (-1))^2 + lambda * 2 * (1 + 1)^2.
  z = _f32([[1.0, 0.0], [0.0, 1.0]])
  swapped = _f32([[0.0, 1.0], [1.0, 0.0]])
  m = losses.cross_correlation_matrix(logits=z, target_logits=swapped, unbiased_std=False, eps=0.0)
  np.testing.assert_allclose(m, [[-1.0, 1.0], [1.0, -1.0]], atol=1e-6)
  loss = losses.cross_correlation_loss(logits=z, target_logits=swapped, unbiased_std=False, eps=0.0)
  np.testing.assert_allclose(loss, 8.0 + 0.0051 * 8.0, rtol=1e-6)
  # Against itself: M = [[1, -1], [-1, 1]], which is the FCCM optimum: loss 0.
  assert float(losses.cross_correlation_loss(logits=z, target_logits=z, unbiased_std=False,
                                             eps=0.0)) == pytest.approx(0.0, abs=1e-6)
  # The code's unbiased std then /B gives (B-1)/B = 1/2 times Eq. 1:
  # M = 0.5 * [[-1, 1], [1, -1]] -> 2 * 1.5^2 + lambda * 2 * 1.5^2.
  loss_code = losses.cross_correlation_loss(logits=z, target_logits=swapped, eps=0.0)
  np.testing.assert_allclose(loss_code, 4.5 + 0.0051 * 4.5, rtol=1e-6)


def test_fccm_identical_standardised_inputs_have_zero_diagonal_term():
  rng = _rng(2)
  z = rng.normal(size=(20, 6))
  z = (z - z.mean(0)) / z.std(0)
  weight = 0.0051
  m = np.asarray(losses.cross_correlation_matrix(logits=_f32(z), target_logits=_f32(z),
                                                 unbiased_std=False, eps=0.0))
  np.testing.assert_allclose(np.diagonal(m), 1.0, atol=1e-6)
  off = sum((1 + m[u, v])**2 for u in range(6) for v in range(6) if u != v)
  loss = losses.cross_correlation_loss(logits=_f32(z), target_logits=_f32(z),
                                       off_diagonal_weight=weight, unbiased_std=False, eps=0.0)
  np.testing.assert_allclose(loss, weight * off, rtol=1e-5)
  # The code's convention (unbiased std, /B) leaves exactly (1/B)^2 per class.
  m_code = losses.cross_correlation_matrix(logits=_f32(z), target_logits=_f32(z), eps=0.0)
  np.testing.assert_allclose(np.diagonal(m_code), 19.0 / 20.0, atol=1e-6)


def test_cross_correlation_batch_of_one_raises():
  with pytest.raises(ValueError, match=r"cross_correlation_loss: `logits` needs a batch of at "
                                       r"least 2 examples.*got batch size 1"):
    losses.cross_correlation_loss(logits=jnp.ones((1, 10)), target_logits=jnp.ones((1, 10)))


def test_cross_correlation_constant_column_is_finite():
  rng = _rng(3)
  z = rng.normal(size=(16, 5)).astype(np.float32)
  z[:, 2] = 7.0  # constant column: zero batch variance
  value, grad = jax.value_and_grad(
      lambda x: losses.cross_correlation_loss(logits=x, target_logits=_f32(z)))(_f32(z))
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  # The constant column standardises to 0, so its diagonal entry is 0.
  m = losses.cross_correlation_matrix(logits=_f32(z), target_logits=_f32(z))
  assert float(m[2, 2]) == pytest.approx(0.0, abs=1e-6)


def test_cross_correlation_gradient_matches_finite_differences():
  rng = _rng(4)
  z, t = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
  grad = jax.grad(lambda x: losses.cross_correlation_loss(logits=x, target_logits=_f32(t),
                                                          off_diagonal_weight=0.3))(_f32(z))
  numeric = np.zeros_like(z)
  h = 1e-6
  for idx in np.ndindex(z.shape):
    plus, minus = z.copy(), z.copy()
    plus[idx] += h
    minus[idx] -= h
    numeric[idx] = (ref.ref_cross_correlation_loss(plus, t, off_diagonal_weight=0.3)
                    - ref.ref_cross_correlation_loss(minus, t, off_diagonal_weight=0.3)) / (2 * h)
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-4)


def test_cross_correlation_target_is_constant():
  rng = _rng(5)
  z, t = _f32(rng.normal(size=(8, 4))), _f32(rng.normal(size=(8, 4)))
  grad_target = jax.grad(lambda y: losses.cross_correlation_loss(logits=z, target_logits=y))(t)
  np.testing.assert_array_equal(grad_target, 0.0)


# --------------------------------------------------------------------- FISL (Eq. 3-5)


@pytest.mark.parametrize("batch,dim", [(2, 4), (9, 16), (32, 64)])
def test_instance_similarity_matrix_matches_reference(batch, dim):
  h = _rng(batch).normal(size=(batch, dim))
  got = losses.instance_similarity_matrix(features=_f32(h), temperature=0.02)
  assert got.shape == (batch, batch - 1)
  np.testing.assert_allclose(got, ref.ref_instance_similarity_matrix(h, temperature=0.02),
                             rtol=1e-5, atol=2e-4)  # entries are cosines / 0.02, up to 50


def test_instance_similarity_matrix_hand_worked():
  # Normalised rows [1,0], [0,1], [1,1]/sqrt2: cosines 0, 1/sqrt2, 1/sqrt2.
  got = losses.instance_similarity_matrix(features=_f32([[1, 0], [0, 1], [1, 1]]),
                                          temperature=0.5, eps=0.0)
  r = math.sqrt(2.0)
  np.testing.assert_allclose(got, [[0.0, r], [0.0, r], [r, r]], rtol=1e-6, atol=1e-6)


def test_instance_similarity_loss_matches_reference():
  rng = _rng(6)
  s, t = rng.normal(size=(12, 11)) * 10, rng.normal(size=(12, 11)) * 10
  got = losses.instance_similarity_loss(similarity=_f32(s), target_similarity=_f32(t))
  np.testing.assert_allclose(got, ref.ref_instance_similarity_loss(s, t), rtol=RTOL)


def test_instance_similarity_loss_hand_worked():
  # softmax([0, ln 3]) = [1/4, 3/4] against softmax([0, 0]) = [1/2, 1/2].
  target = _f32([[0.0, math.log(3.0)]] * 3)
  loss = losses.instance_similarity_loss(similarity=jnp.zeros((3, 2)), target_similarity=target)
  expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_instance_similarity_identical_examples_have_finite_gradient():
  features = jnp.ones((8, 5)) * 3.0

  def fisl(h):
    s = losses.instance_similarity_matrix(features=h)
    return losses.instance_similarity_loss(similarity=s, target_similarity=jnp.zeros_like(s))

  value, grad = jax.value_and_grad(fisl)(features)
  assert float(value) == pytest.approx(0.0, abs=1e-6)  # uniform rows on both sides
  assert np.all(np.isfinite(grad))
  # All-zero features (e.g. a dead ReLU layer) stay finite as well.
  assert np.all(np.isfinite(jax.grad(fisl)(jnp.zeros((8, 5)))))


def test_instance_similarity_gradient_matches_finite_differences():
  rng = _rng(7)
  h, t = rng.normal(size=(5, 3)), rng.normal(size=(5, 4))

  def fisl(x):
    s = losses.instance_similarity_matrix(features=x, temperature=0.5)
    return losses.instance_similarity_loss(similarity=s, target_similarity=_f32(t))

  def fisl_ref(x):
    return ref.ref_instance_similarity_loss(ref.ref_instance_similarity_matrix(x, temperature=0.5), t)

  grad = jax.grad(fisl)(_f32(h))
  numeric = np.zeros_like(h)
  for idx in np.ndindex(h.shape):
    plus, minus = h.copy(), h.copy()
    plus[idx] += 1e-6
    minus[idx] -= 1e-6
    numeric[idx] = (fisl_ref(plus) - fisl_ref(minus)) / 2e-6
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-4)


# --------------------------------------------------------------------- KD, FNTD, dual


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_knowledge_distillation_matches_reference(temperature):
  rng = _rng(8)
  s, t = rng.normal(size=(10, 7)) * 4, rng.normal(size=(10, 7)) * 4
  got = losses.knowledge_distillation_loss(student_logits=_f32(s), teacher_logits=_f32(t),
                                           temperature=temperature)
  np.testing.assert_allclose(got, ref.ref_kd_loss(s, t, temperature=temperature), rtol=RTOL)


def test_knowledge_distillation_hand_worked():
  loss = losses.knowledge_distillation_loss(student_logits=jnp.zeros((1, 2)),
                                            teacher_logits=_f32([[math.log(3.0), 0.0]]))
  np.testing.assert_allclose(loss, 0.75 * math.log(1.5) + 0.25 * math.log(0.5), rtol=1e-6)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_non_target_distillation_matches_reference(temperature, renormalize):
  rng = _rng(9)
  s, t = rng.normal(size=(16, 10)) * 3, rng.normal(size=(16, 10)) * 3
  y = rng.integers(0, 10, size=16)
  got = losses.non_target_distillation_loss(student_logits=_f32(s), teacher_logits=_f32(t),
                                            labels=jnp.asarray(y), temperature=temperature,
                                            renormalize=renormalize)
  want = ref.ref_non_target_distillation_loss(s, t, y, temperature=temperature,
                                              renormalize=renormalize)
  np.testing.assert_allclose(got, want, rtol=RTOL)


def test_non_target_distillation_hand_worked():
  # Teacher uniform (1/3 each), student softmax([ln 2, 0, 0]) = [1/2, 1/4, 1/4],
  # target class 0: sum over classes 1, 2 of (1/3) ln((1/3)/(1/4)).
  student, teacher = _f32([[math.log(2.0), 0.0, 0.0]]), jnp.zeros((1, 3))
  labels = jnp.array([0])
  loss = losses.non_target_distillation_loss(student_logits=student, teacher_logits=teacher,
                                             labels=labels)
  np.testing.assert_allclose(loss, (2.0 / 3.0) * math.log(4.0 / 3.0), rtol=1e-6)
  # Renormalised over the non-target classes both sides are [1/2, 1/2]: zero.
  renorm = losses.non_target_distillation_loss(student_logits=student, teacher_logits=teacher,
                                               labels=labels, renormalize=True)
  assert float(renorm) == pytest.approx(0.0, abs=1e-7)
  # x T^2: at T = 2 the same logits give T^2 times the tempered KL.
  p_t, p_s = np.full(3, 1 / 3), np.exp([math.log(2) / 2, 0, 0])
  p_s = p_s / p_s.sum()
  want = 4.0 * sum(p_t[u] * math.log(p_t[u] / p_s[u]) for u in (1, 2))
  got = losses.non_target_distillation_loss(student_logits=student, teacher_logits=teacher,
                                            labels=labels, temperature=2.0)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_fntd_equals_kl_on_the_one_class_removed_view():
  rng = _rng(10)
  s, t = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  y = rng.integers(0, 5, size=6)
  temperature = 3.0
  p_t = np.exp(t / temperature) / np.exp(t / temperature).sum(-1, keepdims=True)
  p_s = np.exp(s / temperature) / np.exp(s / temperature).sum(-1, keepdims=True)
  direct = np.mean([np.sum(np.delete(p_t[b], y[b]) * np.log(np.delete(p_t[b], y[b])
                                                            / np.delete(p_s[b], y[b])))
                    for b in range(6)])
  got = losses.non_target_distillation_loss(student_logits=_f32(s), teacher_logits=_f32(t),
                                            labels=jnp.asarray(y), temperature=temperature)
  np.testing.assert_allclose(got, temperature**2 * direct, rtol=1e-5)


def test_fntd_ignores_the_target_logit_and_teacher_gets_no_gradient():
  rng = _rng(11)
  s, t = _f32(rng.normal(size=(4, 6))), _f32(rng.normal(size=(4, 6)))
  y = jnp.array([0, 1, 2, 3])
  def loss(student, teacher):
    return losses.non_target_distillation_loss(student_logits=student, teacher_logits=teacher,
                                               labels=y, temperature=3.0, renormalize=True)
  grad_s, grad_t = jax.grad(loss, argnums=(0, 1))(s, t)
  # With renormalisation the target logit does not enter the loss at all.
  np.testing.assert_allclose(grad_s[jnp.arange(4), y], 0.0, atol=1e-7)
  np.testing.assert_array_equal(grad_t, 0.0)


@pytest.mark.parametrize("scale", [1.0, 12.0])  # 12: a confident, near-saturated student
def test_fntd_written_form_pushes_the_target_logit_down(scale):
  # Without renormalisation, d(tau^2 sum_{u!=t} p_T^u log(p_T^u/p_S^u))/dz_S^t
  # = tau (1 - p_T^t) p_S^t per row (p at temperature tau), divided by B for the batch mean.
  rng = _rng(13)
  s, t = rng.normal(size=(4, 6)) * scale, rng.normal(size=(4, 6))
  y = np.array([0, 1, 2, 3])
  tau = 3.0
  grad = jax.grad(lambda z: losses.non_target_distillation_loss(
      student_logits=z, teacher_logits=_f32(t), labels=jnp.asarray(y), temperature=tau))(_f32(s))
  p_s = np.exp(s / tau) / np.exp(s / tau).sum(-1, keepdims=True)
  p_t = np.exp(t / tau) / np.exp(t / tau).sum(-1, keepdims=True)
  rows = np.arange(4)
  want = tau * (1 - p_t[rows, y]) * p_s[rows, y] / 4
  np.testing.assert_allclose(np.asarray(grad)[rows, y], want, rtol=1e-5, atol=1e-8)
  assert np.all(want > 0)


def test_dual_domain_distillation_matches_reference():
  rng = _rng(12)
  z, prev, pre = (rng.normal(size=(8, 10)) * 2 for _ in range(3))
  got = losses.dual_domain_distillation_loss(logits=_f32(z), previous_logits=_f32(prev),
                                             pretrained_logits=_f32(pre))
  np.testing.assert_allclose(got, ref.ref_dual_domain_distillation_loss(z, prev, pre), rtol=RTOL)
  # Hand: both teachers softmax([ln 3, 0]) vs uniform student -> 2 * KL.
  teacher = _f32([[math.log(3.0), 0.0]])
  dual = losses.dual_domain_distillation_loss(logits=jnp.zeros((1, 2)), previous_logits=teacher,
                                              pretrained_logits=teacher)
  np.testing.assert_allclose(dual, 2 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5)), rtol=1e-6)


def test_softmax_cross_entropy_matches_reference_and_hand_case():
  rng = _rng(13)
  z, y = rng.normal(size=(9, 4)) * 5, rng.integers(0, 4, size=9)
  got = losses.softmax_cross_entropy(logits=_f32(z), labels=jnp.asarray(y))
  np.testing.assert_allclose(got, ref.ref_softmax_cross_entropy(z, y), rtol=RTOL)
  hand = losses.softmax_cross_entropy(logits=jnp.zeros((1, 2)), labels=jnp.array([0]))
  np.testing.assert_allclose(hand, math.log(2.0), rtol=1e-6)

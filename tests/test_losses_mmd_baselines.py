"""FedMMD and baseline losses against the loop-based NumPy reference and hand cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from tests import numpy_reference as ref

RTOL = 2e-5


def _f32(x):
  return jnp.asarray(x, jnp.float32)


# --------------------------------------------------------------------- FedMMD


def test_mmd_bandwidths_are_the_nineteen_of_the_reference_notes():
  assert losses.MMD_BANDWIDTHS == (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 5, 10, 15, 20, 25, 30,
                                   35, 100, 1e3, 1e4, 1e5, 1e6)


def test_gaussian_kernel_matches_reference():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
  got = losses.gaussian_kernel_matrix(x=_f32(x), y=_f32(y))
  np.testing.assert_allclose(got, ref.ref_gaussian_kernel_matrix(x, y, bandwidths=losses.MMD_BANDWIDTHS),
                             rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("shift", [0.0, 0.3, 2.0])
def test_mmd_matches_reference(shift):
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(16, 10)), rng.normal(size=(12, 10)) + shift
  got = losses.multi_kernel_mmd_squared(x=_f32(x), y=_f32(y))
  np.testing.assert_allclose(got, ref.ref_mk_mmd_squared(x, y), rtol=1e-4, atol=1e-5)


def test_mmd_hand_worked():
  # One point each, one bandwidth 1/2: K(x,x) = K(y,y) = 1, K(x,y) = exp(-1) -> 2 - 2/e.
  got = losses.multi_kernel_mmd_squared(x=_f32([[0.0]]), y=_f32([[1.0]]), bandwidths=(0.5,))
  np.testing.assert_allclose(got, 2.0 - 2.0 / math.e, rtol=1e-6)


def test_mmd_of_a_sample_with_itself_is_zero_and_grows_with_a_mean_shift():
  x = _f32(np.random.default_rng(2).normal(size=(32, 10)))
  assert float(losses.multi_kernel_mmd_squared(x=x, y=x)) == pytest.approx(0.0, abs=1e-5)
  values = [float(losses.multi_kernel_mmd_squared(x=x, y=x + s)) for s in (0.0, 0.1, 0.5, 1.0, 3.0)]
  assert all(b > a for a, b in zip(values, values[1:])), values


def test_mmd_gradient_is_finite_for_large_and_identical_inputs():
  x = _f32(np.random.default_rng(3).normal(size=(8, 10)) * 1e4)
  for y in (x, x + 1.0, -x):
    grad = jax.grad(lambda v: losses.multi_kernel_mmd_squared(x=x, y=v))(y)
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("reduction", ["tf_l2_loss", "batch_mean"])
def test_two_stream_l2_matches_reference(reduction):
  rng = np.random.default_rng(4)
  a, b = rng.normal(size=(6, 10)), rng.normal(size=(6, 10))
  got = losses.two_stream_l2_loss(local_outputs=_f32(a), global_outputs=_f32(b),
                                  reduction=reduction)
  np.testing.assert_allclose(got, ref.ref_two_stream_l2_loss(a, b, reduction), rtol=RTOL)


def test_two_stream_l2_reductions_hand_worked():
  # differences [[1, 2], [0, 0], [3, 0]]: squared sum 14, per-row sums (5, 0, 9).
  local, zeros = _f32([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]), jnp.zeros((3, 2))
  # tf.nn.l2_loss: half the sum of every squared element, batch included.
  assert float(losses.two_stream_l2_loss(local_outputs=local, global_outputs=zeros)) == 7.0
  assert float(losses.two_stream_l2_loss(local_outputs=local, global_outputs=zeros,
                                         reduction="batch_mean")) == pytest.approx(14.0 / 3)
  mask = jnp.asarray([True, True, False])  # the padded row is dropped by both reductions
  assert float(losses.two_stream_l2_loss(local_outputs=local, global_outputs=zeros,
                                         mask=mask)) == 2.5
  assert float(losses.two_stream_l2_loss(local_outputs=local, global_outputs=zeros,
                                         reduction="batch_mean", mask=mask)) == 2.5
  grad = jax.grad(lambda z: losses.two_stream_l2_loss(local_outputs=z, global_outputs=zeros))(local)
  np.testing.assert_array_equal(grad, local)  # d/dz 0.5 z^2 = z: lambda transfers as in TF
  with pytest.raises(ValueError, match="reduction` must be one of"):
    losses.two_stream_l2_loss(local_outputs=local, global_outputs=zeros, reduction="sum")


def test_mmd_floor_of_the_authors_code():
  x = _f32(np.random.default_rng(3).normal(size=(5, 4)))
  # Identical streams: 0 with the paper's clip, the code's 1e-4 floor (and no gradient) with it.
  assert float(losses.multi_kernel_mmd_squared(x=x, y=x)) == pytest.approx(0.0, abs=1e-5)
  floored = losses.multi_kernel_mmd_squared(x=x, y=x, floor=losses.MMD_CODE_FLOOR)
  assert float(floored) == pytest.approx(1e-4)
  # Close streams (one wide kernel): MMD^2 in (0, 1e-4) has a gradient unfloored, none floored.
  close = x.at[0].add(0.05)
  mmd = lambda v, floor: losses.multi_kernel_mmd_squared(x=x, y=v, bandwidths=(10.0,),
                                                         floor=floor)
  assert 0.0 < float(mmd(close, 0.0)) < 1e-4
  assert float(jnp.max(jnp.abs(jax.grad(mmd)(close, 0.0)))) > 0.0
  np.testing.assert_array_equal(jax.grad(mmd)(close, 1e-4), np.zeros((5, 4)))
  far = losses.multi_kernel_mmd_squared(x=x, y=x + 3.0, floor=1e-4)
  assert float(far) == pytest.approx(float(losses.multi_kernel_mmd_squared(x=x, y=x + 3.0)))
  with pytest.raises(ValueError, match="floor"):
    losses.multi_kernel_mmd_squared(x=x, y=x, floor=-1.0)


# --------------------------------------------------------------------- FedProx


def test_proximal_term_matches_reference_and_hand_case():
  rng = np.random.default_rng(5)
  p = [rng.normal(size=(3, 3)), rng.normal(size=(3,))]
  g = [rng.normal(size=(3, 3)), rng.normal(size=(3,))]
  got = losses.proximal_term(params={"k": _f32(p[0]), "b": _f32(p[1])},
                             global_params={"k": _f32(g[0]), "b": _f32(g[1])}, mu=0.01)
  np.testing.assert_allclose(got, ref.ref_proximal_term(p, g, mu=0.01), rtol=RTOL)
  hand = losses.proximal_term(params={"w": _f32([1.0, 2.0])}, global_params={"w": jnp.zeros(2)},
                              mu=0.1)
  assert float(hand) == pytest.approx(0.25)


def test_proximal_term_with_zero_mu_is_zero_and_pulls_towards_global():
  params, anchor = {"w": _f32([1.0, -2.0])}, {"w": _f32([0.5, 0.5])}
  assert float(losses.proximal_term(params=params, global_params=anchor, mu=0.0)) == 0.0
  grad = jax.grad(lambda p: losses.proximal_term(params=p, global_params=anchor, mu=0.2))(params)
  np.testing.assert_allclose(grad["w"], 0.2 * np.array([0.5, -2.5]), rtol=1e-6)


# --------------------------------------------------------------------- MOON


@pytest.mark.parametrize("num_previous", [1, 3])
def test_model_contrastive_matches_reference(num_previous):
  rng = np.random.default_rng(6)
  f, g = rng.normal(size=(8, 16)), rng.normal(size=(8, 16))
  prev = rng.normal(size=(num_previous, 8, 16))
  previous = _f32(prev[0]) if num_previous == 1 else _f32(prev)
  got = losses.model_contrastive_loss(features=_f32(f), global_features=_f32(g),
                                      previous_features=previous, temperature=0.5)
  np.testing.assert_allclose(got, ref.ref_model_contrastive_loss(f, g, prev, temperature=0.5),
                             rtol=RTOL)


def test_model_contrastive_hand_worked():
  # cos to global 1, cos to previous 0, tau 1/2: -log(e^2 / (e^2 + 1)) = log(1 + e^-2).
  got = losses.model_contrastive_loss(features=_f32([[1.0, 0.0]]), global_features=_f32([[2.0, 0.0]]),
                                      previous_features=_f32([[0.0, 3.0]]))
  np.testing.assert_allclose(got, math.log1p(math.exp(-2.0)), rtol=1e-6)


# --------------------------------------------------------------------- FedRS


def test_restricted_softmax_logits_matches_reference():
  rng = np.random.default_rng(7)
  z = rng.normal(size=(4, 6))
  mask = np.array([True, False, True, True, False, False])
  got = losses.restricted_softmax_logits(logits=_f32(z), class_mask=jnp.asarray(mask), alpha=0.5)
  np.testing.assert_allclose(got, ref.ref_restricted_softmax_logits(z, mask, alpha=0.5), rtol=1e-6)
  # alpha = 1 is plain softmax.
  np.testing.assert_array_equal(
      losses.restricted_softmax_logits(logits=_f32(z), class_mask=jnp.asarray(mask), alpha=1.0),
      _f32(z))


# --------------------------------------------------------------------- FedProc


def test_prototype_contrastive_matches_reference():
  rng = np.random.default_rng(8)
  f, protos = rng.normal(size=(10, 12)), rng.normal(size=(5, 12))
  mask = np.array([True, True, False, True, True])
  y = rng.integers(0, 5, size=10)
  for temperature in (1.0, 0.5):
    got = losses.prototype_contrastive_loss(features=_f32(f), labels=jnp.asarray(y),
                                            prototypes=_f32(protos),
                                            prototype_mask=jnp.asarray(mask),
                                            temperature=temperature)
    want = ref.ref_prototype_contrastive_loss(f, y, protos, mask, temperature=temperature)
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_prototype_contrastive_hand_worked_and_objective():
  # Sample 0: cos to prototype 0 is 1, to prototype 1 is 0 (prototype 2 masked):
  # -log(e / (e + 1)). Sample 1's class has no prototype: contributes 0; B = 2.
  features, labels = _f32([[1.0, 0.0], [0.0, 1.0]]), jnp.array([0, 2])
  protos, mask = _f32([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]), jnp.array([True, True, False])
  infonce = math.log1p(math.exp(-1.0)) / 2
  got = losses.prototype_contrastive_loss(features=features, labels=labels, prototypes=protos,
                                          prototype_mask=mask)
  np.testing.assert_allclose(got, infonce, rtol=1e-6)
  logits = jnp.zeros((2, 3))
  objective = losses.prototype_contrastive_objective(logits=logits, features=features,
                                                     labels=labels, prototypes=protos,
                                                     prototype_mask=mask, alpha=0.25)
  np.testing.assert_allclose(objective, 0.25 * infonce + 0.75 * math.log(3.0), rtol=1e-6)


def test_prototype_contrastive_without_any_prototype_is_zero_with_finite_gradient():
  f = _f32(np.random.default_rng(9).normal(size=(4, 3)))
  value, grad = jax.value_and_grad(lambda x: losses.prototype_contrastive_loss(
      features=x, labels=jnp.array([0, 1, 0, 1]), prototypes=jnp.zeros((2, 3)),
      prototype_mask=jnp.array([False, False])))(f)
  assert float(value) == 0.0 and np.all(np.isfinite(grad))


# --------------------------------------------------------------------- RHFL, FedMD, FedDF


def test_symmetric_cross_entropy_matches_reference_and_hand_case():
  rng = np.random.default_rng(10)
  z, y = rng.normal(size=(9, 10)) * 3, rng.integers(0, 10, size=9)
  got = losses.symmetric_cross_entropy(logits=_f32(z), labels=jnp.asarray(y))
  np.testing.assert_allclose(got, ref.ref_symmetric_cross_entropy(z, y), rtol=RTOL)
  # Uniform over 2 classes: CE = ln 2, RCE = -(1/2) ln(1e-4).
  hand = losses.symmetric_cross_entropy(logits=jnp.zeros((1, 2)), labels=jnp.array([0]))
  np.testing.assert_allclose(hand, 0.1 * math.log(2.0) - 0.5 * math.log(1e-4), rtol=1e-6)


def test_consensus_l1_matches_reference_and_hand_case():
  rng = np.random.default_rng(11)
  z, c = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
  np.testing.assert_allclose(losses.consensus_l1_loss(logits=_f32(z), consensus_logits=_f32(c)),
                             ref.ref_consensus_l1_loss(z, c), rtol=RTOL)
  hand = losses.consensus_l1_loss(logits=_f32([[1.0, -3.0]]), consensus_logits=jnp.zeros((1, 2)))
  assert float(hand) == pytest.approx(2.0)


def test_ensemble_distillation_matches_reference_and_hand_case():
  rng = np.random.default_rng(12)
  s, clients = rng.normal(size=(6, 10)), rng.normal(size=(4, 6, 10)) * 2
  got = losses.ensemble_distillation_loss(student_logits=_f32(s), client_logits=_f32(clients),
                                          temperature=2.0)
  np.testing.assert_allclose(got, ref.ref_ensemble_distillation_loss(s, clients, temperature=2.0),
                             rtol=RTOL)
  # Mean of [2 ln 3, 0] and [0, 0] is [ln 3, 0]: softmax [3/4, 1/4] vs uniform student.
  hand = losses.ensemble_distillation_loss(
      student_logits=jnp.zeros((1, 2)),
      client_logits=_f32([[[2 * math.log(3.0), 0.0]], [[0.0, 0.0]]]))
  np.testing.assert_allclose(hand, 0.75 * math.log(1.5) + 0.25 * math.log(0.5), rtol=1e-6)

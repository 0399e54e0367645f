"""GeoDL + iCaRL + FL (fedjax_het.algorithms.geodl_icarl_fl) and GeoDL's loss (losses.geodesic)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import geodl_icarl_fl
from fedjax_het.cil import masking
from fedjax_het.config import load_module, validate_config
from fedjax_het.errors import ConfigError
from fedjax_het.losses import geodesic
from fedjax_het.losses import glfc as glfc_losses
from tests.test_cil_train import (tiny_cil_config, tiny_settings, tiny_stream,
                                  train_tiny_and_check_table1)
from tests.tiny_models import TinyMLP
from tests.tiny_runs import evaluate_seen, rounds_across_a_task_change, tiny_replay

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "fedjax_het" / "configs" / "cifar100.py"

# ----------------------------------------------------------------------------- NumPy references


def _normalize(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _orthonormal(rng, dim, k):
  return np.linalg.qr(rng.standard_normal((dim, k)))[0]


def _geodesic_integral(ps, pt, x, y, steps=2001):
  """int_0^1 (Phi(t)^T x_i) . (Phi(t)^T y_i) dt per row, by the trapezoid rule (float64).

  Phi(t) = P_s U_1 cos(t Theta) - R_s U_2 sin(t Theta) is the geodesic of Gong et al.
  (2012) built from the full orthogonal complement R_s of span(P_s) and the CS
  decomposition P_s^T P_t = U_1 cos(Theta) V^T, R_s^T P_t = -U_2 sin(Theta) V^T.
  """
  dim, d = ps.shape
  rs = np.linalg.svd(ps, full_matrices=True)[0][:, d:]
  u1, cosines, vt = np.linalg.svd(ps.T @ pt)
  theta = np.arccos(np.clip(cosines, -1.0, 1.0))
  b = rs.T @ pt @ vt.T
  u2 = np.zeros((dim - d, d))
  moving = np.sin(theta) > 1e-9          # a zero angle has no sine term to carry
  u2[:, moving] = -b[:, moving] / np.sin(theta[moving])
  # The endpoint: Phi(1) = P_t V (the geodesic reaches the target subspace).
  np.testing.assert_allclose(ps @ u1 * np.cos(theta) - rs @ u2 * np.sin(theta), pt @ vt.T,
                             atol=1e-9)
  ts = np.linspace(0.0, 1.0, steps)[:, None]
  x_s, x_r, y_s, y_r = x @ ps @ u1, x @ rs @ u2, y @ ps @ u1, y @ rs @ u2   # (B, d) each
  # Phi(t)^T x = cos(t Theta) U_1^T P_s^T x - sin(t Theta) U_2^T R_s^T x, for every t at once.
  cos, sin = np.cos(ts * theta)[:, None, :], np.sin(ts * theta)[:, None, :]   # (T, 1, d)
  values = np.sum((cos * x_s - sin * x_r) * (cos * y_s - sin * y_r), axis=-1)  # (T, B)
  return np.trapezoid(values, ts[:, 0], axis=0)


def _geodl_loss(features, old_features, d, valid):
  """GeoDL's loss in float64: bases by NumPy's SVD, similarities by numerical integration."""
  new = _normalize(np.asarray(features, np.float64))
  old = _normalize(np.asarray(old_features, np.float64))
  w = np.asarray(valid, np.float64)[:, None]
  ps = np.linalg.svd((old * w).T, full_matrices=False)[0][:, :d]
  pt = np.linalg.svd((new * w).T, full_matrices=False)[0][:, :d]
  xy = _geodesic_integral(ps, pt, old, new)
  xx = _geodesic_integral(ps, pt, old, old)
  yy = _geodesic_integral(ps, pt, new, new)
  rows = 1.0 - xy / np.sqrt(xx * yy)
  return float(np.sum(rows * w[:, 0]) / np.sum(w))


# ----------------------------------------------------------------------------- the loss

_kernel = jax.jit(lambda a, b: geodesic.geodesic_flow_kernel(source_basis=a, target_basis=b))
_angles = jax.jit(lambda a, b: geodesic.principal_angles(source_basis=a, target_basis=b))
_loss = jax.jit(lambda new, old, mask, d: geodesic.geodesic_distillation_loss(
    features=new, old_features=old, subspace_dim=d, mask=mask), static_argnums=3)
_loss_and_grad = jax.jit(jax.value_and_grad(lambda new, old, mask: geodesic.
                                            geodesic_distillation_loss(
                                                features=new, old_features=old, subspace_dim=3,
                                                mask=mask)))


@pytest.mark.parametrize("dim,d", [(6, 3), (5, 3)])
def test_flow_kernel_matches_numerical_integration_of_the_projected_features(dim, d):
  rng = np.random.default_rng(dim * 10 + d)
  ps, pt = _orthonormal(rng, dim, d), _orthonormal(rng, dim, d)
  if d > dim - d:   # the subspaces must share 2d - D directions: one angle is 0
    pt = np.linalg.qr(np.concatenate([ps[:, :1], pt[:, 1:]], axis=1))[0]
  x, y = rng.standard_normal((4, dim)), rng.standard_normal((4, dim))
  kernel = np.asarray(_kernel(jnp.asarray(ps, jnp.float32), jnp.asarray(pt, jnp.float32)))
  expect = _geodesic_integral(ps, pt, x, y)
  np.testing.assert_allclose(np.sum((x @ kernel) * y, axis=-1), expect, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(kernel, kernel.T, atol=1e-6)
  reverse = np.asarray(_kernel(jnp.asarray(pt, jnp.float32), jnp.asarray(ps, jnp.float32)))
  np.testing.assert_allclose(reverse, kernel, atol=1e-5)   # the geodesic run backwards
  theta = np.asarray(_angles(jnp.asarray(ps, jnp.float32), jnp.asarray(pt, jnp.float32)))
  cosines = np.linalg.svd(ps.T @ pt, compute_uv=False)
  np.testing.assert_allclose(np.cos(theta), cosines, atol=1e-5)


def test_flow_kernel_of_coinciding_or_nearly_coinciding_subspaces_is_the_projection():
  rng = np.random.default_rng(3)
  p = _orthonormal(rng, 6, 3)
  rotation = _orthonormal(rng, 3, 3)
  for target in (p, p @ rotation):   # the same subspace, another basis of it
    kernel = _kernel(jnp.asarray(p, jnp.float32), jnp.asarray(target, jnp.float32))
    np.testing.assert_allclose(np.asarray(kernel), p @ p.T, atol=1e-5)
  # Angles of 1e-4 (float32 cosines round to 1; arccos would see none) and of 0.03 (the
  # small-angle series of L3): still the integral.
  for angle in (1e-4, 0.03):
    tilt = _orthonormal(rng, 6, 6)[:, :1]
    tilt -= p @ (p.T @ tilt)
    tilt /= np.linalg.norm(tilt)
    q = p.copy()
    q[:, 0] = np.cos(angle) * p[:, 0] + np.sin(angle) * tilt[:, 0]
    theta = _angles(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
    np.testing.assert_allclose(np.max(np.asarray(theta)), angle, rtol=2e-2)
    kernel = np.asarray(_kernel(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)))
    x = rng.standard_normal((3, 6))
    np.testing.assert_allclose(np.sum((x @ kernel) * x, -1), _geodesic_integral(p, q, x, x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_loss_matches_numpy_with_a_padded_row(scale):
  rng = np.random.default_rng(0)
  old = (rng.standard_normal((6, 5)) * scale).astype(np.float32)
  new = (old + rng.standard_normal((6, 5)) * scale * 0.7).astype(np.float32)
  valid = np.asarray([1, 1, 1, 1, 1, 0], bool)
  new_padded = new.copy()
  new_padded[5] = 1e3 * scale   # the padded row counts nowhere (not in the subspaces either)
  loss = _loss(jnp.asarray(new_padded), jnp.asarray(old), jnp.asarray(valid), 3)
  expect = _geodl_loss(new, old, 3, valid)
  assert 0.01 < expect < 2.0
  np.testing.assert_allclose(float(loss), expect, rtol=1e-4, atol=1e-5)


def test_identical_features_give_zero_loss():
  rng = np.random.default_rng(1)
  for scale in (1e-3, 1.0, 1e4):
    x = jnp.asarray(rng.standard_normal((6, 5)) * scale, jnp.float32)
    loss = _loss(x, x, jnp.ones((6,), bool), 3)
    assert abs(float(loss)) < 1e-5


def _degenerate_cases():
  rng = np.random.default_rng(2)
  eye = np.eye(6, 5, dtype=np.float32) * 3.0        # five equal singular values, a zero row
  noisy = eye + 1e-7 * rng.standard_normal(eye.shape).astype(np.float32)  # nearly equal
  x = rng.standard_normal((6, 5)).astype(np.float32)
  every = np.ones((6,), bool)
  return {
      "coinciding": (x, x, every),
      "equal_singular_values_same_subspace": (eye[[1, 2, 3, 4, 0, 5]], eye, every),
      "nearly_equal_singular_values": (noisy[[2, 0, 3, 1, 4, 5]], noisy, every),
      "rank_below_d": (x, x[[1, 0, 2, 3, 4, 5]], np.asarray([1, 1, 0, 0, 0, 0], bool)),
      "zero_rows": (np.zeros_like(x), x, every),
  }


@pytest.mark.parametrize("case", sorted(_degenerate_cases()))
def test_gradients_are_finite_in_degenerate_float32_cases(case):
  new, old, mask = _degenerate_cases()[case]
  value, grad = _loss_and_grad(jnp.asarray(new), jnp.asarray(old), jnp.asarray(mask))
  assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
  assert grad.dtype == jnp.float32


def test_subspace_dim_out_of_range_is_refused():
  x = jnp.ones((4, 6), jnp.float32)
  with pytest.raises(ValueError, match="subspace_dim"):
    geodesic.geodesic_distillation_loss(features=x, old_features=x, subspace_dim=5)
  with pytest.raises(ConfigError, match="config.geodl.subspace_dim"):
    geodl_icarl_fl.resolve_subspace_dim(129, 128, 512)
  assert geodl_icarl_fl.resolve_subspace_dim(0, 128, 512) == 126   # the code's batch - 2
  assert geodl_icarl_fl.resolve_subspace_dim(0, 64, 32) == 30
  assert geodl_icarl_fl.resolve_subspace_dim(10, 64, 32) == 10


def test_weight_schedule():
  weight = jax.jit(geodl_icarl_fl.distillation_weight, static_argnums=(1, 2))
  assert [float(weight(t, 5.0, True)) for t in range(4)] == pytest.approx(
      [0.0, 5.0, 5.0 * np.sqrt(2), 5.0 * np.sqrt(3)])
  assert [float(weight(t, 5.0, False)) for t in range(3)] == [0.0, 5.0, 5.0]


# ----------------------------------------------------------------------------- the method


def test_local_loss_is_icarl_plus_weighted_geodl():
  c, seen = 6, 4
  model = TinyMLP(num_classes=c)
  keys = jax.random.split(jax.random.key(0), 3)
  variables = models.init_variables(model, keys[0])
  old = models.init_variables(model, keys[1])
  images = jax.random.normal(keys[2], (6, 32, 32, 3))
  labels = jnp.asarray([2, 3, 0, 1, 3, 2], jnp.int32)
  mask = jnp.asarray([True, True, True, True, True, False])
  aux = {"class_mask": masking.seen_class_mask(seen, c), "old_model": old,
         "num_old": jnp.int32(2), "weight": jnp.float32(7.0)}
  loss_fn = geodl_icarl_fl.geodl_icarl_local_loss(model, subspace_dim=2)
  (loss, (_, parts)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      variables["params"], variables["batch_stats"], images, labels, mask, jax.random.key(1),
      aux)
  features, logits, _ = models.apply_model(model, variables, images, train=False)
  old_features, old_logits, _ = models.apply_model(model, old, images, train=False)
  icarl = glfc_losses.class_semantic_relation_distillation_loss(
      logits=logits, labels=labels, old_logits=old_logits, num_old_classes=2,
      class_mask=aux["class_mask"], mask=mask)
  geodl = _geodl_loss(np.asarray(features), np.asarray(old_features), 2, np.asarray(mask))
  np.testing.assert_allclose(float(parts["icarl"]), float(icarl), rtol=1e-5)
  np.testing.assert_allclose(float(parts["geodl"]), geodl, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(loss), float(icarl) + 7.0 * geodl, rtol=1e-4, atol=1e-5)
  body = np.asarray(grads["body"]["kernel"])
  assert np.isfinite(body).all() and np.abs(body).sum() > 0


@pytest.mark.slow  # four jitted rounds (about 8 s of CPU); the end-to-end test runs them too
def test_rounds_train_distil_and_evaluate_across_a_task_change():
  stream = tiny_stream()
  settings = tiny_settings(batch_size=16)
  model = TinyMLP(num_classes=stream.num_classes)   # features depend on the parameters
  replay = tiny_replay(stream)
  algorithm = geodl_icarl_fl.make_geodl_icarl_fl(settings, replay, model, stream.mean,
                                                 stream.std, stream.max_client_size,
                                                 eval_batch_size=16)
  state, history = rounds_across_a_task_change(algorithm, stream)
  assert [int(h["task"]) for h in history] == [0, 0, 1, 1]
  assert [float(h["geodl/weight"]) for h in history] == [0.0, 0.0, 5.0, 5.0]
  for h in history:
    assert all(np.isfinite(float(h[name])) for name in ("train/loss", "train/icarl",
                                                         "train/geodl"))
  for h in history[:2]:   # task 0: the distillation term has weight 0
    np.testing.assert_allclose(float(h["train/loss"]), float(h["train/icarl"]), rtol=1e-6)
  assert float(history[3]["train/geodl"]) > 0
  assert float(history[3]["train/loss"]) > float(history[3]["train/icarl"])
  assert sum(int(h["geodl/transitions"]) for h in history) >= 1
  assert float(history[3]["geodl/exemplars"]) > 0
  stored = np.asarray(state["clients"].memory.labels)[np.asarray(state["clients"].memory.valid)]
  assert stored.size and (stored < 2).all()   # only task 0's classes are exemplars
  assert int(history[3]["geodl/classes_with_mean"]) >= 2
  correct, total, predicted = evaluate_seen(algorithm, state, stream)
  assert int(np.sum(total)) == len(stream.test_labels)
  assert int(np.sum(predicted)) == len(stream.test_labels) and int(np.sum(correct)) >= 0


@pytest.mark.slow  # the trainer end to end (simple_cnn compiles)
def test_end_to_end_writes_table1(tmp_path):
  c = tiny_cil_config("geodl_icarl_fl")
  c.geodl.memory_size = 8
  _, results, records, _ = train_tiny_and_check_table1(c, tmp_path / "run")
  assert len(results["seen_accuracy"]) == 2
  assert all("train/geodl" in r and "geodl/exemplars" in r for r in records)
  assert [r["geodl/weight"] for r in records] == [0.0, 0.0, 5.0, 5.0]
  assert all(np.isfinite(r["train/loss"]) for r in records)


def test_experiment_configs_validate():
  module = load_module(CONFIGS)
  for variant, tasks in (("geodl_icarl_fl", 10), ("geodl_icarl_fl_tasks5", 5),
                         ("geodl_icarl_fl_tasks20", 20), ("geodl_icarl_fl_quick", 4)):
    config = module.get_config(variant)
    validate_config(config)
    assert config.algorithm == "geodl_icarl_fl" and config.scenario.num_tasks == tasks
    assert config.geodl.weight == (1.0 if variant.endswith("_quick") else 5.0)
    assert config.geodl.subspace_dim == 0
    assert config.local.lr == (0.5 if variant.endswith("_quick") else 2.0)
  assert module.get_config("geodl_icarl_fl").geodl.memory_size == 2000
  assert module.get_config("geodl_icarl_fl_quick").geodl.memory_size == 90


@pytest.mark.parametrize("field,value", [("weight", -1.0), ("adaptive_weight", None),
                                         ("subspace_dim", -2), ("memory_size", 0)])
def test_bad_fields_name_the_field(field, value):
  module = load_module(CONFIGS)
  broken = module.get_config("geodl_icarl_fl_quick")
  broken.geodl[field] = value
  with pytest.raises(ConfigError, match=f"config.geodl.{field}"):
    validate_config(broken)

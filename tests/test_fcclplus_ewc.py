"""EWC (Kirkpatrick et al., PNAS 2017, Eq. 3) as FCCL+'s local anti-forgetting term (Table XVI).

L_local = CE + (lambda / 2) sum_i F_i (theta_i - theta*_i)^2, F the diagonal Fisher of the
teacher theta* on the participant's private data (`fcclplus.local_distillation="ewc"`).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fcclplus
from fedjax_het.config import validate_config
from fedjax_het.engine import api
from fedjax_het.losses import ewc
from fedjax_het.train import train_and_evaluate
from tests.test_fcclplus_dual import LR, _config, _setup, _slot
from tests.test_train import digits, tiny_config
from tests.tiny_federation import grouped_data


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _numpy_fisher(w, b, x, y, valid):
  """Mean over valid rows of the squared gradient of log softmax(x W + b)[y] (float64).

  d/dW = x^T (onehot(y) - p), d/db = onehot(y) - p, per example.
  """
  x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
  residual = np.eye(w.shape[1])[y] - _softmax(x @ w + b)       # (N, C)
  valid = np.asarray(valid, np.float64)
  count = max(valid.sum(), 1.0)
  fw = np.einsum("n,ni,nc->ic", valid, x**2, residual**2) / count
  fb = np.einsum("n,nc->c", valid, residual**2) / count
  return fw, fb


def _linear(params, x):
  """Logits of one example (d,) or of a batch (n, d)."""
  return x @ params["w"] + (params["b"] if x.ndim == 1 else params["b"][None])


def _problem(seed=0, n=5, d=4, c=3, scale=1.0):
  rng = np.random.default_rng(seed)
  params = {"w": jnp.asarray(scale * rng.normal(size=(d, c)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(c,)), jnp.float32)}
  x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  y = jnp.asarray(rng.integers(0, c, n), jnp.int32)
  return params, x, y


@pytest.mark.parametrize("chunk_size", [1, 2, 32])
def test_fisher_of_a_linear_softmax_model_equals_numpy(chunk_size):
  params, x, y = _problem()
  mask = jnp.asarray([True, True, False, True, True])
  fisher = ewc.fisher_diagonal(logits_fn=_linear, params=params, inputs=x, labels=y, mask=mask,
                               chunk_size=chunk_size)
  fw, fb = _numpy_fisher(params["w"], params["b"], x, y, mask)
  np.testing.assert_allclose(fisher["w"], fw, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(fisher["b"], fb, rtol=1e-5, atol=1e-7)


def test_fisher_with_sampled_labels_uses_the_models_own_draws():
  params, x, _ = _problem(seed=1, n=7)
  key = jax.random.key(4)
  fisher = jax.jit(lambda p, x: ewc.fisher_diagonal(logits_fn=_linear, params=p, inputs=x,
                                                    key=key, chunk_size=3))(params, x)
  drawn = np.asarray(ewc.sample_labels(logits=_linear(params, x), key=key))
  fw, fb = _numpy_fisher(params["w"], params["b"], x, drawn, np.ones(7))
  np.testing.assert_allclose(fisher["w"], fw, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(fisher["b"], fb, rtol=1e-5, atol=1e-7)
  # The draws follow the model: a model sure of class 2 draws 2.
  sure = {"w": jnp.zeros((4, 3)), "b": jnp.asarray([0.0, 0.0, 50.0])}
  np.testing.assert_array_equal(ewc.sample_labels(logits=_linear(sure, x), key=key), 2)


def test_fisher_and_penalty_stay_finite_with_saturated_logits():
  params, x, y = _problem(seed=2, scale=100.0)  # logits of magnitude ~100
  assert float(jnp.max(jnp.abs(_linear(params, x)))) > 50
  for labels, key in ((y, None), (None, jax.random.key(0))):
    fisher = ewc.fisher_diagonal(logits_fn=_linear, params=params, inputs=x, labels=labels,
                                 key=key)
    assert all(bool(jnp.all(jnp.isfinite(f))) for f in jax.tree_util.tree_leaves(fisher))
  fw, fb = _numpy_fisher(params["w"], params["b"], x, y, np.ones(5))
  fisher = ewc.fisher_diagonal(logits_fn=_linear, params=params, inputs=x, labels=y)
  np.testing.assert_allclose(fisher["w"], fw, rtol=1e-4, atol=1e-6)
  moved = jax.tree_util.tree_map(lambda p: p + 100.0, params)
  penalty = ewc.ewc_penalty(params=moved, anchor_params=params, fisher=fisher, weight=0.7)
  assert np.isfinite(float(penalty))


def test_penalty_is_half_lambda_fisher_weighted_squares_and_its_gradient():
  params, _, _ = _problem(seed=3)
  rng = np.random.default_rng(5)
  anchor = jax.tree_util.tree_map(lambda p: p + jnp.asarray(rng.normal(size=p.shape),
                                                             jnp.float32), params)
  fisher = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.uniform(size=p.shape), jnp.float32),
                                  params)
  weight = 0.7
  want = 0.5 * weight * sum(float(np.sum(np.asarray(f, np.float64) * (
      np.asarray(p, np.float64) - np.asarray(a, np.float64))**2)) for p, a, f in zip(
          *(jax.tree_util.tree_leaves(t) for t in (params, anchor, fisher))))
  got = ewc.ewc_penalty(params=params, anchor_params=anchor, fisher=fisher, weight=weight)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  grad = jax.grad(lambda p: ewc.ewc_penalty(params=p, anchor_params=anchor, fisher=fisher,
                                            weight=weight))(params)
  for g, p, a, f in zip(*(jax.tree_util.tree_leaves(t) for t in (grad, params, anchor, fisher))):
    np.testing.assert_allclose(g, weight * f * (p - a), rtol=1e-5, atol=1e-7)
  assert float(ewc.ewc_penalty(params=params, anchor_params=params, fisher=fisher)) == 0.0
  with pytest.raises(ValueError, match="`weight` must be finite and >= 0"):
    ewc.ewc_penalty(params=params, anchor_params=anchor, fisher=fisher, weight=-1.0)
  with pytest.raises(TypeError, match="keyword arguments only"):
    ewc.ewc_penalty(params, anchor, fisher)
  with pytest.raises(ValueError, match="exactly one of `labels`"):
    ewc.fisher_diagonal(logits_fn=_linear, params=params, inputs=jnp.zeros((2, 4)))


@pytest.mark.parametrize("labels", ["true", "sampled"])
def test_ewc_local_step_is_ce_plus_the_penalty_by_hand(labels):
  setup = _setup(["a", "a"])
  weight = 0.6
  config = _config("ewc", ewc_weight=weight, ewc_labels=labels, ewc_batch_size=4)
  phases = fcclplus.make_phases(config, setup)
  data, images, ys = grouped_data(setup)
  state = phases.init(jax.random.key(0), api.FederatedArrays(data, None, None))
  g = state["groups"]["a"]
  g["teacher"] = jax.tree_util.tree_map(
      lambda v: v + 0.05 * jnp.sin(jnp.arange(v.size, dtype=v.dtype).reshape(v.shape)),
      g["variables"])
  key = jax.random.key(1)
  new_state, metrics = phases.local_update(state, data, key, jnp.int32(0))
  new_g = new_state["groups"]["a"]
  label_keys = jax.vmap(lambda i: jax.random.fold_in(
      jax.random.fold_in(key, fcclplus.EWC_KEY_STREAM), i))(jnp.arange(2))
  for slot in range(2):
    x = jnp.asarray(images[slot], jnp.float32).reshape(len(images[slot]), -1) / 255.0
    y = np.asarray(ys[slot])
    teacher = _slot(g["teacher"]["params"], slot)["head"]
    tw, tb = teacher["kernel"], teacher["bias"]
    fisher_labels = (y if labels == "true" else np.asarray(
        ewc.sample_labels(logits=x @ tw + tb[None], key=label_keys[slot])))
    fw, fb = _numpy_fisher(tw, tb, x, fisher_labels, np.ones(len(y)))
    student = _slot(g["variables"]["params"], slot)["head"]
    w, b = (np.asarray(a, np.float64) for a in (student["kernel"], student["bias"]))
    xs = np.asarray(x, np.float64)
    p = _softmax(xs @ w + b)
    onehot = np.eye(3)[y]
    ce = -np.mean(np.sum(onehot * np.log(p), axis=-1))
    dw, db = w - np.asarray(tw, np.float64), b - np.asarray(tb, np.float64)
    penalty = 0.5 * weight * (np.sum(fw * dw**2) + np.sum(fb * db**2))
    dz = (p - onehot) / len(y)
    want_w = w - LR * (xs.T @ dz + weight * fw * dw)
    want_b = b - LR * (dz.sum(0) + weight * fb * db)
    assert penalty > 1e-6  # the teacher differs from the student and F > 0
    got = _slot(new_g["variables"]["params"], slot)["head"]
    np.testing.assert_allclose(got["kernel"], want_w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["bias"], want_b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["a"]["ce"][slot], ce, rtol=1e-5)
    np.testing.assert_allclose(metrics["a"]["distill"][slot], penalty, rtol=1e-4)
    np.testing.assert_allclose(metrics["a"]["loss"][slot], ce + penalty, rtol=1e-5)
  # The end-of-local model is next round's anchor theta^{e-1}.
  jax.tree_util.tree_map(np.testing.assert_array_equal, new_g["teacher"], new_g["variables"])


def test_ewc_settings_are_validated_naming_the_field():
  config = _config("ewc")
  validate_config(config)
  assert (config.fcclplus.ewc_weight, config.fcclplus.ewc_labels) == (1.0, "sampled")
  for field, value, allowed in (
      ("ewc_weight", -0.1, "a finite number >= 0"),
      ("ewc_labels", "model", r"one of \('sampled', 'true'\)"),
      ("ewc_batch_size", 0, "an integer >= 1")):
    bad = _config("ewc", **{field: value})
    with pytest.raises(ValueError, match=rf"config.fcclplus.{field} must be {allowed}, got"):
      validate_config(bad)


def test_the_quick_config_takes_ewc_from_the_command_line():
  config = digits.get_config("fcclplus_quick")
  config.fcclplus.local_distillation = "ewc"  # --config.fcclplus.local_distillation=ewc
  config.fcclplus.ewc_weight = 0.1            # --config.fcclplus.ewc_weight=0.1
  validate_config(config)


@pytest.mark.slow  # about 40 s on a 2-core CPU (mostly compiling the per-example Fisher)
def test_fcclplus_with_ewc_trains_end_to_end(tmp_path):
  config = tiny_config("fcclplus", **{"num_rounds": 2, "fcclplus.local_distillation": "ewc",
                                      "fcclplus.ewc_weight": 0.7,
                                      "models.architectures": ("simple_cnn",) * 4,
                                      "logging.diagnostic_rounds": ()})
  train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert np.isfinite(records[-1][f"train/local/distill/{client}"])
    assert records[-1][f"train/local/distill/{client}"] >= 0.0  # a penalty, unlike FNTD
    assert 0.0 <= records[-1][f"eval/inter/{client}"] <= 100.0

"""`compute_dtype="bfloat16"`: a bfloat16 forward/backward with float32 state (models, trainer)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import models


def _pair(name: str):
  f32 = models.get_model(name, 10, width=0.25, conv_impl="im2col")
  bf16 = models.get_model(name, 10, width=0.25, conv_impl="im2col", compute_dtype="bfloat16")
  variables = models.init_variables(f32, jax.random.key(0))
  images = jax.random.normal(jax.random.key(1), (16, 32, 32, 3))
  labels = jnp.arange(16) % 10
  return f32, bf16, variables, images, labels


def _ce_grads(model, variables, images, labels):
  def loss(params):
    _, logits, new = models.apply_model(model, {**variables, "params": params}, images,
                                        train=True)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels)), new
  return jax.grad(loss, has_aux=True)(variables["params"])


def _cosine(a, b):
  a = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(a)]).astype(np.float64)
  b = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(b)]).astype(np.float64)
  return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_float32_is_the_default_and_the_same_model():
  assert models.get_model("resnet10", 10).compute_dtype == "float32"
  assert models.get_model("resnet10", 10, compute_dtype="float32") == models.get_model(
      "resnet10", 10)


# ResNet-10's forward (15-20 s on a 2-core CPU): slow suite; its bfloat16 gradients and
# BatchNorm statistics are checked below in the default suite.
@pytest.mark.parametrize("name", [pytest.param("resnet10", marks=pytest.mark.slow),
                                  "fedavg_cifar_cnn"])
def test_bfloat16_outputs_are_float32_and_close_to_float32(name):
  f32, bf16, variables, images, _ = _pair(name)
  feats32, logits32, _ = models.apply_model(f32, variables, images, train=False)
  feats16, logits16, same = models.apply_model(bf16, variables, images, train=False)
  assert logits16.dtype == feats16.dtype == jnp.float32
  assert same is variables
  scale = float(jnp.max(jnp.abs(logits32)))
  error = float(jnp.max(jnp.abs(logits16 - logits32)))
  # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%): the result
  # differs from float32 (the cast happened) but only by rounding-sized amounts.
  # (XLA may keep some intermediates in float32 where the backend has no bfloat16
  # arithmetic, e.g. on CPU, so the outputs need not be bfloat16-representable.)
  assert 0 < error < 0.05 * scale


@pytest.mark.parametrize("name", ["resnet10",  # the CNN's (5 s): slow suite
                                  pytest.param("fedavg_cifar_cnn", marks=pytest.mark.slow)])
def test_bfloat16_gradients_and_statistics_are_float32_and_aligned(name):
  f32, bf16, variables, images, labels = _pair(name)
  grads32, new32 = _ce_grads(f32, variables, images, labels)
  grads16, new16 = _ce_grads(bf16, variables, images, labels)
  assert {g.dtype for g in jax.tree_util.tree_leaves(grads16)} == {jnp.dtype(jnp.float32)}
  assert _cosine(grads32, grads16) > 0.97  # 0.985 for ResNet10 (train-mode BatchNorm)
  stats16 = jax.tree_util.tree_leaves(new16["batch_stats"])
  assert all(s.dtype == jnp.float32 for s in stats16)
  for s32, s16 in zip(jax.tree_util.tree_leaves(new32["batch_stats"]), stats16):
    np.testing.assert_allclose(np.asarray(s16), np.asarray(s32), rtol=0.05, atol=0.02)


def test_bfloat16_train_step_in_scan_runs_and_learns():
  _, bf16, variables, images, labels = _pair("fedavg_cifar_cnn")
  optimizer = optax.adam(3e-3)

  def step(carry, _):
    params, opt_state = carry
    grads, _ = _ce_grads(bf16, {**variables, "params": params}, images, labels)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  (params, _), _ = jax.jit(lambda p: jax.lax.scan(step, (p, optimizer.init(p)), None,
                                                  length=30))(variables["params"])
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params))
  _, before, _ = models.apply_model(bf16, variables, images, train=False)
  _, after, _ = models.apply_model(bf16, {**variables, "params": params}, images, train=False)
  ce = lambda logits: float(jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(logits, labels)))
  assert ce(after) < 0.5 * ce(before)


def test_unknown_compute_dtype_names_the_allowed_values():
  with pytest.raises(ValueError, match=r"compute_dtype.*\('float32', 'bfloat16'\).*'float16'"):
    models.get_model("resnet10", 10, compute_dtype="float16")


@pytest.mark.slow  # about 25 s; the bfloat16 dtype and gradient tests above stay in the default suite
def test_a_bfloat16_run_trains_from_the_config_with_float32_state(tmp_path):
  from fedjax_het.config import validate_config  # pylint: disable=g-import-not-at-top
  from fedjax_het.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from fedjax_het.experiment import Experiment
  from fedjax_het.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  from tests.test_train import tiny_config  # pylint: disable=g-import-not-at-top

  config = tiny_config("fcclplus", **{"models.compute_dtype": "bfloat16", "num_rounds": 1})
  experiment = Experiment(config)
  assert {m.compute_dtype for m in (g.model for g in experiment.groups)} == {"bfloat16"}
  state = experiment.init_state()
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(state["groups"])
          if jnp.issubdtype(leaf.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}
  out = train_and_evaluate(config, tmp_path)
  record = out["last_record"]
  assert all(np.isfinite(v) for k, v in record.items() if k.startswith(("train/", "eval/")))
  assert json.loads((tmp_path / "config.json").read_text())["models"]["compute_dtype"] == \
      "bfloat16"
  config.models.compute_dtype = "float16"
  with pytest.raises(ConfigError, match=r"models\.compute_dtype.*'float32', 'bfloat16'"):
    validate_config(config)

"""Properties every loss must have: jit, vmap over clients, finite gradients, clear errors.

`CASES` maps each exported function to a builder of random keyword arguments
(scaled by `scale` where the argument is a logit-like quantity) and the name of
the argument to differentiate. A guard test fails when a new export lacks a case.
"""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses

B, C, D = 8, 10, 16


def _normal(rng, shape, scale=1.0):
  return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def _labels(rng, n=B, classes=C):
  return jnp.asarray(rng.integers(0, classes, size=n), jnp.int32)


def _pair(name_a, name_b):
  return lambda rng, s: {name_a: _normal(rng, (B, C), s), name_b: _normal(rng, (B, C), s)}


CASES = {
    "cross_correlation_matrix": (_pair("logits", "target_logits"), "logits"),
    "cross_correlation_loss": (_pair("logits", "target_logits"), "logits"),
    "instance_similarity_matrix": (lambda r, s: {"features": _normal(r, (B, D), s)}, "features"),
    "instance_similarity_loss": (lambda r, s: {"similarity": _normal(r, (B, B - 1), s),
                                               "target_similarity": _normal(r, (B, B - 1), s)},
                                 "similarity"),
    "knowledge_distillation_loss": (lambda r, s: {**_pair("student_logits", "teacher_logits")(r, s),
                                                  "temperature": 3.0}, "student_logits"),
    "non_target_distillation_loss": (lambda r, s: {**_pair("student_logits", "teacher_logits")(r, s),
                                                   "labels": _labels(r), "temperature": 3.0},
                                     "student_logits"),
    "dual_domain_distillation_loss": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                    "previous_logits": _normal(r, (B, C), s),
                                                    "pretrained_logits": _normal(r, (B, C), s)},
                                      "logits"),
    "softmax_cross_entropy": (lambda r, s: {"logits": _normal(r, (B, C), s), "labels": _labels(r)},
                              "logits"),
    "sigmoid_binary_cross_entropy": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                   "targets": jnp.asarray(r.random((B, C)),
                                                                          jnp.float32)}, "logits"),
    "class_aware_gradient_compensation_loss": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                             "labels": _labels(r),
                                                             "num_old_classes": 4}, "logits"),
    "class_semantic_relation_distillation_loss": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                                "labels": _labels(r),
                                                                "old_logits": _normal(r, (B, 6), s)},
                                                  "logits"),
    "mean_prediction_entropy": (lambda r, s: {"logits": _normal(r, (B, C), s)}, "logits"),
    "task_transition_detected": (lambda r, s: {"entropy": _normal(r, (), s),
                                               "previous_entropy": _normal(r, (), s)}, None),
    "prototype_perturbation_loss": (lambda r, s: {"features": _normal(r, (B, D), s),
                                                  "labels": _labels(r),
                                                  "noise": _normal(r, (B, D)),
                                                  "feature_variance": jnp.abs(_normal(r, (B, D))),
                                                  "kernel": _normal(r, (D, C)),
                                                  "bias": _normal(r, (C,))}, "features"),
    "gradient_matching_loss": (lambda r, s: {"gradients": {"w": _normal(r, (D, C), s),
                                                           "b": _normal(r, (C,), s)},
                                             "target_gradients": {"w": _normal(r, (D, C), s),
                                                                  "b": _normal(r, (C,), s)}},
                               "gradients"),
    "infer_label_from_last_layer_gradient": (lambda r, s: {"kernel_gradient": _normal(r, (D, C), s)},
                                             None),
    "gaussian_kernel_matrix": (lambda r, s: {"x": _normal(r, (B, C), s), "y": _normal(r, (B, C), s)},
                               "x"),
    "multi_kernel_mmd_squared": (lambda r, s: {"x": _normal(r, (B, C), s),
                                               "y": _normal(r, (B, C), s)}, "y"),
    "two_stream_l2_loss": (_pair("local_outputs", "global_outputs"), "local_outputs"),
    "proximal_term": (lambda r, s: {"params": {"w": _normal(r, (D, C), s)},
                                    "global_params": {"w": _normal(r, (D, C), s)}}, "params"),
    "model_contrastive_loss": (lambda r, s: {"features": _normal(r, (B, D), s),
                                             "global_features": _normal(r, (B, D), s),
                                             "previous_features": _normal(r, (B, D), s)},
                               "features"),
    "restricted_softmax_logits": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                "class_mask": jnp.asarray(r.random(C) > 0.5)},
                                  "logits"),
    "prototype_contrastive_loss": (lambda r, s: {"features": _normal(r, (B, D), s),
                                                 "labels": _labels(r),
                                                 "prototypes": _normal(r, (C, D), s),
                                                 "prototype_mask": jnp.asarray(r.random(C) > 0.3)},
                                   "features"),
    "prototype_contrastive_objective": (lambda r, s: {"logits": _normal(r, (B, C), s),
                                                      "features": _normal(r, (B, D), s),
                                                      "labels": _labels(r),
                                                      "prototypes": _normal(r, (C, D), s),
                                                      "prototype_mask": jnp.asarray(r.random(C) > 0.3),
                                                      "alpha": 0.5}, "logits"),
    "symmetric_cross_entropy": (lambda r, s: {"logits": _normal(r, (B, C), s), "labels": _labels(r)},
                                "logits"),
    "consensus_l1_loss": (_pair("logits", "consensus_logits"), "logits"),
    "ensemble_distillation_loss": (lambda r, s: {"student_logits": _normal(r, (B, C), s),
                                                 "client_logits": _normal(r, (3, B, C), s)},
                                   "student_logits"),
}

FUNCTIONS = sorted(name for name in losses.__all__ if callable(getattr(losses, name)))


def test_every_exported_loss_has_a_property_case():
  assert sorted(CASES) == FUNCTIONS


def _as_scalar_loss(out):
  return jnp.sum(out) if jnp.ndim(out) else out


@pytest.mark.parametrize("name", FUNCTIONS)
def test_runs_under_jit_and_matches_eager(name):
  fn = getattr(losses, name)
  make, _ = CASES[name]
  kwargs = make(np.random.default_rng(0), 1.0)
  jitted = fn(**kwargs)  # the public callable is already jit-compiled
  nested = jax.jit(lambda kw: fn(**kw))(kwargs)  # inside a caller's own jit
  with jax.disable_jit():
    eager = fn.raw(**kwargs)
  np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(nested, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_vmap_over_clients_equals_python_loop(name):
  fn = getattr(losses, name)
  make, _ = CASES[name]
  clients = [make(np.random.default_rng(seed), 1.0) for seed in range(3)]
  # Static (Python scalar) hyper-parameters stay unbatched.
  static = {k: v for k, v in clients[0].items() if isinstance(v, (int, float))}
  batched = {k: jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[c[k] for c in clients])
             for k in clients[0] if k not in static}
  vmapped = jax.vmap(lambda kw: fn(**kw, **static))(batched)
  looped = jnp.stack([fn(**c) for c in clients])
  np.testing.assert_allclose(vmapped, looped, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in FUNCTIONS if CASES[n][1] is not None])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_gradient_is_finite_for_logits_up_to_1e4(name, scale):
  fn = getattr(losses, name)
  make, argname = CASES[name]
  kwargs = make(np.random.default_rng(1), scale)

  def scalar(arg):
    return _as_scalar_loss(fn(**{**kwargs, argname: arg}))

  value, grad = jax.value_and_grad(scalar)(kwargs[argname])
  assert np.isfinite(value), f"{name}: loss {value} at scale {scale}"
  for leaf in jax.tree_util.tree_leaves(grad):
    assert np.all(np.isfinite(leaf)), f"{name}: non-finite gradient at scale {scale}"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_positional_arguments_are_rejected(name):
  fn = getattr(losses, name)
  kwargs = CASES[name][0](np.random.default_rng(2), 1.0)
  first = next(iter(kwargs.values()))
  with pytest.raises(TypeError, match="keyword arguments only"):
    fn(first)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_signatures_are_keyword_only_and_documented(name):
  fn = getattr(losses, name)
  params = inspect.signature(fn).parameters.values()
  assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name
  doc = fn.__doc__ or ""
  assert "Args:" in doc and "Returns:" in doc, name


@pytest.mark.parametrize("name,field,value,text", [
    ("knowledge_distillation_loss", "temperature", 0.0, "> 0"),
    ("non_target_distillation_loss", "temperature", -1.0, "> 0"),
    ("instance_similarity_matrix", "temperature", float("nan"), "> 0"),
    ("cross_correlation_loss", "off_diagonal_weight", -0.1, ">= 0"),
    ("restricted_softmax_logits", "alpha", 1.5, "in [0, 1]"),
    ("proximal_term", "mu", -1.0, ">= 0"),
])
def test_out_of_range_hyper_parameters_name_the_field(name, field, value, text):
  fn = getattr(losses, name)
  kwargs = CASES[name][0](np.random.default_rng(3), 1.0)
  with pytest.raises(ValueError, match=re.escape(f"{name}: `{field}` must be finite and {text}")):
    fn(**{**kwargs, field: value})


@pytest.mark.parametrize("name,field,bad_shape", [
    ("cross_correlation_loss", "logits", (B, C, 1)),
    ("softmax_cross_entropy", "logits", (C,)),
    ("instance_similarity_matrix", "features", (B,)),
    ("model_contrastive_loss", "features", (B, D, 1)),
    ("ensemble_distillation_loss", "client_logits", (B, C)),
])
def test_wrong_rank_names_the_argument(name, field, bad_shape):
  fn = getattr(losses, name)
  kwargs = CASES[name][0](np.random.default_rng(4), 1.0)
  with pytest.raises(ValueError, match=rf"{name}: `{field}` must have shape"):
    fn(**{**kwargs, field: jnp.zeros(bad_shape)})


def test_mismatched_shapes_and_bad_labels_are_reported():
  with pytest.raises(ValueError, match=r"`logits` \(8, 10\), `target_logits` \(8, 9\)"):
    losses.cross_correlation_loss(logits=jnp.zeros((8, 10)), target_logits=jnp.zeros((8, 9)))
  with pytest.raises(ValueError, match=r"`labels` must have shape \(batch,\) = \(8,\)"):
    losses.softmax_cross_entropy(logits=jnp.zeros((8, 10)), labels=jnp.zeros((7,), jnp.int32))
  with pytest.raises(ValueError, match="`labels` must hold integer class indices"):
    losses.softmax_cross_entropy(logits=jnp.zeros((8, 10)), labels=jnp.zeros((8,)))


def test_hyper_parameters_may_be_traced():
  """Schedules (e.g. FedProc's alpha = 1 - r/(E-1)) arrive traced inside the engine's jit."""
  kwargs = CASES["prototype_contrastive_objective"][0](np.random.default_rng(5), 1.0)
  fn = jax.jit(lambda alpha: losses.prototype_contrastive_objective(**{**kwargs, "alpha": alpha}))
  np.testing.assert_allclose(fn(0.5), losses.prototype_contrastive_objective(**kwargs), rtol=1e-6)


MASKED = [n for n in FUNCTIONS if "mask" in inspect.signature(getattr(losses, n)).parameters]


def test_every_per_example_loss_accepts_a_mask():
  assert set(MASKED) >= {
      "softmax_cross_entropy", "knowledge_distillation_loss", "non_target_distillation_loss",
      "dual_domain_distillation_loss", "class_aware_gradient_compensation_loss",
      "class_semantic_relation_distillation_loss", "mean_prediction_entropy",
      "multi_kernel_mmd_squared", "two_stream_l2_loss", "model_contrastive_loss",
      "prototype_contrastive_loss", "symmetric_cross_entropy", "consensus_l1_loss",
      "ensemble_distillation_loss"}


@pytest.mark.parametrize("name", MASKED)
def test_masked_loss_equals_loss_on_the_valid_rows(name):
  """A padded partial batch gives exactly the loss of its valid examples."""
  fn = getattr(losses, name)
  kwargs = CASES[name][0](np.random.default_rng(6), 1.0)
  valid = np.array([True, False, True, True, False, True, True, False])

  def take_valid(key, value):
    if key == "client_logits":
      return value[:, valid]
    if isinstance(value, jax.Array) and value.ndim >= 1 and value.shape[0] == B:
      return value[valid]
    return value

  masked = fn(**kwargs, mask=jnp.asarray(valid))
  subset = fn(**{k: take_valid(k, v) for k, v in kwargs.items()})
  np.testing.assert_allclose(masked, subset, rtol=1e-5, atol=1e-6)
  # Garbage in the padded rows must not leak into the value or the gradient.
  _, argname = CASES[name]
  poisoned = dict(kwargs)
  poisoned[argname] = jnp.where(jnp.asarray(valid)[:, None], kwargs[argname], 1e4)
  np.testing.assert_allclose(fn(**poisoned, mask=jnp.asarray(valid)), masked, rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda a: fn(**{**poisoned, argname: a}, mask=jnp.asarray(valid)))(poisoned[argname])
  np.testing.assert_array_equal(np.asarray(grad)[~valid], 0.0)
  # An all-padding batch contributes nothing.
  assert float(fn(**kwargs, mask=jnp.zeros(B, bool))) == 0.0

"""Full-width forward passes of the zoo (slow on CPU: run with `-m slow`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models

FULL_WIDTH_FEATURES = {"resnet18": 512, "resnet34": 512, "efficientnet_b0": 320,
                       "mobilenet_v2": 1280, "googlenet": 1024, "glfc_resnet18": 512}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL_WIDTH_FEATURES))
def test_full_width_forward_pass(name):
  num_classes = 100 if name == "glfc_resnet18" else 10
  model = models.get_model(name, num_classes)
  variables = models.init_variables(model, jax.random.key(0))
  images = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
  for train in (False, True):
    features, logits, new = models.apply_model(model, variables, images, train=train,
                                               rng=jax.random.key(1))
    assert features.shape == (2, FULL_WIDTH_FEATURES[name])
    assert logits.shape == (2, num_classes)
    assert np.all(np.isfinite(features)) and np.all(np.isfinite(logits))
    assert (new is variables) == (not train)
  # Eval mode with freshly initialised statistics (mean 0, var 1) is a
  # deterministic function of the input.
  again, _, _ = models.apply_model(model, variables, images, train=False)
  np.testing.assert_array_equal(again, models.apply_model(model, variables, images,
                                                          train=False)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_full_width_im2col_matches_xla(name):
  ref = models.get_model(name, 10)
  variables = models.init_variables(ref, jax.random.key(0))
  images = jnp.asarray(np.random.default_rng(1).normal(size=(2, 32, 32, 3)), jnp.float32)
  _, want, _ = models.apply_model(ref, variables, images, train=True)
  for impl in ("im2col", "custom_vjp"):
    model = models.get_model(name, 10, conv_impl=impl)
    _, got, _ = models.apply_model(model, variables, images, train=True)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)

"""GLFC's growable head and LeNet encoder; the FedFusion wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models

TINY = 0.125


def _images(batch=2, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, 32, 32, 3)), jnp.float32)


# ------------------------------------------------------------------ GLFC head growth


def test_grow_classifier_keeps_old_logits_and_adds_fresh_columns():
  old_model = models.get_model("glfc_resnet18", 10, width=TINY)
  variables = models.init_variables(old_model, jax.random.key(0))
  grown = models.grow_classifier(variables, num_new_classes=10, key=jax.random.key(1))
  new_model = models.get_model("glfc_resnet18", 20, width=TINY)
  # The grown variables are exactly what the wider model expects.
  want = jax.eval_shape(lambda k: models.init_variables(new_model, k), jax.random.key(0))
  assert jax.tree_util.tree_map(jnp.shape, grown) == jax.tree_util.tree_map(lambda s: s.shape,
                                                                            want)
  old_head, new_head = variables["params"]["head"], grown["params"]["head"]
  np.testing.assert_array_equal(new_head["kernel"][:, :10], old_head["kernel"])
  np.testing.assert_array_equal(new_head["bias"][:10], old_head["bias"])
  assert grown["params"]["trunk"] is variables["params"]["trunk"]
  assert grown["batch_stats"] is variables["batch_stats"]
  # Fresh columns: torch Linear init U(-1/sqrt(d), 1/sqrt(d)), not zeros, not copies.
  d = old_model.feature_dim
  fresh = np.asarray(new_head["kernel"][:, 10:])
  assert np.max(np.abs(fresh)) <= 1 / np.sqrt(d) and np.std(fresh) > 0.3 / np.sqrt(d)
  assert np.max(np.abs(new_head["bias"][10:])) <= 1 / np.sqrt(d)
  images = _images()
  f_old, l_old, _ = models.apply_model(old_model, variables, images, train=False)
  f_new, l_new, _ = models.apply_model(new_model, grown, images, train=False)
  np.testing.assert_array_equal(f_new, f_old)
  np.testing.assert_allclose(l_new[:, :10], l_old, rtol=1e-6, atol=1e-6)
  assert l_new.shape == (2, 20)


def test_grow_classifier_twice_and_under_vmap():
  model = models.get_model("simple_cnn", 4, width=0.25)
  keys = jax.random.split(jax.random.key(0), 3)
  stacked = jax.vmap(lambda k: models.init_variables(model, k))(keys)
  grown = jax.vmap(lambda v, k: models.grow_classifier(v, num_new_classes=2, key=k))(
      stacked, jax.random.split(jax.random.key(1), 3))
  kernel = grown["params"]["head"]["kernel"]
  assert kernel.shape == (3, model.feature_dim, 6)
  np.testing.assert_array_equal(kernel[:, :, :4], stacked["params"]["head"]["kernel"])
  assert not np.allclose(kernel[0, :, 4:], kernel[1, :, 4:])  # per-client keys
  again = models.grow_classifier(jax.tree_util.tree_map(lambda a: a[0], grown),
                                 num_new_classes=3, key=jax.random.key(2))
  assert again["params"]["head"]["bias"].shape == (9,)
  np.testing.assert_array_equal(again["params"]["head"]["bias"][:6],
                                grown["params"]["head"]["bias"][0])


def test_grow_classifier_errors():
  model = models.get_model("simple_cnn", 4, width=0.25)
  variables = models.init_variables(model, jax.random.key(0))
  with pytest.raises(ValueError, match="num_new_classes"):
    models.grow_classifier(variables, num_new_classes=0, key=jax.random.key(0))
  stacked = jax.tree_util.tree_map(lambda a: a[None], variables)
  with pytest.raises(ValueError, match="vmap"):
    models.grow_classifier(stacked, num_new_classes=1, key=jax.random.key(0))
  with pytest.raises(ValueError, match="head"):
    models.grow_classifier({"params": {}}, num_new_classes=1, key=jax.random.key(0))


# ------------------------------------------------------------------ LeNet encoder


def test_lenet_encoder_init_and_differentiability():
  model = models.get_model("lenet_encoder", 100)
  assert model.feature_dim == 768
  variables = models.init_variables(model, jax.random.key(0))
  assert variables["batch_stats"] == {}
  leaves = jax.tree_util.tree_leaves(variables["params"])
  assert len(leaves) == 8  # 3 convs + head, weight and bias each
  for leaf in leaves:  # every weight AND bias ~ U(-0.5, 0.5)
    assert float(jnp.max(jnp.abs(leaf))) <= 0.5 and float(jnp.max(jnp.abs(leaf))) > 0.4
  shapes = {k: v["kernel"].shape for k, v in variables["params"]["trunk"].items()}
  assert shapes == {"conv1": (5, 5, 3, 12), "conv2": (5, 5, 12, 12), "conv3": (5, 5, 12, 12)}
  images = _images(2)
  features, logits, _ = models.apply_model(model, variables, images, train=False)
  assert features.shape == (2, 768) and logits.shape == (2, 100)
  assert float(jnp.min(features)) > 0.0 and float(jnp.max(features)) < 1.0  # sigmoid outputs

  def loss(params, x):
    _, logits, _ = models.apply_model(model, {**variables, "params": params}, x, train=False)
    return -jax.nn.log_softmax(logits)[0, 3]

  grad_params, grad_x = jax.grad(loss, argnums=(0, 1))(variables["params"], images)
  assert float(jnp.max(jnp.abs(grad_x))) > 0
  for leaf in jax.tree_util.tree_leaves(grad_params):
    assert np.all(np.isfinite(leaf)) and float(jnp.max(jnp.abs(leaf))) > 0


# ------------------------------------------------------------------ FedFusion


def _fedfusion(base, fusion, width=TINY, num_classes=4):
  model = models.get_model("fedfusion", num_classes, width=width, base=base, fusion=fusion)
  plain = models.get_model(base, num_classes, width=width)
  return model, plain


@pytest.mark.parametrize("fusion", ["multi", "single"])
@pytest.mark.parametrize("base", ["fedavg_cifar_cnn", "fedavg_mnist_cnn", "resnet10"])
def test_fedfusion_gamma_zero_reproduces_the_local_model_exactly(base, fusion):
  model, plain = _fedfusion(base, fusion)
  variables = models.init_variables(model, jax.random.key(0))
  gamma = variables["params"]["fusion"]["gamma"]
  assert gamma.shape == ((plain.trunk.out_channels,) if fusion == "multi" else ())
  np.testing.assert_array_equal(gamma, 0.0)
  # Make the global trunk different from the local one, so equality is not trivial.
  other = models.init_variables(plain, jax.random.key(7))
  variables = models.fedfusion_set_global(variables, other)
  local = models.fedfusion_local_variables(variables)
  assert jax.tree_util.tree_structure(local) == jax.tree_util.tree_structure(
      models.init_variables(plain, jax.random.key(0)))
  images = _images()
  for train in (False, True):
    f, l, new = models.apply_model(model, variables, images, train=train)
    f_ref, l_ref, new_ref = models.apply_model(plain, local, images, train=train)
    np.testing.assert_array_equal(f, f_ref)
    np.testing.assert_array_equal(l, l_ref)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           models.fedfusion_local_variables(new), new_ref)
    if base == "resnet10":  # the frozen trunk's running statistics never move
      jax.tree_util.tree_map(np.testing.assert_array_equal,
                             new["batch_stats"]["global_trunk"],
                             variables["batch_stats"]["global_trunk"])
  # A non-zero gamma mixes in the global trunk.
  params = dict(variables["params"])
  params["fusion"] = {"gamma": jnp.full_like(gamma, 0.5)}
  _, mixed, _ = models.apply_model(model, {**variables, "params": params}, images, train=False)
  assert not np.allclose(mixed, l_ref)


@pytest.mark.parametrize("fusion", ["conv", "multi", "single"])
def test_fedfusion_global_trunk_gets_zero_gradient(fusion):
  model, _ = _fedfusion("fedavg_cifar_cnn", fusion)
  variables = models.init_variables(model, jax.random.key(0))
  params = dict(variables["params"])
  if fusion != "conv":  # gamma != 0 so the global map reaches the loss
    params["fusion"] = {"gamma": jnp.full_like(params["fusion"]["gamma"], 0.3)}

  def loss(params):
    _, logits, _ = models.apply_model(model, {**variables, "params": params}, _images(),
                                      train=True)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0])

  grads = jax.jit(jax.grad(loss))(params)
  for leaf in jax.tree_util.tree_leaves(grads["global_trunk"]):
    np.testing.assert_array_equal(leaf, 0.0)
  for part in ("local_trunk", "fusion", "tail", "head"):
    assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(grads[part])) > 0


def test_fedfusion_conv_operator_and_mask():
  model, plain = _fedfusion("fedavg_cifar_cnn", "conv", width=0.25)
  variables = models.init_variables(model, jax.random.key(0))
  c = plain.trunk.out_channels
  assert variables["params"]["fusion"]["conv"]["kernel"].shape == (1, 1, 2 * c, c)
  assert set(variables["params"]) == {"local_trunk", "global_trunk", "fusion", "tail", "head"}
  features, logits, _ = models.apply_model(model, variables, _images(), train=False)
  assert features.shape == (2, model.feature_dim) and logits.shape == (2, 4)
  mask = models.fedfusion_trainable_mask(variables["params"])
  assert jax.tree_util.tree_structure(mask) == jax.tree_util.tree_structure(variables["params"])
  assert not any(jax.tree_util.tree_leaves(mask["global_trunk"]))
  for part in ("local_trunk", "fusion", "tail", "head"):
    assert all(jax.tree_util.tree_leaves(mask[part]))
  with pytest.raises(ValueError, match="global_trunk"):
    models.fedfusion_trainable_mask(models.init_variables(plain, jax.random.key(0))["params"])


def test_fedfusion_set_global_also_local_copies_the_base_model():
  model, plain = _fedfusion("fedavg_cifar_cnn", "multi")
  variables = models.init_variables(model, jax.random.key(0))
  base = models.init_variables(plain, jax.random.key(5))
  loaded = models.fedfusion_set_global(variables, base, also_local=True)
  assert loaded["params"]["global_trunk"] is base["params"]["trunk"]
  assert loaded["params"]["local_trunk"] is base["params"]["trunk"]
  assert loaded["params"]["head"] is base["params"]["head"]
  assert loaded["params"]["fusion"] is variables["params"]["fusion"]
  images = _images()
  _, logits, _ = models.apply_model(model, loaded, images, train=False)
  _, want, _ = models.apply_model(plain, base, images, train=False)
  np.testing.assert_array_equal(logits, want)

"""`fedavg.augmentation`: the FedFusion script's crop and flip, on the unpermuted image."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import experiment
from fedjax_het.algorithms import fedavg, fedavg_family
from fedjax_het.config import base_config, validate_config
from fedjax_het.configs import mnist
from fedjax_het.data import augment, partition
from tests.tiny_federation import tiny_config, tiny_data, tiny_setup


def _images(n=3, h=28, w=28, c=1, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


def test_permute_pixels_is_the_scenarios_permutation_and_unpermute_inverts_it():
  images = _images(c=3)
  perm = partition.client_permutation(1, seed=4, num_pixels=28 * 28)
  permuted = augment.permute_pixels(jnp.asarray(images), jnp.asarray(perm))
  np.testing.assert_array_equal(permuted, partition.permuted_pixels(images, 1, seed=4))
  np.testing.assert_array_equal(augment.unpermute_pixels(permuted, jnp.asarray(perm)), images)
  # By hand on a 2x2 image: stored pixel j is original pixel perm[j].
  image = np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)
  out = augment.permute_pixels(jnp.asarray(image), jnp.asarray([2, 0, 3, 1]))
  np.testing.assert_array_equal(np.asarray(out).ravel(), [2.0, 0.0, 3.0, 1.0])


def test_resized_crop_flip_acts_on_the_unpermuted_image():
  """Augmenting the stored (permuted) images with their permutation is augmenting the original
  images and permuting the result: the crop and flip see the digit's own geometry."""
  images = jnp.asarray(_images(), jnp.float32) / 255.0
  perm = jnp.asarray(partition.client_permutation(0, seed=2, num_pixels=28 * 28))
  key = jax.random.key(7)
  got = augment.resized_crop_flip(key, augment.permute_pixels(images, perm), perm)
  want = augment.permute_pixels(augment.resized_crop_flip(key, images), perm)
  np.testing.assert_array_equal(got, want)
  # Without the permutation the same key gives another image (the crop acts on scrambled
  # pixel positions there).
  assert not np.allclose(augment.resized_crop_flip(key, augment.permute_pixels(images, perm)),
                         got)


def test_resized_crop_flip_commutes_with_normalisation_and_keeps_a_constant_image():
  """Bilinear resizing and flipping commute with x -> (x - mean) / std, so the trainer may
  augment its normalised batch; a constant image (negative after normalisation) stays that
  constant whatever the crop: nothing pads or leaks zeros, with or without a permutation."""
  images = jnp.asarray(_images(seed=1), jnp.float32) / 255.0
  key = jax.random.key(3)
  mean, std = 0.131, 0.308
  np.testing.assert_allclose(augment.resized_crop_flip(key, (images - mean) / std),
                             (augment.resized_crop_flip(key, images) - mean) / std,
                             rtol=1e-5, atol=1e-5)
  constant = jnp.full((4, 28, 28, 1), -0.425, jnp.float32)
  perm = jnp.asarray(partition.client_permutation(3, seed=0, num_pixels=28 * 28))
  for p in (None, perm):
    np.testing.assert_allclose(augment.resized_crop_flip(key, constant, p), -0.425, rtol=1e-6)


def test_resized_crop_flip_mirrors_about_half_and_crops_8_to_100_percent():
  """On a left-to-right ramp (pixel value = column / 27) a crop keeps the ramp rising and a flip
  makes it fall; the ramp's rise across the output is the crop's width in columns / 27, from
  the widest crops (the whole width) to narrow ones (area 8%: about a third of the width)."""
  ramp = np.broadcast_to(np.arange(28, dtype=np.float32) / 27, (28, 28))
  batch = jnp.asarray(np.repeat(ramp[None, :, :, None], 400, axis=0))
  out = np.asarray(augment.resized_crop_flip(jax.random.key(0), batch))
  rise = out[:, 0, -1, 0] - out[:, 0, 0, 0]
  mirrored = np.mean(rise < 0)
  assert 0.4 < mirrored < 0.6, mirrored  # 400 fair coins: 4 standard deviations
  width = np.abs(rise)
  assert width.max() > 0.9 and width.min() < 0.35, (width.min(), width.max())
  # Rows of a ramp are all the same ramp after any crop and flip.
  np.testing.assert_allclose(out, np.broadcast_to(out[:, :1], out.shape), atol=1e-6)


def test_augmented_objective_sees_the_augmented_batch_and_none_is_the_objective():
  seen = {}

  def objective_for(group):
    del group

    def loss(params, batch_stats, images, labels, mask, rng, aux):
      seen["images"], seen["rng"] = images, rng
      return jnp.sum(images), (batch_stats, {})

    return loss

  assert fedavg_family.augmented_objective_for(objective_for, "none") is objective_for
  with pytest.raises(ValueError, match="augmentation must be one of"):
    fedavg_family.augmented_objective_for(objective_for, "mixup")
  loss = fedavg_family.augmented_objective_for(objective_for, "resized_crop_flip")(None)
  images = jnp.asarray(_images(), jnp.float32) / 255.0
  perm = jnp.asarray(partition.client_permutation(1, seed=0, num_pixels=28 * 28))
  rng = jax.random.key(11)
  for aux, p in (({"pixel_permutation": perm}, perm), ({}, None)):
    loss(None, None, images, None, None, rng, aux)
    want = augment.resized_crop_flip(jax.random.fold_in(rng, fedavg_family.AUGMENT_KEY_DATA),
                                     images, p)
    np.testing.assert_array_equal(seen["images"], want)
    assert seen["rng"] is rng  # the inner loss (its dropout) draws from the step's own key


def test_permuted_experiment_carries_each_clients_pixel_permutation():
  """The data of a pixel-permuted run hold, per slot, the permutation its stored images carry:
  unpermuted, they are the images of the same run without the permutation (the "permuted"
  partition is the IID split, permuted)."""
  def data_of(partition_name):
    config = mnist.get_config("fedavg_permuted_quick")
    config.scenario.dataset_source = "synthetic"
    config.scenario.partition = partition_name
    return experiment.Experiment(config).data.groups

  permuted, plain = data_of("permuted"), data_of("iid")
  (name, group), = permuted.items()
  assert plain[name].pixel_permutation is None
  perms = np.asarray(group.pixel_permutation)
  pixels = group.images.shape[2] * group.images.shape[3]  # the bundle's 32x32 MNIST images
  assert perms.shape == (group.images.shape[0], pixels)
  for slot in range(group.images.shape[0]):
    np.testing.assert_array_equal(perms[slot],
                                  partition.client_permutation(slot, seed=0, num_pixels=pixels))
    np.testing.assert_array_equal(
        augment.unpermute_pixels(jnp.asarray(group.images[slot]), jnp.asarray(perms[slot])),
        plain[name].images[slot])


def test_fedavg_round_with_augmentation_traces_once_and_trains_on_other_images():
  setup = tiny_setup(3)
  data, _, _ = tiny_data(setup)
  trained = {}
  for augmentation in ("none", "resized_crop_flip"):
    algorithm = fedavg.make_fedavg(tiny_config("fedavg", **{"fedavg.augmentation": augmentation}),
                            setup)
    state = algorithm.init(jax.random.key(0), data)
    chex.clear_trace_counter()  # the two settings' rounds share their code object
    round_fn = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
    for r in range(2):
      state, metrics = round_fn(state, data, jax.random.key(r + 1), jnp.int32(r))
    assert np.isfinite(float(metrics["server"]["cohort_rows"]))
    trained[augmentation] = state["server"]["params"]
  leaves = zip(jax.tree_util.tree_leaves(trained["none"]),
               jax.tree_util.tree_leaves(trained["resized_crop_flip"]))
  assert any(not np.allclose(a, b) for a, b in leaves)


def test_augmentation_field_rejects_other_values_in_one_line():
  config = base_config("fedfusion")
  assert config.fedavg.augmentation == "none"
  config.fedavg.augmentation = "mixup"
  with pytest.raises(ValueError, match=r"^config.fedavg.augmentation must be one of "
                                       r"\('none', 'resized_crop_flip'\)") as err:
    validate_config(config)
  assert len(str(err.value).splitlines()) == 1

"""Augmentation and normalisation (pure JAX): shapes, ranges, identities, keys, jit, vmap."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import data
from fedjax_het.data import augment


def _images(batch=6, seed=0):
  return jnp.asarray(np.random.default_rng(seed).random((batch, 32, 32, 3)), jnp.float32)


KEY = jax.random.key(0)

OPS = {
    "random_crop": augment.random_crop,
    "random_resized_crop": augment.random_resized_crop,
    "random_flip": augment.random_flip,
    "color_jitter": augment.color_jitter,
    "random_grayscale": augment.random_grayscale,
    "random_rotation": augment.random_rotation,
    "weak_pad": functools.partial(augment.weak_augment, crop="pad"),
    "weak_resized": functools.partial(augment.weak_augment, crop="resized"),
    "strong": augment.strong_augment,
    "strong_rotation": functools.partial(augment.strong_augment, kind="rotation"),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_shapes_dtype_and_range(name):
  images = _images()
  out = OPS[name](KEY, images)
  assert out.shape == images.shape and out.dtype == jnp.float32
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


@pytest.mark.parametrize("name", ["random_flip", "weak_pad"])
def test_single_image_and_uint8_inputs(name):
  images = _images()
  single = OPS[name](KEY, images[0])
  assert single.shape == (32, 32, 3) and single.dtype == jnp.float32
  # A single image is a batch of one.
  np.testing.assert_array_equal(single, OPS[name](KEY, images[:1])[0])
  # uint8 input is scaled to [0, 1] first.
  as_uint8 = (np.asarray(images) * 255).astype(np.uint8)
  np.testing.assert_allclose(OPS[name](KEY, as_uint8), OPS[name](KEY, as_uint8 / 255.0),
                             atol=1e-6)


def test_identity_when_disabled():
  images = _images()
  np.testing.assert_array_equal(augment.random_crop(KEY, images, padding=0), images)
  np.testing.assert_array_equal(augment.random_flip(KEY, images, p=0.0), images)
  np.testing.assert_array_equal(augment.color_jitter(KEY, images, p=0.0), images)
  np.testing.assert_array_equal(augment.random_grayscale(KEY, images, p=0.0), images)
  np.testing.assert_array_equal(augment.random_rotation(KEY, images, max_degrees=0.0), images)
  np.testing.assert_allclose(
      augment.random_resized_crop(KEY, images, scale=(1.0, 1.0), ratio=(1.0, 1.0)), images,
      atol=1e-6)
  # Jitter with zero strengths is the identity even when applied (HSV round trip).
  np.testing.assert_allclose(
      augment.color_jitter(KEY, images, brightness=0, contrast=0, saturation=0, hue=0, p=1.0),
      images, atol=1e-5)


def test_always_on_flip_and_grayscale():
  images = _images()
  np.testing.assert_array_equal(augment.random_flip(KEY, images, p=1.0), images[:, :, ::-1])
  grey = augment.random_grayscale(KEY, images, p=1.0)
  want = images @ jnp.asarray([0.299, 0.587, 0.114])
  np.testing.assert_allclose(grey[..., 1], want, rtol=1e-6)
  np.testing.assert_array_equal(grey[..., 0], grey[..., 2])


def test_random_crop_is_a_zero_padded_shift_and_keys_differ():
  image = _images(1)[0] + 0.1  # no zeros inside the image
  batch = jnp.broadcast_to(image, (16, 32, 32, 3))
  out = np.asarray(augment.random_crop(KEY, batch, padding=4))
  padded = np.pad(np.asarray(image), ((4, 4), (4, 4), (0, 0)))
  offsets = set()
  for crop in out:
    match = [(dy, dx) for dy in range(9) for dx in range(9)
             if np.array_equal(crop, padded[dy:dy + 32, dx:dx + 32])]
    assert len(match) == 1
    offsets.add(match[0])
  assert len(offsets) > 8  # per-example keys: examples get different crops
  other = augment.random_crop(jax.random.key(1), batch, padding=4)
  assert not np.array_equal(out, other)
  np.testing.assert_array_equal(out, augment.random_crop(KEY, batch, padding=4))


def test_resized_crop_changes_scale_and_keys_differ():
  images = _images(8)
  a = augment.random_resized_crop(jax.random.key(1), images)
  b = augment.random_resized_crop(jax.random.key(2), images)
  assert float(jnp.abs(a - b).mean()) > 0.01
  # Upsampled crops are smoother than the (white-noise) originals.
  def roughness(x):
    return float(jnp.abs(jnp.diff(x, axis=2)).mean())
  assert roughness(a) < roughness(images)


def test_color_jitter_and_rotation_change_images():
  images = _images()
  jittered = augment.color_jitter(KEY, images, p=1.0)
  assert float(jnp.abs(jittered - images).mean()) > 0.01
  rotated = augment.random_rotation(KEY, images, max_degrees=15.0)
  assert float(jnp.abs(rotated - images).mean()) > 0.01
  assert float(jnp.abs(augment.strong_augment(KEY, images)
                       - augment.weak_augment(KEY, images)).mean()) > 0.001


def test_jit_matches_eager():
  images = _images()
  for name in ("weak_pad", "strong"):
    eager = OPS[name](KEY, images)
    jitted = jax.jit(OPS[name])(KEY, images)
    np.testing.assert_allclose(jitted, eager, atol=1e-5)


def test_vmap_over_clients_uses_per_client_keys():
  clients = jnp.stack([_images(4, seed=s) for s in range(3)])  # (K, B, 32, 32, 3)
  keys = jax.random.split(KEY, 3)
  out = jax.jit(jax.vmap(augment.strong_augment))(keys, clients)
  assert out.shape == clients.shape
  for k in range(3):
    np.testing.assert_allclose(out[k], augment.strong_augment(keys[k], clients[k]), atol=1e-5)
  # Raw uint32 keys work too.
  raw = jax.random.split(jax.random.PRNGKey(0), 3)
  assert jax.vmap(augment.weak_augment)(raw, clients).shape == clients.shape


def test_normalize():
  uint8 = np.full((2, 32, 32, 3), 255, np.uint8)
  out = data.normalize(uint8, data.IMAGENET_MEAN, data.IMAGENET_STD)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out[0, 0, 0], (1 - np.array(data.IMAGENET_MEAN))
                             / np.array(data.IMAGENET_STD), rtol=1e-6)
  floats = jnp.full((32, 32, 3), 0.5)
  np.testing.assert_allclose(data.normalize(floats, data.CIFAR100_MEAN, data.CIFAR100_STD)[3, 4],
                             (0.5 - np.array(data.CIFAR100_MEAN)) / np.array(data.CIFAR100_STD),
                             rtol=1e-5, atol=1e-6)
  assert jax.jit(data.normalize)(uint8).shape == uint8.shape
  with pytest.raises(ValueError, match="one per channel"):
    data.normalize(uint8, (0.5,), (0.5,))


def test_invalid_arguments():
  with pytest.raises(ValueError, match="`p` must be in"):
    augment.random_flip(KEY, _images(), p=1.5)
  with pytest.raises(ValueError, match="`images` must have shape"):
    augment.random_flip(KEY, jnp.zeros((32, 32)))
  with pytest.raises(ValueError, match="`crop` must be one of"):
    augment.weak_augment(KEY, _images(), crop="center")
  with pytest.raises(ValueError, match="`kind`"):
    augment.strong_augment(KEY, _images(), kind="blur")
  with pytest.raises(ValueError, match="`hue`"):
    augment.color_jitter(KEY, _images(), hue=0.7)

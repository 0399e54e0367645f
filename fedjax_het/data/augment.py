"""Image augmentation and normalisation in pure JAX (jit-able, vmappable).

Conventions:
  * Images are float in [0, 1], shape (B, 32, 32, 3) or a single (32, 32, 3)
    (treated as a batch of one). uint8 inputs are accepted and scaled by
    1/255. Outputs are float32 in [0, 1] (before `normalize`).
  * Every random op takes ONE key for the whole batch and splits it into one
    key per example internally (`jax.random.split(key, B)`), so each example
    gets its own crop, flip, jitter, ... . To augment several clients at once,
    `jax.vmap` over a leading client axis with one key per client:
    `jax.vmap(weak_augment)(jax.random.split(key, K), images_kbhwc)`.
  * Semantics follow torchvision (the references' code), noted per function.
  * The ops are `jax.jit`-compiled with their keyword hyper-parameters static
    (one compilation per input shape and setting); they trace cleanly inside
    a caller's own `jit` / `vmap` / `scan`.

The FCCL+ public-data pipelines (FCCL+ Sec. 4.1; the authors' code):
  * weak: RandomCrop(32, padding=4) + RandomHorizontalFlip (the code); the
    paper text says RandomResizedCrop(scale=(0.2, 1)) instead: `crop="resized"`.
  * strong: weak + ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8 +
    RandomGrayscale(p=0.2). The code's Fashion-MNIST public set uses
    RandomRotation(15) instead of the colour ops: `kind="rotation"`.
Normalisation: private data with ImageNet statistics, public data with the
CIFAR-100 statistics the FCCL code uses for CIFAR-100 and Tiny-ImageNet (its
Fashion-MNIST public set uses the ImageNet ones).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The CIFAR-100 statistics of the FCCL code's public-data transforms.
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
#: Tiny-ImageNet's statistics, as the FCCL+ code writes them (its public CIFAR-100 uses them).
TINYIMAGENET_MEAN = (0.4802, 0.4480, 0.3975)
TINYIMAGENET_STD = (0.2770, 0.2691, 0.2821)

_GREY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision / PIL


def _as_float(images: jax.Array) -> jax.Array:
  images = jnp.asarray(images)
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 255.0
  return images.astype(jnp.float32)


def _batched(fn_name: str, per_image: Callable[[jax.Array, jax.Array], jax.Array]
             ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Lifts a (key, image HWC) function to (key, images BHWC or HWC)."""

  def apply(key: jax.Array, images: jax.Array) -> jax.Array:
    images = _as_float(images)
    if images.ndim == 3:
      return apply(key, images[None])[0]
    if images.ndim != 4:
      raise ValueError(f"{fn_name}: `images` must have shape (B, H, W, C) or (H, W, C), got "
                       f"{images.shape}.")
    keys = jax.random.split(key, images.shape[0])
    return jax.vmap(per_image)(keys, images)

  return apply


def _check_probability(fn_name: str, name: str, p: float) -> None:
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"{fn_name}: `{name}` must be in [0, 1], got {p!r}.")


# ----------------------------------------------------------------------------
# Geometric ops.
# ----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=('padding',))
def random_crop(key: jax.Array, images: jax.Array, *, padding: int = 4) -> jax.Array:
  """torchvision RandomCrop(size, padding): zero-pad, then a uniformly random crop.

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, C) or (H, W, C).
    padding: zero padding on each side (0 = identity).

  Returns:
    float32 images of the input shape.
  """
  if padding < 0:
    raise ValueError(f"random_crop: `padding` must be >= 0, got {padding!r}.")

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    if padding == 0:
      return image
    h, w, c = image.shape
    padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)))
    ky, kx = jax.random.split(k)
    top = jax.random.randint(ky, (), 0, 2 * padding + 1)
    left = jax.random.randint(kx, (), 0, 2 * padding + 1)
    return jax.lax.dynamic_slice(padded, (top, left, 0), (h, w, c))

  return _batched("random_crop", one)(key, images)


def _bilinear_sample(image: jax.Array, ys: jax.Array, xs: jax.Array, *, order: int,
                     mode: str) -> jax.Array:
  """Samples image (H, W, C) at pixel-index coordinates ys, xs (H', W')."""
  channels = [jax.scipy.ndimage.map_coordinates(image[..., c], [ys, xs], order=order, mode=mode,
                                                cval=0.0)
              for c in range(image.shape[-1])]
  return jnp.stack(channels, axis=-1)


@functools.partial(jax.jit, static_argnames=('scale', 'ratio'))
def random_resized_crop(key: jax.Array, images: jax.Array, *,
                        scale: tuple[float, float] = (0.2, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> jax.Array:
  """torchvision RandomResizedCrop(32, scale, ratio) with bilinear resizing.

  Like torchvision: up to 10 attempts draw an area fraction from `scale` and
  a log-uniform aspect ratio from `ratio`; the first crop that fits is taken
  at a uniformly random integer position; if none fits, the whole image
  (ratio clamped) is used. The crop is resized back to the input size with
  bilinear interpolation (half-pixel centres, edge clamping); crops are never
  larger than the image, so no antialiasing is involved.

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, C) or (H, W, C).
    scale: range of the crop area as a fraction of the image area.
    ratio: range of the crop aspect ratio (width / height).

  Returns:
    float32 images of the input shape.
  """
  if not 0 < scale[0] <= scale[1] <= 1:
    raise ValueError(f"random_resized_crop: `scale` must satisfy 0 < lo <= hi <= 1, got {scale}.")
  if not 0 < ratio[0] <= ratio[1]:
    raise ValueError(f"random_resized_crop: `ratio` must satisfy 0 < lo <= hi, got {ratio}.")

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    h, w, _ = image.shape
    area = h * w
    k_area, k_ratio, k_top, k_left = jax.random.split(k, 4)
    attempts = 10
    target = area * jax.random.uniform(k_area, (attempts,), minval=scale[0], maxval=scale[1])
    log_r = jax.random.uniform(k_ratio, (attempts,), minval=math.log(ratio[0]),
                               maxval=math.log(ratio[1]))
    aspect = jnp.exp(log_r)
    cw = jnp.round(jnp.sqrt(target * aspect))
    ch = jnp.round(jnp.sqrt(target / aspect))
    fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = jnp.argmax(fits)
    any_fit = jnp.any(fits)
    # Fallback: whole image with the ratio clamped into `ratio` (torchvision).
    in_ratio = w / h
    fb_w = jnp.where(in_ratio < ratio[0], w, jnp.where(in_ratio > ratio[1], round(h * ratio[1]), w))
    fb_h = jnp.where(in_ratio < ratio[0], round(w / ratio[0]), h)
    crop_w = jnp.where(any_fit, cw[first], fb_w).astype(jnp.float32)
    crop_h = jnp.where(any_fit, ch[first], fb_h).astype(jnp.float32)
    top = jnp.where(any_fit, jnp.floor(jax.random.uniform(k_top) * (h - crop_h + 1)),
                    jnp.floor((h - crop_h) / 2))
    left = jnp.where(any_fit, jnp.floor(jax.random.uniform(k_left) * (w - crop_w + 1)),
                     jnp.floor((w - crop_w) / 2))
    rows = (jnp.arange(h, dtype=jnp.float32) + 0.5) * (crop_h / h) - 0.5 + top
    cols = (jnp.arange(w, dtype=jnp.float32) + 0.5) * (crop_w / w) - 0.5 + left
    rows = jnp.clip(rows, top, top + crop_h - 1)
    cols = jnp.clip(cols, left, left + crop_w - 1)
    ys, xs = jnp.meshgrid(rows, cols, indexing="ij")
    return _bilinear_sample(image, ys, xs, order=1, mode="nearest")

  return _batched("random_resized_crop", one)(key, images)


@functools.partial(jax.jit, static_argnames=('p',))
def random_flip(key: jax.Array, images: jax.Array, *, p: float = 0.5) -> jax.Array:
  """torchvision RandomHorizontalFlip(p): mirror left-right with probability p."""
  _check_probability("random_flip", "p", p)

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    return jnp.where(jax.random.bernoulli(k, p), image[:, ::-1, :], image)

  return _batched("random_flip", one)(key, images)


def permute_pixels(images: jax.Array, permutation: jax.Array) -> jax.Array:
  """(B, H, W, C) images with their pixel positions taken in `permutation`'s order ((H * W,)
  ints): the JAX form of `data.partition.permuted_pixels` (every channel of a pixel moves
  together)."""
  b, h, w, c = images.shape
  return images.reshape(b, h * w, c)[:, permutation].reshape(b, h, w, c)


def unpermute_pixels(images: jax.Array, permutation: jax.Array) -> jax.Array:
  """The inverse of `permute_pixels`: `unpermute_pixels(permute_pixels(x, p), p) == x`."""
  b, h, w, c = images.shape
  flat = images.reshape(b, h * w, c)
  return jnp.zeros_like(flat).at[:, permutation].set(flat).reshape(b, h, w, c)


#: torchvision RandomResizedCrop's default area range: the FedFusion MNIST script's crop.
RESIZED_CROP_FLIP_SCALE = (0.08, 1.0)


def resized_crop_flip(key: jax.Array, images: jax.Array,
                      permutation: jax.Array | None = None) -> jax.Array:
  """RandomResizedCrop(size of the image) then RandomHorizontalFlip(0.5), on the unpermuted image.

  The training transform of the FedFusion authors' permuted-MNIST script (thu-media/FedFusion,
  `data/mnist_data.py`: RandomResizedCrop(28) with torchvision's default scale (0.08, 1) and
  ratio (3/4, 4/3), a horizontal flip, ToTensor, Normalize; the client's pixel permutation is
  applied after the transform). Given the `permutation` the stored images carry
  (`permute_pixels`), the images are unpermuted, cropped and flipped, and permuted again, so
  the crop and flip act on the digit's own geometry as the script's do. The crop's bilinear
  resize and the flip commute with the per-channel affine normalisation, so `images` may be
  normalised already.

  Args:
    key: one PRNG key for the batch (split per image).
    images: (B, H, W, C) float (or uint8, scaled by 1/255).
    permutation: (H * W,) ints, or None for images that are not permuted.

  Returns:
    float32 images of the same shape, permuted as the input.
  """
  images = _as_float(images)
  if permutation is not None:
    images = unpermute_pixels(images, permutation)
  k_crop, k_flip = jax.random.split(key)
  out = random_flip(k_flip, random_resized_crop(k_crop, images, scale=RESIZED_CROP_FLIP_SCALE))
  return out if permutation is None else permute_pixels(out, permutation)


@functools.partial(jax.jit, static_argnames=('max_degrees', 'interpolation'))
def random_rotation(key: jax.Array, images: jax.Array, *, max_degrees: float = 15.0,
                    interpolation: str = "nearest") -> jax.Array:
  """torchvision RandomRotation(max_degrees): rotate about the centre, fill 0.

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, C) or (H, W, C).
    max_degrees: angle drawn uniformly from [-max_degrees, max_degrees]; 0 is
      the identity.
    interpolation: "nearest" (torchvision's default) or "bilinear".

  Returns:
    float32 images of the input shape; uncovered corners are 0.
  """
  if max_degrees < 0:
    raise ValueError(f"random_rotation: `max_degrees` must be >= 0, got {max_degrees!r}.")
  if interpolation not in ("nearest", "bilinear"):
    raise ValueError("random_rotation: `interpolation` must be 'nearest' or 'bilinear', got "
                     f"{interpolation!r}.")
  order = 0 if interpolation == "nearest" else 1

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    h, w, _ = image.shape
    theta = jnp.deg2rad(jax.random.uniform(k, minval=-max_degrees, maxval=max_degrees))
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    yy, xx = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32),
                          indexing="ij")
    # Inverse mapping: output pixel -> source pixel (rotation by -theta).
    c, s = jnp.cos(theta), jnp.sin(theta)
    src_x = c * (xx - cx) - s * (yy - cy) + cx
    src_y = s * (xx - cx) + c * (yy - cy) + cy
    if order == 0:
      src_x, src_y = jnp.round(src_x), jnp.round(src_y)
    return _bilinear_sample(image, src_y, src_x, order=order, mode="constant")

  return _batched("random_rotation", one)(key, images)


# ----------------------------------------------------------------------------
# Colour ops.
# ----------------------------------------------------------------------------


def _grey(image: jax.Array) -> jax.Array:
  """(H, W, 3) -> (H, W, 1) luma."""
  weights = jnp.asarray(_GREY_WEIGHTS, dtype=image.dtype).reshape(1, 1, 3)
  return jnp.sum(image * weights, axis=-1, keepdims=True)


def _blend(a: jax.Array, b: jax.Array, factor: jax.Array) -> jax.Array:
  return jnp.clip(factor * a + (1.0 - factor) * b, 0.0, 1.0)


def _rgb_to_hsv(image: jax.Array) -> jax.Array:
  r, g, b = image[..., 0], image[..., 1], image[..., 2]
  maxc = jnp.max(image, axis=-1)
  minc = jnp.min(image, axis=-1)
  v = maxc
  delta = maxc - minc
  s = jnp.where(maxc > 0, delta / jnp.where(maxc > 0, maxc, 1.0), 0.0)
  safe = jnp.where(delta > 0, delta, 1.0)
  rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
  h = jnp.where(maxc == r, bc - gc, jnp.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
  h = jnp.where(delta > 0, (h / 6.0) % 1.0, 0.0)
  return jnp.stack([h, s, v], axis=-1)


def _hsv_to_rgb(hsv: jax.Array) -> jax.Array:
  h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
  i = jnp.floor(h * 6.0)
  f = h * 6.0 - i
  i = i.astype(jnp.int32) % 6
  p, q, t = v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f))
  r = jnp.select([i == 0, i == 1, i == 2, i == 3, i == 4], [v, q, p, p, t], v)
  g = jnp.select([i == 0, i == 1, i == 2, i == 3, i == 4], [t, v, v, q, p], p)
  b = jnp.select([i == 0, i == 1, i == 2, i == 3, i == 4], [p, p, t, v, v], q)
  return jnp.stack([r, g, b], axis=-1)


def _adjust_brightness(image: jax.Array, factor: jax.Array) -> jax.Array:
  return jnp.clip(image * factor, 0.0, 1.0)


def _adjust_contrast(image: jax.Array, factor: jax.Array) -> jax.Array:
  return _blend(image, jnp.mean(_grey(image)), factor)


def _adjust_saturation(image: jax.Array, factor: jax.Array) -> jax.Array:
  return _blend(image, jnp.broadcast_to(_grey(image), image.shape), factor)


def _adjust_hue(image: jax.Array, shift: jax.Array) -> jax.Array:
  hsv = _rgb_to_hsv(image)
  hue = (hsv[..., 0] + shift) % 1.0
  return _hsv_to_rgb(jnp.stack([hue, hsv[..., 1], hsv[..., 2]], axis=-1))


@functools.partial(jax.jit, static_argnames=('brightness', 'contrast', 'saturation', 'hue', 'p'))
def color_jitter(key: jax.Array, images: jax.Array, *, brightness: float = 0.4,
                 contrast: float = 0.4, saturation: float = 0.4, hue: float = 0.1,
                 p: float = 0.8) -> jax.Array:
  """RandomApply([ColorJitter(brightness, contrast, saturation, hue)], p) of torchvision.

  With probability p, an example gets brightness, contrast and saturation
  factors drawn from [1 - x, 1 + x] and a hue shift from [-hue, hue] (in
  turns of the colour wheel), applied in a random order, each clipped to
  [0, 1]; contrast blends with the mean grey level, saturation with the grey
  image, hue rotates H in HSV space.

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, 3) or (H, W, 3).
    brightness, contrast, saturation: jitter strengths in [0, 1].
    hue: jitter strength in [0, 0.5].
    p: probability of applying the jitter to an example.

  Returns:
    float32 images in [0, 1].
  """
  for name, value in (("brightness", brightness), ("contrast", contrast),
                      ("saturation", saturation)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"color_jitter: `{name}` must be in [0, 1], got {value!r}.")
  if not 0.0 <= hue <= 0.5:
    raise ValueError(f"color_jitter: `hue` must be in [0, 0.5], got {hue!r}.")
  _check_probability("color_jitter", "p", p)

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    k_apply, k_order, kb, kc, ks, kh = jax.random.split(k, 6)
    factors = (jax.random.uniform(kb, minval=1 - brightness, maxval=1 + brightness),
               jax.random.uniform(kc, minval=1 - contrast, maxval=1 + contrast),
               jax.random.uniform(ks, minval=1 - saturation, maxval=1 + saturation),
               jax.random.uniform(kh, minval=-hue, maxval=hue))
    branches = (lambda x: _adjust_brightness(x, factors[0]),
                lambda x: _adjust_contrast(x, factors[1]),
                lambda x: _adjust_saturation(x, factors[2]),
                lambda x: _adjust_hue(x, factors[3]))
    order = jax.random.permutation(k_order, 4)
    # One traced copy of each adjustment: a loop over the 4 steps, each
    # step switching on the random order.
    out = jax.lax.fori_loop(0, 4, lambda step, x: jax.lax.switch(order[step], branches, x), image)
    return jnp.where(jax.random.bernoulli(k_apply, p), out, image)

  return _batched("color_jitter", one)(key, images)


@functools.partial(jax.jit, static_argnames=('p',))
def random_grayscale(key: jax.Array, images: jax.Array, *, p: float = 0.2) -> jax.Array:
  """torchvision RandomGrayscale(p): luma repeated to 3 channels with probability p."""
  _check_probability("random_grayscale", "p", p)

  def one(k: jax.Array, image: jax.Array) -> jax.Array:
    grey = jnp.broadcast_to(_grey(image), image.shape)
    return jnp.where(jax.random.bernoulli(k, p), grey, image)

  return _batched("random_grayscale", one)(key, images)


# ----------------------------------------------------------------------------
# Pipelines and normalisation.
# ----------------------------------------------------------------------------

_CROPS = ("pad", "resized", "none")


def _crop(key: jax.Array, images: jax.Array, crop: str) -> jax.Array:
  if crop == "pad":
    return random_crop(key, images, padding=4)
  if crop == "resized":
    return random_resized_crop(key, images, scale=(0.2, 1.0))
  if crop == "none":
    return _as_float(images)
  raise ValueError(f"`crop` must be one of {_CROPS}, got {crop!r}.")


@functools.partial(jax.jit, static_argnames=('crop',))
def weak_augment(key: jax.Array, images: jax.Array, *, crop: str = "pad") -> jax.Array:
  """FCCL+ weak public-data augmentation: random crop + horizontal flip.

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, C) or (H, W, C), float in [0, 1] or uint8.
    crop: "pad" = RandomCrop(32, padding=4) (the authors' code, default),
      "resized" = RandomResizedCrop(32, scale=(0.2, 1)) (the paper text),
      "none" = no crop.

  Returns:
    float32 images in [0, 1].
  """
  k_crop, k_flip = jax.random.split(key)
  return random_flip(k_flip, _crop(k_crop, images, crop))


@functools.partial(jax.jit, static_argnames=('crop', 'kind'))
def strong_augment(key: jax.Array, images: jax.Array, *, crop: str = "pad",
                   kind: str = "color") -> jax.Array:
  """FCCL+ strong public-data augmentation.

  kind="color" (default; CIFAR-100 / Tiny-ImageNet in the code, and the
  paper): weak + ColorJitter(0.4, 0.4, 0.4, 0.1) applied with p=0.8 +
  RandomGrayscale(p=0.2).
  kind="rotation" (the code's Fashion-MNIST public set): weak +
  RandomRotation(15).

  Args:
    key: one PRNG key for the batch.
    images: (B, H, W, C) or (H, W, C), float in [0, 1] or uint8.
    crop: as in `weak_augment`.
    kind: "color" or "rotation".

  Returns:
    float32 images in [0, 1].
  """
  if kind not in ("color", "rotation"):
    raise ValueError(f"strong_augment: `kind` must be 'color' or 'rotation', got {kind!r}.")
  k_weak, k_a, k_b = jax.random.split(key, 3)
  out = weak_augment(k_weak, images, crop=crop)
  if kind == "rotation":
    return random_rotation(k_a, out, max_degrees=15.0)
  out = color_jitter(k_a, out, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=0.8)
  return random_grayscale(k_b, out, p=0.2)


def normalize(images: jax.Array, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD) -> jax.Array:
  """(images - mean) / std per channel, float32.

  Args:
    images: (..., C) uint8 (scaled by 1/255 first) or float in [0, 1].
    mean, std: per-channel statistics (length C), e.g. IMAGENET_MEAN /
      IMAGENET_STD for private data, CIFAR100_MEAN / CIFAR100_STD for the
      public set.

  Returns:
    float32 array of the input shape.
  """
  x = _as_float(images)
  if len(mean) != x.shape[-1] or len(std) != x.shape[-1]:
    raise ValueError(f"normalize: `mean` and `std` need {x.shape[-1]} values (one per "
                     f"channel), got {len(mean)} and {len(std)}.")
  if any(s <= 0 for s in std):
    raise ValueError(f"normalize: `std` must be positive, got {tuple(std)}.")
  shape = (1,) * (x.ndim - 1) + (x.shape[-1],)
  m = jnp.asarray(mean, dtype=jnp.float32).reshape(shape)
  s = jnp.asarray(std, dtype=jnp.float32).reshape(shape)
  return (x - m) / s


def normalizer(mean: Sequence[float], std: Sequence[float]) -> Callable[[jax.Array], jax.Array]:
  """`normalize` with fixed statistics: uint8 or [0, 1] float images -> float32."""
  mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
  return lambda images: normalize(images, mean, std)

"""Image-quality metrics for reconstructions: PSNR and SSIM.

`ssim` follows scikit-image's `structural_similarity(a, b, data_range=R,
channel_axis=-1, gaussian_weights=True, sigma=1.5, use_sample_covariance=False)`
(the setting of Wang et al. 2004): local statistics under an 11x11 Gaussian
window (sigma 1.5, truncated at 3.5 sigma, weights summing to 1), K1 = 0.01,
K2 = 0.03, the SSIM map averaged over the pixels at least 5 from the border
(scikit-image filters with reflect padding and then crops 5 pixels, so the
padded values never reach the average: the mean of the "valid" filtering
equals scikit-image's), per channel, then the mean over channels.

Both functions take images (..., H, W, C) (any leading batch axes) and return
one value per image; they compute in float32 (scikit-image: float64). SSIM
subtracts each image's per-channel mean before the second moments, so the
local variance E[x^2] - E[x]^2 does not cancel catastrophically (e.g. for
uint8-range data); agreement with the float64 computation is ~1e-5.

Reference:
  Z. Wang, A. C. Bovik, H. R. Sheikh, E. P. Simoncelli. Image quality
    assessment: from error visibility to structural similarity. IEEE TIP 2004.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

#: Gaussian window of `ssim`: sigma, truncation (scipy's default 4.0 is not used:
#: scikit-image passes truncate=3.5), giving radius 5 and an 11x11 window.
SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _check_pair(fn: str, a: jax.Array, b: jax.Array, data_range: float) -> None:
  if jnp.shape(a) != jnp.shape(b) or jnp.ndim(a) < 3:
    raise ValueError(f"{fn}: `a` and `b` must have the same shape (..., H, W, C), got "
                     f"{jnp.shape(a)} and {jnp.shape(b)}.")
  try:
    value = float(data_range)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"{fn}: `data_range` must be finite and > 0, got {data_range!r}.")


def psnr(a: jax.Array, b: jax.Array, *, data_range: float) -> jax.Array:
  """Peak signal-to-noise ratio 10 log10(data_range^2 / MSE) in dB.

  Args:
    a, b: images (..., H, W, C) of the same shape (any dtype; compared as
      float32).
    data_range: the span of the pixel values (1.0 for [0, 1] images, 255 for
      uint8).

  Returns:
    (...) PSNR per image; +inf for identical images.
  """
  _check_pair("psnr", a, b, data_range)
  diff = jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32)
  mse = jnp.mean(jnp.square(diff), axis=(-3, -2, -1))
  return 10.0 * jnp.log10(jnp.asarray(data_range, jnp.float32) ** 2 / mse)


def gaussian_window(sigma: float = SSIM_SIGMA, truncate: float = SSIM_TRUNCATE) -> np.ndarray:
  """1-D Gaussian weights of radius int(truncate * sigma + 0.5), summing to 1 (scipy's)."""
  radius = int(truncate * sigma + 0.5)
  x = np.arange(-radius, radius + 1, dtype=np.float64)
  w = np.exp(-0.5 * (x / sigma) ** 2)
  return (w / w.sum()).astype(np.float32)


def _filter_valid(x: jax.Array, w: np.ndarray) -> jax.Array:
  """Separable filtering of (..., H, W, C) over H and W, 'valid' region only."""
  k = len(w)
  h, wd = x.shape[-3], x.shape[-2]
  rows = sum(float(w[i]) * x[..., i:h - k + 1 + i, :, :] for i in range(k))
  return sum(float(w[i]) * rows[..., :, i:wd - k + 1 + i, :] for i in range(k))


def ssim(a: jax.Array, b: jax.Array, *, data_range: float) -> jax.Array:
  """Mean structural similarity (Gaussian-weighted, as scikit-image; see module doc).

  Args:
    a, b: images (..., H, W, C), H and W >= 11.
    data_range: the span of the pixel values (1.0 for [0, 1] images, 255 for
      uint8); C1 = (K1 * data_range)^2, C2 = (K2 * data_range)^2.

  Returns:
    (...) SSIM per image (1 for identical images).
  """
  _check_pair("ssim", a, b, data_range)
  w = gaussian_window()
  if min(jnp.shape(a)[-3:-1]) < len(w):
    raise ValueError(f"ssim: images must be at least {len(w)}x{len(w)} (the Gaussian "
                     f"window), got {tuple(jnp.shape(a)[-3:-1])}.")
  a = jnp.asarray(a, jnp.float32)
  b = jnp.asarray(b, jnp.float32)
  # Second moments of the values centred on each image's channel mean: the
  # local (co)variances are shift invariant and cancel far less in float32.
  offset_a = jnp.mean(a, axis=(-3, -2), keepdims=True)
  offset_b = jnp.mean(b, axis=(-3, -2), keepdims=True)
  a0, b0 = a - offset_a, b - offset_b
  mu_a, mu_b = _filter_valid(a0, w), _filter_valid(b0, w)
  var_a = _filter_valid(a0 * a0, w) - mu_a * mu_a
  var_b = _filter_valid(b0 * b0, w) - mu_b * mu_b
  cov = _filter_valid(a0 * b0, w) - mu_a * mu_b
  mu_a, mu_b = mu_a + offset_a, mu_b + offset_b
  rng = jnp.asarray(data_range, jnp.float32)
  c1, c2 = (SSIM_K1 * rng) ** 2, (SSIM_K2 * rng) ** 2
  s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)
       / ((mu_a * mu_a + mu_b * mu_b + c1) * (var_a + var_b + c2)))
  return jnp.mean(s, axis=(-3, -2, -1))

"""NumPy image operations shared by the loaders and the synthetic generators.

Everything here is deterministic NumPy (float64/float32 arithmetic, no
threads, no optional packages), so the synthetic data does not depend on what
else is installed.
"""

from __future__ import annotations

import numpy as np


def _resize_weights(in_size: int, out_size: int) -> np.ndarray:
  """(out_size, in_size) weights of PIL's BILINEAR resampling along one axis.

  PIL (and therefore torchvision's `Resize` on PIL images) samples with a
  triangle filter on half-pixel centres; when shrinking, the filter support is
  stretched by the scale factor (antialiasing). When enlarging, this is plain
  bilinear interpolation with half-pixel centres (align_corners=False); at
  the borders the normalisation puts all weight on the edge pixel.
  """
  scale = in_size / out_size
  support = max(scale, 1.0)
  centres = (np.arange(out_size) + 0.5) * scale
  positions = np.arange(in_size) + 0.5
  weights = np.maximum(0.0, 1.0 - np.abs(positions[None, :] - centres[:, None]) / support)
  weights /= weights.sum(axis=1, keepdims=True)
  return weights


def resize_bilinear(images: np.ndarray, height: int, width: int) -> np.ndarray:
  """Resizes (N, H, W, C) images like PIL BILINEAR; returns float64.

  Args:
    images: array (N, H, W, C), any real dtype.
    height, width: output size.

  Returns:
    float64 array (N, height, width, C) in the input's value range (not rounded).
  """
  images = np.asarray(images, dtype=np.float64)
  n, h, w, c = images.shape
  wy = _resize_weights(h, height)
  wx = _resize_weights(w, width)
  out = np.matmul(wy, images.reshape(n, h, w * c)).reshape(n, height, w, c)
  out = np.matmul(out.transpose(0, 1, 3, 2), wx.T)  # (n, height, c, width)
  return np.ascontiguousarray(out.transpose(0, 1, 3, 2))


_PIL_PRECISION_BITS = 22  # 32 - 8 - 2, as in Pillow's Resample.c


def _pil_fixed_point_weights(in_size: int, out_size: int) -> np.ndarray:
  """The integer filter coefficients Pillow uses for 8-bit BILINEAR resampling."""
  scale = in_size / out_size
  support = max(scale, 1.0)
  weights = np.zeros((out_size, in_size))
  for out in range(out_size):
    centre = (out + 0.5) * scale
    lo = max(int(centre - support + 0.5), 0)
    hi = min(int(centre + support + 0.5), in_size)
    taps = np.arange(lo, hi)
    w = np.maximum(0.0, 1.0 - np.abs((taps - centre + 0.5) / support))
    total = w.sum()
    if total != 0.0:
      w = w / total
    weights[out, lo:hi] = w
  scaled = weights * (1 << _PIL_PRECISION_BITS)
  return np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)


def _pil_pass(images: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
  acc = np.tensordot(images.astype(np.int64), weights, axes=([axis], [1]))
  acc = np.moveaxis(acc, -1, axis) + (1 << (_PIL_PRECISION_BITS - 1))
  return np.clip(acc >> _PIL_PRECISION_BITS, 0, 255).astype(np.uint8)


def resize_uint8_like_pil(images: np.ndarray, height: int, width: int) -> np.ndarray:
  """Pillow's `Image.resize((width, height), Image.BILINEAR)` on uint8 images.

  Reproduces Pillow's fixed-point arithmetic (22-bit coefficients, rounding
  and clipping to 8 bits after each pass), i.e. what
  `torchvision.transforms.Resize((32, 32))` does to PIL images, the conversion
  the offline bundle used. Bit-exact (checked against Pillow 13) for square
  inputs and single-axis resizes; for non-square inputs that need both passes
  Pillow sometimes runs the vertical pass first, and values can then differ
  by 1 at some pixels (this function always runs the horizontal pass first).

  Args:
    images: uint8 (N, H, W, C).
    height, width: output size.

  Returns:
    uint8 (N, height, width, C).
  """
  images = np.asarray(images, dtype=np.uint8)
  if images.shape[2] != width:
    images = _pil_pass(images, _pil_fixed_point_weights(images.shape[2], width), axis=2)
  if images.shape[1] != height:
    images = _pil_pass(images, _pil_fixed_point_weights(images.shape[1], height), axis=1)
  return images


def area_downsample(images: np.ndarray, factor: int, chunk: int = 4096) -> np.ndarray:
  """Shrinks uint8 (N, H, W, C) images by an integer `factor` with an area (box) filter.

  Each output pixel is the mean of a `factor` x `factor` block, rounded half
  up: (sum + factor**2 // 2) // factor**2, which is Pillow's
  `Image.reduce(factor)` bit for bit (checked against Pillow 13); the mean
  before rounding is `torch.nn.functional.interpolate(mode="area")`.
  Processed `chunk` images at a time, so the intermediate sums stay small
  beside the input.

  Args:
    images: uint8 (N, H, W, C) with H and W multiples of `factor`.
    factor: integer >= 1 (1 returns the images unchanged).
    chunk: images per block of work.

  Returns:
    uint8 (N, H // factor, W // factor, C).
  """
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.ndim != 4:
    raise ValueError(f"area_downsample: expected uint8 (N, H, W, C), got {images.dtype} "
                     f"{images.shape}.")
  n, h, w, c = images.shape
  if factor < 1 or h % factor or w % factor:
    raise ValueError(f"area_downsample: `factor` must be an integer >= 1 dividing the image size "
                     f"{h}x{w}, got {factor!r}.")
  if factor == 1:
    return images
  out = np.empty((n, h // factor, w // factor, c), np.uint8)
  area = factor * factor
  dtype = np.uint16 if area <= 256 else np.uint32  # 256 * 255 + 128 fits in uint16
  for start in range(0, n, chunk):
    block = images[start:start + chunk]
    sums = np.full(block[:, ::factor, ::factor].shape, area // 2, dtype)
    for i in range(factor):
      for j in range(factor):
        sums += block[:, i::factor, j::factor]
    out[start:start + chunk] = sums // area
  return out


def to_uint8(images: np.ndarray) -> np.ndarray:
  """Rounds float images in [0, 255] to uint8 (clipping out-of-range values)."""
  return np.clip(np.rint(images), 0, 255).astype(np.uint8)


def to_rgb32(images: np.ndarray) -> np.ndarray:
  """Converts uint8 (N, H, W), (N, H, W, 1) or (N, H, W, 3/4) to uint8 (N, 32, 32, 3).

  Grey images are repeated to three channels (after resizing, which commutes),
  an alpha channel is dropped, and sizes other than 32x32 are resized with
  Pillow's BILINEAR resampling (bit-exact, `resize_uint8_like_pil`).
  """
  images = np.asarray(images)
  if images.ndim == 3:
    images = images[..., None]
  if images.ndim != 4 or images.shape[-1] not in (1, 3, 4):
    raise ValueError(f"to_rgb32: expected images (N, H, W[, 1|3|4]), got shape {images.shape}")
  images = images[..., :3].astype(np.uint8, copy=False)
  if images.shape[1:3] != (32, 32):
    images = resize_uint8_like_pil(images, 32, 32)
  if images.shape[-1] == 1:
    images = np.repeat(images, 3, axis=-1)
  return np.ascontiguousarray(images, dtype=np.uint8)


def _reflect_index(i: np.ndarray, size: int) -> np.ndarray:
  """numpy.pad(mode="reflect") index mapping (edge pixel not repeated)."""
  period = 2 * (size - 1)
  i = np.abs(i) % period
  return np.where(i >= size, period - i, i)


def gaussian_blur(images: np.ndarray, sigma: np.ndarray, radius: int = 3) -> np.ndarray:
  """Separable Gaussian blur with a per-image sigma and reflected borders.

  Implemented as two batched matrix products with per-image (H, H) and
  (W, W) blur matrices.

  Args:
    images: float array (N, H, W, C).
    sigma: (N,) standard deviations in pixels; 0 leaves an image unchanged.
    radius: kernel half-width (taps = 2 * radius + 1).

  Returns:
    Blurred float array of the same shape and dtype.
  """
  sigma = np.asarray(sigma, dtype=np.float64)
  n, h, w, c = images.shape
  offsets = np.arange(-radius, radius + 1, dtype=np.float64)
  safe = np.maximum(sigma, 1e-6)[:, None]
  kernel = np.exp(-0.5 * (offsets[None, :] / safe) ** 2)
  kernel /= kernel.sum(axis=1, keepdims=True)  # (N, taps)

  def matrix(size: int) -> np.ndarray:
    rows = np.arange(size)[:, None]
    cols = _reflect_index(rows + offsets[None, :].astype(int), size)  # (size, taps)
    onehot = cols[:, :, None] == np.arange(size)[None, None, :]  # (size, taps, size)
    return np.einsum("nt,itj->nij", kernel, onehot.astype(np.float64)).astype(images.dtype)

  out = np.matmul(matrix(h), images.reshape(n, h, w * c)).reshape(n, h, w, c)
  out = np.matmul(out.transpose(0, 1, 3, 2), matrix(w).transpose(0, 2, 1)[:, None])
  return np.ascontiguousarray(out.transpose(0, 1, 3, 2))


def smooth_noise(rng: np.random.Generator, n: int, grid: int, channels: int,
                 size: int = 32) -> np.ndarray:
  """Low-frequency noise: a (grid x grid) Gaussian field upsampled bilinearly.

  Returns float64 (n, size, size, channels) with roughly unit variance.
  """
  coarse = rng.standard_normal((n, grid, grid, channels))
  return resize_bilinear(coarse, size, size)


def rasterize_segments(segments: np.ndarray, radii: np.ndarray, height: int, width: int,
                       softness: float | np.ndarray = 1.0, chunk: int = 128) -> np.ndarray:
  """Anti-aliased rasterisation of thick line segments (a distance field).

  Each pixel's coverage is clip((r - d) / softness + 0.5, 0, 1), where d is
  the distance from the pixel centre to the segment and r its half-thickness;
  the image is the maximum coverage over segments (union of round-capped
  strokes).

  Args:
    segments: float (B, S, 2, 2) endpoints [[x0, y0], [x1, y1]] in pixel units
      (x to the right, y down; pixel (i, j) has its centre at (j + 0.5, i + 0.5)).
    radii: float (B, S) half-thickness in pixels; segments with radius <= 0
      are ignored (padding).
    height, width: output size.
    softness: edge width in pixels, scalar or (B,).
    chunk: images per block (bounds the memory of the temporaries).

  Returns:
    float32 coverage (B, height, width) in [0, 1].
  """
  segments = np.asarray(segments, dtype=np.float32)
  radii = np.asarray(radii, dtype=np.float32)
  num = segments.shape[0]
  soft = np.broadcast_to(np.asarray(softness, dtype=np.float32), (num,))
  # Padding segments are moved far away, so they never win the maximum.
  segments = np.where((radii > 0)[:, :, None, None], segments, np.float32(-1e4))
  radii = np.maximum(radii, 0.0)
  ys = (np.arange(height, dtype=np.float32) + 0.5)[None, :, None]
  xs = (np.arange(width, dtype=np.float32) + 0.5)[None, None, :]
  out = np.zeros((num, height, width), dtype=np.float32)
  # Process samples in order of their segment count, so padding costs little.
  count = (radii > 0).sum(axis=1)
  order = np.argsort(count, kind="stable")
  for start in range(0, num, chunk):
    idx = order[start:start + chunk]
    seg = segments[idx]
    rad = radii[idx]
    b = len(idx)
    best = np.full((b, height, width), -1e9, dtype=np.float32)
    h = np.empty((b, height, width), dtype=np.float32)
    ex = np.empty_like(h)
    ey = np.empty_like(h)
    for s in range(int(count[idx].max(initial=0))):
      x0 = seg[:, s, 0, 0][:, None, None]
      y0 = seg[:, s, 0, 1][:, None, None]
      dx = (seg[:, s, 1, 0] - seg[:, s, 0, 0])[:, None, None]
      dy = (seg[:, s, 1, 1] - seg[:, s, 0, 1])[:, None, None]
      inv = 1.0 / np.maximum(dx * dx + dy * dy, np.float32(1e-12))
      px = xs - x0  # (b, 1, W)
      py = ys - y0  # (b, H, 1)
      np.add(px * (dx * inv), py * (dy * inv), out=h)
      np.clip(h, 0.0, 1.0, out=h)
      np.multiply(h, dx, out=ex)
      np.subtract(px, ex, out=ex)
      np.multiply(h, dy, out=ey)
      np.subtract(py, ey, out=ey)
      np.multiply(ex, ex, out=ex)
      np.multiply(ey, ey, out=ey)
      np.add(ex, ey, out=ex)
      np.sqrt(ex, out=ex)
      np.subtract(rad[:, s][:, None, None], ex, out=ex)
      np.maximum(best, ex, out=best)
    best /= soft[idx][:, None, None]
    best += 0.5
    out[idx] = np.clip(best, 0.0, 1.0)
  return out

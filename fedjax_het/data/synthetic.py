"""Deterministic, offline synthetic data: a four-domain digit benchmark and a public set.

The embedded default data of the project. Everything is drawn with NumPy only
(strokes rasterised by an anti-aliased distance field, `_imageops`), so the
images are identical whatever optional packages (Pillow, matplotlib, TFDS)
are installed, and nothing is downloaded.

Digit domains (10 classes, class-balanced), each mirroring one real Digits
domain of FCCL/FCCL+ closely enough to show domain shift:

  * "mnist": white handwriting-like strokes on black. Skeletons with
    allographs, elastic jitter, slant, pen width; normalised like MNIST (the
    digit fitted into a 20x20 box, centred by centre of mass in 28x28), then
    resized 28 -> 32 with bilinear interpolation, like the real data.
  * "usps": the same kind of handwriting drawn at 16x16, scaled to fill the
    frame (USPS digits touch the top and bottom), thicker, blurred, then
    upscaled 16 -> 32 bilinearly: the low-resolution, blurry USPS look.
  * "svhn": colour house-number crops: font digits (sans, serif, slab,
    square) in a colour contrasting with a textured, unevenly lit background,
    usually with neighbouring distractor digits cut by the frame, small
    rotation and shear, blur and sensor noise.
  * "syn": rendered font digits (Ganin & Lempitsky's SynDigits): random
    fonts including seven-segment, italic, bold and condensed variants;
    random foreground and flat or gradient background colours; rotation up
    to 20 degrees; occasional neighbours; random blur and noise.

Public set (`synthetic_public`): unlabeled natural-image-like pictures, a
1/f^beta coloured-noise background (the power spectrum of natural images),
sometimes a horizon, and one to four shaded, sometimes striped shapes
(ellipses, rectangles, triangles, rings) with soft edges.

Determinism: every array is a function of (seed, domain, split, size) only,
through `np.random.SeedSequence([seed, domain code, split code, size])` with
the PCG64 generator. Train and test use different streams, so their images
never coincide. The output is bit-identical across runs on a machine; across
CPUs or NumPy/BLAS builds, SIMD transcendental functions and BLAS summation
order may move a rare pixel by one grey level. NumPy documents the PCG64 bit
stream as stable; the distribution methods (`normal`, `uniform`, ...) have
been stable in practice but are not formally guaranteed across NumPy
releases; a change would only regenerate a slightly different (still
deterministic) data set. Bump
`SYNTHETIC_VERSION` whenever the generator changes: cached files carry it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedjax_het.data import _glyphs
from fedjax_het.data._base import Split, cached_arrays
from fedjax_het.data._imageops import (gaussian_blur, rasterize_segments, resize_uint8_like_pil,
                                       smooth_noise, to_uint8)

#: Version of the generators; part of every cache file name.
SYNTHETIC_VERSION = "1"
#: The synthetic digit domains, in the order of the Digits scenario.
DIGIT_DOMAINS = ("mnist", "usps", "svhn", "syn")
#: Test-set size per domain used when a scenario takes a synthetic domain.
DEFAULT_SYNTHETIC_TEST_SIZE = 2000
#: FCCL+ Table V private sizes of the Digits scenario.
DEFAULT_SYNTHETIC_TRAIN_SIZES = {"mnist": 150, "usps": 80, "svhn": 5000, "syn": 1800}

_DOMAIN_CODES = {"mnist": 1, "usps": 2, "svhn": 3, "syn": 4, "public": 5}
_SPLIT_CODES = {"train": 1, "test": 2}
_NUM_CLASSES = 10


def _generator(seed: int, domain: str, split: str, num_examples: int) -> np.random.Generator:
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}.")
  if split not in _SPLIT_CODES:
    raise ValueError(f"`split` must be one of {tuple(_SPLIT_CODES)}, got {split!r}.")
  entropy = [int(seed), _DOMAIN_CODES[domain], _SPLIT_CODES[split], int(num_examples)]
  return np.random.default_rng(np.random.SeedSequence(entropy))


def balanced_labels(num_examples: int, rng: np.random.Generator,
                    num_classes: int = _NUM_CLASSES) -> np.ndarray:
  """A shuffled label vector with every class count within one of the others."""
  return rng.permutation(np.arange(num_examples) % num_classes).astype(np.int32)


# ----------------------------------------------------------------------------
# Glyph assembly and geometry (vectorised over a batch).
# ----------------------------------------------------------------------------


def _pad_glyphs(parts: list[list[tuple[np.ndarray, np.ndarray, float]]]
                ) -> tuple[np.ndarray, np.ndarray]:
  """Pads per-sample glyph lists into (B, S, 2, 2) segments and (B, S) weights.

  Each sample is a list of (segments, weights, x_offset) glyphs, the offset
  (in glyph-box widths) placing neighbours left or right of the centre digit.
  Padding segments have weight 0.
  """
  per_sample = []
  for glyphs in parts:
    segs = [s + np.array([dx, 0.0]) for s, _, dx in glyphs]
    weights = [w for _, w, _ in glyphs]
    per_sample.append((np.concatenate(segs, 0), np.concatenate(weights, 0)))
  longest = max(len(w) for _, w in per_sample)
  segments = np.zeros((len(parts), longest, 2, 2))
  weights = np.zeros((len(parts), longest))
  for i, (s, w) in enumerate(per_sample):
    segments[i, :len(w)] = s
    weights[i, :len(w)] = w
  return segments, weights


def _elastic(points: np.ndarray, rng: np.random.Generator, amplitude: np.ndarray) -> np.ndarray:
  """Smooth random displacement of glyph-space points, (B, S, 2, 2) -> same.

  A sum of three random plane waves per coordinate: neighbouring points move
  together, so strokes stay connected while their shape wobbles like
  handwriting.
  """
  b = points.shape[0]
  out = points.copy()
  for axis in range(2):
    for k in range(3):
      freq = rng.uniform(0.3, 1.4, size=(b, 2)) * rng.choice([-1.0, 1.0], size=(b, 2))
      phase = rng.uniform(0, 2 * np.pi, size=b)
      amp = amplitude / (k + 1)
      arg = (2 * np.pi * (freq[:, None, None, 0] * points[..., 0]
                          + freq[:, None, None, 1] * points[..., 1]) + phase[:, None, None])
      out[..., axis] += amp[:, None, None] * np.sin(arg)
  return out


def _proportion_warp(points: np.ndarray, rng: np.random.Generator, amount: float) -> np.ndarray:
  """Smooth writer-style changes of proportions, (B, S, 2, 2) -> same.

  Moves the waist of the glyph up or down (y -> y + p y (1 - y)), widens the
  top or the bottom (x spreads around 0.5 by a factor linear in y) and bows
  the vertical axis (x -> x + q (y - 0.5)^2), each by a random amount.
  """
  b = points.shape[0]
  x, y = points[..., 0], points[..., 1]
  waist = rng.uniform(-amount, amount, size=b)[:, None, None]
  flare = rng.uniform(-amount, amount, size=b)[:, None, None]
  bow = rng.uniform(-amount, amount, size=b)[:, None, None]
  new_y = y + waist * y * (1.0 - y)
  new_x = 0.5 + (x - 0.5) * (1.0 + flare * (y - 0.5)) + bow * (y - 0.5) ** 2
  return np.stack([new_x, new_y], axis=-1)


def _affine(points: np.ndarray, *, scale_x: np.ndarray, scale_y: np.ndarray,
            shear: np.ndarray, rotation_deg: np.ndarray) -> np.ndarray:
  """Centres glyph-space points at (0.5, 0.5), scales, shears (italic) and rotates.

  Shear > 0 leans the top of the glyph to the right. Returns pixel-unit
  offsets from the glyph centre, (B, S, 2, 2).
  """
  x = (points[..., 0] - 0.5) * scale_x[:, None, None]
  y = (points[..., 1] - 0.5) * scale_y[:, None, None]
  x = x - shear[:, None, None] * y
  theta = np.deg2rad(rotation_deg)[:, None, None]
  c, s = np.cos(theta), np.sin(theta)
  return np.stack([c * x - s * y, s * x + c * y], axis=-1)


def _stroke_contrast(segments: np.ndarray, contrast: np.ndarray) -> np.ndarray:
  """Thickness factor (B, S): vertical strokes 1, horizontal ones 1 - contrast."""
  d = segments[:, :, 1] - segments[:, :, 0]
  length = np.sqrt(np.sum(d * d, axis=-1))
  verticality = np.abs(d[..., 1]) / np.maximum(length, 1e-9)
  return (1.0 - contrast[:, None]) + contrast[:, None] * verticality


def _bbox(points: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-sample bounding box (min, max) of valid segment endpoints, each (B, 2)."""
  big = np.where(valid[:, :, None, None], points, np.inf)
  small = np.where(valid[:, :, None, None], points, -np.inf)
  return big.min(axis=(1, 2)), small.max(axis=(1, 2))


# ----------------------------------------------------------------------------
# Handwriting domains.
# ----------------------------------------------------------------------------


def _handwriting(labels: np.ndarray, rng: np.random.Generator, *, canvas: int, box: float,
                 radius: tuple[float, float], aspect: tuple[float, float], slant: float,
                 softness: float, centre_of_mass: bool, stretch: float = 1.0) -> np.ndarray:
  """Grey handwriting coverage (B, canvas, canvas) in [0, 1]."""
  b = len(labels)
  variants = rng.integers(0, _glyphs.NUM_VARIANTS, size=b)
  parts = [[(*_glyphs.glyph_segments("hand", int(d), int(v)), 0.0)]
           for d, v in zip(labels, variants)]
  glyph, weights = _pad_glyphs(parts)
  valid = weights > 0
  glyph = _proportion_warp(glyph, rng, 0.45)
  glyph = _elastic(glyph, rng, rng.uniform(0.02, 0.06, size=b))
  aspect_ratio = rng.uniform(*aspect, size=b)
  shear = np.clip(rng.normal(0.0, slant, size=b), -2.2 * slant, 2.2 * slant)
  pts = _affine(glyph, scale_x=aspect_ratio, scale_y=np.ones(b), shear=shear,
                rotation_deg=np.clip(rng.normal(0.0, 6.0, size=b), -14.0, 14.0))
  r = rng.uniform(*radius, size=b)
  lo, hi = _bbox(pts, valid)
  extent = hi - lo
  # Fit the ink (skeleton plus pen radius) into a `box` x `box` square,
  # keeping the aspect ratio; `stretch` > 1 widens (USPS-style normalisation).
  scale = (box - 2 * r) / np.maximum(np.maximum(extent[:, 0] * stretch, extent[:, 1]), 1e-6)
  pts = pts * scale[:, None, None, None]
  pts[..., 0] *= stretch
  lo, hi = _bbox(pts, valid)
  if centre_of_mass:
    mid = pts.mean(axis=2)
    length = np.sqrt(np.sum((pts[:, :, 1] - pts[:, :, 0]) ** 2, axis=-1)) + 1e-3
    length = np.where(valid, length, 0.0)
    centre = np.sum(mid * length[..., None], axis=1) / np.sum(length, axis=1, keepdims=True)
  else:
    centre = 0.5 * (lo + hi)
  pts = pts - centre[:, None, None, :] + canvas / 2.0
  radii = np.where(valid, r[:, None] * rng.uniform(0.9, 1.1, size=(b, 1)), 0.0)
  return rasterize_segments(pts, radii, canvas, canvas, softness)


def _mnist_like(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  cover = _handwriting(labels, rng, canvas=28, box=20.0, radius=(1.0, 2.2), aspect=(0.45, 0.95),
                       slant=0.22, softness=1.3, centre_of_mass=True)
  peak = rng.uniform(0.9, 1.0, size=len(labels))[:, None, None]
  grey = to_uint8(255.0 * np.clip(cover * 1.15, 0, 1) * peak)
  grey = resize_uint8_like_pil(grey[..., None], 32, 32)
  return np.repeat(grey, 3, axis=-1)


def _usps_like(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  cover = _handwriting(labels, rng, canvas=16, box=16.2, radius=(0.7, 1.35), aspect=(0.55, 1.0),
                       slant=0.15, softness=1.2, centre_of_mass=False, stretch=1.15)
  cover = gaussian_blur(cover[..., None], rng.uniform(0.35, 0.65, size=len(labels)), radius=2)
  peak = rng.uniform(0.85, 1.0, size=len(labels))[:, None, None, None]
  grey = to_uint8(255.0 * np.clip(cover * 1.1, 0, 1) * peak)
  grey = resize_uint8_like_pil(grey, 32, 32)
  return np.repeat(grey, 3, axis=-1)


# ----------------------------------------------------------------------------
# Font domains.
# ----------------------------------------------------------------------------


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
  """Vectorised HSV -> RGB, all inputs in [0, 1]; returns (..., 3)."""
  i = np.floor(h * 6.0) % 6
  f = h * 6.0 - np.floor(h * 6.0)
  p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
  table = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
  out = np.zeros(h.shape + (3,))
  for k, (r, g, b) in enumerate(table):
    sel = i == k
    out[sel] = np.stack([r[sel], g[sel], b[sel]], axis=-1)
  return out


def _luma(rgb: np.ndarray) -> np.ndarray:
  return rgb @ np.array([0.299, 0.587, 0.114])


def _contrasting_colours(rng: np.random.Generator, n: int, *, bg_sat: tuple[float, float],
                         fg_sat: tuple[float, float], min_contrast: tuple[float, float]
                         ) -> tuple[np.ndarray, np.ndarray]:
  """Background and foreground colours (n, 3) whose luma differs by a random margin."""
  bg = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(*bg_sat, size=n), rng.uniform(0.1, 0.95, n))
  fg = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(*fg_sat, size=n), np.ones(n))
  target = rng.uniform(*min_contrast, size=n)
  bg_luma = _luma(bg)
  # Lighter or darker digit; forced where the other direction has no room.
  lighter = rng.random(n) < 0.5
  lighter = np.where(bg_luma + target > 0.98, False,
                     np.where(bg_luma - target < 0.02, True, lighter))
  fg_luma_target = np.clip(np.where(lighter, bg_luma + target, bg_luma - target), 0.0, 1.0)
  fg = fg * (fg_luma_target / np.maximum(_luma(fg), 1e-6))[:, None]
  over = fg.max(axis=1) > 1.0
  # Colours that overflow are pulled towards white with the same luma.
  fg[over] = fg[over] / fg[over].max(axis=1, keepdims=True)
  deficit = np.clip(fg_luma_target - _luma(fg), 0.0, 1.0)
  fg = fg + deficit[:, None] * (1.0 - fg) / np.maximum(1.0 - _luma(fg), 1e-6)[:, None]
  return bg, np.clip(fg, 0.0, 1.0)


_FONT_WEIGHT_CONTRAST = {"sans": (0.0, 0.2), "serif": (0.45, 0.7), "slab": (0.0, 0.15),
                         "square": (0.0, 0.2), "segment": (0.0, 0.0)}


def _font_coverage(labels: np.ndarray, rng: np.random.Generator, *, styles: Sequence[str],
                   style_probs: Sequence[float], neighbour_prob: float,
                   height: tuple[float, float], aspect: tuple[float, float],
                   weight: tuple[float, float], shear: tuple[float, float],
                   italic_prob: float, rotation: float, shift: float) -> np.ndarray:
  """Coverage (B, 32, 32) of font digits with optional neighbours."""
  b = len(labels)
  style_idx = rng.choice(len(styles), size=b, p=np.asarray(style_probs) / np.sum(style_probs))
  variants = rng.integers(0, _glyphs.NUM_VARIANTS, size=b)
  left = rng.random(b) < neighbour_prob
  right = rng.random(b) < neighbour_prob
  left_digit = rng.integers(0, 10, size=b)
  right_digit = rng.integers(0, 10, size=b)
  gap = rng.uniform(0.15, 0.5, size=b)
  parts = []
  for i in range(b):
    style = styles[style_idx[i]]
    glyphs = [(*_glyphs.glyph_segments(style, int(labels[i]), int(variants[i])), 0.0)]
    if left[i]:
      glyphs.append((*_glyphs.glyph_segments(style, int(left_digit[i]), int(variants[i])),
                     -(1.0 + gap[i])))
    if right[i]:
      glyphs.append((*_glyphs.glyph_segments(style, int(right_digit[i]), int(variants[i])),
                     1.0 + gap[i]))
    parts.append(glyphs)
  glyph, weights = _pad_glyphs(parts)
  valid = weights > 0
  contrast = np.array([rng.uniform(*_FONT_WEIGHT_CONTRAST[styles[k]]) for k in style_idx])
  factor = _stroke_contrast(glyph, contrast) * weights
  h = rng.uniform(*height, size=b)
  aspect_ratio = rng.uniform(*aspect, size=b)
  italic = rng.random(b) < italic_prob
  shear_amount = np.where(italic, rng.uniform(0.15, 0.35, size=b) * rng.choice([-1, 1], size=b),
                          rng.uniform(*shear, size=b))
  pts = _affine(glyph, scale_x=aspect_ratio * h, scale_y=h, shear=shear_amount,
                rotation_deg=rng.uniform(-rotation, rotation, size=b))
  centre = 16.0 + rng.uniform(-shift, shift, size=(b, 2))
  pts = pts + centre[:, None, None, :]
  radius = rng.uniform(*weight, size=b) * h
  radii = np.where(valid, radius[:, None] * factor, 0.0)
  return rasterize_segments(pts, radii, 32, 32, 1.0)


def _svhn_like(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  b = len(labels)
  cover = _font_coverage(labels, rng, styles=("sans", "serif", "slab", "square"),
                         style_probs=(0.35, 0.25, 0.25, 0.15), neighbour_prob=0.8,
                         height=(15.0, 25.0), aspect=(0.5, 0.72), weight=(0.05, 0.11),
                         shear=(-0.12, 0.12), italic_prob=0.1, rotation=7.0, shift=1.5)
  bg, fg = _contrasting_colours(rng, b, bg_sat=(0.0, 0.6), fg_sat=(0.0, 0.7),
                                min_contrast=(0.15, 0.6))
  # Textured background: low-frequency blotches, fine grain, an occasional
  # plaque edge, all under an uneven illumination field.
  texture = (rng.uniform(0.02, 0.12, size=(b, 1, 1, 1)) * smooth_noise(rng, b, 4, 1)
             + rng.uniform(0.01, 0.05, size=(b, 1, 1, 1)) * smooth_noise(rng, b, 12, 3))
  background = bg[:, None, None, :] + texture
  edge = rng.random(b) < 0.35
  edge_pos = rng.uniform(1, 8, size=b)
  edge_side = rng.integers(0, 4, size=b)
  yy, xx = np.mgrid[0:32, 0:32] + 0.5
  dist = np.stack([yy, 32 - yy, xx, 32 - xx])[edge_side]  # (b, 32, 32)
  band = (dist < edge_pos[:, None, None]) & edge[:, None, None]
  band_colour = _hsv_to_rgb(rng.uniform(0, 1, b), rng.uniform(0, 0.5, b), rng.uniform(0.05, 0.9, b))
  background = np.where(band[..., None], band_colour[:, None, None, :], background)
  fg_field = fg[:, None, None, :] + rng.uniform(0.0, 0.06, size=(b, 1, 1, 1)) * smooth_noise(
      rng, b, 6, 3)
  image = background * (1 - cover[..., None]) + fg_field * cover[..., None]
  angle = rng.uniform(0, 2 * np.pi, size=b)
  ramp = (np.cos(angle)[:, None, None] * (xx - 16) + np.sin(angle)[:, None, None] * (yy - 16)) / 16
  light = 1.0 + rng.uniform(0.0, 0.35, size=(b, 1, 1)) * ramp
  image = image * light[..., None]
  image = gaussian_blur(image, rng.uniform(0.4, 1.3, size=b))
  image = image + rng.uniform(0.005, 0.035, size=(b, 1, 1, 1)) * rng.standard_normal(image.shape)
  return to_uint8(255.0 * image)


def _syn_like(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  b = len(labels)
  cover = _font_coverage(labels, rng, styles=("sans", "serif", "slab", "square", "segment"),
                         style_probs=(0.3, 0.25, 0.2, 0.15, 0.1), neighbour_prob=0.3,
                         height=(13.0, 23.0), aspect=(0.45, 0.8), weight=(0.05, 0.14),
                         shear=(-0.06, 0.06), italic_prob=0.3, rotation=20.0, shift=3.0)
  bg, fg = _contrasting_colours(rng, b, bg_sat=(0.0, 1.0), fg_sat=(0.0, 1.0),
                                min_contrast=(0.25, 0.7))
  bg2, _ = _contrasting_colours(rng, b, bg_sat=(0.0, 1.0), fg_sat=(0.0, 1.0),
                                min_contrast=(0.25, 0.7))
  # Flat or linear-gradient background towards a second colour of similar luma.
  bg2 = bg2 * (_luma(bg) / np.maximum(_luma(bg2), 1e-6))[:, None]
  bg2 = np.clip(bg2, 0.0, 1.0)
  gradient = rng.random(b) < 0.5
  yy, xx = np.mgrid[0:32, 0:32] + 0.5
  angle = rng.uniform(0, 2 * np.pi, size=b)
  t = ((np.cos(angle)[:, None, None] * (xx - 16) + np.sin(angle)[:, None, None] * (yy - 16)) / 32
       + 0.5)
  t = np.where(gradient[:, None, None], np.clip(t, 0, 1), 0.0)[..., None]
  background = bg[:, None, None, :] * (1 - t) + bg2[:, None, None, :] * t
  image = background * (1 - cover[..., None]) + fg[:, None, None, :] * cover[..., None]
  sigma = np.where(rng.random(b) < 0.5, 0.0, rng.uniform(0.3, 1.1, size=b))
  image = gaussian_blur(image, sigma)
  image = image + rng.uniform(0.0, 0.06, size=(b, 1, 1, 1)) * rng.standard_normal(image.shape)
  return to_uint8(255.0 * image)


_DOMAIN_FNS = {"mnist": _mnist_like, "usps": _usps_like, "svhn": _svhn_like, "syn": _syn_like}


# ----------------------------------------------------------------------------
# Public set.
# ----------------------------------------------------------------------------


def _power_law_noise(rng: np.random.Generator, n: int, beta: np.ndarray) -> np.ndarray:
  """(n, 32, 32, 3) noise whose power spectrum falls like 1/f^beta, unit std per channel.

  A complex Gaussian half-spectrum shaped by f^(-beta/2), then one inverse
  real FFT.
  """
  shape = (n, 32, 17, 3)
  spectrum = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
  fy = np.fft.fftfreq(32)[:, None]
  fx = np.fft.rfftfreq(32)[None, :]
  f = np.sqrt(fx * fx + fy * fy)
  f[0, 0] = 1.0
  amplitude = f[None] ** (-beta[:, None, None] / 2.0)
  amplitude[:, 0, 0] = 0.0
  field = np.fft.irfft2(spectrum * amplitude[..., None], s=(32, 32), axes=(1, 2))
  field -= field.mean(axis=(1, 2), keepdims=True)
  field /= np.maximum(field.std(axis=(1, 2), keepdims=True), 1e-9)
  return field


def _shape_alpha(kind: np.ndarray, u: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray,
                 soft: np.ndarray) -> np.ndarray:
  """Soft masks of ellipses (0), rectangles (1), triangles (2) and rings (3).

  u, v: local (rotated, centred) coordinates (n, 32, 32); a, b: half sizes (n,).
  Returns float32 alpha (n, 32, 32).
  """
  d = np.zeros(u.shape, dtype=np.float32)
  for k in range(4):
    sel = kind == k
    if not sel.any():
      continue
    uu, vv = u[sel], v[sel]
    aa, bb = a[sel][:, None, None], b[sel][:, None, None]
    if k in (0, 3):
      dk = (np.sqrt((uu / aa) ** 2 + (vv / bb) ** 2) - 1.0) * np.minimum(aa, bb)
      if k == 3:
        dk = np.abs(dk) - 0.25 * np.minimum(aa, bb)
    elif k == 1:
      qx, qy = np.abs(uu) - aa, np.abs(vv) - bb
      dk = (np.sqrt(np.maximum(qx, 0) ** 2 + np.maximum(qy, 0) ** 2)
            + np.minimum(np.maximum(qx, qy), 0.0))
    else:  # isosceles triangle, apex at (0, -b), base on v = +b
      side = np.sqrt(aa * aa + 4 * bb * bb)
      dk = np.maximum(vv - bb, (2 * bb * np.abs(uu) + aa * vv - aa * bb) / side)
    d[sel] = dk
  return np.clip(0.5 - d / soft[:, None, None], 0.0, 1.0)


def _public_like(num_examples: int, rng: np.random.Generator) -> np.ndarray:
  n = num_examples
  f32 = np.float32
  field = _power_law_noise(rng, n, rng.uniform(1.6, 2.6, size=n)).astype(f32)
  mix = (rng.uniform(0.5, 1.0, size=(n, 1, 1)) * np.ones((1, 3, 3))
         + rng.normal(0, 0.35, size=(n, 3, 3))).astype(f32)  # correlated colour channels
  texture = np.matmul(field.reshape(n, 1024, 3), mix.transpose(0, 2, 1)).reshape(n, 32, 32, 3)
  texture /= f32(2.5)
  base = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(0.0, 0.7, n), rng.uniform(0.2, 0.85, n))
  image = base[:, None, None, :].astype(f32) + rng.uniform(0.05, 0.25, size=(n, 1, 1, 1)).astype(
      f32) * texture
  yy, xx = (np.mgrid[0:32, 0:32] + 0.5).astype(f32)
  # Sometimes a horizon: two regions of different colour split by a line.
  horizon = rng.random(n) < 0.35
  tilt = rng.uniform(-0.4, 0.4, size=n).astype(f32)
  level = rng.uniform(8, 24, size=n).astype(f32)
  below = (yy[None] - 16 - tilt[:, None, None] * (xx[None] - 16)) > (level[:, None, None] - 16)
  ground = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(0.1, 0.8, n), rng.uniform(0.1, 0.8, n))
  ground_img = ground[:, None, None, :].astype(f32) + f32(0.15) * np.roll(texture, 7, axis=1)
  sel = horizon
  image[sel] = np.where(below[sel][..., None], ground_img[sel], image[sel])
  num_shapes = rng.integers(1, 5, size=n)
  for slot in range(4):
    active = slot < num_shapes
    kind = rng.integers(0, 4, size=n)
    cx, cy = rng.uniform(2, 30, size=n).astype(f32), rng.uniform(2, 30, size=n).astype(f32)
    half_a = rng.uniform(2.5, 11, size=n).astype(f32)
    half_b = rng.uniform(2.5, 11, size=n).astype(f32)
    angle = rng.uniform(0, np.pi, size=n)
    soft = rng.uniform(0.6, 1.8, size=n).astype(f32)
    colour = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(0.0, 1.0, n), rng.uniform(0.1, 1.0, n))
    shade_amount = rng.uniform(0.0, 0.5, size=n)
    striped = rng.random(n) < 0.3
    period = rng.uniform(2.5, 7.0, size=n)
    colour2 = _hsv_to_rgb(rng.uniform(0, 1, n), rng.uniform(0.0, 1.0, n), rng.uniform(0.0, 1.0, n))
    idx = np.nonzero(active)[0]
    c = np.cos(angle[idx]).astype(f32)[:, None, None]
    s = np.sin(angle[idx]).astype(f32)[:, None, None]
    dx, dy = xx[None] - cx[idx, None, None], yy[None] - cy[idx, None, None]
    u, v = c * dx + s * dy, -s * dx + c * dy
    alpha = _shape_alpha(kind[idx], u, v, half_a[idx], half_b[idx], soft[idx])[..., None]
    shade = 1.0 - 0.5 * shade_amount[idx, None, None].astype(f32) * (
        v / np.maximum(half_b[idx, None, None], 1.0))
    fill = colour[idx, None, None, :].astype(f32) * shade[..., None]
    stripes = (0.5 + 0.5 * np.sin(2 * np.pi * u / period[idx, None, None].astype(f32)))[..., None]
    striped_fill = fill * stripes + colour2[idx, None, None, :].astype(f32) * (1 - stripes)
    fill = np.where(striped[idx, None, None, None], striped_fill, fill)
    image[idx] = image[idx] * (1 - alpha) + fill * alpha
  image = gaussian_blur(image, np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0.3, 0.9, size=n)))
  image = image + f32(0.01) * rng.standard_normal(image.shape, dtype=f32)
  return to_uint8(255.0 * image)


# ----------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------

_CHUNK = 1000


def _generate_digits(domain: str, num_examples: int, seed: int,
                     split: str) -> dict[str, np.ndarray]:
  rng = _generator(seed, domain, split, num_examples)
  labels = balanced_labels(num_examples, rng)
  images = np.zeros((num_examples, 32, 32, 3), dtype=np.uint8)
  for start in range(0, num_examples, _CHUNK):
    chunk_rng = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])
    stop = min(start + _CHUNK, num_examples)
    images[start:stop] = _DOMAIN_FNS[domain](labels[start:stop], chunk_rng)
  return {"images": images, "labels": labels}


def synthetic_digits(domain: str, num_examples: int, *, seed: int, split: str = "train",
                     cache: bool = False) -> Split:
  """A class-balanced synthetic digit set mirroring one real Digits domain.

  Args:
    domain: "mnist", "usps", "svhn" or "syn" (see the module docstring).
    num_examples: number of images (>= 0); class counts differ by at most one.
    seed: non-negative integer; the output is bit-identical for equal
      (domain, num_examples, seed, split) and differs for different seeds.
    split: "train" or "test": independent random streams, so a test set never
      repeats a training image.
    cache: read from / write to the cache directory (FEDJAX_HET_CACHE_DIR,
      default ~/.cache/fedjax_het), keyed by version, domain, split, size, seed.

  Returns:
    Split with uint8 (num_examples, 32, 32, 3) RGB images and int32 labels.

  Raises:
    ValueError: on an unknown domain or split, a negative size or seed.
  """
  if domain not in DIGIT_DOMAINS:
    raise ValueError(f"`domain` must be one of {DIGIT_DOMAINS}, got {domain!r}.")
  if not isinstance(num_examples, (int, np.integer)) or num_examples < 0:
    raise ValueError(f"`num_examples` must be a non-negative integer, got {num_examples!r}.")
  _generator(seed, domain, split, num_examples)  # validates seed and split
  name = f"synthetic-v{SYNTHETIC_VERSION}-{domain}-{split}-n{int(num_examples)}-seed{int(seed)}.npz"
  arrays = cached_arrays(
      name, lambda: _generate_digits(domain, int(num_examples), int(seed), split), use_cache=cache)
  return Split(arrays["images"], arrays["labels"])


def synthetic_public(num_examples: int, *, seed: int, cache: bool = False) -> np.ndarray:
  """Unlabeled natural-image-like pictures, uint8 (num_examples, 32, 32, 3).

  Args:
    num_examples: number of images (>= 0).
    seed: non-negative integer (bit-identical output for equal arguments).
    cache: as in `synthetic_digits`.

  Returns:
    uint8 array (num_examples, 32, 32, 3).
  """
  if not isinstance(num_examples, (int, np.integer)) or num_examples < 0:
    raise ValueError(f"`num_examples` must be a non-negative integer, got {num_examples!r}.")

  def generate() -> dict[str, np.ndarray]:
    rng = _generator(seed, "public", "train", num_examples)
    images = np.zeros((num_examples, 32, 32, 3), dtype=np.uint8)
    for start in range(0, num_examples, _CHUNK):
      chunk_rng = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])
      stop = min(start + _CHUNK, num_examples)
      images[start:stop] = _public_like(stop - start, chunk_rng)
    return {"images": images}

  _generator(seed, "public", "train", num_examples)
  name = f"synthetic-v{SYNTHETIC_VERSION}-public-n{int(num_examples)}-seed{int(seed)}.npz"
  return cached_arrays(name, generate, use_cache=cache)["images"]


def synthetic_digits_benchmark(train_sizes: Mapping[str, int] | None = None, *,
                               test_size: int = DEFAULT_SYNTHETIC_TEST_SIZE, seed: int = 0,
                               cache: bool = True) -> dict[str, tuple[Split, Split]]:
  """The four synthetic digit domains with train and test splits, cached on disk.

  Args:
    train_sizes: domain -> training-set size; default the FCCL+ Table V
      private sizes (mnist 150, usps 80, svhn 5000, syn 1800). Only the listed
      domains are generated.
    test_size: test images per domain (default 2000).
    seed: generation seed.
    cache: keep the generated arrays in the cache directory.

  Returns:
    dict domain -> (train Split, test Split).
  """
  sizes = dict(DEFAULT_SYNTHETIC_TRAIN_SIZES if train_sizes is None else train_sizes)
  return {domain: (synthetic_digits(domain, n, seed=seed, split="train", cache=cache),
                   synthetic_digits(domain, test_size, seed=seed, split="test", cache=cache))
          for domain, n in sizes.items()}

"""Digit glyphs as strokes (polylines) for the synthetic digit domains.

Every glyph lives in a unit box: x in [0, 1] from left to right, y in [0, 1]
from top to bottom. A glyph is a tuple of strokes; a stroke is a polyline
(array (n, 2) of points) with a thickness factor (1 for main strokes, < 1 for
serifs). The renderer turns strokes into anti-aliased images.

Styles (all drawn from the same small set of primitives, so the output only
depends on NumPy):

  * "hand": handwriting skeletons with allographs (a 1 with or without flag,
    open or closed 4, 7 with or without crossbar, 9 with a straight or curved
    tail, 2 with or without a loop). The caller jitters them elastically.
  * "sans": geometric sans-serif (round bowls, no serifs).
  * "serif": the sans skeleton plus wedge serifs; thickness contrast (vertical
    strokes thick, horizontal thin) is applied by the caller.
  * "slab": slab serifs (long, as thick as the stems), boxier bowls, a flat-topped 3.
  * "square": squarish bowls (superellipse exponent 5), like DIN / Eurostile.
  * "segment": seven-segment display digits.

Bold, condensed, italic and rotated variants are produced by the caller
(stroke radius, aspect ratio, shear and rotation).
"""

from __future__ import annotations

import functools
import math

import numpy as np

STYLES = ("hand", "sans", "serif", "slab", "square", "segment")
#: Number of allograph variants per (style, digit); variant indices wrap.
NUM_VARIANTS = 2

Stroke = tuple[np.ndarray, float]


def _arc(cx: float, cy: float, rx: float, ry: float, t0: float, t1: float,
         exponent: float = 2.0, degrees_per_segment: float = 20.0) -> np.ndarray:
  """Points on a (super)ellipse arc from angle t0 to t1 (degrees, counter-clockwise).

  Angles follow the usual mathematical convention with y pointing up, so
  90 degrees is the top of the ellipse (smallest y in image coordinates).
  With exponent 2 the curve is an ellipse; larger exponents give squarer
  corners (superellipse |x|^p + |y|^p = 1).
  """
  n = max(2, int(math.ceil(abs(t1 - t0) / degrees_per_segment)) + 1)
  if exponent > 2.5:
    n = max(n, int(math.ceil(abs(t1 - t0) / 8.0)) + 1)
  t = np.deg2rad(np.linspace(t0, t1, n))
  c, s = np.cos(t), np.sin(t)
  power = 2.0 / exponent
  x = cx + rx * np.sign(c) * np.abs(c) ** power
  y = cy - ry * np.sign(s) * np.abs(s) ** power
  return np.stack([x, y], axis=-1)


def _line(*points: tuple[float, float]) -> np.ndarray:
  return np.asarray(points, dtype=np.float64)


def _join(*parts: np.ndarray) -> np.ndarray:
  return np.concatenate(parts, axis=0)


def _rotate180(strokes: list[Stroke]) -> list[Stroke]:
  return [(1.0 - pts, w) for pts, w in strokes]


def _bowl_digits(d: int, variant: int, p: float, style: str) -> list[Stroke]:
  """Sans / serif / slab / square / hand skeletons of digit d."""
  # Handwriting is warped after sampling, so its arcs are sampled more finely.
  arc = functools.partial(_arc, exponent=p,
                          degrees_per_segment=10.0 if style == "hand" else 20.0)
  hand = style == "hand"
  if d == 0:
    if hand and variant == 1:  # slanted oval that does not quite close
      return [(arc(0.5, 0.5, 0.5, 0.5, 100, 470), 1.0)]
    return [(arc(0.5, 0.5, 0.5, 0.5, 90, 450), 1.0)]
  if d == 1:
    stem = _line((0.58, 0.0), (0.58, 1.0))
    if hand:
      if variant == 0:
        return [(_line((0.55, 0.0), (0.45, 1.0)), 1.0)]
      return [(_line((0.25, 0.2), (0.6, 0.0), (0.5, 1.0)), 1.0)]
    strokes = [(_join(_line((0.18, 0.24)), stem), 1.0)]
    if style in ("serif", "slab") or variant == 1:
      strokes.append((_line((0.22, 1.0), (0.94, 1.0)), 0.8 if style == "serif" else 1.0))
    return strokes
  if d == 2:
    top = arc(0.5, 0.28, 0.47, 0.28, 155, -25)
    if hand and variant == 1:  # 2 with a loop at the bottom
      return [(_join(top, _line((0.12, 0.9)), arc(0.22, 0.88, 0.12, 0.11, 200, -20),
                     _line((1.0, 0.95))), 1.0)]
    return [(_join(top, _line((0.02, 1.0), (1.0, 1.0))), 1.0)]
  if d == 3:
    if style == "slab" or (not hand and variant == 1 and style != "square"):
      # Flat-topped 3.
      return [(_join(_line((0.08, 0.0), (0.9, 0.0), (0.42, 0.42)),
                     arc(0.48, 0.71, 0.5, 0.29, 95, -150)), 1.0)]
    upper = arc(0.48, 0.25, 0.42, 0.25, 155, -90)
    lower = arc(0.48, 0.75, 0.5, 0.25, 90, -155)
    return [(_join(upper, lower), 1.0)]
  if d == 4:
    if hand and variant == 1:  # open 4
      return [(_line((0.3, 0.0), (0.06, 0.62), (1.0, 0.62)), 1.0),
              (_line((0.76, 0.22), (0.76, 1.0)), 1.0)]
    strokes = [(_line((0.74, 1.0), (0.74, 0.0), (0.0, 0.7), (1.0, 0.7)), 1.0)]
    if style in ("serif", "slab"):
      strokes.append((_line((0.52, 1.0), (0.96, 1.0)), 0.8 if style == "serif" else 1.0))
    return strokes
  if d == 5:
    bowl = arc(0.48, 0.68, 0.46, 0.32, 145, -150)
    strokes = [(_join(_line((0.94, 0.0), (0.2, 0.0), (0.12, 0.47)), bowl), 1.0)]
    if style in ("serif", "slab"):
      strokes.append((_line((0.94, 0.0), (0.94, 0.14)), 0.7))
    return strokes
  if d == 6:
    if hand and variant == 1:  # straight-ish stem
      return [(_join(_line((0.78, 0.0), (0.14, 0.66)), arc(0.5, 0.7, 0.4, 0.3, 180, -180)), 1.0)]
    top = arc(0.55, 0.52, 0.48, 0.52, 62, 185)
    loop = arc(0.52, 0.7, 0.46, 0.3, 180, -180)
    return [(_join(top, loop), 1.0)]
  if d == 7:
    strokes = [(_line((0.0, 0.0), (1.0, 0.0), (0.36, 1.0)), 1.0)]
    if variant == 1 and style not in ("square",):
      strokes.append((_line((0.32, 0.52), (0.86, 0.52)), 0.9))
    if style in ("serif", "slab"):
      strokes.append((_line((0.0, 0.0), (0.0, 0.16)), 0.7))
    return strokes
  if d == 8:
    return [(arc(0.5, 0.25, 0.38, 0.25, 270, 630), 1.0),
            (arc(0.5, 0.73, 0.47, 0.27, 90, 450), 1.0)]
  if d == 9:
    if hand and variant == 1:  # straight tail
      return [(arc(0.48, 0.3, 0.44, 0.3, 0, 360), 1.0),
              (_line((0.92, 0.25), (0.82, 1.0)), 1.0)]
    return _rotate180(_bowl_digits(6, 0, p, "sans"))
  raise ValueError(f"digit must be in 0..9, got {d}")


# Seven-segment layout: a top, b top-right, c bottom-right, d bottom,
# e bottom-left, f top-left, g middle.
_SEGMENTS = {
    "a": ((0.1, 0.0), (0.9, 0.0)), "b": ((1.0, 0.07), (1.0, 0.45)),
    "c": ((1.0, 0.55), (1.0, 0.93)), "d": ((0.1, 1.0), (0.9, 1.0)),
    "e": ((0.0, 0.55), (0.0, 0.93)), "f": ((0.0, 0.07), (0.0, 0.45)),
    "g": ((0.1, 0.5), (0.9, 0.5)),
}
_SEGMENT_DIGITS = ("abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg",
                   "abcdfg")


def _segment_digit(d: int, variant: int) -> list[Stroke]:
  segments = _SEGMENT_DIGITS[d]
  if variant == 1 and d == 6:
    segments = "fgedc"  # 6 without its top bar, common on cheap displays
  if variant == 1 and d == 9:
    segments = "abcfg"
  if variant == 1 and d == 7:
    segments = "fabc"
  return [(_line(*_SEGMENTS[s]), 1.0) for s in segments]


@functools.lru_cache(maxsize=None)
def glyph_segments(style: str, digit: int, variant: int) -> tuple[np.ndarray, np.ndarray]:
  """Segments of one glyph.

  Args:
    style: one of STYLES.
    digit: 0..9.
    variant: allograph index (wraps modulo NUM_VARIANTS).

  Returns:
    (segments, weights): float64 (S, 2, 2) segment endpoints [[x0, y0], [x1, y1]]
    in the unit box, and (S,) stroke thickness factors. Read-only arrays.
  """
  if style not in STYLES:
    raise ValueError(f"style must be one of {STYLES}, got {style!r}")
  variant %= NUM_VARIANTS
  if style == "segment":
    strokes = _segment_digit(digit, variant)
  else:
    exponent = {"hand": 2.0, "sans": 2.0, "serif": 2.0, "slab": 2.6, "square": 5.0}[style]
    strokes = _bowl_digits(digit, variant, exponent, style)
  segs, weights = [], []
  for pts, w in strokes:
    if len(pts) == 1:
      pts = np.concatenate([pts, pts], axis=0)
    segs.append(np.stack([pts[:-1], pts[1:]], axis=1))
    weights.append(np.full(len(pts) - 1, w))
  segments = np.concatenate(segs, axis=0)
  weight = np.concatenate(weights, axis=0)
  segments.setflags(write=False)
  weight.setflags(write=False)
  return segments, weight

"""Layers shared by every model of the zoo.

* `conv2d` / `Conv`: the ONE convolution all models use, with four
  interchangeable implementations (same parameters, same values, same
  gradients up to float rounding):

  - "xla": `jax.lax.conv_general_dilated`, the stock convolution. Best on
    GPU/TPU.
  - "im2col": strided slices of the padded input ("patches") and a matmul;
    depthwise convolutions multiply each window slice by its kernel tap and
    sum. Forward and backward are plain slices, pads, dots and elementwise
    ops, so it keeps full speed inside `lax.scan` on XLA:CPU (where the stock
    conv's gradients run about 22-37x slower, jax-ml/jax#12868)
    and under `jax.vmap` (a batched matmul, not a grouped convolution). The
    depthwise case (channel multiplier 1: MobileNetV2, EfficientNet-B0) has a
    hand-written backward pass (`_depthwise_taps`) that keeps only its input,
    not the kh * kw window slices autodiff would keep; like "custom_vjp" it
    therefore supports reverse-mode differentiation (of any order) but not
    `jax.jvp`.
  - "custom_vjp": the stock forward convolution with a hand-written backward
    pass: the input gradient is one canonical NHWC/HWIO convolution (input
    dilated by the stride, spatially flipped kernel with its I/O axes swapped
    per group), the kernel gradient is a canonical convolution of the
    transposed input with the transposed output gradient (ungrouped, stride 1,
    k > 1) or one matmul / elementwise product-sum per kernel tap over the
    window slices (1x1, strided, grouped). A depthwise convolution (channel
    multiplier 1) is im2col's `_depthwise_taps`, which keeps only its input as
    well: the stock depthwise convolution is a grouped convolution, slow on
    XLA:CPU (the full Digits FCCL+ public step with "custom_vjp" took 57.0 s
    with it and 28.5 s with the sum of taps on a 2-core CPU).
  - "gemm_taps": the stock convolution for spatial (k > 1) ungrouped
    convolutions, a plain matmul for pointwise (1x1, unpadded) ones and
    im2col's sum of taps (`_depthwise_taps`) for depthwise ones. Meant for a
    GPU: the pointwise and depthwise layers of MobileNetV2 and EfficientNet-B0
    then need no cuDNN convolution (each of which XLA autotunes when it
    compiles, three times with the backward pass), only matmuls and
    elementwise fusions, while ResNets keep their cuDNN convolutions.

  Padding follows PyTorch by default: an int or pair of ints pads
  symmetrically (torch `padding=p`); "SAME"/"VALID" and explicit
  ((lo, hi), (lo, hi)) pairs are accepted too.
* `max_pool`: max pooling with -inf padding (torch and TF semantics), as
  `lax.reduce_window` for "xla" and as a max over window slices otherwise (the
  pooling gradient has the same loop slowdown as the convolution on XLA:CPU).
* `batch_norm`: `nn.BatchNorm` with PyTorch's momentum (0.1, i.e. flax 0.9)
  and epsilon (1e-5), with an optional per-example mask (padded batches). Flax updates the running variance with the biased batch
  variance, torch with the unbiased one: a factor B/(B-1) on the running
  variance, which only matters in eval mode and vanishes for large batches.
* `dense`: `nn.Dense` with PyTorch's default initialisation.
* `scale_width`: the width multiplier, max(1, round(c * width)).
* `divisible_width`: the width multiplier of MobileNetV2 and EfficientNet,
  rounded to a multiple of 8 (at least 8), as their reference code does.

Initialisation follows PyTorch's defaults (kaiming-uniform with a = sqrt(5)):
weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = kernel
height * width * input channels per group, BatchNorm scale 1 and bias 0. The
public torch code of the papers (kuangliu pytorch-cifar, FCCL, GLFC) keeps
these defaults. `uniform_stream` lets `init_variables` serve all these uniform
draws from one pre-drawn pool (fast compilation).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

#: Convolution implementations accepted by `conv2d`, `Conv` and `get_model`.
CONV_IMPLS = ("xla", "im2col", "custom_vjp", "gemm_taps")

#: Dtypes a model may compute in (`get_model(..., compute_dtype=...)`). Parameters,
#: optimiser state, BatchNorm statistics and losses stay float32 in every case.
COMPUTE_DTYPES = ("float32", "bfloat16")

_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")

Initializer = Callable[..., jax.Array]
Pads = tuple[tuple[int, int], tuple[int, int]]
Padding = Union[str, int, Sequence[int], Sequence[Sequence[int]]]

class UniformStream:
  """Serves the zoo's uniform initialisers from one pre-drawn pool.

  Every random parameter of the zoo is U(-b, b) (PyTorch's default init, or
  LeNet's b = 0.5). Drawing each leaf with its own `jax.random.uniform` call
  makes XLA compile one threefry kernel per leaf: 30+ s for GoogLeNet's 130
  leaves on CPU. `init_variables` instead runs `model.init` twice inside
  `uniform_stream`: a shape-only pass in "count" mode that sums the leaf sizes,
  then a pass in "draw" mode in which each initialiser takes the next slice of
  ONE uniform draw `pool` (shape (total,), values in [0, 1)). The call order is
  deterministic, so the result is a pure function of the key.
  """

  def __init__(self, pool: jax.Array | None):
    self.pool = pool
    self.offset = 0

  def take(self, shape: Sequence[int], bound: float, dtype: Any) -> jax.Array:
    size = math.prod(shape)
    start, self.offset = self.offset, self.offset + size
    if self.pool is None:  # counting pass
      return jnp.zeros(shape, dtype)
    if self.offset > self.pool.shape[0]:
      raise RuntimeError("UniformStream: the drawing pass asked for more values than the "
                         "counting pass; the model's initialisation order is not static.")
    u = lax.dynamic_slice_in_dim(self.pool, start, size) if size else self.pool[:0]
    return ((2.0 * u - 1.0) * bound).reshape(tuple(shape)).astype(dtype)


_STREAM: contextvars.ContextVar[UniformStream | None] = contextvars.ContextVar(
    "fedjax_het_uniform_stream", default=None)


@contextlib.contextmanager
def uniform_stream(pool: jax.Array | None):
  """Context in which the zoo's uniform initialisers read from `pool` (see above)."""
  stream = UniformStream(pool)
  token = _STREAM.set(stream)
  try:
    yield stream
  finally:
    _STREAM.reset(token)


def _uniform(key: jax.Array, shape: Sequence[int], dtype: Any, bound: float) -> jax.Array:
  stream = _STREAM.get()
  if stream is not None:
    return stream.take(shape, bound, dtype)
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def uniform_init(bound: float) -> Initializer:
  """Initialiser drawing U(-bound, bound)."""

  def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    return _uniform(key, shape, dtype, bound)

  return init


def torch_kernel_init(key: jax.Array, shape: Sequence[int],
                      dtype: Any = jnp.float32) -> jax.Array:
  """PyTorch's default kernel init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

  fan_in = product of all but the last axis (HWIO conv kernels: kh * kw * I;
  Dense kernels (in, out): in), as torch's kaiming_uniform(a=sqrt(5)).
  """
  fan_in = math.prod(shape[:-1])
  return _uniform(key, shape, dtype, 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)


def torch_bias_init(fan_in: int) -> Initializer:
  """PyTorch's default bias initialiser, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  return uniform_init(1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)


def check_conv_impl(conv_impl: str, where: str = "conv_impl") -> str:
  """Returns `conv_impl` or raises a ValueError listing the valid values."""
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"`{where}` must be one of {CONV_IMPLS}, got {conv_impl!r}.")
  return conv_impl


def check_compute_dtype(compute_dtype: str, where: str = "compute_dtype") -> str:
  """Returns `compute_dtype` or raises a ValueError listing the valid values."""
  if compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f"`{where}` must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}.")
  return compute_dtype


def scale_width(channels: int, width: float) -> int:
  """Channel count under a width multiplier: max(1, round(channels * width))."""
  return max(1, int(round(channels * width)))


def divisible_width(channels: int, width: float, divisor: int = 8) -> int:
  """Channel count under a width multiplier, rounded to a multiple of `divisor`.

  The rounding of the MobileNetV2 (Sandler et al., CVPR 2018) and EfficientNet
  (Tan & Le, ICML 2019) reference implementations (`_make_divisible` /
  `round_filters`): the nearest multiple of `divisor`, at least `divisor`, and
  one `divisor` more when rounding down lost over 10%. Every channel count of
  the two architectures is a multiple of 8, so width 1 is unchanged; narrow
  widths keep at least 8 channels per layer (plain `scale_width` leaves the
  width-1/8 blocks 2-5 channels wide, too narrow to learn SVHN-like digits:
  21-23% test accuracy where these layers reach about 50% in the same budget).
  """
  value = channels * width
  rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
  if rounded < 0.9 * value:
    rounded += divisor
  return rounded


# ----------------------------------------------------------------------------
# Padding and window helpers.
# ----------------------------------------------------------------------------


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
  if isinstance(value, int) and not isinstance(value, bool):
    return (value, value)
  if (isinstance(value, Sequence) and len(value) == 2
      and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
    return (int(value[0]), int(value[1]))
  raise ValueError(f"`{name}` must be an int or a pair of ints, got {value!r}.")


def explicit_padding(padding: Padding, in_hw: Sequence[int], window: Sequence[int],
                     strides: Sequence[int]) -> Pads:
  """Converts any accepted padding spec into ((top, bottom), (left, right)).

  Args:
    padding: "SAME" or "VALID" (TensorFlow/XLA rules); an int p (torch
      `padding=p`: p on every side); a pair (ph, pw); or explicit pairs
      ((top, bottom), (left, right)). Pads must be >= 0.
    in_hw: input height and width.
    window: window (kernel) height and width.
    strides: strides along height and width.

  Returns:
    ((top, bottom), (left, right)) as Python ints.
  """
  if isinstance(padding, str):
    if padding.upper() not in ("SAME", "VALID"):
      raise ValueError(f"`padding` must be 'SAME', 'VALID', an int, a pair of ints or "
                       f"((top, bottom), (left, right)), got {padding!r}.")
    pads = lax.padtype_to_pads(tuple(in_hw), tuple(window), tuple(strides), padding.upper())
    return tuple((int(lo), int(hi)) for lo, hi in pads)  # type: ignore[return-value]
  if isinstance(padding, int) and not isinstance(padding, bool):
    pads = ((padding, padding), (padding, padding))
  elif (isinstance(padding, Sequence) and len(padding) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) for p in padding)):
    pads = ((padding[0], padding[0]), (padding[1], padding[1]))
  elif (isinstance(padding, Sequence) and len(padding) == 2
        and all(isinstance(p, Sequence) and len(p) == 2 for p in padding)):
    pads = tuple((int(p[0]), int(p[1])) for p in padding)
  else:
    raise ValueError(f"`padding` must be 'SAME', 'VALID', an int, a pair of ints or "
                     f"((top, bottom), (left, right)), got {padding!r}.")
  if any(p < 0 for pair in pads for p in pair):
    raise ValueError(f"`padding` must be >= 0, got {padding!r}.")
  return pads  # type: ignore[return-value]


def _output_size(size: int, pads: tuple[int, int], window: int, stride: int) -> int:
  return (size + pads[0] + pads[1] - window) // stride + 1


def _pad(x: jax.Array, pads: Pads, value: float = 0.0) -> jax.Array:
  if not any(p for pair in pads for p in pair):
    return x
  return jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=value)


def _window_slices(xp: jax.Array, window: tuple[int, int], strides: tuple[int, int],
                   out_hw: tuple[int, int]) -> list[jax.Array]:
  """The kh*kw strided views xp[:, i::sh, j::sw][:, :Ho, :Wo], row-major in (i, j)."""
  batch, _, _, channels = xp.shape
  (kh, kw), (sh, sw), (ho, wo) = window, strides, out_hw
  return [lax.slice(xp, (0, i, j, 0),
                    (batch, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, channels),
                    (1, sh, sw, 1))
          for i in range(kh) for j in range(kw)]


# ----------------------------------------------------------------------------
# Convolution implementations. All take explicit pads and return NHWC.
# ----------------------------------------------------------------------------


def _conv_xla(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
              groups: int) -> jax.Array:
  return lax.conv_general_dilated(x, kernel, window_strides=strides, padding=pads,
                                  dimension_numbers=_DIMENSION_NUMBERS,
                                  feature_group_count=groups)


def _conv_im2col(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
                 groups: int) -> jax.Array:
  kh, kw, cin_g, cout = kernel.shape
  batch, height, width, channels = x.shape
  if _is_depthwise(x, kernel, groups):
    return _depthwise_taps(x, kernel, strides, pads)
  ho = _output_size(height, pads[0], kh, strides[0])
  wo = _output_size(width, pads[1], kw, strides[1])
  slices = _window_slices(_pad(x, pads), (kh, kw), strides, (ho, wo))
  taps = kh * kw
  if groups == 1:
    patches = slices[0] if taps == 1 else jnp.concatenate(slices, axis=-1)
    out = jnp.dot(patches.reshape(-1, taps * channels), kernel.reshape(taps * channels, cout))
    return out.reshape(batch, ho, wo, cout)
  if cin_g == 1:  # Depthwise, channel multiplier m: output channel c * m + j.
    multiplier = cout // channels
    taps_kernel = kernel.reshape(taps, channels, multiplier)
    terms = [s[..., :, None] * taps_kernel[t][None, None, None, :, :]
             for t, s in enumerate(slices)]
    return functools.reduce(jnp.add, terms).reshape(batch, ho, wo, cout)
  # General grouped convolution: one batched matmul over the groups.
  cout_g = cout // groups
  patches = jnp.stack(slices, axis=3).reshape(batch, ho, wo, taps, groups, cin_g)
  grouped_kernel = kernel.reshape(taps, cin_g, groups, cout_g)
  out = jnp.einsum("bhwtgc,tcgo->bhwgo", patches, grouped_kernel)
  return out.reshape(batch, ho, wo, cout)


def _tap_sum(xp: jax.Array, kernel: jax.Array, strides: tuple[int, int],
             out_hw: tuple[int, int]) -> jax.Array:
  """sum over the kh*kw window slices of xp (row-major, left to right) of slice * its tap.

  `kernel` is (kh, kw, C): one weight per tap and channel (a depthwise kernel).
  """
  kh, kw, _ = kernel.shape
  slices = _window_slices(xp, (kh, kw), strides, out_hw)
  terms = [s * kernel[t // kw, t % kw][None, None, None, :] for t, s in enumerate(slices)]
  return functools.reduce(jnp.add, terms)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _depthwise_taps(x: jax.Array, kernel: jax.Array, strides: tuple[int, int],
                    pads: Pads) -> jax.Array:
  """The depthwise convolution (channel multiplier 1) of impls "im2col" and "custom_vjp": the
  sum over the kernel's taps of each window slice times its tap.

  The values are those of the sum of taps itself; the backward pass is written
  by hand so that it keeps only `x` (autodiff of the sum keeps every window
  slice, kh * kw copies of the activation, and on XLA:CPU rebuilt each of
  them, BatchNorm and activation included, as a separate kernel): the input
  gradient is the same sum of taps over the stride-dilated, padded output
  gradient with the window flipped (taps added in the order autodiff adds
  them), the kernel gradient one product-sum per tap.
  """
  return _depthwise_taps_fwd(x, kernel, strides, pads)[0]


def _depthwise_taps_fwd(x, kernel, strides, pads):
  kh, kw = kernel.shape[:2]
  out_hw = (_output_size(x.shape[1], pads[0], kh, strides[0]),
            _output_size(x.shape[2], pads[1], kw, strides[1]))
  return _tap_sum(_pad(x, pads), kernel[:, :, 0, :], strides, out_hw), (x, kernel)


def _depthwise_taps_bwd(strides, pads, residuals, g):
  x, kernel = residuals
  kh, kw = kernel.shape[:2]
  _, height, width, _ = x.shape
  _, ho, wo, _ = g.shape
  # Input gradient: correlate g, dilated by the stride and padded so that every input pixel
  # sees the taps that read it, with the flipped window. Flipped tap t is tap kh*kw-1-t, so the
  # left-to-right sum adds the taps last to first, as the transpose of the forward sum does.
  lo_h, lo_w = kh - 1 - pads[0][0], kw - 1 - pads[1][0]
  hi_h = height + kh - 1 - (ho - 1) * strides[0] - 1 - lo_h
  hi_w = width + kw - 1 - (wo - 1) * strides[1] - 1 - lo_w
  g_padded = lax.pad(g, jnp.zeros((), g.dtype), ((0, 0, 0), (lo_h, hi_h, strides[0] - 1),
                                                 (lo_w, hi_w, strides[1] - 1), (0, 0, 0)))
  dx = _tap_sum(g_padded, kernel[::-1, ::-1, 0, :], (1, 1), (height, width))
  slices = _window_slices(_pad(x, pads), (kh, kw), strides, (ho, wo))
  dkernel = jnp.stack([jnp.sum(s * g, axis=(0, 1, 2)) for s in slices])
  return dx, dkernel.reshape(kernel.shape)


_depthwise_taps.defvjp(_depthwise_taps_fwd, _depthwise_taps_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_custom_vjp(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
                     groups: int) -> jax.Array:
  return _conv_xla(x, kernel, strides, pads, groups)


def _conv_custom_vjp_fwd(x, kernel, strides, pads, groups):
  return _conv_xla(x, kernel, strides, pads, groups), (x, kernel)


def _conv_input_grad(g: jax.Array, kernel: jax.Array, x_shape: Sequence[int],
                     strides: tuple[int, int], pads: Pads, groups: int) -> jax.Array:
  """d(conv)/dx as one canonical NHWC/HWIO convolution of the dilated g."""
  kh, kw, cin_g, cout = kernel.shape
  cout_g = cout // groups
  _, height, width, _ = x_shape
  _, ho, wo, _ = g.shape
  # Transposed kernel: flip the window and swap I/O within each group, so that
  # k_t[i, j, o, g * cin_g + c] = kernel[kh-1-i, kw-1-j, c, g * cout_g + o].
  k_t = kernel[::-1, ::-1].reshape(kh, kw, cin_g, groups, cout_g)
  k_t = jnp.transpose(k_t, (0, 1, 4, 3, 2)).reshape(kh, kw, cout_g, groups * cin_g)
  lo_h, lo_w = kh - 1 - pads[0][0], kw - 1 - pads[1][0]
  hi_h = height + kh - 2 - (ho - 1) * strides[0] - lo_h
  hi_w = width + kw - 2 - (wo - 1) * strides[1] - lo_w
  return lax.conv_general_dilated(g, k_t, window_strides=(1, 1),
                                  padding=((lo_h, hi_h), (lo_w, hi_w)),
                                  lhs_dilation=strides, dimension_numbers=_DIMENSION_NUMBERS,
                                  feature_group_count=groups)


def _conv_kernel_grad(x: jax.Array, g: jax.Array, kernel_shape: Sequence[int],
                      strides: tuple[int, int], pads: Pads, groups: int) -> jax.Array:
  """d(conv)/dkernel, HWIO."""
  kh, kw, cin_g, cout = kernel_shape
  _, ho, wo, _ = g.shape
  xp = _pad(x, pads)
  if groups == 1 and (kh, kw) != (1, 1) and strides == (1, 1):
    # Correlate the input with the output gradient: batch becomes the
    # contracted feature axis, input channels the "batch" of a canonical conv.
    lhs = jnp.transpose(xp, (3, 1, 2, 0))  # (Cin, Hp, Wp, B) as NHWC
    rhs = jnp.transpose(g, (1, 2, 0, 3))  # (Ho, Wo, B, Cout) as HWIO
    out = lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1), padding="VALID",
                                   rhs_dilation=strides, dimension_numbers=_DIMENSION_NUMBERS)
    return jnp.transpose(out[:, :kh, :kw, :], (1, 2, 0, 3))
  slices = _window_slices(xp, (kh, kw), strides, (ho, wo))
  channels = xp.shape[-1]
  if groups == 1:
    # 1x1 or strided: one matmul per kernel tap, contracting batch and space
    # (measured faster than the convolution form for these on XLA:CPU).
    gm = g.reshape(-1, cout)
    taps = [lax.dot_general(s.reshape(-1, channels), gm, (((0,), (0,)), ((), ())))
            for s in slices]
    return jnp.stack(taps).reshape(kh, kw, cin_g, cout)
  if cin_g == 1:
    multiplier = cout // channels
    if multiplier == 1:
      taps = [jnp.sum(s * g, axis=(0, 1, 2)) for s in slices]
    else:
      gm = g.reshape(g.shape[:3] + (channels, multiplier))
      taps = [jnp.sum(s[..., :, None] * gm, axis=(0, 1, 2)).reshape(cout) for s in slices]
    return jnp.stack(taps).reshape(kh, kw, 1, cout)
  cout_g = cout // groups
  gg = g.reshape(g.shape[:3] + (groups, cout_g))
  taps = [jnp.einsum("bhwgc,bhwgo->cgo", s.reshape(s.shape[:3] + (groups, cin_g)), gg)
          for s in slices]
  return jnp.stack(taps).reshape(kh, kw, cin_g, cout)


def _conv_custom_vjp_bwd(strides, pads, groups, residuals, g):
  x, kernel = residuals
  return (_conv_input_grad(g, kernel, x.shape, strides, pads, groups),
          _conv_kernel_grad(x, g, kernel.shape, strides, pads, groups))


_conv_custom_vjp.defvjp(_conv_custom_vjp_fwd, _conv_custom_vjp_bwd)


def _is_depthwise(x: jax.Array, kernel: jax.Array, groups: int) -> bool:
  """A depthwise convolution with channel multiplier 1 (one kernel per channel)."""
  return groups > 1 and kernel.shape[2] == 1 and kernel.shape[3] == x.shape[-1]


def _conv_lean(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
               groups: int) -> jax.Array:
  """`impl="custom_vjp"`: the stock convolution with the hand-written backward pass, except a
  depthwise one (multiplier 1), which is the sum of taps (`_depthwise_taps`): it keeps only its
  input too, and XLA:CPU runs the stock depthwise convolution, a grouped convolution, slowly."""
  if _is_depthwise(x, kernel, groups):
    return _depthwise_taps(x, kernel, strides, pads)
  return _conv_custom_vjp(x, kernel, strides, pads, groups)


def _conv_gemm_taps(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
                    groups: int) -> jax.Array:
  """`impl="gemm_taps"`: a depthwise convolution (multiplier 1) as the sum of taps, an
  unpadded ungrouped 1x1 convolution as a matmul over channels (after the stride's
  subsampling), any other convolution as the stock one."""
  if _is_depthwise(x, kernel, groups):
    return _depthwise_taps(x, kernel, strides, pads)
  if groups == 1 and kernel.shape[:2] == (1, 1) and pads == ((0, 0), (0, 0)):
    x = x[:, ::strides[0], ::strides[1], :]
    return jnp.einsum("bhwc,co->bhwo", x, kernel[0, 0])
  return _conv_xla(x, kernel, strides, pads, groups)


_CONV_FUNCTIONS = {"xla": _conv_xla, "im2col": _conv_im2col, "custom_vjp": _conv_lean,
                   "gemm_taps": _conv_gemm_taps}


def conv2d(x: jax.Array, kernel: jax.Array, *, strides: int | Sequence[int] = 1,
           padding: Padding = 0, feature_group_count: int = 1,
           impl: str = "xla") -> jax.Array:
  """2-D convolution (cross-correlation, like torch and XLA), NHWC x HWIO -> NHWC.

  Args:
    x: (B, H, W, C_in) input.
    kernel: (kh, kw, C_in / groups, C_out), C_out divisible by the groups.
    strides: int or (sh, sw).
    padding: see `explicit_padding`; default 0 (torch default).
    feature_group_count: number of groups; C_in for a depthwise convolution.
    impl: one of `CONV_IMPLS` ("xla", "im2col", "custom_vjp", "gemm_taps").

  Returns:
    (B, H_out, W_out, C_out).
  """
  check_conv_impl(impl, "impl")
  if x.ndim != 4 or kernel.ndim != 4:
    raise ValueError(f"conv2d: `x` must be (B, H, W, C) and `kernel` (kh, kw, C_in/groups, "
                     f"C_out), got shapes {x.shape} and {kernel.shape}.")
  groups = feature_group_count
  if (not isinstance(groups, int) or groups < 1 or x.shape[-1] != kernel.shape[2] * groups
      or kernel.shape[3] % groups):
    raise ValueError(
        f"conv2d: `feature_group_count` {groups!r} must be an int >= 1 with x channels "
        f"{x.shape[-1]} == kernel.shape[2] * groups ({kernel.shape[2]} * {groups}) and "
        f"kernel.shape[3] = {kernel.shape[3]} divisible by it.")
  strides = _pair(strides, "strides")
  if min(strides) < 1:
    raise ValueError(f"conv2d: `strides` must be >= 1, got {strides}.")
  pads = explicit_padding(padding, x.shape[1:3], kernel.shape[:2], strides)
  for size, pad, k, name in zip(x.shape[1:3], pads, kernel.shape[:2], ("height", "width")):
    if size + pad[0] + pad[1] < k:
      raise ValueError(f"conv2d: padded input {name} {size + sum(pad)} is smaller than the "
                       f"kernel ({k}).")
    if impl == "custom_vjp" and max(pad) > k - 1:
      raise ValueError(f"conv2d: impl='custom_vjp' needs pads <= kernel size - 1, got "
                       f"{pads} for a {kernel.shape[:2]} kernel; use 'xla' or 'im2col'.")
  return _CONV_FUNCTIONS[impl](x, kernel, strides, pads, groups)


def max_pool(x: jax.Array, window: int | Sequence[int], *, strides: int | Sequence[int],
             padding: Padding = 0, impl: str = "xla") -> jax.Array:
  """Max pooling over NHWC with -inf padding (torch `MaxPool2d`, TF 'SAME').

  Args:
    x: (B, H, W, C).
    window: int or (wh, ww).
    strides: int or (sh, sw).
    padding: as `conv2d` (padded positions never win the max).
    impl: "xla" and "gemm_taps" use `lax.reduce_window`; the others a max over window
      slices, whose gradient stays fast inside `lax.scan` on XLA:CPU. Ties
      route the gradient differently (reduce_window: the first maximum; the
      slice form: every tied position shares it), a measure-zero event for
      float activations.

  Returns:
    (B, H_out, W_out, C).
  """
  check_conv_impl(impl, "impl")
  window, strides = _pair(window, "window"), _pair(strides, "strides")
  pads = explicit_padding(padding, x.shape[1:3], window, strides)
  if impl in ("xla", "gemm_taps"):
    return nn.max_pool(x, window, strides=strides, padding=pads)
  ho = _output_size(x.shape[1], pads[0], window[0], strides[0])
  wo = _output_size(x.shape[2], pads[1], window[1], strides[1])
  slices = _window_slices(_pad(x, pads, -jnp.inf), window, strides, (ho, wo))
  return functools.reduce(jnp.maximum, slices)


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------


class Conv(nn.Module):
  """2-D convolution layer over NHWC, parameters "kernel" (HWIO) and "bias".

  The parameter names and shapes do not depend on `impl`, so variables are
  interchangeable between implementations.

  Attributes:
    features: output channels.
    kernel_size: int or (kh, kw).
    strides: int or (sh, sw).
    padding: see `explicit_padding`; default 0 (torch default).
    feature_group_count: groups (input channels for a depthwise conv).
    use_bias: whether to add a bias.
    impl: one of `CONV_IMPLS`.
    kernel_init: kernel initialiser; default PyTorch's.
    bias_init: bias initialiser; default PyTorch's U(+-1/sqrt(fan_in)).
  """
  features: int
  kernel_size: int | Sequence[int]
  strides: int | Sequence[int] = 1
  padding: Padding = 0
  feature_group_count: int = 1
  use_bias: bool = True
  impl: str = "xla"
  kernel_init: Initializer | None = None
  bias_init: Initializer | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kh, kw = _pair(self.kernel_size, "kernel_size")
    groups = self.feature_group_count
    if x.shape[-1] % groups or self.features % groups:
      raise ValueError(f"Conv {self.name}: `feature_group_count` {groups} must divide the "
                       f"input channels {x.shape[-1]} and `features` {self.features}.")
    cin_g = x.shape[-1] // groups
    kernel = self.param("kernel", self.kernel_init or torch_kernel_init,
                        (kh, kw, cin_g, self.features), jnp.float32)
    y = conv2d(x, kernel, strides=self.strides, padding=self.padding,
               feature_group_count=groups, impl=self.impl)
    if self.use_bias:
      bias = self.param("bias", self.bias_init or torch_bias_init(kh * kw * cin_g),
                        (self.features,), jnp.float32)
      y = y + bias[None, None, None, :]
    return y


def batch_norm(x: jax.Array, *, train: bool, mask: jax.Array | None = None,
               name: str) -> jax.Array:
  """Applies `nn.BatchNorm` (torch momentum 0.1 and epsilon 1e-5) named `name`.

  Must be called inside a compact method.

  Args:
    x: (B, ...) activations, features last.
    train: batch statistics (and a running-statistics update) if True, running
      statistics if False.
    mask: optional (B,) bools, True for real examples: in train mode the
      batch statistics (and hence the update) use only those rows, so a padded
      batch behaves exactly like the smaller batch of its real rows. An
      all-False mask (a padding-only step) falls back to all rows to keep the
      statistics finite; such a step's result must be discarded by the caller.

  Returns:
    Normalised x.
  """
  bn_mask = None
  if train and mask is not None:
    valid = jnp.logical_or(mask, jnp.logical_not(jnp.any(mask)))
    bn_mask = jnp.broadcast_to(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
  # dtype=x.dtype: a bfloat16 forward (a model built with compute_dtype="bfloat16")
  # stays bfloat16 after the layer; flax still reduces the batch statistics and
  # keeps the running averages in float32.
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                      dtype=x.dtype, name=name)(x, mask=bn_mask)


def dense(features: int, fan_in: int, name: str,
          init_bound: float | None = None) -> nn.Dense:
  """`nn.Dense` with PyTorch's default init, or U(-init_bound, init_bound) if given."""
  if init_bound is None:
    return nn.Dense(features, kernel_init=torch_kernel_init, bias_init=torch_bias_init(fan_in),
                    name=name)
  return nn.Dense(features, kernel_init=uniform_init(init_bound),
                  bias_init=uniform_init(init_bound), name=name)


def swish(x: jax.Array) -> jax.Array:
  """x * sigmoid(x) (EfficientNet's activation)."""
  return x * jax.nn.sigmoid(x)

"""The shared convolution / pooling layer: every impl matches "xla" and numpy."""

import itertools

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.models import layers

IMPLS = ("im2col", "custom_vjp", "gemm_taps")

# (height, width, c_in, c_out, kernel, stride, padding, groups)
CONV_CASES = [
    (8, 9, 3, 5, 3, 1, 1, 1),  # plain 3x3, torch padding
    (9, 9, 4, 6, 3, 2, 1, 1),  # strided, odd size
    (8, 8, 4, 6, 5, 2, 2, 1),  # 5x5 strided
    (8, 8, 4, 8, 1, 2, 0, 1),  # 1x1 strided shortcut
    (8, 7, 4, 8, 5, 1, "SAME", 1),
    (8, 8, 6, 9, 3, 2, "VALID", 3),  # grouped
    (8, 8, 4, 6, 3, 1, ((0, 1), (2, 0)), 2),  # asymmetric pads, grouped
    (8, 8, 4, 4, 3, 2, 1, 4),  # depthwise strided
    (7, 7, 6, 6, 5, 1, 2, 6),  # depthwise 5x5
    (8, 8, 6, 6, 5, 2, 2, 6),  # depthwise 5x5 strided (EfficientNet)
    (7, 7, 6, 12, 3, 1, "SAME", 6),  # depthwise, channel multiplier 2
    (8, 8, 4, 4, 3, 2, "SAME", 4),  # depthwise strided, pads (0, 1)
    (7, 8, 3, 3, 3, 1, ((0, 1), (2, 0)), 3),  # depthwise, asymmetric pads
    (9, 8, 5, 5, 5, 3, ((1, 2), (0, 2)), 5),  # depthwise 5x5, stride 3, asymmetric pads
    (1, 1, 8, 4, 1, 1, 0, 1),  # squeeze-excite 1x1 on a pooled map
]


def _rand(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _value_and_grads(impl, x, w, stride, padding, groups):
  def loss(x, w):
    y = layers.conv2d(x, w, strides=stride, padding=padding, feature_group_count=groups,
                      impl=impl)
    return jnp.sum(jnp.sin(y) * y), y

  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, w)
  return y, grads


def _assert_close(got, want, tol=1e-5):
  scale = max(float(jnp.max(jnp.abs(want))), 1.0)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=tol * scale, rtol=0)


def _numpy_conv(x, w, stride, pads, groups):
  """Direct loop: y[b, i, j, o] = sum_{di, dj, c} xp[b, i*s+di, j*s+dj, g*cg+c] w[di, dj, c, o]."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  kh, kw, cin_g, cout = w.shape
  cout_g = cout // groups
  ho = (xp.shape[1] - kh) // stride + 1
  wo = (xp.shape[2] - kw) // stride + 1
  y = np.zeros((x.shape[0], ho, wo, cout))
  for i, j, o in itertools.product(range(ho), range(wo), range(cout)):
    g = o // cout_g
    patch = xp[:, i * stride:i * stride + kh, j * stride:j * stride + kw,
               g * cin_g:(g + 1) * cin_g]
    y[:, i, j, o] = np.einsum("bhwc,hwc->b", patch, w[:, :, :, o])
  return y


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_xla_conv_matches_direct_numpy_loop(case):
  h, wd, cin, cout, k, stride, padding, groups = case
  x, w = _rand((2, h, wd, cin), 0), _rand((k, k, cin // groups, cout), 1)
  pads = layers.explicit_padding(padding, (h, wd), (k, k), (stride, stride))
  got = layers.conv2d(x, w, strides=stride, padding=padding, feature_group_count=groups)
  np.testing.assert_allclose(got, _numpy_conv(x, w, stride, pads, groups), atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv_impl_matches_xla_in_values_and_gradients(impl, case):
  h, wd, cin, cout, k, stride, padding, groups = case
  x, w = _rand((2, h, wd, cin), 2), _rand((k, k, cin // groups, cout), 3)
  y_ref, (gx_ref, gw_ref) = _value_and_grads("xla", x, w, stride, padding, groups)
  y, (gx, gw) = _value_and_grads(impl, x, w, stride, padding, groups)
  assert y.shape == y_ref.shape and gw.shape == w.shape and gx.shape == x.shape
  _assert_close(y, y_ref)
  _assert_close(gx, gx_ref)
  _assert_close(gw, gw_ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_impl_matches_xla_under_vmap_and_inside_scan(impl):
  # A stack of 3 clients (different kernels), each running a 2-step scan of
  # SGD on the kernel: the loop body the engine builds.
  xs, ws = _rand((3, 2, 2, 8, 8, 4), 4), _rand((3, 3, 3, 4, 6), 5)

  def client(x_steps, w, impl):
    def step(w, x):
      def loss(w):
        return jnp.sum(jnp.tanh(layers.conv2d(x, w, strides=2, padding=1, impl=impl)))
      value, grad = jax.value_and_grad(loss)(w)
      return w - 0.1 * grad, value
    return jax.lax.scan(step, w, x_steps)

  run = jax.jit(jax.vmap(client, in_axes=(0, 0, None)), static_argnums=2)
  w_ref, losses_ref = run(xs, ws, "xla")
  w_new, losses = run(xs, ws, impl)
  _assert_close(losses, losses_ref)
  _assert_close(w_new, w_ref)
  assert not np.allclose(w_new, ws)  # the steps did something


@pytest.mark.parametrize("impl", IMPLS)
def test_depthwise_gradient_of_gradient_matches_xla(impl):
  # Reverse over reverse through the hand-written depthwise backward pass (a gradient-norm
  # penalty, as gradient-matching attacks differentiate), under vmap over 2 clients.
  x, w = _rand((2, 2, 9, 9, 4), 6), _rand((2, 3, 3, 1, 4), 7)

  def penalty(x, w, impl):
    def loss(w):
      y = layers.conv2d(x, w, strides=2, padding=1, feature_group_count=4, impl=impl)
      return jnp.sum(jnp.tanh(y) ** 2)
    return jnp.sum(jax.grad(loss)(w) ** 2)

  grad = jax.jit(jax.vmap(jax.grad(penalty, argnums=(0, 1)), in_axes=(0, 0, None)),
                 static_argnums=2)
  (gx_ref, gw_ref), (gx, gw) = grad(x, w, "xla"), grad(x, w, impl)
  _assert_close(gx, gx_ref, 1e-4)
  _assert_close(gw, gw_ref, 1e-4)
  assert float(jnp.max(jnp.abs(gw_ref))) > 1e-3  # not a vacuous comparison


@pytest.mark.parametrize("impl", IMPLS)
def test_depthwise_backward_keeps_only_its_input(impl, capsys):
  # Autodiff of the sum of taps would keep all 9 window slices (9 activations); the
  # hand-written backward keeps the input and the kernel.
  x, w = _rand((2, 8, 8, 4), 8), _rand((3, 3, 1, 4), 9)

  def f(x, w):
    return layers.conv2d(x, w, padding=1, feature_group_count=4, impl=impl)

  jax.ad_checkpoint.print_saved_residuals(f, x, w)
  saved = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
  assert len(saved) == 2, saved
  assert all("[2,8,8,4]" in line or "[3,3,1,4]" in line for line in saved), saved


def test_im2col_depthwise_forward_is_the_sum_of_taps():
  # The window slices of the padded input times their taps, summed in float64 by hand.
  x, w = _rand((2, 8, 8, 4), 10), _rand((3, 3, 1, 4), 11)
  xp = np.pad(np.asarray(x, np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
  want = sum(xp[:, i:i + 7:2, j:j + 7:2, :] * np.asarray(w, np.float64)[i, j, 0]
             for i in range(3) for j in range(3))
  got = jax.jit(lambda x, w: layers.conv2d(x, w, strides=2, padding=1, feature_group_count=4,
                                           impl="im2col"))(x, w)
  assert got.shape == want.shape == (2, 4, 4, 4)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_conv_module_parameters_are_interchangeable_across_impls():
  x = _rand((2, 8, 8, 6), 6)
  module = models.Conv(6, 3, strides=2, padding=1, feature_group_count=3, impl="xla")
  variables = module.init(jax.random.key(0), x)
  assert variables["params"]["kernel"].shape == (3, 3, 2, 6)  # HWIO, I = C_in / groups
  assert variables["params"]["bias"].shape == (6,)
  ref = module.apply(variables, x)
  for impl in IMPLS:
    other = models.Conv(6, 3, strides=2, padding=1, feature_group_count=3, impl=impl)
    assert jax.tree_util.tree_map(jnp.shape, other.init(jax.random.key(1), x)) == \
        jax.tree_util.tree_map(jnp.shape, variables)
    _assert_close(other.apply(variables, x), ref)


def test_conv_module_torch_default_init_bounds():
  x = jnp.zeros((1, 8, 8, 16))
  params = models.Conv(32, 3, padding=1).init(jax.random.key(0), x)["params"]
  bound = 1.0 / np.sqrt(3 * 3 * 16)  # torch: 1 / sqrt(fan_in)
  for leaf in (params["kernel"], params["bias"]):
    assert float(jnp.max(jnp.abs(leaf))) <= bound
    assert float(jnp.max(jnp.abs(leaf))) > 0.8 * bound  # really uniform on that range
  no_bias = models.Conv(4, 1, use_bias=False).init(jax.random.key(0), x)["params"]
  assert set(no_bias) == {"kernel"}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window,stride,padding", [(2, 2, 0), (3, 2, "SAME"), (3, 1, 1),
                                                   (3, 2, 1)])
def test_max_pool_impls_match_xla(impl, window, stride, padding):
  x = _rand((2, 9, 8, 3), 7)

  def f(impl):
    def loss(x):
      y = layers.max_pool(x, window, strides=stride, padding=padding, impl=impl)
      return jnp.sum(y * jnp.cos(y)), y
    return jax.value_and_grad(loss, has_aux=True)(x)

  (_, y_ref), g_ref = f("xla")
  (_, y), g = f(impl)
  np.testing.assert_array_equal(y, y_ref)
  _assert_close(g, g_ref)


def test_max_pool_padding_never_wins():
  x = -jnp.ones((1, 4, 4, 1)) * 5.0
  for impl in models.CONV_IMPLS:
    y = layers.max_pool(x, 3, strides=2, padding=1, impl=impl)
    np.testing.assert_array_equal(y, -5.0 * jnp.ones((1, 2, 2, 1)))


def test_explicit_padding_rules():
  assert layers.explicit_padding(1, (8, 8), (3, 3), (2, 2)) == ((1, 1), (1, 1))
  assert layers.explicit_padding((1, 2), (8, 8), (3, 5), (1, 1)) == ((1, 1), (2, 2))
  # TF/XLA SAME with stride 2 on an even size pads only at the end.
  assert layers.explicit_padding("SAME", (32, 32), (3, 3), (2, 2)) == ((0, 1), (0, 1))
  assert layers.explicit_padding("valid", (8, 8), (3, 3), (1, 1)) == ((0, 0), (0, 0))


def test_scale_width():
  assert layers.scale_width(64, 1.0) == 64
  assert layers.scale_width(64, 0.25) == 16
  assert layers.scale_width(6, 0.125) == 1  # never zero channels
  assert layers.scale_width(1280, 0.125) == 160


def test_divisible_width_rounds_to_multiples_of_eight_like_make_divisible():
  # Worked by hand from the reference rule: nearest multiple of 8, at least 8, plus 8 when
  # rounding down lost more than 10% (80 * 1/8 = 10 -> 8 would lose 20% -> 16).
  assert [layers.divisible_width(c, 0.125) for c in (16, 24, 32, 40, 80, 96, 112, 160, 192, 320)] \
      == [8, 8, 8, 8, 16, 16, 16, 24, 24, 40]
  assert layers.divisible_width(1280, 0.125) == 160
  assert layers.divisible_width(112, 0.5) == 56  # 56 is a multiple of 8: kept
  assert layers.divisible_width(36, 1.0) == 40   # 36 + 4 = 40 -> 40
  assert layers.divisible_width(33, 1.0) == 32   # 37 // 8 * 8 = 32 >= 0.9 * 33
  for c in (16, 24, 32, 40, 64, 80, 96, 112, 160, 192, 320, 1280):  # width 1 is untouched
    assert layers.divisible_width(c, 1.0) == c


def test_conv_errors_name_the_argument_and_valid_values():
  x, w = jnp.zeros((1, 8, 8, 4)), jnp.zeros((3, 3, 4, 4))
  with pytest.raises(ValueError, match=r"impl.*'xla', 'im2col', 'custom_vjp'"):
    layers.conv2d(x, w, impl="cudnn")
  with pytest.raises(ValueError, match="feature_group_count"):
    layers.conv2d(x, w, feature_group_count=2)
  with pytest.raises(ValueError, match="padding"):
    layers.conv2d(x, w, padding="FULL")
  with pytest.raises(ValueError, match="padding"):
    layers.conv2d(x, w, padding=-1)
  with pytest.raises(ValueError, match="custom_vjp"):
    layers.conv2d(x, w, padding=3, impl="custom_vjp")
  with pytest.raises(ValueError, match="feature_group_count"):
    models.Conv(6, 3, feature_group_count=4).init(jax.random.key(0), x)

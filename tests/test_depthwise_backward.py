"""benchmarks/depthwise_backward.py: the im2col depthwise backward, hand-written vs autodiff."""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.ad_checkpoint
import numpy as np
import pytest

from fedjax_het.config import load_module
from fedjax_het.models import layers

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling arch_steps
bench = load_module(ROOT / "benchmarks" / "depthwise_backward.py")


def _depthwise(x, w):
  return layers.conv2d(x, w, strides=2, padding=1, feature_group_count=4, impl="im2col")


def _saved(capsys, x, w):
  jax.ad_checkpoint.print_saved_residuals(_depthwise, x, w)
  return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_the_switch_gives_autodiffs_backward_and_restores_the_library(capsys):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 9, 4)).astype(np.float32)
  w = rng.normal(size=(3, 3, 1, 4)).astype(np.float32)
  g = rng.normal(size=(2, 5, 5, 4)).astype(np.float32)
  custom = jax.vjp(_depthwise, x, w)[1](g)
  with bench.depthwise_backward("autodiff"):
    slices = [line for line in _saved(capsys, x, w) if line.startswith("f32[2,5,5,4]")]
    assert len(slices) == 9  # one window slice per tap, each the output's size
    autodiff = jax.vjp(_depthwise, x, w)[1](g)
  saved = _saved(capsys, x, w)  # the library's backward again: the input and the kernel
  assert [line.split()[0] for line in saved] == ["f32[2,9,9,4]", "f32[3,3,1,4]"], saved
  for got, want in zip(custom, autodiff):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_benchmark_writes_both_variants(tmp_path):
  out = tmp_path / "depthwise.json"
  result = bench.main(["--backbones", "mobilenet_v2", "--batch", "4", "--steps", "2",
                       "--repeats", "2", "--out", str(out)])
  (row,) = json.loads(out.read_text())["steps_rows"]
  assert row == result["steps_rows"][0]
  assert row["custom_step_ms"] > 0 and row["autodiff_step_ms"] > 0
  assert row["speedup"] == pytest.approx(row["autodiff_step_ms"] / row["custom_step_ms"])


def test_the_custom_vjp_switch_gives_the_stock_grouped_convolution_and_restores_it():
  x, w = np.ones((2, 9, 9, 4), np.float32), np.ones((3, 3, 1, 4), np.float32)

  def primitives():
    fn = lambda x, w: layers.conv2d(x, w, strides=2, padding=1, feature_group_count=4,  # noqa: E731
                                    impl="custom_vjp")
    return str(jax.make_jaxpr(fn)(x, w))

  assert "conv_general_dilated" not in primitives()  # the library's sum of taps
  with bench.custom_vjp_depthwise("stock"):
    assert "conv_general_dilated" in primitives()
  assert "conv_general_dilated" not in primitives()

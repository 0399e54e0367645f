"""benchmarks/program_shapes.py and gpu_compile.py count a program's convolutions and GEMMs."""

import jax
import jax.numpy as jnp
from jax import lax

from tests import benchmark_scripts


def test_count_ops_counts_every_and_every_distinct_convolution_and_dot():
  program_shapes = benchmark_scripts.load("program_shapes")

  def fn(x, y, k3, k1, w):
    conv = lambda a, k: lax.conv_general_dilated(a, k, (1, 1), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    a = conv(x, k3) + conv(x, k3 * 2.0)  # two convolutions of one signature
    b = conv(y, k3)                      # the same kernel on another batch: a second signature
    c = conv(x, k1)                      # a 1x1 kernel: a third
    return a.sum() + b.sum() + c.sum() + (x.reshape(4, -1) @ w).sum()

  args = (jnp.ones((4, 8, 8, 3)), jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 5)),
          jnp.ones((1, 1, 3, 5)), jnp.ones((192, 7)))
  counts = program_shapes.count_ops(jax.jit(fn).lower(*args).as_text())
  assert counts["convolutions"] == 4 and counts["distinct_convolutions"] == 3
  assert counts["dot_generals"] == 1 and counts["distinct_dot_generals"] == 1
  assert counts["distinct_convolutions_by_batch"] == {"2": 1, "4": 2}


def test_hlo_counts_reads_the_markers_of_an_optimised_gpu_program():
  gpu_compile = benchmark_scripts.load("gpu_compile")
  text = "\n".join([
      '%a = f32[2] custom-call(), custom_call_target="__cudnn$convForward"',
      '%b = f32[2] custom-call(), custom_call_target="__cudnn$convBackwardFilter"',
      '%c = f32[2] custom-call(), custom_call_target="__cublas$gemm"',
      '%d = f32[2] custom-call(), custom_call_target="__cublas$lt$matmul"',
      '%e = f32[2] fusion(%a), kind=kCustom, backend_config={"kind":"__triton_gemm"}',
      '%f = f32[2] fusion(%c), kind=kLoop'])
  counts = gpu_compile.hlo_counts(text, "stablehlo.convolution(%0, %1)")
  assert counts == {"cudnn_convolutions": 2, "cublas_gemms": 2, "triton_gemm_fusions": 1,
                    "fusions": 2, "stablehlo_convolutions": 1}

"""benchmarks/proxy_reconstruction.py: its variants, rows and result file (timings not checked)."""

import json

import pytest

from tests import benchmark_scripts

bench = benchmark_scripts.load("proxy_reconstruction")


def test_variant_names_parse_into_chunk_and_convolution():
  assert bench._variants("pool:xla,chunk6:im2col") == [  # pylint: disable=protected-access
      ("pool:xla", 0, "xla"), ("chunk6:im2col", 6, "im2col")]


# Compiles the pool's and a chunked reconstruction for a benchmark file (40-60 s on a
# 2-core CPU): slow suite. The two reconstructions' equality is checked in the default suite
# (tests/test_cil_proxy.py).
@pytest.mark.slow
def test_writes_a_row_per_variant_and_used_count(tmp_path):
  out = tmp_path / "r.json"
  bench.main(["--variants", "pool:im2col,chunk6:im2col", "--used", "6", "--steps", "20",
              "--repeats", "1", "--out", str(out)])
  result = json.loads(out.read_text())
  assert set(result["header"]) == {"commit", "date", "device", "jax"}
  assert (result["pool_slots"], result["steps"], result["keep_last"]) == (60, 20, 20)
  rows = {(r["variant"], r["used"]): r for r in result["rows"]}
  assert set(rows) == {("pool:im2col", 6), ("chunk6:im2col", 6)}
  for row in rows.values():  # 2000 iterations = 100 x the 20 timed
    assert abs(row["seconds_at_2000_steps"] - row["median_secs"] * 100) <= 0.1
    assert "speedup_vs_pool_xla" not in row  # no pool:xla variant to compare with
  variant = result["variants"]["chunk6:im2col"]
  assert (variant["chunk"], variant["encoder_conv_impl"]) == (6, "im2col")

"""Test configuration: 4 simulated CPU devices, strict rank promotion, `slow` marker.

The device count must be set before JAX initialises its backends, so it is done
at import time here, before any test module imports JAX code that runs ops.
"""

import os

import pytest

# Keep tests on the CPU even where an accelerator is visible, unless asked.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
  # Also declared in pyproject.toml; registering here keeps `-p no:cacheprovider`
  # runs and direct `pytest tests/...` invocations warning-free.
  config.addinivalue_line("markers", "slow: long-running test, excluded by default")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module.

  With every program compiled so far kept in one pytest process, XLA crashed
  (a segmentation fault while compiling, twice in a row, at test_train's
  memory test) when the whole default suite ran; that module alone passed.
  Clearing the caches between modules made the full suite pass (its peak
  RSS was then 3 GB). Later modules recompile what they need.
  """
  yield
  jax.clear_caches()

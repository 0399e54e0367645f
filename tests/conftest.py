"""Test configuration: 4 simulated CPU devices, strict rank promotion, `slow` marker.

The device count must be set before JAX initialises its backends, so it is done
at import time here, before any test module imports JAX code that runs ops.
"""

import atexit
import os
import shutil
import tempfile

import pytest

# The default data directory (~/.cache/fedjax_het/data) lies in the cache directory: a session
# of its own keeps a user's downloaded data out of the tests, which read real data only where
# FEDJAX_HET_DATA_DIR names it (tests/real_data.py).
if "FEDJAX_HET_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="fedjax_het_tests_cache_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["FEDJAX_HET_CACHE_DIR"] = _CACHE

# Keep tests on the CPU even where an accelerator is visible, unless asked.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_numpy_rank_promotion", "raise")

# One persistent compilation cache for the session (unless JAX_COMPILATION_CACHE_DIR names
# one): many tests build several Experiments of the same config (a run and its resume, one
# config compiled two ways), whose identical programs XLA then compiles once. A hit returns
# the same executable, so no result changes; test_train.py + test_workdir.py take 151 s with
# it against 216 s without on a 2-core CPU. Removed at exit, so nothing carries over between
# sessions. Named in the environment too (this process's JAX has read its environment already,
# hence the config update), so pytest-xdist workers (`-n 2`), started from this process, share it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _XLA_CACHE = tempfile.mkdtemp(prefix="fedjax_het_tests_xla_cache_")
  atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
  jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)


def pytest_configure(config):
  # Also declared in pyproject.toml; registering here keeps `-p no:cacheprovider`
  # runs and direct `pytest tests/...` invocations warning-free.
  config.addinivalue_line("markers", "slow: long-running test, excluded by default")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module.

  With every program compiled so far kept in one pytest process, XLA crashes
  (a segmentation fault while compiling, at test_train's memory test) when
  the whole default suite runs; that module alone passes. With the caches
  cleared between modules the full suite passes, at a peak RSS of 3 GB.
  Later modules recompile what they need.
  """
  yield
  jax.clear_caches()

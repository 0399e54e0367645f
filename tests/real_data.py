"""Where the tests look for the real `.npz` bundle: $FEDJAX_HET_DATA_DIR (unset: the tests
that need it skip, saying how to get it)."""

import os
import pathlib

from fedjax_het import data


def real_data_dir() -> pathlib.Path | None:
  env = os.environ.get(data.DATA_DIR_ENV)
  return pathlib.Path(env) if env else None


def missing(*files: str) -> str:
  """The skip reason of a test whose bundle files are not there."""
  named = f" ({', '.join(files)})" if files else ""
  return (f"offline bundle not found: set {data.DATA_DIR_ENV} to the directory of the fedjax_het "
          f".npz files{named}; `python -m fedjax_het.data.download <dataset>` writes them there")

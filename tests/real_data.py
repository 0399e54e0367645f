"""Where the tests look for the real `.npz` bundle: $FEDJAX_HET_DATA_DIR, else ../shared/data."""

import os
import pathlib

from fedjax_het import data

ROOT = pathlib.Path(__file__).resolve().parents[1]


def real_data_dir() -> pathlib.Path | None:
  env = os.environ.get(data.DATA_DIR_ENV)
  if env:
    return pathlib.Path(env)
  candidate = ROOT.parent / "shared" / "data"
  return candidate if candidate.is_dir() else None

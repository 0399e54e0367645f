"""Core data types, errors, directories and the on-disk cache of the data layer."""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from fedjax_het.errors import UserError

#: Environment variable naming the directory of the offline `.npz` bundle.
DATA_DIR_ENV = "FEDJAX_HET_DATA_DIR"
#: Environment variable naming the cache directory of generated data.
CACHE_DIR_ENV = "FEDJAX_HET_CACHE_DIR"
#: Image shape every split carries (height, width, RGB channels).
IMAGE_SHAPE = (32, 32, 3)

logger = logging.getLogger("fedjax_het.data")


class DataError(UserError, ValueError):
  """Data that is present but invalid: corrupt file, wrong dtype/shape/labels.

  The message names the file (or the object) and what was expected and found.
  Never replaced by a synthetic fallback.
  """


class DataUnavailableError(DataError):
  """A requested source is not available here (missing directory, file,
  package or prepared dataset). The message says how to provide it.

  This is the only error `build_scenario(..., synthetic_fallback=True)`
  replaces by the synthetic domain.
  """


# ----------------------------------------------------------------------------
# Split and stacked clients.
# ----------------------------------------------------------------------------


def check_images(images: np.ndarray, where: str, *, any_side: bool = False) -> None:
  """Raises DataError unless `images` is a uint8 (N, 32, 32, 3) array.

  `any_side`: any square side instead of 32, (N, S, S, 3) (a `Split` of the
  class-incremental streams' Tiny-ImageNet at 64 or ImageNet-Subset at 224).
  """
  if not isinstance(images, np.ndarray):
    raise DataError(f"{where}: images must be a numpy array, got {type(images).__name__}.")
  if images.dtype != np.uint8:
    raise DataError(f"{where}: images must have dtype uint8, got {images.dtype}.")
  if any_side:
    if images.ndim != 4 or images.shape[1] != images.shape[2] or images.shape[3] != 3:
      raise DataError(f"{where}: images must have shape (N, 32, 32, 3) or another square "
                      f"(N, S, S, 3), got {images.shape}.")
  elif images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
    raise DataError(f"{where}: images must have shape (N, 32, 32, 3), got {images.shape}.")


def check_labels(labels: np.ndarray, num_examples: int, where: str,
                 num_classes: int | None = None) -> np.ndarray:
  """Validates integer labels of length `num_examples`; returns them as int32.

  Raises:
    DataError: on a non-integer dtype, a wrong shape or length, a negative
      label or (if `num_classes` is given) a label >= num_classes.
  """
  labels = np.asarray(labels)
  if not np.issubdtype(labels.dtype, np.integer):
    raise DataError(f"{where}: labels must have an integer dtype, got {labels.dtype}.")
  if labels.ndim != 1:
    raise DataError(f"{where}: labels must have shape (N,), got {labels.shape}.")
  if labels.shape[0] != num_examples:
    raise DataError(f"{where}: {labels.shape[0]} labels for {num_examples} images "
                    "(lengths must match).")
  if labels.size:
    low, high = int(labels.min()), int(labels.max())
    upper = num_classes if num_classes is not None else np.iinfo(np.int32).max
    if low < 0 or high >= upper:
      allowed = f"[0, {num_classes})" if num_classes is not None else ">= 0"
      raise DataError(f"{where}: labels must lie in {allowed}, found values in "
                      f"[{low}, {high}].")
  return labels.astype(np.int32, copy=False)


@dataclasses.dataclass(frozen=True)
class Split:
  """A labelled image set: uint8 images (N, S, S, 3) RGB and int32 labels (N,).

  S is 32 everywhere except the class-incremental streams read at another
  side (`incremental.build_class_incremental_stream`'s `image_size`).
  Validated on construction (DataError on a wrong dtype, shape or length, or
  a negative label); integer labels of another width are converted to int32.
  """
  images: np.ndarray
  labels: np.ndarray

  def __post_init__(self):
    check_images(self.images, "Split", any_side=True)
    object.__setattr__(self, "labels", check_labels(self.labels, self.images.shape[0], "Split"))

  def __len__(self) -> int:
    return int(self.images.shape[0])

  def take(self, indices: np.ndarray) -> Split:
    """The sub-split at `indices` (an integer index array)."""
    indices = np.asarray(indices, dtype=np.int64)
    return Split(self.images[indices], self.labels[indices])


class StackedClients(NamedTuple):
  """Clients of unequal size stacked for `vmap` over a leading client axis.

  Attributes:
    images: uint8 (K, N_max, 32, 32, 3); padding rows are zeros.
    labels: int32 (K, N_max); padding rows are 0.
    mask: bool (K, N_max); True on real examples.
    sizes: int32 (K,); the number of real examples per client.
  """
  images: np.ndarray
  labels: np.ndarray
  mask: np.ndarray
  sizes: np.ndarray


def stack_clients(splits: Sequence[Split], *, pad_to: int | None = None) -> StackedClients:
  """Stacks client splits into padded arrays with a validity mask.

  Args:
    splits: one Split per client (K >= 1). Each client's examples keep their
      order and occupy the first `len(split)` rows.
    pad_to: rows per client; default the largest client. Must be at least
      the largest client (use it to round up to a batch multiple).

  Returns:
    StackedClients with images (K, N, 32, 32, 3), labels (K, N), mask (K, N),
    sizes (K,), where N = pad_to or the largest size.

  Raises:
    ValueError: if `splits` is empty or `pad_to` is below the largest client.
  """
  if not splits:
    raise ValueError("stack_clients: `splits` must hold at least one client, got none.")
  sizes = np.array([len(s) for s in splits], dtype=np.int32)
  largest = int(sizes.max())
  rows = largest if pad_to is None else int(pad_to)
  if rows < largest:
    raise ValueError(f"stack_clients: `pad_to` must be >= the largest client ({largest}), "
                     f"got {pad_to}.")
  k = len(splits)
  images = np.zeros((k, rows) + IMAGE_SHAPE, dtype=np.uint8)
  labels = np.zeros((k, rows), dtype=np.int32)
  mask = np.zeros((k, rows), dtype=bool)
  for i, split in enumerate(splits):
    n = len(split)
    images[i, :n] = split.images
    labels[i, :n] = split.labels
    mask[i, :n] = True
  return StackedClients(images=images, labels=labels, mask=mask, sizes=sizes)


# ----------------------------------------------------------------------------
# Directories and cache.
# ----------------------------------------------------------------------------


def default_data_dir() -> pathlib.Path:
  """The data directory when neither `data_dir` nor $FEDJAX_HET_DATA_DIR names one: `data/`
  in the cache directory (`cache_dir()`: ~/.cache/fedjax_het/data by default), where
  `python -m fedjax_het.data.download` writes and every config reads."""
  return cache_dir() / "data"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The directory of the offline `.npz` bundle.

  Args:
    data_dir: explicit directory (wins when given).

  Returns:
    `data_dir` if given, else the value of the environment variable
    FEDJAX_HET_DATA_DIR if set and non-empty, else `default_data_dir()`. The
    directory is not checked here; loaders report a missing file with
    instructions.
  """
  if data_dir is not None and str(data_dir) != "":
    return pathlib.Path(data_dir).expanduser()
  env = os.environ.get(DATA_DIR_ENV, "")
  if env:
    return pathlib.Path(env).expanduser()
  return default_data_dir()


def cache_dir() -> pathlib.Path:
  """Cache directory for generated data: $FEDJAX_HET_CACHE_DIR or ~/.cache/fedjax_het."""
  env = os.environ.get(CACHE_DIR_ENV, "")
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path("~/.cache/fedjax_het").expanduser()


def atomic_save_npz(path: pathlib.Path, **arrays: np.ndarray) -> None:
  """Writes an uncompressed `.npz` atomically (temporary file + rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise


def cached_arrays(name: str, generate: Callable[[], dict[str, np.ndarray]],
                  use_cache: bool = True) -> dict[str, np.ndarray]:
  """Loads `name` from the cache directory or generates and stores it.

  A cache file that cannot be read (truncated, corrupt) is logged and
  regenerated: the cache holds nothing that cannot be recomputed.

  Args:
    name: file name inside `cache_dir()`; it must encode every parameter of
      `generate` (and a version) so that a change regenerates.
    generate: returns the arrays to store.
    use_cache: False generates without touching the disk.

  Returns:
    dict of arrays.
  """
  if not use_cache:
    return generate()
  path = cache_dir() / name
  if path.exists():
    try:
      with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
      logger.warning("Cache file %s is unreadable (%s); regenerating it.", path, e)
  arrays = generate()
  try:
    atomic_save_npz(path, **arrays)
  except OSError as e:
    logger.warning("Could not write the cache file %s (%s); continuing without cache.", path, e)
  return arrays

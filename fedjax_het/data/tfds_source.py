"""TensorFlow Datasets as a source, through `tfds.data_source` (no TensorFlow needed).

`tensorflow_datasets` is an optional dependency (`pip install
"fedjax_het[data]"`), imported only when a TFDS source is used. Random-access
reading (`tfds.data_source`) works without TensorFlow, but the dataset must
have been prepared once in the `array_record` file format (preparing the
built-in builders needs TensorFlow and network access, once, anywhere; the
prepared directory can then be copied). The TFDS data directory is the
`data_dir` argument, else TFDS's own default ($TFDS_DATA_DIR or
~/tensorflow_datasets).

Images are converted like the references' torchvision pipeline: resized to
32x32 with bilinear resampling (Pillow-compatible, `_imageops`) and grey
images repeated to three channels.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedjax_het.data._base import DataError, DataUnavailableError, Split, check_labels
from fedjax_het.data._imageops import to_rgb32

#: Short names used by scenarios and `load_dataset`, mapped to TFDS builder names.
TFDS_NAMES = {"mnist": "mnist", "svhn": "svhn_cropped", "cifar10": "cifar10",
              "cifar100": "cifar100", "fmnist": "fashion_mnist",
              "fashion_mnist": "fashion_mnist"}

_INSTALL_HINT = 'pip install "fedjax_het[data]"  (tensorflow-datasets, pillow, importlib_resources)'


def _drop_variant_folder_warning(record: logging.LogRecord) -> bool:
  """TFDS warns "Variant folder ... has no dataset_info.json" while it probes an unprepared
  dataset; the data layer reports that case itself (with how to prepare it)."""
  return "Variant folder" not in str(record.msg)


def import_tfds() -> Any:
  """Imports tensorflow_datasets lazily; DataUnavailableError if it is not installed."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataUnavailableError(
        f"tensorflow_datasets is not installed, so TFDS sources cannot be used. Install the "
        f"optional extra: {_INSTALL_HINT}.") from e
  absl_logger = logging.getLogger("absl")
  if _drop_variant_folder_warning not in absl_logger.filters:
    absl_logger.addFilter(_drop_variant_folder_warning)
  return tfds


def _prepare_hint(builder: str, data_dir: str | os.PathLike | None) -> str:
  where = f"data_dir={str(data_dir)!r}" if data_dir else "the default TFDS data directory"
  return (f"Prepare it once in the array_record format (needs TensorFlow and network, once):\n"
          f"  python -c \"import tensorflow_datasets as tfds; tfds.builder('{builder}', "
          f"file_format='array_record'{', data_dir=' + repr(str(data_dir)) if data_dir else ''})"
          f".download_and_prepare()\"\n"
          f"into {where}, or choose another source for this domain.")


def tfds_source(name: str, split: str, *, data_dir: str | os.PathLike | None = None) -> Any:
  """Opens a TFDS random-access data source, with actionable errors.

  Args:
    name: TFDS builder name (e.g. "svhn_cropped") or a short name of
      `TFDS_NAMES` (e.g. "svhn").
    split: TFDS split string ("train", "test", "train[:10%]", ...).
    data_dir: TFDS data directory (default: TFDS's own).

  Returns:
    The `tfds.data_source` object (len() and integer indexing give numpy dicts).

  Raises:
    DataUnavailableError: tensorflow_datasets missing, or the dataset not
      prepared (for random access) in the data directory.
  """
  tfds = import_tfds()
  builder = TFDS_NAMES.get(name, name)
  try:
    return tfds.data_source(builder, split=split, data_dir=None if data_dir is None
                            else os.fspath(data_dir), download=False)
  except Exception as e:  # TFDS raises many types here (not found, wrong format, ...).
    raise DataUnavailableError(
        f"TFDS dataset {builder!r} (split {split!r}) is not available for random access: "
        f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}\n"
        f"{_prepare_hint(builder, data_dir)}") from e


def _num_classes(source: Any, label_key: str) -> int | None:
  try:
    return int(source.dataset_info.features[label_key].num_classes)
  except Exception:  # pylint: disable=broad-except
    return None


def load_tfds(name: str, split: str, *, data_dir: str | os.PathLike | None = None,
              indices: Sequence[int] | np.ndarray | None = None,
              image_key: str = "image", label_key: str = "label") -> Split:
  """Reads a TFDS image-classification split into a Split (uint8 32x32 RGB).

  Args:
    name: TFDS builder name or short name (see `TFDS_NAMES`), e.g. "mnist",
      "svhn_cropped", "cifar10", "cifar100", "fashion_mnist".
    split: TFDS split string.
    data_dir: TFDS data directory (default: TFDS's own).
    indices: read only these example indices (in this order); default all.
      Reading is per example, so sampling indices first is much faster for
      large splits.
    image_key, label_key: feature names.

  Returns:
    Split with images resized to 32x32 (Pillow-style bilinear) and repeated to
    3 channels if grey; labels validated against the dataset's class count.

  Raises:
    DataUnavailableError: see `tfds_source`.
    DataError: an example lacks the features or has an unusable image.
  """
  source = tfds_source(name, split, data_dir=data_dir)
  total = len(source)
  order = np.arange(total) if indices is None else np.asarray(indices, dtype=np.int64)
  if order.size and (order.min() < 0 or order.max() >= total):
    raise ValueError(f"load_tfds: `indices` must lie in [0, {total}) for {name}[{split}], "
                     f"got values in [{order.min()}, {order.max()}].")
  images, labels = [], []
  for i in order:
    example = source[int(i)]
    try:
      image, label = np.asarray(example[image_key]), example[label_key]
    except KeyError as e:
      raise DataError(f"tfds:{name}[{split}] example {i}: missing feature {e}; it has "
                      f"{sorted(example)}.") from e
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
      raise DataError(f"tfds:{name}[{split}] example {i}: expected a uint8 image (H, W[, C]), "
                      f"found dtype {image.dtype} shape {image.shape}.")
    images.append(image)
    labels.append(int(label))
  if not images:
    return Split(np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.int32))
  if all(im.shape == images[0].shape for im in images):
    rgb = to_rgb32(np.stack(images))
  else:
    rgb = np.concatenate([to_rgb32(im[None]) for im in images])
  label_array = check_labels(np.asarray(labels, dtype=np.int64), len(labels),
                             f"tfds:{name}[{split}]", num_classes=_num_classes(source, label_key))
  return Split(rgb, label_array)


def tfds_split_size(name: str, split: str, *, data_dir: str | os.PathLike | None = None) -> int:
  """Number of examples of a prepared TFDS split (opens the source)."""
  return len(tfds_source(name, split, data_dir=data_dir))

"""ImageFolder-style loader for data users download themselves (SYN, Office-Home, Caltech).

Layout (as torchvision's `ImageFolder`): one sub-folder per class under a
root; class names are the sub-folder names, sorted; images inside a class
folder (searched recursively) are read in sorted path order. Every image is
converted to RGB and resized to 32x32 with Pillow's BILINEAR filter, i.e.
`torchvision.transforms.Resize((32, 32))` on a PIL image, as the FCCL code
does.

Pillow is an optional dependency (`pip install "fedjax_het[data]"`), imported
only here.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from fedjax_het.data._base import DataError, DataUnavailableError, Split

#: File suffixes read as images (case-insensitive), torchvision's list.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _import_pil():
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataUnavailableError(
        'Pillow is not installed, so image folders cannot be read. Install the optional extra: '
        'pip install "fedjax_het[data]".') from e
  return Image


def class_folders(root: str | os.PathLike) -> tuple[str, ...]:
  """Sorted names of the class sub-folders of `root` (hidden folders ignored)."""
  root = pathlib.Path(root)
  if not root.is_dir():
    raise DataUnavailableError(f"{root}: image folder not found (expected a directory with one "
                               "sub-folder per class).")
  names = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
  if not names:
    raise DataError(f"{root}: no class sub-folders found (expected one sub-folder per class, "
                    "e.g. root/0/*.png, root/1/*.png, ...).")
  return names


def load_image_folder(root: str | os.PathLike, *,
                      class_names: Sequence[str] | None = None) -> tuple[Split, tuple[str, ...]]:
  """Reads an ImageFolder tree into a Split of uint8 32x32 RGB images.

  Args:
    root: directory with one sub-folder per class.
    class_names: expected class folders, in label order. Default: the sorted
      sub-folder names (torchvision's rule). When given, the sub-folders must
      be exactly these names.

  Returns:
    (Split, class names): examples ordered by class, then by sorted path;
    label = index of the class name.

  Raises:
    DataUnavailableError: the root does not exist, or Pillow is missing.
    DataError: no class folders, an empty class, a class-name mismatch, or
      an unreadable image (the message names the file).
  """
  image_module = _import_pil()
  root = pathlib.Path(root)
  found = class_folders(root)
  names = found if class_names is None else tuple(class_names)
  if set(names) != set(found):
    raise DataError(f"{root}: class folders {list(found)} do not match the expected classes "
                    f"{list(names)}.")
  images, labels = [], []
  for label, name in enumerate(names):
    files = sorted(p for p in (root / name).rglob("*")
                   if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
      raise DataError(f"{root / name}: class folder holds no image files "
                      f"(extensions {IMAGE_EXTENSIONS}).")
    for path in files:
      try:
        with image_module.open(path) as im:
          rgb = im.convert("RGB").resize((32, 32), image_module.BILINEAR)
          images.append(np.asarray(rgb, dtype=np.uint8))
      except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot be read as an image: {e}") from e
      labels.append(label)
  return Split(np.stack(images), np.asarray(labels, dtype=np.int32)), names

"""ImageFolder-style loader for data users download themselves (SYN, Office-Home, Caltech).

Layout (as torchvision's `ImageFolder`): one sub-folder per class under a
root; class names are the sub-folder names, sorted; images inside a class
folder (searched recursively) are read in sorted path order. Every image is
converted to RGB and resized to `size` x `size` (default 32) with Pillow's
BILINEAR filter, i.e. `torchvision.transforms.Resize((size, size))` on a PIL
image, as the FCCL code does; `fit="center_crop"` instead scales the shorter
side to `size` and keeps the central square (the aspect ratio is kept, as
ImageNet's Resize + CenterCrop evaluation transform does).

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


#: `load_image_folder`'s `fit`: stretch to the square, or scale the shorter side and crop.
FITS = ("stretch", "center_crop")


def load_image_folder(root: str | os.PathLike, *,
                      class_names: Sequence[str] | None = None, size: int = 32,
                      fit: str = "stretch") -> tuple[Split, tuple[str, ...]]:
  """Reads an ImageFolder tree into a Split of uint8 `size` x `size` RGB images.

  Args:
    root: directory with one sub-folder per class.
    class_names: expected class folders, in label order. Default: the sorted
      sub-folder names (torchvision's rule). When given, the sub-folders must
      be exactly these names.
    size: side of the returned images (an integer >= 1; default 32).
    fit: "stretch" (resize to size x size, the default) or "center_crop"
      (the shorter side to `size`, then the central square; module docstring).

  Returns:
    (Split, class names): examples ordered by class, then by sorted path;
    label = index of the class name.

  Raises:
    DataUnavailableError: the root does not exist, or Pillow is missing.
    DataError: no class folders, an empty class, a class-name mismatch, or
      an unreadable image (the message names the file).
  """
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
    raise ValueError(f"load_image_folder: `size` must be an integer >= 1, got {size!r}.")
  if fit not in FITS:
    raise ValueError(f"load_image_folder: `fit` must be one of {FITS}, got {fit!r}.")
  size = int(size)
  image_module = _import_pil()
  root = pathlib.Path(root)
  found = class_folders(root)
  names = found if class_names is None else tuple(class_names)
  if set(names) != set(found):
    raise DataError(f"{root}: class folders {list(found)} do not match the expected classes "
                    f"{list(names)}.")
  per_class = []
  for name in names:
    files = sorted(p for p in (root / name).rglob("*")
                   if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
      raise DataError(f"{root / name}: class folder holds no image files "
                      f"(extensions {IMAGE_EXTENSIONS}).")
    per_class.append(files)
  # Filled in place: one (N, size, size, 3) array, no list of images to stack (ImageNet-scale
  # folders at 224 px would need twice the pool's memory otherwise).
  images = np.empty((sum(len(f) for f in per_class), size, size, 3), np.uint8)
  labels = np.repeat(np.arange(len(names), dtype=np.int32), [len(f) for f in per_class])
  row = 0
  for files in per_class:
    for path in files:
      try:
        with image_module.open(path) as im:
          rgb = im.convert("RGB")
          if fit == "center_crop":
            rgb = _center_crop(rgb, size, image_module.BILINEAR)
          else:
            rgb = rgb.resize((size, size), image_module.BILINEAR)
          images[row] = np.asarray(rgb, dtype=np.uint8)
      except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot be read as an image: {e}") from e
      row += 1
  return Split(images, labels), names


def _center_crop(image, size: int, resample):
  """The shorter side scaled to `size` (BILINEAR), then the central size x size square."""
  width, height = image.size
  scale = size / min(width, height)
  new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
  image = image.resize((new_w, new_h), resample)
  left, top = (new_w - size) // 2, (new_h - size) // 2
  return image.crop((left, top, left + size, top + size))

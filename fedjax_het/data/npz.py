"""Loaders of the `.npz` bundle (digits, Office, CIFAR, Fashion-MNIST, Tiny-ImageNet).

The bundle is a directory of `.npz` files (docs/data.md lists them): uint8
images (N, 32, 32, 3) RGB under `*_x` / `x` keys (`tinyimagenet.npz`: 64x64,
read at 64 or 32 by `load_tinyimagenet`), integer labels under
`*_y` / `y` keys, read with `np.load(allow_pickle=False)`. The directory
comes from the `data_dir` argument or the FEDJAX_HET_DATA_DIR environment
variable (`resolve_data_dir`); files are read in place, never copied.

Everything loaded is validated; problems raise errors that name the file and
key and say what was expected and what was found:

  * DataUnavailableError: the file is missing from the data directory.
  * DataError: the file is not a readable `.npz` (truncated, corrupt), a key
    is missing, images are not uint8 (N, 32, 32, 3), labels are not integer,
    lie outside [0, num_classes), or their count differs from the images'.

`python -m fedjax_het.data.download` writes these files from the official
datasets (`fedjax_het.data.download`, docs/data.md): e.g. `svhn_train_x` /
`svhn_train_y` / `svhn_test_x` / `svhn_test_y` and the `syn_*` keys in
digits.npz, `caltech_x` / `caltech_y` in office_caltech10.npz, an
`office_home.npz` with `art_x`, `art_y`, `clipart_x`, ... (65 classes),
`fmnist.npz` (the official Fashion-MNIST split) or `tinyimagenet.npz`. Files
made by other means with the same layout load the same way.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from fedjax_het.data._base import (DATA_DIR_ENV, DataError, DataUnavailableError, Split,
                                   check_images, check_labels, resolve_data_dir)
from fedjax_het.data._imageops import area_downsample


@dataclasses.dataclass(frozen=True)
class BundleFile:
  """One file of the offline bundle.

  Attributes:
    filename: file name inside the data directory.
    num_classes: labels must lie in [0, num_classes).
    description: what the file holds (used in error messages).
    download: the arguments of `python -m fedjax_het.data.download` that write
      the file (used in error messages).
  """
  filename: str
  num_classes: int
  description: str
  download: str


#: The files of the offline bundle, by short name.
BUNDLE: dict[str, BundleFile] = {
    "digits": BundleFile("digits.npz", 10, "MNIST, USPS, SVHN and SYN train/test splits",
                         "mnist usps svhn (SYN: syn --from PATH)"),
    "office31": BundleFile("office31.npz", 31, "Office-31 amazon/dslr/webcam",
                           "office31 --from PATH"),
    "office_caltech": BundleFile("office_caltech10.npz", 10,
                                 "Office-Caltech-10 amazon/caltech/dslr/webcam",
                                 "office_caltech --from PATH"),
    "office_home": BundleFile("office_home.npz", 65, "Office-Home art/clipart/product/real_world",
                              "office_home --from PATH"),
    "cifar10": BundleFile("cifar10.npz", 10, "CIFAR-10 train/test", "cifar10"),
    "cifar100_glfc": BundleFile("cifar100_glfc.npz", 100, "CIFAR-100 train/test for GLFC",
                                "cifar100"),
    "public_cifar100": BundleFile("public_cifar100_5000.npz", 100,
                                  "5000 CIFAR-100 images (FCCL public data)", "cifar100"),
    "public_fmnist": BundleFile("public_fmnist_5000.npz", 10, "5000 Fashion-MNIST images",
                                "fmnist"),
    "public_tinyimagenet": BundleFile("public_tinyimagenet_5000.npz", 200,
                                      "5000 Tiny-ImageNet images", "tinyimagenet"),
    "fashion_mnist": BundleFile("fmnist.npz", 10, "Fashion-MNIST train/test", "fmnist"),
    "tinyimagenet": BundleFile("tinyimagenet.npz", 200, "Tiny-ImageNet-200 train/val at 64x64",
                               "tinyimagenet"),
}

#: The download command's arguments that write one domain's keys of a file, where they
#: differ from the file's (`BundleFile.download`): the digit domains one by one.
_DOMAIN_DOWNLOAD = {("digits.npz", d): d for d in ("mnist", "usps", "svhn")}
_DOMAIN_DOWNLOAD[("digits.npz", "syn")] = "syn --from PATH"

#: Public-set names accepted by `load_public`, mapped to bundle entries.
PUBLIC_FILES = {"cifar100": "public_cifar100", "fmnist": "public_fmnist",
                "tinyimagenet": "public_tinyimagenet"}

#: FCCL+ benchmark split of the Office datasets: index i (within a domain's
#: array) is a training example iff i % 10 <= OFFICE_TRAIN_MAX_REMAINDER.
OFFICE_TRAIN_MAX_REMAINDER = 7

_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def bundle_path(entry: str, data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Path of a bundle file in the data directory (`resolve_data_dir`).

  Args:
    entry: a key of `BUNDLE` (e.g. "digits").
    data_dir: explicit directory, else $FEDJAX_HET_DATA_DIR, else the default
      (~/.cache/fedjax_het/data).
  """
  if entry not in BUNDLE:
    raise ValueError(f"`entry` must be one of {tuple(BUNDLE)}, got {entry!r}.")
  return resolve_data_dir(data_dir) / BUNDLE[entry].filename


class _NpzReader:
  """Reads and validates arrays of one `.npz` file, with errors naming the file."""

  def __init__(self, path: pathlib.Path, spec: BundleFile):
    self.path = path
    self.spec = spec
    if not path.is_file():
      raise DataUnavailableError(
          f"{path}: file not found. Expected the bundle file {spec.filename} "
          f"({spec.description}) in the data directory {path.parent}. Write it there with: "
          f"python -m fedjax_het.data.download --data_dir {path.parent} {spec.download} "
          f"(docs/data.md), or point data_dir / {DATA_DIR_ENV} at the directory that holds it.")
    try:
      self._npz = np.load(path, allow_pickle=False)
      self.keys = tuple(self._npz.files)
    except _READ_ERRORS as e:
      raise DataError(f"{path}: cannot be read as an .npz archive (truncated or corrupt "
                      f"file?): {type(e).__name__}: {e}") from e

  def close(self) -> None:
    self._npz.close()

  def __enter__(self) -> _NpzReader:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def has(self, key: str) -> bool:
    return key in self.keys

  def array(self, key: str) -> np.ndarray:
    if key not in self.keys:
      raise DataError(f"{self.path}: missing key {key!r}; the file has keys "
                      f"{sorted(self.keys)}.")
    try:
      return self._npz[key]
    except _READ_ERRORS as e:
      raise DataError(f"{self.path}: key {key!r} cannot be read (truncated or corrupt "
                      f"file?): {type(e).__name__}: {e}") from e

  def split(self, x_key: str, y_key: str) -> Split:
    """Validated Split from an image key and a label key."""
    images = self.array(x_key)
    labels = self.array(y_key)
    where = f"{self.path} [{x_key}]"
    check_images(images, where)
    labels = check_labels(labels, images.shape[0], f"{self.path} [{y_key}]",
                          num_classes=self.spec.num_classes)
    return Split(images, labels)

  def class_names(self) -> tuple[str, ...]:
    if not self.has("classes"):
      return ()
    names = tuple(str(c) for c in self.array("classes"))
    if len(names) != self.spec.num_classes:
      raise DataError(f"{self.path} [classes]: expected {self.spec.num_classes} class names, "
                      f"found {len(names)}.")
    return names


def open_bundle(entry: str, data_dir: str | os.PathLike | None = None) -> _NpzReader:
  """Opens a bundle file for validated reading (use as a context manager)."""
  return _NpzReader(bundle_path(entry, data_dir), BUNDLE[entry])


def index_split(split: Split, max_remainder: int = OFFICE_TRAIN_MAX_REMAINDER
                ) -> tuple[Split, Split]:
  """Deterministic train/test split by index: train iff i % 10 <= max_remainder.

  The rule of the FCCL+ benchmark code for Office31, Office-Caltech and
  Office-Home (80% train): it needs no seed and interleaves the classes.
  """
  index = np.arange(len(split))
  train = index % 10 <= max_remainder
  return split.take(index[train]), split.take(index[~train])


# ----------------------------------------------------------------------------
# Per-file loaders.
# ----------------------------------------------------------------------------


def _domains(reader: _NpzReader, suffix: str, domains: Sequence[str] | None,
             keys: str) -> tuple[str, ...]:
  """The requested domains of a bundle file whose arrays are `<domain><suffix>`, checked.

  `keys` names a domain's keys for the error message, "{d}" standing for the domain.
  """
  present = tuple(k[:-len(suffix)] for k in reader.keys if k.endswith(suffix))
  wanted = present if domains is None else tuple(domains)
  for domain in wanted:
    if domain not in present:
      command = _DOMAIN_DOWNLOAD.get((reader.spec.filename, domain), reader.spec.download)
      raise DataUnavailableError(
          f"{reader.path}: has no {domain!r} domain (keys {keys.format(d=domain)}); it holds "
          f"{list(present)}. Add it with: python -m fedjax_het.data.download --data_dir "
          f"{reader.path.parent} {command} (docs/data.md).")
  return wanted


def load_npz_digits(data_dir: str | os.PathLike | None = None,
                    domains: tuple[str, ...] | None = None) -> dict[str, tuple[Split, Split]]:
  """Real digit domains from digits.npz: {domain: (train, test)}.

  Args:
    data_dir: bundle directory (else $FEDJAX_HET_DATA_DIR).
    domains: domains to read (default: every domain with `<d>_train_x` keys:
      mnist, usps, svhn, syn, those the file holds). A requested domain whose
      keys are absent raises DataUnavailableError.

  Returns:
    dict domain -> (train Split, test Split). Sizes as downloaded: mnist
    60000 / 10000, usps 7291 / 2007, svhn 73257 / 26032 (official splits);
    a compact copy may hold fewer (e.g. mnist 1000 per class of the official
    train set).
  """
  with open_bundle("digits", data_dir) as reader:
    wanted = _domains(reader, "_train_x", domains, "{d}_train_x/_train_y/_test_x/_test_y")
    return {domain: (reader.split(f"{domain}_train_x", f"{domain}_train_y"),
                     reader.split(f"{domain}_test_x", f"{domain}_test_y")) for domain in wanted}


def load_office_domains(entry: str, data_dir: str | os.PathLike | None = None,
                        domains: tuple[str, ...] | None = None
                        ) -> tuple[dict[str, Split], tuple[str, ...]]:
  """All images of each domain of an Office-style bundle file (no split).

  Args:
    entry: "office31", "office_caltech" or "office_home".
    data_dir: bundle directory.
    domains: domains to read (default: every `<d>_x` key of the file).

  Returns:
    ({domain: Split}, class names) with the file's class names (or () if
    the file has no `classes` key).
  """
  with open_bundle(entry, data_dir) as reader:
    wanted = _domains(reader, "_x", domains, "{d}_x/{d}_y")
    return ({domain: reader.split(f"{domain}_x", f"{domain}_y") for domain in wanted},
            reader.class_names())


def load_office31(data_dir: str | os.PathLike | None = None) -> dict[str, tuple[Split, Split]]:
  """Office-31 amazon/dslr/webcam, split by index (train iff i % 10 <= 7).

  Returns:
    dict domain -> (train, test). Shipped sizes: amazon 2255/562, dslr
    400/98, webcam 637/158; 31 classes (alphabetical).
  """
  domains, _ = load_office_domains("office31", data_dir)
  return {d: index_split(s) for d, s in domains.items()}


def load_office_caltech(data_dir: str | os.PathLike | None = None
                        ) -> dict[str, tuple[Split, Split]]:
  """Office-Caltech-10 domains present in the bundle, split like `load_office31`.

  The domains are those the file holds (`download office_caltech --from PATH`
  merges the ones it finds); a domain missing from the file can also come
  from an image folder.
  """
  domains, _ = load_office_domains("office_caltech", data_dir)
  return {d: index_split(s) for d, s in domains.items()}


def load_cifar10(data_dir: str | os.PathLike | None = None) -> tuple[Split, Split]:
  """CIFAR-10 (train, test) from cifar10.npz (1000 per class train, full test)."""
  with open_bundle("cifar10", data_dir) as reader:
    return reader.split("train_x", "train_y"), reader.split("test_x", "test_y")


def load_cifar100_glfc(data_dir: str | os.PathLike | None = None) -> tuple[Split, Split]:
  """CIFAR-100 (train, test) from cifar100_glfc.npz.

  `python -m fedjax_het.data.download cifar100` writes the official split
  (500 / 100 per class); a compact copy with 120 / 50 per class drawn from
  the merged sets is not the official split (docs/data.md), fine for
  development but not for paper-exact GLFC numbers.
  """
  with open_bundle("cifar100_glfc", data_dir) as reader:
    return reader.split("train_x", "train_y"), reader.split("test_x", "test_y")


def load_fashion_mnist(data_dir: str | os.PathLike | None = None) -> tuple[Split, Split]:
  """Fashion-MNIST (train, test) from fmnist.npz.

  `python -m fedjax_het.data.download fmnist` writes the official split
  (60,000 / 10,000 images of Xiao et al. 2017), 28x28 grey resized with
  Pillow's BILINEAR filter to 32x32 and repeated to three channels, as the
  public set `public_fmnist_5000.npz` beside it.
  """
  with open_bundle("fashion_mnist", data_dir) as reader:
    return reader.split("train_x", "train_y"), reader.split("test_x", "test_y")


#: Resolutions `load_tinyimagenet` returns: the stored 64x64, or 32x32 by 2x2 area averaging.
TINYIMAGENET_RESOLUTIONS = (64, 32)


class LabelledImages(NamedTuple):
  """Images of any square size with their labels.

  Attributes:
    images: uint8 (N, S, S, 3) RGB.
    labels: int32 (N,).
  """
  images: np.ndarray
  labels: np.ndarray


class TinyImageNet(NamedTuple):
  """Tiny-ImageNet-200 as `load_tinyimagenet` returns it.

  Attributes:
    train: the training images (500 per class in the official release).
    test: the official validation images (50 per class), Tiny-ImageNet's
      labelled test set (its test images have no published labels).
    wnids: the 200 WordNet ids, the class names by label.
    resolution: the side of the images (64 or 32).
  """
  train: LabelledImages
  test: LabelledImages
  wnids: tuple[str, ...]
  resolution: int


def load_tinyimagenet(data_dir: str | os.PathLike | None = None,
                      resolution: int = 64) -> TinyImageNet:
  """Tiny-ImageNet-200 from tinyimagenet.npz, at 64x64 or 32x32.

  `python -m fedjax_het.data.download tinyimagenet` writes the file from the
  official tiny-imagenet-200.zip (cs231n.stanford.edu): `train_x` / `train_y`
  (100,000 images), `val_x` / `val_y` (10,000) at the released 64x64, and
  `wnids` (labels index the order of `wnids.txt`).

  Args:
    data_dir: bundle directory (else $FEDJAX_HET_DATA_DIR).
    resolution: 64 (the images as released; GLFC trains Tiny-ImageNet at
      64x64) or 32 (each 2x2 block averaged and rounded half up,
      `_imageops.area_downsample`, bit-identical to Pillow's
      `Image.reduce(2)`; the 5000-image public set is instead resized with
      BILINEAR, as torchvision's Resize((32, 32))).

  Returns:
    TinyImageNet with uint8 (N, resolution, resolution, 3) images.
  """
  if resolution not in TINYIMAGENET_RESOLUTIONS:
    raise ValueError(f"`resolution` must be one of {TINYIMAGENET_RESOLUTIONS}, got "
                     f"{resolution!r}.")
  with open_bundle("tinyimagenet", data_dir) as reader:
    wnids = tuple(str(w) for w in reader.array("wnids"))
    if len(wnids) != reader.spec.num_classes:
      raise DataError(f"{reader.path} [wnids]: expected {reader.spec.num_classes} WordNet ids, "
                      f"found {len(wnids)}.")
    splits = []
    for split in ("train", "val"):
      images = reader.array(f"{split}_x")
      where = f"{reader.path} [{split}_x]"
      if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (64, 64, 3):
        raise DataError(f"{where}: images must be uint8 (N, 64, 64, 3), got {images.dtype} "
                        f"{images.shape}.")
      labels = check_labels(reader.array(f"{split}_y"), images.shape[0],
                            f"{reader.path} [{split}_y]", num_classes=reader.spec.num_classes)
      splits.append(LabelledImages(area_downsample(images, 64 // resolution), labels))
  return TinyImageNet(splits[0], splits[1], wnids, resolution)


def load_public(name: str, data_dir: str | os.PathLike | None = None) -> np.ndarray:
  """A public unlabeled set of the bundle as uint8 (N, 32, 32, 3).

  Args:
    name: "cifar100", "fmnist" or "tinyimagenet" (5000 images each).
    data_dir: bundle directory.

  Returns:
    The images (labels are validated but dropped: public data is unlabeled).
  """
  if name not in PUBLIC_FILES:
    raise ValueError(f"`name` must be one of {tuple(PUBLIC_FILES)}, got {name!r}.")
  with open_bundle(PUBLIC_FILES[name], data_dir) as reader:
    return reader.split("x", "y").images


def available_bundle_files(data_dir: str | os.PathLike | None = None) -> Mapping[str, bool]:
  """Which bundle files exist in the data directory (all False if none is set)."""
  directory = resolve_data_dir(data_dir)
  return {entry: directory is not None and (directory / spec.filename).is_file()
          for entry, spec in BUNDLE.items()}

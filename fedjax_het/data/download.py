"""Downloads the real datasets from their publishers and converts them to the `.npz` bundle.

  python -m fedjax_het.data.download mnist usps svhn cifar100 [--data_dir DIR]
  python -m fedjax_het.data.download syn --from ~/Downloads/synthetic-digits.zip
  python -m fedjax_het.data.download --list

Each dataset with a stable public URL is fetched from its publisher (the URLs
and MD5 checksums torchvision publishes; Avalanche's for Tiny-ImageNet, which
torchvision lacks; the source of every checksum is named beside it in
`DATASETS` and recorded in the manifest), verified, and converted into
the layout `fedjax_het.data.npz` reads (uint8 (N, 32, 32, 3) RGB images, int64
labels; grey images resized with Pillow's BILINEAR filter to 32x32 and repeated
to three channels, as `torchvision.transforms.Resize((32, 32))` does). Datasets
behind a login or a form (SYN, Office31, Office-Caltech-10, Office-Home) are
converted from what the user downloaded (`--from PATH`, an archive or a
folder); their error line says where to get them. `--from` also accepts the
official files of the downloadable datasets (checksums verified).

The data directory is `--data_dir`, else $FEDJAX_HET_DATA_DIR, the directory
the configs read (`scenario.data_dir`). Raw downloads stay under
`<data_dir>/downloads/` (removed with `--delete_raw`); every conversion is
recorded in `<data_dir>/manifest.json` (source URL, checksum and its source,
date, byte sizes, array shapes).

Robustness: a download is written to `<name>.part`, resumed with an HTTP Range
request after a cut connection (in the same run and on the next), verified,
and only then renamed; a checksum mismatch removes the partial file. The
`.npz` outputs are written to a temporary name in the data directory and
renamed, so no interrupted or corrupt download leaves a file the loaders
accept. Network failures, timeouts and checksum mismatches raise
`DownloadError` (one line naming the URL and the manual alternative).

Layout written (docs/data.md lists sizes and licences):

  * mnist, usps, svhn, syn -> `digits.npz`, keys `<domain>_{train,test}_{x,y}`
    (merged into an existing digits.npz; the other domains' keys are kept).
  * svhn_extra -> `svhn_extra.npz` (`x`, `y`: SVHN's 531,131 extra images).
  * cifar10 -> `cifar10.npz` (official 50,000 / 10,000 split, `classes`).
  * cifar100 -> `cifar100_glfc.npz` (official 50,000 / 10,000 split, fine
    labels, `classes`) and `public_cifar100_5000.npz` (50 train images per
    class: FCCL's public set).
  * fmnist -> `fmnist.npz` (official 60,000 / 10,000 split, `classes`) and
    `public_fmnist_5000.npz` (500 train images per class).
  * tinyimagenet -> `tinyimagenet.npz` (64x64 train and val images, `wnids`)
    and `public_tinyimagenet_5000.npz` (25 train images per class at 32x32).
  * office31 -> `office31.npz`; office_caltech -> `office_caltech10.npz`
    (merged per domain); office_home -> `office_home.npz`: `<domain>_x`,
    `<domain>_y`, `classes` (ImageFolder order: classes sorted, then paths).

Public subsets draw `per_class` images of each class of the official train set
with `numpy.random.default_rng(0)` (sorted indices).
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import dataclasses
import datetime
import gzip
import hashlib
import http.client
import io
import json
import os
import pathlib
import pickle
import shutil
import socket
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from fedjax_het.data._base import DATA_DIR_ENV, DataError, DataUnavailableError, resolve_data_dir
from fedjax_het.data._imageops import resize_uint8_like_pil, to_rgb32
from fedjax_het.data.folder import IMAGE_EXTENSIONS, load_image_folder

#: File (inside the data directory) recording what was downloaded and converted.
MANIFEST = "manifest.json"
#: Sub-directory of the data directory holding the raw downloaded files.
DOWNLOADS = "downloads"
#: Seconds without data before a download attempt fails.
DEFAULT_TIMEOUT = 60.0
#: Attempts per URL (each resumes where the previous one was cut).
ATTEMPTS = 3
_CHUNK = 1 << 20
_DOCS = "docs/data.md"


class DownloadError(DataUnavailableError):
  """A download failed (network, timeout, checksum); the message names the URL and `--from`."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  """One official file of a dataset.

  Attributes:
    urls: where to fetch it, tried in order (mirrors after the first).
    md5: its published MD5 (hex).
    checksum_source: where that checksum is published (repository and path).
  """
  urls: tuple[str, ...]
  md5: str
  checksum_source: str

  @property
  def filename(self) -> str:
    return self.urls[0].rsplit("/", 1)[-1]


#: Converter: (official file name -> local path, or the unpacked `--from` folder) -> outputs.
Converter = Callable[[Mapping[str, pathlib.Path] | pathlib.Path], dict[str, dict[str, np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A dataset the command knows.

  Attributes:
    name: the command-line name.
    title: the dataset's name in prose.
    homepage: its publisher's page.
    licence: its licence or terms of use, one line.
    size: number of images, and the download size where it has a URL (text).
    files: its official files; empty when it has no stable public URL (then
      only `--from` converts it, see `manual`).
    outputs: bundle file name -> keys that mark the dataset as present.
    merge: output files merged into an existing file of that name (keys of
      the written domains replaced, the others kept) instead of replaced.
    manual: where to get the data for `--from` (datasets without `files`).
    convert: the converter (see `Converter`).
  """
  name: str
  title: str
  homepage: str
  licence: str
  size: str
  files: tuple[RemoteFile, ...]
  outputs: Mapping[str, tuple[str, ...]]
  convert: Converter
  merge: tuple[str, ...] = ()
  manual: str = ""


# ----------------------------------------------------------------------------
# Readers of the official formats.
# ----------------------------------------------------------------------------


def read_idx(path: pathlib.Path) -> np.ndarray:
  """An IDX file (MNIST / Fashion-MNIST format, gzipped or not) as a uint8 array."""
  opener = gzip.open if path.name.endswith(".gz") else open
  with opener(path, "rb") as f:
    raw = f.read()
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
    raise DataError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()}).")
  ndim = raw[3]
  shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if data.size != int(np.prod(shape)):
    raise DataError(f"{path}: IDX header says shape {shape}, found {data.size} values.")
  return data.reshape(shape)


def read_usps(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
  """USPS in LIBSVM format (bz2): uint8 (N, 16, 16) images and labels 0..9.

  Each line is `label index:value ...` with labels 1..10 and 256 values in
  [-1, 1]; pixels are uint8((v + 1) / 2 * 255) computed in float32 and labels
  label - 1, as torchvision's USPS (which the FCCL code reads).
  """
  images, labels = [], []
  with bz2.open(path, "rt") as f:
    for number, line in enumerate(f, 1):
      fields = line.split()
      if not fields:
        continue
      row = np.zeros(256, np.float32)
      try:
        for item in fields[1:]:
          index, value = item.split(":")
          row[int(index) - 1] = float(value)
        labels.append(int(float(fields[0])) - 1)
      except (ValueError, IndexError) as e:
        raise DataError(f"{path}:{number}: not a LIBSVM line with 256 features: {e}") from e
      images.append(row)
  pixels = ((np.stack(images) + np.float32(1)) / np.float32(2) * np.float32(255)).astype(np.uint8)
  return pixels.reshape(-1, 16, 16), np.asarray(labels, np.int64)


def read_svhn_mat(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
  """An SVHN cropped-digits `.mat` file: uint8 (N, 32, 32, 3) and labels 0..9 (10 -> 0)."""
  try:
    from scipy import io as scipy_io  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataUnavailableError(
        f"{path}: reading SVHN's .mat files needs scipy; install it: pip install scipy") from e
  try:
    mat = scipy_io.loadmat(path)
    images = np.ascontiguousarray(np.transpose(mat["X"], (3, 0, 1, 2)), dtype=np.uint8)
    labels = np.asarray(mat["y"], np.int64).reshape(-1) % 10
  except (KeyError, ValueError, OSError) as e:
    raise DataError(f"{path}: not an SVHN .mat file with X (32, 32, 3, N) and y: {e}") from e
  return images, labels


class _ArrayUnpickler(pickle.Unpickler):
  """Unpickles CIFAR batches: dicts, lists, strings and numpy arrays, nothing else."""

  _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
              ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

  def find_class(self, module, name):
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch")
    return super().find_class(module, name)


def read_cifar_batch(data: bytes, where: str) -> dict[str, object]:
  """A CIFAR python batch (a Python 2 pickle of a dict) with str keys.

  Read with encoding="latin1", as torchvision reads it, so that Python 2
  strings holding array bytes load into numpy arrays.
  """
  try:
    batch = _ArrayUnpickler(io.BytesIO(data), encoding="latin1").load()
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
    raise DataError(f"{where}: not a CIFAR python batch: {e}") from e
  return {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}


def _cifar_images(batch: Mapping[str, object], where: str) -> np.ndarray:
  flat = np.asarray(batch["data"], np.uint8)
  if flat.ndim != 2 or flat.shape[1] != 3072:
    raise DataError(f"{where}: 'data' must be (N, 3072) uint8, got {flat.shape}.")
  return np.ascontiguousarray(flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def _names(values) -> np.ndarray:
  return np.asarray([v.decode() if isinstance(v, bytes) else str(v) for v in values])


def _tar_members(path: pathlib.Path) -> dict[str, bytes]:
  """{base name: bytes} of the regular files of a tar archive."""
  try:
    with tarfile.open(path) as tar:
      return {m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read()
              for m in tar.getmembers() if m.isfile()}
  except (tarfile.TarError, OSError, EOFError) as e:
    raise DataError(f"{path}: cannot be read as a tar archive: {e}") from e


def per_class_subset(labels: np.ndarray, per_class: int, seed: int = 0) -> np.ndarray:
  """Sorted indices of `per_class` examples of every class, drawn with default_rng(seed)."""
  rng = np.random.default_rng(seed)
  chosen = []
  for c in np.unique(labels):
    members = np.flatnonzero(labels == c)
    chosen.append(rng.choice(members, size=min(per_class, members.size), replace=False))
  return np.sort(np.concatenate(chosen))


# ----------------------------------------------------------------------------
# Converters.
# ----------------------------------------------------------------------------


def _files(source) -> Mapping[str, pathlib.Path]:
  if not isinstance(source, Mapping):
    raise TypeError("this dataset converts its official files")
  return source


#: Fashion-MNIST's class names by label (github.com/zalandoresearch/fashion-mnist README).
_FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")
#: The IDX files of MNIST and Fashion-MNIST: train images, train labels, test images, labels.
_IDX_NAMES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _read_idx_pair(source, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
  files = _files(source)
  x, y = read_idx(files[images]), read_idx(files[labels]).astype(np.int64)
  if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
    raise DataError(f"{files[images]}: {x.shape} images for {y.shape} labels in "
                    f"{files[labels]}; expected (N, H, W) and (N,).")
  return x, y


def _convert_mnist(source):
  out = {}
  for split, (images, labels) in (("train", _IDX_NAMES[:2]), ("test", _IDX_NAMES[2:])):
    x, out[f"mnist_{split}_y"] = _read_idx_pair(source, images, labels)
    out[f"mnist_{split}_x"] = to_rgb32(x)
  return {"digits.npz": out}


def _convert_fmnist(source):
  x, y = _read_idx_pair(source, *_IDX_NAMES[:2])
  test_x, test_y = _read_idx_pair(source, *_IDX_NAMES[2:])
  train_x = to_rgb32(x)
  keep = per_class_subset(y, 500)
  return {"fmnist.npz": {"train_x": train_x, "train_y": y, "test_x": to_rgb32(test_x),
                         "test_y": test_y, "classes": np.asarray(_FMNIST_CLASSES)},
          "public_fmnist_5000.npz": {"x": train_x[keep], "y": y[keep]}}


def _convert_usps(source):
  files = _files(source)
  out = {}
  for split, name in (("train", "usps.bz2"), ("test", "usps.t.bz2")):
    images, labels = read_usps(files[name])
    out[f"usps_{split}_x"], out[f"usps_{split}_y"] = to_rgb32(images), labels
  return {"digits.npz": out}


def _convert_svhn(source):
  files = _files(source)
  out = {}
  for split in ("train", "test"):
    out[f"svhn_{split}_x"], out[f"svhn_{split}_y"] = read_svhn_mat(files[f"{split}_32x32.mat"])
  return {"digits.npz": out}


def _convert_svhn_extra(source):
  images, labels = read_svhn_mat(_files(source)["extra_32x32.mat"])
  return {"svhn_extra.npz": {"x": images, "y": labels}}


def _read_cifar(path: pathlib.Path, label_key: str, meta_name: str, names_key: str,
                train_batches: Sequence[str], test_batch: str) -> dict[str, np.ndarray]:
  members = _tar_members(path)
  missing = [n for n in (*train_batches, test_batch, meta_name) if n not in members]
  if missing:
    raise DataError(f"{path}: the archive lacks {missing}; found {sorted(members)}.")
  out = {}
  for split, batches in (("train", train_batches), ("test", (test_batch,))):
    parsed = [read_cifar_batch(members[b], f"{path}[{b}]") for b in batches]
    out[f"{split}_x"] = np.concatenate([_cifar_images(p, f"{path}[{b}]")
                                        for p, b in zip(parsed, batches)])
    out[f"{split}_y"] = np.concatenate([np.asarray(p[label_key], np.int64) for p in parsed])
  out["classes"] = _names(read_cifar_batch(members[meta_name], f"{path}[{meta_name}]")[names_key])
  return out


def _convert_cifar10(source):
  arrays = _read_cifar(_files(source)["cifar-10-python.tar.gz"], "labels", "batches.meta",
                       "label_names", [f"data_batch_{i}" for i in range(1, 6)], "test_batch")
  return {"cifar10.npz": arrays}


def _convert_cifar100(source):
  arrays = _read_cifar(_files(source)["cifar-100-python.tar.gz"], "fine_labels", "meta",
                       "fine_label_names", ["train"], "test")
  keep = per_class_subset(arrays["train_y"], 50)
  return {"cifar100_glfc.npz": arrays,
          "public_cifar100_5000.npz": {"x": arrays["train_x"][keep], "y": arrays["train_y"][keep]}}


def _decode_rgb(data: bytes, where: str) -> np.ndarray:
  from fedjax_het.data.folder import _import_pil  # pylint: disable=g-import-not-at-top
  image_module = _import_pil()
  try:
    with image_module.open(io.BytesIO(data)) as im:
      return np.asarray(im.convert("RGB"), dtype=np.uint8)
  except (OSError, ValueError) as e:
    raise DataError(f"{where}: cannot be read as an image: {e}") from e


def read_tinyimagenet(path: pathlib.Path) -> dict[str, np.ndarray]:
  """tiny-imagenet-200.zip: 64x64 train and val images, labels in `wnids.txt` order.

  Train images are `train/<wnid>/images/*.JPEG`, val images `val/images/*`
  labelled by `val/val_annotations.txt`; both in sorted path order.
  """
  try:
    archive = zipfile.ZipFile(path)
  except (zipfile.BadZipFile, OSError) as e:
    raise DataError(f"{path}: cannot be read as a zip archive: {e}") from e
  with archive:
    names = archive.namelist()
    prefix = next((n[:-len("wnids.txt")] for n in names if n.endswith("wnids.txt")), None)
    if prefix is None:
      raise DataError(f"{path}: no wnids.txt in the archive (expected tiny-imagenet-200/).")
    wnids = archive.read(prefix + "wnids.txt").decode().split()
    label = {w: i for i, w in enumerate(wnids)}
    annotations = {}
    if prefix + "val/val_annotations.txt" in names:
      for line in archive.read(prefix + "val/val_annotations.txt").decode().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
          annotations[fields[0]] = fields[1]
    out = {}
    for split in ("train", "val"):
      members = sorted(n for n in names if n.startswith(f"{prefix}{split}/")
                       and n.lower().endswith(IMAGE_EXTENSIONS))
      if not members:
        raise DataError(f"{path}: no {split} images under {prefix}{split}/.")
      images = np.empty((len(members), 64, 64, 3), np.uint8)
      labels = np.empty((len(members),), np.int64)
      for i, name in enumerate(members):
        parts = name[len(prefix):].split("/")
        wnid = parts[1] if split == "train" else annotations.get(parts[-1])
        if wnid not in label:
          raise DataError(f"{path}[{name}]: class {wnid!r} is not in wnids.txt.")
        image = _decode_rgb(archive.read(name), f"{path}[{name}]")
        if image.shape != (64, 64, 3):
          raise DataError(f"{path}[{name}]: expected a 64x64 image, got {image.shape}.")
        images[i], labels[i] = image, label[wnid]
      out[f"{split}_x"], out[f"{split}_y"] = images, labels
  out["wnids"] = np.asarray(wnids)
  return out


def _convert_tinyimagenet(source):
  arrays = read_tinyimagenet(_files(source)["tiny-imagenet-200.zip"])
  keep = per_class_subset(arrays["train_y"], 25)
  public = {"x": resize_uint8_like_pil(arrays["train_x"][keep], 32, 32),
            "y": arrays["train_y"][keep], "wnids": arrays["wnids"]}
  return {"tinyimagenet.npz": arrays, "public_tinyimagenet_5000.npz": public}


def _normal(name: str) -> str:
  return name.strip().lower().replace(" ", "_").replace("-", "_")


def _find_dirs(root: pathlib.Path, wanted: Callable[[pathlib.Path], bool],
               depth: int = 4) -> list[pathlib.Path]:
  """Directories under root (root included, at most `depth` levels) that satisfy `wanted`."""
  found, level = [], [root]
  for _ in range(depth + 1):
    found += [d for d in level if wanted(d)]
    level = sorted(c for d in level for c in d.iterdir()
                   if c.is_dir() and not c.name.startswith((".", "__MACOSX")))
  return found


def _image_folder_root(directory: pathlib.Path) -> pathlib.Path:
  """The class-folder root of a domain folder (Office31 nests it under images/)."""
  children = [c for c in directory.iterdir() if c.is_dir() and not c.name.startswith(".")]
  if len(children) == 1 and children[0].name == "images":
    return children[0]
  return directory


_DIGITS = tuple(str(i) for i in range(10))
#: Folder names of SYN's train and test ImageFolders: the FCCL code's syn/train and syn/val,
#: the Kaggle archive's imgs_train and imgs_valid.
_SYN_SPLITS = (("train", "imgs_train"), ("val", "test", "valid", "imgs_valid", "imgs_test"))


def _has_digit_classes(d: pathlib.Path) -> bool:
  return all((d / c).is_dir() for c in _DIGITS)


def _convert_syn(source):
  """SYN from a folder or archive holding a train and a test (val) ImageFolder of 0..9."""
  root = pathlib.Path(source)
  train_names, test_names = _SYN_SPLITS

  def pair(d):
    return (any(_has_digit_classes(d / n) for n in train_names)
            and any(_has_digit_classes(d / n) for n in test_names))

  found = _find_dirs(root, pair)
  if not found:
    raise DataError(f"{root}: no SYN image folders found: expected a folder with train/ (or "
                    f"imgs_train/) and val/ (or test/, imgs_valid/), each holding class folders "
                    f"0..9.")
  base = found[0]
  train_dir = next(base / n for n in train_names if _has_digit_classes(base / n))
  test_dir = next(base / n for n in test_names if _has_digit_classes(base / n))
  train, _ = load_image_folder(train_dir, class_names=_DIGITS)
  test, _ = load_image_folder(test_dir, class_names=_DIGITS)
  return {"digits.npz": {"syn_train_x": train.images, "syn_train_y": train.labels.astype(np.int64),
                         "syn_test_x": test.images, "syn_test_y": test.labels.astype(np.int64)}}


def _convert_office(source, filename: str, domains: Mapping[str, tuple[str, ...]],
                    num_classes: int):
  """Office-style domains (one ImageFolder per domain) found under a folder."""
  root = pathlib.Path(source)
  out, classes = {}, None
  for domain, aliases in domains.items():
    dirs = _find_dirs(root, lambda d, a=aliases: _normal(d.name) in a)
    if not dirs:
      continue
    split, names = load_image_folder(_image_folder_root(dirs[0]))
    if len(names) != num_classes:
      raise DataError(f"{dirs[0]}: {len(names)} class folders, {filename} needs {num_classes}.")
    if classes is not None and names != classes:
      raise DataError(f"{dirs[0]}: class folders {list(names)[:4]}... differ from the other "
                      f"domains' {list(classes)[:4]}...")
    classes = names
    out[f"{domain}_x"], out[f"{domain}_y"] = split.images, split.labels.astype(np.int64)
  if not out:
    aliases = sorted({a for v in domains.values() for a in v})
    raise DataError(f"{root}: no domain folder found: expected folders named {aliases} (case "
                    f"and spaces ignored) within 4 levels, each with one sub-folder per class.")
  out["classes"] = np.asarray(classes)
  return {filename: out}


def _convert_office31(source):
  return _convert_office(source, "office31.npz", {d: (d,) for d in ("amazon", "dslr", "webcam")},
                         31)


def _convert_office_caltech(source):
  domains = {"amazon": ("amazon",), "caltech": ("caltech", "caltech10"), "dslr": ("dslr",),
             "webcam": ("webcam",)}
  return _convert_office(source, "office_caltech10.npz", domains, 10)


def _convert_office_home(source):
  domains = {"art": ("art",), "clipart": ("clipart",), "product": ("product",),
             "real_world": ("real_world", "realworld")}
  return _convert_office(source, "office_home.npz", domains, 65)


# ----------------------------------------------------------------------------
# The datasets.
# ----------------------------------------------------------------------------

_MNIST_MIRRORS = ("http://yann.lecun.com/exdb/mnist/",
                  "https://ossci-datasets.s3.amazonaws.com/mnist/")
_FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_USPS_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"
_SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
_TV = "pytorch/vision torchvision/datasets/"
_SVHN_LICENCE = "non-commercial use only (Netzer et al. 2011)"
_CIFAR_LICENCE = "no formal licence (research use; Krizhevsky 2009)"


def _mnist_files(mirrors: Sequence[str], md5s: Sequence[str],
                 source: str) -> tuple[RemoteFile, ...]:
  return tuple(RemoteFile(tuple(m + name for m in mirrors), md5, source)
               for name, md5 in zip(_IDX_NAMES, md5s))


#: The datasets, by command-line name.
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset(
        "mnist", "MNIST", "http://yann.lecun.com/exdb/mnist/",
        "CC BY-SA 3.0 (as commonly cited; LeCun, Cortes and Burges)", "70,000 images, 11 MB",
        # Checksums: pytorch/vision torchvision/datasets/mnist.py (MNIST.resources).
        _mnist_files(_MNIST_MIRRORS, ("f68b3c2dcbeaaa9fbdd348bbdeb94873",
                                      "d53e105ee54ea40749a09fcbcd1e9432",
                                      "9fb629c4189551a2d022fa330f9573f3",
                                      "ec29112dd5afa0611ce80d1b7f02629c"),
                     _TV + "mnist.py (MNIST.resources)"),
        {"digits.npz": ("mnist_train_x", "mnist_test_x")}, _convert_mnist,
        merge=("digits.npz",)),
    Dataset(
        "usps", "USPS",
        "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps",
        "no formal licence (research use; Hull 1994)", "9,298 images, 2 MB",
        # Checksums: pytorch/vision torchvision/datasets/usps.py (USPS.split_list).
        (RemoteFile((_USPS_URL + "usps.bz2",), "ec16c51db3855ca6c91edd34d0e9b197",
                    _TV + "usps.py (USPS.split_list)"),
         RemoteFile((_USPS_URL + "usps.t.bz2",), "8ea070ee2aca1ac39742fdd1ef5ed118",
                    _TV + "usps.py (USPS.split_list)")),
        {"digits.npz": ("usps_train_x", "usps_test_x")}, _convert_usps, merge=("digits.npz",)),
    Dataset(
        "svhn", "SVHN (cropped digits, train and test)", _SVHN_URL, _SVHN_LICENCE,
        "99,289 images, 246 MB",
        # Checksums: pytorch/vision torchvision/datasets/svhn.py (SVHN.split_list).
        (RemoteFile((_SVHN_URL + "train_32x32.mat",), "e26dedcc434d2e4c54c9b2d4a06d8373",
                    _TV + "svhn.py (SVHN.split_list)"),
         RemoteFile((_SVHN_URL + "test_32x32.mat",), "eb5a983be6a315427106f1b164d9cef3",
                    _TV + "svhn.py (SVHN.split_list)")),
        {"digits.npz": ("svhn_train_x", "svhn_test_x")}, _convert_svhn, merge=("digits.npz",)),
    Dataset(
        "svhn_extra", "SVHN (cropped digits, extra split)", _SVHN_URL, _SVHN_LICENCE,
        "531,131 images, 1.3 GB",
        # Checksum: pytorch/vision torchvision/datasets/svhn.py (SVHN.split_list["extra"]).
        (RemoteFile((_SVHN_URL + "extra_32x32.mat",), "a93ce644f1a588dc4d68dda5feec44a7",
                    _TV + "svhn.py (SVHN.split_list)"),),
        {"svhn_extra.npz": ("x",)}, _convert_svhn_extra),
    Dataset(
        "syn", "SYN: Synthetic Digits (Roy et al. 2018), the SYN domain of the FCCL code",
        "https://www.kaggle.com/datasets/prasunroy/synthetic-digits",
        "research use (Roy et al. 2018; backgrounds from COCO)", "12,000 images", (),
        {"digits.npz": ("syn_train_x", "syn_test_x")}, _convert_syn, merge=("digits.npz",),
        manual="download the FCCL authors' syn/ folder (the Google Drive 'Digits' link in the "
               "README of https://github.com/WenkeHuang/RethinkFL) or Roy et al.'s archive "
               "(https://www.kaggle.com/datasets/prasunroy/synthetic-digits, Kaggle login) and "
               "pass it: a folder or archive with train/ and val/ (or imgs_train/ and "
               "imgs_valid/) class folders 0..9"),
    Dataset(
        "cifar10", "CIFAR-10", _CIFAR_URL + "cifar.html", _CIFAR_LICENCE,
        "60,000 images, 163 MB",
        # Checksum: pytorch/vision torchvision/datasets/cifar.py (CIFAR10.tgz_md5).
        (RemoteFile((_CIFAR_URL + "cifar-10-python.tar.gz",), "c58f30108f718f92721af3b95e74349a",
                    _TV + "cifar.py (CIFAR10.tgz_md5)"),),
        {"cifar10.npz": ("train_x", "test_x")}, _convert_cifar10),
    Dataset(
        "cifar100", "CIFAR-100 (official split) and its 5000-image public set",
        _CIFAR_URL + "cifar.html", _CIFAR_LICENCE, "60,000 images, 161 MB",
        # Checksum: pytorch/vision torchvision/datasets/cifar.py (CIFAR100.tgz_md5).
        (RemoteFile((_CIFAR_URL + "cifar-100-python.tar.gz",),
                    "eb9058c3a382ffc7106e4002c42a8d85", _TV + "cifar.py (CIFAR100.tgz_md5)"),),
        {"cifar100_glfc.npz": ("train_x", "test_x"), "public_cifar100_5000.npz": ("x",)},
        _convert_cifar100),
    Dataset(
        "fmnist", "Fashion-MNIST (official split) and its 5000-image public set",
        "https://github.com/zalandoresearch/fashion-mnist", "MIT (Zalando Research)",
        "70,000 images, 30 MB",
        # Checksums: pytorch/vision torchvision/datasets/mnist.py (FashionMNIST.resources).
        _mnist_files((_FMNIST_URL,), ("8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                                      "25c81989df183df01b3e8a0aad5dffbe",
                                      "bef4ecab320f06d8554ea6380940ec79",
                                      "bb300cfdad3c16e7a12a480ee83cd310"),
                     _TV + "mnist.py (FashionMNIST.resources)"),
        {"fmnist.npz": ("train_x", "test_x"), "public_fmnist_5000.npz": ("x",)},
        _convert_fmnist),
    Dataset(
        "tinyimagenet", "Tiny-ImageNet-200 (64x64) and its 5000-image public set",
        "http://cs231n.stanford.edu/", "ImageNet terms: non-commercial research use",
        "110,000 images, 237 MB",
        # Checksum: ContinualAI/avalanche avalanche/benchmarks/datasets/tiny_imagenet/
        # tiny_imagenet.py (TinyImagenet.md5); torchvision has no Tiny-ImageNet.
        (RemoteFile(("http://cs231n.stanford.edu/tiny-imagenet-200.zip",),
                    "90528d7ca1a48142e341f4ef8d21d0de",
                    "ContinualAI/avalanche avalanche/benchmarks/datasets/tiny_imagenet/"
                    "tiny_imagenet.py (TinyImagenet.md5)"),),
        {"tinyimagenet.npz": ("train_x", "val_x"), "public_tinyimagenet_5000.npz": ("x",)},
        _convert_tinyimagenet),
    Dataset(
        "office31", "Office-31 (amazon, dslr, webcam)",
        "https://faculty.cc.gatech.edu/~judy/domainadapt/", "research use (Saenko et al. 2010)",
        "4,110 images", (), {"office31.npz": ("amazon_x", "dslr_x", "webcam_x")},
        _convert_office31,
        manual="download domain_adaptation_images.tar.gz (Google Drive link on "
               "https://faculty.cc.gatech.edu/~judy/domainadapt/) and pass it, or a folder with "
               "amazon/, dslr/, webcam/ (each <class>/*.jpg or images/<class>/*.jpg)"),
    Dataset(
        "office_caltech", "Office-Caltech-10 (amazon, caltech, dslr, webcam)",
        "https://github.com/jindongwang/transferlearning/tree/master/data#office-caltech10",
        "research use (Gong et al. 2012; Caltech-256 and Office-31 terms)", "2,533 images", (),
        {"office_caltech10.npz": ("amazon_x", "caltech_x", "dslr_x", "webcam_x")},
        _convert_office_caltech, merge=("office_caltech10.npz",),
        manual="download the Office-Caltech-10 images (the links of "
               "https://github.com/jindongwang/transferlearning/tree/master/data#office-caltech10)"
               " and pass the archive or a folder with amazon/, caltech/, dslr/, webcam/ (each "
               "<class>/*.jpg); the domains found are merged into office_caltech10.npz"),
    Dataset(
        "office_home", "Office-Home (art, clipart, product, real_world)",
        "https://www.hemanthdv.org/officeHomeDataset.html",
        "research and educational use only (Venkateswara et al. 2017)", "15,588 images", (),
        {"office_home.npz": ("art_x", "clipart_x", "product_x", "real_world_x")},
        _convert_office_home,
        manual="download OfficeHomeDataset_10072016.zip (form and Google Drive link on "
               "https://www.hemanthdv.org/officeHomeDataset.html) and pass it, or a folder with "
               "Art/, Clipart/, Product/, Real World/ (each <class>/*.jpg)"),
)}


# ----------------------------------------------------------------------------
# HTTP with resume and checksums.
# ----------------------------------------------------------------------------


def file_md5(path: pathlib.Path) -> str:
  digest = hashlib.md5()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(_CHUNK), b""):
      digest.update(block)
  return digest.hexdigest()


class _Cut(Exception):
  """A transfer ended early after `received` bytes of this attempt."""

  def __init__(self, reason: str, received: int):
    super().__init__(reason)
    self.received = received


def _transfer(url: str, part: pathlib.Path, timeout: float, progress: bool) -> None:
  """One HTTP GET into `part`, resuming from its size with a Range request."""
  offset = part.stat().st_size if part.exists() else 0
  request = urllib.request.Request(url, headers={"User-Agent": "fedjax_het-download"})
  if offset:
    request.add_header("Range", f"bytes={offset}-")
  try:
    response = urllib.request.urlopen(request, timeout=timeout)  # closed by `with` below
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:  # the partial file already holds everything
      return
    raise
  with response:
    if offset and response.status != 206:  # the server ignored the Range: start over
      offset = 0
    length = response.headers.get("Content-Length")
    total = offset + int(length) if length is not None else None
    received = 0
    with open(part, "ab" if offset else "wb") as f, tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, desc=part.name[:-len(".part")],
        disable=None if progress and (total is None or total > 8 * _CHUNK) else True) as bar:
      while True:
        try:
          block = response.read(_CHUNK)
        except (OSError, http.client.HTTPException) as e:
          raise _Cut(f"{type(e).__name__}: {e}", received) from e
        if not block:
          break
        f.write(block)
        received += len(block)
        bar.update(len(block))
    if total is not None and offset + received < total:
      raise _Cut(f"connection closed after {offset + received} of {total} bytes", received)


def _manual_hint(dataset: Dataset, remote: RemoteFile) -> str:
  """The manual alternative to a failed download: fetch every file the dataset needs by hand
  (the failed one first), then `--from`."""
  files = [remote] + [f for f in dataset.files if f.filename != remote.filename]
  if len(files) == 1:
    return (f"download {remote.urls[0]} (see {dataset.homepage}) by hand and run: python -m "
            f"fedjax_het.data.download {dataset.name} --from <file or folder>")
  return (f"download its {len(files)} files by hand ({', '.join(f.urls[0] for f in files)}; "
          f"see {dataset.homepage}), put them in one folder and run: python -m "
          f"fedjax_het.data.download {dataset.name} --from <that folder>")


def fetch(dataset: Dataset, remote: RemoteFile, directory: pathlib.Path, *,
          timeout: float = DEFAULT_TIMEOUT, progress: bool = True) -> pathlib.Path:
  """Downloads one official file into `directory` (resumed, verified, renamed) and returns it.

  A file already there with the right checksum is reused. Raises DownloadError
  (one line with the URL and the manual alternative) on a network failure,
  timeout or checksum mismatch; a mismatching download is removed.
  """
  directory.mkdir(parents=True, exist_ok=True)
  final = directory / remote.filename
  if final.is_file() and file_md5(final) == remote.md5:
    return final
  part = final.with_name(final.name + ".part")
  failure, done = "", False
  for url in remote.urls:
    for _ in range(ATTEMPTS):
      try:
        _transfer(url, part, timeout, progress)
        done = True
      except _Cut as e:
        failure = f"{url}: {e}"
        if e.received:  # progress was made: resume with another Range request
          continue
      except urllib.error.HTTPError as e:
        failure = f"{url}: HTTP {e.code} {e.reason}"
      except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, (socket.timeout, TimeoutError)):
          reason = f"no data for {timeout:g} s (timeout)"
        failure = f"{url}: {reason}"
      break
    if done:
      break
  if not done:
    kept = "; the partial file is kept for resuming" if part.exists() else ""
    raise DownloadError(f"cannot download {failure}{kept}. Without network: "
                        f"{_manual_hint(dataset, remote)}.")
  got = file_md5(part)
  if got != remote.md5:
    part.unlink()
    raise DownloadError(f"checksum mismatch for {remote.urls[0]}: md5 {got}, expected "
                        f"{remote.md5} (published in {remote.checksum_source}); the download is "
                        f"removed. Retry, or {_manual_hint(dataset, remote)}.")
  os.replace(part, final)
  return final


# ----------------------------------------------------------------------------
# Writing the bundle files and the manifest.
# ----------------------------------------------------------------------------


def _npz_keys(path: pathlib.Path) -> set[str]:
  """The array names of an `.npz` file (empty if it is missing or unreadable)."""
  try:
    with zipfile.ZipFile(path) as archive:
      return {n[:-len(".npy")] for n in archive.namelist() if n.endswith(".npy")}
  except (OSError, zipfile.BadZipFile):
    return set()


def write_npz(path: pathlib.Path, arrays: Mapping[str, np.ndarray], merge: bool = False) -> None:
  """Writes `arrays` as a compressed `.npz` atomically (temporary name, then rename).

  With `merge`, an existing file's arrays are kept except those of the
  domains written (keys `<domain>_...`) and `classes`, which must then agree
  with the existing class names; a `missing_domains` entry loses the domains
  written, and a free-text `meta` entry (a copied bundle's description of its
  domains, stale once they change) is dropped: `manifest.json` records what
  was written.
  """
  domains = {k.split("_")[0] for k in arrays if k != "classes"}
  existing = merge and path.is_file()
  missing = None
  if existing:
    try:
      with np.load(path, allow_pickle=False) as old:
        if "classes" in arrays and "classes" in old.files and not np.array_equal(
            old["classes"], arrays["classes"]):
          raise DataError(f"{path}: its classes {list(old['classes'])[:4]}... differ from the "
                          f"converted data's {list(arrays['classes'])[:4]}...; move the file "
                          f"away to write a new one.")
        if "missing_domains" in old.files:
          missing = [d for d in old["missing_domains"].tolist() if d not in domains]
    except (OSError, ValueError, zipfile.BadZipFile) as e:
      raise DataError(f"{path}: cannot be read to merge into ({e}); move it away.") from e
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  os.close(fd)
  try:
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as out:
      if existing:
        with zipfile.ZipFile(path) as old_zip:
          for info in old_zip.infolist():
            key = info.filename[:-len(".npy")]
            if (key in arrays or key.split("_")[0] in domains
                or key in ("missing_domains", "meta")):
              continue
            with old_zip.open(info) as src, out.open(info.filename, "w", force_zip64=True) as dst:
              shutil.copyfileobj(src, dst, _CHUNK)
      if missing:
        arrays = {**arrays, "missing_domains": np.asarray(missing)}
      for key, array in arrays.items():
        with out.open(f"{key}.npy", "w", force_zip64=True) as dst:
          np.lib.format.write_array(dst, np.asarray(array), allow_pickle=False)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_manifest(data_dir: pathlib.Path) -> dict:
  """The manifest of a data directory ({"datasets": {}} if there is none)."""
  path = data_dir / MANIFEST
  if not path.is_file():
    return {"datasets": {}}
  try:
    manifest = json.loads(path.read_text())
    if not isinstance(manifest.get("datasets"), dict):
      raise ValueError("no 'datasets' object")
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: not a download manifest ({e}); move it away.") from e
  return manifest


def _record(data_dir: pathlib.Path, dataset: Dataset, sources: list[dict],
            outputs: Mapping[str, Mapping[str, np.ndarray]]) -> None:
  manifest = read_manifest(data_dir)
  manifest["datasets"][dataset.name] = {
      "title": dataset.title, "licence": dataset.licence, "homepage": dataset.homepage,
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "sources": sources,
      "outputs": {name: {"bytes": (data_dir / name).stat().st_size,
                         "arrays": {k: list(np.shape(v)) for k, v in arrays.items()}}
                  for name, arrays in outputs.items()},
  }
  fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=data_dir)
  with os.fdopen(fd, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, data_dir / MANIFEST)


# ----------------------------------------------------------------------------
# download().
# ----------------------------------------------------------------------------


def _dataset(name: str) -> Dataset:
  if name not in DATASETS:
    raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}.")
  return DATASETS[name]


def _data_dir(data_dir: str | os.PathLike | None) -> pathlib.Path:
  """The data directory the configs read (`resolve_data_dir`; not created here: `_made_for`)."""
  return pathlib.Path(resolve_data_dir(data_dir)).expanduser()


@contextlib.contextmanager
def _made_for(directory: pathlib.Path, *inside: pathlib.Path) -> Iterator[None]:
  """Makes `directory` (with its missing parents) for the block; when the block fails, the
  folders it made that are left empty (`directory`, its new parents, and `inside`, folders
  below it such as `downloads/<name>/`) are removed again: a failed command leaves no empty
  data directory behind. A folder with something in it (a partial download to resume) stays."""
  made = [p for p in (directory, *directory.parents) if not p.exists()]
  made += [p for q in inside for p in (q, *q.parents)
           if p not in made and not p.exists() and directory in p.parents]
  directory.mkdir(parents=True, exist_ok=True)
  try:
    yield
  except BaseException:
    for folder in sorted(made, key=lambda p: len(p.parts), reverse=True):
      try:
        folder.rmdir()
      except OSError:  # not empty (or gone)
        pass
    raise


def _unpack(path: pathlib.Path, scratch: pathlib.Path) -> pathlib.Path:
  """A folder with the contents of `path` (a folder, a zip or a tar archive)."""
  if path.is_dir():
    return path
  target = scratch / "unpacked"
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as archive:
        archive.extractall(target)  # zipfile drops absolute and ".." path parts
    elif tarfile.is_tarfile(path):
      with tarfile.open(path) as archive:
        if hasattr(tarfile, "data_filter"):
          archive.extractall(target, filter="data")
        else:  # Python < 3.11.4 has no extraction filters: refuse what "data" would refuse
          for member in archive.getmembers():
            parts = pathlib.PurePosixPath(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (member.isfile()
                                                                     or member.isdir()):
              raise DataError(f"--from {path}: unsafe archive member {member.name!r}.")
          archive.extractall(target)
    else:
      raise DataError(f"--from {path}: not a folder, zip or tar archive.")
  except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
    raise DataError(f"--from {path}: cannot be unpacked: {e}") from e
  return target


def _official_files(dataset: Dataset, path: pathlib.Path) -> dict[str, pathlib.Path]:
  """The official files of `dataset` in the `--from` file or folder, checksums verified."""
  folder = path.parent if path.is_file() else path
  found = {}
  for remote in dataset.files:
    match = folder / remote.filename
    if not match.is_file():  # look deeper only when the file is not at the top
      match = next((c for c in sorted(folder.rglob(remote.filename)) if c.is_file()), None)
    if match is None:
      raise DataUnavailableError(
          f"--from {path}: {remote.filename} not found; {dataset.name} needs "
          f"{', '.join(f.filename for f in dataset.files)} (from {dataset.homepage}).")
    got = file_md5(match)
    if got != remote.md5:
      raise DataError(f"--from {match}: md5 {got}, expected {remote.md5} (published in "
                      f"{remote.checksum_source}): not the official file of {remote.urls[0]}.")
    found[remote.filename] = match
  return found


def download(name: str, data_dir: str | os.PathLike | None = None, *,
             from_path: str | os.PathLike | None = None, timeout: float = DEFAULT_TIMEOUT,
             progress: bool = True, delete_raw: bool = False) -> dict[str, pathlib.Path]:
  """Downloads (or takes from `from_path`) a dataset and writes its bundle files.

  Args:
    name: a key of `DATASETS` (e.g. "mnist", "svhn", "syn", "cifar100").
    data_dir: the bundle directory (else $FEDJAX_HET_DATA_DIR); created if needed.
    from_path: convert what the user downloaded instead: for datasets with
      official files, a folder holding them (or one of them); for the others,
      the dataset's archive (zip, tar) or its unpacked folder.
    timeout: seconds without data before a download attempt fails.
    progress: show a tqdm bar on long downloads.
    delete_raw: remove `<data_dir>/downloads/<name>/` after the conversion.

  Returns:
    {bundle file name: its path} of the files written.

  Raises:
    DownloadError: a network failure, timeout or checksum mismatch.
    DataUnavailableError: no data directory, or a dataset without a public
      URL and no `from_path` (the message says where to get it).
    DataError: unknown name, or files that are not the dataset's format.
  """
  dataset = _dataset(name)
  if from_path is None and not dataset.files:
    raise DataUnavailableError(
        f"{dataset.name} ({dataset.title}) has no public URL to download from; "
        f"{dataset.manual}: python -m fedjax_het.data.download {dataset.name} --from PATH (see "
        f"{_DOCS}).")
  directory = _data_dir(data_dir)
  raw = directory / DOWNLOADS / dataset.name
  if from_path is not None and not pathlib.Path(from_path).expanduser().exists():
    raise DataUnavailableError(f"--from {pathlib.Path(from_path).expanduser()}: no such file or "
                               "folder.")
  with _made_for(directory, raw), tempfile.TemporaryDirectory(prefix=".download-",
                                                               dir=directory) as scratch:
    if from_path is not None:
      path = pathlib.Path(from_path).expanduser()
      if not path.exists():
        raise DataUnavailableError(f"--from {path}: no such file or folder.")
      if dataset.files:
        source = _official_files(dataset, path)
        sources = [{"from": str(source[f.filename]), "url": f.urls[0], "md5": f.md5,
                    "checksum_source": f.checksum_source,
                    "bytes": source[f.filename].stat().st_size} for f in dataset.files]
      else:
        source = _unpack(path, pathlib.Path(scratch))
        sources = [{"from": str(path), "bytes": path.stat().st_size if path.is_file() else None}]
    else:
      source = {f.filename: fetch(dataset, f, raw, timeout=timeout, progress=progress)
                for f in dataset.files}
      sources = [{"url": f.urls[0], "md5": f.md5, "checksum_source": f.checksum_source,
                  "bytes": source[f.filename].stat().st_size} for f in dataset.files]
    outputs = dataset.convert(source)
    written = {}
    for filename, arrays in outputs.items():
      write_npz(directory / filename, arrays, merge=filename in dataset.merge)
      written[filename] = directory / filename
    _record(directory, dataset, sources, outputs)
  if delete_raw and raw.is_dir():
    shutil.rmtree(raw)
  return written


def status(data_dir: str | os.PathLike | None = None) -> dict[str, str]:
  """{dataset: "downloaded <date>" | "present" | "partial" | "missing"} for a data directory.

  "present": the bundle files hold the dataset's arrays but the manifest does
  not record a download (e.g. files copied from elsewhere); "partial": some
  of them (e.g. an Office-Caltech file without its caltech domain).
  """
  directory = pathlib.Path(resolve_data_dir(data_dir)).expanduser()
  recorded = read_manifest(directory)["datasets"] if directory.is_dir() else {}
  result = {}
  for name, dataset in DATASETS.items():
    found = [set(keys) & _npz_keys(directory / filename)
             for filename, keys in dataset.outputs.items()]
    if not any(found):
      result[name] = "missing"
    elif any(f != set(keys) for f, keys in zip(found, dataset.outputs.values())):
      result[name] = "partial"
    elif name in recorded:
      result[name] = f"downloaded {str(recorded[name].get('date', ''))[:10]}"
    else:
      result[name] = "present"
  return result


def listing(data_dir: str | os.PathLike | None = None) -> str:
  """The `--list` table: name, status, how to get it, size, licence."""
  states = status(data_dir)
  rows = [("dataset", "status", "how", "size", "licence")]
  for name, dataset in DATASETS.items():
    rows.append((name, states[name], "download" if dataset.files else "--from PATH",
                 dataset.size, dataset.licence))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  lines = [f"data directory: {resolve_data_dir(data_dir)} (--data_dir, ${DATA_DIR_ENV}, or the "
           "default)"]
  lines += ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; returns the exit status (1 with one error line on failure)."""
  parser = argparse.ArgumentParser(
      prog="python -m fedjax_het.data.download",
      description="Download real datasets and convert them to the fedjax_het .npz bundle "
                  f"(see {_DOCS}).")
  parser.add_argument("names", nargs="*", metavar="NAME",
                      help=f"datasets to fetch: {', '.join(DATASETS)}")
  parser.add_argument("--data_dir", default=None,
                      help=f"bundle directory (default: ${DATA_DIR_ENV}, else ~/.cache/fedjax_het/data)")
  parser.add_argument("--from", dest="from_path", default=None, metavar="PATH",
                      help="convert this archive or folder instead of downloading (one NAME)")
  parser.add_argument("--list", action="store_true", help="list the datasets and their status")
  parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                      help="seconds without data before a download attempt fails")
  parser.add_argument("--delete_raw", action="store_true",
                      help=f"remove the raw files under <data_dir>/{DOWNLOADS}/ after converting")
  args = parser.parse_args(argv)
  try:
    if args.list:
      print(listing(args.data_dir))
      return 0
    if not args.names:
      parser.error("name at least one dataset, or pass --list")
    for name in args.names:
      _dataset(name)
    if args.from_path is not None and len(args.names) != 1:
      raise DataError(f"--from converts one dataset; got {len(args.names)}: {args.names}.")
    for name in args.names:
      written = download(name, args.data_dir, from_path=args.from_path, timeout=args.timeout,
                         delete_raw=args.delete_raw)
      print(f"{name}: wrote {', '.join(str(p) for p in written.values())}")
  except DataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("error: interrupted; run the command again to resume the download.", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

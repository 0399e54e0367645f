"""GLFC class-incremental task streams as fixed-shape arrays (compile once for all tasks).

`build_class_incremental_stream` loads a labelled dataset (CIFAR-100 by
default), draws the federated class-incremental protocol of GLFC [GLFC Sec. 5]
with `partition.class_incremental_tasks`, and packs the whole stream into
NumPy arrays whose shapes do not change from task to task, so that one jitted
round serves every task:

  * the images are stored once, as a pool (`images`, `labels`); every client
    of every task is an index array into it (`client_indices[t, k, :n]`,
    padded with 0 up to the largest client dataset of the whole stream);
  * labels are re-indexed by class order: task t introduces classes
    t*k .. (t+1)*k - 1 (k = classes_per_task), so "the classes seen after task
    t" is the prefix [0, (t+1)*k) and a classifier with all `num_classes`
    outputs from the start plus a class mask (`fedjax_het.cil.masking`)
    replaces a growing head;
  * per (task, client): size, whether the client exists yet (`client_joined`),
    whether it kept its previous task's data (`client_kept_old`), and which
    classes it holds (`client_classes`, a (C,) boolean row).

`ClassIncrementalStream.task(t)` returns the arrays of task t as a `TaskArrays`
NamedTuple (a pytree) whose shapes and dtypes are the same for every t; pass it
(with the pool) to the jitted round. Exemplar memories of old classes can
likewise be fixed-size index arrays into `images`.

Protocol (GLFC Sec. 5 and the authors' code; see
`partition.class_incremental_tasks` for the exact rules): `initial_clients`
(30) clients at task 0, `new_clients_per_task` (10) more at each later task; a
client taking part in a task holds round(class_fraction * k) (60%) of that
task's classes; at each new task a fraction `shift_fraction` (90%) of the
existing clients moves to the new task, the others keep their old classes and
data. `client_data`:

  * "overlap" (default; reproduces the paper): every client receives ALL
    training images of each of its classes, as the authors' code does (the
    paper's numbers come from it); clients holding the same class share
    images.
  * "disjoint": a class's images are split disjointly (random, near-equal
    parts) among the clients that take it in that task.

Each client's indices are in a seeded random order (a client that kept its old
data keeps its previous order), so a prefix of a client is class-mixed.

Deviations and caveats:

  * Image size (`image_size`; None: the dataset's `NATIVE_IMAGE_SIZES`,
    CIFAR-100 32, Tiny-ImageNet 64, ImageNet-Subset 224, the sizes GLFC
    trains at). Tiny-ImageNet (200 classes) is read from the bundle file
    `tinyimagenet.npz` (source "real"; `npz.load_tinyimagenet`: the
    official 64x64 train images, 500 per class, and the labelled val
    images, 50 per class, as the test set; 32 by 2x2 area averaging) or from
    an ImageFolder (`source="folder:<root>"` with train/ and val/ or test/).
    ImageNet-Subset (100 classes) is an ImageFolder: source "real" reads
    `<data_dir>/imagenet_subset/` (train/ and val/), `folder:<root>` any
    other root; its images are scaled (shorter side to `image_size`) and
    centre-cropped to the square, as ImageNet's Resize + CenterCrop. Other
    folder datasets are resized to the square (`folder.load_image_folder`).
    Both are normalised by the pool's own mean and std. The CIFAR-100
    bundle and TFDS sources exist at 32x32 only (`image_sizes`).
  * The offline bundle `cifar100_glfc.npz` (source "real") is NOT the official
    CIFAR-100 split: 120 training and 50 test images per class (12000 / 5000),
    drawn from PFLlib shards of the pooled official train+test sets. Fine for
    development; paper-exact numbers need the official split (500 / 100 per
    class), e.g. `source="tfds"`.
  * Class order (`class_order`, `CLASS_ORDERS`): "seeded" (default) is a
    seeded random permutation (`partition.class_incremental_tasks`).
    "icarl" is iCaRL's CIFAR-100 order (`ICARL_CIFAR100_ORDER`), which the
    GLFC paper says it follows; "identity" is the labels in ascending order,
    what the authors' code trains on (conditionWang/FCIL `src/GLFC.py` draws a
    task's classes from range(numclass - task_size, numclass) and
    `src/iCIFAR100.py` selects by raw label). A named order keeps every other
    draw of the seeded stream: the task draw runs on labels renamed so that
    its permutation lands on the named order (`_named_order_draw`), so the
    clients, their class positions within the task and the task shifts are
    those of the "seeded" stream of the same seed; only which class sits at
    each position changes. With `num_classes` < the dataset's classes, a
    named order uses its first `num_classes` classes.
  * With `num_classes` < the dataset's classes (quick runs), a seeded random
    subset of `num_classes` classes is used, ordered by the task draw: the
    first `num_classes` classes of a random class order. `train_size` and
    `test_size` then count images of these classes only.
  * The authors' code adds `task_size` (= classes per task) new clients per
    task, equal to the paper's 10 only for T = 10; here `new_clients_per_task`
    is explicit (default 10, the paper's text).

Synthetic data (`source="synthetic"`, or `synthetic_fallback=True` when the
requested source is unavailable: a loud logged WARNING, recorded in `sources`
and `substituted`): the synthetic digit domains have 10 classes each, so the
stand-in synthesises up to `SYNTHETIC_MAX_CLASSES` = 40 classes as
(domain, digit) pairs: class 10*d + digit of domain `synthetic.DIGIT_DOMAINS[d]`
(mnist, usps, svhn, syn), using the first ceil(num_classes / 10) domains (10
classes: MNIST-style digits only). It says nothing about CIFAR-100; it only
lets a quick config run end to end. A stream needing more classes raises a
clear error (pass e.g. num_classes=20, num_tasks=4). Default synthetic sizes
mirror the bundle: 120 training and 50 test images per class.

Memory (host; the device copy is the same): the pool is N * 3072 bytes (the
bundle: 12000 images = 36.9 MB, test 5000 = 15.4 MB; official CIFAR-100:
153.6 MB + 30.7 MB). The index arrays are T * K_max * n_max * 4 bytes with
K_max = initial + (T-1) * new and n_max = the largest client dataset; on the
bundle with "overlap" (n_max = round(0.6 k) * 120): T=5: 5 * 70 * 1440 * 4 =
2.0 MB, T=10: 10 * 120 * 720 * 4 = 3.5 MB, T=20: 20 * 220 * 360 * 4 = 6.3 MB
(x 500/120 on the official split). Materialising per-client images instead
would cost K * n_max * 3072 bytes per task (265 MB at T=10 on the bundle).

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fedjax_het.data import _imageops, npz, synthetic
from fedjax_het.data import partition as partition_lib
from fedjax_het.data._base import (DATA_DIR_ENV, DataError, DataUnavailableError, Split, logger,
                                   resolve_data_dir)
from fedjax_het.data.partitioned import DATASET_STATS, _check_int, _is_int
from fedjax_het.data.scenarios import load_dataset, stratified_subsample

#: Datasets of `build_class_incremental_stream` and their number of classes (module
#: docstring: where Tiny-ImageNet and ImageNet-Subset are read from).
INCREMENTAL_DATASETS = {"cifar100": 100, "tiny_imagenet": 200, "imagenet_subset": 100}
#: The image side each dataset is read at by default: the size GLFC trains at.
NATIVE_IMAGE_SIZES = {"cifar100": 32, "tiny_imagenet": 64, "imagenet_subset": 224}
#: Image sides a resizing source (an image folder, the synthetic stand-in) accepts.
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 8, 512
#: The folder under the data directory that source "real" reads ImageNet-Subset from.
IMAGENET_SUBSET_FOLDER = "imagenet_subset"
#: How the images of a class are shared among its clients (module docstring).
CLIENT_DATA = ("overlap", "disjoint")
#: Classes the synthetic stand-in can serve: (domain, digit) pairs of the four
#: synthetic digit domains.
SYNTHETIC_MAX_CLASSES = 10 * len(synthetic.DIGIT_DOMAINS)
#: Synthetic images per class when train_size / test_size is None (the bundle's).
SYNTHETIC_TRAIN_PER_CLASS, SYNTHETIC_TEST_PER_CLASS = 120, 50

#: The CIFAR-100 fine labels in official index order (checked on the bundle:
#: 0 apple, 1 aquarium_fish, 58 pickup_truck, 99 worm).
CIFAR100_CLASS_NAMES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle",
    "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm")

#: iCaRL's CIFAR-100 class order (100 official fine-label indices; task t of k classes
#: takes positions t*k .. (t+1)*k - 1). Source: srebuffi/iCaRL,
#: `iCaRL-TheanoLasagne/main_cifar_100_theano.py`, first run: `np.random.seed(1993)`, then
#: `utils_cifar100.load_data(0)` shuffles 100 per-class index arrays of 500, then
#: `order = np.arange(100); np.random.shuffle(order)` (NumPy's legacy generator; re-derived in
#: tests/test_cil_class_order.py). The same list is `iCIFAR100.class_order` of
#: arthurdouillard/incremental_learning.pytorch (`inclearn/lib/data/datasets.py`, "taken from
#: original iCaRL implementation"), the order PODNet and later CIL papers report on.
ICARL_CIFAR100_ORDER = (
    87, 0, 52, 58, 44, 91, 68, 97, 51, 15, 94, 92, 10, 72, 49, 78, 61, 14, 8, 86,
    84, 96, 18, 24, 32, 45, 88, 11, 4, 67, 69, 66, 77, 47, 79, 93, 29, 50, 57, 83,
    17, 81, 41, 12, 37, 59, 25, 20, 80, 73, 1, 28, 6, 46, 62, 82, 53, 9, 31, 75,
    38, 63, 33, 74, 27, 22, 36, 3, 16, 21, 60, 19, 70, 90, 89, 43, 5, 42, 65, 76,
    40, 30, 23, 85, 2, 95, 56, 48, 71, 64, 98, 13, 99, 7, 34, 55, 54, 26, 35, 39)
#: `class_order` choices: "seeded" (a seeded permutation), or a named fixed order
#: (module docstring): "icarl" (CIFAR-100 only), "identity" (ascending labels).
CLASS_ORDERS = ("seeded", "icarl", "identity")

# Random-stream codes (SeedSequence([seed, _STREAM, code])).
_STREAM = 4127
_SELECT, _TRAIN_SUBSAMPLE, _TEST_SUBSAMPLE, _TASKS, _SHUFFLE = range(5)


def _rng(seed: int, code: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([int(seed), _STREAM, code]))


def _check_fraction(name: str, value, low_open: bool) -> float:
  ok = (not isinstance(value, bool) and isinstance(value, (int, float, np.number))
        and np.isfinite(value) and (0 < value <= 1 if low_open else 0 <= value <= 1))
  if not ok:
    allowed = "(0, 1]" if low_open else "[0, 1]"
    raise ValueError(f"`{name}` must be a number in {allowed}, got {value!r}.")
  return float(value)


def _readonly(array: np.ndarray) -> np.ndarray:
  array.setflags(write=False)
  return array


# ----------------------------------------------------------------------------
# The stream.
# ----------------------------------------------------------------------------


class TaskArrays(NamedTuple):
  """The arrays of one task; shapes and dtypes are identical for every task.

  A pytree: pass it to a jitted round (with the pool `images`/`labels`) and
  the round compiles once for the whole stream.

  Attributes:
    task: int32 scalar, the task number t.
    num_seen: int32 scalar, (t + 1) * classes_per_task.
    class_mask: bool (C,), True on the seen classes [0, num_seen).
    client_indices: int32 (K_max, n_max) indices into the pool; rows of
      absent clients and the tail past `client_sizes` are 0 (padding).
    client_sizes: int32 (K_max,), real examples per client (0 if absent).
    client_joined: bool (K_max,), the client exists at this task.
    client_kept_old: bool (K_max,), the client kept its previous task's data.
    client_classes: bool (K_max, C), the classes each client holds.
    test_valid: bool (M,), test examples of the seen classes (the paper's
      evaluation set after this task).
  """
  task: np.ndarray
  num_seen: np.ndarray
  class_mask: np.ndarray
  client_indices: np.ndarray
  client_sizes: np.ndarray
  client_joined: np.ndarray
  client_kept_old: np.ndarray
  client_classes: np.ndarray
  test_valid: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class ClassIncrementalStream:
  """A federated class-incremental stream in fixed-shape arrays (module docstring).

  Shapes: N training pool, M test, T tasks, C = T * k classes, K_max =
  initial + (T-1) * new clients, n_max the largest client dataset of the
  stream. Arrays built by this module are read-only.

  Attributes:
    images: uint8 (N, S, S, 3), the training pool (only the stream's classes; S the image
      side, `build_class_incremental_stream`'s `image_size`).
    labels: int32 (N,), class-order indices in [0, C).
    class_order: int64 (C,), the original dataset label of each class index.
    class_names: names in class-order index order, () when unknown.
    client_indices: int32 (T, K_max, n_max) into the pool, padded with 0.
    client_sizes: int32 (T, K_max), real examples of each client per task.
    client_joined: bool (T, K_max), the client exists at task t.
    client_kept_old: bool (T, K_max), the client kept its task t-1 data.
    client_classes: bool (T, K_max, C), classes the client holds at task t.
    test_images: uint8 (M, S, S, 3), test images of the stream's classes.
    test_labels: int32 (M,), class-order indices.
    num_tasks, classes_per_task, num_classes: T, k, C (Python ints).
    client_data: "overlap" or "disjoint".
    dataset: dataset name ("cifar100", or "custom" for `stream_from_tasks`).
    sources: dataset -> provenance of the data actually used (e.g.
      "npz:/data/cifar100_glfc.npz" or "synthetic(seed=0; ...substituted for
      'real')").
    substituted: datasets replaced by synthetic data (synthetic_fallback).
    mean, std: per-channel normalisation statistics on [0, 1] pixels.
    seed: the seed the stream was drawn with.
  """
  images: np.ndarray
  labels: np.ndarray
  class_order: np.ndarray
  class_names: tuple[str, ...]
  client_indices: np.ndarray
  client_sizes: np.ndarray
  client_joined: np.ndarray
  client_kept_old: np.ndarray
  client_classes: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  num_tasks: int
  classes_per_task: int
  num_classes: int
  client_data: str
  dataset: str
  sources: dict[str, str]
  substituted: tuple[str, ...]
  mean: tuple[float, float, float]
  std: tuple[float, float, float]
  seed: int

  def __post_init__(self):
    t, k, c = self.num_tasks, self.classes_per_task, self.num_classes
    if t * k != c:
      raise ValueError(f"ClassIncrementalStream: num_tasks * classes_per_task = {t} * {k} "
                       f"!= num_classes = {c}.")
    if self.client_data not in CLIENT_DATA:
      raise ValueError(f"ClassIncrementalStream: `client_data` must be one of {CLIENT_DATA}, "
                       f"got {self.client_data!r}.")
    shape = self.client_indices.shape
    if len(shape) != 3 or shape[0] != t:
      raise ValueError(f"ClassIncrementalStream: client_indices must be (T={t}, K_max, n_max), "
                       f"got {shape}.")
    expected = {"client_sizes": shape[:2], "client_joined": shape[:2],
                "client_kept_old": shape[:2], "client_classes": shape[:2] + (c,),
                "class_order": (c,), "labels": self.images.shape[:1],
                "test_labels": self.test_images.shape[:1]}
    for name, want in expected.items():
      got = getattr(self, name).shape
      if got != want:
        raise ValueError(f"ClassIncrementalStream: `{name}` must have shape {want}, got {got}.")
    if self.class_names and len(self.class_names) != c:
      raise ValueError(f"ClassIncrementalStream: {len(self.class_names)} class_names for {c} "
                       "classes.")
    for name in ("labels", "test_labels"):
      values = getattr(self, name)
      if values.size and (values.min() < 0 or values.max() >= c):
        raise ValueError(f"ClassIncrementalStream: `{name}` must lie in [0, {c}).")

  # -- sizes ------------------------------------------------------------------

  @property
  def max_clients(self) -> int:
    """K_max: clients at the last task."""
    return int(self.client_indices.shape[1])

  @property
  def max_client_size(self) -> int:
    """n_max: rows of `client_indices` per client."""
    return int(self.client_indices.shape[2])

  @property
  def num_clients(self) -> np.ndarray:
    """int (T,), the clients present at each task."""
    return self.client_joined.sum(axis=1)

  # -- classes ----------------------------------------------------------------

  def _check_task(self, task) -> int | None:
    if _is_int(task):
      if not 0 <= task < self.num_tasks:
        raise ValueError(f"`task` must be an integer in [0, {self.num_tasks}), got {task!r}.")
      return int(task)
    return None

  def seen_classes(self, task):
    """(task + 1) * classes_per_task: classes seen after `task` (a prefix).

    `task` is a Python/NumPy integer (range-checked) or an integer array or
    traced value (computed as is).
    """
    checked = self._check_task(task)
    return ((checked if checked is not None else task) + 1) * self.classes_per_task

  def task_of_class(self, class_index):
    """The task that introduces class-order index `class_index` (class // k).

    Works on integers (range-checked) and integer arrays.
    """
    if _is_int(class_index):
      if not 0 <= class_index < self.num_classes:
        raise ValueError(f"`class_index` must be an integer in [0, {self.num_classes}), got "
                         f"{class_index!r}.")
      return int(class_index) // self.classes_per_task
    return class_index // self.classes_per_task

  def class_mask(self, task: int) -> np.ndarray:
    """bool (C,): True on the classes seen after `task`."""
    return np.arange(self.num_classes) < self.seen_classes(task)

  # -- per task ---------------------------------------------------------------

  def task(self, task: int) -> TaskArrays:
    """The fixed-shape arrays of `task` (see `TaskArrays`)."""
    t = self._check_task(task)
    if t is None:
      raise ValueError(f"`task` must be an integer in [0, {self.num_tasks}), got {task!r}.")
    seen = self.seen_classes(t)
    return TaskArrays(
        task=np.asarray(t, np.int32), num_seen=np.asarray(seen, np.int32),
        class_mask=self.class_mask(t), client_indices=self.client_indices[t],
        client_sizes=self.client_sizes[t], client_joined=self.client_joined[t],
        client_kept_old=self.client_kept_old[t], client_classes=self.client_classes[t],
        test_valid=self.test_labels < seen)

  def client_split(self, task: int, client: int) -> Split:
    """The examples of one client at one task as a Split (for inspection)."""
    t = self._check_task(task)
    if t is None:
      raise ValueError(f"`task` must be an integer in [0, {self.num_tasks}), got {task!r}.")
    if not _is_int(client) or not 0 <= client < self.max_clients:
      raise ValueError(f"`client` must be an integer in [0, {self.max_clients}), got "
                       f"{client!r}.")
    idx = self.client_indices[t, client, :self.client_sizes[t, client]]
    return Split(self.images[idx], self.labels[idx])

  def metadata(self) -> dict[str, Any]:
    """JSON-serialisable description (for the run's config/metadata files)."""
    return {
        "dataset": self.dataset, "num_tasks": self.num_tasks,
        "classes_per_task": self.classes_per_task, "num_classes": self.num_classes,
        "client_data": self.client_data, "pool_size": int(self.images.shape[0]),
        "test_size": int(self.test_images.shape[0]), "max_clients": self.max_clients,
        "max_client_size": self.max_client_size,
        "num_clients": [int(n) for n in self.num_clients],
        "class_order": [int(c) for c in self.class_order],
        "sources": dict(self.sources), "substituted": list(self.substituted),
        "mean": list(self.mean), "std": list(self.std), "seed": self.seed,
    }


def _pool_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """Per-channel mean and std of uint8 images on [0, 1], float64 accumulation."""
  if images.shape[0] == 0:
    return (0.0,) * 3, (1.0,) * 3
  x = images.reshape(-1, 3)
  total = np.zeros(3)
  total_sq = np.zeros(3)
  for start in range(0, x.shape[0], 1 << 20):  # bounded float64 temporaries
    chunk = x[start:start + (1 << 20)].astype(np.float64) / 255.0
    total += chunk.sum(axis=0)
    total_sq += np.square(chunk).sum(axis=0)
  mean = total / x.shape[0]
  std = np.sqrt(np.maximum(total_sq / x.shape[0] - np.square(mean), 0.0))
  return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def stream_from_tasks(train: Split, test: Split, tasks: Sequence[partition_lib.Task], *,
                      client_data: str = "overlap", shuffle: bool = True, seed: int = 0,
                      dataset: str = "custom", class_names: Sequence[str] = (),
                      sources: dict[str, str] | None = None,
                      substituted: Sequence[str] = (),
                      mean: Sequence[float] | None = None,
                      std: Sequence[float] | None = None) -> ClassIncrementalStream:
  """Packs the tasks of `partition.class_incremental_tasks` into fixed-shape arrays.

  The pool keeps the examples of the stream's classes only (in their order in
  `train`); labels are re-indexed by class order (task t's classes become
  t*k .. (t+1)*k - 1). `build_class_incremental_stream` calls this; call it
  directly to build a stream from arrays of your own.

  Args:
    train: the labelled training pool the tasks index into (original labels).
    test: the test set (original labels); examples of other classes dropped.
    tasks: output of `partition.class_incremental_tasks(train.labels, ...)`.
    client_data: recorded in the stream ("overlap" or "disjoint"); it should
      match the `overlap` argument the tasks were drawn with.
    shuffle: put each client's indices in a seeded random order (a client
      that kept its old data keeps its previous order); False keeps the
      order of `Task.client_indices` (remapped to pool positions).
    seed: seeds the shuffle; recorded in the stream.
    dataset: name recorded in the stream.
    class_names: names indexed by ORIGINAL label (reordered here), or ().
    sources, substituted: provenance (default {dataset: "arrays"}, ()).
    mean, std: normalisation statistics; default measured on the pool.

  Returns:
    ClassIncrementalStream with read-only arrays.

  Raises:
    ValueError: inconsistent tasks (unequal class counts, tasks out of order,
      a class repeated, or indices outside the stream's classes).
  """
  if client_data not in CLIENT_DATA:
    raise ValueError(f"`client_data` must be one of {CLIENT_DATA}, got {client_data!r}.")
  seed = _check_int("seed", seed, 0)
  if not tasks:
    raise ValueError("`tasks` must hold at least one Task, got none.")
  k = len(tasks[0].classes)
  for t, task in enumerate(tasks):
    if task.task != t or len(task.classes) != k:
      raise ValueError(f"`tasks`: task {t} has number {task.task} and {len(task.classes)} "
                       f"classes; expected tasks numbered 0.. in order with {k} classes each.")
  order = np.concatenate([np.asarray(task.classes, np.int64) for task in tasks])
  num_tasks, num_classes = len(tasks), int(order.size)
  if np.unique(order).size != num_classes:
    raise ValueError("`tasks`: a class is introduced by more than one task.")

  size = int(max(order.max(), train.labels.max(initial=0), test.labels.max(initial=0))) + 1
  remap = np.full(size, -1, np.int64)
  remap[order] = np.arange(num_classes)
  train_new = remap[train.labels]
  keep = np.nonzero(train_new >= 0)[0]
  position = np.full(len(train), -1, np.int64)
  position[keep] = np.arange(keep.size)
  test_keep = np.nonzero(remap[test.labels] >= 0)[0]

  k_max = len(tasks[-1].client_ids)
  sizes = np.zeros((num_tasks, k_max), np.int32)
  for t, task in enumerate(tasks):
    sizes[t, :len(task.client_indices)] = [len(i) for i in task.client_indices]
  n_max = max(1, int(sizes.max()))
  indices = np.zeros((num_tasks, k_max, n_max), np.int32)
  joined = np.zeros((num_tasks, k_max), bool)
  kept_old = np.zeros((num_tasks, k_max), bool)
  holds = np.zeros((num_tasks, k_max, num_classes), bool)
  rng = _rng(seed, _SHUFFLE)
  for t, task in enumerate(tasks):
    n_t = len(task.client_ids)
    joined[t, :n_t] = True
    kept_old[t, :n_t] = task.kept_old
    for client in range(n_t):
      n = sizes[t, client]
      if t > 0 and task.kept_old[client] and sizes[t - 1, client] == n:
        indices[t, client, :n] = indices[t - 1, client, :n]  # same data, same order
      else:
        rows = position[np.asarray(task.client_indices[client], np.int64)]
        if rows.size and rows.min() < 0:
          raise ValueError(f"`tasks`: client {client} of task {t} holds examples of classes "
                           "outside the stream's classes.")
        indices[t, client, :n] = rng.permutation(rows) if shuffle else rows
      holds[t, client, remap[np.asarray(task.client_classes[client], np.int64)]] = True

  if len(class_names) and len(class_names) <= int(order.max()):
    raise ValueError(f"`class_names` holds {len(class_names)} names (indexed by original label) "
                     f"but the tasks use label {int(order.max())}; pass one name per label, "
                     "or ().")
  pool_images = train.images[keep]
  if mean is None or std is None:
    measured = _pool_stats(pool_images)
    mean = measured[0] if mean is None else mean
    std = measured[1] if std is None else std
  names = tuple(str(class_names[c]) for c in order) if len(class_names) else ()
  return ClassIncrementalStream(
      images=_readonly(pool_images), labels=_readonly(train_new[keep].astype(np.int32)),
      class_order=_readonly(order), class_names=names,
      client_indices=_readonly(indices), client_sizes=_readonly(sizes),
      client_joined=_readonly(joined), client_kept_old=_readonly(kept_old),
      client_classes=_readonly(holds),
      test_images=_readonly(test.images[test_keep]),
      test_labels=_readonly(remap[test.labels[test_keep]].astype(np.int32)),
      num_tasks=num_tasks, classes_per_task=k, num_classes=num_classes,
      client_data=client_data, dataset=dataset,
      sources=dict(sources) if sources is not None else {dataset: "arrays"},
      substituted=tuple(substituted), mean=tuple(float(m) for m in mean),
      std=tuple(float(s) for s in std), seed=seed)


# ----------------------------------------------------------------------------
# Building from a dataset.
# ----------------------------------------------------------------------------


def _divisors(n: int) -> tuple[int, ...]:
  return tuple(d for d in range(1, n + 1) if n % d == 0)


def image_sizes(dataset: str, source: str) -> tuple[int, ...] | None:
  """The image sides `dataset` can be read at from `source`; None: any in [MIN, MAX].

  The CIFAR-100 bundle and TFDS hold 32x32 images; the Tiny-ImageNet bundle
  64x64 (or 32x32 by area averaging); image folders and the synthetic
  stand-in are resized to any side in [MIN_IMAGE_SIZE, MAX_IMAGE_SIZE].
  """
  if source == "real" and dataset == "tiny_imagenet":
    return tuple(npz.TINYIMAGENET_RESOLUTIONS)
  if source in ("real", "tfds") and dataset == "cifar100":
    return (32,)
  return None


def check_image_size(dataset: str, source: str, image_size) -> int:
  """`image_size` (None: the dataset's native side) checked against `image_sizes`."""
  if image_size is None:
    image_size = NATIVE_IMAGE_SIZES[dataset]
  allowed = image_sizes(dataset, source)
  ok = (not isinstance(image_size, bool) and isinstance(image_size, (int, np.integer))
        and (image_size in allowed if allowed is not None
             else MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE))
  if not ok:
    what = (f"one of {allowed}" if allowed is not None
            else f"an integer in [{MIN_IMAGE_SIZE}, {MAX_IMAGE_SIZE}]")
    raise ValueError(f"`image_size` must be {what} for dataset {dataset!r} with source "
                     f"{source!r}, got {image_size!r}.")
  return int(image_size)


def _resize_square(split: Split, size: int) -> Split:
  """`split` with its images resized to size x size (Pillow's BILINEAR, `_imageops`)."""
  if split.images.shape[1:3] == (size, size):
    return split
  return Split(_imageops.resize_uint8_like_pil(split.images, size, size), split.labels)


def _load(dataset: str, source: str, data_dir, image_size: int
          ) -> tuple[Split, Split, str, tuple[str, ...]]:
  """(train, test, provenance, class names by label or ()) of a real source."""
  if dataset == "tiny_imagenet" and source == "real":
    tiny = npz.load_tinyimagenet(data_dir, resolution=image_size)
    return (Split(tiny.train.images, tiny.train.labels), Split(tiny.test.images, tiny.test.labels),
            f"npz:{npz.bundle_path('tinyimagenet', data_dir)}", tiny.wnids)
  fit = "center_crop" if dataset == "imagenet_subset" else "stretch"
  if dataset == "imagenet_subset" and source == "real":
    directory = resolve_data_dir(data_dir)
    if not (directory / IMAGENET_SUBSET_FOLDER).is_dir():
      raise DataUnavailableError(
          f"ImageNet-Subset is read from <data_dir>/{IMAGENET_SUBSET_FOLDER}/ (train/ and "
          f"val/ image folders) and {directory / IMAGENET_SUBSET_FOLDER} does not exist.")
    source = f"folder:{directory / IMAGENET_SUBSET_FOLDER}"
  train, test, provenance = load_dataset(dataset, source=source, data_dir=data_dir,
                                         image_size=image_size, fit=fit)
  names = CIFAR100_CLASS_NAMES if dataset == "cifar100" and not source.startswith(
      "folder:") else ()
  return _resize_square(train, image_size), _resize_square(test, image_size), provenance, names


def _check_source(source) -> str:
  ok = isinstance(source, str) and (
      source in ("real", "tfds", "synthetic")
      or (source.startswith("folder:") and len(source) > len("folder:")))
  if not ok:
    raise ValueError("`source` must be one of ('real', 'tfds', 'folder:<path>', 'synthetic'), "
                     f"got {source!r}.")
  return source


def _how_to(dataset: str, source: str) -> str:
  hints = []
  if source == "real" and dataset == "tiny_imagenet":
    hints.append(f"python -m fedjax_het.data.download --data_dir <dir> tinyimagenet writes "
                 f"tinyimagenet.npz (64x64) into the data directory (data_dir=... or "
                 f"${DATA_DIR_ENV}; docs/data.md)")
  if source == "real" and dataset == "imagenet_subset":
    hints.append(f"put ImageNet-Subset's train/ and val/ class folders under "
                 f"<data_dir>/{IMAGENET_SUBSET_FOLDER}/ (docs/data.md)")
  if source == "real" and dataset == "cifar100":
    hints.append(f"python -m fedjax_het.data.download --data_dir <dir> cifar100 writes "
                 f"cifar100_glfc.npz into the data directory (data_dir=... or ${DATA_DIR_ENV}; "
                 "docs/data.md)")
  if source != "tfds" and dataset == "cifar100":
    hints.append(f"source='tfds' (TFDS {dataset} prepared; data_dir = the TFDS data directory; "
                 "the official split)")
  if not source.startswith("folder:"):
    hints.append("source='folder:/path' (train/ and test/ (or val/) image folders)")
  hints.append(f"or synthetic_fallback=True / source='synthetic' for the synthetic stand-in "
               f"(at most {SYNTHETIC_MAX_CLASSES} classes: pass num_classes <= "
               f"{SYNTHETIC_MAX_CLASSES})")
  return "; ".join(hints)


def _synthetic_pool(num_classes: int, train_size: int | None, test_size: int | None,
                    seed: int, image_size: int = 32
                    ) -> tuple[Split, Split, tuple[str, ...], str]:
  """(train, test, class names by label, domains text): (domain, digit) classes.

  The synthetic digits are drawn at 32x32 and resized to `image_size` (BILINEAR).
  """
  num_domains = math.ceil(num_classes / 10)
  per_train = (SYNTHETIC_TRAIN_PER_CLASS if train_size is None
               else math.ceil(train_size / num_classes))
  per_test = SYNTHETIC_TEST_PER_CLASS if test_size is None else math.ceil(test_size / num_classes)
  splits = []
  for split, per_class in (("train", per_train), ("test", per_test)):
    parts = [synthetic.synthetic_digits(domain, 10 * per_class, seed=seed, split=split,
                                        cache=True)
             for domain in synthetic.DIGIT_DOMAINS[:num_domains]]
    splits.append(_resize_square(
        Split(np.concatenate([p.images for p in parts]),
              np.concatenate([p.labels + 10 * d for d, p in enumerate(parts)])), image_size))
  domains = synthetic.DIGIT_DOMAINS[:num_domains]
  names = tuple(f"{domain}_{digit}" for domain in domains for digit in range(10))
  return splits[0], splits[1], names, "+".join(domains)


def build_class_incremental_stream(dataset: str = "cifar100", *, num_tasks: int = 10,
                                   num_classes: int | None = None, initial_clients: int = 30,
                                   new_clients_per_task: int = 10, class_fraction: float = 0.6,
                                   shift_fraction: float = 0.9, client_data: str = "overlap",
                                   source: str = "real",
                                   data_dir: str | os.PathLike | None = None,
                                   synthetic_fallback: bool = False,
                                   train_size: int | None = None,
                                   test_size: int | None = None,
                                   class_order: str = "seeded",
                                   image_size: int | None = None,
                                   seed: int = 0) -> ClassIncrementalStream:
  """GLFC's federated class-incremental stream as fixed-shape arrays (module docstring).

  CIFAR-100 with T = 5, 10, 20 tasks gives 20, 10, 5 classes per task [GLFC
  Sec. 5.4]; T = 10 is Table 1.

  Args:
    dataset: one of INCREMENTAL_DATASETS ("cifar100", "tiny_imagenet",
      "imagenet_subset"; module docstring).
    num_tasks: T >= 1; must divide `num_classes`.
    num_classes: classes of the stream (None: all of the dataset); a seeded
      random subset when smaller (quick runs, e.g. 20 classes in 4 tasks).
    initial_clients: clients at task 0 (>= 1).
    new_clients_per_task: clients joining at each later task (>= 0).
    class_fraction: fraction of a task's classes a client holds, (0, 1].
    shift_fraction: fraction of existing clients moving to a new task, [0, 1].
    client_data: "overlap" (the authors' code; reproduces the paper) or
      "disjoint".
    source: "real" (CIFAR-100: the offline bundle cifar100_glfc.npz, not the
      official split; Tiny-ImageNet: tinyimagenet.npz; ImageNet-Subset: the
      folder <data_dir>/imagenet_subset/), "tfds", "folder:<path>" (see
      `scenarios.load_dataset`) or "synthetic" (the (domain, digit)
      stand-in, at most 40 classes).
    data_dir: bundle directory (else $FEDJAX_HET_DATA_DIR); the TFDS data
      directory for source="tfds".
    synthetic_fallback: substitute the synthetic stand-in for an unavailable
      source (a logged WARNING; recorded in `sources` and `substituted`).
    train_size: stratified subsample of the stream's training images (those
      of its `num_classes` classes), >= num_classes; None: all (synthetic:
      120 per class). Larger than available: ValueError.
    test_size: cap on the stream's test images (stratified), >= num_classes;
      None: all (synthetic: 50 per class).
    class_order: one of CLASS_ORDERS: "seeded" (a seeded permutation; with
      `num_classes` < the dataset's, a seeded subset), "icarl" (iCaRL's
      CIFAR-100 order; dataset "cifar100" with real data only) or "identity"
      (ascending labels); a named order takes its first `num_classes`
      classes (module docstring).
    image_size: side of the stream's square images; None: the dataset's
      `NATIVE_IMAGE_SIZES` entry. Allowed sides: `image_sizes` (the synthetic
      stand-in is resized to it with Pillow's BILINEAR filter).
    seed: seeds the class subset, subsamples, the task draw, the example
      order and synthetic data (separate random streams).

  Returns:
    ClassIncrementalStream.

  Raises:
    ValueError: a bad argument (naming it and the allowed values).
    DataUnavailableError: the source is unavailable and synthetic_fallback
      is False, or the fallback cannot serve `num_classes` (the message says
      what to do).
    DataError: the data is present but invalid or has too few classes.
  """
  if dataset not in INCREMENTAL_DATASETS:
    raise ValueError(f"`dataset` must be one of {tuple(INCREMENTAL_DATASETS)}, got "
                     f"{dataset!r}.")
  dataset_classes = INCREMENTAL_DATASETS[dataset]
  num_tasks = _check_int("num_tasks", num_tasks, 1)
  num_classes = _check_int("num_classes", num_classes, 1, optional=True)
  if num_classes is None:
    num_classes = dataset_classes
  if num_classes > dataset_classes:
    raise ValueError(f"`num_classes` must be an integer in [1, {dataset_classes}] for "
                     f"{dataset!r}, or None, got {num_classes}.")
  if num_classes % num_tasks:
    raise ValueError(f"`num_tasks`={num_tasks} does not divide `num_classes`={num_classes} "
                     f"(every task introduces the same number of classes); allowed num_tasks "
                     f"for {num_classes} classes: {_divisors(num_classes)}.")
  classes_per_task = num_classes // num_tasks
  initial_clients = _check_int("initial_clients", initial_clients, 1)
  new_clients_per_task = _check_int("new_clients_per_task", new_clients_per_task, 0)
  class_fraction = _check_fraction("class_fraction", class_fraction, low_open=True)
  shift_fraction = _check_fraction("shift_fraction", shift_fraction, low_open=False)
  if client_data not in CLIENT_DATA:
    raise ValueError(f"`client_data` must be one of {CLIENT_DATA}, got {client_data!r}.")
  source = _check_source(source)
  image_size = check_image_size(dataset, source, image_size)
  if not isinstance(synthetic_fallback, (bool, np.bool_)):
    raise ValueError(f"`synthetic_fallback` must be True or False, got {synthetic_fallback!r}.")
  train_size = _check_int("train_size", train_size, num_classes, optional=True)
  test_size = _check_int("test_size", test_size, num_classes, optional=True)
  seed = _check_int("seed", seed, 0)
  if class_order not in CLASS_ORDERS:
    raise ValueError(f"`class_order` must be one of {CLASS_ORDERS}, got {class_order!r}.")
  if class_order == "icarl" and (dataset != "cifar100" or source == "synthetic"):
    raise ValueError("`class_order`='icarl' is iCaRL's order of the CIFAR-100 labels: it needs "
                     f"dataset='cifar100' with real data, got dataset={dataset!r}, "
                     f"source={source!r}; use 'seeded' or 'identity'.")
  if source == "synthetic" and num_classes > SYNTHETIC_MAX_CLASSES:
    raise ValueError(f"source='synthetic' serves at most {SYNTHETIC_MAX_CLASSES} classes "
                     f"((domain, digit) pairs of {synthetic.DIGIT_DOMAINS}), `num_classes`="
                     f"{num_classes} requested; pass num_classes <= {SYNTHETIC_MAX_CLASSES} "
                     "(e.g. num_classes=20, num_tasks=4).")

  substituted: tuple[str, ...] = ()
  synthetic_names: tuple[str, ...] | None = None
  if source == "synthetic":
    train, test, synthetic_names, domains = _synthetic_pool(num_classes, train_size, test_size,
                                                            seed, image_size)
    provenance = (f"synthetic(seed={seed}; {domains} digits, classes = (domain, digit) "
                  "pairs)")
  else:
    try:
      train, test, provenance, real_names = _load(dataset, source, data_dir, image_size)
    except DataUnavailableError as e:
      if not synthetic_fallback:
        raise DataUnavailableError(
            f"Dataset {dataset!r} (source {source!r}) is unavailable: {e}\nTo provide it: "
            f"{_how_to(dataset, source)}.") from e
      if num_classes > SYNTHETIC_MAX_CLASSES:
        raise DataUnavailableError(
            f"Dataset {dataset!r} (source {source!r}) is unavailable ({str(e).splitlines()[0]}) "
            f"and the synthetic fallback serves at most {SYNTHETIC_MAX_CLASSES} classes, "
            f"`num_classes`={num_classes} requested. Pass num_classes <= "
            f"{SYNTHETIC_MAX_CLASSES} (divisible by num_tasks, e.g. num_classes=20, "
            f"num_tasks=4) or provide the data: {_how_to(dataset, source)}.") from e
      train, test, synthetic_names, domains = _synthetic_pool(num_classes, train_size,
                                                              test_size, seed, image_size)
      logger.warning(
          "SYNTHETIC SUBSTITUTION in the class-incremental stream: dataset %r requested "
          "source %r, which is unavailable (%s). Using %d synthetic (domain, digit) classes "
          "of the %s digit domains instead because synthetic_fallback=True; results say "
          "nothing about %s and are not comparable with real-data runs. Real data: %s.",
          dataset, source, str(e).splitlines()[0], num_classes, domains, dataset,
          _how_to(dataset, source).split("; ")[0])
      provenance = (f"synthetic(seed={seed}; {domains} digits, classes = (domain, digit) "
                    f"pairs; substituted for {source!r})")
      substituted = (dataset,)
      if class_order == "icarl":
        raise DataUnavailableError(
            f"Dataset {dataset!r} (source {source!r}) is unavailable ({str(e).splitlines()[0]}) "
            "and `class_order`='icarl' orders the CIFAR-100 labels, which the synthetic "
            f"fallback does not have. Provide the data ({_how_to(dataset, source)}) or pass "
            "class_order='seeded' or 'identity'.") from e

  if synthetic_names is None:
    for split, which in ((train, "training"), (test, "test")):
      if len(split) and int(split.labels.max()) >= dataset_classes:
        raise DataError(f"{provenance}: {which} labels must lie in [0, {dataset_classes}) for "
                        f"{dataset!r}, found {int(split.labels.max())}.")
    class_names = real_names
    # Folder datasets without published statistics are normalised by the pool's own.
    mean, std = DATASET_STATS.get(dataset, (None, None))
  else:
    class_names = synthetic_names
    mean = std = None  # measured on the pool

  present = np.unique(train.labels)
  if present.size < num_classes:
    raise DataError(f"{provenance}: the training set holds {present.size} classes, the stream "
                    f"needs `num_classes`={num_classes}.")
  named = None
  if class_order != "seeded":
    named = (np.asarray(ICARL_CIFAR100_ORDER, np.int64) if class_order == "icarl"
             else np.arange(dataset_classes, dtype=np.int64))[:num_classes]
    missing = np.setdiff1d(named, present)
    if missing.size:
      raise DataError(f"{provenance}: `class_order`={class_order!r} takes the classes "
                      f"{named.tolist()}, the training set lacks {missing.tolist()}.")
    chosen = np.sort(named)
    train = train.take(np.nonzero(np.isin(train.labels, chosen))[0])
  elif present.size > num_classes:
    chosen = np.sort(_rng(seed, _SELECT).choice(present, num_classes, replace=False))
    train = train.take(np.nonzero(np.isin(train.labels, chosen))[0])
  else:
    chosen = present
  test = test.take(np.nonzero(np.isin(test.labels, chosen))[0])
  if train_size is not None:
    if train_size > len(train):
      raise ValueError(f"`train_size`={train_size} exceeds the {len(train)} training images of "
                       f"the stream's {num_classes} classes ({provenance}); pass train_size <= "
                       f"{len(train)} or None.")
    train = train.take(stratified_subsample(train.labels, train_size,
                                            _rng(seed, _TRAIN_SUBSAMPLE)))
  if test_size is not None and test_size < len(test):
    test = test.take(stratified_subsample(test.labels, test_size, _rng(seed, _TEST_SUBSAMPLE)))

  draw = dict(num_tasks=num_tasks, classes_per_task=classes_per_task,
              initial_clients=initial_clients, new_clients_per_task=new_clients_per_task,
              class_fraction=class_fraction, shift_fraction=shift_fraction,
              overlap=client_data == "overlap")
  if named is not None:
    return _named_order_draw(train, test, named, draw, client_data=client_data, seed=seed,
                             dataset=dataset, class_names=class_names,
                             sources={dataset: provenance}, substituted=substituted,
                             mean=mean, std=std)
  tasks = partition_lib.class_incremental_tasks(train.labels, rng=_rng(seed, _TASKS), **draw)
  return stream_from_tasks(train, test, tasks, client_data=client_data, seed=seed,
                           dataset=dataset, class_names=class_names,
                           sources={dataset: provenance}, substituted=substituted,
                           mean=mean, std=std)


def _named_order_draw(train: Split, test: Split, order: np.ndarray, draw: dict[str, Any], *,
                      seed: int, class_names: Sequence[str], **stream_kwargs
                      ) -> ClassIncrementalStream:
  """The seeded task draw with its class permutation replaced by `order` (module docstring).

  `partition.class_incremental_tasks` first draws `rng.permutation` of the
  sorted present labels. With the C stream classes renamed so that class
  order[i] carries the label perm[i] (perm = that same first draw on C
  labels 0..C-1), the draw's task classes are perm, i.e. order[i] at
  position i; every later draw of the stream is unchanged. The stream's
  `class_order` records the original labels.
  """
  perm = _rng(seed, _TASKS).permutation(order.size)
  rename = np.full(int(max(order.max(), train.labels.max(initial=0),
                           test.labels.max(initial=0))) + 1, -1, np.int64)
  rename[order] = perm
  renamed_train = Split(train.images, rename[train.labels])
  renamed_test = Split(test.images, rename[test.labels])
  tasks = partition_lib.class_incremental_tasks(renamed_train.labels, rng=_rng(seed, _TASKS),
                                                **draw)
  drawn = np.concatenate([np.asarray(task.classes, np.int64) for task in tasks])
  if not np.array_equal(drawn, perm):
    raise RuntimeError("class order: partition.class_incremental_tasks no longer draws its "
                       "class permutation first; the named-order draw needs updating.")
  names = ()
  if len(class_names):
    by_renamed = [""] * order.size
    for original, new in zip(order, perm):
      by_renamed[new] = str(class_names[original])
    names = tuple(by_renamed)
  stream = stream_from_tasks(renamed_train, renamed_test, tasks, seed=seed, class_names=names,
                             **stream_kwargs)
  return dataclasses.replace(stream, class_order=_readonly(order.copy()))

"""Partitioned scenarios: one labelled dataset split over many clients (FedAvg-style).

`build_partitioned_scenario` loads a whole dataset (`scenarios.load_dataset`),
optionally subsamples it (stratified), and splits the training pool over
`num_clients` clients (1 to thousands) with one of seven partitions:

  * "iid": a uniformly random, disjoint split into near-equal parts (sizes
    differ by at most one) [FedAvg, "IID"].
  * "dirichlet": label skew [Hsu et al. 2019]: for every class, its examples
    are divided among the clients in proportions drawn from
    Dir(dirichlet_alpha * 1_K); small alpha gives each client few classes,
    large alpha approaches IID. As in the FCCL/MOON reference code, a client
    that already holds >= N / K examples gets no share of later classes, and
    the draw is repeated until every client holds >= `min_size` examples
    (`partition.dirichlet_partition`). Every example is assigned.
  * "shards": McMahan et al.'s pathological non-IID split [FedAvg]: the pool
    sorted by label is cut into num_clients * shards_per_client shards of
    equal size and each client gets shards_per_client random shards
    (`partition.shard_partition`). The paper cuts MNIST's 60000 images into
    200 shards of 300 for 100 clients; here the shard size is
    pool_size / (num_clients * shards_per_client), so the whole (subsampled)
    pool is used (MNIST of the offline bundle: 10000 images, 100 clients, 2
    shards each -> shards of 50). The pool size must be a multiple of the
    number of shards (ValueError otherwise, suggesting a `train_size`) so that
    no example is silently dropped. A client holds at most shards_per_client
    classes when every class count is a multiple of the shard size (true for
    the class-balanced bundle and synthetic pools with divisible sizes);
    otherwise a shard can straddle two classes, as in the paper ("most clients
    will only have examples of two digits").
  * "class_split": the classes present, in label order, cut into num_clients
    contiguous groups of equal size; each client holds every example of its
    group. With 2 clients on a 10-class dataset this is FedMMD's "binary"
    non-IID split (classes 0-4 / 5-9, `partition.binary_class_split`); the
    number of clients must divide the number of classes
    (`partition.class_groups`).
  * "class_split_own": the "class_split" training partition, and every
    client has its own test set: the test images of its own classes
    (`partition.examples_of_classes` on the test labels), its own domain
    f"{dataset}_classes{first}-{last}" (f"{dataset}_group{k}" when the
    group's class ids are not consecutive). A client's intra-domain accuracy
    (`eval/intra/<client>`) is then its accuracy on the test images of the
    classes it holds, and `eval/inter` its accuracy on the other clients'
    classes. This is the reading of FedFusion's "artificial non-IID
    partitions of CIFAR10" (Table 1 (a), (b)) in
    `fedjax_het/configs/_two_stream.py`: the authors' code builds each
    client's test loader from the test images of its class subset
    (`CifarData(subset=...)`).
  * "permuted": the IID split, then every image of client i (training and
    test) has its pixel positions shuffled by client i's fixed permutation
    (`partition.permuted_pixels(images, i, seed=seed)`; row i of
    `Scenario.pixel_permutations`), the "user-specific
    non-IID" permuted-MNIST setting of FedMMD [Yao et al.]. Each client is its
    own domain, f"{dataset}_perm{i}", with its own test set. Deviation: by
    default (`permuted_test="split"`) the test set is split IID into
    num_clients disjoint parts and client i's part is permuted, so the K test
    sets together are the test set once and memory does not grow with K;
    `permuted_test="full"` gives every client the whole test set under its
    permutation (K copies: K * N_test * 3 KiB of memory).
  * "permuted_classes": the permuted-MNIST data of the FedFusion authors' code
    (thu-media/FedFusion, mnist_main.py and data/mnist_data.py), which the
    paper's text does not describe: the classes dealt to the clients in turn
    (`partition.class_groups(..., interleaved=True)`: with 2 clients on MNIST
    the even and the odd digits), client i holding every example of its classes, and
    every image of client i (training and test) permuted as in "permuted".
    Client i's test set is the test images of its own classes under its
    permutation (the code's `MNISTData(subset, permutation)` test loader), its
    domain f"{dataset}_perm{i}"; `permuted_test` must be "split" (the test
    images are split by class, each once). The code also augments its
    training images (RandomResizedCrop(28), horizontal flip) before the
    permutation; this partition does not.

PFLlib's data (`dataset` = f"{name}_pfllib", name one of PARTITION_DATASETS; the
data of HtFLlib, FedTGP and FedKTL, prepared by PFLlib's dataset/utils/dataset_utils.py):
the (subsampled) training and test splits are pooled into one set (PFLlib merges
CIFAR's official train and test splits), the pool is partitioned over the clients, and
every client's share is split 75/25 into its own training and test set
(`partition.train_test_split_indices`, scikit-learn's shuffled split). The partitions:

  * "dirichlet": PFLlib's "dir", the Dirichlet(dirichlet_alpha) split above with its
    minimum client size least_samples = min(10 / 0.25, N / K / 2) (40 on CIFAR-10), the
    FedTGP / FedKTL "practical" setting with alpha = 0.1;
  * "shards": PFLlib's "pat" (`partition.pathological_partition`): `shards_per_client`
    classes per client, handed out in label order, unbalanced shares (PFLlib's default),
    the "pathological" setting (2 classes per client on CIFAR-10, 10 on CIFAR-100);
  * "iid": PFLlib's IID data, "pat" with every class per client and balanced shares.

Each client is its own domain, f"{name}_client{k}", whose test set is its own 25%; the
normalisation is PFLlib's (mean 0.5, std 0.5 per channel, its `transforms.Normalize`).

The returned `Scenario` (see `scenarios.Scenario`):

  * name f"{dataset}_{partition}", num_classes of the dataset (10 for a
    synthetic substitution);
  * iid / dirichlet / shards / class_split: domains = (dataset,) * K and
    test = {dataset: the (subsampled) test split}, one test domain shared by
    all clients;
  * class_split_own: one domain per client (see above) whose test set is the
    (subsampled) test images of the client's classes;
  * permuted, permuted_classes: domains = (f"{dataset}_perm0", ...,
    f"{dataset}_perm{K-1}") and one permuted test split per client domain;
  * public: an empty uint8 (0, 32, 32, 3) array (sources["public"] = "none"), or with
    `public_size` > 0 that many images of `public_name` (the public-data methods: FedMD,
    FCCL+, ... in HtFLlib's scenario, fedjax_het/configs/htfl.py), public_mean / public_std
    then the public set's statistics (`scenarios.load_public_set`);
  * sources = {dataset: provenance, "public": "none"} (one entry for the
    dataset, also for "permuted": the per-client permutation is recorded in
    the provenance text); substituted = (dataset,) for a synthetic
    substitution, else ();
  * private_mean / private_std = `DATASET_STATS[dataset]` (the dataset's
    usual normalisation statistics, see there), public_mean / public_std the
    same without a public set; pixel permutation does not change per-channel statistics;
  * class_names where known.

Each client's examples are in random order. Everything is a function of
`seed`: the subsamples, the partition, the example order and the pixel
permutations use separate random streams (so e.g. changing the partition does
not change the subsample).

Data sources (`source`): "real" (the `.npz` bundle: mnist, usps and svhn
from digits.npz, cifar10.npz, cifar100_glfc.npz, fmnist.npz; `python -m
fedjax_het.data.download mnist usps svhn cifar10 cifar100 fmnist` writes
them, `DOWNLOAD_ARGS`), "tfds", "folder:<path>" (see
`scenarios.load_dataset`), or "synthetic" (mnist, usps, svhn: the synthetic
digit domain mirroring the dataset, `synthetic.synthetic_digits`). An
unavailable source raises `DataUnavailableError` saying how to provide it,
unless `synthetic_fallback=True`: then the synthetic digit domain is used
instead (the domain mirroring the dataset for mnist, usps and svhn; the
MNIST-style domain for the others, which then says nothing about that
dataset), with a logged WARNING that names the download command and the
substitution recorded in `Scenario.sources` and `Scenario.substituted`, like
`build_scenario`.

References:
  [FedAvg] H. B. McMahan et al. Communication-Efficient Learning of Deep
    Networks from Decentralized Data. AISTATS 2017.
  [Hsu et al. 2019] T.-M. H. Hsu, H. Qi, M. Brown. Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification.
    arXiv:1909.06335, 2019.
  [FedMMD] X. Yao et al. Federated Learning with Additional Mechanisms on
    Clients to Reduce Communication Costs. 2019.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from fedjax_het.data import augment, npz, partition as partition_lib, synthetic
from fedjax_het.data._base import DATA_DIR_ENV, DataError, DataUnavailableError, Split, logger
from fedjax_het.data.scenarios import (Scenario, load_dataset, load_public_set,
                                       stratified_subsample)

#: The partitions of `build_partitioned_scenario`.
PARTITIONS = ("iid", "dirichlet", "shards", "class_split", "class_split_own", "permuted",
              "permuted_classes")
#: The partitions that permute every client's pixels (module docstring).
PERMUTED_PARTITIONS = ("permuted", "permuted_classes")
#: The datasets of `build_partitioned_scenario` (those `load_dataset` reads).
PARTITION_DATASETS = ("mnist", "cifar10", "usps", "cifar100", "svhn", "fashion_mnist")
#: How a permuted scenario's per-client test sets are made (see the module docstring).
PERMUTED_TEST_MODES = ("split", "full")
#: PFLlib's data of each dataset (module docstring): f"{name}_pfllib".
PFLLIB_SUFFIX = "_pfllib"
PFLLIB_DATASETS = tuple(f"{name}{PFLLIB_SUFFIX}" for name in PARTITION_DATASETS)
#: The partitions of PFLlib's data and PFLlib's name of each.
PFLLIB_PARTITIONS = {"dirichlet": "dir", "shards": "pat", "iid": "pat (IID)"}
#: PFLlib's per-client train fraction (`train_ratio`) and batch size (`least_samples`).
PFLLIB_TRAIN_FRACTION, PFLLIB_BATCH_SIZE = 0.75, 10
#: PFLlib's normalisation (`transforms.Normalize((0.5,) * 3, (0.5,) * 3)`).
PFLLIB_STATS = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
#: Training-pool size of the synthetic digits when `train_size` is None.
DEFAULT_SYNTHETIC_POOL_SIZE = 10000

_Stats = tuple[float, float, float]


def _grey(mean: float, std: float) -> tuple[_Stats, _Stats]:
  return (mean,) * 3, (std,) * 3


#: dataset -> (mean, std) per RGB channel, on [0, 1] pixel values. Images are
#: uint8 (N, 32, 32, 3) RGB everywhere (grey datasets repeat one channel), so
#: grey statistics are repeated over the three channels.
#:
#: * mnist: 0.1307 / 0.3081, the usual MNIST statistics of the official 60000
#:   28x28 training images (torchvision examples, the FedAvg reference code).
#:   Measured on the bundle's 32x32 layout (bilinear 28 -> 32): 0.1318 / 0.2900.
#: * usps: 0.2543 / 0.3480, measured here on the bundle's full official USPS
#:   training set (7291 images, 16 -> 32 bilinear); no usual values exist.
#: * cifar10: (0.4914, 0.4822, 0.4465) / (0.2470, 0.2435, 0.2616), the
#:   per-channel mean and pixel std of the official 50000 training images.
#:   Measured on the bundle (1000 per class): (0.4911, 0.4827, 0.4465) /
#:   (0.2452, 0.2430, 0.2614).
#: * cifar100: `augment.CIFAR100_MEAN` / `CIFAR100_STD` (official training
#:   set; the bundle's subset measures (0.5072, 0.4868, 0.4404) / (0.2672,
#:   0.2558, 0.2755)).
#: * svhn: (0.4377, 0.4438, 0.4728) / (0.1980, 0.2010, 0.1970), the values
#:   commonly used for the SVHN cropped-digits training split.
#: * fashion_mnist: 0.2860 / 0.3530, official 60000 training images.
#:
#: A synthetic substitution takes the statistics of the dataset its domain
#: mirrors (MNIST's for the MNIST-style digits; they measure 0.168 / 0.322).
DATASET_STATS: dict[str, tuple[_Stats, _Stats]] = {
    "mnist": _grey(0.1307, 0.3081),
    "usps": _grey(0.2543, 0.3480),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": (tuple(augment.CIFAR100_MEAN), tuple(augment.CIFAR100_STD)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "fashion_mnist": _grey(0.2860, 0.3530),
}

_DIGITS = tuple(str(i) for i in range(10))
_NUM_CLASSES = {"mnist": 10, "usps": 10, "cifar10": 10, "cifar100": 100, "svhn": 10,
                "fashion_mnist": 10}
_CLASS_NAMES = {
    "mnist": _DIGITS, "usps": _DIGITS, "svhn": _DIGITS,
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"),
}
#: Bundle file read by the "real" source.
_BUNDLE_FILE = {"mnist": "digits", "usps": "digits", "cifar10": "cifar10",
                "cifar100": "cifar100_glfc", "svhn": "digits", "fashion_mnist": "fashion_mnist"}
#: dataset -> the arguments of `python -m fedjax_het.data.download` that write its bundle file.
DOWNLOAD_ARGS = {"mnist": "mnist", "usps": "usps", "cifar10": "cifar10", "cifar100": "cifar100",
                 "svhn": "svhn", "fashion_mnist": "fmnist"}
_TFDS_OK = ("mnist", "cifar10", "cifar100", "svhn", "fashion_mnist")

# Random-stream codes (SeedSequence([seed, _STREAM, code])).
_STREAM = 4099
_TRAIN_SUBSAMPLE, _TEST_SUBSAMPLE, _PARTITION, _ORDER, _TEST_SPLIT, _CLIENT_SPLIT = range(6)


def _rng(seed: int, code: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([int(seed), _STREAM, code]))


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_int(name: str, value, minimum: int, *, optional: bool = False) -> int | None:
  if optional and value is None:
    return None
  if not _is_int(value) or value < minimum:
    extra = " or None" if optional else ""
    raise ValueError(f"`{name}` must be an integer >= {minimum}{extra}, got {value!r}.")
  return int(value)


def _synthetic_domain(dataset: str) -> str:
  """The synthetic digit domain standing in for `dataset`."""
  return dataset if dataset in synthetic.DIGIT_DOMAINS else "mnist"


def _allowed_sources(dataset: str) -> tuple[str, ...]:
  allowed = ["real", "folder:<path>"]
  if dataset in _TFDS_OK:
    allowed.append("tfds")
  if dataset in synthetic.DIGIT_DOMAINS:
    allowed.append("synthetic")
  return tuple(allowed)


def _check_source(dataset: str, source) -> str:
  ok = isinstance(source, str) and (
      source == "real" or (source.startswith("folder:") and len(source) > len("folder:"))
      or (source == "tfds" and dataset in _TFDS_OK)
      or (source == "synthetic" and dataset in synthetic.DIGIT_DOMAINS))
  if not ok:
    raise ValueError(f"`source` must be one of {_allowed_sources(dataset)} for dataset "
                     f"{dataset!r}, got {source!r}.")
  return source


def _download_command(dataset: str) -> str:
  return f"python -m fedjax_het.data.download --data_dir <dir> {DOWNLOAD_ARGS[dataset]}"


def _how_to(dataset: str, source: str) -> str:
  hints = []
  if source == "real":
    hints.append(f"put {npz.BUNDLE[_BUNDLE_FILE[dataset]].filename} in the data directory "
                 f"(data_dir=... or ${DATA_DIR_ENV}): {_download_command(dataset)} (docs/data.md)")
  if dataset in _TFDS_OK and source != "tfds":
    hints.append("source='tfds' (TFDS prepared in the array_record format; data_dir = the TFDS "
                 "data directory)")
  if not source.startswith("folder:"):
    hints.append("source='folder:/path' (train/ and test/ (or val/) image folders)")
  if dataset in synthetic.DIGIT_DOMAINS:
    hints.append("source='synthetic' for the synthetic stand-in")
  hints.append("or pass synthetic_fallback=True to substitute the synthetic "
               f"{_synthetic_domain(dataset)!r} digits (logged and recorded in "
               "Scenario.substituted)")
  return "; ".join(hints)


def _check_partition_args(dirichlet_alpha, shards_per_client, min_size) -> None:
  _check_int("shards_per_client", shards_per_client, 1)
  _check_int("min_size", min_size, 1)
  if (isinstance(dirichlet_alpha, bool) or not isinstance(dirichlet_alpha, (int, float, np.number))
      or not np.isfinite(dirichlet_alpha) or dirichlet_alpha <= 0):
    raise ValueError(f"`dirichlet_alpha` must be a finite number > 0, got {dirichlet_alpha!r}.")


def partition_indices(labels: np.ndarray, num_clients: int, partition: str, *,
                      rng: np.random.Generator, dirichlet_alpha: float = 0.5,
                      shards_per_client: int = 2, min_size: int = 10) -> list[np.ndarray]:
  """The client index arrays of one partition of a labelled pool.

  "permuted" returns the IID split and "permuted_classes" the interleaved class split (the
  pixels are permuted by the caller).
  Used by `build_partitioned_scenario`; see the module docstring for the
  partitions.

  Args:
    labels: (N,) integer labels of the pool.
    num_clients: K >= 1 (at most N).
    partition: one of PARTITIONS.
    rng: random generator.
    dirichlet_alpha: Dirichlet concentration (> 0), "dirichlet" only.
    shards_per_client: shards per client (>= 1), "shards" only.
    min_size: minimum client size (>= 1), "dirichlet" only.

  Returns:
    K disjoint int64 index arrays whose union is range(N).

  Raises:
    ValueError: a bad argument (naming it and the allowed values), or a
      num_clients the pool cannot satisfy.
  """
  if partition not in PARTITIONS:
    raise ValueError(f"`partition` must be one of {PARTITIONS}, got {partition!r}.")
  k = _check_int("num_clients", num_clients, 1)
  _check_partition_args(dirichlet_alpha, shards_per_client, min_size)
  spc, min_size = int(shards_per_client), int(min_size)
  labels = np.asarray(labels)
  n = int(labels.shape[0])
  if partition in ("iid", "permuted"):
    if k > n:
      raise ValueError(f"`num_clients`={k} exceeds the {n} training examples: an {partition!r} "
                       "split would leave clients empty; use fewer clients or a larger "
                       "`train_size`.")
    return partition_lib.iid_partition(n, k, rng)
  if partition in ("class_split", "class_split_own"):
    return partition_lib.examples_of_classes(labels, partition_lib.class_groups(labels, k))
  if partition == "permuted_classes":
    groups = partition_lib.class_groups(labels, k, interleaved=True)
    return partition_lib.examples_of_classes(labels, groups)
  if partition == "dirichlet":
    if k * min_size > n:
      raise ValueError(f"`num_clients`={k} x `min_size`={min_size} = {k * min_size} exceeds the "
                       f"{n} training examples; use fewer clients, a smaller `min_size` or a "
                       "larger `train_size`.")
    try:
      return partition_lib.dirichlet_partition(labels, k, float(dirichlet_alpha), rng,
                                               min_size=min_size)
    except ValueError as e:  # no draw met min_size: name this function's arguments
      raise ValueError(f"Dirichlet partition over `num_clients`={k} failed: {e} (`alpha` is "
                       "`dirichlet_alpha` here; fewer clients or a larger `train_size` also "
                       "help).") from e
  num_shards = k * spc
  if num_shards > n:
    raise ValueError(f"`num_clients`={k} x `shards_per_client`={spc} = {num_shards} shards "
                     f"exceed the {n} training examples; use fewer clients or shards.")
  if n % num_shards:
    raise ValueError(f"`num_clients`={k} x `shards_per_client`={spc} = {num_shards} shards do "
                     f"not divide the {n} training examples (shards have equal sizes and no "
                     f"example is dropped); pass train_size={n - n % num_shards} (a multiple of "
                     f"{num_shards}) or a num_clients / shards_per_client that divides {n}.")
  return partition_lib.shard_partition(labels, k, shards_per_client=spc,
                                       shard_size=n // num_shards, rng=rng)


def _load(scenario_name: str, dataset: str, source: str, data_dir, synthetic_fallback: bool,
          train_size: int | None, test_size: int | None, seed: int
          ) -> tuple[Split, Split, str, str | None]:
  """(train pool, test set, provenance, synthetic domain if synthetic else None)."""

  def generate(provenance: str) -> tuple[Split, Split, str, str]:
    domain = _synthetic_domain(dataset)
    n_train = DEFAULT_SYNTHETIC_POOL_SIZE if train_size is None else train_size
    n_test = synthetic.DEFAULT_SYNTHETIC_TEST_SIZE if test_size is None else test_size
    return (synthetic.synthetic_digits(domain, n_train, seed=seed, split="train", cache=True),
            synthetic.synthetic_digits(domain, n_test, seed=seed, split="test", cache=True),
            provenance, domain)

  if source == "synthetic":
    return generate(f"synthetic(seed={seed})")
  try:
    train, test, provenance = load_dataset(dataset, source=source, data_dir=data_dir)
  except DataUnavailableError as e:
    if not synthetic_fallback:
      raise DataUnavailableError(
          f"Dataset {dataset!r} (source {source!r}) is unavailable: {e}\nTo provide it: "
          f"{_how_to(dataset, source)}.") from e
    domain = _synthetic_domain(dataset)
    switch = "" if source == "real" else " and set scenario.dataset_source=real"
    logger.warning(
        "SYNTHETIC SUBSTITUTION in scenario %r: dataset %r requested source %r, which is "
        "unavailable (%s). Using the synthetic %s digit domain (10 classes) instead because "
        "synthetic_fallback=True; results are not comparable with real-data runs. Real data: "
        "%s%s (docs/data.md).", scenario_name, dataset, source, str(e).splitlines()[0], domain,
        _download_command(dataset), switch)
    what = "" if domain == dataset else f"{domain} digits "
    return generate(f"synthetic(seed={seed}; {what}substituted for {source!r})")
  return train, test, provenance, None


def _class_group_domain(dataset: str, k: int, group: np.ndarray) -> str:
  """The test domain of client k of "class_split_own" (see the module docstring)."""
  first, last = int(group[0]), int(group[-1])
  if last - first + 1 == len(group):
    return f"{dataset}_classes{first}-{last}" if last > first else f"{dataset}_class{first}"
  return f"{dataset}_group{k}"


def build_partitioned_scenario(dataset: str, *, num_clients: int, partition: str,
                               dirichlet_alpha: float = 0.5, shards_per_client: int = 2,
                               source: str = "real", data_dir: str | os.PathLike | None = None,
                               synthetic_fallback: bool = False, train_size: int | None = None,
                               test_size: int | None = None, seed: int = 0,
                               min_size: int = 10, permuted_test: str = "split",
                               public_name: str = "cifar100", public_size: int = 0,
                               public_normalization: str = "library") -> Scenario:
  """One labelled dataset partitioned over `num_clients` clients (see the module docstring).

  Args:
    dataset: one of PARTITION_DATASETS.
    num_clients: number of clients K >= 1 (thousands are fine).
    partition: one of PARTITIONS.
    dirichlet_alpha: Dirichlet concentration (> 0) of "dirichlet".
    shards_per_client: shards per client (>= 1) of "shards".
    source: "real" (offline bundle), "tfds", "folder:<path>" or (mnist, usps,
      svhn) "synthetic".
    data_dir: bundle directory (else $FEDJAX_HET_DATA_DIR); the TFDS data
      directory for source="tfds".
    synthetic_fallback: substitute the synthetic digits for an unavailable
      source (logged, recorded in `sources` and `substituted`).
    train_size: stratified subsample of the training pool before
      partitioning (None: the whole pool; larger than the pool: ValueError);
      the pool size of synthetic data (default 10000).
    test_size: cap on the test set (stratified subsample; None: all); the
      test size of synthetic data (default 2000).
    seed: seeds subsamples, partition, example order, pixel permutations and
      synthetic data.
    min_size: minimum examples per client of "dirichlet" (>= 1).
    permuted_test: "split" (client i's test set is its 1/K share of the test
      set) or "full" (the whole test set), pixel-permuted; "permuted" only
      ("permuted_classes" tests each client on its own classes and takes "split").
    public_name, public_size, public_normalization: the public set, `public_size` images
      of `public_name` (one of the bundle's public sets, "synthetic", "tfds:<name>" or
      "folder:<path>") drawn as `scenarios.build_scenario` draws them, normalised with
      `public_normalization`'s statistics (`scenarios.load_public_set`); 0 (default): no
      public set, an empty array. An unavailable set raises, or with `synthetic_fallback`
      is replaced by the synthetic public images (logged, recorded in `sources["public"]`
      and `substituted`).

  Returns:
    Scenario.

  Raises:
    ValueError: a bad argument (naming it and the allowed values) or a
      num_clients the data cannot satisfy.
    DataUnavailableError: the source is unavailable and synthetic_fallback
      is False (the message says how to provide it).
    DataError: the data is present but invalid.
  """
  public_size = _check_int("public_size", public_size, 0)
  if dataset in PFLLIB_DATASETS:
    scenario = _build_pfllib_scenario(
        dataset, num_clients=num_clients, partition=partition, dirichlet_alpha=dirichlet_alpha,
        shards_per_client=shards_per_client, source=source, data_dir=data_dir,
        synthetic_fallback=synthetic_fallback, train_size=train_size, test_size=test_size,
        seed=seed)
  else:
    scenario = _build_scenario(
        dataset, num_clients=num_clients, partition=partition, dirichlet_alpha=dirichlet_alpha,
        shards_per_client=shards_per_client, source=source, data_dir=data_dir,
        synthetic_fallback=synthetic_fallback, train_size=train_size, test_size=test_size,
        seed=seed, min_size=min_size, permuted_test=permuted_test)
  if not public_size:
    return scenario
  return _with_public(scenario, public_name, public_size, public_normalization,
                      data_dir=data_dir, synthetic_fallback=bool(synthetic_fallback), seed=seed)


def _with_public(scenario: Scenario, public_name: str, public_size: int,
                 public_normalization: str, *, data_dir: str | os.PathLike | None,
                 synthetic_fallback: bool, seed: int) -> Scenario:
  """`scenario` with `public_size` images of `public_name` as its public set."""
  substituted = scenario.substituted
  try:
    public, provenance, mean, std = load_public_set(public_name, public_size, seed=seed,
                                                    data_dir=data_dir,
                                                    normalization=public_normalization)
  except DataUnavailableError as e:
    if not synthetic_fallback:
      raise DataUnavailableError(f"Scenario {scenario.name!r}: {e}\nOr pass public_size=0 "
                                 "(no public set) or synthetic_fallback=True.") from e
    logger.warning("Scenario %r: the public set %r is unavailable (%s); the synthetic public "
                   "images stand in for it.", scenario.name, public_name,
                   str(e).splitlines()[0])
    public, _, mean, std = load_public_set("synthetic", public_size, seed=seed,
                                           normalization=public_normalization)
    provenance = f"synthetic(seed={seed}; substituted for {public_name!r})"
    substituted += ("public",)
  return dataclasses.replace(scenario, public=public,
                             sources={**scenario.sources, "public": provenance},
                             substituted=substituted, public_mean=tuple(mean),
                             public_std=tuple(std))


def _build_scenario(dataset: str, *, num_clients: int, partition: str, dirichlet_alpha: float,
                    shards_per_client: int, source: str, data_dir: str | os.PathLike | None,
                    synthetic_fallback: bool, train_size: int | None, test_size: int | None,
                    seed: int, min_size: int, permuted_test: str) -> Scenario:
  """The partitions of PARTITIONS over `dataset` (module docstring)."""
  if dataset not in PARTITION_DATASETS:
    raise ValueError(f"`dataset` must be one of {PARTITION_DATASETS + PFLLIB_DATASETS}, got "
                     f"{dataset!r}.")
  if partition not in PARTITIONS:
    raise ValueError(f"`partition` must be one of {PARTITIONS}, got {partition!r}.")
  num_clients = _check_int("num_clients", num_clients, 1)
  source = _check_source(dataset, source)
  if not isinstance(synthetic_fallback, (bool, np.bool_)):
    raise ValueError(f"`synthetic_fallback` must be True or False, got {synthetic_fallback!r}.")
  train_size = _check_int("train_size", train_size, 1, optional=True)
  test_size = _check_int("test_size", test_size, 1, optional=True)
  seed = _check_int("seed", seed, 0)
  if permuted_test not in PERMUTED_TEST_MODES:
    raise ValueError(f"`permuted_test` must be one of {PERMUTED_TEST_MODES}, got "
                     f"{permuted_test!r}.")
  if partition == "permuted_classes" and permuted_test != "split":
    raise ValueError(f"`permuted_test`={permuted_test!r} applies to partition='permuted'; "
                     "partition='permuted_classes' tests every client on the test images of "
                     "its own classes: permuted_test must be 'split'.")
  _check_partition_args(dirichlet_alpha, shards_per_client, min_size)  # before loading

  name = f"{dataset}_{partition}"
  train, test, provenance, synthetic_domain = _load(name, dataset, source, data_dir,
                                                    bool(synthetic_fallback), train_size,
                                                    test_size, seed)
  substituted = (dataset,) if synthetic_domain is not None and source != "synthetic" else ()
  stats_name = dataset if synthetic_domain is None else synthetic_domain
  num_classes = _NUM_CLASSES[stats_name]
  class_names = () if source.startswith("folder:") else _CLASS_NAMES.get(stats_name, ())
  for split, which in ((train, "training"), (test, "test")):
    if len(split) and int(split.labels.max()) >= num_classes:
      raise DataError(f"{provenance}: {which} labels must lie in [0, {num_classes}) for "
                      f"{dataset!r}, found {int(split.labels.max())}.")

  if synthetic_domain is None:
    if train_size is not None:
      if train_size > len(train):
        raise ValueError(f"`train_size`={train_size} exceeds the {len(train)} training examples "
                         f"of {dataset!r} ({provenance}); pass train_size <= {len(train)} or "
                         "None.")
      train = train.take(stratified_subsample(train.labels, train_size,
                                              _rng(seed, _TRAIN_SUBSAMPLE)))
    if test_size is not None and test_size < len(test):
      test = test.take(stratified_subsample(test.labels, test_size, _rng(seed, _TEST_SUBSAMPLE)))

  pixel_permutations = None
  parts = partition_indices(train.labels, num_clients, partition, rng=_rng(seed, _PARTITION),
                            dirichlet_alpha=dirichlet_alpha,
                            shards_per_client=shards_per_client, min_size=min_size)
  order_rng = _rng(seed, _ORDER)
  clients = [train.take(order_rng.permutation(idx)) for idx in parts]

  if partition in PERMUTED_PARTITIONS:
    domains = tuple(f"{dataset}_perm{i}" for i in range(num_clients))
    if partition == "permuted_classes":
      groups = partition_lib.class_groups(train.labels, num_clients, interleaved=True)
      test_parts = [test.take(idx) for idx in partition_lib.examples_of_classes(test.labels,
                                                                               groups)]
      for i, part in enumerate(test_parts):
        if not len(part):
          raise ValueError(f"partition='permuted_classes': the test set has no image of the "
                           f"classes {groups[i].tolist()} of client {i}; use a larger "
                           "`test_size` (or None).")
    elif permuted_test == "split":
      if num_clients > len(test):
        raise ValueError(f"`num_clients`={num_clients} exceeds the {len(test)} test examples: "
                         "permuted_test='split' gives each client a disjoint share of the test "
                         "set; use fewer clients, a larger `test_size` or permuted_test='full'.")
      test_parts = [test.take(idx) for idx in
                    partition_lib.iid_partition(len(test), num_clients, _rng(seed, _TEST_SPLIT))]
    else:
      test_parts = [test] * num_clients
    height, width = train.images.shape[1:3]
    pixel_permutations = partition_lib.make_permutations(num_clients, seed,
                                                         num_pixels=height * width)
    clients = [Split(partition_lib.take_pixels(c.images, pixel_permutations[i]), c.labels)
               for i, c in enumerate(clients)]
    tests = {d: Split(partition_lib.take_pixels(t.images, pixel_permutations[i]), t.labels)
             for i, (d, t) in enumerate(zip(domains, test_parts))}
    provenance += (f"; pixels permuted per client (partition.client_permutation, seed={seed}); "
                   + (f"classes dealt in turn (client i: row i of {groups.tolist()}); test "
                      "per client: the test images of its own classes"
                      if partition == "permuted_classes" else f"test {permuted_test}"))
  elif partition == "class_split_own":
    groups = partition_lib.class_groups(train.labels, num_clients)
    domains = tuple(_class_group_domain(dataset, k, group) for k, group in enumerate(groups))
    own = partition_lib.examples_of_classes(test.labels, groups)
    for domain, idx in zip(domains, own):
      if not idx.size:
        raise ValueError(f"partition='class_split_own': the test set has no image of the classes "
                         f"of client {domain!r}; use a larger `test_size` (or None).")
    tests = {d: test.take(idx) for d, idx in zip(domains, own)}
    provenance += "; test per client: the test images of its own classes"
  else:
    domains = (dataset,) * num_clients
    tests = {dataset: test}

  mean, std = DATASET_STATS[stats_name]
  return Scenario(
      name=name, num_classes=num_classes, domains=domains,
      train=tuple(clients), test=tests, public=np.zeros((0, 32, 32, 3), np.uint8),
      sources={dataset: provenance, "public": "none"}, substituted=substituted,
      private_mean=tuple(mean), private_std=tuple(std), public_mean=tuple(mean),
      public_std=tuple(std), class_names=tuple(class_names),
      pixel_permutations=pixel_permutations)


def _build_pfllib_scenario(dataset: str, *, num_clients: int, partition: str,
                           dirichlet_alpha: float, shards_per_client: int, source: str,
                           data_dir: str | os.PathLike | None, synthetic_fallback: bool,
                           train_size: int | None, test_size: int | None,
                           seed: int) -> Scenario:
  """PFLlib's data of `dataset` = f"{name}_pfllib" (module docstring)."""
  name = dataset[:-len(PFLLIB_SUFFIX)]
  if partition not in PFLLIB_PARTITIONS:
    raise ValueError(f"`partition` must be one of {tuple(PFLLIB_PARTITIONS)} for dataset "
                     f"{dataset!r} (PFLlib's {tuple(PFLLIB_PARTITIONS.values())}), got "
                     f"{partition!r}.")
  k = _check_int("num_clients", num_clients, 1)
  source = _check_source(name, source)
  if not isinstance(synthetic_fallback, (bool, np.bool_)):
    raise ValueError(f"`synthetic_fallback` must be True or False, got {synthetic_fallback!r}.")
  train_size = _check_int("train_size", train_size, 1, optional=True)
  test_size = _check_int("test_size", test_size, 1, optional=True)
  seed = _check_int("seed", seed, 0)
  _check_partition_args(dirichlet_alpha, shards_per_client, 1)
  train, test, provenance, synthetic_domain = _load(f"{dataset}_{partition}", name, source,
                                                    data_dir, bool(synthetic_fallback),
                                                    train_size, test_size, seed)
  substituted = (name,) if synthetic_domain is not None and source != "synthetic" else ()
  stats_name = name if synthetic_domain is None else synthetic_domain
  num_classes = _NUM_CLASSES[stats_name]
  class_names = () if source.startswith("folder:") else _CLASS_NAMES.get(stats_name, ())
  if synthetic_domain is None:
    if train_size is not None:
      if train_size > len(train):
        raise ValueError(f"`train_size`={train_size} exceeds the {len(train)} training examples "
                         f"of {name!r} ({provenance}); pass train_size <= {len(train)} or None.")
      train = train.take(stratified_subsample(train.labels, train_size,
                                              _rng(seed, _TRAIN_SUBSAMPLE)))
    if test_size is not None and test_size < len(test):
      test = test.take(stratified_subsample(test.labels, test_size, _rng(seed, _TEST_SUBSAMPLE)))
  pool = Split(np.concatenate([train.images, test.images]),
               np.concatenate([train.labels, test.labels]).astype(train.labels.dtype))
  n = len(pool)
  if len(pool.labels) and int(pool.labels.max()) >= num_classes:
    raise DataError(f"{provenance}: labels must lie in [0, {num_classes}) for {name!r}, found "
                    f"{int(pool.labels.max())}.")
  least = int(min(PFLLIB_BATCH_SIZE / (1 - PFLLIB_TRAIN_FRACTION), n / k / 2))
  rng = _rng(seed, _PARTITION)
  if partition == "dirichlet":
    if k * max(least, 1) > n:
      raise ValueError(f"`num_clients`={k} exceeds what the {n} pooled examples allow; use "
                       "fewer clients or larger `train_size` / `test_size`.")
    parts = partition_lib.dirichlet_partition(pool.labels, k, float(dirichlet_alpha), rng,
                                              min_size=max(least, 1))
  else:
    per_client = int(shards_per_client) if partition == "shards" else num_classes
    parts = partition_lib.pathological_partition(
        pool.labels, k, classes_per_client=per_client, rng=rng, balance=partition == "iid",
        min_size=least)
  split_rng = _rng(seed, _CLIENT_SPLIT)
  domains = tuple(f"{name}_client{i}" for i in range(k))
  clients, tests = [], {}
  for domain, idx in zip(domains, parts):
    own_train, own_test = partition_lib.train_test_split_indices(len(idx), PFLLIB_TRAIN_FRACTION,
                                                                 split_rng)
    if not own_train.size or not own_test.size:
      raise ValueError(f"PFLlib data {dataset!r}: client {domain!r} holds {len(idx)} examples, "
                       f"too few for a {PFLLIB_TRAIN_FRACTION:g} / "
                       f"{1 - PFLLIB_TRAIN_FRACTION:g} train/test split; use fewer clients or "
                       "larger `train_size` / `test_size`.")
    clients.append(pool.take(idx[own_train]))
    tests[domain] = pool.take(idx[own_test])
  provenance += (f"; PFLlib's data: training and test splits pooled ({n} images), partition "
                 f"{PFLLIB_PARTITIONS[partition]!r}, each client split "
                 f"{PFLLIB_TRAIN_FRACTION:g} / {1 - PFLLIB_TRAIN_FRACTION:g} into train / test")
  mean, std = PFLLIB_STATS
  return Scenario(
      name=f"{dataset}_{partition}", num_classes=num_classes, domains=domains,
      train=tuple(clients), test=tests, public=np.zeros((0, 32, 32, 3), np.uint8),
      sources={name: provenance, "public": "none"}, substituted=substituted,
      private_mean=mean, private_std=std, public_mean=mean, public_std=std,
      class_names=tuple(class_names))

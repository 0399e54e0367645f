"""Scenario builders: per-client private sets, per-domain test sets and a public set.

`build_scenario` assembles the FCCL/FCCL+ domain-shift scenarios (Digits,
Office-Caltech, Office31, Office-Home) from explicitly chosen sources, one per
domain. Nothing silently changes the data: a requested source that is not
available raises an error saying how to provide it, unless
`synthetic_fallback=True`, which substitutes the synthetic domain (Digits
domains and the public set only), logs a warning, and records the
substitution in `Scenario.substituted` and `Scenario.sources`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedjax_het.data import augment, npz, synthetic
from fedjax_het.data._base import DATA_DIR_ENV, DataError, DataUnavailableError, Split, logger
from fedjax_het.data.folder import load_image_folder
from fedjax_het.data.tfds_source import TFDS_NAMES, load_tfds, tfds_split_size

Stats = tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class Scenario:
  """A federated scenario: private client data, per-domain test sets, public data.

  Attributes:
    name: scenario name ("digits", "office31", ...; "_homogeneous" appended
      for the homogeneous variant).
    num_classes: number of classes.
    domains: the domain of each client, one per client (e.g. ("mnist",
      "usps", "svhn", "syn")); the client's intra-domain test set is
      `test[domains[i]]`.
    train: one private Split per client.
    test: domain -> test Split, for every domain of the scenario.
    public: uint8 (N0, 32, 32, 3) unlabeled public images (N0 may be 0).
    sources: domain (and "public") -> provenance of the data actually used,
      e.g. "npz:/data/digits.npz[mnist]", "tfds:svhn_cropped",
      "folder:/data/SYN", "synthetic(seed=0)" or, for a substitution,
      "synthetic(seed=0; substituted for 'tfds')".
    substituted: domains (and possibly "public") whose requested source was
      unavailable and replaced by synthetic data (synthetic_fallback=True).
    private_mean, private_std: normalisation statistics of private data.
    public_mean, public_std: normalisation statistics of the public data.
    class_names: class names when known (else ()).
    office_test: the test protocol of an Office scenario, "held_out" (test
      images are never private data) or "whole_domain" (each test set is
      the whole domain, training images included); "" for other scenarios.
    pixel_permutations: int (num_clients, H * W): row i is the order of the
      pixel positions client i's training and test images carry
      (`partition.take_pixels`), for the permuted partitions of
      `data.partitioned`; None where no pixel is permuted.
  """
  name: str
  num_classes: int
  domains: tuple[str, ...]
  train: tuple[Split, ...]
  test: dict[str, Split]
  public: np.ndarray
  sources: dict[str, str]
  substituted: tuple[str, ...]
  private_mean: Stats
  private_std: Stats
  public_mean: Stats
  public_std: Stats
  class_names: tuple[str, ...] = ()
  office_test: str = ""
  pixel_permutations: np.ndarray | None = None

  def __post_init__(self):
    if len(self.train) != len(self.domains):
      raise ValueError(f"Scenario: {len(self.train)} train splits for {len(self.domains)} "
                       "domains (one per client expected).")
    missing = set(self.domains) - set(self.test)
    if missing:
      raise ValueError(f"Scenario: no test split for domains {sorted(missing)}.")
    if (self.pixel_permutations is not None
        and np.shape(self.pixel_permutations)[0] != len(self.domains)):
      raise ValueError(f"Scenario: {np.shape(self.pixel_permutations)[0]} pixel permutations "
                       f"for {len(self.domains)} clients (one per client expected).")
    public = np.asarray(self.public)
    if public.dtype != np.uint8 or public.ndim != 4 or public.shape[1:] != (32, 32, 3):
      raise DataError(f"Scenario: public must be uint8 (N, 32, 32, 3), got {public.dtype} "
                      f"{public.shape}.")

  @property
  def num_clients(self) -> int:
    return len(self.domains)

  def metadata(self) -> dict[str, Any]:
    """JSON-serialisable description (for the run's config/metadata files)."""
    return {
        "name": self.name, "num_classes": self.num_classes, "domains": list(self.domains),
        "train_sizes": [len(s) for s in self.train],
        "test_sizes": {d: len(s) for d, s in self.test.items()},
        "public_size": int(self.public.shape[0]), "sources": dict(self.sources),
        "substituted": list(self.substituted),
        "private_mean": list(self.private_mean), "private_std": list(self.private_std),
        "public_mean": list(self.public_mean), "public_std": list(self.public_std),
        **({"office_test": self.office_test} if self.office_test else {}),
    }


@dataclasses.dataclass(frozen=True)
class _Spec:
  domains: tuple[str, ...]
  num_classes: int
  private_sizes: dict[str, int]
  default_sources: dict[str, str]
  bundle: str  # npz bundle entry read by the "real" source
  train_max_remainder: int  # index split rule for arrays/folders without a split


#: The scenarios of FCCL/FCCL+ with their FCCL+ Table V private sizes.
SCENARIOS: dict[str, _Spec] = {
    "digits": _Spec(("mnist", "usps", "svhn", "syn"), 10,
                    {"mnist": 150, "usps": 80, "svhn": 5000, "syn": 1800},
                    {"mnist": "real", "usps": "real", "svhn": "tfds", "syn": "real"},
                    "digits", npz.OFFICE_TRAIN_MAX_REMAINDER),
    "office_caltech": _Spec(("amazon", "caltech", "dslr", "webcam"), 10,
                            {"amazon": 368, "caltech": 431, "dslr": 60, "webcam": 113},
                            {"amazon": "real", "caltech": "real", "dslr": "real",
                             "webcam": "real"},
                            "office_caltech", npz.OFFICE_TRAIN_MAX_REMAINDER),
    "office31": _Spec(("amazon", "dslr", "webcam"), 31,
                      {"amazon": 1082, "dslr": 192, "webcam": 305},
                      {"amazon": "real", "dslr": "real", "webcam": "real"},
                      "office31", npz.OFFICE_TRAIN_MAX_REMAINDER),
    "office_home": _Spec(("art", "clipart", "product", "real_world"), 65,
                         {"art": 1400, "clipart": 2000, "product": 2500, "real_world": 2000},
                         {"art": "real", "clipart": "real", "product": "real",
                          "real_world": "real"},
                         "office_home", npz.OFFICE_TRAIN_MAX_REMAINDER),
}

#: Test protocols of the Office scenarios (`build_scenario(office_test=...)`).
OFFICE_TESTS = ("held_out", "whole_domain")

_TFDS_DOMAINS = {"mnist": "mnist", "svhn": "svhn_cropped"}
_PUBLIC_NPZ = tuple(npz.PUBLIC_FILES)
#: Public set -> normalisation statistics, `public_normalization="library"`: CIFAR-100's for
#: CIFAR-100, Tiny-ImageNet and everything else; ImageNet's for Fashion-MNIST.
_PUBLIC_STATS = {"fmnist": (augment.IMAGENET_MEAN, augment.IMAGENET_STD),
                 "tfds:fashion_mnist": (augment.IMAGENET_MEAN, augment.IMAGENET_STD)}
#: `public_normalization="fcclplus_code"`: the FCCL+ code's statistics where they differ from
#: the library's. Its `datasets/cifar100.py` normalises the public CIFAR-100 images with
#: Tiny-ImageNet's mean and std (0.4802, 0.4480, 0.3975) / (0.2770, 0.2691, 0.2821); its
#: Tiny-ImageNet (CIFAR-100's statistics) and Fashion-MNIST (ImageNet's) match the library's.
_FCCLPLUS_CODE_PUBLIC_STATS = {"cifar100": (augment.TINYIMAGENET_MEAN, augment.TINYIMAGENET_STD)}
#: How the public images are normalised (`build_scenario(public_normalization=...)`).
PUBLIC_NORMALIZATIONS = ("library", "fcclplus_code")


# ----------------------------------------------------------------------------
# Source parsing.
# ----------------------------------------------------------------------------


def _allowed_sources(domain: str) -> tuple[str, ...]:
  allowed = ["real", "folder:<path>"]
  if domain in _TFDS_DOMAINS:
    allowed.append("tfds")
  if domain in synthetic.DIGIT_DOMAINS:
    allowed.append("synthetic")
  return tuple(allowed)


def _check_source(domain: str, source: str) -> str:
  if not isinstance(source, str):
    raise ValueError(f"sources[{domain!r}] must be a string, got {source!r}.")
  ok = (source == "real" or (source.startswith("folder:") and len(source) > len("folder:"))
        or (source == "tfds" and domain in _TFDS_DOMAINS)
        or (source == "synthetic" and domain in synthetic.DIGIT_DOMAINS))
  if not ok:
    raise ValueError(f"sources[{domain!r}] = {source!r} is not a valid source for this domain; "
                     f"allowed: {_allowed_sources(domain)}.")
  return source


def _resolve_sources(name: str, spec: _Spec, domains: Sequence[str],
                     sources: Mapping[str, str] | str | None) -> dict[str, str]:
  if isinstance(sources, str):
    sources = {d: sources for d in spec.domains}
  sources = dict(sources or {})
  unknown = set(sources) - set(spec.domains)
  if unknown:
    raise ValueError(f"sources: unknown domains {sorted(unknown)} for scenario {name!r}; its "
                     f"domains are {spec.domains} (the public set is chosen with `public_name`).")
  resolved = {**spec.default_sources, **sources}
  return {d: _check_source(d, resolved[d]) for d in dict.fromkeys(domains)}


# ----------------------------------------------------------------------------
# Domain pools: a training pool to draw private data from, plus a test split.
# ----------------------------------------------------------------------------


class _Pool:
  """A domain's training pool (drawn from by index) and its test split."""
  provenance: str
  class_names: tuple[str, ...] = ()

  @property
  def train_size(self) -> int:
    raise NotImplementedError

  def train(self, indices: np.ndarray) -> Split:
    raise NotImplementedError

  def test(self, test_size: int | None, rng: np.random.Generator) -> Split:
    raise NotImplementedError


def stratified_subsample(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """Indices of a seeded subsample of `size` with class proportions kept (+-1).

  Returns sorted indices (the original order is kept).
  """
  labels = np.asarray(labels)
  n = labels.shape[0]
  if size >= n:
    return np.arange(n)
  perm = rng.permutation(n)
  ranks = np.zeros(n)
  counts = np.bincount(labels)
  seen = np.zeros_like(counts)
  for i in perm:  # rank of each example within its class, in random order
    ranks[i] = (seen[labels[i]] + 0.5) / counts[labels[i]]
    seen[labels[i]] += 1
  return np.sort(np.argsort(ranks, kind="stable")[:size])


class _ArrayPool(_Pool):

  def __init__(self, train: Split, test: Split, provenance: str,
               class_names: tuple[str, ...] = ()):
    self._train, self._test = train, test
    self.provenance = provenance
    self.class_names = class_names

  @property
  def train_size(self) -> int:
    return len(self._train)

  def train(self, indices: np.ndarray) -> Split:
    return self._train.take(indices)

  def test(self, test_size: int | None, rng: np.random.Generator) -> Split:
    if test_size is None:
      return self._test
    return self._test.take(stratified_subsample(self._test.labels, test_size, rng))


class _TfdsPool(_Pool):

  def __init__(self, builder: str, data_dir: str | os.PathLike | None):
    self._builder, self._data_dir = builder, data_dir
    self._train_size = tfds_split_size(builder, "train", data_dir=data_dir)
    self._test_size = tfds_split_size(builder, "test", data_dir=data_dir)
    self.provenance = f"tfds:{builder}"

  @property
  def train_size(self) -> int:
    return self._train_size

  def train(self, indices: np.ndarray) -> Split:
    return load_tfds(self._builder, "train", data_dir=self._data_dir, indices=indices)

  def test(self, test_size: int | None, rng: np.random.Generator) -> Split:
    if test_size is None or test_size >= self._test_size:
      return load_tfds(self._builder, "test", data_dir=self._data_dir)
    # Labels are only known after reading, so the cap is a uniform random
    # (not stratified) subset here; reading all test images would be slow.
    indices = np.sort(rng.permutation(self._test_size)[:test_size])
    return load_tfds(self._builder, "test", data_dir=self._data_dir, indices=indices)


class _SyntheticPool(_ArrayPool):
  """Generated (cached) synthetic digits; the test set is already drawn at `test_size`."""

  def __init__(self, domain: str, train_size: int, test_size: int, seed: int, provenance: str):
    super().__init__(
        synthetic.synthetic_digits(domain, train_size, seed=seed, split="train", cache=True),
        synthetic.synthetic_digits(domain, test_size, seed=seed, split="test", cache=True),
        provenance, tuple(str(i) for i in range(10)))

  def test(self, test_size: int | None, rng: np.random.Generator) -> Split:
    return self._test


def _folder_pool(path: str, spec: _Spec, scenario: str, whole_domain_test: bool = False) -> _Pool:
  """An ImageFolder domain; `whole_domain_test`: its test split is all of its images."""
  root = os.path.expanduser(path)
  expected = tuple(str(i) for i in range(10)) if scenario == "digits" else None
  test_dir = next((os.path.join(root, d) for d in ("test", "val")
                   if os.path.isdir(os.path.join(root, d))), None)
  if os.path.isdir(os.path.join(root, "train")) and test_dir is not None:
    train, names = load_image_folder(os.path.join(root, "train"), class_names=expected)
    test, test_names = load_image_folder(test_dir, class_names=names)
    del test_names
    if whole_domain_test:
      test = Split(np.concatenate([train.images, test.images]),
                   np.concatenate([train.labels, test.labels]))
  else:
    full, names = load_image_folder(root, class_names=expected)
    train, test = npz.index_split(full, spec.train_max_remainder)
    if whole_domain_test:
      test = full
  if len(names) != spec.num_classes:
    raise DataError(f"{root}: {len(names)} class folders, scenario {scenario!r} has "
                    f"{spec.num_classes} classes.")
  return _ArrayPool(train, test, f"folder:{root}", names)


def _real_pool(domain: str, spec: _Spec, scenario: str, data_dir: str | os.PathLike | None,
               whole_domain_test: bool = False) -> _Pool:
  if scenario == "digits":
    train, test = npz.load_npz_digits(data_dir, domains=(domain,))[domain]
    path = npz.bundle_path("digits", data_dir)
    return _ArrayPool(train, test, f"npz:{path}[{domain}]", tuple(str(i) for i in range(10)))
  splits, names = npz.load_office_domains(spec.bundle, data_dir, domains=(domain,))
  train, test = npz.index_split(splits[domain], spec.train_max_remainder)
  if whole_domain_test:
    test = splits[domain]
  path = npz.bundle_path(spec.bundle, data_dir)
  return _ArrayPool(train, test, f"npz:{path}[{domain}]", names)


#: Digit domains and public sets that `python -m fedjax_het.data.download` fetches (or, with
#: `--from`, converts), by name; docs/data.md lists them.
_DOWNLOADABLE = {"mnist": "mnist", "usps": "usps", "svhn": "svhn",
                 "syn": "syn --from <SYN archive>", "cifar100": "cifar100", "fmnist": "fmnist",
                 "tinyimagenet": "tinyimagenet"}


#: `tfds:` public sets -> the bundle public set of the same dataset (the download command's name).
_TFDS_PUBLIC = {"tfds:cifar100": "cifar100", "tfds:fashion_mnist": "fmnist",
                "tfds:fmnist": "fmnist"}


def is_synthetic_stand_in(domain: str, source: str, *, data_dir: str | os.PathLike | None,
                          synthetic_fallback: bool) -> bool | None:
  """Whether a digits scenario's `domain` with `source` is the synthetic stand-in, read off the
  bundle's keys without loading any data: True or False, or None where only loading the data
  can tell (a `tfds` or `folder:` source).

  `synthetic` is the stand-in; `real` is the stand-in when the data directory's digits.npz
  lacks the domain (or there is none) and `synthetic_fallback` is on. The stand-in depends on
  the domain and the seed only, so two sources that both give it give the same data.
  """
  if domain not in synthetic.DIGIT_DOMAINS or source not in ("synthetic", "real"):
    return None
  if source == "synthetic":
    return True
  try:
    with npz.open_bundle("digits", data_dir) as reader:
      present = f"{domain}_train_x" in reader.keys
  except DataError:  # no data directory, no digits.npz, or an unreadable one
    present = False
  if present:
    return False
  return True if synthetic_fallback else None


def _download_parts(name: str, source: str) -> tuple[str, str] | None:
  """(the download command's argument, the config switch to set after it, "" for none) that
  brings `name`'s real data, or None when no download does.

  `name` is a digit domain, or (source "public") a `public_name`; `source` is the domain's
  requested source. The command writes the bundle, which the "real" source (and a bundle
  public set) reads.
  """
  if source == "public":
    if name in _PUBLIC_NPZ:
      return _DOWNLOADABLE[name], ""
    bundle = _TFDS_PUBLIC.get(name)
    if bundle is not None:
      return bundle, f"scenario.public_name={bundle}"
    return "cifar100 (or fmnist, tinyimagenet)", "scenario.public_name to that name"
  if name not in _DOWNLOADABLE:
    return None
  return _DOWNLOADABLE[name], "" if source == "real" else f"scenario.sources.{name}=real"


def _download_sentence(parts: Sequence[tuple[str, str]]) -> str:
  """" Real data: <the download commands> [and set <switches>] (docs/data.md)." for the
  (argument, switch) pairs of `_download_parts` ("" without any)."""
  if not parts:
    return ""
  download = "python -m fedjax_het.data.download --data_dir <dir>"
  names = list(dict.fromkeys(n for n, _ in parts))
  plain = [n for n in names if " " not in n]  # "syn --from ..." and alternatives run alone
  commands = [f"{download} {' '.join(plain)}"] * bool(plain) + [
      f"{download} {n}" for n in names if " " in n]
  switches = list(dict.fromkeys(w for _, w in parts if w))
  return (" Real data: " + "; ".join(commands)
          + (" and set " + ", ".join(switches) if switches else "") + " (docs/data.md).")


def _substitution_warning(scenario: str,
                          substitutions: Sequence[tuple[str, str, str, str]]) -> str:
  """One warning for every synthetic substitution of a scenario: what, why (each distinct
  reason's first sentence once) and the download commands that bring the real data."""
  what = ", ".join(w for w, _, _, _ in substitutions)
  reasons = list(dict.fromkeys(why.split(". ")[0].rstrip(".") + "."
                               for _, why, _, _ in substitutions))
  parts = [p for p in (_download_parts(item, source) for _, _, item, source in substitutions)
           if p is not None]
  many = len(substitutions) > 1
  return (f"SYNTHETIC SUBSTITUTION in scenario {scenario!r}: {what} {'are' if many else 'is'} "
          f"unavailable, so the embedded synthetic data stands in for {'them' if many else 'it'}"
          f" (synthetic_fallback=True; results are not comparable with real-data runs). "
          + " ".join(reasons) + _download_sentence(parts))


def _download_hint(name: str, source: str = "real") -> str:
  """How to get `name`'s real data into the data directory, as a sentence ("" when no
  download brings it; `_download_parts`)."""
  parts = _download_parts(name, source)
  return _download_sentence([parts] if parts else [])


def _how_to(domain: str, source: str, spec: _Spec, scenario: str) -> str:
  bundle = npz.BUNDLE[spec.bundle].filename
  hints = []
  if source == "real":
    command = (f": python -m fedjax_het.data.download {_DOWNLOADABLE[domain]}"
               if domain in _DOWNLOADABLE else "")
    hints.append(f"put {bundle} with keys for {domain!r} in the data directory (data_dir=... or "
                 f"${DATA_DIR_ENV}){command}")
  if domain in _TFDS_DOMAINS and source != "tfds":
    hints.append(f"sources={{{domain!r}: 'tfds'}} (TFDS {_TFDS_DOMAINS[domain]!r}, prepared)")
  if not source.startswith("folder:"):
    layout = "class folders 0..9" if scenario == "digits" else "one folder per class"
    hints.append(f"sources={{{domain!r}: 'folder:/path'}} (ImageFolder with {layout}, either "
                 "directly or under train/ and test|val/)")
  if domain in synthetic.DIGIT_DOMAINS:
    hints.append(f"sources={{{domain!r}: 'synthetic'}} or synthetic_fallback=True for the "
                 "synthetic stand-in")
  return "; or ".join(hints)


def _office_unavailable(name: str, spec: _Spec, failures: Sequence[tuple[str, str, str]],
                        loaded: Mapping[str, _Pool]) -> str:
  """One line for unavailable Office domains: which, why, the field to set, the folder layout.

  `failures` holds (domain, source, reason); `loaded` the domains that did load.
  """
  groups: dict[tuple[str, str], list[str]] = {}
  for domain, source, reason in failures:
    groups.setdefault((source, " ".join(reason.splitlines())), []).append(domain)
  missing = [d for d, _, _ in failures]
  what = "; ".join(
      f"domain{'s' if len(ds) > 1 else ''} {', '.join(repr(d) for d in ds)} (source "
      f"{source!r}: {reason.rstrip('.')})" for (source, reason), ds in groups.items())
  first = missing[0]
  names = next((p.class_names for p in loaded.values() if p.class_names), ())
  classes = (f"the class folders: {', '.join(names)}" if names and len(names) <= 12 else
             f"{spec.num_classes} class folders, named as in the other domains")
  each, it = ("each", "them") if len(missing) > 1 else ("it", "it")
  message = (
      f"Scenario {name!r}: no data for {what}. Give {each} as an image folder: "
      f"--config.scenario.sources.{first}=folder:<path> (config field "
      f"scenario.sources.{first if len(missing) == 1 else '<domain>'}; in Python "
      f"build_scenario(sources={{{first!r}: 'folder:<path>'}})), an ImageFolder with one "
      f"sub-folder per class, <path>/<class name>/*.jpg (split by image index: i % 10 <= 7 "
      f"train, the rest test), or <path>/train/<class name>/*.jpg beside <path>/test/ (or "
      f"val/); {classes}; or put {npz.BUNDLE[spec.bundle].filename} with keys "
      f"{first}_x/{first}_y in the data directory (scenario.data_dir or ${DATA_DIR_ENV})")
  remaining = tuple(d for d in spec.domains if d in loaded)
  if remaining:
    message += (f"; or leave {it} out: --config.scenario.domains=\"{remaining!r}\" with one "
                f"config.models.architectures entry per remaining participant")
  return message + "."


# ----------------------------------------------------------------------------
# Public set.
# ----------------------------------------------------------------------------


def _public_stats(name: str, normalization: str = "library") -> tuple[Stats, Stats]:
  if normalization not in PUBLIC_NORMALIZATIONS:
    raise ValueError(f"public_normalization={normalization!r}; allowed: "
                     f"{PUBLIC_NORMALIZATIONS}.")
  table = dict(_PUBLIC_STATS)
  if normalization == "fcclplus_code":
    table.update(_FCCLPLUS_CODE_PUBLIC_STATS)
  mean, std = table.get(name, (augment.CIFAR100_MEAN, augment.CIFAR100_STD))
  return tuple(mean), tuple(std)


def _load_public_images(name: str, data_dir: str | os.PathLike | None, size: int, seed: int,
                        rng: np.random.Generator, tfds_data_dir: str | os.PathLike | None
                        ) -> tuple[np.ndarray, str]:
  if name in _PUBLIC_NPZ:
    images = npz.load_public(name, data_dir)
    provenance = f"npz:{npz.bundle_path(npz.PUBLIC_FILES[name], data_dir)}"
  elif name == "synthetic":
    return synthetic.synthetic_public(size, seed=seed, cache=True), f"synthetic(seed={seed})"
  elif name.startswith("tfds:"):
    builder = TFDS_NAMES.get(name[5:], name[5:])
    total = tfds_split_size(builder, "train", data_dir=tfds_data_dir)
    if total < size:
      raise ValueError(f"public set {name!r} has {total} images, public_size={size} requested.")
    indices = np.sort(rng.permutation(total)[:size])
    return (load_tfds(builder, "train", data_dir=tfds_data_dir, indices=indices).images,
            f"tfds:{builder}")
  elif name.startswith("folder:"):
    images = load_image_folder(os.path.expanduser(name[7:]))[0].images
    provenance = f"folder:{os.path.expanduser(name[7:])}"
  else:
    raise ValueError(f"`public_name` must be one of {_PUBLIC_NPZ + ('synthetic',)}, "
                     f"'tfds:<name>' or 'folder:<path>', got {name!r}.")
  if images.shape[0] < size:
    raise ValueError(f"public set {name!r} ({provenance}) has {images.shape[0]} images, "
                     f"public_size={size} requested; pass a smaller public_size.")
  if images.shape[0] > size:
    images = images[np.sort(rng.permutation(images.shape[0])[:size])]
  return images, provenance


def load_public_set(name: str, size: int, *, seed: int,
                    data_dir: str | os.PathLike | None = None,
                    normalization: str = "library") -> tuple[np.ndarray, str, Stats, Stats]:
  """`size` images of the public set `name`, drawn as `build_scenario` draws them.

  The partitioned scenarios' public set (`partitioned.build_partitioned_scenario`): the same
  images `build_scenario(public_name=name, public_size=size, seed=seed)` holds.

  Returns:
    (uint8 images (size, 32, 32, 3), provenance, mean, std): the statistics of
    `normalization` (one of `PUBLIC_NORMALIZATIONS`).

  Raises:
    ValueError: an unknown name or normalisation, or more images than the set holds.
    DataUnavailableError: the set is not in the data directory (the message says how to
      provide it).
  """
  mean, std = _public_stats(name, normalization)
  rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2025]))
  try:
    images, provenance = _load_public_images(name, data_dir, size, int(seed), rng, data_dir)
  except DataUnavailableError as e:
    raise DataUnavailableError(f"public set {name!r} unavailable: {e}") from e
  return images, provenance, mean, std


# ----------------------------------------------------------------------------
# build_scenario.
# ----------------------------------------------------------------------------


def build_scenario(name: str, *, data_dir: str | os.PathLike | None = None,
                   sources: Mapping[str, str] | str | None = None,
                   synthetic_fallback: bool = False,
                   private_sizes: Mapping[str, int] | None = None,
                   test_size: int | None = None, public_name: str = "cifar100",
                   public_size: int = 5000, seed: int = 0,
                   domains: Sequence[str] | None = None,
                   homogeneous: bool = False,
                   tfds_data_dir: str | os.PathLike | None = None,
                   office_test: str = "held_out",
                   public_normalization: str = "library") -> Scenario:
  """Builds a domain-shift scenario of FCCL / FCCL+ (one client per domain by default).

  Scenarios, their domains and default sources (every default requests the
  real data; nothing synthetic is used unless asked for):

  * "digits": mnist, usps, svhn, syn (10 classes). Defaults: mnist "real",
    usps "real" (digits.npz of the bundle), svhn "tfds" (svhn_cropped; "real"
    reads the `svhn_*` keys that `python -m fedjax_het.data.download svhn`
    adds to digits.npz), syn "real" (the `syn_*` keys of `download syn --from
    PATH`; or `folder:` with the SYN images, or "synthetic").
  * "office_caltech": amazon, caltech, dslr, webcam (10 classes), "real" =
    office_caltech10.npz, which lacks caltech (use `folder:` or drop it with
    `domains=("amazon", "dslr", "webcam")`).
  * "office31": amazon, dslr, webcam (31 classes), office31.npz.
  * "office_home": art, clipart, product, real_world (65 classes), "real" =
    a user-made office_home.npz (same layout); usually `folder:` sources.

  Sources per domain (`sources`): "real" (the `.npz` bundle under the data
  directory), "tfds" (mnist, svhn; TFDS prepared for random access),
  "folder:<path>" (ImageFolder with class sub-folders, either with train/ and
  test/ (or val/) sub-folders, as the FCCL code's SYN, or one folder split by
  index), "synthetic" (digit domains only: `synthetic.synthetic_digits`).
  A string instead of a dict applies to every domain (e.g.
  `sources="synthetic"` for the fully offline Digits benchmark).

  Splits: the domain's official train/test split where one exists (MNIST,
  USPS, SVHN, folders with train/ and test/); otherwise index i of the
  domain's array is a training example iff i % 10 <= 7 (the FCCL+ code's rule
  for Office31, Office-Caltech and Office-Home). Synthetic domains generate a
  training pool of exactly the requested size and a test set of `test_size`
  (default 2000) images from a separate random stream. Office test protocol
  (`office_test`): "held_out" (default) tests on the images outside the
  training split only; "whole_domain" tests on every image of the domain,
  training images included, which is what the FCCL+ benchmark code evaluates
  on (private data still comes from the training split).

  Private data: client i draws `private_sizes[domains[i]]` training examples
  of its domain without replacement (seeded); clients sharing a domain get
  disjoint examples. Defaults are FCCL+ Table V (digits 150/80/5000/1800;
  office_caltech 368/431/60/113; office31 1082/192/305; office_home
  1400/2000/2500/2000). With `homogeneous=True` each client instead draws
  its size evenly from all of the scenario's domains (shuffled), removing the
  domain shift between clients (the data side of a homogeneous control; the
  model side is the engine's choice).

  Public data (`public_name`): "cifar100" (default; the bundle's 5000
  CIFAR-100 images, FCCL's public set), "fmnist", "tinyimagenet", "synthetic"
  (`synthetic.synthetic_public`), "tfds:<name>" (train split) or
  "folder:<path>"; `public_size` images are drawn without replacement
  (public_size=0 gives an empty public set).

  Normalisation: ImageNet statistics for private data. Public data
  (`public_normalization`): "library" (default) normalises every public set
  with CIFAR-100's statistics, except Fashion-MNIST (ImageNet's); "fcclplus_code"
  normalises CIFAR-100 with Tiny-ImageNet's statistics, as the FCCL+ code's
  `datasets/cifar100.py` does (its other public sets match "library").

  Unavailable sources: by default a DataUnavailableError lists every missing
  domain and how to provide it. With `synthetic_fallback=True`, an
  unavailable digit domain or public set is replaced by its synthetic
  counterpart with a logged warning and recorded in `substituted` and
  `sources`; Office domains have no synthetic stand-in and still raise, with
  a one-line message naming the domains, the `sources` field to set and the
  ImageFolder layout expected. Corrupt data (DataError) is never replaced.

  Args:
    name: "digits", "office_caltech", "office31" or "office_home".
    data_dir: directory of the `.npz` bundle (else $FEDJAX_HET_DATA_DIR).
    sources: domain -> source (partial; the rest use the defaults above), or
      one source string for all domains.
    synthetic_fallback: substitute synthetic data for unavailable sources.
    private_sizes: domain -> private training size per client (partial
      overrides of the defaults).
    test_size: cap on each real test set (seeded stratified subsample) and the
      size of synthetic test sets (default: full real test sets, 2000
      synthetic).
    public_name, public_size: the public set, see above.
    seed: seeds the sampling of private data, test caps, public subsets and
      the synthetic generators.
    domains: client domains (default: the scenario's domains, one client
      each); a domain may repeat (disjoint private sets) or be left out.
    homogeneous: see "Private data".
    tfds_data_dir: TFDS data directory for "tfds" sources (default: TFDS's
      own, $TFDS_DATA_DIR or ~/tensorflow_datasets).
    office_test: "held_out" or "whole_domain", see "Splits" (Office
      scenarios; Digits accepts "held_out" only). Recorded in
      `Scenario.office_test`.
    public_normalization: "library" or "fcclplus_code", see "Normalisation".

  Returns:
    Scenario.

  Raises:
    ValueError: unknown scenario, domain or source; sizes larger than the
      available data.
    DataUnavailableError: a requested source is missing (see above).
    DataError: a source is present but invalid.
  """
  if name not in SCENARIOS:
    raise ValueError(f"`name` must be one of {tuple(SCENARIOS)}, got {name!r}.")
  spec = SCENARIOS[name]
  client_domains = tuple(spec.domains if domains is None else domains)
  if not client_domains:
    raise ValueError("`domains` must name at least one client domain.")
  bad = [d for d in client_domains if d not in spec.domains]
  if bad:
    raise ValueError(f"`domains`: {bad} are not domains of {name!r}; allowed: {spec.domains}.")
  if test_size is not None and test_size < 1:
    raise ValueError(f"`test_size` must be >= 1 or None, got {test_size!r}.")
  if public_size < 0:
    raise ValueError(f"`public_size` must be >= 0, got {public_size!r}.")
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}.")
  if office_test not in OFFICE_TESTS:
    raise ValueError(f"`office_test` must be one of {OFFICE_TESTS}, got {office_test!r}.")
  if name == "digits" and office_test != "held_out":
    raise ValueError(f"`office_test`={office_test!r} applies to the Office scenarios only; "
                     "Digits domains keep their own test sets ('held_out').")
  whole_domain_test = office_test == "whole_domain"
  requested = _resolve_sources(name, spec, client_domains, sources)
  sizes = dict(spec.private_sizes)
  for d, n in (private_sizes or {}).items():
    if d not in spec.domains:
      raise ValueError(f"private_sizes: unknown domain {d!r}; allowed: {spec.domains}.")
    if not isinstance(n, (int, np.integer)) or n < 0:
      raise ValueError(f"private_sizes[{d!r}] must be a non-negative integer, got {n!r}.")
    sizes[d] = int(n)

  # How many examples each client takes from each domain.
  unique = tuple(dict.fromkeys(client_domains))
  allocation: list[dict[str, int]] = []
  for d in client_domains:
    if homogeneous:
      share = np.full(len(unique), sizes[d] // len(unique))
      share[:sizes[d] % len(unique)] += 1
      allocation.append(dict(zip(unique, share.tolist())))
    else:
      allocation.append({d: sizes[d]})
  needed = {d: sum(a.get(d, 0) for a in allocation) for d in unique}

  # Open every domain's pool; collect unavailable ones.
  pools: dict[str, _Pool] = {}
  substituted: list[str] = []
  # (what, why, name, requested source) of each synthetic substitution, warned about once.
  substitutions: list[tuple[str, str, str, str]] = []
  failures: list[str] = []
  office_failures: list[tuple[str, str, str]] = []
  synthetic_test = synthetic.DEFAULT_SYNTHETIC_TEST_SIZE if test_size is None else test_size
  for d in unique:
    source = requested[d]
    try:
      if source == "synthetic":
        pools[d] = _SyntheticPool(d, needed[d], synthetic_test, seed, f"synthetic(seed={seed})")
      elif source == "real":
        pools[d] = _real_pool(d, spec, name, data_dir, whole_domain_test)
      elif source == "tfds":
        pools[d] = _TfdsPool(_TFDS_DOMAINS[d], tfds_data_dir)
      else:
        pools[d] = _folder_pool(source[len("folder:"):], spec, name, whole_domain_test)
    except DataUnavailableError as e:
      office_failures.append((d, source, str(e)))
      if synthetic_fallback and d in synthetic.DIGIT_DOMAINS:
        substitutions.append((f"{d} (source {source!r})", str(e).splitlines()[0], d, source))
        pools[d] = _SyntheticPool(d, needed[d], synthetic_test, seed,
                                  f"synthetic(seed={seed}; substituted for {source!r})")
        substituted.append(d)
      else:
        failures.append(f"  - {d!r} (source {source!r}): {e}\n    To provide it: "
                        f"{_how_to(d, source, spec, name)}.")
  if failures and name != "digits":  # Office domains: one line (no synthetic or TFDS option)
    raise DataUnavailableError(_office_unavailable(name, spec, office_failures, pools))
  if failures:
    failed_digits = [d for d in unique if d in synthetic.DIGIT_DOMAINS and d not in pools]
    extra = ("\nOr pass synthetic_fallback=True to substitute the synthetic stand-ins of "
             f"{failed_digits} (logged and recorded in Scenario.substituted)."
             if failed_digits and not synthetic_fallback else "")
    raise DataUnavailableError(f"Scenario {name!r}: data unavailable for "
                               f"{len(failures)} domain(s):\n" + "\n".join(failures) + extra)

  # Class names must agree across domains.
  names = {d: p.class_names for d, p in pools.items() if p.class_names}
  distinct = set(names.values())
  if len(distinct) > 1:
    raise DataError(f"Scenario {name!r}: domains disagree on class names: "
                    + "; ".join(f"{d}: {list(n)[:5]}..." for d, n in names.items()))
  class_names = next(iter(distinct)) if distinct else ()

  # Private data: disjoint draws per domain, consecutive chunks per client.
  rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2024]))
  pieces: list[list[Split]] = [[] for _ in client_domains]
  for d in unique:
    pool = pools[d]
    if needed[d] > pool.train_size:
      raise ValueError(
          f"Scenario {name!r}: domain {d!r} ({pool.provenance}) has {pool.train_size} training "
          f"images, but its clients need {needed[d]} (private_sizes[{d!r}]={sizes[d]}); pass a "
          f"smaller private_sizes={{{d!r}: ...}}.")
    chosen = rng.permutation(pool.train_size)[:needed[d]]
    drawn = pool.train(np.sort(chosen))
    drawn = drawn.take(rng.permutation(len(drawn)))
    start = 0
    for i, alloc in enumerate(allocation):
      n = alloc.get(d, 0)
      if n:
        pieces[i].append(drawn.take(np.arange(start, start + n)))
        start += n
  train = []
  for i, parts in enumerate(pieces):
    if not parts:
      train.append(Split(np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.int32)))
      continue
    merged = Split(np.concatenate([p.images for p in parts]),
                   np.concatenate([p.labels for p in parts]))
    if homogeneous and len(parts) > 1:
      merged = merged.take(rng.permutation(len(merged)))
    train.append(merged)
  test = {d: pools[d].test(test_size, rng) for d in unique}
  sources_used = {d: pools[d].provenance for d in unique}

  # Public set.
  public_rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2025]))
  public_stats_name = public_name
  if public_size == 0:
    public, sources_used["public"] = np.zeros((0, 32, 32, 3), np.uint8), "none"
  else:
    try:
      public, sources_used["public"] = _load_public_images(public_name, data_dir, public_size,
                                                           int(seed), public_rng, tfds_data_dir)
    except DataUnavailableError as e:
      if not synthetic_fallback:
        raise DataUnavailableError(
            f"Scenario {name!r}: public set {public_name!r} unavailable: {e}\nTo provide it: put "
            f"the bundle's public_*.npz files in the data directory (data_dir=... or "
            f"${DATA_DIR_ENV}), or pass public_name='synthetic', or synthetic_fallback=True."
            f"{_download_hint(public_name, 'public')}"
        ) from e
      substitutions.append((f"the public set {public_name!r}", str(e).splitlines()[0],
                            public_name, "public"))
      public = synthetic.synthetic_public(public_size, seed=int(seed), cache=True)
      sources_used["public"] = f"synthetic(seed={seed}; substituted for {public_name!r})"
      substituted.append("public")
      public_stats_name = "synthetic"
  if substitutions:
    logger.warning(_substitution_warning(name, substitutions))
  public_mean, public_std = _public_stats(public_stats_name, public_normalization)
  return Scenario(
      name=name + ("_homogeneous" if homogeneous else ""), num_classes=spec.num_classes,
      domains=client_domains, train=tuple(train), test=test, public=public,
      sources=sources_used, substituted=tuple(substituted),
      private_mean=tuple(augment.IMAGENET_MEAN), private_std=tuple(augment.IMAGENET_STD),
      public_mean=public_mean, public_std=public_std, class_names=class_names,
      office_test="" if name == "digits" else office_test)


# ----------------------------------------------------------------------------
# Whole datasets (for the partitioner-based scenarios: FedMMD, GLFC).
# ----------------------------------------------------------------------------

#: name -> (bundle entry read by the "real" source, or None; number of classes).
_DATASETS = {"mnist": ("digits", 10), "usps": ("digits", 10), "cifar10": ("cifar10", 10),
             "cifar100": ("cifar100_glfc", 100), "svhn": ("digits", 10),
             "fashion_mnist": ("fashion_mnist", 10),
             # GLFC's other streams: as ImageFolders a user provides (`folder:<path>`); the
             # downloaded 64x64 tinyimagenet.npz loads with `npz.load_tinyimagenet`.
             "tiny_imagenet": (None, 200), "imagenet_subset": (None, 100)}
_BUNDLE_LOADERS = {"cifar10": npz.load_cifar10, "cifar100_glfc": npz.load_cifar100_glfc,
                   "fashion_mnist": npz.load_fashion_mnist}


def load_dataset(name: str, *, source: str = "real",
                 data_dir: str | os.PathLike | None = None, image_size: int = 32,
                 fit: str = "stretch") -> tuple[Split, Split, str]:
  """A whole labelled dataset (train, test) for partitioner-based experiments.

  Args:
    name: "mnist", "usps", "cifar10", "cifar100", "svhn", "fashion_mnist",
      "tiny_imagenet" or "imagenet_subset" (the last two from folders only).
    source: "real" (bundle: mnist, usps and svhn from digits.npz,
      cifar10.npz, cifar100_glfc.npz, fmnist.npz; `python -m
      fedjax_het.data.download` writes them), "tfds" (mnist, svhn, cifar10,
      cifar100, fashion_mnist; `data_dir` is then the TFDS data directory) or
      "folder:<path>" (train/ and test/ or val/ ImageFolders).
    data_dir: see `source`.
    image_size: side of a folder source's images (`folder.load_image_folder`;
      default 32); the bundle and TFDS sources keep their stored size.
    fit: how a folder source's images reach the square, "stretch" or
      "center_crop" (`folder.load_image_folder`).

  Returns:
    (train, test, provenance).
  """
  if name not in _DATASETS:
    raise ValueError(f"`name` must be one of {tuple(_DATASETS)}, got {name!r}.")
  entry, _ = _DATASETS[name]
  if source == "real":
    if entry is None:
      where = ("has no 'real' source here (the download command's 64x64 tinyimagenet.npz "
               "loads with fedjax_het.data.npz.load_tinyimagenet)" if name == "tiny_imagenet"
               else "is not in the offline bundle")
      raise DataUnavailableError(f"{name!r} {where}; use source='folder:<path>'.")
    if entry == "digits":
      train, test = npz.load_npz_digits(data_dir, domains=(name,))[name]
    else:
      train, test = _BUNDLE_LOADERS[entry](data_dir)
    return train, test, f"npz:{npz.bundle_path(entry, data_dir)}" + (
        f"[{name}]" if entry == "digits" else "")
  if source == "tfds":
    if name not in TFDS_NAMES:
      raise ValueError(f"{name} is not in TFDS; use "
                       + ("source='real' or " if entry else "") + "source='folder:<path>'.")
    builder = TFDS_NAMES[name]
    return (load_tfds(builder, "train", data_dir=data_dir),
            load_tfds(builder, "test", data_dir=data_dir), f"tfds:{builder}")
  if source.startswith("folder:") and len(source) > 7:
    root = os.path.expanduser(source[7:])
    test_dir = next((os.path.join(root, d) for d in ("test", "val")
                     if os.path.isdir(os.path.join(root, d))), None)
    if test_dir is None or not os.path.isdir(os.path.join(root, "train")):
      raise DataUnavailableError(f"{root}: expected train/ and test/ (or val/) image folders.")
    train, names = load_image_folder(os.path.join(root, "train"), size=image_size, fit=fit)
    test, _ = load_image_folder(test_dir, class_names=names, size=image_size, fit=fit)
    return train, test, f"folder:{root}"
  raise ValueError(f"`source` must be 'real', 'tfds' or 'folder:<path>', got {source!r}.")

"""Scenario builders: sources, explicit fallback, sizes, splits, public set, client stacking."""

import json
import logging

import numpy as np
import pytest

from fedjax_het import data
from tests import real_data
from tests.real_data import real_data_dir

SMALL = {"mnist": 30, "usps": 20, "svhn": 40, "syn": 30}


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
  """Shared tmp cache for generated data; no data directory from the environment."""
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "scenario_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)


@pytest.fixture
def tfds_dir(tmp_path):
  return tmp_path / "tfds"  # an empty TFDS data directory: nothing prepared


REAL_DIR = real_data_dir()  # read before the autouse fixture clears the variable


@pytest.fixture
def real_dir():
  if REAL_DIR is None or not (REAL_DIR / "office31.npz").is_file():
    pytest.skip(real_data.missing("office31.npz"))
  return REAL_DIR


def _fake_bundle(directory, sizes=(("mnist", 40, 30), ("usps", 30, 20)), public=20):
  """A tiny valid bundle: unique random images (every image distinct)."""
  rng = np.random.default_rng(0)
  arrays = {}
  for domain, n_train, n_test in sizes:
    for split, n in (("train", n_train), ("test", n_test)):
      arrays[f"{domain}_{split}_x"] = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
      arrays[f"{domain}_{split}_y"] = np.arange(n) % 10
  directory.mkdir(parents=True, exist_ok=True)
  np.savez(directory / "digits.npz", **arrays)
  np.savez(directory / "public_cifar100_5000.npz",
           x=rng.integers(0, 256, (public, 32, 32, 3), dtype=np.uint8), y=np.arange(public) % 100)
  return directory


def _synthetic_digits(**kwargs):
  args = dict(sources="synthetic", private_sizes=SMALL, test_size=20, public_name="synthetic",
              public_size=16)
  args.update(kwargs)
  return data.build_scenario("digits", **args)


# ----------------------------------------------------------------------------- synthetic


def test_fully_synthetic_digits_scenario():
  s = _synthetic_digits()
  assert s.name == "digits" and s.num_classes == 10
  assert s.domains == ("mnist", "usps", "svhn", "syn")
  assert [len(t) for t in s.train] == [30, 20, 40, 30]
  assert {d: len(t) for d, t in s.test.items()} == {d: 20 for d in s.domains}
  assert s.public.shape == (16, 32, 32, 3) and s.public.dtype == np.uint8
  assert s.sources == {d: "synthetic(seed=0)" for d in (*s.domains, "public")}
  assert s.substituted == ()
  assert s.private_mean == data.IMAGENET_MEAN and s.private_std == data.IMAGENET_STD
  assert s.public_mean == data.CIFAR100_MEAN and s.public_std == data.CIFAR100_STD
  for split in s.train:
    assert split.images.dtype == np.uint8 and split.labels.dtype == np.int32
  json.dumps(s.metadata())


def test_scenario_is_deterministic_for_a_seed():
  a, b = _synthetic_digits(), _synthetic_digits()
  for x, y in zip(a.train, b.train):
    np.testing.assert_array_equal(x.images, y.images)
    np.testing.assert_array_equal(x.labels, y.labels)
  c = _synthetic_digits(seed=1)
  assert not np.array_equal(a.train[2].images, c.train[2].images)


def test_default_synthetic_test_size_and_table_v_sizes():
  s = data.build_scenario("digits", sources="synthetic", public_name="synthetic", public_size=8,
                          private_sizes={"svhn": 50, "syn": 50})
  assert [len(t) for t in s.train] == [150, 80, 50, 50]
  assert len(s.test["mnist"]) == data.DEFAULT_SYNTHETIC_TEST_SIZE


# ----------------------------------------------------------------------------- fallback


def test_missing_sources_raise_with_instructions_by_default(tfds_dir):
  with pytest.raises(data.DataUnavailableError) as info:
    data.build_scenario("digits", tfds_data_dir=tfds_dir)
  message = str(info.value)
  for domain in ("'mnist'", "'usps'", "'svhn'", "'syn'"):
    assert domain in message
  assert data.DATA_DIR_ENV in message
  assert "synthetic_fallback=True" in message
  assert "folder:" in message and "array_record" in message


def test_opt_in_fallback_substitutes_logs_and_records(tfds_dir, caplog):
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    s = data.build_scenario("digits", synthetic_fallback=True, private_sizes=SMALL,
                            test_size=20, public_size=16, tfds_data_dir=tfds_dir)
  assert s.substituted == ("mnist", "usps", "svhn", "syn", "public")
  assert s.sources["mnist"] == "synthetic(seed=0; substituted for 'real')"
  assert s.sources["svhn"] == "synthetic(seed=0; substituted for 'tfds')"
  assert s.sources["public"] == "synthetic(seed=0; substituted for 'cifar100')"
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "SYNTHETIC SUBSTITUTION" in r.getMessage()]
  # One warning for the five substitutions, each named with its source, each reason once,
  # and one download command (SYN's, which needs its archive, beside it).
  assert len(warnings) == 1
  (warning,) = warnings
  assert warning.startswith("SYNTHETIC SUBSTITUTION in scenario 'digits': mnist (source 'real'), "
                            "usps (source 'real'), svhn (source 'tfds'), syn (source 'real'), "
                            "the public set 'cifar100' are unavailable")
  assert warning.count("digits.npz: file not found.") == 1
  assert warning.endswith("Real data: python -m fedjax_het.data.download --data_dir <dir> mnist "
                          "usps svhn cifar100; python -m fedjax_het.data.download --data_dir <dir> "
                          "syn --from <SYN archive> and set scenario.sources.svhn=real "
                          "(docs/data.md).")
  # Same data as asking for the synthetic domains directly.
  direct = _synthetic_digits()
  np.testing.assert_array_equal(s.train[2].images, direct.train[2].images)


def test_partial_real_data_only_substitutes_missing_domains(tmp_path, tfds_dir):
  bundle = _fake_bundle(tmp_path / "bundle")
  s = data.build_scenario("digits", data_dir=bundle, synthetic_fallback=True,
                          private_sizes=SMALL, test_size=10, public_size=10,
                          tfds_data_dir=tfds_dir)
  assert s.substituted == ("svhn", "syn")
  assert s.sources["mnist"] == f"npz:{bundle / 'digits.npz'}[mnist]"
  assert s.sources["public"] == f"npz:{bundle / 'public_cifar100_5000.npz'}"


def test_corrupt_data_is_never_replaced(tmp_path):
  bundle = tmp_path / "bundle"
  bundle.mkdir()
  np.savez(bundle / "digits.npz", mnist_train_x=np.zeros((4, 32, 32, 3), np.float32),
           mnist_train_y=np.zeros(4, int), mnist_test_x=np.zeros((4, 32, 32, 3), np.uint8),
           mnist_test_y=np.zeros(4, int))
  with pytest.raises(data.DataError, match="dtype uint8") as info:
    data.build_scenario("digits", data_dir=bundle, synthetic_fallback=True,
                        sources={"usps": "synthetic", "svhn": "synthetic", "syn": "synthetic"})
  assert not isinstance(info.value, data.DataUnavailableError)


def test_office_domains_have_no_synthetic_fallback():
  with pytest.raises(data.DataUnavailableError, match="'amazon'"):
    data.build_scenario("office31", synthetic_fallback=True, public_name="synthetic",
                        public_size=4)


def test_missing_public_set_explains_options():
  with pytest.raises(data.DataUnavailableError,
                     match=r"public_name='synthetic'.* Real data: python -m fedjax_het\.data\."
                           r"download --data_dir <dir> tinyimagenet \(docs/data\.md\)\.$"):
    data.build_scenario("digits", sources="synthetic", private_sizes=SMALL, test_size=5,
                        public_name="tinyimagenet", public_size=4)


@pytest.mark.parametrize("public_name, command", [
    ("fmnist", "fmnist (docs/data.md)."),
    ("tfds:fashion_mnist", "fmnist and set scenario.public_name=fmnist (docs/data.md)."),
    ("folder:/nonexistent/public", "cifar100 (or fmnist, tinyimagenet) and set "
                                   "scenario.public_name to that name (docs/data.md)."),
])
def test_public_fallback_warning_names_the_download_command(tfds_dir, caplog, public_name,
                                                            command):
  with caplog.at_level(logging.WARNING, logger="fedjax_het.data"):
    s = data.build_scenario("digits", sources="synthetic", private_sizes=SMALL, test_size=5,
                            public_name=public_name, public_size=4, synthetic_fallback=True,
                            tfds_data_dir=tfds_dir)
  assert s.substituted == ("public",)
  assert f"Real data: python -m fedjax_het.data.download --data_dir <dir> {command}" in caplog.text


def test_invalid_configuration_errors(tmp_path):
  with pytest.raises(ValueError, match="`name` must be one of"):
    data.build_scenario("pacs")
  with pytest.raises(ValueError, match=r"sources\['usps'\] = 'tfds' is not a valid source"):
    data.build_scenario("digits", sources={"usps": "tfds"})
  with pytest.raises(ValueError, match=r"sources\['amazon'\] = 'synthetic'"):
    data.build_scenario("office31", sources={"amazon": "synthetic"})
  with pytest.raises(ValueError, match="unknown domains"):
    data.build_scenario("digits", sources={"mnistm": "real"})
  with pytest.raises(ValueError, match="`public_name` must be one of"):
    _synthetic_digits(public_name="imagenet")
  bundle = _fake_bundle(tmp_path / "bundle")
  with pytest.raises(ValueError, match=r"'mnist' .* has 40 training images, but its clients "
                                       r"need 60"):
    data.build_scenario("digits", data_dir=bundle, domains=("mnist",),
                        private_sizes={"mnist": 60}, public_size=0)


# ----------------------------------------------------------------------------- sampling


def test_clients_sharing_a_domain_are_disjoint_and_test_cap_is_stratified(tmp_path):
  bundle = _fake_bundle(tmp_path / "bundle")
  s = data.build_scenario("digits", data_dir=bundle, domains=("mnist", "mnist", "usps"),
                          private_sizes={"mnist": 20, "usps": 10}, test_size=10, public_size=0)
  a, b = ({im.tobytes() for im in t.images} for t in s.train[:2])
  assert len(a) == len(b) == 20 and not a & b
  assert np.all(np.bincount(s.test["mnist"].labels, minlength=10) == 1)
  assert s.public.shape == (0, 32, 32, 3) and s.sources["public"] == "none"


def test_homogeneous_variant_mixes_domains(tmp_path):
  bundle = _fake_bundle(tmp_path / "bundle")
  digits = data.load_npz_digits(bundle)
  usps_images = {im.tobytes() for im in digits["usps"][0].images}
  s = data.build_scenario("digits", data_dir=bundle, domains=("mnist", "usps"),
                          private_sizes={"mnist": 20, "usps": 10}, public_size=0,
                          homogeneous=True)
  assert s.name == "digits_homogeneous" and [len(t) for t in s.train] == [20, 10]
  from_usps = [sum(im.tobytes() in usps_images for im in t.images) for t in s.train]
  assert from_usps == [10, 5]  # each client: half from each domain


def test_real_office31_scenario(real_dir):
  s = data.build_scenario("office31", data_dir=real_dir, public_size=100)
  assert [len(t) for t in s.train] == [1082, 192, 305]
  assert {d: len(t) for d, t in s.test.items()} == {"amazon": 562, "dslr": 98, "webcam": 158}
  assert s.num_classes == 31 and len(s.class_names) == 31
  assert s.sources["dslr"].endswith("office31.npz[dslr]") and s.substituted == ()
  assert s.public.shape == (100, 32, 32, 3)


def test_real_digits_with_explicit_synthetic_svhn_syn(real_dir):
  s = data.build_scenario("digits", data_dir=real_dir,
                          sources={"svhn": "synthetic", "syn": "synthetic"},
                          private_sizes={"svhn": 40, "syn": 40}, test_size=200, public_size=50)
  assert [len(t) for t in s.train] == [150, 80, 40, 40]
  assert s.sources["mnist"].endswith("digits.npz[mnist]") and s.substituted == ()
  assert np.all(np.bincount(s.test["usps"].labels) >= 14)  # stratified cap of 200


def test_office_caltech_without_caltech_needs_folder_or_domains(real_dir):
  with pytest.raises(data.DataUnavailableError, match="'caltech'.*folder:"):
    data.build_scenario("office_caltech", data_dir=real_dir, public_size=0)
  s = data.build_scenario("office_caltech", data_dir=real_dir, public_size=0,
                          domains=("amazon", "dslr", "webcam"))
  assert [len(t) for t in s.train] == [368, 60, 113]


# ----------------------------------------------------------------------------- TFDS and folders


def test_tfds_source_in_scenario_with_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow_datasets not installed")
  with tfds.testing.mock_data(num_examples=30):
    s = data.build_scenario("digits", sources={"mnist": "synthetic", "usps": "synthetic",
                                               "svhn": "tfds", "syn": "synthetic"},
                            private_sizes={**SMALL, "svhn": 25}, test_size=12,
                            public_name="synthetic", public_size=4)
  assert s.sources["svhn"] == "tfds:svhn_cropped"
  assert len(s.train[2]) == 25 and len(s.test["svhn"]) == 12
  assert s.train[2].images.shape[1:] == (32, 32, 3)


def test_folder_source_with_train_and_test_folders(tmp_path):
  image_module = pytest.importorskip("PIL.Image")
  rng = np.random.default_rng(0)
  root = tmp_path / "SYN"
  for split, per_class in (("train", 3), ("val", 2)):
    for c in range(10):
      (root / split / str(c)).mkdir(parents=True)
      for i in range(per_class):
        image_module.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(
            root / split / str(c) / f"{i}.png")
  s = data.build_scenario("digits", sources={"mnist": "synthetic", "usps": "synthetic",
                                             "svhn": "synthetic", "syn": f"folder:{root}"},
                          private_sizes={**SMALL, "syn": 25}, test_size=10,
                          public_name="synthetic", public_size=4)
  assert s.sources["syn"] == f"folder:{root}"
  assert len(s.train[3]) == 25
  # The test set comes from val/ (20 images), capped by test_size=10, stratified.
  assert np.all(np.bincount(s.test["syn"].labels, minlength=10) == 1)
  uncapped = data.build_scenario("digits", sources={"syn": f"folder:{root}"}, domains=("syn",),
                                 private_sizes={"syn": 30}, public_size=0)
  assert len(uncapped.test["syn"]) == 20 and len(uncapped.train[0]) == 30


# ----------------------------------------------------------------------------- stacking


def test_stack_clients_pads_with_mask():
  rng = np.random.default_rng(0)
  splits = [data.Split(rng.integers(1, 256, (n, 32, 32, 3), dtype=np.uint8),
                       rng.integers(1, 10, n)) for n in (3, 5, 1)]
  stacked = data.stack_clients(splits)
  assert stacked.images.shape == (3, 5, 32, 32, 3) and stacked.labels.shape == (3, 5)
  np.testing.assert_array_equal(stacked.sizes, [3, 5, 1])
  np.testing.assert_array_equal(stacked.mask.sum(1), [3, 5, 1])
  np.testing.assert_array_equal(stacked.images[0, :3], splits[0].images)
  assert not stacked.images[0, 3:].any() and not stacked.labels[2, 1:].any()
  assert stacked.mask.dtype == bool and stacked.labels.dtype == np.int32
  assert data.stack_clients(splits, pad_to=8).images.shape == (3, 8, 32, 32, 3)
  with pytest.raises(ValueError, match="`pad_to` must be >= the largest client"):
    data.stack_clients(splits, pad_to=4)
  with pytest.raises(ValueError, match="at least one client"):
    data.stack_clients([])


def test_load_dataset_whole_sets(tmp_path, real_dir):
  train, test, provenance = data.load_dataset("cifar10", data_dir=real_dir)
  assert (len(train), len(test)) == (10000, 10000) and provenance.endswith("cifar10.npz")
  train, _, provenance = data.load_dataset("mnist", data_dir=real_dir)
  assert len(train) == 10000 and provenance.endswith("digits.npz[mnist]")
  with pytest.raises(ValueError, match="usps is not in TFDS"):
    data.load_dataset("usps", source="tfds")
  with pytest.raises(ValueError, match="`name` must be one of"):
    data.load_dataset("imagenet")


def test_load_dataset_reads_downloaded_svhn_and_fashion_mnist(tmp_path):
  bundle = _fake_bundle(tmp_path / "bundle")  # digits.npz with mnist and usps only
  with pytest.raises(data.DataUnavailableError,
                     match=r"has no 'svhn' domain .* python -m fedjax_het\.data\.download "
                           r"--data_dir \S+ svhn \(docs/data\.md\)"):
    data.load_dataset("svhn", data_dir=bundle)
  with pytest.raises(data.DataUnavailableError,
                     match=r"fmnist\.npz: file not found.*download --data_dir \S+ fmnist"):
    data.load_dataset("fashion_mnist", data_dir=bundle)
  _fake_bundle(bundle, sizes=(("mnist", 40, 30), ("usps", 30, 20), ("svhn", 50, 20)))
  rng = np.random.default_rng(1)
  fashion = {f"{split}_{k}": v for split, n in (("train", 30), ("test", 10)) for k, v in (
      ("x", rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)), ("y", np.arange(n) % 10))}
  np.savez(bundle / "fmnist.npz", **fashion)
  with np.load(bundle / "digits.npz") as digits:
    svhn_train_x, svhn_test_y = digits["svhn_train_x"], digits["svhn_test_y"]
  train, test, provenance = data.load_dataset("svhn", data_dir=bundle)
  assert provenance == f"npz:{bundle / 'digits.npz'}[svhn]"
  np.testing.assert_array_equal(train.images, svhn_train_x)
  np.testing.assert_array_equal(test.labels, svhn_test_y)
  train, test, provenance = data.load_dataset("fashion_mnist", data_dir=bundle)
  assert provenance == f"npz:{bundle / 'fmnist.npz'}"
  np.testing.assert_array_equal(train.images, fashion["train_x"])
  np.testing.assert_array_equal(test.labels, fashion["test_y"])
  with pytest.raises(data.DataUnavailableError, match=r"'tiny_imagenet' has no 'real' source "
                                                      r"here .*load_tinyimagenet"):
    data.load_dataset("tiny_imagenet", data_dir=bundle)
  with pytest.raises(data.DataUnavailableError, match="'imagenet_subset' is not in the offline "
                                                      "bundle; use source='folder:<path>'"):
    data.load_dataset("imagenet_subset", data_dir=bundle)

"""Office-Home end to end without its images: an archive laid out as the official
OfficeHomeDataset_10072016.zip (made-up pixels) goes through the download command into a
bundle, and `experiments/reproduce.py` trains FCCL Table 3's FCCL row from that bundle and
writes the table. The real images are not redistributable; this checks every step a user
with the archive takes, on 65 classes and the four domains' folder names."""

import json
import pathlib
import zipfile

import numpy as np
import pytest

from fedjax_het import data
from fedjax_het import experiment as experiment_lib
from fedjax_het.config import load_module
from fedjax_het.data import download as dl
from fedjax_het.data import npz

pytest.importorskip("PIL.Image", reason="Pillow not installed (the download command reads images)")
from tests.test_download import _png  # noqa: E402  (PNG bytes of an image)

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The archive's domain folders ("Real World" has a space) and 65 class folders.
FOLDERS = ("Art", "Clipart", "Product", "Real World")
CLASSES = tuple(f"Class_{c:02d}" for c in range(65))
PER_CLASS = {"Art": 2, "Clipart": 3, "Product": 2, "Real World": 3}
#: The private images each participant draws in the tests' runs.
PRIVATE_SIZES = {"art": 40, "clipart": 60, "product": 40, "real_world": 60}


def _archive(path: pathlib.Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """OfficeHomeDataset_10072016/<Domain>/<Class>/<nnnnn>.jpg in a zip, PNG-encoded pixels
  (lossless, so the bundle can be checked bit for bit); returns {bundle domain: (images
  (N, 32, 32, 3), labels)} in the archive's order (classes sorted, then files)."""
  rng = np.random.default_rng(0)
  domains = {}
  with zipfile.ZipFile(path, "w") as archive:
    for folder in FOLDERS:
      rows, labels = [], []
      for label, name in enumerate(CLASSES):
        for j in range(PER_CLASS[folder]):
          pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
          archive.writestr(f"OfficeHomeDataset_10072016/{folder}/{name}/{j + 1:05d}.jpg",
                           _png(pixels))
          rows.append(pixels)
          labels.append(label)
      domains[folder.lower().replace(" ", "_")] = (np.stack(rows), np.asarray(labels))
  return domains


def _public_set(bundle: pathlib.Path) -> None:
  """A made-up public_cifar100_5000.npz (the FCCL public set)."""
  rng = np.random.default_rng(1)
  np.savez(bundle / "public_cifar100_5000.npz",
           x=rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8),
           y=np.arange(200, dtype=np.int64) % 100)


@pytest.fixture(scope="module")
def office_home(tmp_path_factory):
  """(the archive's expected {domain: (images, labels)}, the bundle the download command
  wrote from the archive, with a made-up public set beside it)."""
  root = tmp_path_factory.mktemp("office_home")
  archive = root / "OfficeHomeDataset_10072016.zip"
  expected = _archive(archive)
  bundle = root / "bundle"
  dl.download("office_home", bundle, from_path=archive)
  _public_set(bundle)
  return expected, bundle


def test_the_archive_becomes_the_bundle_and_the_fccl_table3_scenario(office_home, monkeypatch,
                                                                     tmp_path_factory):
  expected, bundle = office_home
  domains, classes = npz.load_office_domains("office_home", bundle)
  assert classes == CLASSES
  assert set(domains) == set(expected) == {"art", "clipart", "product", "real_world"}
  for domain, (pixels, labels) in expected.items():
    np.testing.assert_array_equal(domains[domain].images, pixels)
    np.testing.assert_array_equal(domains[domain].labels, labels)

  # FCCL Table 3's scenario (office.py:home_fccl_homogeneous_quick) reads every domain of it.
  monkeypatch.setenv(data.DATA_DIR_ENV, str(bundle))
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "home_cache"))
  office = load_module(REPO / "fedjax_het" / "configs" / "office.py")
  config = office.get_config("home_fccl_homogeneous_quick")
  config.scenario.public_size = 32
  config.scenario.private_sizes.update(PRIVATE_SIZES)
  scenario = experiment_lib.build_scenario(config)
  assert scenario.domains == ("art", "clipart", "product", "real_world")
  assert scenario.substituted == () and scenario.class_names == CLASSES
  assert [len(split.labels) for split in scenario.train] == list(PRIVATE_SIZES.values())
  assert scenario.public.shape == (32, 32, 32, 3)
  for domain, split in scenario.test.items():  # held out: index i % 10 > 7 of the domain
    assert 0 < len(split.labels) < len(expected[domain][1])


@pytest.mark.slow  # about a minute on 2 cores: four width-1/16 ResNet-18 compile, train a round
def test_the_runner_trains_fccl_table3_from_the_archive(office_home, monkeypatch, capsys,
                                                        tmp_path, tmp_path_factory):
  _, bundle = office_home
  monkeypatch.setenv(data.DATA_DIR_ENV, str(bundle))
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "home_cache"))
  reproduce = load_module(REPO / "experiments" / "reproduce.py")
  results = tmp_path / "results"
  tiny = ("num_rounds=1", "local.epochs=1", "local.batch_size=16", "models.width=0.0625",
          "scenario.public_size=32", "scenario.test_size=0", "fccl.pretrain_epochs=1",
          "logging.progress=False", "logging.plots=False", "logging.diagnostic_rounds=()",
          "compilation_cache_dir=", f"scenario.private_sizes={PRIVATE_SIZES!r}")
  argv = ["--table=fccl_table3", "--methods=fccl", "--seeds=0", f"--results-dir={results}"]
  assert reproduce.main(argv + [a for o in tiny for a in ("--set", o)]) == 0
  assert "fccl_table3/quick/fccl__seed0: trained" in capsys.readouterr().out

  cell = results / "fccl_table3" / "quick" / "fccl__seed0"
  run = json.loads((cell / "run.json").read_text())["config"]
  assert run["models.architectures"] == ["resnet18"] * 4
  assert run["fccl.average_placement"] == "between_phases"
  metadata = json.loads((cell / "metadata.json").read_text())
  assert metadata["substituted_by_synthetic"] == []
  numbers = json.loads((cell / "results.json").read_text())
  for kind in ("inter", "intra"):
    assert set(numbers[kind]) == {"art", "clipart", "product", "real_world", "AVG"}
    assert all(0.0 <= v <= 100.0 for v in numbers[kind].values())
  table = (results / "fccl_table3" / "quick" / "table.md").read_text()
  assert "| FCCL |" in table and "real_world" in table

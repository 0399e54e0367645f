"""Office configs (fedjax_het/configs/office.py): variants, paper settings, test protocol, errors."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fedjax_het import data
from fedjax_het import experiment as experiment_lib
from fedjax_het.config import validate_config
from fedjax_het.errors import ConfigError, UserError
from tests import real_data
from tests.real_data import real_data_dir

REPO = pathlib.Path(__file__).resolve().parents[1]
REAL_DIR = real_data_dir()  # read before the autouse fixture clears the variable


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


office = _load(REPO / "fedjax_het" / "configs" / "office.py", "office_config")
digits = _load(REPO / "fedjax_het" / "configs" / "digits.py", "digits_config_for_office")
from tests.test_train import cli  # noqa: E402  (experiments/train.py defines absl flags: load once)

#: Office-Caltech classes of the bundle (alphabetical).
CALTECH_CLASSES = ("back_pack", "bike", "calculator", "headphones", "keyboard",
                   "laptop_computer", "monitor", "mouse", "mug", "projector")


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "office_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)


def _fake_office_bundle(directory, entry="office31", domains=(("amazon", 60), ("dslr", 40),
                                                               ("webcam", 50)), num_classes=31):
  """A tiny Office-style bundle file: every image distinct, labels cycling over the classes."""
  rng = np.random.default_rng(0)
  arrays = {}
  for domain, n in domains:
    arrays[f"{domain}_x"] = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    arrays[f"{domain}_y"] = np.arange(n) % num_classes
  if entry == "office_caltech":
    arrays["classes"] = np.asarray(CALTECH_CLASSES)
  directory.mkdir(parents=True, exist_ok=True)
  np.savez(directory / data.BUNDLE[entry].filename, **arrays)
  return directory


def _tiny(arg, data_dir, **fields):
  """An office config reading `data_dir`, with small private sets and no public set."""
  c = office.get_config(arg)
  c.scenario.data_dir = str(data_dir)
  c.scenario.public_size = 0
  c.scenario.test_size = 0
  c.update_from_flattened_dict(fields)
  return c


def _rows(split):
  return {image.tobytes() for image in split.images}


# ----------------------------------------------------------------------------- configs


def test_every_office_variant_builds_and_validates():
  assert office.METHODS == digits.METHODS  # the same methods as the Digits configs
  for prefix in office.SCENARIOS:
    for method in office.METHODS:
      for suffix in ("", "_homogeneous", "_quick", "_homogeneous_quick"):
        config = office.get_config(f"{prefix}_{method}{suffix}")
        validate_config(config)
        assert config.name == f"office_{prefix}_{method}{suffix}"
        assert not config.scenario.synthetic_fallback
        assert config.scenario.office_test == "held_out"
  for bad in ("digits_fcclplus", "office31", "office31_fedgkt", "home_fcclplus_fast"):
    with pytest.raises(ValueError, match="expected <scenario>_<method>"):
      office.get_config(bad)


def test_paper_backbones_top_k_and_temperature_per_scenario():
  expected = {  # FCCL+ Table VI, the top-k of Sec. 4.1, FNTD tau
      "office31": (("resnet10", "resnet12", "resnet10"), 5, 3.0),
      "caltech": (("googlenet", "resnet12", "resnet10", "resnet12"), 1, 1.0),
      "home": (("resnet18", "resnet34", "googlenet", "resnet12"), 5, 1.0),
  }
  for prefix, (archs, top_k, tau) in expected.items():
    c = office.get_config(f"{prefix}_fcclplus")
    assert c.scenario.name == office.SCENARIOS[prefix]
    assert tuple(c.models.architectures) == archs
    assert set(c.scenario.sources) == set(data.SCENARIOS[c.scenario.name].domains)
    assert (c.eval.top_k, c.fcclplus.fntd_temperature) == (top_k, tau)
    assert (c.num_rounds, c.local.epochs, c.local.batch_size, c.collaborative.batch_size,
            c.scenario.public_size, c.scenario.test_size, c.models.width) == (
                40, 20, 256, 512, 5000, 0, 1.0)  # the paper's settings, full test sets
    assert dict(c.scenario.private_sizes) == {}  # -> Table V (the data layer's defaults)
    quick = office.get_config(f"{prefix}_fcclplus_quick")
    assert (quick.models.width, quick.num_rounds, quick.local.epochs,
            quick.scenario.test_size) == (0.125, 5, 5, 300)
    assert quick.eval.top_k == top_k and tuple(quick.models.architectures) == archs
    for method in ("fedavg", "fcclplus_homogeneous"):
      assert tuple(office.get_config(f"{prefix}_{method}").models.architectures) == (
          ("resnet12",) * len(archs))
  sizes = {name: data.SCENARIOS[name].private_sizes
           for name in ("office31", "office_caltech", "office_home")}
  assert sizes == {"office31": {"amazon": 1082, "dslr": 192, "webcam": 305},
                   "office_caltech": {"amazon": 368, "caltech": 431, "dslr": 60, "webcam": 113},
                   "office_home": {"art": 1400, "clipart": 2000, "product": 2500,
                                   "real_world": 2000}}  # FCCL+ Table V
  assert office.get_config("office31_fedavg").fedavg.weighting == "uniform"
  assert office.get_config("caltech_fcclplus_homogeneous").fcclplus.average_parameters
  assert office.get_config("home_solo").num_rounds == 50


def test_cli_maps_office_names_to_the_config_file():
  argv = cli.expand_config_name(["train.py", "--config=office_office31_fcclplus_quick"])
  assert argv[1] == f"--config={REPO / 'fedjax_het/configs/office.py'}:office31_fcclplus_quick"


def test_office_test_field_is_validated():
  config = office.get_config("office31_fcclplus_quick")
  config.scenario.office_test = "authors"
  with pytest.raises(ConfigError, match=r"config.scenario.office_test must be one of "
                     r"\('held_out', 'whole_domain'\), got 'authors'"):
    validate_config(config)
  config.scenario.office_test = "whole_domain"
  validate_config(config)
  config.scenario.name = "digits"
  with pytest.raises(ConfigError, match="config.scenario.office_test must be 'held_out' unless"):
    validate_config(config)
  with pytest.raises(ValueError, match="`office_test` must be one of"):
    data.build_scenario("office31", office_test="train")


# ----------------------------------------------------------------------------- test protocol


def test_whole_domain_test_sets_hold_the_training_images_and_held_out_ones_do_not(tmp_path):
  bundle = _fake_office_bundle(tmp_path / "bundle")
  full, _ = data.load_office_domains("office31", bundle)
  by_protocol = {}
  for protocol in data.OFFICE_TESTS:
    config = _tiny("office31_fcclplus_quick", bundle, **{"scenario.office_test": protocol})
    config.scenario.private_sizes.update({"amazon": 20, "dslr": 12, "webcam": 16})
    validate_config(config)
    scenario = experiment_lib.build_scenario(config)  # the trainer's path from the config
    assert scenario.office_test == protocol and scenario.metadata()["office_test"] == protocol
    by_protocol[protocol] = scenario
  for i, domain in enumerate(("amazon", "dslr", "webcam")):
    domain_rows = _rows(full[domain])
    train_pool, held_out = data.index_split(full[domain])
    for protocol, scenario in by_protocol.items():
      private, test = _rows(scenario.train[i]), _rows(scenario.test[domain])
      assert private <= _rows(train_pool)  # private data: the i % 10 <= 7 images, both ways
      if protocol == "held_out":
        assert test == _rows(held_out) and not private & test
      else:
        assert test == domain_rows and private <= test
        assert len(scenario.test[domain]) == len(full[domain])
    # The private draw does not depend on the protocol.
    np.testing.assert_array_equal(by_protocol["held_out"].train[i].images,
                                  by_protocol["whole_domain"].train[i].images)


def test_whole_domain_protocol_with_an_image_folder(tmp_path):
  image_module = pytest.importorskip("PIL.Image", reason="Pillow not installed")
  bundle = _fake_office_bundle(tmp_path / "bundle", "office_caltech",
                               (("amazon", 40), ("dslr", 30), ("webcam", 30)), num_classes=10)
  rng = np.random.default_rng(1)
  root = tmp_path / "caltech"
  for name in CALTECH_CLASSES:
    (root / name).mkdir(parents=True)
    for j in range(3):
      image_module.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(
          root / name / f"{j}.jpg")
  tests = {}
  for protocol in data.OFFICE_TESTS:
    config = _tiny("caltech_fcclplus_quick", bundle, **{
        "scenario.office_test": protocol, "scenario.sources.caltech": f"folder:{root}"})
    config.scenario.private_sizes.update({"amazon": 10, "caltech": 12, "dslr": 8,
                                          "webcam": 8})
    scenario = experiment_lib.build_scenario(config)
    assert scenario.sources["caltech"] == f"folder:{root}"
    assert scenario.class_names == CALTECH_CLASSES
    tests[protocol] = scenario
  assert len(tests["held_out"].test["caltech"]) == 6  # 30 images, i % 10 >= 8
  assert len(tests["whole_domain"].test["caltech"]) == 30
  assert _rows(tests["whole_domain"].train[1]) <= _rows(tests["whole_domain"].test["caltech"])
  assert not _rows(tests["held_out"].train[1]) & _rows(tests["held_out"].test["caltech"])


def test_results_header_names_the_protocol_and_top_k():
  assert experiment_lib._office_test_line("", 1) == ""  # not an Office scenario
  line = experiment_lib._office_test_line("whole_domain", 5)
  assert "scenario.office_test='whole_domain'" in line and "top-5 accuracy" in line
  assert "training images included" in line
  assert "held-out images" in experiment_lib._office_test_line("held_out", 1)


# ----------------------------------------------------------------------------- missing data


def test_missing_caltech_folder_stops_with_one_line_naming_field_and_layout(tmp_path):
  bundle = _fake_office_bundle(tmp_path / "bundle", "office_caltech",
                               (("amazon", 40), ("dslr", 30), ("webcam", 30)), num_classes=10)
  config = _tiny("caltech_fcclplus_quick", bundle)
  with pytest.raises(data.DataUnavailableError) as info:
    experiment_lib.build_scenario(config)
  message = str(info.value)
  assert isinstance(info.value, UserError) and "\n" not in message
  for part in ("'caltech'", "--config.scenario.sources.caltech=folder:<path>",
               "<path>/<class name>/*.jpg", "<path>/train/<class name>/*.jpg",
               "i % 10 <= 7", "back_pack, bike", "office_caltech10.npz",
               "--config.scenario.domains=\"('amazon', 'dslr', 'webcam')\""):
    assert part in message, part
  assert "'amazon'" not in message.split("(source")[0]  # only the missing domain is named

  # A folder that does not exist is named too.
  config = _tiny("caltech_fcclplus_quick", bundle,
                 **{"scenario.sources.caltech": f"folder:{tmp_path / 'nowhere'}"})
  with pytest.raises(data.DataUnavailableError, match=r"'caltech' \(source 'folder:.*nowhere"):
    experiment_lib.build_scenario(config)


def test_missing_office_home_names_every_domain_in_one_line(tmp_path):
  config = _tiny("home_fcclplus_quick", tmp_path)  # an empty data directory
  with pytest.raises(data.DataUnavailableError) as info:
    experiment_lib.build_scenario(config)
  message = str(info.value)
  assert "\n" not in message
  assert "domains 'art', 'clipart', 'product', 'real_world'" in message
  assert "scenario.sources.<domain>" in message and "65 class folders" in message


def test_cli_prints_the_missing_domain_as_one_line(tmp_path):
  bundle = _fake_office_bundle(tmp_path / "bundle", "office_caltech",
                               (("amazon", 40), ("dslr", 30), ("webcam", 30)), num_classes=10)
  env = {**os.environ, data.DATA_DIR_ENV: str(bundle), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
      [sys.executable, "experiments/train.py", "--config=office_caltech_fcclplus_quick",
       f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 1
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "scenario.sources.caltech" in errors[0]
  assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- real bundle


@pytest.fixture
def real_dir():
  if REAL_DIR is None or not (REAL_DIR / "office31.npz").is_file():
    pytest.skip(real_data.missing("office31.npz"))
  return REAL_DIR


def test_real_office31_whole_domain_test_sets(real_dir):
  config = _tiny("office31_fcclplus", real_dir, **{"scenario.office_test": "whole_domain"})
  scenario = experiment_lib.build_scenario(config)
  assert [len(t) for t in scenario.train] == [1082, 192, 305]  # Table V
  assert {d: len(t) for d, t in scenario.test.items()} == {
      "amazon": 2817, "dslr": 498, "webcam": 795}  # every image of each domain
  held_out = experiment_lib.build_scenario(_tiny("office31_fcclplus", real_dir))
  assert {d: len(t) for d, t in held_out.test.items()} == {
      "amazon": 562, "dslr": 98, "webcam": 158}


@pytest.mark.slow
def test_office31_quick_trains_one_round_on_the_real_bundle(real_dir, tmp_path):
  env = {**os.environ, data.DATA_DIR_ENV: str(real_dir)}
  result = subprocess.run(
      [sys.executable, "experiments/train.py", "--config=office_office31_fcclplus_quick",
       "--config.num_rounds=1", "--config.logging.diagnostic_rounds=(1,)",
       f"--workdir={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=3600)
  assert result.returncode == 0, result.stderr[-3000:]
  results = (tmp_path / "results.md").read_text()
  assert "scenario.office_test='held_out'" in results and "top-5 accuracy" in results
  assert "| amazon | dslr | webcam | AVG |" in results
  metadata = json.loads((tmp_path / "metadata.json").read_text())
  assert metadata["office_test"] == "held_out" and metadata["substituted_by_synthetic"] == []
  assert [p["architecture"] for p in metadata["participants"]] == [
      "resnet10", "resnet12", "resnet10"]
  numbers = json.loads((tmp_path / "results.json").read_text())
  assert 0.0 <= numbers["intra"]["AVG"] <= 100.0

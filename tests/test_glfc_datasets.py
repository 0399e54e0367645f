"""GLFC Tables 2 and 3: Tiny-ImageNet at 64x64, ImageNet-Subset from image folders, their configs.

The real loaders are tested on small files written here (no Tiny-ImageNet or ImageNet on this
machine): a 4-class 64x64 `tinyimagenet.npz` with the download command's keys, and an image
folder of PNGs.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import load_module, validate_config
from fedjax_het.data import incremental
from fedjax_het.errors import ConfigError
from fedjax_het.reports import paper_numbers, tables
from fedjax_het.train import train_and_evaluate

CONFIGS = pathlib.Path(__file__).parents[1] / "fedjax_het/configs"


def _write_tinyimagenet(directory: pathlib.Path, classes: int = 4, train: int = 6,
                        val: int = 2) -> None:
  """A `tinyimagenet.npz` as `download._convert_tinyimagenet` writes it, 4 of 200 classes used."""
  rng = np.random.default_rng(0)
  wnids = np.array([f"n{i:08d}" for i in range(200)])
  np.savez(directory / "tinyimagenet.npz",
           train_x=rng.integers(0, 256, (classes * train, 64, 64, 3), dtype=np.uint8),
           train_y=np.repeat(np.arange(classes), train).astype(np.int64),
           val_x=rng.integers(0, 256, (classes * val, 64, 64, 3), dtype=np.uint8),
           val_y=np.repeat(np.arange(classes), val).astype(np.int64), wnids=wnids)


def test_tinyimagenet_bundle_gives_64px_tasks(tmp_path):
  _write_tinyimagenet(tmp_path)
  stream = incremental.build_class_incremental_stream(
      "tiny_imagenet", num_tasks=2, num_classes=4, initial_clients=2, new_clients_per_task=1,
      data_dir=tmp_path, seed=0)
  assert stream.images.shape == (24, 64, 64, 3) and stream.test_images.shape == (8, 64, 64, 3)
  assert (stream.num_tasks, stream.classes_per_task, stream.num_classes) == (2, 2, 4)
  assert stream.sources["tiny_imagenet"] == f"npz:{tmp_path / 'tinyimagenet.npz'}"
  assert not stream.substituted
  assert sorted(stream.class_names) == [f"n{i:08d}" for i in range(4)]  # the wnids
  # Task t's classes are t*k .. (t+1)*k - 1; every client holds round(0.6 * 2) = 1 of them.
  for t in range(2):
    task = stream.task(t)
    held = task.client_classes[task.client_joined]
    assert (held.sum(-1) == 1).all() and held[:, 2 * t:2 * t + 2].all(-1).sum() == 0
    assert held[:, 2 * t:2 * t + 2].any(-1).all()
  assert int(stream.task(1).client_joined.sum()) == 3
  # The same bundle at 32 px: 2x2 area averages of the 64 px images.
  small = incremental.build_class_incremental_stream(
      "tiny_imagenet", num_tasks=2, num_classes=4, initial_clients=2, new_clients_per_task=1,
      data_dir=tmp_path, image_size=32, seed=0)
  assert small.images.shape == (24, 32, 32, 3)
  expect = stream.images.reshape(24, 32, 2, 32, 2, 3).astype(np.float64).mean((2, 4))
  assert np.abs(small.images - expect).max() <= 0.5 + 1e-9


def test_imagenet_subset_folder_at_a_chosen_size(tmp_path):
  image_module = pytest.importorskip("PIL.Image")
  rng = np.random.default_rng(1)
  for split, per_class in (("train", 4), ("val", 2)):
    for c in range(4):
      folder = tmp_path / "imagenet_subset" / split / f"n{c:08d}"
      folder.mkdir(parents=True)
      for j in range(per_class):  # non-square: scaled by the shorter side, centre-cropped
        image_module.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(
            folder / f"{j}.png")
  kwargs = dict(num_tasks=2, num_classes=4, initial_clients=2, new_clients_per_task=1, seed=0)
  stream = incremental.build_class_incremental_stream(
      "imagenet_subset", data_dir=tmp_path, image_size=48, **kwargs)  # source "real"
  assert stream.images.shape == (16, 48, 48, 3) and stream.test_images.shape == (8, 48, 48, 3)
  assert stream.sources["imagenet_subset"] == f"folder:{tmp_path / 'imagenet_subset'}"
  other = incremental.build_class_incremental_stream(
      "imagenet_subset", source=f"folder:{tmp_path / 'imagenet_subset'}", image_size=20,
      **kwargs)
  assert other.images.shape == (16, 20, 20, 3)
  # What the centre crop keeps: the 40x60 image scaled to 48x72, columns 12..59.
  first = sorted((tmp_path / "imagenet_subset/train").iterdir())[0] / "0.png"
  with image_module.open(first) as im:
    want = np.asarray(im.convert("RGB").resize((72, 48), image_module.BILINEAR))[:, 12:60]
  label0 = int(np.nonzero(stream.class_order == 0)[0][0])
  assert any(np.array_equal(img, want) for img in stream.images[stream.labels == label0])


@pytest.mark.parametrize("field,value,allowed", [
    ("scenario.image_size", 64, "0 (the dataset's 32) or one of (32,)"),
    ("scenario.image_size", 4, "an integer in [8, 512]"),
    ("scenario.dataset", "imagenet", "one of ('cifar100', 'tiny_imagenet', 'imagenet_subset')"),
    ("models.stem", "resnet", "one of ('auto', 'cifar', 'imagenet')"),
])
def test_bad_values_give_one_line(field, value, allowed):
  module = load_module(CONFIGS / "cifar100.py")
  config = module.get_config("glfc")
  if field == "scenario.image_size" and value == 4:
    config.scenario.dataset, config.scenario.source = "imagenet_subset", "folder:/x"
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  message = str(error.value)
  assert "\n" not in message and f"config.{field}" in message and allowed in message
  with pytest.raises(ValueError, match=r"`image_size` must be one of \(64, 32\) for dataset "
                     r"'tiny_imagenet' with source 'real', got 48"):
    incremental.build_class_incremental_stream("tiny_imagenet", image_size=48)


def test_configs_of_tables_2_and_3():
  for name, dataset, tasks, side in (("tinyimagenet", "tiny_imagenet", 20, 64),
                                     ("imagenet_subset", "imagenet_subset", 10, 224)):
    module = load_module(CONFIGS / f"{name}.py")
    cifar = load_module(CONFIGS / "cifar100.py")
    assert len(module.VARIANTS) == 2 * len(cifar.METHODS)
    for variant in module.VARIANTS:
      config = module.get_config(variant)
      validate_config(config)
      assert config.name == f"{name}_{variant}" and config.scenario.dataset == dataset
      if not variant.endswith("_quick"):  # the paper's protocol (GLFC Sec. 5.1)
        sc = config.scenario
        assert (sc.num_tasks, sc.initial_clients, sc.new_clients_per_task, sc.class_fraction,
                config.cil.clients_per_round, config.cil.rounds_per_task,
                config.local.epochs) == (tasks, 30, 10, 0.6, 10, 10, 20)
        assert cil_stream.image_size(config) == side
        assert config.models.architectures == ("glfc_resnet18",)
        # cifar100.py's method settings, only the dataset differs.
        expect = cifar.get_config(variant)
        assert config.local.lr == expect.local.lr
    with pytest.raises(ValueError, match="expected one of"):
      module.get_config("glfc_tasks5")
  assert cil_stream.model_kwargs(load_module(CONFIGS / "imagenet_subset.py").get_config(
      "glfc")) == {"stem": "imagenet"}
  assert cil_stream.model_kwargs(load_module(CONFIGS / "tinyimagenet.py").get_config(
      "glfc")) == {"stem": "cifar"}


def test_tables_2_and_3_registered():
  for table_id, paper, label in (("glfc_table2", paper_numbers.GLFC_TABLE2, "ImageNet-Subset"),
                                 ("glfc_table3", paper_numbers.GLFC_TABLE3, "Tiny-ImageNet")):
    table = tables.get_table(table_id)
    (setting,) = table.settings
    assert setting.label == label and table.family == "class_incremental"
    assert set(paper) == {r.key for r in setting.rows} - {"fedavg_cil"}
    for row in paper.values():
      assert len(row["seen"]) == 10 and abs(np.mean(row["seen"]) - row["avg"]) < 0.11
  assert paper_numbers.GLFC_TABLE2["glfc"]["seen"][-1] == 42.7
  assert paper_numbers.GLFC_TABLE3["glfc"]["avg"] == 54.9


def test_resnet18_stems_and_encoder_at_64_and_224():
  for stem, side, kernel in (("cifar", 64, 3), ("imagenet", 224, 7)):
    model = models.get_model("glfc_resnet18", 5, width=0.0625, stem=stem)
    # Shapes only (traced, not compiled): the parameters do not depend on the side.
    variables = jax.eval_shape(lambda m=model: models.init_variables(m, jax.random.key(0)))
    assert variables["params"]["trunk"]["conv1"]["kernel"].shape[:2] == (kernel, kernel)
    features, logits, _ = jax.eval_shape(
        lambda v, x, m=model: models.apply_model(m, v, x, train=False), variables,
        jax.ShapeDtypeStruct((1, side, side, 3), jnp.float32))
    assert features.shape == (1, 32) and logits.shape == (1, 5)
  encoder = models.get_model("lenet_encoder", 5, image_size=64)
  variables = models.init_variables(encoder, jax.random.key(0), input_shape=(1, 64, 64, 3))
  assert variables["params"]["head"]["kernel"].shape[0] == 16 * 16 * 12


@pytest.mark.slow  # compiles GLFC's round on ResNet-18 at 64 px: about 2 minutes on 2 cores
def test_tinyimagenet_quick_runs_one_task_at_64px(tmp_path):
  """tinyimagenet_glfc_quick shrunk to one task of 2 classes: 64x64 images through the model."""
  config = load_module(CONFIGS / "tinyimagenet.py").get_config("glfc_quick")
  config.compilation_cache_dir = ""
  config.scenario.source = "synthetic"
  config.scenario.num_tasks, config.scenario.num_classes = 1, 2
  config.scenario.initial_clients, config.scenario.new_clients_per_task = 2, 0
  config.scenario.train_size, config.scenario.test_size = 16, 4
  config.cil.rounds_per_task, config.cil.clients_per_round = 1, 2
  config.models.width = 0.0625
  config.local.epochs, config.local.batch_size = 1, 8
  config.checkpoint.every = 1
  config.logging.progress = config.logging.plots = False
  validate_config(config)
  out = train_and_evaluate(config, tmp_path)
  assert out["rounds_done"] == 1
  metadata = json.loads((tmp_path / "metadata.json").read_text())
  assert metadata["pool_size"] == 16
  results = json.loads((tmp_path / "results.json").read_text())
  assert np.isfinite(results["seen_accuracy"]).all() and len(results["seen_accuracy"]) == 1
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
  stream = cil_stream.build_stream(config)
  assert stream.images.shape[1:] == (64, 64, 3)

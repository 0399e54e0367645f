"""Loaders: the offline .npz bundle, bad files, image folders, TFDS (mock data)."""

import pathlib
import re

import numpy as np
import pytest

from fedjax_het import data
from fedjax_het.data import npz
from fedjax_het.data._imageops import area_downsample, resize_uint8_like_pil, to_rgb32
from tests import real_data
from tests.real_data import real_data_dir


@pytest.fixture
def real_dir():
  directory = real_data_dir()
  if directory is None:
    pytest.skip(real_data.missing())
  return directory


def _require(directory, entry):
  path = directory / npz.BUNDLE[entry].filename
  if not path.is_file():
    pytest.skip(f"{path} not present (set {data.DATA_DIR_ENV})")


# ----------------------------------------------------------------------------- real bundle


def test_real_digits(real_dir):
  _require(real_dir, "digits")
  digits = data.load_npz_digits(real_dir)
  assert set(digits) == {"mnist", "usps"}
  expected = {"mnist": (10000, 10000), "usps": (7291, 2007)}
  for domain, (train, test) in digits.items():
    assert (len(train), len(test)) == expected[domain]
    for split in (train, test):
      assert split.images.shape[1:] == (32, 32, 3) and split.images.dtype == np.uint8
      assert split.labels.dtype == np.int32
      assert set(np.unique(split.labels)) == set(range(10))
    # Grey images repeated to 3 channels.
    np.testing.assert_array_equal(train.images[..., 0], train.images[..., 2])
  assert np.all(np.bincount(digits["mnist"][0].labels) == 1000)


def test_real_office(real_dir):
  _require(real_dir, "office31")
  _require(real_dir, "office_caltech")
  office31 = data.load_office31(real_dir)
  sizes = {d: (len(tr), len(te)) for d, (tr, te) in office31.items()}
  assert sizes == {"amazon": (2255, 562), "dslr": (400, 98), "webcam": (637, 158)}
  all_labels = np.concatenate([tr.labels for tr, _ in office31.values()])
  assert set(np.unique(all_labels)) == set(range(31))
  caltech = data.load_office_caltech(real_dir)
  assert set(caltech) == {"amazon", "dslr", "webcam"}
  assert set(np.unique(caltech["amazon"][0].labels)) == set(range(10))
  _, names = data.load_office_domains("office31", real_dir)
  assert len(names) == 31 and list(names) == sorted(names)


def test_real_cifar_and_public_sets(real_dir):
  for entry in ("cifar10", "cifar100_glfc", "public_cifar100", "public_fmnist",
                "public_tinyimagenet"):
    _require(real_dir, entry)
  train, test = data.load_cifar10(real_dir)
  assert (len(train), len(test)) == (10000, 10000)
  assert set(np.unique(test.labels)) == set(range(10))
  train, test = data.load_cifar100_glfc(real_dir)
  assert (len(train), len(test)) == (12000, 5000)
  assert np.all(np.bincount(train.labels) == 120)
  for name in ("cifar100", "fmnist", "tinyimagenet"):
    public = data.load_public(name, real_dir)
    assert public.shape == (5000, 32, 32, 3) and public.dtype == np.uint8


def test_data_dir_from_environment(real_dir, monkeypatch):
  _require(real_dir, "digits")
  monkeypatch.setenv(data.DATA_DIR_ENV, str(real_dir))
  assert data.resolve_data_dir(None) == real_dir
  assert "mnist" in data.load_npz_digits()


# ----------------------------------------------------------------------------- bad files


def _good_digits():
  rng = np.random.default_rng(0)
  arrays = {}
  for domain, n in (("mnist", 20), ("usps", 12)):
    for split in ("train", "test"):
      arrays[f"{domain}_{split}_x"] = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
      arrays[f"{domain}_{split}_y"] = np.arange(n, dtype=np.int64) % 10
  return arrays


def _write(tmp_path, **overrides):
  arrays = _good_digits()
  for key, value in overrides.items():
    if value is None:
      del arrays[key]
    else:
      arrays[key] = value
  path = tmp_path / "digits.npz"
  np.savez(path, **arrays)
  return path


def test_valid_synthetic_bundle_loads(tmp_path):
  _write(tmp_path)
  digits = data.load_npz_digits(tmp_path)
  assert len(digits["mnist"][0]) == 20 and digits["usps"][1].labels.dtype == np.int32


@pytest.mark.parametrize("override, message", [
    ({"mnist_train_x": np.zeros((20, 32, 32, 3), np.float32)},
     r"digits\.npz \[mnist_train_x\]: images must have dtype uint8, got float32"),
    ({"mnist_train_x": np.zeros((20, 28, 28, 1), np.uint8)},
     r"\[mnist_train_x\]: images must have shape \(N, 32, 32, 3\), got \(20, 28, 28, 1\)"),
    ({"usps_test_y": np.full(12, 10)},
     r"\[usps_test_y\]: labels must lie in \[0, 10\), found values in \[10, 10\]"),
    ({"usps_test_y": np.full(12, -1)}, r"labels must lie in \[0, 10\)"),
    ({"mnist_test_y": np.zeros(19, np.int64)},
     r"\[mnist_test_y\]: 19 labels for 20 images \(lengths must match\)"),
    ({"mnist_test_y": np.zeros(20, np.float32)},
     r"\[mnist_test_y\]: labels must have an integer dtype, got float32"),
    ({"mnist_test_y": None}, r"missing key 'mnist_test_y'; the file has keys"),
])
def test_bad_file_raises_named_error(tmp_path, override, message):
  path = _write(tmp_path, **override)
  with pytest.raises(data.DataError, match=message) as info:
    data.load_npz_digits(tmp_path)
  assert str(path) in str(info.value)
  assert not isinstance(info.value, data.DataUnavailableError)


def test_truncated_file_raises_named_error(tmp_path):
  path = _write(tmp_path)
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(data.DataError, match=r"digits\.npz: cannot be read as an \.npz archive "
                                           r"\(truncated or corrupt file\?\)"):
    data.load_npz_digits(tmp_path)


def test_corrupt_member_raises_named_error(tmp_path):
  path = _write(tmp_path)
  raw = bytearray(path.read_bytes())
  start = raw.find(b"mnist_train_x.npy") + 200  # inside that member's data
  raw[start:start + 64] = b"\x00" * 64
  path.write_bytes(bytes(raw))
  with pytest.raises(data.DataError, match=r"key 'mnist_train_x' cannot be read \(truncated or "
                                           r"corrupt file\?\): BadZipFile"):
    data.load_npz_digits(tmp_path)


def test_missing_file_and_missing_directory(tmp_path, monkeypatch):
  with pytest.raises(data.DataUnavailableError, match=r"digits\.npz: file not found.*"
                                                      + data.DATA_DIR_ENV):
    data.load_npz_digits(tmp_path)
  # Without data_dir and FEDJAX_HET_DATA_DIR: the default data directory, named in the error.
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path / "cache"))
  default = tmp_path / "cache" / "data"
  with pytest.raises(data.DataUnavailableError,
                     match=re.escape(f"{default / 'office31.npz'}: file not found") + r".*"
                           + re.escape(f"download --data_dir {default} office31")):
    data.load_office31()


def test_missing_domain_names_its_download_command(tmp_path):
  _write(tmp_path)
  with pytest.raises(data.DataUnavailableError,
                     match=r"has no 'syn' domain .*it holds \['mnist', 'usps'\]\. Add it with: "
                           r"python -m fedjax_het\.data\.download --data_dir \S+ syn --from PATH"):
    data.load_npz_digits(tmp_path, domains=("syn",))


def test_fashion_mnist_loads_and_is_validated(tmp_path):
  rng = np.random.default_rng(2)
  arrays = {"train_x": rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8),
            "train_y": np.arange(12) % 10, "test_x": rng.integers(0, 256, (4, 32, 32, 3),
                                                                  dtype=np.uint8),
            "test_y": np.arange(4)}
  np.savez(tmp_path / "fmnist.npz", **arrays)
  train, test = data.load_fashion_mnist(tmp_path)
  np.testing.assert_array_equal(train.images, arrays["train_x"])
  np.testing.assert_array_equal(test.labels, arrays["test_y"])
  np.savez(tmp_path / "fmnist.npz", **{**arrays, "test_y": np.full(4, 10)})
  with pytest.raises(data.DataError, match=r"fmnist\.npz \[test_y\]: labels must lie in "
                                           r"\[0, 10\)"):
    data.load_fashion_mnist(tmp_path)


def _tinyimagenet(directory, **overrides):
  """A tiny tinyimagenet.npz: 64x64 images of 3 classes, 200 WordNet ids."""
  rng = np.random.default_rng(3)
  arrays = {"train_x": rng.integers(0, 256, (6, 64, 64, 3), dtype=np.uint8),
            "train_y": np.array([0, 0, 1, 1, 199, 199]),
            "val_x": rng.integers(0, 256, (3, 64, 64, 3), dtype=np.uint8),
            "val_y": np.array([199, 1, 0]),
            "wnids": np.array([f"n{i:08d}" for i in range(200)])}
  arrays.update(overrides)
  np.savez(directory / "tinyimagenet.npz", **arrays)
  return arrays


def test_tinyimagenet_at_64_and_32(tmp_path):
  arrays = _tinyimagenet(tmp_path)
  full = data.load_tinyimagenet(tmp_path)
  assert full.resolution == 64 and full.wnids[199] == "n00000199"
  np.testing.assert_array_equal(full.train.images, arrays["train_x"])
  np.testing.assert_array_equal(full.test.labels, arrays["val_y"])
  assert full.train.labels.dtype == np.int32
  small = data.load_tinyimagenet(tmp_path, resolution=32)
  assert small.train.images.shape == (6, 32, 32, 3) and small.resolution == 32
  # Each output pixel: the 2x2 block's mean, rounded half up.
  block = arrays["val_x"][1, 10:12, 20:22].astype(int).sum(axis=(0, 1))
  np.testing.assert_array_equal(small.test.images[1, 5, 10], (block + 2) // 4)
  split = data.Split(*small.train)  # 32x32 is a valid Split
  assert len(split) == 6
  with pytest.raises(ValueError, match=r"`resolution` must be one of \(64, 32\), got 48"):
    data.load_tinyimagenet(tmp_path, resolution=48)


@pytest.mark.parametrize("override, message", [
    ({"train_x": np.zeros((6, 32, 32, 3), np.uint8)},
     r"\[train_x\]: images must be uint8 \(N, 64, 64, 3\), got uint8 \(6, 32, 32, 3\)"),
    ({"val_y": np.array([0, 1, 200])}, r"\[val_y\]: labels must lie in \[0, 200\)"),
    ({"wnids": np.array(["n0", "n1"])}, r"\[wnids\]: expected 200 WordNet ids, found 2"),
])
def test_tinyimagenet_bad_file_names_the_key(tmp_path, override, message):
  _tinyimagenet(tmp_path, **override)
  with pytest.raises(data.DataError, match=message):
    data.load_tinyimagenet(tmp_path)


def test_tinyimagenet_missing_file_names_the_download_command(tmp_path):
  with pytest.raises(data.DataUnavailableError, match=r"tinyimagenet\.npz: file not found.*"
                                                      r"download --data_dir \S+ tinyimagenet"):
    data.load_tinyimagenet(tmp_path)


def test_resolve_data_dir_precedence(tmp_path, monkeypatch):
  monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "env"))
  assert data.resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
  assert data.resolve_data_dir(None) == tmp_path / "env"
  monkeypatch.delenv(data.DATA_DIR_ENV)
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path / "cache"))
  assert data.resolve_data_dir(None) == tmp_path / "cache" / "data"
  monkeypatch.delenv(data.CACHE_DIR_ENV)
  assert data.resolve_data_dir(None) == pathlib.Path("~/.cache/fedjax_het/data").expanduser()


def test_split_validation():
  good = np.zeros((3, 32, 32, 3), np.uint8)
  assert data.Split(good, np.array([0, 1, 2], np.int64)).labels.dtype == np.int32
  with pytest.raises(data.DataError, match="dtype uint8"):
    data.Split(good.astype(np.float32), np.zeros(3, int))
  with pytest.raises(data.DataError, match=r"shape \(N, 32, 32, 3\)"):
    data.Split(np.zeros((3, 32, 32), np.uint8), np.zeros(3, int))
  with pytest.raises(data.DataError, match="lengths must match"):
    data.Split(good, np.zeros(2, int))
  with pytest.raises(data.DataError, match=r">= 0"):
    data.Split(good, np.array([0, -1, 0]))


def test_index_split_rule():
  split = data.Split(np.zeros((25, 32, 32, 3), np.uint8), np.arange(25) % 5)
  train, test = data.index_split(split)
  assert len(train) == 8 + 8 + 5 and len(test) == 2 + 2


# ----------------------------------------------------------------------------- resizing


@pytest.mark.parametrize("size", [16, 28, 64, 100])
def test_resize_matches_pillow_bilinear(size):
  image_module = pytest.importorskip("PIL.Image")
  rng = np.random.default_rng(size)
  image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
  want = np.asarray(image_module.fromarray(image).resize((32, 32), image_module.BILINEAR))
  np.testing.assert_array_equal(resize_uint8_like_pil(image[None], 32, 32)[0], want)


@pytest.mark.parametrize("factor", [2, 4])
def test_area_downsample_matches_pillow_reduce(factor):
  image_module = pytest.importorskip("PIL.Image")
  images = np.random.default_rng(factor).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
  want = np.stack([np.asarray(image_module.fromarray(x).reduce(factor)) for x in images])
  np.testing.assert_array_equal(area_downsample(images, factor, chunk=2), want)
  with pytest.raises(ValueError, match="`factor` must be an integer >= 1 dividing"):
    area_downsample(images, 3)


def test_to_rgb32_repeats_grey():
  grey = np.random.default_rng(0).integers(0, 256, (2, 28, 28, 1), dtype=np.uint8)
  rgb = to_rgb32(grey)
  assert rgb.shape == (2, 32, 32, 3)
  np.testing.assert_array_equal(rgb[..., 0], rgb[..., 1])


# ----------------------------------------------------------------------------- image folders


def _png_tree(root, image_module, classes=("b_cls", "a_cls"), per_class=3):
  rng = np.random.default_rng(1)
  for c in classes:
    (root / c).mkdir(parents=True)
    for i in range(per_class):
      mode = ("RGB", "L", "RGBA")[i % 3]
      shape = (40, 24, 3) if mode == "RGB" else (20, 20) if mode == "L" else (32, 32, 4)
      arr = rng.integers(0, 256, shape, dtype=np.uint8)
      image_module.fromarray(arr, mode).save(root / c / f"{i}.png")


def test_image_folder_loader(tmp_path):
  image_module = pytest.importorskip("PIL.Image")
  _png_tree(tmp_path, image_module)
  (tmp_path / "a_cls" / "notes.txt").write_text("not an image")
  split, names = data.load_image_folder(tmp_path)
  assert names == ("a_cls", "b_cls")  # sorted, as torchvision
  assert split.images.shape == (6, 32, 32, 3) and split.images.dtype == np.uint8
  np.testing.assert_array_equal(split.labels, [0, 0, 0, 1, 1, 1])
  with image_module.open(tmp_path / "a_cls" / "0.png") as im:
    want = np.asarray(im.convert("RGB").resize((32, 32), image_module.BILINEAR))
  np.testing.assert_array_equal(split.images[0], want)
  grey = split.images[1]
  np.testing.assert_array_equal(grey[..., 0], grey[..., 2])


def test_image_folder_errors(tmp_path):
  image_module = pytest.importorskip("PIL.Image")
  with pytest.raises(data.DataUnavailableError, match="image folder not found"):
    data.load_image_folder(tmp_path / "nope")
  _png_tree(tmp_path, image_module)
  with pytest.raises(data.DataError, match="do not match the expected classes"):
    data.load_image_folder(tmp_path, class_names=("a_cls", "c_cls"))
  (tmp_path / "c_cls").mkdir()
  with pytest.raises(data.DataError, match="c_cls: class folder holds no image files"):
    data.load_image_folder(tmp_path)
  (tmp_path / "c_cls" / "broken.png").write_bytes(b"\x89PNG not really")
  with pytest.raises(data.DataError, match=r"broken\.png: cannot be read as an image"):
    data.load_image_folder(tmp_path)


# ----------------------------------------------------------------------------- TFDS


@pytest.fixture
def tfds():
  return pytest.importorskip("tensorflow_datasets", reason="tensorflow_datasets not installed")


def test_tfds_mock_mnist_and_svhn(tfds):
  with tfds.testing.mock_data(num_examples=12):
    mnist = data.load_tfds("mnist", "train")
    assert mnist.images.shape == (12, 32, 32, 3) and mnist.images.dtype == np.uint8
    np.testing.assert_array_equal(mnist.images[..., 0], mnist.images[..., 1])  # grey -> RGB
    assert mnist.labels.dtype == np.int32 and mnist.labels.max() < 10
    svhn = data.load_tfds("svhn", "test", indices=[3, 1, 7])
    assert svhn.images.shape == (3, 32, 32, 3)
    full = data.load_tfds("svhn_cropped", "test")
    np.testing.assert_array_equal(svhn.images, full.images[[3, 1, 7]])
    with pytest.raises(ValueError, match="`indices` must lie in"):
      data.load_tfds("mnist", "train", indices=[12])


def test_tfds_unprepared_dataset_is_unavailable_with_instructions(tfds, tmp_path):
  del tfds
  with pytest.raises(data.DataUnavailableError, match=r"(?s)svhn_cropped.*array_record"):
    data.load_tfds("svhn", "train", data_dir=tmp_path)

"""Named class orders of the class-incremental stream (scenario.class_order)."""

import numpy as np
import pytest

from fedjax_het import config as config_lib
from fedjax_het import data
from fedjax_het.cil import stream as cil_stream
from fedjax_het.data import incremental
from fedjax_het.configs import cifar100
from fedjax_het.reports import tables


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "order_cache"))
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)


def _fake_cifar100(directory, per_train=3, per_test=2):
  """A bundle-shaped npz: 100 classes, images tagged with their row number."""
  rng = np.random.default_rng(0)
  arrays = {}
  for split, per in (("train", per_train), ("test", per_test)):
    n = 100 * per
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    x[:, 0, 0, :2] = np.stack([np.arange(n) // 256, np.arange(n) % 256], axis=1)
    arrays[f"{split}_x"], arrays[f"{split}_y"] = x, rng.permutation(np.arange(n) % 100)
  np.savez(directory / "cifar100_glfc.npz", **arrays)
  return arrays


def _build(directory, **kwargs):
  kwargs = dict(num_tasks=10, data_dir=directory, initial_clients=5, new_clients_per_task=2,
                seed=3) | kwargs
  return incremental.build_class_incremental_stream(**kwargs)


def test_icarl_order_is_a_permutation_and_matches_icarls_derivation():
  order = np.asarray(incremental.ICARL_CIFAR100_ORDER)
  assert sorted(order.tolist()) == list(range(100))
  # iCaRL's Theano code: seed 1993, load_data shuffles 100 per-class arrays of 500 indices,
  # then the class order is a shuffled arange(100) (NumPy's legacy generator).
  legacy = np.random.RandomState(1993)
  for _ in range(100):
    legacy.shuffle(np.arange(500))
  derived = np.arange(100)
  legacy.shuffle(derived)
  np.testing.assert_array_equal(order, derived)


@pytest.mark.parametrize("name", ["icarl", "identity"])
def test_stream_tasks_follow_the_named_order(tmp_path, name):
  arrays = _fake_cifar100(tmp_path)
  s = _build(tmp_path, class_order=name)
  expected = incremental.ICARL_CIFAR100_ORDER if name == "icarl" else tuple(range(100))
  np.testing.assert_array_equal(s.class_order, expected)
  assert s.class_names == tuple(incremental.CIFAR100_CLASS_NAMES[c] for c in expected)
  # Every pool image carries the stream label of its original class; task t holds
  # positions t*10 .. t*10+9 of the order.
  lookup = {x.tobytes(): int(y) for x, y in zip(arrays["train_x"], arrays["train_y"])}
  assert all(expected[y] == lookup[x.tobytes()] for x, y in zip(s.images, s.labels))
  test_lookup = {x.tobytes(): int(y) for x, y in zip(arrays["test_x"], arrays["test_y"])}
  assert all(expected[y] == test_lookup[x.tobytes()]
             for x, y in zip(s.test_images, s.test_labels))
  for t in range(10):
    movers = s.client_joined[t] & ~s.client_kept_old[t]  # clients on task t's classes
    held = np.nonzero(s.client_classes[t][movers].any(axis=0))[0]
    assert held.min() >= 10 * t and held.max() < 10 * (t + 1)
    for k in np.nonzero(movers)[0]:
      rows = s.client_indices[t, k, :s.client_sizes[t, k]]
      assert set(s.labels[rows].tolist()) == set(np.nonzero(s.client_classes[t, k])[0])


def test_named_order_keeps_the_seeded_client_draw(tmp_path):
  _fake_cifar100(tmp_path)
  seeded, named = _build(tmp_path), _build(tmp_path, class_order="icarl")
  for field in ("client_sizes", "client_joined", "client_kept_old", "client_classes"):
    np.testing.assert_array_equal(getattr(seeded, field), getattr(named, field))
  assert not np.array_equal(seeded.class_order, named.class_order)


def test_named_order_with_fewer_classes_takes_its_prefix(tmp_path):
  _fake_cifar100(tmp_path)
  s = _build(tmp_path, num_tasks=4, num_classes=20, class_order="icarl")
  np.testing.assert_array_equal(s.class_order, incremental.ICARL_CIFAR100_ORDER[:20])


def test_default_is_the_seeded_stream_bit_for_bit(tmp_path):
  _fake_cifar100(tmp_path)
  default, seeded = _build(tmp_path), _build(tmp_path, class_order="seeded")
  assert cil_stream.stream_fingerprint(default) == cil_stream.stream_fingerprint(seeded)
  np.testing.assert_array_equal(default.class_order, seeded.class_order)
  # The seeded order is a random permutation, not a named one.
  assert not np.array_equal(default.class_order, np.arange(100))
  # The draw before the option existed: the permutation is the task rng's first draw.
  first = incremental._rng(3, incremental._TASKS).permutation(np.arange(100))
  np.testing.assert_array_equal(default.class_order, first)


def test_bad_class_orders_name_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"`class_order` must be one of .*'icarl'"):
    _build(tmp_path, class_order="random")
  with pytest.raises(ValueError, match="class_order`='icarl'.*cifar100"):
    _build(tmp_path, class_order="icarl", source="synthetic", num_classes=20, num_tasks=4)
  c = config_lib.base_config("fedavg_cil")
  c.scenario.class_order = "sorted"
  with pytest.raises(ValueError, match="scenario.class_order"):
    cil_stream.validate_stream_config(c)


def test_configs_use_icarls_order_at_paper_scale_only():
  for name in cifar100.VARIANTS:
    expected = "seeded" if name.endswith("_quick") else "icarl"
    assert cifar100.get_config(name).scenario.class_order == expected, name
  assert config_lib.base_config("glfc").scenario.class_order == "seeded"


def test_mid_variants_are_the_paper_setting_with_the_stated_cuts():
  """cifar100 `<method>_mid` (GLFC Table 1's mid scale): the paper variant's config but for
  the width, the local epochs, the exemplar memory, GLFC's transitions and how its proxy
  computes the reconstructions (module docstring); glfc_table1 alone of the GLFC tables has the
  scale."""
  for method in cifar100.METHODS:
    paper = cifar100.get_config(method).to_dict()
    mid = cifar100.get_config(f"{method}_mid").to_dict()
    paper.pop("name"), mid.pop("name")
    assert (mid["models"]["width"], mid["local"]["epochs"]) == (0.125, 2)
    mid["models"]["width"], mid["local"]["epochs"] = paper["models"]["width"], 20
    section = cifar100._memory_section(method)  # pylint: disable=protected-access
    if section:
      assert (mid[section]["memory_size"], paper[section]["memory_size"]) == (480, 2000)
      mid[section]["memory_size"] = 2000
    if "glfc" in mid:
      assert (mid["glfc"]["transition"], paper["glfc"]["transition"]) == ("stream", "entropy")
      mid["glfc"]["transition"] = "entropy"
      proxy = mid["glfc"]["proxy"]
      assert (proxy["reconstruction_chunk"], proxy["encoder_conv_impl"]) == (6, "im2col")
      assert (paper["glfc"]["proxy"]["reconstruction_chunk"],
              paper["glfc"]["proxy"]["encoder_conv_impl"]) == (0, "xla")
      proxy["reconstruction_chunk"], proxy["encoder_conv_impl"] = 0, "xla"
    assert mid == paper, method
  with pytest.raises(ValueError, match="<method>_mid"):
    cifar100.get_config("glfc_tasks5_mid")
  assert [t.id for t in tables.TABLES.values()
          if t.family == "class_incremental" and "mid" in t.scales] == ["glfc_table1"]

"""Synthetic digit domains and public set: determinism, balance, shift, learnability, cache."""

import os

import numpy as np
import pytest

from fedjax_het import data

N_TRAIN, N_TEST = 300, 300


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path_factory, monkeypatch):
  cache = tmp_path_factory.getbasetemp() / "synthetic_cache"
  monkeypatch.setenv(data.CACHE_DIR_ENV, str(cache))
  return cache


@pytest.fixture(scope="module")
def domains():
  """{domain: (train, test)} generated once for the module (no disk cache)."""
  return {d: (data.synthetic_digits(d, N_TRAIN, seed=0),
              data.synthetic_digits(d, N_TEST, seed=0, split="test"))
          for d in data.DIGIT_DOMAINS}


def _features(images):
  """Grey, per-image standardised, polarity-normalised pixels (bright digit)."""
  g = images.astype(np.float32).mean(-1).reshape(len(images), -1) / 255.0
  g = (g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-6)
  return np.where(((g ** 3).mean(1) < 0)[:, None], -g, g)


def _ncm_accuracy(train, test):
  x, y = _features(train.images), train.labels
  means = np.stack([x[y == c].mean(0) for c in range(10)])
  xt = _features(test.images)
  pred = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
  return float((pred == test.labels).mean())


def _image_stats(images):
  x = images.astype(np.float32) / 255.0
  saturation = (x.max(-1) - x.min(-1)).mean((1, 2))
  edges = np.abs(np.diff(x.mean(-1), axis=2)).mean((1, 2))
  return np.stack([saturation, x.mean((1, 2, 3)), x.std((1, 2, 3)), edges], axis=1)


@pytest.mark.parametrize("domain", data.DIGIT_DOMAINS)
def test_format_balance_and_all_classes(domains, domain):
  train, test = domains[domain]
  for split, n in ((train, N_TRAIN), (test, N_TEST)):
    assert split.images.shape == (n, 32, 32, 3) and split.images.dtype == np.uint8
    assert split.labels.dtype == np.int32
    counts = np.bincount(split.labels, minlength=10)
    assert counts.min() == counts.max() == n // 10  # every class, balanced
    assert split.images.std() > 10  # not blank


@pytest.mark.parametrize("domain", data.DIGIT_DOMAINS)
def test_deterministic_and_seed_dependent(domains, domain):
  again = data.synthetic_digits(domain, N_TRAIN, seed=0)
  np.testing.assert_array_equal(again.images, domains[domain][0].images)
  np.testing.assert_array_equal(again.labels, domains[domain][0].labels)
  other = data.synthetic_digits(domain, N_TRAIN, seed=1)
  assert (other.images != again.images).mean() > 0.2


@pytest.mark.parametrize("domain", data.DIGIT_DOMAINS)
def test_train_and_test_never_coincide(domains, domain):
  train, test = domains[domain]
  train_set = {im.tobytes() for im in train.images}
  assert not any(im.tobytes() in train_set for im in test.images)


def test_every_domain_is_learnable_within_domain(domains):
  # Nearest class mean on standardised grey pixels, fit and tested within a
  # domain: far above the 10% chance level.
  acc = {d: _ncm_accuracy(*domains[d]) for d in data.DIGIT_DOMAINS}
  assert acc["mnist"] > 0.7 and acc["usps"] > 0.7, acc
  assert acc["svhn"] > 0.3 and acc["syn"] > 0.3, acc


def test_domains_shift_classifier_accuracy(domains):
  names = data.DIGIT_DOMAINS
  acc = np.array([[_ncm_accuracy(domains[a][0], domains[b][1]) for b in names] for a in names])
  diag = np.diag(acc)
  off = acc[~np.eye(4, dtype=bool)]
  assert off.mean() < diag.mean() - 0.2, acc
  # The handwriting domains do not transfer to each other, nor to the colour
  # domains at their own level.
  assert acc[0, 1] < acc[1, 1] - 0.3 and acc[1, 0] < acc[0, 0] - 0.3, acc
  assert acc[1, 2] < acc[2, 2] and acc[1, 3] < acc[3, 3], acc


def test_domains_differ_in_image_statistics(domains):
  stats = {d: _image_stats(domains[d][1].images).mean(0) for d in data.DIGIT_DOMAINS}
  # Grey domains have no colour; SVHN/SYN do.
  assert stats["mnist"][0] == 0 and stats["usps"][0] == 0
  assert stats["svhn"][0] > 0.08 and stats["syn"][0] > 0.08
  # USPS digits fill the frame: much more ink than MNIST (as in the real data).
  assert stats["usps"][1] > 1.4 * stats["mnist"][1]
  # A nearest-mean domain classifier on 4 image statistics beats chance (25%) by far.
  x_train = np.concatenate([_image_stats(domains[d][0].images) for d in data.DIGIT_DOMAINS])
  x_test = np.concatenate([_image_stats(domains[d][1].images) for d in data.DIGIT_DOMAINS])
  y = np.repeat(np.arange(4), N_TRAIN)
  mu, sd = x_train.mean(0), x_train.std(0)
  means = np.stack([((x_train - mu) / sd)[y == k].mean(0) for k in range(4)])
  pred = ((((x_test - mu) / sd)[:, None] - means[None]) ** 2).sum(-1).argmin(1)
  assert (pred == np.repeat(np.arange(4), N_TEST)).mean() > 0.6


def test_public_set_deterministic_and_varied():
  a = data.synthetic_public(64, seed=3)
  assert a.shape == (64, 32, 32, 3) and a.dtype == np.uint8
  np.testing.assert_array_equal(a, data.synthetic_public(64, seed=3))
  assert (a != data.synthetic_public(64, seed=4)).mean() > 0.5
  # Natural-image-like: coloured, with structure at many scales, images differ.
  assert (a.max(-1).astype(int) - a.min(-1)).mean() > 10
  assert a.reshape(64, -1).std(1).min() > 5
  assert len({im.tobytes() for im in a}) == 64


def test_cache_roundtrip_names_and_corrupt_file_regenerates(_tmp_cache):
  first = data.synthetic_digits("usps", 40, seed=5, cache=True)
  path = _tmp_cache / f"synthetic-v{data.SYNTHETIC_VERSION}-usps-train-n40-seed5.npz"
  assert path.is_file()
  assert not [p for p in os.listdir(_tmp_cache) if p.endswith(".tmp")]  # atomic write
  cached = data.synthetic_digits("usps", 40, seed=5, cache=True)
  np.testing.assert_array_equal(first.images, cached.images)
  # The cache is read, not regenerated: a marker written into it comes back.
  marked = first.images.copy()
  marked[0, 0, 0, 0] = 123
  np.savez(path, images=marked, labels=first.labels)
  assert data.synthetic_digits("usps", 40, seed=5, cache=True).images[0, 0, 0, 0] == 123
  # A truncated cache file is regenerated, not an error.
  path.write_bytes(path.read_bytes()[:100])
  np.testing.assert_array_equal(data.synthetic_digits("usps", 40, seed=5, cache=True).images,
                                first.images)


def test_benchmark_uses_table_v_defaults_and_cache(_tmp_cache):
  bench = data.synthetic_digits_benchmark({"mnist": 20, "syn": 30}, test_size=10, seed=2)
  assert set(bench) == {"mnist", "syn"}
  assert len(bench["mnist"][0]) == 20 and len(bench["syn"][1]) == 10
  assert (_tmp_cache / f"synthetic-v{data.SYNTHETIC_VERSION}-syn-test-n10-seed2.npz").is_file()
  assert data.DEFAULT_SYNTHETIC_TRAIN_SIZES == {"mnist": 150, "usps": 80, "svhn": 5000,
                                                "syn": 1800}


def test_invalid_arguments_name_the_field():
  with pytest.raises(ValueError, match="`domain` must be one of"):
    data.synthetic_digits("mnistm", 10, seed=0)
  with pytest.raises(ValueError, match="`seed`"):
    data.synthetic_digits("mnist", 10, seed=-1)
  with pytest.raises(ValueError, match="`split`"):
    data.synthetic_digits("mnist", 10, seed=0, split="val")
  with pytest.raises(ValueError, match="`num_examples`"):
    data.synthetic_public(-3, seed=0)


def test_glyphs_cover_every_style_and_digit():
  from fedjax_het.data import _glyphs  # pylint: disable=g-import-not-at-top
  for style in _glyphs.STYLES:
    for digit in range(10):
      for variant in range(_glyphs.NUM_VARIANTS):
        segments, weights = _glyphs.glyph_segments(style, digit, variant)
        assert segments.shape[1:] == (2, 2) and len(weights) == len(segments) > 0
        assert np.all(np.isfinite(segments))
  # Different digits have different skeletons within a style.
  shapes = {_glyphs.glyph_segments("sans", d, 0)[0].tobytes() for d in range(10)}
  assert len(shapes) == 10


def test_rasterizer_antialiased_and_padding_ignored():
  from fedjax_het.data._imageops import rasterize_segments  # pylint: disable=g-import-not-at-top
  seg = np.array([[[[4.0, 16.0], [28.0, 16.0]], [[0.0, 0.0], [0.0, 0.0]]]])
  cover = rasterize_segments(seg, np.array([[2.2, 0.0]]), 32, 32, 1.0)[0]
  assert cover[16, 16] == 1.0 and cover[5, 16] == 0.0  # inside / far outside
  assert cover[18, 16] == pytest.approx(0.2, abs=1e-5)  # centre 2.5 from the axis, r = 2.2
  assert cover[0, 0] == 0.0  # the zero-radius padding segment draws nothing

"""A public set for the partitioned scenarios (the public-data methods in HtFLlib's scenario)."""

import numpy as np
import pytest

from fedjax_het.data import partitioned, scenarios
from fedjax_het.data._base import DataUnavailableError


def _mnist(**kwargs):
  return partitioned.build_partitioned_scenario(
      "mnist", num_clients=4, partition="iid", source="synthetic", train_size=200,
      test_size=40, seed=3, **kwargs)


def test_no_public_set_by_default():
  scenario = _mnist()
  assert scenario.public.shape == (0, 32, 32, 3) and scenario.sources["public"] == "none"
  assert scenario.public_mean == scenario.private_mean


def test_the_public_set_is_build_scenarios_draw_and_leaves_the_clients_alone():
  plain = _mnist()
  scenario = _mnist(public_name="synthetic", public_size=48)
  images, provenance, mean, std = scenarios.load_public_set("synthetic", 48, seed=3)
  assert scenario.public.shape == (48, 32, 32, 3) and scenario.public.dtype == np.uint8
  np.testing.assert_array_equal(scenario.public, images)
  assert scenario.sources["public"] == provenance
  assert (scenario.public_mean, scenario.public_std) == (tuple(mean), tuple(std))
  assert scenario.private_mean == plain.private_mean and scenario.substituted == ()
  for a, b in zip(scenario.train, plain.train):
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
  # The same images as a domain scenario's public set of that name, size and seed.
  domain = scenarios.build_scenario("digits", sources={d: "synthetic" for d in
                                                       ("mnist", "usps", "svhn", "syn")},
                                    private_sizes={"mnist": 10, "usps": 10, "svhn": 10,
                                                   "syn": 10},
                                    test_size=10, public_name="synthetic", public_size=48,
                                    seed=3)
  np.testing.assert_array_equal(domain.public, scenario.public)


def test_an_unavailable_public_set_raises_or_is_substituted(tmp_path):
  with pytest.raises(DataUnavailableError, match="(?s)public set 'cifar100'.*download.*public_size=0"):
    _mnist(public_name="cifar100", public_size=16, data_dir=tmp_path)
  scenario = _mnist(public_name="cifar100", public_size=16, data_dir=tmp_path,
                    synthetic_fallback=True)
  assert scenario.public.shape == (16, 32, 32, 3) and scenario.substituted == ("public",)
  assert "substituted for 'cifar100'" in scenario.sources["public"]


def test_bad_public_arguments_name_the_field():
  with pytest.raises(ValueError, match="public_size"):
    _mnist(public_size=-1)
  with pytest.raises(ValueError, match="public_name"):
    _mnist(public_name="imagenet", public_size=8)
  with pytest.raises(ValueError, match="public_normalization"):
    _mnist(public_name="synthetic", public_size=8, public_normalization="own")

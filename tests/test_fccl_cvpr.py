"""FCCL's conference protocol: the `fccl_cvpr` configs and per-participant local epochs."""

import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from fedjax_het.algorithms import fccl
from fedjax_het.config import base_config, validate_config
from fedjax_het.errors import ConfigError
from tests.tiny_runs import local_sgd, public_batches, tiny_public_data, tiny_public_setup

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
  spec = importlib.util.spec_from_file_location(f"{name}_config",
                                                REPO / "fedjax_het" / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_cvpr_configs_hold_the_conference_code_protocol():
  digits, office = _load("digits"), _load("office")
  for config, epochs, public_epochs in ((digits.get_config("fccl_cvpr"), (40, 35, 3, 4), 1),
                                        (office.get_config("home_fccl_cvpr"), (10, 6, 6, 6), 2)):
    validate_config(config)
    assert config.algorithm == "fccl"
    assert tuple(config.local.epochs) == epochs
    assert (config.local.batch_size, config.collaborative.batch_size) == (512, 512)
    assert config.collaborative.epochs == public_epochs
    assert (config.local.lr, config.collaborative.lr) == (1e-3, 1e-3)
    assert (config.local.lr_decay, config.collaborative.lr_decay) == (0.0, 0.0)
    assert config.local.weight_decay == 0.0
    assert config.collaborative.optimizer_reset == "batch"
    assert (config.fccl.pretrain_epochs, config.fccl.pretrain_batch_size) == (40, 256)
    assert config.fccl.pretrain_min_lr == config.fccl.pretrain_lr  # a constant rate
  assert office.get_config("home_fccl_cvpr").name == "office_home_fccl_cvpr"
  # The paper-setting FCCL variants keep one number and the FCCL+ schedule.
  for config in (digits.get_config("fccl"), office.get_config("home_fccl")):
    assert (config.local.epochs, config.local.lr_decay, config.fccl.pretrain_batch_size) == (
        20, 0.9, 0)
  for bad in ("fcclplus_cvpr", "fccl_cvpr_quick", "fccl_homogeneous_cvpr"):
    with pytest.raises(ValueError, match="fccl_cvpr"):
      digits.get_config(bad)


def _config(**fields):
  c = local_sgd(public_batches(base_config("fccl")), epochs=None, batch_size=3)
  c.fccl.pretrain_epochs = 1
  c.update_from_flattened_dict(fields)
  return c


def _with_epochs(config, epochs):
  config.local = config.local.to_dict() | {"epochs": epochs}
  return config


def _local_heads(config, setup, data):
  phases = fccl.make_phases(config, setup)
  state = phases.init(jax.random.PRNGKey(0), data)
  state, _ = phases.local_update(state, data.groups, jax.random.PRNGKey(1), 0)
  return {g.name: np.asarray(state["groups"][g.name]["variables"]["params"]["head"]["kernel"])
          for g in setup.groups}


def test_per_participant_epochs_train_each_participant_its_own_epochs():
  setup = tiny_public_setup(("a", "b"))
  data = tiny_public_data(setup)
  config = lambda: _config(**{"fccl.pretrain_epochs": 0})  # noqa: E731
  mixed = _local_heads(_with_epochs(config(), (1, 3)), setup, data)
  one = _local_heads(_with_epochs(config(), 1), setup, data)
  three = _local_heads(_with_epochs(config(), 3), setup, data)
  np.testing.assert_array_equal(mixed["a"], one["a"])
  np.testing.assert_array_equal(mixed["b"], three["b"])
  assert not np.allclose(one["b"], three["b"])


def test_per_participant_epochs_are_checked_against_the_participants():
  setup = tiny_public_setup(("a", "b", "a"))
  with pytest.raises(ConfigError, match=r"config.local.epochs must be one integer or one per "
                     r"participant \(3\)"):
    fccl.make_phases(_with_epochs(_config(), (1, 2)), setup)
  with pytest.raises(ConfigError, match=r"config.local.epochs must give the participants of "
                     r"architecture group 'a' \(participants \(0, 2\)\) one value"):
    fccl.make_phases(_with_epochs(_config(), (1, 2, 3)), setup)
  with pytest.raises(ConfigError, match=r"config.fccl.pretrain_batch_size must be an integer "
                     r">= 0"):
    validate_config(_config(**{"fccl.pretrain_batch_size": -1}))


def test_pretrain_batch_size_zero_is_the_local_batch():
  setup = tiny_public_setup(("a", "b"))
  data = tiny_public_data(setup)
  init = lambda c: fccl.make_phases(c, setup).init(jax.random.PRNGKey(0), data)  # noqa: E731
  default = init(_config())
  explicit = init(_config(**{"fccl.pretrain_batch_size": 3}))
  other = init(_config(**{"fccl.pretrain_batch_size": 2}))

  def kernel(state):
    return np.asarray(state["groups"]["a"]["pretrained"]["params"]["head"]["kernel"])

  np.testing.assert_array_equal(kernel(default), kernel(explicit))
  assert not np.allclose(kernel(default), kernel(other))

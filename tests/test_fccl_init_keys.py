"""FCCL's `fccl.init_keys`: which keys draw its initial weights and SOLO pretraining batches.

"split" (the default) draws them from the two halves of `jax.random.split(key)`; "run" from
the key itself and `fold_in(key, 1)`, as fcclplus.py does. Checked against the other
modules' own init: with "run", FCCL's initial weights are BASE's (solo.py) for the same key,
and its pretrained model is FCCL+'s (`fcclplus.local_distillation="dual"`, the same
pretraining settings), weight for weight.
"""

import jax
import numpy as np
import pytest

from fedjax_het.algorithms import fccl, fcclplus, solo
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import api
from fedjax_het.errors import ConfigError
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import tables
from tests.tiny_federation import grouped_data, tiny_setup
from tests.tiny_models import TinyBatchNorm
from tests.tiny_runs import lines_against_a_record_without

KEY = jax.random.key(7)


def _fccl_config(init_keys, pretrain_epochs=0):
  c = base_config("fccl")
  c.local.batch_size = 3
  c.fccl.pretrain_epochs = pretrain_epochs
  c.fccl.init_keys = init_keys
  return c


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _equal(a, b):
  return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


@pytest.fixture(scope="module", name="federation")
def _federation():
  """Two architectures (a heterogeneous federation, as Digits: no shared initial model)."""
  setup = tiny_setup(2, model=TinyBatchNorm(), archs=["a", "b"])
  return setup, api.FederatedArrays(grouped_data(setup)[0], None, None)


def test_run_keys_start_fccl_from_base_weights_and_split_keys_do_not(federation):
  setup, data = federation
  base = solo.make_solo(base_config("solo"), setup).init(KEY, data)["groups"]
  run = fccl.make_phases(_fccl_config("run"), setup).init(KEY, data)["groups"]
  split = fccl.make_phases(_fccl_config("split"), setup).init(KEY, data)["groups"]
  for group in ("a", "b"):
    want = base[group]["variables"]
    assert _equal(run[group]["variables"], want) and _equal(run[group]["pretrained"], want)
    assert not _equal(split[group]["variables"]["params"], want["params"])
  assert fccl.default_config().fccl.init_keys == "split"


def test_run_keys_pretrain_on_the_batches_fcclplus_draws(federation):
  setup, data = federation
  c = base_config("fcclplus")
  c.local.batch_size = 3
  c.fcclplus.local_distillation = "dual"
  c.fcclplus.pretrain_epochs = 2
  defaults = fccl.default_config().fccl
  c.fcclplus.pretrain_lr, c.fcclplus.pretrain_min_lr = defaults.pretrain_lr, defaults.pretrain_min_lr
  want = fcclplus.make_phases(c, setup).init(KEY, data)["groups"]
  got = fccl.make_phases(_fccl_config("run", pretrain_epochs=2), setup).init(KEY, data)["groups"]
  untouched = fccl.make_phases(_fccl_config("run"), setup).init(KEY, data)["groups"]
  split = fccl.make_phases(_fccl_config("split", pretrain_epochs=2), setup).init(KEY,
                                                                                 data)["groups"]
  for group in ("a", "b"):
    assert _equal(got[group]["pretrained"], want[group]["pretrained"])
    assert _equal(got[group]["variables"], want[group]["variables"])
    # Pretraining moved the weights (not a comparison of two untouched inits).
    assert not _equal(got[group]["pretrained"]["params"],
                      untouched[group]["pretrained"]["params"])
    assert not _equal(split[group]["pretrained"]["params"], want[group]["pretrained"]["params"])


def test_init_keys_is_validated_in_one_line():
  config = _fccl_config("shared")
  with pytest.raises(ConfigError) as info:
    validate_config(config)
  message = str(info.value)
  assert "config.fccl.init_keys" in message and "('split', 'run')" in message
  assert "\n" not in message
  with pytest.raises(ConfigError, match=r"config.fccl.init_keys must be one of "
                                        r"\('split', 'run'\), got 'shared'"):
    fccl.make_phases(config, tiny_setup(2))


def test_records_without_init_keys_resume_as_split():
  assert lines_against_a_record_without(_fccl_config("split"), "fccl.init_keys") == []
  assert lines_against_a_record_without(_fccl_config("run"), "fccl.init_keys") == [
      "config.fccl.init_keys: '<absent>' -> 'run'"]


def test_the_keys_diagnosis_is_digits_base_and_fccl_beside_fccl_with_run_keys():
  diagnosis, digits = (tables.get_table("fcclplus_digits_fccl_keys"),
                       tables.get_table("fcclplus_digits"))
  assert diagnosis.scales == ("quick",) and diagnosis.base == "solo"
  [setting], [full] = diagnosis.settings, digits.settings
  assert [r.key for r in setting.rows] == ["solo", "fccl", "fccl_run_keys"]
  rows = {r.key: r for r in full.rows}
  assert setting.rows[:2] == (rows["solo"], rows["fccl"])  # twins of fcclplus_digits' cells
  assert setting.rows[2].source == ""  # no paper prints this row
  [twin] = cells_lib.plan(digits, "quick", [1], ["fccl"])
  plain = cell_configs.cell_config(twin)
  assert plain.fccl.init_keys == "split"
  [cell] = cells_lib.plan(diagnosis, "quick", [1], ["fccl_run_keys"])
  config = cell_configs.cell_config(cell)
  validate_config(config)
  plain.fccl.init_keys = "run"
  assert config.to_dict() == plain.to_dict()  # nothing else differs
  assert setting.paper["inter"] == {"solo": full.paper["inter"]["solo"],
                                    "fccl": full.paper["inter"]["fccl"]}
  assert setting.paper_delta == {}
  with pytest.raises(ConfigError, match="allowed scales: quick"):
    cells_lib.plan(diagnosis, "mid", [0], None)

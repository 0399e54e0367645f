"""FCCL's homogeneous variant: where the models are averaged (fccl.average_placement).

Two participants of one architecture (Dense -> BatchNorm -> head, so parameters and
BatchNorm statistics are both averaged). One collaborative step, then the local phase:
  between_phases (FCCL Sec. 4.1): the local phase of every participant starts from the
    NumPy mean of the post-collaborative models; the round ends with the unaveraged
    post-local models (also the next round's previous-round models);
  after_local (the FCCL+ benchmark code): the local phase starts from each participant's own
    post-collaborative model; the round ends with the NumPy mean of the post-local models,
    while the previous-round models are the unaveraged post-local ones.
The reference local phase is the library's own with averaging switched off.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fccl
from fedjax_het.config import base_config, validate_config
from fedjax_het.errors import ConfigError
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import tables
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config
from tests.tiny_federation import tiny_data, tiny_setup
from tests.tiny_models import TinyBatchNorm
from tests.tiny_runs import (lines_against_a_record_without, local_sgd,
                              public_batches)


def _config(average=True, placement=None):
  c = local_sgd(public_batches(base_config("fccl")), batch_size=3)
  c.eval.batch_size = 4
  c.fccl.pretrain_epochs = 0
  c.fccl.average_parameters = average
  if placement is not None:
    c.fccl.average_placement = placement
  return c


def _numpy_mean(tree):
  """Every leaf replaced by its mean over the participant axis, broadcast back (NumPy)."""
  return jax.tree_util.tree_map(
      lambda v: np.broadcast_to(np.asarray(v, np.float64).mean(0), v.shape), tree)


def _assert_close(got, want):
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                              atol=1e-6), got, want)


@pytest.fixture(scope="module")
def post_collaborative():
  """(setup, data, state after one collaborative step, the state's plain local phase).

  The two participants' post-collaborative models differ; the plain local phase is the
  library's with averaging switched off (`fccl.average_parameters=False`).
  """
  setup = tiny_setup(2, model=TinyBatchNorm())
  data, _, _ = tiny_data(setup)
  phases = fccl.make_phases(_config(), setup)
  state = phases.init(jax.random.key(0), data)
  group = state["groups"]["a"]
  # Two different models (the homogeneous start gives both participant 0's model).
  group["variables"] = jax.tree_util.tree_map(
      lambda v: v + 0.1 * jnp.arange(2.0).reshape((2,) + (1,) * (v.ndim - 1)),
      group["variables"])
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  state, _ = jax.jit(phases.collaborative_step)(state, images, jax.random.key(2), jnp.int32(0))
  return setup, data, state, _local(_config(average=False), setup, data, state)


def _local(config, setup, data, state):
  phases = fccl.make_phases(config, setup)
  return phases.local_update(state, data.groups, jax.random.key(3), jnp.int32(0))[0]


def test_between_phases_starts_every_local_phase_from_the_average(post_collaborative):
  setup, data, post_col, plain = post_collaborative
  variables = post_col["groups"]["a"]["variables"]
  leaf = jax.tree_util.tree_leaves(variables["params"])[0]
  assert not np.allclose(leaf[0], leaf[1])  # the average is not trivial
  got = _local(_config(placement="between_phases"), setup, data, post_col)["groups"]["a"]

  averaged = {**post_col, "groups": {"a": {**post_col["groups"]["a"],
                                           "variables": _numpy_mean(variables)}}}
  want = _local(_config(average=False), setup, data, averaged)["groups"]["a"]
  _assert_close(got["variables"], want["variables"])
  _assert_close(got["previous"], want["variables"])  # theta^{t-1}: the own post-local model
  _assert_close(got["pretrained"], post_col["groups"]["a"]["pretrained"])
  # The round ends with the two participants' own post-local models, not one average.
  out = jax.tree_util.tree_leaves(got["variables"]["params"])[0]
  assert not np.allclose(out[0], out[1])
  # Without the average the local phase ends elsewhere.
  assert not np.allclose(jax.tree_util.tree_leaves(plain["groups"]["a"]["variables"])[0],
                         jax.tree_util.tree_leaves(got["variables"])[0])


def test_after_local_ends_the_round_with_the_average_of_the_post_local_models(
    post_collaborative):
  setup, data, post_col, plain = post_collaborative
  plain = plain["groups"]["a"]
  assert fccl.default_config().fccl.average_placement == "after_local"
  got = _local(_config(placement="after_local"), setup, data, post_col)["groups"]["a"]
  _assert_close(got["variables"], _numpy_mean(plain["variables"]))
  _assert_close(got["previous"], plain["variables"])  # theta^{t-1}: the own model
  _assert_close(got["pretrained"], post_col["groups"]["a"]["pretrained"])


def test_average_placement_is_validated_in_one_line():
  config = _config(placement="before_collaborative")
  with pytest.raises(ConfigError) as info:
    validate_config(config)
  message = str(info.value)
  assert "config.fccl.average_placement" in message
  assert "('after_local', 'between_phases')" in message
  assert "\n" not in message
  with pytest.raises(ConfigError, match=r"config.fccl.average_placement must be one of "
                     r"\('after_local', 'between_phases'\)"):
    fccl.make_phases(config, tiny_setup(2))


def test_records_without_the_placement_resume_as_after_local():
  config = _config()
  assert lines_against_a_record_without(config, "fccl.average_placement") == []
  config.fccl.average_placement = "between_phases"
  assert lines_against_a_record_without(config, "fccl.average_placement") == [
      "config.fccl.average_placement: '<absent>' -> 'between_phases'"]


def test_each_table_row_averages_where_its_paper_does():
  """FCCL Table 3: between the phases (FCCL Sec. 4.1), ResNet-18 for all; FCCL+ Table XV:
  after the local phase (the benchmark code), ResNet12 for all, FedRS in its count form."""
  for scale in ("quick", "paper"):
    [table3] = cells_lib.plan(tables.get_table("fccl_table3"), scale, [0], ["fccl"])
    config = cell_configs.cell_config(table3)
    assert config.fccl.average_parameters and config.fccl.own_slot == "previous"
    assert config.fccl.average_placement == "between_phases"
    assert tuple(config.models.architectures) == ("resnet18",) * 4
    table15 = tables.get_table("fcclplus_table15")
    for cell in cells_lib.plan(table15, scale, [0], ["fccl", "fedrs"]):
      config = cell_configs.cell_config(cell)
      assert set(config.models.architectures) == {"resnet12"}
      if cell.row.key == "fccl":
        assert config.fccl.average_parameters and config.fccl.own_slot == "current"
        assert config.fccl.average_placement == "after_local"
      else:
        assert config.fedrs.form == "count"


@pytest.mark.slow
def test_between_phases_trains_end_to_end(tmp_path):
  config = tiny_config("fccl")
  config.models.architectures = ("simple_cnn",) * 4
  config.fccl.average_parameters = True
  config.fccl.average_placement = "between_phases"
  config.num_rounds = 2
  config.logging.diagnostic_rounds = ()
  train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert 0.0 <= records[-1][f"eval/intra/{client}"] <= 100.0
    assert np.isfinite(records[-1][f"train/local/loss/{client}"])
  assert json.loads((tmp_path / "config.json").read_text())["fccl"]["average_placement"] == (
      "between_phases")

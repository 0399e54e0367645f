"""FCCL+'s communication per round, train/server/bytes_up|bytes_down, counted by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fcclplus
from tests.test_fcclplus_dual import _config, _setup
from tests.tiny_federation import round_data_with_public

# TinyLinear: 3 classes, head 3072 -> 3 (kernel and bias), no BatchNorm.
CLASSES = 3
MODEL_BYTES = (3072 * 3 + 3) * 4


def _config_with(batch_size=4, epochs=1, **fields):
  config = _config("fntd", **fields)
  config.collaborative.batch_size = batch_size
  config.collaborative.epochs = epochs
  return config


def _bytes(archs, public_size, **fields):
  up, down = fcclplus.communication_bytes(_config_with(**fields), _setup(archs), public_size)
  assert up == down
  return up


@pytest.mark.parametrize("archs", [["a", "a"], ["a", "b"]])
def test_each_participant_sends_its_logits_and_similarities_on_every_public_batch(archs):
  # 8 public images in batches of 4: 2 batches; per batch and participant the logits
  # (4 x 3 floats) and the similarity logits without the diagonal (4 x 3 floats), 4 bytes
  # each; 2 participants; the same targets come back.
  assert _bytes(archs, 8) == 2 * 2 * (4 * CLASSES + 4 * 3) * 4 == 384
  # 10 images: ceil(10 / 4) = 3 full batches (the last one refilled), 2 epochs: 6 batches.
  assert _bytes(archs, 10, epochs=2) == 2 * 6 * (4 * CLASSES + 4 * 3) * 4
  # A batch larger than the public set is capped at it: one batch of 8.
  assert _bytes(archs, 8, batch_size=512) == 2 * (8 * CLASSES + 8 * 7) * 4
  # FCCM only / FISL only.
  assert _bytes(archs, 8, use_fisl=False) == 2 * 2 * (4 * CLASSES) * 4
  assert _bytes(archs, 8, use_fccm=False) == 2 * 2 * (4 * 3) * 4
  # No public phase: nothing.
  assert _bytes(archs, 8, epochs=0) == 0
  assert _bytes(archs, 0) == 0


def test_the_homogeneous_variant_also_exchanges_every_model_once_a_round():
  assert _bytes(["a", "a"], 8, average_parameters=True) == 384 + 2 * MODEL_BYTES


def test_the_round_logs_the_bytes_as_server_metrics():
  # Without a public phase the public stage runs nothing (cheap to call eagerly); the
  # homogeneous variant still exchanges the two models.
  config = _config_with(epochs=0, average_parameters=True)
  setup = _setup(["a", "a"])
  algorithm = fcclplus.make_fcclplus(config, setup)
  data = round_data_with_public(setup)
  state = algorithm.init(jax.random.key(0), data)
  public_stage = algorithm.stages[0]
  assert public_stage.name == "public"
  new_state, metrics = public_stage.run(state, data, jax.random.key(1), jnp.int32(0))
  assert set(metrics) == {"server"}
  assert float(metrics["server"]["bytes_up"]) == 2 * MODEL_BYTES
  assert float(metrics["server"]["bytes_down"]) == 2 * MODEL_BYTES
  jax.tree_util.tree_map(np.testing.assert_array_equal, new_state, state)

"""Every method's communication per round, train/server/bytes_up|bytes_down, counted by hand.

A byte count is per round, summed over the participants that take part, up = client ->
server (`fedjax_het.algorithms.common`, "Communication accounting").
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from fedjax_het.algorithms import (common, fccl, fcclplus, feddf, fedmatch, fedmd, get_method,
                                   rcfl, rhfl)
from fedjax_het.config import base_config, load_module
from fedjax_het.engine import api, clients
from tests.tiny_federation import round_data_with_public
from tests.tiny_models import TinyLinear

REPO = pathlib.Path(__file__).resolve().parents[1]
communication = load_module(REPO / "experiments" / "communication.py")
STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
CLASSES = 10
MODEL_BYTES = (3072 * CLASSES + CLASSES) * 4  # TinyLinear(10): kernel and bias, float32
MODULES = {"fccl": fccl, "fedmd": fedmd, "feddf": feddf, "fedmatch": fedmatch, "rhfl": rhfl,
           "rcfl": rcfl}


def _setup(archs):
  groups = clients.group_clients(archs, [TinyLinear(num_classes=CLASSES)] * len(archs))
  return api.Setup(groups=groups, num_participants=len(archs), num_classes=CLASSES,
                   num_rounds=4, max_sizes={g.name: 6 for g in groups},
                   private_mean=STATS[0], private_std=STATS[1], public_mean=STATS[0],
                   public_std=STATS[1], max_test_size=4)


def _config(method, batch_size=8, epochs=1, **fields):
  c = base_config(method)
  c.collaborative.batch_size = batch_size
  c.collaborative.epochs = epochs
  c.local.epochs = 1
  c.local.batch_size = 6
  c.eval.batch_size = 4
  c.update_from_flattened_dict(fields)
  return c


def _bytes(method, public_size, archs=("a", "b", "a", "b"), **fields):
  return MODULES[method].communication_bytes(_config(method, **fields), _setup(list(archs)),
                                             public_size)


LOGITS = 4 * 8 * CLASSES * 4  # 4 participants, public batch 8, 10 classes, float32


def test_fccl_exchanges_logits_and_the_mean_logits_of_every_public_batch():
  assert _bytes("fccl", 8) == (LOGITS, LOGITS) == (1280, 1280)
  # 20 images in batches of 8: ceil(20 / 8) = 3 batches; 2 epochs: 6.
  assert _bytes("fccl", 20, epochs=2) == (6 * LOGITS,) * 2
  assert _bytes("fccl", 8, epochs=0) == (0, 0)
  # Homogeneous variant: every model up, the average down.
  assert _bytes("fccl", 8, archs="aaaa", **{"fccl.average_parameters": True}) == (
      (LOGITS + 4 * MODEL_BYTES,) * 2)


def test_fedmd_exchanges_the_scores_of_the_public_subset():
  assert _bytes("fedmd", 8) == (4 * 8 * 10 * 4, 4 * 8 * 10 * 4)
  # A subset of 8 of 40 public images: one batch; the whole set: 5 batches.
  assert _bytes("fedmd", 40, **{"fedmd.public_subset": 8}) == (LOGITS, LOGITS)
  assert _bytes("fedmd", 40) == (5 * LOGITS, 5 * LOGITS)
  # A batch larger than the subset is capped at it.
  assert _bytes("fedmd", 40, batch_size=16, **{"fedmd.public_subset": 8}) == (LOGITS, LOGITS)


def test_rcfl_exchanges_scores_and_their_aggregation_on_every_public_batch():
  assert _bytes("rcfl", 8) == (LOGITS, LOGITS)
  assert _bytes("rcfl", 20, epochs=2) == (6 * LOGITS,) * 2  # 3 batches of 8, two passes


def test_feddf_exchanges_logits_and_the_ensemble():
  assert _bytes("feddf", 16) == (2 * LOGITS, 2 * LOGITS)
  assert _bytes("feddf", 8, archs="aaaa", **{"feddf.average_parameters": True}) == (
      (LOGITS + 4 * MODEL_BYTES,) * 2)


def test_fedmatch_receives_the_helpers_logits():
  # All K - 1 = 3 others help: up 1 x, down 3 x the logits.
  assert _bytes("fedmatch", 8) == (LOGITS, 3 * LOGITS)
  # One nearest helper: each participant also sends its embedding (8 noise images x C).
  assert _bytes("fedmatch", 8, **{"fedmatch.num_helpers": 1}) == (
      LOGITS + 4 * fedmatch.NOISE_IMAGES * CLASSES * 4, LOGITS)


def test_rhfl_receives_every_other_participants_logits_and_the_confidence_weights():
  ccr = (4 * 4, 4 * 4 * 4)  # one loss up per participant, the K weights down to each
  assert _bytes("rhfl", 8) == (LOGITS + ccr[0], 3 * LOGITS + ccr[1])
  assert _bytes("rhfl", 8, **{"rhfl.confidence_reweighting": False}) == (LOGITS, 3 * LOGITS)


def test_public_batches_follow_the_public_phase():
  assert common.public_batches(8, 1, 20) == (8, 3)
  assert common.public_batches(512, 2, 20) == (20, 2)
  assert common.public_batches(512, 1, 1) == (2, 1)
  assert common.public_batches(8, 0, 20) == (0, 0)
  assert common.public_batches(8, 1, 0) == (0, 0)


def test_tree_bytes_counts_size_times_itemsize():
  tree = {"a": jnp.zeros((3, 4), jnp.float32), "b": jax.ShapeDtypeStruct((5,), jnp.int8),
          "c": jnp.zeros((2,), jnp.bfloat16)}
  assert common.tree_bytes(tree) == 48 + 5 + 4
  assert common.model_bytes(TinyLinear(num_classes=CLASSES)) == MODEL_BYTES


@pytest.mark.parametrize("method", ["fccl", "fedmd", "feddf", "fedmatch", "rhfl", "rcfl", "solo"])
def test_the_round_logs_the_counted_bytes(method):
  """The round's logged bytes, read from its trace (`experiments/communication.py`)."""
  if method == "solo":
    config = base_config("solo")
  else:
    config = _config(method, **{"fccl": {"fccl.pretrain_epochs": 0},
                                "fedmd": {"fedmd.warmup_epochs": 0},
                                "rcfl": {"rcfl.warmup_epochs": 0}}.get(method, {}))
  setup = _setup(["a", "b", "a", "b"])
  algorithm = get_method(method).make(config, setup)
  logged = communication.traced_bytes(algorithm, round_data_with_public(setup, public_size=8))
  assert logged == ((0, 0) if method == "solo" else _bytes(method, 8))


def test_the_docs_block_is_the_rendering_of_the_record():
  """docs/communication.md's block is `--render` of the record (rerun the command)."""
  record = json.loads(communication.record_path("digits").read_text())
  text = communication.DOC.read_text()
  assert communication.block_of(text, "digits") == communication.render(record), (
      "stale block of docs/communication.md: rerun python experiments/communication.py")
  assert [row["variant"] for row in record["rows"]] == [row[0] for row in communication.ROWS]


@pytest.mark.parametrize("method", ["fccl", "fcclplus", "fedmd", "feddf", "fedmatch", "rhfl",
                                    "rcfl"])
def test_the_record_holds_what_the_methods_count_now(method):
  """The heterogeneous rows of the record are each method's `communication_bytes` on the
  Digits paper config (4 participants, 10 classes, 5000 public images in batches of 512)."""
  record = json.loads(communication.record_path("digits").read_text())
  row = next(r for r in record["rows"] if r["variant"] == method)
  config = load_module(REPO / "fedjax_het" / "configs" / "digits.py").get_config(method)
  module = fcclplus if method == "fcclplus" else MODULES[method]
  counted = module.communication_bytes(config, _setup(["a", "b", "c", "d"]),
                                       int(config.scenario.public_size))
  assert (row["bytes_up"], row["bytes_down"]) == counted
  if method != "fcclplus":  # 10 public batches of 512 images, logits 512 x 10, float32
    assert row["bytes_up"] == 4 * 10 * 512 * 10 * 4 + (16 if method == "rhfl" else 0)

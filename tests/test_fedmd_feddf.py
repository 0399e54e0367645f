"""FedMD and FedDF: one public step by hand on two linear participants, rounds, training, config.

The hand checks run the public step of each method on two TinyLinear
participants of two architecture groups (so the target crosses groups) with
plain SGD, and compare the new weights with a NumPy computation of
  FedMD: W_i <- W_i - lr * X^T sign(Z_i - Z_bar) / (B C),
  FedDF: W_i <- W_i - lr * (X^T (softmax(Z_i/T) - softmax(Z_bar/T)) / (T B) + wd W_i),
with Z_bar = (Z_1 + Z_2) / 2 the mean over BOTH participants (self included).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from fedjax_het.algorithms import feddf, fedmd, private_training
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import clients, public
from fedjax_het.experiment import Experiment
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config
from tests.tiny_runs import (IMAGES, STATS, participant_heads, rounds_traced_once,
                             tiny_public_config, tiny_public_data, tiny_public_setup)

NUM_CLASSES = 3


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _config(method, **fields):
  if method == "fedmd":
    fields = {"fedmd.warmup_epochs": 0, **fields}
  return tiny_public_config(method, **fields)


def _metric(metrics, setup, name):
  """{participant: value} of a per-slot metric {group: {name: (slots,)}}."""
  return {p: float(metrics[g.name][name][slot]) for g in setup.groups
          for slot, p in enumerate(g.clients)}


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


X = np.asarray(IMAGES, np.float64).reshape(8, -1)


# --------------------------------------------------------------------------- hand checks


@pytest.mark.parametrize("digest_loss", ["l1", "mse"])
def test_fedmd_digest_step_by_hand(digest_loss):
  setup = tiny_public_setup()
  lr = 0.1
  phases = fedmd.make_phases(_config("fedmd", **{"fedmd.digest_loss": digest_loss}), setup)
  state = phases.init(jax.random.key(0), tiny_public_data(setup))
  new_state, metrics = phases.digest_step(state, IMAGES, jax.random.key(2), jnp.int32(0))

  before, after = participant_heads(state, setup), participant_heads(new_state, setup)
  logits = {p: X @ w + b for p, (w, b) in before.items()}
  consensus = (logits[0] + logits[1]) / 2            # both participants, self included
  got = _metric(metrics, setup, digest_loss)
  n = X.shape[0] * NUM_CLASSES
  for p, (w, b) in before.items():
    diff = logits[p] - consensus
    assert np.min(np.abs(diff)) > 1e-4                 # no sign ambiguity in float32
    if digest_loss == "l1":
      want_loss, dz = np.mean(np.abs(diff)), np.sign(diff) / n
    else:
      want_loss, dz = np.mean(diff**2), 2 * diff / n
    # The value catches a consensus without the participant itself (|Z_1 - Z_2| is twice as big).
    np.testing.assert_allclose(got[p], want_loss, rtol=1e-5)
    np.testing.assert_allclose(after[p][0] - w, -lr * X.T @ dz, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(after[p][1] - b, -lr * dz.sum(0), rtol=1e-4, atol=1e-7)
    assert np.max(np.abs(after[p][0] - w)) > 1e-4      # the step moved the weights


def test_feddf_distillation_step_by_hand():
  setup = tiny_public_setup()
  lr, tau, wd = 0.5, 2.0, 0.01
  config = _config("feddf", **{"collaborative.lr": lr, "feddf.temperature": tau,
                               "feddf.weight_decay": wd})
  phases = feddf.make_phases(config, setup)
  state = phases.init(jax.random.key(0), tiny_public_data(setup))
  new_state, metrics = phases.distill_step(state, IMAGES, jax.random.key(2), jnp.int32(0))

  before, after = participant_heads(state, setup), participant_heads(new_state, setup)
  logits = {p: X @ w + b for p, (w, b) in before.items()}
  teacher = (logits[0] + logits[1]) / 2              # the ensemble of all participants
  got = _metric(metrics, setup, "kl")
  for p, (w, b) in before.items():
    q, s = _softmax(teacher / tau), _softmax(logits[p] / tau)
    kl = np.mean(np.sum(q * (np.log(q) - np.log(s)), -1))
    np.testing.assert_allclose(got[p], kl, rtol=1e-4)
    dz = (s - q) / (tau * X.shape[0])
    np.testing.assert_allclose(after[p][0] - w, -lr * (X.T @ dz + wd * w), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(after[p][1] - b, -lr * (dz.sum(0) + wd * b), rtol=1e-4,
                               atol=1e-7)
    assert np.max(np.abs(after[p][0] - w)) > 1e-4


@pytest.mark.parametrize("method", ["fedmd", "feddf"])
def test_padding_slots_change_neither_the_target_nor_real_participants(method):
  """Three participants, group "a" padded to 4 slots: same real updates as unpadded."""
  module = {"fedmd": fedmd, "feddf": feddf}[method]
  results = []
  for multiple in (1, 4):
    setup = tiny_public_setup(("a", "b", "a"), slot_multiple=multiple)
    phases = module.make_phases(_config(method), setup)
    state = phases.init(jax.random.key(0), tiny_public_data(setup))
    step = phases.digest_step if method == "fedmd" else phases.distill_step
    state, _ = step(state, IMAGES, jax.random.key(2), jnp.int32(0))
    results.append(participant_heads(state, setup))
  for p in range(3):
    for a, b in zip(results[0][p], results[1][p]):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["fedmd", "feddf"])
def test_saturated_logits_give_finite_steps(method):
  """Logits of order 1e28 (float32 max 3e38): the L1 and KL steps stay finite.

  torch's softmax(Z).log() would give -inf for the underflowed probabilities
  here; the log-softmax form keeps the KL and its gradient finite.
  """
  setup = tiny_public_setup()
  module = {"fedmd": fedmd, "feddf": feddf}[method]
  phases = module.make_phases(_config(method), setup)
  state = phases.init(jax.random.key(0), tiny_public_data(setup))
  state = jax.tree_util.tree_map(lambda v: v * 1e30, state)
  logits = X @ participant_heads(state, setup)[0][0]
  assert np.max(np.abs(logits)) > 1e27
  step = phases.digest_step if method == "fedmd" else phases.distill_step
  new_state, metrics = step(state, IMAGES, jax.random.key(2), jnp.int32(0))
  for leaf in jax.tree_util.tree_leaves((new_state, metrics)):
    assert np.all(np.isfinite(np.asarray(leaf)))
  # The losses' own gradients at saturated, disagreeing logits.
  z = jnp.asarray([[1e30, -1e30, 0.0]], jnp.float32)
  t = jnp.asarray([[-1e30, 1e30, 0.0]], jnp.float32)
  g_l1 = jax.grad(lambda z: losses.consensus_l1_loss(logits=z, consensus_logits=t))(z)
  g_kl = jax.grad(lambda z: losses.ensemble_distillation_loss(student_logits=z,
                                                              client_logits=t[None]))(z)
  assert np.all(np.isfinite(g_l1)) and np.all(np.isfinite(g_kl))
  np.testing.assert_allclose(g_kl, [[1.0, -1.0, 0.0]], atol=1e-6)  # softmax(z) - softmax(t)


# --------------------------------------------------------------------------- round wiring


def test_fedmd_public_subset_is_redrawn_each_round_and_zero_means_all():
  setup = tiny_public_setup()
  data = tiny_public_data(setup, public_size=10)
  draw = fedmd.make_phases(_config("fedmd", **{"fedmd.public_subset": 4}), setup).draw_subset
  rows = {tuple(np.asarray(draw(jax.random.key(k), jnp.arange(10)))) for k in range(5)}
  assert all(len(set(r)) == 4 and set(r) <= set(range(10)) for r in rows)  # no repeats
  assert len(rows) > 1                                                      # redrawn
  assert draw(jax.random.key(0), data.public).shape == (4, 32, 32, 3)
  for size in (0, 10, 50):  # 0, or at least the set's size: the whole set
    everything = fedmd.make_phases(_config("fedmd", **{"fedmd.public_subset": size}),
                                   setup).draw_subset
    assert everything(jax.random.key(0), data.public) is data.public


def _assert_same(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_fedmd_round_is_digest_on_the_round_subset_then_revisit():
  setup = tiny_public_setup()
  config = _config("fedmd", **{"fedmd.public_subset": 6, "fedmd.warmup_epochs": 1,
                               "local.batch_size": 2})  # the revisit key orders the batches
  data = tiny_public_data(setup, public_size=10)
  algorithm = fedmd.make_fedmd(config, setup)
  phases = fedmd.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), data)
  key = jax.random.key(7)
  got, metrics = algorithm.round(state, data, key, jnp.int32(0))

  order_key, augment_key, digest_key, revisit_key, subset_key = jax.random.split(key, 5)
  spec = public.make_spec(config.collaborative, STATS[0], STATS[1])
  want, _ = public.public_phase(
      lambda s, x, k: phases.digest_step(s, x, k, jnp.int32(0)), state,
      phases.draw_subset(subset_key, data.public), spec, order_key=order_key,
      augment_key=augment_key, step_key=digest_key)
  want, _ = phases.revisit(want, data.groups, revisit_key, jnp.int32(0))
  _assert_same(got, want)
  assert set(metrics) == {"collaborative", "local", "server"}
  assert set(metrics["collaborative"]["a"]) == {"l1"}
  # 2 participants x 2 batches of 4 of the 6-image subset x scores 4 x 3 x 4 bytes, each way.
  assert {k: float(v) for k, v in metrics["server"].items()} == {"bytes_up": 192.0,
                                                                 "bytes_down": 192.0}
  assert [stage.name for stage in algorithm.stages] == ["public", "local"]


def test_fedmd_warmup_is_private_training_before_round_one():
  setup = tiny_public_setup()
  data = tiny_public_data(setup)
  config = _config("fedmd", **{"fedmd.warmup_epochs": 2})
  state = fedmd.make_phases(config, setup).init(jax.random.key(0), data)
  init_key, warmup_key = jax.random.split(jax.random.key(0))
  start = {g.name: clients.init_group_variables(g, init_key, shared=False, num_participants=2)
           for g in setup.groups}
  want = private_training.pretrain_variables(setup, start, data.groups, warmup_key, epochs=2,
                                             batch_size=6, lr=0.05, min_lr=0.05, optimizer="sgd")
  _assert_same({n: g["variables"] for n, g in state["groups"].items()}, want)
  assert not np.allclose(want["a"]["params"]["head"]["kernel"],
                         start["a"]["params"]["head"]["kernel"])


@pytest.mark.parametrize("order", feddf.ORDERS)
def test_feddf_round_order(order):
  setup = tiny_public_setup()
  config = _config("feddf", **{"feddf.order": order, "local.batch_size": 2})
  data = tiny_public_data(setup, public_size=8)
  algorithm = feddf.make_feddf(config, setup)
  phases = feddf.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), data)
  key = jax.random.key(7)
  got, metrics = algorithm.round(state, data, key, jnp.int32(0))

  order_key, augment_key, distill_key, local_key = jax.random.split(key, 4)
  spec = public.make_spec(config.collaborative, STATS[0], STATS[1])
  distill = lambda s: public.public_phase(
      lambda s, x, k: phases.distill_step(s, x, k, jnp.int32(0)), s, data.public, spec,
      order_key=order_key, augment_key=augment_key, step_key=distill_key)[0]
  train = lambda s: phases.local_update(s, data.groups, local_key, jnp.int32(0))[0]
  want = train(distill(state)) if order == "distill_then_local" else distill(train(state))
  _assert_same(got, want)
  assert [stage.name for stage in algorithm.stages] == (  # one program each, in this order
      ["public", "local"] if order == "distill_then_local" else ["local", "public"])
  other = distill(train(state)) if order == "distill_then_local" else train(distill(state))
  assert not np.allclose(got["groups"]["a"]["variables"]["params"]["head"]["kernel"],
                         other["groups"]["a"]["variables"]["params"]["head"]["kernel"])
  assert set(metrics["collaborative"]["b"]) == {"kl"}
  # 2 participants x 2 public batches of 4 x logits 4 x 3 x 4 bytes, each way.
  assert {k: float(v) for k, v in metrics["server"].items()} == {"bytes_up": 192.0,
                                                                 "bytes_down": 192.0}


def test_homogeneous_feddf_averages_before_local_training():
  setup = tiny_public_setup(("a", "a"))
  data = tiny_public_data(setup)
  averaged = feddf.make_phases(_config("feddf", **{"feddf.average_parameters": True}), setup)
  plain = feddf.make_phases(_config("feddf"), setup)
  state = averaged.init(jax.random.key(0), data)
  kernel = state["groups"]["a"]["variables"]["params"]["head"]["kernel"]
  np.testing.assert_array_equal(kernel[0], kernel[1])  # one shared initialisation
  state = jax.tree_util.tree_map(lambda v: v.at[1].add(0.01), state)
  mean = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v.mean(0), v.shape), state)
  got, _ = averaged.local_update(state, data.groups, jax.random.key(3), jnp.int32(0))
  want, _ = plain.local_update(mean, data.groups, jax.random.key(3), jnp.int32(0))
  _assert_same(got, want)


# --------------------------------------------------------------------------- through the trainer


# FedMD's case is slow (21 s): its round's composition is checked on tiny linear models above,
# and FedDF's case runs the same trainer path.
@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
@pytest.mark.parametrize("variant", [pytest.param("fedmd", marks=pytest.mark.slow), "feddf"])
def test_round_is_traced_once_over_several_rounds(variant):
  state, history = rounds_traced_once(
      Experiment(tiny_config(variant, name=f"trace_guard_{variant}")), 3)
  metrics = history[-1]
  assert int(state["round"]) == 3
  names = {"fedmd": "l1", "feddf": "kl"}[variant]
  assert all(names in m for m in metrics["collaborative"].values())
  assert all({"loss", "ce"} <= set(m) for m in metrics["local"].values())


@pytest.mark.slow  # the default suite covers the round through the trainer's scan (traced once)
@pytest.mark.parametrize("variant", ["fedmd", "feddf"])
def test_train_and_evaluate_writes_results(tmp_path, variant):
  out = train_and_evaluate(tiny_config(variant), tmp_path)
  for name in ("config.json", "metadata.json", "metrics.jsonl", "results.md", "results.json"):
    assert (tmp_path / name).exists(), name
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2, 3]
  metric = {"fedmd": "l1", "feddf": "kl"}[variant]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert np.isfinite(records[-1][f"train/collaborative/{metric}/{client}"])
    assert np.isfinite(records[-1][f"train/local/loss/{client}"])
    assert 0.0 <= records[-1][f"eval/intra/{client}"] <= 100.0
  assert variant in (tmp_path / "results.md").read_text()
  assert 0.0 <= out["results"]["inter"]["AVG"] <= 100.0


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value,message", [
    ("fedmd.public_subset", -1, "config.fedmd.public_subset must be an integer >= 0"),
    ("fedmd.warmup_epochs", -1, "config.fedmd.warmup_epochs must be an integer >= 0"),
    ("fedmd.digest_loss", "kl", "config.fedmd.digest_loss must be one of ('l1', 'mse')"),
    ("collaborative.optimizer_reset", "epoch",
     "config.collaborative.optimizer_reset must be one of ('batch', 'round', 'never')"),
    ("feddf.temperature", 0.0, "config.feddf.temperature must be a number > 0"),
    ("feddf.weight_decay", -1e-5, "config.feddf.weight_decay must be a number >= 0"),
    ("feddf.order", "local_first",
     "config.feddf.order must be one of ('distill_then_local', 'local_then_distill')"),
    ("feddf.average_parameters", True,
     "config.feddf.average_parameters must be False unless every participant uses the same "
     "architecture"),
])
def test_invalid_config_values_name_the_field(field, value, message):
  method = field.split(".")[0] if field.startswith("fe") else "fedmd"
  config = tiny_config(method)
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    validate_config(config)


def test_default_configs_follow_the_benchmark():
  md, df = base_config("fedmd"), base_config("feddf")
  assert (md.fedmd.public_subset, md.fedmd.warmup_epochs, md.fedmd.digest_loss) == (0, 40, "l1")
  assert (md.collaborative.optimizer, md.collaborative.lr, md.collaborative.batch_size) == (
      "adam", 1e-3, 512)
  assert (df.collaborative.optimizer, df.collaborative.lr, df.feddf.weight_decay,
          df.feddf.temperature, df.feddf.order) == ("sgd", 1e-3, 1e-5, 1.0, "distill_then_local")
  assert (md.local.epochs, md.local.lr, df.local.epochs, df.local.lr) == (20, 1e-3, 20, 1e-3)

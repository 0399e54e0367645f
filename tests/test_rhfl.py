"""RHFL: hand-checked alignment step and confidence weights, traced-once round, end to end.

The hand checks use tiny linear participants (`TinyLinear`: logits = x W + b) and
SGD, so one public step is, per participant k,
    dL/dZ_k = (1/B) sum_{i != k} W_i (P_k - P_i),   W <- W - lr X^T dZ,  b <- b - lr sum_b dZ,
computed here in float64 NumPy.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import rhfl
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import public
from fedjax_het.experiment import Experiment
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config
from tests.tiny_federation import grouped_data, round_data_with_public
from tests.tiny_runs import STATS, local_sgd, public_sgd, rounds_traced_once, tiny_public_setup

NAMES = ("mnist", "usps", "svhn", "syn")


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


_setup = tiny_public_setup


def _config(**rhfl_fields):
  c = local_sgd(public_sgd(base_config("rhfl"), batch_size=None, augmentation=None), lr=0.2)
  c.eval.batch_size = 4
  c.rhfl.update(rhfl_fields)
  return c


_data = grouped_data


def _participant(tree_by_group, setup, key="variables"):
  """{participant: that participant's entry} from state["groups"]."""
  out = {}
  for g in setup.groups:
    for slot, p in enumerate(g.clients):
      out[p] = jax.tree_util.tree_map(lambda v: np.asarray(v[slot], np.float64),
                                      tree_by_group[g.name][key])
  return out


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _sce(logits, labels, alpha=0.1, beta=1.0):
  """Symmetric cross-entropy by hand: alpha CE + beta (-log 1e-4) sum_{c != y} clip(p_c)."""
  p = _softmax(logits)
  n = len(labels)
  ce = -np.log(p[np.arange(n), labels])
  off = np.clip(p, 1e-7, 1.0)
  off[np.arange(n), labels] = 0.0
  rce = -np.log(1e-4) * off.sum(-1)
  return np.mean(alpha * ce + beta * rce)


# --------------------------------------------------------------------------- hand checks


@pytest.mark.parametrize("archs", [["a", "a"], ["a", "b"], ["a", "b", "a"]])
def test_alignment_step_is_sgd_on_the_confidence_weighted_kl_of_the_others(archs):
  setup = _setup(archs)
  phases = rhfl.make_phases(_config(), setup)
  state = phases.init(jax.random.key(0), None)
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  weights = jnp.asarray([0.3, 0.7, 0.45][:len(archs)])
  new_state, metrics = phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0),
                                                 weights)
  before = _participant(state["groups"], setup)
  after = _participant(new_state["groups"], setup)
  x = np.asarray(images, np.float64).reshape(8, -1)
  probs = {k: _softmax(x @ v["params"]["head"]["kernel"] + v["params"]["head"]["bias"])
           for k, v in before.items()}
  w = np.asarray(weights, np.float64)
  for k in range(len(archs)):
    others = [i for i in range(len(archs)) if i != k]
    d_logits = sum(w[i] * (probs[k] - probs[i]) for i in others) / 8
    head = before[k]["params"]["head"]
    np.testing.assert_allclose(after[k]["params"]["head"]["kernel"],
                               head["kernel"] - 0.1 * x.T @ d_logits, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(after[k]["params"]["head"]["bias"],
                               head["bias"] - 0.1 * d_logits.sum(0), rtol=1e-4, atol=1e-7)
    # The logged loss: sum_{i != k} W_i KL(p_i || p_k), batch mean.
    kl = sum(w[i] * np.mean(np.sum(probs[i] * (np.log(probs[i]) - np.log(probs[k])), -1))
             for i in others)
    group = next(g for g in setup.groups if k in g.clients)
    np.testing.assert_allclose(metrics[group.name]["kl"][group.clients.index(k)], kl, rtol=1e-4)
  # The step moved the heads (the check above is not vacuous).
  assert not np.allclose(after[0]["params"]["head"]["kernel"],
                         before[0]["params"]["head"]["kernel"])


def test_confidence_weights_match_the_hand_formula():
  previous = np.array([2.0, 1.5, 1.2])
  current = np.array([1.0, 1.2, 1.5])
  quality = (previous - current) / current            # [1.0, 0.25, -0.2]
  amount = 1 / 2 + 0.5 * quality / quality.sum()      # 1/(K-1) + eta F / sum F
  want = np.exp(amount) / np.exp(amount).sum()
  got, got_quality = rhfl.confidence_weights(jnp.asarray(previous, jnp.float32),
                                             jnp.asarray(current, jnp.float32), eta=0.5)
  np.testing.assert_allclose(got_quality, [1.0, 0.25, -0.2], rtol=1e-6)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got, [0.4416, 0.3090, 0.2494], atol=1e-4)  # by hand, 4 decimals
  assert np.argmax(got) == 0  # the participant whose loss fell most is the most trusted
  # eta = 0 (the code's CCR off): softmax of equal amounts, 1/K each.
  flat, _ = rhfl.confidence_weights(jnp.asarray(previous), jnp.asarray(current), eta=0.0)
  np.testing.assert_allclose(flat, [1 / 3] * 3, rtol=1e-6)


def test_confidence_phase_measures_private_sce_and_weights_the_participants():
  setup = _setup(["a", "b", "a"])
  phases = rhfl.make_phases(_config(), setup)
  data, images, labels = _data(setup)
  state = phases.init(jax.random.key(0), None)
  params = _participant(state["groups"], setup)
  sce = np.array([_sce((images[k].reshape(len(labels[k]), -1) / 255.0)
                       @ params[k]["params"]["head"]["kernel"]
                       + params[k]["params"]["head"]["bias"], labels[k]) for k in range(3)])
  # Round 0: uniform 1 / (K - 1), and L^0 is kept for round 1.
  state0, weights0, metrics0 = phases.confidence(state, data, jax.random.key(1), jnp.int32(0))
  np.testing.assert_allclose(weights0, [0.5, 0.5, 0.5])
  np.testing.assert_allclose(
      [float(metrics0[g.name]["private_sce"][s]) for k in range(3) for g in setup.groups
       for s, p in enumerate(g.clients) if p == k], sce, rtol=1e-5)
  # Round 1 with given previous losses: Eq. (3)-(5) on (previous, the measured SCE).
  previous = np.array([1.5, 2.5, 1.0]) * sce
  state1 = {**state0, "groups": {g.name: {**state0["groups"][g.name], "confidence_loss":
                                          jnp.asarray(previous[list(g.clients)], jnp.float32)}
                                 for g in setup.groups}}
  new_state, weights1, metrics1 = phases.confidence(state1, data, jax.random.key(1),
                                                    jnp.int32(1))
  quality = (previous - sce) / sce                     # [0.5, 1.5, 0.0]
  amount = 0.5 + 0.5 * quality / quality.sum()
  want = np.exp(amount) / np.exp(amount).sum()
  np.testing.assert_allclose(weights1, want, rtol=1e-5)
  for g in setup.groups:  # the weights are logged per slot; L^1 becomes the stored loss
    np.testing.assert_allclose(metrics1[g.name]["weight"], want[list(g.clients)], rtol=1e-5)
    np.testing.assert_allclose(new_state["groups"][g.name]["confidence_loss"],
                               sce[list(g.clients)], rtol=1e-5)


def test_without_reweighting_every_round_uses_one_over_k_minus_one():
  setup = _setup(["a", "a", "a"])
  phases = rhfl.make_phases(_config(confidence_reweighting=False), setup)
  data, _, _ = _data(setup)
  state = phases.init(jax.random.key(0), None)
  for r in (0, 3):
    new_state, weights, metrics = phases.confidence(state, data, jax.random.key(1), jnp.int32(r))
    np.testing.assert_allclose(weights, [0.5, 0.5, 0.5])
    assert set(metrics["a"]) == {"weight"}
    assert new_state is state


def test_local_step_is_sgd_on_symmetric_cross_entropy():
  setup = _setup(["a", "a"])
  phases = rhfl.make_phases(_config(sce_alpha=0.3, sce_beta=0.5), setup)
  state = phases.init(jax.random.key(0), None)
  data, images, labels = _data(setup)
  new_state, metrics = phases.local_update(state, data, jax.random.key(1), jnp.int32(0))
  before, after = _participant(state["groups"], setup), _participant(new_state["groups"], setup)
  for k in range(2):
    x = images[k].reshape(len(labels[k]), -1) / 255.0
    head = before[k]["params"]["head"]
    p = _softmax(x @ head["kernel"] + head["bias"])
    n, y = len(labels[k]), labels[k]
    onehot = np.eye(3)[y]
    # RCE = -log(1e-4) (1 - p_y) (no clip active here): d/dz = -log(1e-4) p_y (p - onehot).
    p_y = p[np.arange(n), y][:, None]
    d_rce = -np.log(1e-4) * p_y * (p - onehot)
    d_logits = (0.3 * (p - onehot) + 0.5 * d_rce) / n
    np.testing.assert_allclose(after[k]["params"]["head"]["kernel"],
                               head["kernel"] - 0.2 * x.T @ d_logits, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["a"]["loss"][k], _sce(x @ head["kernel"] + head["bias"],
                                                              y, 0.3, 0.5), rtol=1e-5)


# --------------------------------------------------------------------------- saturated float32


def test_saturated_logits_give_finite_losses_weights_and_gradients():
  setup = _setup(["a", "b"])
  phases = rhfl.make_phases(_config(), setup)
  state = phases.init(jax.random.key(0), None)
  # Heads scaled so that the logits reach ~1e4: softmax is one-hot in float32.
  state["groups"] = {name: {**g, "variables": jax.tree_util.tree_map(lambda v: v * 1e4,
                                                                     g["variables"])}
                     for name, g in state["groups"].items()}
  data, _, _ = _data(setup)
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  state_c, weights, metrics_c = phases.confidence(state, data, jax.random.key(2), jnp.int32(2))
  new_state, metrics = phases.collaborative_step(state_c, images, jax.random.key(3), jnp.int32(2),
                                                 weights)
  trained, local_metrics = phases.local_update(new_state, data, jax.random.key(4), jnp.int32(2))
  for tree in (weights, metrics_c, metrics, new_state, local_metrics, trained):
    for leaf in jax.tree_util.tree_leaves(tree):
      assert np.all(np.isfinite(np.asarray(leaf))), tree
  assert max(float(metrics[g]["kl"][0]) for g in ("a", "b")) > 1.0  # saturated, not trivial
  # Degenerate loss histories: no change (the qualities cancel), a zero current loss.
  same, _ = rhfl.confidence_weights(jnp.ones(4), jnp.ones(4), eta=0.5)
  np.testing.assert_allclose(same, [0.25] * 4, rtol=1e-6)
  cancel, _ = rhfl.confidence_weights(jnp.array([3.0, 1.0]), jnp.array([2.0, 2.0]), eta=0.5)
  np.testing.assert_allclose(cancel, [0.5, 0.5], rtol=1e-6)
  zero, _ = rhfl.confidence_weights(jnp.array([1.0, 1.0, 1.0]), jnp.array([0.0, 1.0, 0.5]),
                                    eta=0.5)
  assert np.all(np.isfinite(zero)) and np.isclose(float(jnp.sum(zero)), 1.0)


# --------------------------------------------------------------------------- through the trainer


def test_round_is_confidence_and_public_alignment_then_local_sce_on_split_keys():
  """The round's two stages against the phases composed by hand on the round's five keys
  (local batches of 2: the local key orders them, so a wrong key changes the result)."""
  setup = _setup(["a", "b", "a"])
  config = _config()
  config.local.batch_size = 2
  config.collaborative.batch_size = 4
  config.collaborative.augmentation = "none"
  data = round_data_with_public(setup, public_seed=5)
  algorithm = rhfl.make_rhfl(config, setup)
  phases = rhfl.make_phases(config, setup)
  assert [stage.name for stage in algorithm.stages] == ["public", "local"]
  state = algorithm.init(jax.random.key(0), data)
  key, index = jax.random.key(7), jnp.int32(0)
  got, metrics = jax.jit(algorithm.round)(state, data, key, index)

  def by_hand(state):
    order_key, augment_key, collab_key, local_key, confidence_key = jax.random.split(key, 5)
    state, weights, _ = phases.confidence(state, data.groups, confidence_key, index)
    spec = public.make_spec(config.collaborative, STATS[0], STATS[1])
    state, _ = public.public_phase(
        lambda s, x, k: phases.collaborative_step(s, x, k, index, weights), state,
        data.public, spec, order_key=order_key, augment_key=augment_key, step_key=collab_key)
    return phases.local_update(state, data.groups, local_key, index)[0]

  want = jax.jit(by_hand)(state)
  for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
  assert set(metrics) == {"confidence", "collaborative", "local", "server"}
  # 3 participants x 2 public batches of 4 x logits 4 x 3 x 4 bytes (288) up, plus one loss
  # each; down each receives the other two's logits (576) and the 3 CCR weights.
  assert {k: float(v) for k, v in metrics["server"].items()} == {"bytes_up": 288.0 + 3 * 4,
                                                                 "bytes_down": 576.0 + 9 * 4}
  kernel = lambda s: s["groups"]["a"]["variables"]["params"]["head"]["kernel"]  # noqa: E731
  assert not np.allclose(np.asarray(kernel(got)), np.asarray(kernel(state)))


@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_round_is_traced_once_over_several_rounds_with_finite_metrics():
  state, history = rounds_traced_once(Experiment(tiny_config("rhfl", name="rhfl_trace")), 3)
  metrics = history[-1]
  weights = [np.concatenate([np.asarray(m["weight"]) for m in h["confidence"].values()])
             for h in history]
  assert int(state["round"]) == 3
  np.testing.assert_allclose(weights[0], 1 / 3)  # round 1: uniform 1 / (K - 1), K = 4
  for w in weights[1:]:  # later rounds: a softmax over the four participants
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-5)
  assert set(metrics) == {"confidence", "collaborative", "local", "server"}


@pytest.mark.slow  # the default suite covers the round through the trainer's scan (traced once)
def test_train_and_evaluate_runs_rhfl_end_to_end(tmp_path):
  out = train_and_evaluate(tiny_config("rhfl"), tmp_path)
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2, 3]
  for record in records:
    for client in NAMES:
      for name in ("confidence/weight", "confidence/private_sce", "collaborative/kl",
                   "local/loss", "local/ce"):
        assert np.isfinite(record[f"train/{name}/{client}"]), name
      assert 0.0 <= record[f"eval/intra/{client}"] <= 100.0
  assert [records[0][f"train/confidence/weight/{c}"] for c in NAMES] == pytest.approx([1 / 3] * 4)
  assert sum(records[-1][f"train/confidence/weight/{c}"] for c in NAMES) == pytest.approx(1.0)
  assert 0.0 <= out["results"]["intra"]["AVG"] <= 100.0
  assert "rhfl" in (tmp_path / "results.md").read_text()


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value,message", [
    ("rhfl.sce_alpha", -0.1, "config.rhfl.sce_alpha must be a number >= 0, got -0.1"),
    ("rhfl.sce_beta", -2.0, "config.rhfl.sce_beta must be a number >= 0, got -2.0"),
    ("rhfl.confidence_eta", -1.0, "config.rhfl.confidence_eta must be a number >= 0"),
    ("collaborative.optimizer_reset", "round",
     "config.collaborative.optimizer_reset must be one of ('batch',) for rhfl"),
    ("local.epochs", 0, "config.local.epochs must be an integer >= 1, got 0"),
])
def test_invalid_config_values_name_the_field(field, value, message):
  config = tiny_config("rhfl")
  validate_config(config)
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    validate_config(config)


def test_sce_needs_a_positive_weight_and_make_rejects_other_resets():
  config = tiny_config("rhfl")
  config.rhfl.sce_alpha, config.rhfl.sce_beta = 0.0, 0.0
  with pytest.raises(ValueError, match=r"config.rhfl.sce_beta must be a number > 0 when "
                     r"rhfl.sce_alpha is 0"):
    validate_config(config)
  config = _config()
  config.collaborative.optimizer_reset = "never"
  with pytest.raises(ValueError, match=r"config.collaborative.optimizer_reset must be one of "
                     r"\('batch',\)"):
    rhfl.make_phases(config, _setup(["a", "a"]))

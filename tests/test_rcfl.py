"""RCFL: the α-weighted score aggregation and the distillation loss by hand, config, a run.

The hand checks compare `rcfl.aggregate_scores` and `rcfl.distillation_loss` with a NumPy
computation written from the module docstring's equations (loops over classes and images,
float64), on a case where one class is held by every participant, one by two of three,
one by a single participant and one by nobody, plus a padding slot.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import rcfl
from fedjax_het.config import base_config, validate_config
from fedjax_het.errors import ConfigError
from fedjax_het.experiment import Experiment
from tests.test_train import tiny_config
from tests.tiny_runs import (IMAGES, participant_heads, rounds_traced_once, tiny_public_config,
                             tiny_public_data, tiny_public_setup)


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _aggregate_numpy(scores, holds, alpha, k):
  """t_bc = w_c m_bc / sum_c' w_c' m_bc', m the mean over c's holders, w by holder count."""
  s, b, c = scores.shape
  out = np.zeros((b, c))
  weights = np.zeros(c)
  for cls in range(c):
    holders = [i for i in range(s) if holds[i, cls]]
    if len(holders) == k:
      weights[cls] = alpha
    elif holders:
      weights[cls] = 1.0 - alpha
  for row in range(b):
    for cls in range(c):
      holders = [i for i in range(s) if holds[i, cls]]
      if holders:
        out[row, cls] = weights[cls] * np.mean([scores[i, row, cls] for i in holders])
    out[row] /= out[row].sum()
  return out


# Participants 0-2 and a padding slot 3. Class 0: all three; 1: participants 0 and 2;
# 2: participant 1 only; 3: nobody.
HOLDS = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], bool)


@pytest.mark.parametrize("alpha", [0.75, 0.2])
def test_aggregate_scores_matches_numpy(alpha):
  rng = np.random.default_rng(0)
  scores = _softmax(rng.normal(size=(4, 3, 4)) * 2.0)
  got = rcfl.aggregate_scores(jnp.asarray(scores, jnp.float32), jnp.asarray(HOLDS),
                              alpha=alpha, num_participants=3)
  want = _aggregate_numpy(scores, HOLDS, alpha, 3)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.asarray(got)[:, 3] == 0.0)  # nobody holds class 3
  # Every class shared (FCCL's scenarios): the plain mean of the real participants, any alpha.
  shared = np.ones((4, 4), bool)
  shared[3] = False
  for a in (alpha, 0.0, 1.0):
    got = rcfl.aggregate_scores(jnp.asarray(scores, jnp.float32), jnp.asarray(shared),
                                alpha=a, num_participants=3)
    np.testing.assert_allclose(np.asarray(got), scores[:3].mean(0), rtol=1e-5, atol=1e-6)


def _kl_numpy(logits, target, mask):
  z = logits - logits.max(-1, keepdims=True)
  log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
  rows = []
  for t, lp in zip(target, log_p):
    rows.append(sum(tc * (np.log(tc) - lc) for tc, lc in zip(t, lp) if tc > 0))
  rows = np.asarray(rows)
  return (rows * mask).sum() / mask.sum()


def test_distillation_loss_matches_numpy_and_detaches_the_target():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(5, 4)) * 3.0
  target = _softmax(rng.normal(size=(5, 4)))
  target[1] = [0.0, 0.5, 0.5, 0.0]  # zeros in the target: 0 log 0 = 0
  mask = np.array([1.0, 1.0, 0.0, 1.0, 1.0])
  got = rcfl.distillation_loss(logits=jnp.asarray(logits, jnp.float32),
                               target=jnp.asarray(target, jnp.float32), mask=jnp.asarray(mask))
  np.testing.assert_allclose(float(got), _kl_numpy(logits, target, mask), rtol=1e-5, atol=1e-6)
  unmasked = rcfl.distillation_loss(logits=jnp.asarray(logits, jnp.float32),
                                    target=jnp.asarray(target, jnp.float32))
  np.testing.assert_allclose(float(unmasked), _kl_numpy(logits, target, np.ones(5)), rtol=1e-5)
  grad_t = jax.grad(lambda t: rcfl.distillation_loss(
      logits=jnp.asarray(logits, jnp.float32), target=t))(jnp.asarray(target, jnp.float32))
  assert not np.any(np.asarray(grad_t))
  # d/dz of the mean KL: (softmax(z) - t) / B.
  grad = jax.grad(lambda z: rcfl.distillation_loss(logits=z, target=jnp.asarray(
      target, jnp.float32)))(jnp.asarray(logits, jnp.float32))
  np.testing.assert_allclose(np.asarray(grad), (_softmax(logits) - target) / 5, atol=1e-6)


def test_saturated_logits_give_finite_scores_targets_and_losses():
  """Logits of +-80 in float32: softmax underflows to exact zeros (exp(-160) < 1e-45)."""
  logits = np.array([[[80.0, -80.0, 0.0], [-80.0, 80.0, 80.0]],
                     [[-80.0, 80.0, 0.0], [80.0, -80.0, -80.0]]], np.float32)
  scores = jax.nn.softmax(jnp.asarray(logits), axis=-1)
  assert np.any(np.asarray(scores) == 0.0)
  holds = np.array([[1, 1, 1], [1, 1, 0]], bool)
  target = rcfl.aggregate_scores(scores, jnp.asarray(holds), alpha=0.75)
  want = _aggregate_numpy(_softmax(logits.astype(np.float64)), holds, 0.75, 2)
  assert np.all(np.isfinite(np.asarray(target)))
  np.testing.assert_allclose(np.asarray(target), want, atol=1e-6)
  student = jnp.asarray(logits[0])
  loss, grad = jax.value_and_grad(lambda z: rcfl.distillation_loss(logits=z, target=target))(
      student)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(float(loss), _kl_numpy(logits[0].astype(np.float64), want,
                                                    np.ones(2)), rtol=1e-5)
  # Every holder's mass on a class it does not hold: the target falls back to the weights.
  only_unheld = jnp.asarray([[[0.0, 0.0, 1.0]], [[0.0, 0.0, 1.0]]], jnp.float32)
  fallback = rcfl.aggregate_scores(only_unheld, jnp.asarray([[1, 1, 0], [1, 1, 0]], bool),
                                   alpha=0.75)
  np.testing.assert_allclose(np.asarray(fallback), [[0.5, 0.5, 0.0]])


def _config(**fields):
  return tiny_public_config("rcfl", **{"rcfl.warmup_epochs": 0, **fields})


def test_distill_step_by_hand_on_linear_participants():
  """One SGD step: W_i <- W_i - lr X^T (softmax(Z_i) - t) / B with t the mean of the
  participants' softmax scores (every class shared), the same for every participant."""
  setup = tiny_public_setup(("a", "b", "a"), slot_multiple=2)  # padding slot in group "b"
  data = tiny_public_data(setup)
  phases = rcfl.make_phases(_config(), setup)
  state = phases.init(jax.random.key(0), data)
  holds = rcfl.label_sets(data.groups, setup.num_classes, "all")
  new_state, metrics = phases.distill_step(state, IMAGES, jax.random.key(2), jnp.int32(0),
                                           holds)
  x = np.asarray(IMAGES, np.float64).reshape(8, -1)
  before, after = participant_heads(state, setup), participant_heads(new_state, setup)
  probs = {p: _softmax(x @ w + b) for p, (w, b) in before.items()}
  target = np.mean([probs[p] for p in range(3)], axis=0)
  for p, (w, b) in before.items():
    delta = (probs[p] - target) / 8
    np.testing.assert_allclose(after[p][0], w - 0.1 * x.T @ delta, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(after[p][1], b - 0.1 * delta.sum(0), rtol=1e-4, atol=1e-6)
  assert all(np.all(np.isfinite(np.asarray(m["kl"]))) for m in metrics.values())
  # The label sets from the private data: a participant without class c does not vote on it.
  data_holds = rcfl.label_sets(data.groups, setup.num_classes, "data")
  for g in setup.groups:
    labels, sizes = np.asarray(data.groups[g.name].labels), np.asarray(data.groups[g.name].sizes)
    for slot in range(g.num_slots):
      want = np.isin(np.arange(setup.num_classes), labels[slot, :sizes[slot]])
      np.testing.assert_array_equal(np.asarray(data_holds[g.name][slot]), want)


@pytest.mark.parametrize("field,value,message", [
    ("rcfl.alpha", 1.5, "config.rcfl.alpha must be a number in [0, 1], got 1.5."),
    ("rcfl.alpha", float("nan"), "config.rcfl.alpha must be a number in [0, 1], got nan."),
    ("rcfl.label_sets", "some", "config.rcfl.label_sets must be one of ('all', 'data'), got "
                                "'some'."),
    ("rcfl.warmup_epochs", -1, "config.rcfl.warmup_epochs must be an integer >= 0, got -1."),
])
def test_invalid_rcfl_values_give_one_line_naming_the_field(field, value, message):
  config = base_config("rcfl")
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert str(error.value) == message
  assert "\n" not in str(error.value)


def test_defaults_and_configs():
  c = base_config("rcfl")
  assert (c.rcfl.alpha, c.rcfl.label_sets, c.rcfl.warmup_epochs) == (0.75, "all", 20)
  assert (c.collaborative.optimizer, c.collaborative.lr, c.collaborative.batch_size,
          c.local.epochs) == ("adam", 1e-3, 512, 20)


@pytest.mark.parametrize("label_sets", ["all", "data"])
def test_round_is_distillation_then_local_and_traced_once(label_sets):
  """The whole round on linear participants (a padding slot included), jitted: one trace over
  two rounds, finite metrics, the counted bytes."""
  setup = tiny_public_setup(("a", "b", "a"), slot_multiple=2)
  data = tiny_public_data(setup, public_size=10)
  config = _config(**{"rcfl.label_sets": label_sets, "rcfl.warmup_epochs": 1})
  algorithm = rcfl.make_rcfl(config, setup)
  assert [stage.name for stage in algorithm.stages] == ["public", "local"]
  state = algorithm.init(jax.random.key(0), data)
  chex.clear_trace_counter()
  run = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
  for r in range(2):  # a second trace would raise AssertionError
    state, metrics = run(state, data, jax.random.key(7 + r), jnp.int32(r))
    for leaf in jax.tree_util.tree_leaves((state, metrics)):
      assert np.all(np.isfinite(np.asarray(leaf)))
  assert set(metrics) == {"collaborative", "local", "server"}
  assert set(metrics["collaborative"]["a"]) == {"kl"}
  # 3 participants x 3 batches of 4 of the 10 public images x scores 4 x 3 x 4 bytes, each way.
  assert rcfl.communication_bytes(config, setup, 10) == (3 * 3 * 4 * 3 * 4,) * 2
  assert {k: float(v) for k, v in metrics["server"].items()} == {"bytes_up": 432.0,
                                                                 "bytes_down": 432.0}


# Trains the quick Digits config's round at width 1/8 (small CNNs): about 50 s on 2 cores.
@pytest.mark.slow
def test_round_trains_from_the_config_and_is_traced_once():
  config = tiny_config("rcfl", name="trace_guard_rcfl", **{"rcfl.warmup_epochs": 1,
                                                           "models.width": 0.125})
  experiment = Experiment(config)
  state, history = rounds_traced_once(experiment, 2)
  metrics = history[-1]
  assert int(state["round"]) == 2
  assert all("kl" in m for m in metrics["collaborative"].values())
  assert all({"loss", "ce"} <= set(m) for m in metrics["local"].values())
  up, down = rcfl.communication_bytes(experiment.config, experiment.setup,
                                      int(experiment.data.public.shape[0]))
  assert up == down == 4 * 2 * 32 * 10 * 4  # K x batches x B x C x 4 (64 public images)
  assert float(metrics["server"]["bytes_up"]) == up
  assert float(metrics["server"]["bytes_down"]) == down

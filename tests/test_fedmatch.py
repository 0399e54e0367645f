"""FedMatch: the public loss and pseudo labels by hand, helpers, one step by hand, rounds, config.

The loss checks compare `fedmatch.public_loss` with a float64 NumPy computation of
  lambda_c (1/H) sum_j KL(p_j^w || p^w) + lambda_p CE(z^s, y_hat; kept rows)
and its gradients
  dL/dz^w = lambda_c / (H B) sum_j (p^w - p_j^w),
  dL/dz^s = lambda_p keep (p^s - onehot(y_hat)) / sum(keep).
The step check runs one public step on TinyLinear participants (logits = x W + b) of
two architecture groups with plain SGD: W <- W - lr (X_w^T dZ^w + X_s^T dZ^s).
"""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fedmatch
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import public
from fedjax_het.errors import ConfigError
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config
from tests.tiny_federation import round_data_with_public, tiny_data, tiny_setup
from tests.tiny_runs import local_sgd, participant_heads, public_sgd, tiny_public_setup

NAMES = ("mnist", "usps", "svhn", "syn")


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _setup(archs=("a", "b", "a"), *, slot_multiple=1):
  return tiny_public_setup(archs, slot_multiple=slot_multiple)


def _config(**fedmatch_fields):
  c = local_sgd(public_sgd(base_config("fedmatch"), augmentation=None))
  c.eval.batch_size = 4
  c.fedmatch.update(fedmatch_fields)
  return c


# --------------------------------------------------------------------------- NumPy reference


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  shifted = z - z.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _votes(own, peers, helpers):
  b = np.arange(own.shape[0])
  votes = np.zeros(own.shape)
  votes[b, np.argmax(own, -1)] += 1
  for weight, peer in zip(helpers, peers):
    votes[b, np.argmax(peer, -1)] += weight
  return votes


def _reference(own_w, own_s, peers, helpers, *, tau=0.85, agreement="plurality", lc=1.0,
               lp=1.0):
  """(loss, kl, ce, keep, labels, dL/dz^w, dL/dz^s) in float64."""
  own_w, own_s, peers = (np.asarray(a, np.float64) for a in (own_w, own_s, peers))
  helpers = np.asarray(helpers, np.float64)
  n, c = own_w.shape
  log_p = _log_softmax(own_w)
  kls = [np.mean(np.sum(np.exp(_log_softmax(t)) * (_log_softmax(t) - log_p), -1)) for t in peers]
  h = helpers.sum()
  kl = float(np.dot(helpers, kls)) / max(h, 1.0)
  votes = _votes(own_w, peers, helpers)
  labels = votes.argmax(-1)
  if agreement == "plurality":
    agree = (votes == votes.max(-1, keepdims=True)).sum(-1) == 1
  else:
    agree = votes.max(-1) == 1 + h
  keep = (np.exp(log_p).max(-1) >= tau) & agree
  log_s = _log_softmax(own_s)
  ce = -log_s[np.arange(n), labels][keep].mean() if keep.any() else 0.0
  grad_w = lc / (max(h, 1.0) * n) * sum(w * (np.exp(log_p) - np.exp(_log_softmax(t)))
                                         for w, t in zip(helpers, peers))
  grad_s = lp * keep[:, None] * (np.exp(log_s) - np.eye(c)[labels]) / max(keep.sum(), 1)
  return lc * kl + lp * ce, kl, ce, keep, labels, grad_w, grad_s


def _public_loss(own_w, own_s, peers, helpers, **kwargs):
  fields = dict(threshold=0.85, agreement="plurality", consistency_weight=1.0,
                pseudo_label_weight=1.0)
  fields.update(kwargs)
  f32 = lambda a: jnp.asarray(a, jnp.float32)

  def loss(w, s):
    return fedmatch.public_loss(own_weak=w, own_strong=s, peer_weak=f32(peers),
                                helper_weights=f32(helpers), **fields)

  (value, metrics), (grad_w, grad_s) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      f32(own_w), f32(own_s))
  return value, metrics, grad_w, grad_s


# --------------------------------------------------------------------------- loss by hand

OWN_W = np.array([[4.0, 0.5, -1.0],    # confident 0; helpers 0, 0        -> kept, 0
                  [0.2, 3.0, 0.1],     # confident 1; helpers 2, 1        -> kept, 1 (2 of 3)
                  [3.0, -1.0, 0.0],    # confident 0; helpers 0, 1        -> kept, 0
                  [0.3, 0.1, 0.2]])    # not confident                    -> dropped
OWN_S = np.array([[1.0, 0.0, -0.5], [0.5, 0.2, 0.0], [-1.0, 2.0, 0.3], [0.0, 0.0, 1.0]])
PEER_1 = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 3.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
PEER_2 = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0], [0.0, 1.5, 0.0], [0.0, 2.0, 1.0]])


@pytest.mark.parametrize("agreement", fedmatch.AGREEMENTS)
@pytest.mark.parametrize("lc,lp", [(1.0, 1.0), (0.3, 2.0)])
def test_public_loss_and_gradients_match_numpy(agreement, lc, lp):
  peers = np.stack([OWN_W, PEER_1, PEER_2])  # participant 0 is the one training
  helpers = [0.0, 1.0, 1.0]
  want = _reference(OWN_W, OWN_S, peers, helpers, agreement=agreement, lc=lc, lp=lp)
  value, metrics, grad_w, grad_s = _public_loss(OWN_W, OWN_S, peers, helpers, agreement=agreement,
                                                consistency_weight=lc, pseudo_label_weight=lp)
  np.testing.assert_allclose(value, want[0], rtol=1e-5)
  np.testing.assert_allclose([metrics["loss"], metrics["kl"], metrics["ce"], metrics["kept"]],
                             [want[0], want[1], want[2], want[3].mean()], rtol=1e-5)
  np.testing.assert_allclose(grad_w, want[5], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad_s, want[6], rtol=1e-5, atol=1e-7)
  kept = {"plurality": [True, True, True, False], "unanimous": [True, False, False, False]}
  np.testing.assert_array_equal(want[3], kept[agreement])  # the reference is not vacuous
  assert want[1] > 0.1 and want[2] > 0.1


def test_public_loss_is_exact_for_saturated_float32_logits():
  """Logits of magnitude 30-60: naive float32 softmax-then-log gives -inf, ours the exact value."""
  own_w = np.array([[50.0, -50.0, 0.0], [-40.0, 45.0, 30.0], [35.0, 30.0, -50.0]])
  own_s = np.array([[-60.0, 50.0, 0.0], [40.0, -50.0, 45.0], [-45.0, 50.0, 0.0]])
  peer = np.array([[-50.0, 50.0, 0.0], [-30.0, 50.0, -40.0], [50.0, -50.0, 30.0]])
  peers = np.stack([own_w, peer])
  helpers = [0.0, 1.0]
  # Naive float32 softmax then log: probabilities below ~1e-45 are 0 and their log is -inf.
  z = own_s.astype(np.float32)
  with np.errstate(divide="ignore", over="ignore"):
    naive = np.log(np.exp(z) / np.exp(z).sum(-1, keepdims=True))
  assert not np.all(np.isfinite(naive))
  want = _reference(own_w, own_s, peers, helpers)
  value, metrics, grad_w, grad_s = _public_loss(own_w, own_s, peers, helpers)
  np.testing.assert_array_equal(want[3], [False, True, True])  # row 0: 1 vs 1 vote, a tie
  np.testing.assert_allclose(value, want[0], rtol=1e-5)
  np.testing.assert_allclose([metrics["kl"], metrics["ce"]], want[1:3], rtol=1e-5)
  assert want[1] > 30 and want[2] > 50  # saturated and disagreeing, not a trivial case
  for got, ref in ((grad_w, want[5]), (grad_s, want[6])):
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- pseudo labels


PSEUDO_LABELS = jax.jit(lambda **kw: fedmatch.agreement_pseudo_labels(**kw),
                        static_argnames=("agreement",))


def test_agreement_mask_by_hand():
  confident = lambda c: np.eye(3)[c] * 5.0       # max probability ~0.987
  unsure = lambda c: np.eye(3)[c] * 0.5          # max probability ~0.45
  own = np.stack([confident(0),  # helpers 0, 0: agree                -> kept, 0
                  confident(1),  # helpers 1, 2: plurality 1          -> kept (plurality), 1
                  confident(0),  # helpers 1, 2: one vote each, a tie -> dropped
                  unsure(2),     # helpers 2, 2: agree, not confident -> dropped
                  confident(0),  # helpers 1, 1: outvoted             -> kept (plurality), 1
                  confident(2)])  # helpers 2, 2: agree               -> kept, 2
  helper_1 = np.stack([confident(0), confident(1), unsure(1), confident(2), unsure(1),
                       confident(2)])
  helper_2 = np.stack([unsure(0), unsure(2), confident(2), unsure(2), confident(1),
                       unsure(2)])
  outsider = np.stack([confident(1)] * 6)  # not a helper (weight 0): never votes
  peers = jnp.asarray(np.stack([own, helper_1, helper_2, outsider]), jnp.float32)
  helpers = jnp.asarray([0.0, 1.0, 1.0, 0.0])
  want = {"plurality": ([0, 1, 0, 2, 1, 2], [True, True, False, False, True, True]),
          "unanimous": ([0, 1, 0, 2, 1, 2], [True, False, False, False, False, True])}
  for agreement, (labels, keep) in want.items():
    got_labels, got_keep = PSEUDO_LABELS(
        own_logits=jnp.asarray(own, jnp.float32), peer_logits=peers, helper_weights=helpers,
        threshold=0.85, agreement=agreement)
    np.testing.assert_array_equal(got_keep, keep)
    np.testing.assert_array_equal(np.asarray(got_labels)[np.asarray(keep)],
                                  np.asarray(labels)[np.asarray(keep)])
  # Two voters (two participants): any disagreement is a tie and drops the row.
  pair = jnp.asarray(np.stack([own[:2], np.stack([confident(1), confident(1)])]), jnp.float32)
  _, keep = PSEUDO_LABELS(
      own_logits=pair[0], peer_logits=pair, helper_weights=jnp.asarray([0.0, 1.0]),
      threshold=0.85)
  np.testing.assert_array_equal(keep, [False, True])
  # The threshold: the same agreeing row is kept below its confidence, dropped above.
  p_max = float(jax.nn.softmax(jnp.asarray(confident(0)))[0])
  for tau, kept in ((p_max - 1e-4, True), (min(p_max + 1e-4, 1.0), False)):
    _, keep = PSEUDO_LABELS(
        own_logits=peers[0, :1], peer_logits=peers[:, :1], helper_weights=helpers, threshold=tau)
    assert bool(keep[0]) is kept


# --------------------------------------------------------------------------- helpers


def test_nearest_helpers_by_hand():
  nearest = jax.jit(fedmatch.nearest_helpers, static_argnums=1)
  points = jnp.asarray([[0.0], [1.0], [3.0], [10.0]])
  np.testing.assert_array_equal(nearest(points, 1),
                                [[0, 1, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
  np.testing.assert_array_equal(nearest(points, 2),
                                [[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]])
  tie = nearest(jnp.asarray([[0.0], [1.0], [-1.0]]), 1)
  np.testing.assert_array_equal(tie[0], [0, 1, 0])  # equal distances: the lower index
  np.testing.assert_array_equal(fedmatch.all_other_participants(3),
                                [[0, 1, 1], [1, 0, 1], [1, 1, 0]])


def test_helpers_are_the_nearest_by_noise_embedding_or_all_others():
  setup = _setup(("a", "b", "a", "b"))
  everyone = fedmatch.make_phases(_config(), setup)
  state = everyone.init(jax.random.key(0), None)
  np.testing.assert_array_equal(jax.jit(everyone.select_helpers)(state), 1 - np.eye(4))
  noise = np.asarray(jax.random.normal(jax.random.key(fedmatch.NOISE_SEED),
                                       (fedmatch.NOISE_IMAGES, 32, 32, 3)), np.float64)
  x = noise.reshape(len(noise), -1)
  embedding = {}
  for g in setup.groups:
    head = state["groups"][g.name]["variables"]["params"]["head"]
    for slot, p in enumerate(g.clients):
      logits = x @ np.asarray(head["kernel"][slot]) + np.asarray(head["bias"][slot])
      embedding[p] = np.exp(_log_softmax(logits)).reshape(-1)
  distance = np.array([[np.sum((embedding[i] - embedding[j]) ** 2) if i != j else np.inf
                        for j in range(4)] for i in range(4)])
  want = np.zeros((4, 4))
  for i in range(4):
    want[i, np.argsort(distance[i], kind="stable")[:2]] = 1
  two = fedmatch.make_phases(_config(num_helpers=2), setup)
  np.testing.assert_array_equal(jax.jit(two.select_helpers)(state), want)


# --------------------------------------------------------------------------- one step by hand


WEAK = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
STRONG = jax.random.normal(jax.random.key(2), (8, 32, 32, 3))


def test_public_step_is_sgd_on_the_public_loss_of_every_participant():
  setup = _setup(("a", "b", "a"))
  lc, lp, tau, lr = 0.7, 1.3, 0.4, 0.1
  phases = fedmatch.make_phases(_config(confidence_threshold=tau, consistency_weight=lc,
                                        pseudo_label_weight=lp), setup)
  state = phases.init(jax.random.key(0), None)
  helpers = phases.select_helpers(state)
  new_state, metrics = jax.jit(phases.public_step)(state, (WEAK, STRONG), jax.random.key(3),
                                                   jnp.int32(0), helpers)
  before, after = participant_heads(state, setup), participant_heads(new_state, setup)
  xw = np.asarray(WEAK, np.float64).reshape(8, -1)
  xs = np.asarray(STRONG, np.float64).reshape(8, -1)
  weak = np.stack([xw @ w + b for w, b in (before[p] for p in range(3))])
  kept_any = []
  for p in range(3):
    w, b = before[p]
    strong = xs @ w + b
    loss, kl, ce, keep, _, dzw, dzs = _reference(weak[p], strong, weak, 1.0 - np.eye(3)[p],
                                                 tau=tau, lc=lc, lp=lp)
    np.testing.assert_allclose(after[p][0], w - lr * (xw.T @ dzw + xs.T @ dzs), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(after[p][1], b - lr * (dzw.sum(0) + dzs.sum(0)), rtol=1e-4,
                               atol=1e-6)
    group = next(g for g in setup.groups if p in g.clients)
    slot = group.clients.index(p)
    got = metrics[group.name]
    np.testing.assert_allclose([got["loss"][slot], got["kl"][slot], got["ce"][slot]],
                               [loss, kl, ce], rtol=1e-4)
    np.testing.assert_allclose(got["kept"][slot], keep.mean())
    kept_any.append(0 < keep.sum() < 8)
  assert any(kept_any)  # some rows kept and some dropped: both terms are exercised


def test_padding_slots_change_nothing_real():
  results = []
  for multiple in (1, 4):
    setup = _setup(("a", "b", "a"), slot_multiple=multiple)
    phases = fedmatch.make_phases(_config(confidence_threshold=0.4), setup)
    state = phases.init(jax.random.key(0), None)
    state, _ = jax.jit(phases.public_step)(state, (WEAK, STRONG), jax.random.key(3),
                                           jnp.int32(0), phases.select_helpers(state))
    results.append(participant_heads(state, setup))
  for p in range(3):
    for a, b in zip(results[0][p], results[1][p]):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- rounds


def test_round_on_the_tiny_federation_is_traced_once_deterministic_and_trains():
  setup = tiny_setup(2)
  data, _, _ = tiny_data(setup)
  public_images = jnp.asarray(np.random.default_rng(3).integers(0, 255, (8, 32, 32, 3),
                                                                  np.uint8))
  data = data._replace(public=public_images)
  algorithm = fedmatch.make_fedmatch(_config(confidence_threshold=0.4), setup)
  start = algorithm.init(jax.random.key(0), data)
  chex.clear_trace_counter()
  round_fn = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
  state = start
  for r in range(3):  # a second trace would raise AssertionError
    state, metrics = round_fn(state, data, jax.random.key(10 + r), jnp.int32(r))
    for leaf in jax.tree_util.tree_leaves(metrics):
      assert np.all(np.isfinite(np.asarray(leaf)))
  assert set(metrics) == {"collaborative", "local", "server"}
  assert set(metrics["collaborative"]["a"]) == {"loss", "kl", "ce", "kept"}
  # 2 participants x 2 public batches of 4 x weak-view logits 4 x 3 x 4 bytes up; each
  # receives its one helper's, the same down.
  assert {k: float(v) for k, v in metrics["server"].items()} == {"bytes_up": 192.0,
                                                                 "bytes_down": 192.0}
  assert metrics["collaborative"]["a"]["kl"].shape == (2,)
  kernel = lambda s: np.asarray(s["groups"]["a"]["variables"]["params"]["head"]["kernel"])
  assert np.max(np.abs(kernel(state) - kernel(start))) > 1e-4
  # Deterministic: the same state, data and key give the same round, bit for bit.
  again, again_metrics = round_fn(start, data, jax.random.key(10), jnp.int32(0))
  first, first_metrics = round_fn(start, data, jax.random.key(10), jnp.int32(0))
  for a, b in zip(jax.tree_util.tree_leaves((again, again_metrics)),
                  jax.tree_util.tree_leaves((first, first_metrics))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The public phase changed the models (the round is not the local training alone).
  local_only, _ = jax.jit(fedmatch.make_phases(_config(), setup).local_update)(
      start, data.groups, jax.random.split(jax.random.key(10), 4)[3], jnp.int32(0))
  assert not np.allclose(kernel(first), kernel(local_only))


def test_round_is_the_public_phase_then_the_local_update_on_the_rounds_keys():
  """The round's two stages against the phases composed by hand on the round's four keys
  (local batches of 2: the local key orders them, so a wrong key changes the result)."""
  setup = _setup(("a", "b", "a"))
  config = _config(confidence_threshold=0.4)
  config.local.batch_size = 2
  data = round_data_with_public(setup)
  algorithm = fedmatch.make_fedmatch(config, setup)
  phases = fedmatch.make_phases(config, setup)
  assert [stage.name for stage in algorithm.stages] == ["public", "local"]
  state = algorithm.init(jax.random.key(0), data)
  key, index = jax.random.key(10), jnp.int32(0)
  got, _ = jax.jit(algorithm.round)(state, data, key, index)

  def by_hand(state):
    order_key, augment_key, public_key, local_key = jax.random.split(key, 4)
    helpers = phases.select_helpers(state)  # from the models the round starts with
    state, _ = public.public_phase(
        lambda s, views, k: phases.public_step(s, views, k, index, helpers), state,
        data.public, fedmatch.make_spec(config, setup), order_key=order_key,
        augment_key=augment_key, step_key=public_key)
    return phases.local_update(state, data.groups, local_key, index)[0]

  want = jax.jit(by_hand)(state)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reset", ["round", "never"])
def test_kept_public_optimizer_state_is_carried(reset):
  setup = _setup(("a", "b"))
  config = _config()
  config.collaborative.optimizer = "adam"
  config.collaborative.optimizer_reset = reset
  phases = fedmatch.make_phases(config, setup)
  state = phases.init(jax.random.key(0), None)
  assert "public_opt" in state["groups"]["a"]
  new_state, _ = jax.jit(phases.public_step)(state, (WEAK, STRONG), jax.random.key(3),
                                              jnp.int32(0), phases.select_helpers(state))
  count = lambda s: [np.asarray(x) for x in jax.tree_util.tree_leaves(s["groups"]["b"]
                                                                      ["public_opt"])]
  assert any(not np.array_equal(a, b) for a, b in zip(count(state), count(new_state)))


@pytest.mark.slow  # the default suite covers the round on the tiny federation (traced once)
def test_train_and_evaluate_runs_fedmatch_end_to_end(tmp_path):
  out = train_and_evaluate(tiny_config("fedmatch", num_rounds=1), tmp_path)
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1]
  for client in NAMES:
    for name in ("collaborative/loss", "collaborative/kl", "collaborative/ce",
                 "collaborative/kept", "local/loss", "local/ce"):
      assert np.isfinite(records[0][f"train/{name}/{client}"]), name
    assert 0.0 <= records[0][f"eval/intra/{client}"] <= 100.0
  assert 0.0 <= out["results"]["intra"]["AVG"] <= 100.0
  assert "fedmatch" in (tmp_path / "results.md").read_text()


# --------------------------------------------------------------------------- config


def test_default_config_follows_the_paper_and_the_benchmark():
  c = base_config("fedmatch")
  assert (c.fedmatch.confidence_threshold, c.fedmatch.num_helpers, c.fedmatch.agreement,
          c.fedmatch.strong_augmentation) == (0.85, 0, "plurality", "strong")
  assert (c.fedmatch.consistency_weight, c.fedmatch.pseudo_label_weight) == (1.0, 1.0)
  assert (c.collaborative.optimizer, c.collaborative.lr, c.collaborative.batch_size,
          c.collaborative.augmentation) == ("adam", 1e-3, 512, "weak")
  assert (c.local.epochs, c.local.lr, c.local.batch_size) == (20, 1e-3, 256)
  validate_config(c)


@pytest.mark.parametrize("field,value,message", [
    ("fedmatch.confidence_threshold", 1.5,
     "config.fedmatch.confidence_threshold must be a number in [0, 1], got 1.5"),
    ("fedmatch.consistency_weight", -1.0,
     "config.fedmatch.consistency_weight must be a number >= 0, got -1.0"),
    ("fedmatch.pseudo_label_weight", -0.5,
     "config.fedmatch.pseudo_label_weight must be a number >= 0, got -0.5"),
    ("fedmatch.num_helpers", -1,
     "config.fedmatch.num_helpers must be an integer >= 0 (0: all other participants), got -1"),
    ("fedmatch.agreement", "majority",
     "config.fedmatch.agreement must be one of ('plurality', 'unanimous'), got 'majority'"),
    ("fedmatch.strong_augmentation", "randaugment",
     "config.fedmatch.strong_augmentation must be one of ('weak', 'strong', 'none')"),
])
def test_invalid_config_values_name_the_field(field, value, message):
  config = _config()
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[").replace("]", r"\]")):
    validate_config(config)


def test_zero_weights_and_too_many_helpers_are_rejected():
  config = _config(consistency_weight=0.0, pseudo_label_weight=0.0)
  with pytest.raises(ConfigError, match="config.fedmatch.pseudo_label_weight must be a number > 0 "
                     "when fedmatch.consistency_weight is 0"):
    validate_config(config)
  config = _config(num_helpers=3)
  validate_config(config)  # the participants are known only when the method is built
  with pytest.raises(ConfigError, match=r"config.fedmatch.num_helpers must be an integer in "
                     r"\[0, 2\] for 3 participants \(0: all 2 other participants\), got 3"):
    fedmatch.make_phases(config, _setup())

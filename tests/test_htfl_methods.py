"""FedProto, FD and FedTGP: their losses and server steps against NumPy by hand (float32,
saturated inputs included), one round each on a tiny federation checked by hand, the jitted
round traced once, and a quick config trained end to end (slow)."""

import json

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fd, fedkd, fedproto, fedtgp, htfl_common, lg_fedavg
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import api, clients, rounds
from fedjax_het.errors import ConfigError
from fedjax_het.evaluation import TestData as EvalData
from fedjax_het.losses import htfl as L
from tests.tiny_models import TinyMLP
from tests.tiny_runs import STATS, local_sgd

F32 = np.float32


class TinyWide(TinyMLP):
  """TinyMLP with 7 features: a second feature dimension."""

  @property
  def feature_dim(self):
    return 7

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    del train, mask
    h = nn.Dense(7, name="body")(x.reshape((x.shape[0], -1)))
    return h, nn.Dense(self.num_classes, name="head")(h)


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ------------------------------------------------------------------------------ losses


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_prototype_regularizer_matches_numpy(scale):
  rng = np.random.default_rng(0)
  h = (rng.normal(size=(5, 3)) * scale).astype(F32)
  protos = (rng.normal(size=(4, 3)) * scale).astype(F32)
  labels = np.array([0, 3, 1, 2, 3])
  present = np.array([True, False, True, True])
  mask = np.array([1, 1, 0, 1, 1], F32)
  got = L.prototype_regularizer(features=jnp.asarray(h), labels=jnp.asarray(labels),
                                prototypes=jnp.asarray(protos), present=jnp.asarray(present),
                                mask=jnp.asarray(mask))
  # HtFLlib: MSELoss over B x D with absent classes' rows replaced by their own features.
  target = np.where(present[labels][:, None], protos[labels], h).astype(np.float64)
  rows = ((h.astype(np.float64) - target) ** 2).mean(-1)
  want = (rows * mask).sum() / mask.sum()
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  grad = jax.grad(lambda x: L.prototype_regularizer(
      features=x, labels=jnp.asarray(labels), prototypes=jnp.asarray(protos),
      present=jnp.asarray(present), mask=jnp.asarray(mask)))(jnp.asarray(h))
  want_grad = 2 * (h - target) / 3 * present[labels][:, None] * mask[:, None] / mask.sum()
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6 * scale)


@pytest.mark.parametrize("target", ["logits", "softmax"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_logit_distillation_matches_numpy(target, scale):
  rng = np.random.default_rng(1)
  z = (rng.normal(size=(5, 4)) * scale).astype(F32)
  class_logits = (rng.normal(size=(4, 4)) * scale).astype(F32)
  labels = np.array([0, 1, 1, 2, 3])
  present = np.array([True, True, False, True])
  mask = np.array([1, 0, 1, 1, 1], F32)
  got = L.logit_distillation_loss(logits=jnp.asarray(z), labels=jnp.asarray(labels),
                                  class_logits=jnp.asarray(class_logits),
                                  present=jnp.asarray(present), mask=jnp.asarray(mask),
                                  target=target)
  t = np.where(present[labels][:, None], class_logits[labels], z).astype(np.float64)
  if target == "softmax":
    t = np.exp(_log_softmax(t))
  rows = -(t * _log_softmax(z)).sum(-1)       # torch CrossEntropyLoss with a float target
  want = (rows * mask).sum() / mask.sum()
  assert np.isfinite(float(got))
  np.testing.assert_allclose(float(got), want, rtol=1e-4, atol=1e-6 * scale)


def test_raw_logit_target_is_unbounded_below_and_the_softmax_target_is_not():
  # A worked case of why the quick FD configs take fd.target="softmax": with the raw target
  # t = (-2, 1) the loss -sum_c t_c log p_c is 2 log p_0 - log p_1, which falls without bound
  # as z_0 -> -inf (log p_0 ~ z_0, log p_1 -> 0); with softmax(t) it is a cross-entropy >= 0.
  class_logits = jnp.asarray([[-2.0, 1.0], [0.0, 0.0]], jnp.float32)
  present = jnp.asarray([True, False])

  def loss(z0, target):
    return float(L.logit_distillation_loss(
        logits=jnp.asarray([[z0, 0.0]], jnp.float32), labels=jnp.asarray([0]),
        class_logits=class_logits, present=present, target=target))

  for z0 in (-10.0, -1e3, -1e6):
    lse = np.logaddexp(z0, 0.0)                                    # log-sum-exp of z
    np.testing.assert_allclose(loss(z0, "logits"), 2 * z0 - lse, rtol=1e-5)
    p = np.exp(np.array([-2.0, 1.0]) - np.logaddexp(-2.0, 1.0))   # softmax(t)
    want = lse - p[0] * z0                       # -sum_c p_c log softmax(z)_c, p summing to 1
    np.testing.assert_allclose(loss(z0, "softmax"), want, rtol=1e-4)
    assert loss(z0, "softmax") >= 0.0


def test_quick_fd_distils_toward_the_softmax_and_the_paper_scale_toward_raw_logits():
  from fedjax_het.configs import htfl
  for group in ("htfe2", "htfe4"):
    assert htfl.get_config(f"cifar10_practical_{group}_fd_quick").fd.target == "softmax"
    assert htfl.get_config(f"cifar10_practical_{group}_fd").fd.target == "logits"


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_fedkd_losses_match_numpy(scale):
  rng = np.random.default_rng(3)
  z, zg = [(rng.normal(size=(5, 4)) * scale).astype(F32) for _ in range(2)]
  h, hw = [(rng.normal(size=(5, 3)) * scale).astype(F32) for _ in range(2)]
  labels = np.array([0, 3, 1, 2, 3])
  mask = np.array([1, 1, 0, 1, 1], F32)
  loss, loss_g = L.fedkd_losses(logits=jnp.asarray(z), mentee_logits=jnp.asarray(zg),
                                features=jnp.asarray(h), mapped_mentee_features=jnp.asarray(hw),
                                labels=jnp.asarray(labels), mask=jnp.asarray(mask))
  keep = mask > 0
  lp, lpg = _log_softmax(z[keep]), _log_softmax(zg[keep])
  y = labels[keep]
  ce = -lp[np.arange(len(y)), y].mean()
  ce_g = -lpg[np.arange(len(y)), y].mean()
  kl = (np.exp(lpg) * (lpg - lp)).mean()       # torch KLDivLoss(log p, p_g), mean over B x C
  kl_g = (np.exp(lp) * (lp - lpg)).mean()
  mse = ((h[keep].astype(np.float64) - hw[keep]) ** 2).mean()
  np.testing.assert_allclose(float(loss), ce + (kl + mse) / (ce + ce_g), rtol=1e-4)
  np.testing.assert_allclose(float(loss_g), ce_g + (kl_g + mse) / (ce + ce_g), rtol=1e-4)


def _tgp_numpy(protos, labels, generated, margin, mask):
  p, g = protos.astype(np.float64), generated.astype(np.float64)
  d2 = (p ** 2).sum(-1)[:, None] - 2 * p @ g.T + (g ** 2).sum(-1)[None, :]
  dist = np.sqrt(np.maximum(d2, 1e-12))
  onehot = np.eye(g.shape[0])[labels]
  logp = _log_softmax(-(dist + margin * onehot))
  rows = -logp[np.arange(len(labels)), labels]
  return (rows * mask).sum() / mask.sum()


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_tgp_margin_contrastive_loss_matches_numpy(scale):
  rng = np.random.default_rng(2)
  protos = (rng.normal(size=(6, 5)) * scale).astype(F32)
  generated = (rng.normal(size=(3, 5)) * scale).astype(F32)
  labels = np.array([0, 1, 2, 2, 1, 0])
  mask = np.array([1, 1, 1, 0, 1, 1], F32)
  got = L.tgp_margin_contrastive_loss(prototypes=jnp.asarray(protos), labels=jnp.asarray(labels),
                                      global_prototypes=jnp.asarray(generated), margin=2.5,
                                      mask=jnp.asarray(mask))
  np.testing.assert_allclose(float(got), _tgp_numpy(protos, labels, generated, 2.5, mask),
                             rtol=1e-4)


def test_tgp_loss_is_finite_where_a_prototype_meets_its_global_prototype():
  generated = np.array([[1.0, 2.0], [-3.0, 0.5]], F32)
  protos = generated.copy()                       # zero distance to the own class
  labels = np.array([0, 1])
  fn = lambda g: L.tgp_margin_contrastive_loss(  # noqa: E731
      prototypes=jnp.asarray(protos), labels=jnp.asarray(labels), global_prototypes=g,
      margin=100.0)
  value, grad = jax.value_and_grad(fn)(jnp.asarray(generated))
  assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(float(value), _tgp_numpy(protos, labels, generated, 100.0,
                                                      np.ones(2)), rtol=1e-5)


def test_nearest_prototype_scores_skip_absent_classes():
  h = jnp.asarray([[0.0, 0.0], [5.0, 5.0]])
  protos = jnp.asarray([[0.1, 0.0], [5.0, 5.0], [0.0, 0.0]])
  scores = L.nearest_prototype_scores(h, protos, jnp.asarray([True, True, False]))
  assert np.asarray(jnp.argmax(scores, -1)).tolist() == [0, 1]  # class 2 (exact) is absent
  np.testing.assert_allclose(scores[0, 0], -0.005, rtol=1e-6)


def test_class_sums_by_segment_sum():
  values = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  sums, counts = L.class_sums(values=values, labels=jnp.asarray([2, 0, 2]), num_classes=3,
                              mask=jnp.asarray([True, True, False]))
  np.testing.assert_array_equal(sums, [[3, 4], [0, 0], [1, 2]])
  np.testing.assert_array_equal(counts, [1, 0, 1])
  np.testing.assert_array_equal(L.class_means(sums, counts), [[3, 4], [0, 0], [1, 2]])


def test_adaptive_margin_matches_the_code():
  centres = np.array([[0, 0], [3, 4], [0, 1], [9, 9]], F32)
  present = np.array([True, True, True, False])
  # gaps: class 0 -> 1 (class 2), class 1 -> sqrt(9 + 9) (class 2), class 2 -> 1, class 3
  # (absent) -> the smallest gap 1; max gap sqrt(18).
  margin = fedtgp.adaptive_margin(jnp.asarray(centres), jnp.asarray(present), 100.0)
  np.testing.assert_allclose(float(margin), np.sqrt(18.0), rtol=1e-5)
  assert float(fedtgp.adaptive_margin(jnp.asarray(centres), jnp.asarray(present), 2.0)) == 2.0
  alone = fedtgp.adaptive_margin(jnp.asarray(centres), jnp.asarray([True, False, False, False]),
                                 100.0)
  assert float(alone) == 100.0                    # one class: every gap 1e9, capped


def test_server_sgd_runs_ceil_valid_over_batch_steps_per_epoch():
  valid = jnp.asarray([True, False, True, True, True, False, True])  # 5 valid rows
  rows = jnp.arange(7, dtype=jnp.float32)

  def loss(w, x, mask):  # d/dw = mean of the batch's valid rows: counts the rows seen
    return w * jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

  w, _ = htfl_common.server_sgd_epochs(loss, jnp.zeros(()), (rows,), valid,
                                       key=jax.random.key(0), epochs=1, batch_size=7,
                                       learning_rate=1.0)
  np.testing.assert_allclose(float(w), -np.mean([0, 2, 3, 4, 6]), rtol=1e-6)  # one full batch
  count = lambda w, x, mask: w * jnp.any(mask).astype(jnp.float32)  # noqa: E731
  w, _ = htfl_common.server_sgd_epochs(count, jnp.zeros(()), (rows,), valid,
                                       key=jax.random.key(0), epochs=3, batch_size=2,
                                       learning_rate=1.0)
  assert float(w) == -9.0                          # 3 epochs x ceil(5 / 2) steps


# ------------------------------------------------------------------ tiny federation rounds


def _setup(archs=("a", "a", "b")):
  model = TinyMLP(num_classes=3)
  groups = clients.group_clients(list(archs), [model] * len(archs))
  return api.Setup(groups=groups, num_participants=len(archs), num_classes=3, num_rounds=4,
                   max_sizes={g.name: 6 for g in groups}, private_mean=STATS[0],
                   private_std=STATS[1], public_mean=STATS[0], public_std=STATS[1],
                   max_test_size=6)


def _data(setup, seed=0):
  rng = np.random.default_rng(seed)
  sizes = [6, 4, 5][:setup.num_participants]
  images = [rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8) for n in sizes]
  labels = [np.array([0, 1, 0, 2, 1, 0][:n], np.int32) for n in sizes]
  labels[1] = np.array([1, 1, 2, 2], np.int32)   # client 1 holds no class 0
  groups = {g.name: jax.device_put(clients.stack_group_data(
      g, images, labels, num_participants=setup.num_participants, max_size=6))
      for g in setup.groups}
  test = EvalData(np.stack([np.pad(x, ((0, 6 - len(x)), (0, 0), (0, 0), (0, 0)))
                            for x in images]),
                  np.stack([np.pad(y, (0, 6 - len(y))) for y in labels]),
                  np.asarray(sizes, np.int32))
  return api.FederatedArrays(groups, jnp.zeros((0, 32, 32, 3), jnp.uint8),
                             jax.device_put(test)), images, labels


def _config(method, **fields):
  c = local_sgd(base_config(method), lr=0.05, epochs=1, batch_size=6)
  c.htfl.feature_dim = 0          # TinyMLP's own 4 features (no zoo Classifier to pool)
  c.eval.batch_size = 6
  c.update_from_flattened_dict(fields)
  return c


def _features(state, setup, images):
  """Every participant's TinyMLP features (float64) of its images under the state's params."""
  out = []
  for p, x in enumerate(images):
    group = next(g for g in setup.groups if p in g.clients)
    slot = group.clients.index(p)
    body = state["groups"][group.name]["variables"]["params"]["body"]
    w, b = (np.asarray(body["kernel"][slot], np.float64), np.asarray(body["bias"][slot],
                                                                     np.float64))
    out.append(x.reshape(len(x), -1).astype(np.float64) / 255.0 @ w + b)
  return out


def _logits(state, setup, features):
  out = []
  for p, h in enumerate(features):
    group = next(g for g in setup.groups if p in g.clients)
    slot = group.clients.index(p)
    head = state["groups"][group.name]["variables"]["params"]["head"]
    out.append(h @ np.asarray(head["kernel"][slot], np.float64)
               + np.asarray(head["bias"][slot], np.float64))
  return out


def _class_means_numpy(values, labels, num_classes=3):
  """HtFLlib's agg_func then proto_aggregation: per client class means, then the
  unweighted mean over the clients holding the class."""
  total, holders = np.zeros((num_classes, values[0].shape[1])), np.zeros(num_classes)
  for v, y in zip(values, labels):
    for c in np.unique(y):
      total[c] += v[y == c].mean(0)
      holders[c] += 1
  return total / np.maximum(holders, 1)[:, None], holders > 0


def _run(make, config, setup, data, num_rounds):
  algorithm = make(config, setup)
  round_fn = jax.jit(rounds.make_round_fn(algorithm))
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  history = [state]
  for _ in range(num_rounds):
    state, metrics = round_fn(state, data)
    history.append(state)
  return algorithm, history, metrics


def test_fedproto_round_collects_train_mode_prototypes_and_averages_them():
  setup = _setup()
  data, images, labels = _data(setup)
  _, history, metrics = _run(fedproto.make_fedproto, _config("fedproto"), setup, data, 2)
  # Round 1: one full-batch step per client, the prototypes taken before it (initial params).
  want, present = _class_means_numpy(_features(history[0], setup, images), labels)
  np.testing.assert_allclose(history[1]["global_protos"], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(history[1]["proto_present"], present)
  # Round 2's regulariser, at the round's starting params, against round 1's prototypes.
  feats = _features(history[1], setup, images)
  reg = [np.mean(((h - want[y]) ** 2).mean(-1)) for h, y in zip(feats, labels)]
  got = metrics["local"]
  np.testing.assert_allclose(got["a"]["proto"], reg[:2], rtol=1e-4)
  np.testing.assert_allclose(got["b"]["proto"], reg[2:], rtol=1e-4)


def test_fedproto_size_weighting_is_eq6():
  setup = _setup()
  data, images, labels = _data(setup)
  _, history, _ = _run(fedproto.make_fedproto, _config("fedproto", **{
      "fedproto.weighting": "size"}), setup, data, 1)
  h = np.concatenate(_features(history[0], setup, images))
  y = np.concatenate(labels)
  want = np.stack([h[y == c].mean(0) for c in range(3)])
  np.testing.assert_allclose(history[1]["global_protos"], want, rtol=1e-4, atol=1e-5)


def test_fedproto_evaluates_by_the_nearest_global_prototype():
  setup = _setup()
  data, images, labels = _data(setup)
  algorithm, history, _ = _run(fedproto.make_fedproto, _config("fedproto"), setup, data, 1)
  state = history[1]
  accuracy = jax.jit(algorithm.evaluate)(state, data.test)
  protos, present = np.asarray(state["global_protos"]), np.asarray(state["proto_present"])
  for p, (h, y) in enumerate(zip(_features(state, setup, images), labels)):
    d2 = ((h[:, None, :] - protos[None]) ** 2).mean(-1)
    predicted = np.where(present[None], d2, np.inf).argmin(-1)
    group = next(g for g in setup.groups if p in g.clients)
    row = np.asarray(accuracy[group.name][group.clients.index(p)])
    np.testing.assert_allclose(row[p], 100.0 * np.mean(predicted == y), rtol=1e-5)
    assert np.all(np.isnan(np.delete(row, p)))     # eval_domains="own": other splits not run
  everywhere = fedproto.make_fedproto(_config("fedproto", **{"htfl.eval_domains": "all"}), setup)
  assert np.all(np.isfinite(np.asarray(jax.jit(everywhere.evaluate)(state, data.test)["a"])))


def _assert_own_head_accuracy(algorithm, other, state, setup, data, images, labels):
  """`algorithm.evaluate` gives each client's argmax of its own head (NumPy, float64) on its
  own test split, and `other` (the method's own classifier) differs somewhere."""
  accuracy = jax.jit(algorithm.evaluate)(state, data.test)
  by_other = jax.jit(other.evaluate)(state, data.test)
  differs = False
  for p, (logits, y) in enumerate(zip(_logits(state, setup, _features(state, setup, images)),
                                      labels)):
    group = next(g for g in setup.groups if p in g.clients)
    slot = group.clients.index(p)
    want = 100.0 * np.mean(logits.argmax(-1) == y)
    np.testing.assert_allclose(np.asarray(accuracy[group.name][slot])[p], want, rtol=1e-5)
    differs |= float(by_other[group.name][slot][p]) != want
  assert differs   # the two classifiers disagree somewhere on this federation


@pytest.mark.parametrize("method", ["fedproto", "fedtgp"])
def test_the_head_classifier_evaluates_each_clients_own_logits(method):
  """`classifier="head"`: each client's argmax of its own head on its own test split, the
  training unchanged (the same state as the prototype classifier's run)."""
  make = {"fedproto": fedproto.make_fedproto, "fedtgp": fedtgp.make_fedtgp}[method]
  setup = _setup()
  data, images, labels = _data(setup)
  # FedTGP's round with 2 server epochs: the program of test_three_rounds_give_the_recorded_state.
  fields = {"fedtgp.server_epochs": 2} if method == "fedtgp" else {}
  _, history, _ = _run(make, _config(method, **fields), setup, data, 1)
  algorithm, head_history, _ = _run(
      make, _config(method, **fields, **{f"{method}.classifier": "head"}), setup, data, 1)
  chex.assert_trees_all_equal(history[1], head_history[1])
  _assert_own_head_accuracy(algorithm, make(_config(method, **fields), setup), head_history[1],
                            setup, data, images, labels)


@pytest.mark.parametrize("method", ["lg_fedavg", "fedgh"])
def test_the_local_head_evaluates_each_clients_trained_head(method):
  """`classifier="local"`: each client's argmax with its own head after local training (the
  global head otherwise), the training unchanged."""
  make = {"lg_fedavg": lg_fedavg.make_lg_fedavg, "fedgh": lg_fedavg.make_fedgh}[method]
  setup = _setup()
  data, images, labels = _data(setup)
  fields = {"local.lr": 0.5}          # heads far enough apart to predict differently
  algorithm, history, _ = _run(make, _config(method, **fields,
                                             **{f"{method}.classifier": "local"}),
                               setup, data, 2)
  _, plain_history, _ = _run(make, _config(method, **fields), setup, data, 2)
  chex.assert_trees_all_equal(history[-1], plain_history[-1])
  _assert_own_head_accuracy(algorithm, make(_config(method, **fields), setup), history[-1],
                            setup, data, images, labels)


def test_fd_round_averages_train_mode_logits_per_class_and_distils():
  setup = _setup()
  data, images, labels = _data(setup)
  _, history, metrics = _run(fd.make_fd, _config("fd"), setup, data, 2)
  logits0 = _logits(history[0], setup, _features(history[0], setup, images))
  want, present = _class_means_numpy(logits0, labels)
  np.testing.assert_allclose(history[1]["global_logits"], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(history[1]["logit_present"], present)
  logits1 = _logits(history[1], setup, _features(history[1], setup, images))
  kd = [np.mean(-(want[y] * _log_softmax(z)).sum(-1)) for z, y in zip(logits1, labels)]
  np.testing.assert_allclose(metrics["local"]["a"]["distill"], kd[:2], rtol=1e-4)
  np.testing.assert_allclose(metrics["local"]["b"]["distill"], kd[2:], rtol=1e-4)


def test_fedtgp_round_trains_global_prototypes_with_the_adaptive_margin():
  setup = _setup()
  data, images, labels = _data(setup)
  config = _config("fedtgp", **{"fedtgp.server_epochs": 2, "fedtgp.server_batch_size": 4})
  _, history, metrics = _run(fedtgp.make_fedtgp, config, setup, data, 1)
  state = history[1]
  # Client prototypes: eval-mode features of the TRAINED models (collect_protos).
  centres, present = _class_means_numpy(_features(state, setup, images), labels)
  dist = np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1)) + np.diag([np.inf] * 3)
  np.testing.assert_allclose(float(metrics["server"]["margin"]),
                             min(dist.min(1).max(), 100.0), rtol=1e-4)
  assert np.all(np.asarray(state["proto_present"]))
  generated = fedtgp.TrainableGlobalPrototypes(3, 4, 4).apply({"params": state["tgp"]})
  np.testing.assert_allclose(state["global_protos"], generated, rtol=1e-6)
  assert not np.allclose(state["tgp"]["embedding"], history[0]["tgp"]["embedding"])


def _heads(state, setup):
  """{participant: (kernel, bias)} of every client's own head (float64)."""
  out = {}
  for g in setup.groups:
    head = state["groups"][g.name]["variables"]["params"]["head"]
    for slot, p in enumerate(g.clients):
      out[p] = (np.asarray(head["kernel"][slot], np.float64),
                np.asarray(head["bias"][slot], np.float64))
  return out


def test_lg_fedavg_averages_the_heads_by_training_size():
  setup = _setup()
  data, images, labels = _data(setup)
  algorithm, history, _ = _run(lg_fedavg.make_lg_fedavg, _config("lg_fedavg"), setup, data, 2)
  # Round 1 starts every client from participant 0's initial head.
  first = history[0]["groups"]["a"]["variables"]["params"]["head"]
  np.testing.assert_array_equal(history[0]["head"]["kernel"], first["kernel"][0])
  for state in history[1:]:
    heads, sizes = _heads(state, setup), np.array([6, 4, 5], np.float64)
    want_w = sum(n * heads[p][0] for p, n in enumerate(sizes)) / sizes.sum()
    want_b = sum(n * heads[p][1] for p, n in enumerate(sizes)) / sizes.sum()
    np.testing.assert_allclose(state["head"]["kernel"], want_w, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state["head"]["bias"], want_b, rtol=1e-5, atol=1e-7)
  # Evaluation: each client's own features with the global head.
  state = history[-1]
  accuracy = jax.jit(algorithm.evaluate)(state, data.test)
  w, b = np.asarray(state["head"]["kernel"]), np.asarray(state["head"]["bias"])
  for p, (h, y) in enumerate(zip(_features(state, setup, images), labels)):
    group = next(g for g in setup.groups if p in g.clients)
    got = np.asarray(accuracy[group.name][group.clients.index(p)])[p]
    np.testing.assert_allclose(got, 100.0 * np.mean((h @ w + b).argmax(-1) == y), rtol=1e-5)


def test_fedgh_trains_the_global_head_on_the_uploaded_prototypes():
  setup = _setup()
  data, images, labels = _data(setup)
  config = _config("fedgh", **{"fedgh.server_batch_size": 64, "fedgh.server_lr": 0.5})
  _, history, _ = _run(lg_fedavg.make_fedgh, config, setup, data, 1)
  state = history[1]
  # The uploaded pairs: every client's class means of its trained model's features.
  protos, ys = [], []
  for h, y in zip(_features(state, setup, images), labels):
    for c in np.unique(y):
      protos.append(h[y == c].mean(0))
      ys.append(c)
  protos, ys = np.stack(protos), np.array(ys)
  w0 = np.asarray(history[0]["head"]["kernel"], np.float64)
  b0 = np.asarray(history[0]["head"]["bias"], np.float64)
  # One epoch, one full batch: one SGD step on the mean cross-entropy.
  delta = np.exp(_log_softmax(protos @ w0 + b0)) - np.eye(3)[ys]
  want_w = w0 - 0.5 * protos.T @ delta / len(ys)
  want_b = b0 - 0.5 * delta.mean(0)
  np.testing.assert_allclose(state["head"]["kernel"], want_w, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(state["head"]["bias"], want_b, rtol=1e-4, atol=1e-6)


def _fedkd_round_recording_copies(monkeypatch, **fields):
  """One eager FedKD round of the tiny federation: (state0, state1, metrics, the trained
  mentee copies of the 3 clients stacked, before any upload)."""
  setup = _setup()
  data, _, _ = _data(setup)
  copies = []
  train = fedkd.local.train_clients

  def recording(*args, **kwargs):
    trained, metrics = train(*args, **kwargs)
    copies.append(trained["params"]["mentee"])
    return trained, metrics

  monkeypatch.setattr(fedkd.local, "train_clients", recording)
  algorithm = fedkd.make_fedkd(_config("fedkd", **fields), setup)
  state0 = rounds.initial_state(algorithm, jax.random.key(0), data)
  state1, metrics = rounds.make_round_fn(algorithm)(state0, data)   # eager: copies concrete
  stacked = jax.tree_util.tree_map(lambda *x: np.concatenate(x), *copies)   # 3 clients
  return state0, state1, metrics, stacked


def test_fedkd_averages_the_mentee_copies_and_keeps_w_h_local(monkeypatch):
  state0, state1, metrics, stacked = _fedkd_round_recording_copies(
      monkeypatch, **{"fedkd.compression": "none"})
  want = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64).mean(0), stacked)
  jax.tree_util.tree_map(lambda got, w: np.testing.assert_allclose(got, w, rtol=1e-5,
                                                                   atol=1e-7),
                         state1["mentee"], want)
  assert not np.allclose(state1["mentee"]["head"]["kernel"], state0["mentee"]["head"]["kernel"])
  w_h = np.asarray(state1["groups"]["a"]["w_h"])
  assert not np.allclose(w_h, state0["groups"]["a"]["w_h"]) and not np.allclose(w_h[0], w_h[1])
  assert np.all(np.isfinite(np.asarray(metrics["local"]["a"]["mentee"])))


def _code_truncation(w, energy):
  """HtFLlib's FedKD truncation of one parameter in torch layout, by hand in NumPy float32:
  (received parameter, floats sent)."""
  w = np.asarray(w, np.float32)
  if w.ndim < 2 or w.shape[0] <= 1:
    return w, w.size
  u, s, vt = np.linalg.svd(w, full_matrices=False)          # batched over leading axes
  with np.errstate(over="ignore"):                          # the saturated case: inf
    per_position = np.square(s).reshape(-1, s.shape[-1]).sum(0)
  if per_position.sum() == 0:
    return w, w.size
  rank = 0
  for k in range(per_position.size):                        # k = n is never tried
    if per_position[:k].sum() > energy * per_position.sum():
      rank = k
      break
  received = (u[..., :rank] * s[..., None, :rank]) @ vt[..., :rank, :]
  matrices = int(np.prod(w.shape[:-2]))
  return received, matrices * rank * (w.shape[-2] + w.shape[-1] + 1)


def _flax_to_torch(x):
  return np.transpose(x, (3, 2, 0, 1)) if x.ndim == 4 else (x.T if x.ndim == 2 else x)


@pytest.mark.parametrize("energy", [0.95, 0.98, 0.5])
@pytest.mark.parametrize("shape", [(20, 6), (6, 20), (5, 5, 3, 4), (3, 3, 2, 8), (7,), (9, 1)])
def test_svd_truncation_matches_the_codes_rule(shape, energy):
  rng = np.random.default_rng(sum(shape))
  # A decaying spectrum, so that the rank lands inside (not at the code's edge).
  x = rng.normal(size=shape).astype(np.float32)
  if len(shape) == 2 and min(shape) > 1:
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    x = ((u * (0.5 ** np.arange(min(shape)))) @ vt).astype(np.float32)
  got, sent = jax.jit(fedkd.svd_truncate)(jnp.asarray(x), jnp.float32(energy))
  want, want_sent = _code_truncation(_flax_to_torch(x), energy)
  np.testing.assert_allclose(_flax_to_torch(np.asarray(got)), want, rtol=1e-4, atol=1e-5)
  assert float(sent) == want_sent


def test_svd_truncation_zeroes_a_flat_spectrum_and_keeps_zeros_and_vectors():
  q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(8, 8)))
  flat = (3.0 * q[:, :4]).astype(np.float32)          # four equal singular values
  got, sent = fedkd.svd_truncate(jnp.asarray(flat), jnp.float32(0.95))
  want, want_sent = _code_truncation(flat.T, 0.95)
  assert want_sent == 0 and not np.any(want)          # the code's edge: nothing kept
  assert float(sent) == 0 and not np.any(np.asarray(got))
  zeros = jnp.zeros((3, 3, 2, 4))
  got, sent = fedkd.svd_truncate(zeros, jnp.float32(0.95))
  assert float(sent) == zeros.size and not np.any(np.asarray(got))
  # Saturated: the squared singular values overflow float32 to inf in both.
  huge = jnp.asarray(np.random.default_rng(1).normal(size=(6, 4)) * 1e20, jnp.float32)
  got, sent = fedkd.svd_truncate(huge, jnp.float32(0.95))
  want, want_sent = _code_truncation(np.asarray(huge).T, 0.95)
  assert float(sent) == want_sent == 0 and not np.any(np.asarray(got))


def test_energy_share_rises_from_t_start_as_the_code_updates_it():
  np.testing.assert_allclose([float(fedkd.energy_share(r, 100, 0.95, 0.98))
                              for r in (0, 1, 50, 99)],
                             [0.95, 0.9503, 0.965, 0.9797], rtol=0, atol=1e-6)


def test_fedkd_with_svd_averages_the_truncated_copies_and_truncates_the_mean(monkeypatch):
  state0, state1, metrics, stacked = _fedkd_round_recording_copies(
      monkeypatch, **{"fedkd.compression": "svd", "fedkd.energy_start": 0.6,
                      "fedkd.energy_end": 0.9})
  energy = 0.6                                                      # round 0: T_start
  leaves = jax.tree_util.tree_leaves(stacked)
  mean, up = [], 0
  for leaf in leaves:
    received = []
    for c in range(3):
      r, n = _code_truncation(_flax_to_torch(np.asarray(leaf[c])), energy)
      received.append(r)
      up += n
    mean.append(np.mean(received, axis=0))
  want, down = [], 0
  for m in mean:
    r, n = _code_truncation(m, energy)
    want.append(r)
    down += 3 * n
  got = jax.tree_util.tree_leaves(state1["mentee"])
  for g, w in zip(got, want):
    np.testing.assert_allclose(_flax_to_torch(np.asarray(g)), w, rtol=1e-4, atol=1e-5)
  server = metrics["server"]
  assert float(server["bytes_up"]) == 4 * up and float(server["bytes_down"]) == 4 * down
  full = sum(x.size for x in jax.tree_util.tree_leaves(state0["mentee"]))
  assert 0 < up < 3 * full                      # truncated: fewer floats than the whole copies


@pytest.mark.parametrize("method", ["fedproto", pytest.param("fd", marks=pytest.mark.slow),
                                    pytest.param("lg_fedavg", marks=pytest.mark.slow)])
def test_clients_one_after_another_equal_the_vmapped_clients(method):
  """htfl.client_loop "map" (each client only its own steps) trains the same models as
  "vmap" (every client as many steps as the group's largest, the rest masked): batch 2 over
  sizes 6 / 4 / 5 gives 3 / 2 / 3 steps an epoch, two epochs."""
  setup = _setup()
  data, _, _ = _data(setup)
  states = {}
  for loop in ("map", "vmap"):
    config = _config(method, **{"htfl.client_loop": loop, "local.batch_size": 2,
                                "local.epochs": 2})
    assert htfl_common.client_loop(config) == loop
    _, history, _ = _run(MAKERS[method], config, setup, data, 2)
    states[loop] = history[-1]
  chex.assert_trees_all_close(states["map"], states["vmap"], rtol=1e-5, atol=1e-6)
  c = _config(method)
  c.htfl.client_loop = "threads"
  with pytest.raises(ValueError, match=r"htfl.client_loop.*'auto', 'vmap', 'map'"):
    validate_config(c)


@pytest.mark.parametrize("make,method", [(fedproto.make_fedproto, "fedproto"),
                                         (fd.make_fd, "fd"), (fedtgp.make_fedtgp, "fedtgp"),
                                         (lg_fedavg.make_lg_fedavg, "lg_fedavg"),
                                         (lg_fedavg.make_fedgh, "fedgh"),
                                         (fedkd.make_fedkd, "fedkd")])
def test_round_is_traced_once(make, method):
  setup = _setup()
  data, _, _ = _data(setup)
  # FedTGP's 2 server epochs: the program of test_three_rounds_give_the_recorded_state.
  config = _config(method, **({"fedtgp.server_epochs": 2} if method == "fedtgp" else {}))
  algorithm = make(config, setup)
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  chex.clear_trace_counter()
  step = jax.jit(chex.assert_max_traces(rounds.make_round_fn(algorithm), n=1))
  for _ in range(3):  # a second trace would raise AssertionError
    state, metrics = step(state, data)
    for leaf in jax.tree_util.tree_leaves(metrics):
      assert np.all(np.isfinite(np.asarray(leaf)))


#: (method, field, a bad value, what the message must name).
BAD_VALUES = (
    ("fedproto", "fedproto.weighting", "median", r"fedproto.weighting.*'uniform', 'size'"),
    ("fedproto", "fedproto.classifier", "logits", r"fedproto.classifier.*'prototype', 'head'"),
    ("fedtgp", "fedtgp.classifier", "logits", r"fedtgp.classifier.*'prototype', 'head'"),
    ("lg_fedavg", "lg_fedavg.classifier", "mine", r"lg_fedavg.classifier.*'global', 'local'"),
    ("fedgh", "fedgh.classifier", "mine", r"fedgh.classifier.*'global', 'local'"),
    ("fedkd", "fedkd.compression", "pca", r"fedkd.compression.*'svd', 'none'"),
    ("fedkd", "fedkd.energy_end", 1.5, r"fedkd.energy_end.*\[0, 1\]"),
    ("fd", "fd.target", "probabilities", r"fd.target.*'logits', 'softmax'"),
    ("fedtgp", "htfl.eval_domains", "some", r"htfl.eval_domains.*'own', 'all'"),
)


def test_bad_config_values_name_the_field():
  for method, field, value, message in BAD_VALUES:
    c = base_config(method)
    c.update_from_flattened_dict({field: value})
    with pytest.raises(ValueError, match=message):
      validate_config(c)
  wide = clients.group_clients(["a", "b"], [TinyMLP(num_classes=3), TinyWide(num_classes=3)])
  setup = api.Setup(groups=wide, num_participants=2, num_classes=3, num_rounds=1,
                    max_sizes={"a": 6, "b": 6}, private_mean=STATS[0], private_std=STATS[1],
                    public_mean=STATS[0], public_std=STATS[1], max_test_size=6)
  with pytest.raises(ConfigError, match=r"config.htfl.feature_dim must be an integer >= 1"):
    htfl_common.feature_setup(_config("fedproto"), setup)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedproto", "fd", "fedtgp", "lg_fedavg", "fedgh",
                                    "fedkd"])
def test_quick_config_trains_end_to_end(method, tmp_path, monkeypatch):
  data_dir = "/work/shared/data"
  import os  # pylint: disable=import-outside-toplevel
  if not os.path.exists(os.path.join(data_dir, "cifar10.npz")):
    pytest.skip("cifar10.npz not found")
  from fedjax_het.config import load_module  # pylint: disable=import-outside-toplevel
  from fedjax_het.train import train_and_evaluate  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("FEDJAX_HET_DATA_DIR", data_dir)
  c = load_module("fedjax_het/configs/htfl.py").get_config(
      f"cifar10_practical_htfe2_{method}_quick")
  c.num_rounds = 1
  c.compilation_cache_dir = ""
  c.logging.plots = False
  train_and_evaluate(c, str(tmp_path))
  results = json.loads((tmp_path / "results.json").read_text())
  assert 0.0 <= results["intra"]["AVG"] <= 100.0


# Three rounds of each method on the tiny federation (`_setup`, `_data`, `_config`; FedTGP with
# 2 server epochs), its final state's floating leaves summed in float64: the plain sum, the
# sum weighted by 1 + (flat index mod 7) and the sum of magnitudes, recorded on a 2-core x86
# CPU with each method's round written out in its own module. The shared skeleton of
# htfl_common (LocalPhase, train_collecting, weighted_tree_mean, prototype_loss_for) gives
# the same state bit for bit there; the check allows 1e-5 of the magnitude sum for other
# CPUs' rounding (three rounds of training on an AVX2-only x86 core, against the AVX-512 core
# of the record, move FedTGP's sums by up to 2.2e-6 of it).
STATE_FINGERPRINTS = {
    "fedproto": (962366.5774364155, 3861214.1044923887, 2761759.086406572),
    "fd": (214.1221583898432, 792.2938161579148, 873.3313225932422),
    "fedtgp": (1194032.256032858, 4793632.476347517, 6194209.387742652),
    "lg_fedavg": (-0.7110858091286332, -7.865425406451891, 583.4342025038468),
    "fedgh": (3.227231055393304, 8.037016516839685, 583.6019710558037),
    "fedkd": (11.090363920288667, 38.637553753089094, 765.4301091308424),
}
MAKERS = {"fedproto": fedproto.make_fedproto, "fd": fd.make_fd, "fedtgp": fedtgp.make_fedtgp,
          "lg_fedavg": lg_fedavg.make_lg_fedavg, "fedgh": lg_fedavg.make_fedgh,
          "fedkd": fedkd.make_fedkd}


@pytest.mark.parametrize("method", sorted(STATE_FINGERPRINTS))
def test_three_rounds_give_the_recorded_state(method):
  setup = _setup()
  data, _, _ = _data(setup)
  config = _config(method, **({"fedtgp.server_epochs": 2} if method == "fedtgp" else {}),
                   **({"fedkd.compression": "none"} if method == "fedkd" else {}))
  _, history, _ = _run(MAKERS[method], config, setup, data, 3)
  leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(history[-1])
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
  got = (sum(float(np.sum(x)) for x in leaves),
         sum(float(np.sum(x * (1 + np.arange(x.size) % 7))) for x in leaves),
         sum(float(np.sum(np.abs(x))) for x in leaves))
  want = STATE_FINGERPRINTS[method]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * want[2])

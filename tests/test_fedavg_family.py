"""MOON, FedProc, FedRS on tiny clients: hand-computed local steps, state updates, end to end."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fedavg, fedproc, fedrs, moon
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import rounds
from fedjax_het.train import train_and_evaluate
from tests.test_fedavg import tiny_digits_config
from tests.tiny_federation import LR, SIZES, flat_inputs, tiny_config, tiny_data, tiny_setup
from tests.tiny_models import TinyMLP

MAKE = {"fedavg": fedavg.make_fedavg, "moon": moon.make_moon, "fedproc": fedproc.make_fedproc,
        "fedrs": fedrs.make_fedrs}


_setup, _config = tiny_setup, tiny_config


def _data(setup, labels=None, seed=0):
  data, images, labels = tiny_data(setup, labels, seed)
  return data, flat_inputs(images), labels


def _allclose(got, want, rtol=1e-5, atol=1e-6):
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol),
                         got, want)


def _sgd(params, grads):
  return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)


def _row(tree, i):
  return jax.tree_util.tree_map(lambda v: v[i], tree)


# Hand-written forward passes and losses (no fedjax_het.losses), on flattened inputs.

def _dense(p, x):
  return x @ p["kernel"] + p["bias"][None, :]


def _mlp(p, x):
  h = _dense(p["body"], x)
  return h, _dense(p["head"], h)


def _linear_logits(p, x):
  return _dense(p["head"], x)


def _ce(logits, y):
  return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(len(y)), y])


def _cos(a, b):
  return jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))


@jax.jit
def _moon_hand_grad(p, x, y, z_glob, z_prev, mu, tau):
  """d/dp of CE + mu * l_con with the frozen features z_glob (positive) and z_prev (negative)."""
  def objective(p):
    z, logits = _mlp(p, x)
    pos, neg = _cos(z, z_glob) / tau, _cos(z, z_prev) / tau
    return _ce(logits, y) + mu * jnp.mean(-pos + jnp.logaddexp(pos, neg))
  return jax.grad(objective)(p)


@jax.jit
def _restricted_hand_grad(p, x, y, scale):
  """d/dp of CE on the linear logits with column c multiplied by scale[c]."""
  return jax.grad(lambda p: _ce(_linear_logits(p, x) * scale[None, :], y))(p)


def test_moon_local_step_is_the_hand_gradient_of_ce_plus_mu_contrastive():
  mu, tau = 0.8, 0.5
  setup = _setup(2, TinyMLP())
  config = _config("moon", **{"moon.mu": mu, "moon.temperature": tau})
  algorithm = moon.make_moon(config, setup)
  data, inputs, labels = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  w = state["server"]["params"]
  # Previous local models that differ from the global one (and from each other).
  noise = jax.tree_util.tree_map(lambda v: 0.05 * jax.random.normal(jax.random.key(7), v.shape),
                                 state["groups"]["a"]["previous"])
  state["groups"]["a"]["previous"] = jax.tree_util.tree_map(
      lambda v, n: v + n, state["groups"]["a"]["previous"], noise)
  new, metrics = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(1))

  want, ce_only = [], []
  for k in range(2):
    x, y = inputs[k], jnp.asarray(labels[k])
    previous = _row(state["groups"]["a"]["previous"]["params"], k)
    z_glob, z_prev = _mlp(w, x)[0], _mlp(previous, x)[0]
    want.append(_sgd(w, _moon_hand_grad(w, x, y, z_glob, z_prev, mu, tau)))
    ce_only.append(_sgd(w, _moon_hand_grad(w, x, y, z_glob, z_prev, 0.0, tau)))
    # A sampled client's previous model is now its new local model.
    _allclose(_row(new["groups"]["a"]["previous"]["params"], k), want[k])
  total = SIZES[0] + SIZES[1]
  _allclose(new["server"]["params"],
            jax.tree_util.tree_map(lambda a, b: (SIZES[0] * a + SIZES[1] * b) / total, *want))
  # The contrastive term changed the step (the check above is not CE alone).
  assert not np.allclose(want[0]["body"]["kernel"], ce_only[0]["body"]["kernel"], atol=1e-6)
  assert np.all(np.asarray(metrics["local"]["a"]["contrastive"]) > 0)


def test_moon_only_sampled_clients_replace_their_previous_model():
  setup = _setup(3)
  algorithm = moon.make_moon(_config("moon", **{"fedavg.clients_per_round": 1}), setup)
  data, _, _ = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  # Before any participation the previous model is the initial global model.
  for slot in range(3):
    _allclose(_row(state["groups"]["a"]["previous"], slot), state["server"], rtol=0, atol=0)
  round_fn = jax.jit(algorithm.round)
  seen = set()
  for r in range(6):
    new, metrics = round_fn(state, data, jax.random.key(20 + r), jnp.int32(r))
    sampled = np.flatnonzero(np.asarray(metrics["local"]["a"]["participated"]))
    assert len(sampled) == 1
    seen.add(int(sampled[0]))
    for slot in range(3):
      got = _row(new["groups"]["a"]["previous"], slot)
      if slot == sampled[0]:  # one client and server SGD(1): the server model is its model
        _allclose(got, new["server"], rtol=1e-6, atol=1e-6)
      else:
        _allclose(got, _row(state["groups"]["a"]["previous"], slot), rtol=0, atol=0)
    state = new
  assert seen == {0, 1, 2}


def test_fedproc_prototypes_are_the_cohort_average_of_per_class_mean_features():
  setup = _setup(3, TinyMLP())
  # Class 2 is held by nobody; class 1 by everyone; padding rows (label 0) must not count.
  labels = [[0, 1, 0, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0, 0]]
  config = _config("fedproc", **{"fedavg.clients_per_round": 2, "fedavg.evaluate": "local"})
  algorithm = fedproc.make_fedproc(config, setup)
  data, inputs, labels = _data(setup, labels)
  state = algorithm.init(jax.random.key(0), data)
  assert not np.any(state["prototypes"]["mask"])
  round_fn = jax.jit(algorithm.round)
  for r, key in enumerate((3, 4)):
    new, metrics = round_fn(state, data, jax.random.key(key), jnp.int32(r))
    cohort = np.flatnonzero(np.asarray(metrics["local"]["a"]["participated"]))
    assert len(cohort) == 2
    sums, holders = np.zeros((3, 4)), np.zeros(3)
    for k in cohort:
      trained = _row(new["groups"]["a"]["variables"]["params"], k)  # the client's new model
      h = np.asarray(_mlp(trained, inputs[k])[0], np.float64)
      for c in set(labels[k].tolist()):
        sums[c] += h[labels[k] == c].mean(axis=0)
        holders[c] += 1
    want = sums / np.maximum(holders, 1)[:, None]
    np.testing.assert_array_equal(new["prototypes"]["mask"], holders > 0)
    np.testing.assert_allclose(new["prototypes"]["vectors"], want, rtol=1e-5, atol=1e-6)
    assert float(metrics["server"]["prototype_classes"]) == np.sum(holders > 0)
    state = new


def test_fedproc_alpha_schedule():
  np.testing.assert_allclose([fedproc.linear_alpha(r, 5) for r in range(5)],
                             [1.0, 0.75, 0.5, 0.25, 0.0])
  assert float(fedproc.linear_alpha(0, 1)) == 1.0  # E = 1: no division by zero
  setup = _setup(2, TinyMLP(), num_rounds=4)
  data, _, _ = _data(setup)
  for schedule, want in (("linear", 1.0 - 2.0 / 3.0), ("constant", 0.3)):
    algorithm = fedproc.make_fedproc(
        _config("fedproc", **{"fedproc.alpha_schedule": schedule, "fedproc.alpha": 0.3}), setup)
    round_fn = jax.jit(algorithm.round)
    state = algorithm.init(jax.random.key(0), data)
    state, _ = round_fn(state, data, jax.random.key(1), jnp.int32(0))  # prototypes
    _, metrics = round_fn(state, data, jax.random.key(2), jnp.int32(2))
    np.testing.assert_allclose(metrics["local"]["a"]["alpha"], [want, want], rtol=1e-6)


def test_fedproc_round_zero_is_cross_entropy_only():
  setup = _setup(2, TinyMLP())
  data, _, _ = _data(setup)
  key = jax.random.key(5)
  avg = fedavg.make_fedavg(_config("fedavg", **{"local.epochs": 2}), setup)
  want, _ = jax.jit(avg.round)(avg.init(jax.random.key(0), data), data, key, jnp.int32(0))
  proc = fedproc.make_fedproc(_config("fedproc", **{"local.epochs": 2}), setup)
  got, metrics = jax.jit(proc.round)(proc.init(jax.random.key(0), data), data, key,
                                     jnp.int32(0))
  _allclose(got["server"], want["server"], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(metrics["local"]["a"]["alpha"], [0.0, 0.0])
  assert np.all(np.asarray(got["prototypes"]["mask"]))  # random labels: all 3 classes held


def test_fedrs_restricts_each_clients_own_missing_classes():
  # Client 0 holds {0, 1}; client 1 holds {1, 2} (its padding rows are labelled 0).
  np.testing.assert_array_equal(fedrs.class_presence(jnp.array([0, 1, 1, 0, 0, 1]), 6, 3),
                                [True, True, False])
  np.testing.assert_array_equal(fedrs.class_presence(jnp.array([1, 2, 1, 2, 0, 0]), 4, 3),
                                [False, True, True])
  alpha = 0.5
  setup = _setup(2)
  labels = [[0, 1, 1, 0, 0, 1], [1, 2, 1, 2]]
  config = _config("fedrs", **{"fedrs.alpha": alpha, "fedavg.evaluate": "local"})
  algorithm = fedrs.make_fedrs(config, setup)
  data, inputs, labels = _data(setup, labels)
  state = algorithm.init(jax.random.key(0), data)
  new, _ = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  w = state["server"]["params"]
  for k, scale in enumerate(([1.0, 1.0, alpha], [alpha, 1.0, 1.0])):
    x, y = inputs[k], jnp.asarray(labels[k])
    want = _sgd(w, _restricted_hand_grad(w, x, y, jnp.asarray(scale)))
    _allclose(_row(new["groups"]["a"]["variables"]["params"], k), want)
    plain = _sgd(w, _restricted_hand_grad(w, x, y, jnp.ones(3)))
    assert not np.allclose(plain["head"]["kernel"], want["head"]["kernel"], atol=1e-6)


def test_fedrs_count_form_scales_each_logit_by_the_clients_class_frequency():
  # The FedRS authors' code: scale_c = alpha + (1 - alpha) n_c / max n (counts 4, 1, 0).
  counts = fedrs.class_counts(jnp.array([0, 0, 1, 0, 0, 2, 2]), 5, 3)
  np.testing.assert_array_equal(counts, [4.0, 1.0, 0.0])
  np.testing.assert_allclose(fedrs.count_scale(counts, 0.5), [1.0, 0.625, 0.5])
  alpha = 0.5
  setup = _setup(2)
  labels = [[0, 1, 1, 0, 0, 1], [1, 2, 1, 2]]
  config = _config("fedrs", **{"fedrs.alpha": alpha, "fedrs.form": "count",
                               "fedavg.evaluate": "local"})
  algorithm = fedrs.make_fedrs(config, setup)
  data, inputs, labels = _data(setup, labels)
  state = algorithm.init(jax.random.key(0), data)
  new, _ = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  w = state["server"]["params"]
  for k, scale in enumerate(([1.0, 1.0, alpha], [alpha, 1.0, 1.0])):  # equal counts -> 1
    x, y = inputs[k], jnp.asarray(labels[k])
    _allclose(_row(new["groups"]["a"]["variables"]["params"], k),
              _sgd(w, _restricted_hand_grad(w, x, y, jnp.asarray(scale))))
  # Unequal counts: client 0 with labels (0, 0, 0, 1) scales class 1 by 0.5 + 0.5 / 3.
  np.testing.assert_allclose(fedrs.count_scale(fedrs.class_counts(jnp.array([0, 0, 0, 1]), 4, 3),
                                               alpha), [1.0, 0.5 + 0.5 / 3, 0.5], rtol=1e-6)


@pytest.mark.parametrize("method", ["fedavg", "moon", "fedproc", "fedrs"])
def test_bytes_are_cohort_size_times_the_variables_sent(method):
  setup = _setup(3, TinyMLP())
  algorithm = MAKE[method](_config(method, **{"fedavg.clients_per_round": 2}), setup)
  data, _, _ = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  _, metrics = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  model = sum(np.asarray(v).nbytes for v in jax.tree_util.tree_leaves(state["server"]))
  assert model == 4 * (3072 * 4 + 4 + 4 * 3 + 3)
  extra = 3 * 4 * 4 if method == "fedproc" else 0  # C x d float32 prototypes
  assert float(metrics["server"]["bytes_up"]) == 2 * (model + extra)
  assert float(metrics["server"]["bytes_down"]) == 2 * (model + extra)


def test_family_configs_validate_and_reject_bad_fields():
  for method in ("moon", "fedproc", "fedrs"):
    validate_config(base_config(method))
  cases = [("moon", "moon.temperature", 0.0, r"config.moon.temperature must be a number > 0"),
           ("moon", "moon.mu", -1.0, r"config.moon.mu must be a number >= 0"),
           ("fedproc", "fedproc.alpha_schedule", "cosine",
            r"config.fedproc.alpha_schedule must be one of \('linear', 'constant'\)"),
           ("fedproc", "fedproc.alpha", 1.5, r"config.fedproc.alpha must be a number in \[0, 1\]"),
           ("fedrs", "fedrs.alpha", 2.0, r"config.fedrs.alpha must be a number in \[0, 1\]")]
  for method, field, value, message in cases:
    config = base_config(method)
    config.update_from_flattened_dict({field: value})
    with pytest.raises(ValueError, match=message):
      validate_config(config)


@pytest.mark.parametrize("method", ["moon", "fedproc", "fedrs"])
def test_digits_family_member_trains_end_to_end_with_one_trace(method, tmp_path,
                                                              tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  make_round_fn, guarded = rounds.make_round_fn, []

  def make_guarded_round_fn(algorithm):  # every round of the run: a second trace raises
    guarded.append(algorithm.name)
    return chex.assert_max_traces(make_round_fn(algorithm), n=1)

  chex.clear_trace_counter()
  monkeypatch.setattr(rounds, "make_round_fn", make_guarded_round_fn)
  # FedProc's alpha = 1, 0.5, 0 takes 3 rounds.
  c = tiny_digits_config(method, num_rounds=3 if method == "fedproc" else 2)
  out = train_and_evaluate(c, tmp_path)
  assert guarded == [method]
  assert [r["round"] for r in out["records"]] == list(range(1, c.num_rounds + 1))
  last = out["records"][-1]
  for name in ("mnist", "usps", "svhn", "syn"):
    assert last[f"train/local/participated/{name}"] == 1.0
    assert np.isfinite(last[f"train/local/loss/{name}"])
  assert last["train/server/bytes_up"] > 0 and last["train/server/bytes_down"] > 0
  if method == "fedproc":
    alphas = [r["train/local/alpha/mnist"] for r in out["records"]]
    assert alphas == [0.0, 0.5, 0.0]  # round 0: no prototypes yet, CE only; then 1 - r/(E-1)
    assert last["train/server/prototype_classes"] > 0
    assert np.isfinite(out["records"][1]["train/local/infonce/mnist"])
  if method == "moon":
    assert np.isfinite(last["train/local/contrastive/mnist"])
  assert 0 <= out["results"]["intra"]["AVG"] <= 100

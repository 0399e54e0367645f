"""FedAvg family on tiny linear clients: rounds against hand-computed averages, end to end."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from fedjax_het.algorithms import fedavg, fedprox
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import api, clients
from fedjax_het.train import train_and_evaluate
from tests.tiny_federation import SIZES, STATS, tiny_config, tiny_data, tiny_setup
from tests.tiny_models import TinyLinear

REPO = pathlib.Path(__file__).resolve().parents[1]
_setup, _config, _data = tiny_setup, tiny_config, tiny_data


def _ce_grad(params, x, y, mu=0.0, anchor=None):
  model = TinyLinear()

  def objective(p):
    loss = losses.softmax_cross_entropy(logits=model.apply({"params": p}, x, train=True)[1],
                                        labels=y)
    if mu:
      loss += 0.5 * mu * sum(jnp.sum((a - b) ** 2) for a, b in
                             zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(anchor)))
    return loss

  return jax.grad(objective)(params)


def _sgd(params, grads, lr):
  return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


@pytest.mark.parametrize("weighting", ["size", "uniform"])
def test_fedavg_round_is_the_weighted_average_of_one_local_step_each(weighting):
  setup = _setup(2)
  algorithm = fedavg.make_fedavg(_config(**{"fedavg.weighting": weighting}), setup)
  data, images, labels = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  new, metrics = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  w = state["server"]["params"]
  locals_ = [_sgd(w, _ce_grad(w, jnp.asarray(images[k], jnp.float32) / 255.0,
                              jnp.asarray(labels[k])), 0.5) for k in range(2)]
  weights = np.array(SIZES[:2], np.float64) if weighting == "size" else np.ones(2)
  weights /= weights.sum()
  want = jax.tree_util.tree_map(lambda a, b: weights[0] * a + weights[1] * b, *locals_)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         new["server"]["params"], want)
  np.testing.assert_array_equal(metrics["local"]["a"]["participated"], [1.0, 1.0])
  assert float(metrics["server"]["cohort_rows"]) == 10.0


def test_fedprox_with_mu_zero_is_fedavg_and_with_mu_adds_the_proximal_gradient():
  setup = _setup(2)
  data, images, labels = _data(setup)
  key = jax.random.key(3)
  avg = fedavg.make_fedavg(_config(**{"local.epochs": 2}), setup)
  state = avg.init(jax.random.key(0), data)
  want, _ = avg.round(state, data, key, jnp.int32(0))
  prox0 = fedprox.make_fedprox(_config("fedprox", **{"local.epochs": 2, "fedprox.mu": 0.0}), setup)
  got, _ = prox0.round(state, data, key, jnp.int32(0))
  jax.tree_util.tree_map(np.testing.assert_array_equal, got["server"], want["server"])

  mu = 0.7
  prox = fedprox.make_fedprox(_config("fedprox", **{"local.epochs": 2, "fedprox.mu": mu}), setup)
  got, metrics = prox.round(state, data, key, jnp.int32(0))
  w = state["server"]["params"]
  locals_ = []
  for k in range(2):  # two full-batch SGD steps on CE + mu/2 ||v - w||^2
    x, y = jnp.asarray(images[k], jnp.float32) / 255.0, jnp.asarray(labels[k])
    v = _sgd(w, _ce_grad(w, x, y, mu, w), 0.5)  # the proximal gradient is 0 at v = w
    v = _sgd(v, _ce_grad(v, x, y, mu, w), 0.5)
    locals_.append(v)
  total = SIZES[0] + SIZES[1]
  want = jax.tree_util.tree_map(lambda a, b: (SIZES[0] * a + SIZES[1] * b) / total, *locals_)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         got["server"]["params"], want)
  assert np.all(np.asarray(metrics["local"]["a"]["proximal"]) > 0)


def test_only_sampled_clients_train_and_keep_their_new_local_model():
  setup = _setup(3)
  config = _config(**{"fedavg.clients_per_round": 1, "fedavg.evaluate": "local"})
  algorithm = fedavg.make_fedavg(config, setup)
  data, _, _ = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  seen = set()
  for r in range(8):
    new, metrics = algorithm.round(state, data, jax.random.key(10 + r), jnp.int32(r))
    took_part = np.flatnonzero(np.asarray(metrics["local"]["a"]["participated"]))
    assert len(took_part) == 1
    seen.update(took_part.tolist())
    old_vars = state["groups"]["a"]["variables"]["params"]["head"]["kernel"]
    new_vars = new["groups"]["a"]["variables"]["params"]["head"]["kernel"]
    for slot in range(3):
      changed = not np.array_equal(old_vars[slot], new_vars[slot])
      assert changed == (slot in took_part)
    # With one client per round and server SGD(1), the server model is that client's model.
    np.testing.assert_allclose(new["server"]["params"]["head"]["kernel"],
                               new_vars[took_part[0]], rtol=1e-6)
    state = new
  assert seen == {0, 1, 2}


def test_fedavg_rejects_heterogeneous_architectures_and_bad_fields():
  config = base_config("fedavg")
  config.models.architectures = ("resnet10", "resnet12")
  with pytest.raises(ValueError, match="config.models.architectures must be one architecture"):
    validate_config(config)
  config = base_config("fedprox")
  config.fedprox.mu = -1.0
  with pytest.raises(ValueError, match=r"config.fedprox.mu must be a number >= 0, got -1.0"):
    validate_config(config)
  config = base_config("fedavg")
  config.server.optimizer = "adagrad"
  with pytest.raises(ValueError, match=r"config.server.optimizer must be one of \('sgd', "
                     r"'momentum', 'adam'\)"):
    validate_config(config)


def tiny_digits_config(method: str, num_rounds: int = 2):
  """`digits.py:<method>_quick` shrunk to four small CNNs, a few dozen images per client and no
  public data: a FedAvg-family run of seconds (no progress bar, TensorBoard or figures)."""
  spec = importlib.util.spec_from_file_location("digits_config",
                                                REPO / "fedjax_het/configs/digits.py")
  digits = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(digits)
  c = digits.get_config(f"{method}_quick")
  c.models.architectures = ("simple_cnn",) * 4
  c.num_rounds = num_rounds
  c.local.epochs = 1
  c.local.batch_size = 16
  c.scenario.public_size = 0
  c.scenario.private_sizes.update({"mnist": 30, "usps": 20, "svhn": 40, "syn": 24})
  c.scenario.test_size = 30
  c.eval.batch_size = 30
  c.logging.progress = False
  c.logging.tensorboard = False
  c.logging.plots = False
  c.compilation_cache_dir = ""
  return c


# Slow: FedProx's run (10-15 s on a 2-core CPU): its round is FedAvg's with the proximal
# gradient, which test_fedprox_with_mu_zero_is_fedavg_and_with_mu_adds_the_proximal_gradient
# checks in the default suite. FedAvg's run (about 20 s):
# test_sampling_is_reproducible_after_a_resume keeps FedAvg end to end (its cohorts and
# accuracies) in the default suite, and test_fedavg_family's MOON, FedProc and FedRS runs train
# this digits config through FedAvg's engine with these checks (every client took part, finite
# losses, results in [0, 100]).
@pytest.mark.parametrize("method", [pytest.param("fedavg", marks=pytest.mark.slow),
                                    pytest.param("fedprox", marks=pytest.mark.slow)])
def test_digits_fedavg_family_trains_end_to_end(method, tmp_path, tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  out = train_and_evaluate(tiny_digits_config(method), tmp_path)
  last = out["records"][-1]
  assert all(last[f"train/local/participated/{n}"] == 1.0 for n in ("mnist", "usps", "svhn", "syn"))
  assert np.isfinite(last["train/local/loss/mnist"])
  assert 0 <= out["results"]["intra"]["AVG"] <= 100


def _scan_operand_shapes(jaxpr):
  """Shapes of every operand of every `scan` in a (closed) jaxpr, recursively."""
  shapes = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      shapes += [tuple(v.aval.shape) for v in eqn.invars if hasattr(v.aval, "shape")]
    for param in eqn.params.values():
      for item in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(item, "jaxpr", item)  # ClosedJaxpr -> Jaxpr
        if hasattr(inner, "eqns"):
          shapes += _scan_operand_shapes(inner)
  return shapes


def test_a_round_with_10_of_1000_clients_trains_a_cohort_axis_of_10():
  k = 1000
  groups = clients.group_clients(["a"] * k, [TinyLinear()] * k)
  setup = api.Setup(groups=groups, num_participants=k, num_classes=3, num_rounds=4,
                    max_sizes={"a": 2}, private_mean=STATS[0], private_std=STATS[1],
                    public_mean=STATS[0], public_std=STATS[1], max_test_size=4)
  config = _config(**{"fedavg.clients_per_round": 10, "local.batch_size": 2})
  algorithm = fedavg.make_fedavg(config, setup)
  rng = np.random.default_rng(0)
  images = [rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8) for _ in range(k)]
  labels = [rng.integers(0, 3, 2).astype(np.int32) for _ in range(k)]
  data = api.FederatedArrays({"a": jax.device_put(clients.stack_group_data(
      groups[0], images, labels, num_participants=k))}, jnp.zeros((0, 32, 32, 3), jnp.uint8), None)
  state = algorithm.init(jax.random.key(0), data)
  jaxpr = jax.make_jaxpr(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  shapes = _scan_operand_shapes(jaxpr.jaxpr)
  assert shapes, "the local phase should be a lax.scan"
  assert any(s and s[0] == 10 for s in shapes)        # the cohort axis
  assert not any(k in s for s in shapes), shapes       # nothing per-client over all 1000


def test_fedadam_server_step_is_optax_adam_on_the_averaged_delta():
  import optax
  setup = _setup(2)
  config = _config(**{"server.optimizer": "adam", "server.lr": 0.1})
  algorithm = fedavg.make_fedavg(config, setup)
  plain = fedavg.make_fedavg(_config(), setup)  # server SGD(1): the new server = the average
  data, _, _ = _data(setup)
  state = algorithm.init(jax.random.key(0), data)
  key = jax.random.key(5)
  averaged, _ = plain.round(state, data, key, jnp.int32(0))
  got, _ = algorithm.round(state, data, key, jnp.int32(0))
  # FedAdam (Reddi et al. 2021) with b1 = 0.9, b2 = 0.99, tau = 1e-3, by hand with optax.
  tx = optax.adam(0.1, b1=0.9, b2=0.99, eps=1e-3)
  delta = jax.tree_util.tree_map(lambda s, a: s - a, state["server"]["params"],
                                 averaged["server"]["params"])
  updates, _ = tx.update(delta, tx.init(state["server"]["params"]), state["server"]["params"])
  want = optax.apply_updates(state["server"]["params"], updates)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                         got["server"]["params"], want)


def test_sampling_is_reproducible_after_a_resume(tmp_path, tmp_path_factory, monkeypatch):
  """A killed many-client run resumes with the same cohorts and the same final numbers."""
  from fedjax_het import reporting
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  c = base_config("fedavg")
  c.name = "resume"
  c.num_rounds = 4
  c.scenario.name = "partitioned"
  c.scenario.dataset = "mnist"
  c.scenario.dataset_source = "synthetic"
  c.scenario.num_clients = 20
  c.scenario.partition = "dirichlet"
  c.scenario.train_size = 400
  c.scenario.test_size = 50
  c.scenario.public_size = 0
  c.models.architectures = ("simple_cnn",)
  c.fedavg.clients_per_round = 3
  c.local.epochs = 1
  c.local.batch_size = 16
  c.eval.batch_size = 50
  c.logging.progress = False
  c.logging.tensorboard = False
  c.logging.plots = False
  c.compilation_cache_dir = ""
  reference = train_and_evaluate(c, tmp_path / "uninterrupted")
  original = reporting.MetricsWriter.write

  def crash_in_round_3(self, record):
    if record["round"] == 3:
      raise KeyboardInterrupt("simulated kill")
    return original(self, record)

  monkeypatch.setattr(reporting.MetricsWriter, "write", crash_in_round_3)
  with pytest.raises(KeyboardInterrupt):
    train_and_evaluate(c, tmp_path / "killed")
  monkeypatch.setattr(reporting.MetricsWriter, "write", original)
  resumed = train_and_evaluate(c, tmp_path / "killed")
  for got, want in zip(resumed["records"], reference["records"]):
    cohort_got = sorted(k for k, v in got.items() if "participated" in k and v == 1.0)
    cohort_want = sorted(k for k, v in want.items() if "participated" in k and v == 1.0)
    assert cohort_got == cohort_want and len(cohort_got) == 3
    np.testing.assert_allclose(got["eval/accuracy/mean"], want["eval/accuracy/mean"], atol=1e-6)

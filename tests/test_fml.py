"""FML: the mutual-learning loss by hand, the meme aggregation, per-participant epochs, a run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fml
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import local
from fedjax_het.errors import ConfigError
from fedjax_het.train import train_and_evaluate
from tests.test_train import tiny_config
from tests.tiny_runs import local_sgd, tiny_public_data, tiny_public_setup


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _dml_numpy(logits, peer, labels, weight, mask):
  logp, logq = _log_softmax(logits), _log_softmax(peer)
  ce = -logp[np.arange(len(labels)), labels]
  kl = (np.exp(logq) * (logq - logp)).sum(-1)
  return (mask * (weight * ce + (1 - weight) * kl)).sum() / mask.sum()


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_mutual_learning_loss_matches_numpy(scale):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 4)) * scale
  peer = rng.normal(size=(5, 4)) * scale
  labels = np.array([0, 3, 1, 2, 3])
  mask = np.array([1.0, 1.0, 0.0, 1.0, 1.0])
  got = fml.mutual_learning_loss(logits=jnp.asarray(logits, jnp.float32),
                                 peer_logits=jnp.asarray(peer, jnp.float32),
                                 labels=jnp.asarray(labels), ce_weight=0.3,
                                 mask=jnp.asarray(mask))
  want = _dml_numpy(logits, peer, labels, 0.3, mask)
  assert np.isfinite(float(got))
  np.testing.assert_allclose(float(got), want, rtol=1e-4, atol=1e-3 * scale)
  # The peer is a constant: no gradient flows into it, and the model's gradient is finite.
  grad_peer = jax.grad(lambda p: fml.mutual_learning_loss(
      logits=jnp.asarray(logits, jnp.float32), peer_logits=p, labels=jnp.asarray(labels),
      ce_weight=0.3))(jnp.asarray(peer, jnp.float32))
  assert not np.any(np.asarray(grad_peer))
  grad = jax.grad(lambda z: fml.mutual_learning_loss(
      logits=z, peer_logits=jnp.asarray(peer, jnp.float32), labels=jnp.asarray(labels),
      ce_weight=0.3))(jnp.asarray(logits, jnp.float32))
  assert np.all(np.isfinite(np.asarray(grad)))


def _config(**fields):
  c = local_sgd(base_config("fml"))
  c.update_from_flattened_dict(fields)
  return c


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_meme_aggregation_is_the_mean_of_the_participants_memes(weighting):
  # Group "a": 2 members, "b": 1 + padding.
  setup = tiny_public_setup(("a", "b", "a"), slot_multiple=2)
  data = tiny_public_data(setup)
  phases = fml.make_phases(_config(**{"fml.weighting": weighting}), setup)
  state = phases.init(jax.random.PRNGKey(0), data)
  trained, _ = phases.local_update(state, data.groups, jax.random.PRNGKey(1), 0)
  kernels, weights = [], []
  for g in setup.groups:
    for slot in range(g.num_clients):
      kernels.append(np.asarray(trained["groups"][g.name]["meme"]["params"]["head"]["kernel"][slot],
                                np.float64))
      weights.append(1.0 if weighting == "uniform" else float(data.groups[g.name].sizes[slot]))
  assert not np.allclose(kernels[0], kernels[1])  # the copies trained apart
  want = np.tensordot(np.asarray(weights) / np.sum(weights), np.stack(kernels), axes=1)
  out = phases.aggregate(trained)
  np.testing.assert_allclose(np.asarray(out["meme"]["params"]["head"]["kernel"]), want,
                             rtol=1e-5, atol=1e-7)
  assert sorted(out["groups"]["a"]) == ["variables"]  # the round's copies are dropped
  # The private models are each participant's own: trained, not averaged.
  private = trained["groups"]["a"]["variables"]["params"]["head"]["kernel"]
  assert not np.allclose(private[0], private[1])


def test_each_model_descends_its_own_loss():
  """The joint gradient wrt the private model is that of L_local alone (the meme's KL target
  is detached), and vice versa: one SGD step of the sum is two independent DML steps."""
  setup = tiny_public_setup(("a",))
  data = tiny_public_data(setup)
  phases = fml.make_phases(_config(**{"fml.alpha": 0.2, "fml.beta": 0.7}), setup)
  state = phases.init(jax.random.PRNGKey(0), data)
  g = data.groups["a"]
  x = jnp.asarray(g.images[0, :4], jnp.float32) / 255.0
  y = jnp.asarray(g.labels[0, :4])
  model = setup.groups[0].model
  private = jax.tree_util.tree_map(lambda v: v[0], state["groups"]["a"]["variables"]["params"])
  meme = state["meme"]["params"]

  def logits(p):
    return model.apply({"params": p}, x, train=True)[1]

  def joint(pp, pm):
    zp, zm = logits(pp), logits(pm)
    return (fml.mutual_learning_loss(logits=zp, peer_logits=zm, labels=y, ce_weight=0.2)
            + fml.mutual_learning_loss(logits=zm, peer_logits=zp, labels=y, ce_weight=0.7))

  gp, gm = jax.grad(joint, argnums=(0, 1))(private, meme)
  want_p = jax.grad(lambda p: fml.mutual_learning_loss(
      logits=logits(p), peer_logits=logits(meme), labels=y, ce_weight=0.2))(private)
  want_m = jax.grad(lambda p: fml.mutual_learning_loss(
      logits=logits(p), peer_logits=logits(private), labels=y, ce_weight=0.7))(meme)
  for got, want in ((gp, want_p), (gm, want_m)):
    np.testing.assert_allclose(np.asarray(got["head"]["kernel"]),
                               np.asarray(want["head"]["kernel"]), rtol=1e-5, atol=1e-7)


def test_per_participant_epochs_are_validated_naming_the_field():
  setup = tiny_public_setup(("a", "b", "a"))
  assert local.group_epochs("local.epochs", 3, setup) == {"a": 3, "b": 3}
  assert local.group_epochs("local.epochs", (2, 5, 2), setup) == {"a": 2, "b": 5}
  with pytest.raises(ConfigError, match=r"config.local.epochs must be one integer or one per "
                     r"participant \(3\), got \(2, 5\)"):
    local.group_epochs("local.epochs", (2, 5), setup)
  with pytest.raises(ConfigError, match=r"config.local.epochs must give the participants of "
                     r"architecture group 'a'"):
    local.group_epochs("local.epochs", (2, 5, 3), setup)
  c = base_config("fml")
  c.local = c.local.to_dict() | {"epochs": (1, 0)}
  with pytest.raises(ConfigError, match=r"config.local.epochs must be an integer >= 1 or a "
                     r"tuple of integers >= 1, one per participant, got \(1, 0\)"):
    validate_config(c)
  fedavg = base_config("fedavg")
  fedavg.local = fedavg.local.to_dict() | {"epochs": (1, 1)}
  with pytest.raises(ConfigError, match=r"config.local.epochs must be an integer >= 1, got"):
    validate_config(fedavg)  # methods that read one number keep rejecting a sequence


@pytest.mark.slow  # compiles two models per participant (about 20 s on 2 cores)
def test_fml_trains_end_to_end(tmp_path):
  config = tiny_config("fml", **{"num_rounds": 1, "logging.diagnostic_rounds": ()})
  config.local = config.local.to_dict() | {"epochs": (1, 2, 1, 2)}  # one per participant
  config.fml.meme_architecture = "simple_cnn"
  out = train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert 0.0 <= records[-1][f"eval/intra/{client}"] <= 100.0
    for name in ("loss", "private", "meme"):
      assert np.isfinite(records[-1][f"train/local/{name}/{client}"])
  assert np.isfinite(out["results"]["intra"]["AVG"])

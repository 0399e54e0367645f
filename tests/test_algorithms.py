"""Algorithm math on tiny linear models: the engine's updates against direct computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses
from fedjax_het.algorithms import fccl, fcclplus, solo
from fedjax_het.config import base_config
from fedjax_het.engine import api, clients, optim
from tests.tiny_federation import grouped_data
from tests.tiny_models import TinyBatchNorm, TinyLinear

STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def _setup(archs, model=TinyLinear(), *, max_size=6, slot_multiple=1, rounds=4):
  groups = clients.group_clients(archs, [model] * len(archs), slot_multiple=slot_multiple)
  return api.Setup(groups=groups, num_participants=len(archs), num_classes=3, num_rounds=rounds,
                    max_sizes={g.name: max_size for g in groups}, private_mean=STATS[0],
                    private_std=STATS[1], public_mean=STATS[0], public_std=STATS[1],
                    max_test_size=4)


def _config(method="fcclplus", **collab):
  c = base_config(method)
  c.collaborative.optimizer = "sgd"
  c.collaborative.lr_decay = 0.0
  c.collaborative.update(collab)
  c.local.epochs = 1
  c.local.batch_size = 6
  c.eval.batch_size = 4
  return c


_data = grouped_data


def _participant_params(state, setup):
  out = {}
  for g in setup.groups:
    for slot, p in enumerate(g.clients):
      out[p] = jax.tree_util.tree_map(lambda v: v[slot], state["groups"][g.name]["variables"])
  return out


@pytest.mark.parametrize("use_fccm", [True, False])
def test_fcclplus_collaborative_step_equals_each_participants_own_gradient(use_fccm):
  """Three participants in two groups; SGD: p_i <- p_i - lr * grad_i(FCCM + omega FISL)
  (FISL alone for the use_fccm=False ablation)."""
  setup = _setup(["a", "b", "a"])
  config = _config(lr=0.1)
  config.fcclplus.use_fccm = use_fccm
  algorithm = fcclplus.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), None)
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  new_state, metrics = algorithm.collaborative_step(state, images, jax.random.key(2),
                                                      jnp.int32(0))
  before, after = _participant_params(state, setup), _participant_params(new_state, setup)
  model = TinyLinear()

  def outputs(p):
    h, z = model.apply({"params": p["params"]}, images, train=True)
    return z, losses.instance_similarity_matrix(features=h, temperature=0.02)

  z_bar = np.mean([np.asarray(outputs(before[i])[0]) for i in range(3)], axis=0)
  s_bar = np.mean([np.asarray(outputs(before[i])[1]) for i in range(3)], axis=0)
  for i in range(3):
    def objective(params):
      z, s = outputs({"params": params})
      fccm = losses.cross_correlation_loss(logits=z, target_logits=jnp.asarray(z_bar))
      return ((fccm if use_fccm else 0.0)
              + 3.0 * losses.instance_similarity_loss(similarity=s,
                                                      target_similarity=jnp.asarray(s_bar)))
    grad = jax.grad(objective)(before[i]["params"])
    want = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, before[i]["params"], grad)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6),
                           after[i]["params"], want)
  assert set(metrics["a"]) == {"fccm", "fisl"} and metrics["a"]["fccm"].shape == (2,)


def test_fcclplus_needs_one_collaborative_loss():
  from fedjax_het.config import validate_config  # pylint: disable=g-import-not-at-top
  config = _config()
  config.fcclplus.use_fccm = False
  config.fcclplus.use_fisl = False
  with pytest.raises(ValueError, match=r"config.fcclplus.use_fccm must be True when "
                     r"fcclplus.use_fisl is False"):
    validate_config(config)


def test_fcclplus_fresh_adam_moves_every_weight_by_the_learning_rate():
  """The code's new Adam per public batch: a first step of exactly lr per weight (sign-SGD)."""
  setup = _setup(["a", "a"])
  config = _config(lr=1e-3)
  config.collaborative.optimizer = "adam"
  algorithm = fcclplus.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), None)
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  new_state, _ = algorithm.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
  delta = jax.tree_util.tree_map(lambda a, b: np.abs(np.asarray(a - b)),
                                 new_state["groups"]["a"]["variables"]["params"],
                                 state["groups"]["a"]["variables"]["params"])
  # Kernel: |step| = lr * |g| / (|g| + 1e-8), i.e. lr wherever |g| >> 1e-8 (almost all
  # weights; a handful of near-zero gradients take a slightly shorter step).
  kernel = delta["head"]["kernel"]
  assert np.all(kernel <= 1e-3 * (1 + 1e-6))
  assert np.mean(np.abs(kernel - 1e-3) < 1e-6) > 0.95
  # Bias: FCCM standardises each logit column over the batch, so it is invariant to
  # the bias (gradient ~0 up to rounding) and Adam's eps keeps the step below lr.
  assert np.all(delta["head"]["bias"] <= 1e-3 * (1 + 1e-6))


def test_padding_slots_do_not_change_real_participants():
  """A group padded to 4 slots (as for 4 devices) gives the same real updates."""
  config = _config(lr=0.1)
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  results = []
  for multiple in (1, 4):
    setup = _setup(["a", "b", "a"], slot_multiple=multiple)
    algorithm = fcclplus.make_phases(config, setup)
    state = algorithm.init(jax.random.key(0), None)
    state, _ = algorithm.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
    data, _, _ = _data(setup)
    state, _ = algorithm.local_update(state, data, jax.random.key(3), jnp.int32(0))
    results.append(_participant_params(state, setup))
  for i in range(3):
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                           results[0][i], results[1][i])  # rounding: other reduction shapes


def test_fcclplus_local_step_is_ce_plus_fntd_against_the_teacher():
  setup = _setup(["a", "a"])
  config = _config()
  config.local.optimizer = "sgd"
  config.local.lr = 0.2
  config.local.lr_decay = 0.0
  algorithm = fcclplus.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), None)
  # Make the teacher differ from the student so FNTD is non-zero.
  teacher = jax.tree_util.tree_map(lambda v: v + 0.05, state["groups"]["a"]["variables"])
  state["groups"]["a"]["teacher"] = teacher
  data, images, labels = _data(setup)
  new_state, metrics = algorithm.local_update(state, data, jax.random.key(1), jnp.int32(0))
  model = TinyLinear()
  for slot in range(2):
    params = jax.tree_util.tree_map(lambda v: v[slot], state["groups"]["a"]["variables"]["params"])
    t_params = jax.tree_util.tree_map(lambda v: v[slot], teacher["params"])
    x = jnp.asarray(images[slot], jnp.float32) / 255.0
    y = jnp.asarray(labels[slot])
    t_logits = model.apply({"params": t_params}, x, train=True)[1]

    def objective(p):
      z = model.apply({"params": p}, x, train=True)[1]
      return (losses.softmax_cross_entropy(logits=z, labels=y)
              + losses.non_target_distillation_loss(student_logits=z, teacher_logits=t_logits,
                                                    labels=y, temperature=3.0))

    value, grad = jax.value_and_grad(objective)(params)
    want = jax.tree_util.tree_map(lambda p, g: p - 0.2 * g, params, grad)
    got = jax.tree_util.tree_map(lambda v: v[slot], new_state["groups"]["a"]["variables"]["params"])
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           got, want)
    np.testing.assert_allclose(metrics["a"]["loss"][slot], value, rtol=1e-5)
  # The end-of-local model becomes next round's teacher.
  jax.tree_util.tree_map(np.testing.assert_array_equal, new_state["groups"]["a"]["teacher"],
                         new_state["groups"]["a"]["variables"])


def test_fcclplus_kd_then_fntd_distils_with_kd_first_then_fntd():
  """FCCL+ Table XVII's schedule: 2 local epochs (one full batch each), kd_fraction 0.5:
  epoch 0 descends CE + tau^2 KD, epoch 1 CE + FNTD, against the same teacher."""
  setup = _setup(["a", "a"])
  config = _config()
  config.local.optimizer = "sgd"
  config.local.lr = 0.2
  config.local.lr_decay = 0.0
  config.local.epochs = 2
  config.fcclplus.local_distillation = "kd_then_fntd"
  config.fcclplus.kd_fraction = 0.5
  algorithm = fcclplus.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), None)
  teacher = jax.tree_util.tree_map(lambda v: v + 0.05, state["groups"]["a"]["variables"])
  state["groups"]["a"]["teacher"] = teacher
  data, images, labels = _data(setup)
  new_state, _ = algorithm.local_update(state, data, jax.random.key(1), jnp.int32(0))
  model = TinyLinear()
  for slot in range(2):
    params = jax.tree_util.tree_map(lambda v: v[slot], state["groups"]["a"]["variables"]["params"])
    t_params = jax.tree_util.tree_map(lambda v: v[slot], teacher["params"])
    x = jnp.asarray(images[slot], jnp.float32) / 255.0
    y = jnp.asarray(labels[slot])
    t_logits = model.apply({"params": t_params}, x, train=True)[1]

    def objective(p, kd):
      z = model.apply({"params": p}, x, train=True)[1]
      distill = (9.0 * losses.knowledge_distillation_loss(student_logits=z, teacher_logits=t_logits,
                                                           temperature=3.0) if kd else
                 losses.non_target_distillation_loss(student_logits=z, teacher_logits=t_logits,
                                                     labels=y, temperature=3.0))
      return losses.softmax_cross_entropy(logits=z, labels=y) + distill

    want = params
    for kd in (True, False):
      grad = jax.grad(objective)(want, kd)
      want = jax.tree_util.tree_map(lambda p, g: p - 0.2 * g, want, grad)
    got = jax.tree_util.tree_map(lambda v: v[slot], new_state["groups"]["a"]["variables"]["params"])
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           got, want)
  config.fcclplus.kd_fraction = 1.5
  with pytest.raises(ValueError, match=r"fcclplus.kd_fraction"):
    fcclplus.validate_config(config)


@pytest.mark.slow  # about 25 s on 2 CPU cores
def test_homogeneous_fcclplus_averages_all_participants_before_local_training():
  setup = _setup(["r", "r", "r"])
  config = _config()
  config.fcclplus.average_parameters = True
  config.local.lr = 1e-12  # local training then leaves the averaged model in place
  algorithm = fcclplus.make_phases(config, setup)
  state = algorithm.init(jax.random.key(0), None)
  state["groups"]["r"]["variables"] = jax.tree_util.tree_map(
      lambda v: v + jnp.arange(3.0).reshape((3,) + (1,) * (v.ndim - 1)),
      state["groups"]["r"]["variables"])
  mean = jax.tree_util.tree_map(lambda v: v.mean(0), state["groups"]["r"]["variables"])
  data, _, _ = _data(setup)
  new_state, _ = algorithm.local_update(state, data, jax.random.key(1), jnp.int32(0))
  for leaf, m in zip(jax.tree_util.tree_leaves(new_state["groups"]["r"]["variables"]),
                     jax.tree_util.tree_leaves(mean)):
    for slot in range(3):
      np.testing.assert_allclose(leaf[slot], m, atol=1e-6)


def test_average_parameters_rejects_heterogeneous_participants():
  config = _config()
  config.fcclplus.average_parameters = True
  with pytest.raises(ValueError, match="average_parameters=True needs one architecture"):
    fcclplus.make_phases(config, _setup(["a", "b"]))


def test_fccl_own_slot_holds_the_previous_round_model():
  """FCCL target of participant i: (sum_{j != i} Z_j + Z_i^{prev}) / K."""
  setup = _setup(["a", "a", "b"])
  config = _config("fccl", lr=0.1)
  config.fccl.pretrain_epochs = 0
  algorithm = fccl.make_phases(config, setup)
  data, _, _ = _data(setup)
  state = algorithm.init(jax.random.key(0), api.FederatedArrays(data, None, None))
  for name in ("a", "b"):  # a previous model different from the current one
    state["groups"][name]["previous"] = jax.tree_util.tree_map(
        lambda v: 0.5 * v, state["groups"][name]["variables"])
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  new_state, _ = algorithm.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
  model = TinyLinear()
  before, after = _participant_params(state, setup), _participant_params(new_state, setup)
  prev = {}
  for g in setup.groups:
    for slot, p in enumerate(g.clients):
      prev[p] = jax.tree_util.tree_map(lambda v: v[slot], state["groups"][g.name]["previous"])
  logits = lambda p: model.apply({"params": p["params"]}, images, train=True)[1]
  current = [np.asarray(logits(before[i])) for i in range(3)]
  for i in range(3):
    target = (sum(current[j] for j in range(3) if j != i) + np.asarray(logits(prev[i]))) / 3
    grad = jax.grad(lambda p: losses.cross_correlation_loss(
        logits=logits({"params": p}), target_logits=jnp.asarray(target)))(before[i]["params"])
    want = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, before[i]["params"], grad)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6),
                           after[i]["params"], want)


def test_solo_trains_only_on_private_data_and_learns():
  setup = _setup(["a", "b"], model=TinyBatchNorm())
  config = base_config("solo")
  config.local.epochs = 30
  config.local.lr = 0.05
  config.local.batch_size = 6
  config.eval.batch_size = 4
  algorithm = solo.make_solo(config, setup)
  data, _, _ = _data(setup)
  arrays = api.FederatedArrays(data, jnp.zeros((0, 32, 32, 3), jnp.uint8), None)
  state = algorithm.init(jax.random.key(0), arrays)
  losses_per_round = []
  for r in range(3):
    state, metrics = algorithm.round(state, arrays, jax.random.key(r), jnp.int32(r))
    assert set(metrics) == {"local", "server"}
    assert {k: float(v) for k, v in metrics["server"].items()} == {  # no communication at all
        "bytes_up": 0.0, "bytes_down": 0.0}
    losses_per_round.append(float(metrics["local"]["a"]["loss"][0]))
  assert losses_per_round[-1] < 0.5 * losses_per_round[0]
  # BatchNorm statistics move in train mode.
  stats = state["groups"]["a"]["variables"]["batch_stats"]
  assert not np.allclose(jax.tree_util.tree_leaves(stats)[0], 0.0)


def test_cosine_pretraining_schedule_matches_timm():
  rates = np.asarray(optim.cosine_epoch_rates(1e-3, 1e-6, 50))
  assert rates[0] == pytest.approx(1e-3)
  assert rates[25] == pytest.approx(1e-6 + 0.5 * (1e-3 - 1e-6), rel=1e-5)
  assert np.all(np.diff(rates) < 0)
  # timm's formula, epoch by epoch, in float64.
  want = [1e-6 + 0.5 * (1e-3 - 1e-6) * (1 + np.cos(np.pi * e / 50)) for e in range(50)]
  np.testing.assert_allclose(rates, want, rtol=1e-5)

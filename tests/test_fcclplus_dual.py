"""FCCL+'s `local_distillation="dual"`: the conference (FCCL, CVPR 2022) local loss, Eq. 4-7.

L_local = CE + lambda_Loc (KL(softmax(Z^{e-1}/tau) || softmax(Z/tau)) + KL(softmax(Z*/tau) ||
softmax(Z/tau))), Z^{e-1} the previous round's end-of-local model, Z* the SOLO-pretrained one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fcclplus, private_training
from fedjax_het.config import base_config, validate_config
from fedjax_het.engine import api
from tests.tiny_federation import grouped_data, tiny_setup

LR = 0.2


def _setup(archs):
  return tiny_setup(len(archs), archs=archs)


def _config(distillation="dual", **fcclplus_fields):
  c = base_config("fcclplus")
  c.local.optimizer = "sgd"
  c.local.lr = LR
  c.local.lr_decay = 0.0
  c.local.weight_decay = 0.0
  c.local.epochs = 1
  c.local.batch_size = 6            # one full-batch step per epoch
  c.eval.batch_size = 4
  c.fcclplus.local_distillation = distillation
  c.fcclplus.update(fcclplus_fields)
  return c


def _slot(tree, slot):
  return jax.tree_util.tree_map(lambda v: v[slot], tree)


def _hand_step(params, prev, pre, x, y, *, weight, tau):
  """One SGD step on CE + weight (KL_prev + KL_pre) for z = x W + b, gradient by hand.

  Returns (new params, loss, CE, weighted KL sum). dCE/dz = (softmax(z) - onehot(y)) / B and
  dKL(p_T || softmax(z / tau))/dz = (softmax(z / tau) - p_T) / (tau B).
  """
  w, b = params["head"]["kernel"], params["head"]["bias"]
  n = x.shape[0]
  z = x @ w + b[None]
  onehot = jax.nn.one_hot(y, 3)
  teacher_probs = [jax.nn.softmax((x @ t["head"]["kernel"] + t["head"]["bias"][None]) / tau)
                   for t in (prev, pre)]
  log_student = jax.nn.log_softmax(z / tau)
  kls = [jnp.mean(jnp.sum(p * (jnp.log(p) - log_student), axis=-1)) for p in teacher_probs]
  ce = -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(z), axis=-1))
  loss = ce + weight * (kls[0] + kls[1])
  dz = (jax.nn.softmax(z) - onehot) / n
  for p in teacher_probs:
    dz = dz + weight * (jax.nn.softmax(z / tau) - p) / (tau * n)
  grad = {"head": {"kernel": x.T @ dz, "bias": dz.sum(0)}}
  new = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grad)
  return new, loss, ce, weight * (kls[0] + kls[1])


def test_dual_local_step_is_ce_plus_both_kls_by_hand():
  setup = _setup(["a", "a"])
  weight, tau = 0.7, 2.0   # not the defaults, so the step must read both fields
  config = _config(dual_weight=weight, dual_temperature=tau, pretrain_epochs=0)
  algorithm = fcclplus.make_phases(config, setup)
  data, images, labels = grouped_data(setup)
  state = algorithm.init(jax.random.key(0), api.FederatedArrays(data, None, None))
  g = state["groups"]["a"]
  # Three different models: student, previous-round teacher, pretrained teacher.
  g["teacher"] = jax.tree_util.tree_map(lambda v: v + 0.05, g["variables"])
  g["pretrained"] = jax.tree_util.tree_map(
      lambda v: -0.5 * v + 0.03 * jnp.cos(jnp.arange(v.size, dtype=v.dtype).reshape(v.shape)),
      g["variables"])
  new_state, metrics = algorithm.local_update(state, data, jax.random.key(1), jnp.int32(0))
  new_g = new_state["groups"]["a"]
  for slot in range(2):
    x = jnp.asarray(images[slot], jnp.float32).reshape(len(images[slot]), -1) / 255.0
    y = jnp.asarray(labels[slot])
    want, loss, ce, distill = _hand_step(
        _slot(g["variables"]["params"], slot), _slot(g["teacher"]["params"], slot),
        _slot(g["pretrained"]["params"], slot), x, y, weight=weight, tau=tau)
    assert float(distill) > 1e-3  # both teachers differ from the student
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           _slot(new_g["variables"]["params"], slot), want)
    np.testing.assert_allclose(metrics["a"]["loss"][slot], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["a"]["ce"][slot], ce, rtol=1e-5)
    np.testing.assert_allclose(metrics["a"]["distill"][slot], distill, rtol=1e-4)
  # The end-of-local model becomes next round's Z^{e-1}; theta^* stays.
  jax.tree_util.tree_map(np.testing.assert_array_equal, new_g["teacher"], new_g["variables"])
  jax.tree_util.tree_map(np.testing.assert_array_equal, new_g["pretrained"], g["pretrained"])


@pytest.mark.parametrize("average", [False, True])
def test_dual_pretrains_with_solo_and_the_other_choices_do_not(average):
  setup = _setup(["a", "a"])
  data, _, _ = grouped_data(setup)
  arrays = api.FederatedArrays(data, None, None)
  key = jax.random.key(3)
  fields = dict(pretrain_epochs=3, pretrain_lr=0.05, pretrain_min_lr=0.01,
                average_parameters=average)
  plain = {}
  for choice in ("fntd", "kd", "kd_then_fntd", "none"):
    state = fcclplus.make_phases(_config(choice, **fields), setup).init(key, None)  # no data read
    assert set(state["groups"]["a"]) == {"variables", "teacher"}, choice
    plain[choice] = state["groups"]["a"]
  for choice in ("kd", "kd_then_fntd", "none"):  # one initial model for all of them
    jax.tree_util.tree_map(np.testing.assert_array_equal, plain[choice], plain["fntd"])

  state = fcclplus.make_phases(_config("dual", **fields), setup).init(key, arrays)
  g = state["groups"]["a"]
  assert set(g) == {"variables", "teacher", "pretrained"}
  want = private_training.pretrain_variables(setup, {"a": plain["fntd"]["variables"]}, data,
                                             jax.random.fold_in(key, 1), epochs=3, batch_size=6,
                                             lr=0.05, min_lr=0.01)["a"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, g["pretrained"], want)
  # Pretraining moved the model, and each participant differently (own private data).
  kernel = g["pretrained"]["params"]["head"]["kernel"]
  assert not np.allclose(kernel, plain["fntd"]["variables"]["params"]["head"]["kernel"])
  assert not np.allclose(kernel[0], kernel[1])
  # Round 1's previous model is theta^*; training starts from it (homogeneous: participant 0's).
  jax.tree_util.tree_map(np.testing.assert_array_equal, g["teacher"], want)
  start = (jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v[:1], v.shape), want) if average
           else want)
  jax.tree_util.tree_map(np.testing.assert_array_equal, g["variables"], start)


def test_dual_settings_are_validated_naming_the_field():
  config = _config("dual")
  validate_config(config)
  assert config.fcclplus.dual_weight == 1.0 and config.fcclplus.dual_temperature == 1.0
  assert config.fcclplus.pretrain_epochs == 50  # FCCL's defaults (config.fccl)
  bad = _config("dual_kd")
  allowed = r"\('fntd', 'kd', 'kd_then_fntd', 'none', 'dual', 'ewc'\)"
  with pytest.raises(ValueError, match=r"config.fcclplus.local_distillation must be one of "
                     + allowed + r", got 'dual_kd'"):
    validate_config(bad)
  with pytest.raises(ValueError, match=r"config.fcclplus.local_distillation must be one of "
                     + allowed):
    fcclplus.make_phases(bad, _setup(["a", "a"]))
  for field, value, allowed in (
      ("dual_weight", -1.0, "a number >= 0"), ("dual_temperature", 0.0, "a number > 0"),
      ("pretrain_epochs", -1, "an integer >= 0"), ("pretrain_lr", 0.0, "a number > 0"),
      ("pretrain_min_lr", 0.5, r"a number in \[0, fcclplus.pretrain_lr\]")):
    config = _config("dual", **{field: value})
    with pytest.raises(ValueError, match=rf"config.fcclplus.{field} must be {allowed}, got"):
      validate_config(config)

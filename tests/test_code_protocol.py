"""The FCCL+ authors' code protocol (`_code` / `_mid` variants) and its switches.

Each difference from the paper's text that the code protocol sets is checked where the run
reads it: batch sizes, private sizes, the FISL weight omega, the public normalisation, FCCM's
epsilon and the second feature pass, the last two against hand computations.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import experiment as experiment_lib
from fedjax_het import losses
from fedjax_het.algorithms import fcclplus
from fedjax_het.config import base_config, load_module, validate_config
from fedjax_het.data import augment
from fedjax_het.engine import api, clients, public
from tests.test_office_configs import REPO
from tests.tiny_models import TinyBatchNorm, TinyLinear, TinyMLP

digits = load_module(REPO / "fedjax_het" / "configs" / "digits.py")
office = load_module(REPO / "fedjax_het" / "configs" / "office.py")

STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


class TinyDropout(nn.Module):
  """features = dropout(Dense "body"(x)) in train mode, logits = Dense "head"(features)."""
  num_classes: int = 3

  @property
  def feature_dim(self):
    return 4

  @property
  def needs_dropout_rng(self):
    return True

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    del mask
    h = nn.Dense(4, name="body")(x.reshape((x.shape[0], -1)))
    h = nn.Dropout(0.5, deterministic=not train)(h)
    return h, nn.Dense(self.num_classes, name="head")(h)


def _setup(k, model):
  groups = clients.group_clients(["a"] * k, [model] * k)
  return api.Setup(groups=groups, num_participants=k, num_classes=3, num_rounds=4,
                   max_sizes={"a": 6}, private_mean=STATS[0], private_std=STATS[1],
                   public_mean=STATS[0], public_std=STATS[1], max_test_size=4)


def _config(**fcclplus_fields):
  c = base_config("fcclplus")
  c.collaborative.optimizer = "sgd"
  c.collaborative.lr = 0.1
  c.collaborative.lr_decay = 0.0
  c.fcclplus.update(fcclplus_fields)
  return c


# --- the code's arguments, as written in WenkeHuang/FCCL fccl+/utils/best_args.py and datasets/


@pytest.mark.parametrize("variant,scenario,public_batch,local_batch,epochs,omega", [
    ("digits", "digits", 256, 128, 20, 3.0),
    ("office31", "office31", 256, 128, 20, 3.0),
    ("caltech", "office_caltech", 128, 128, 20, 3.0),
    ("home", "office_home", 176, 128, 15, 1.0),
])
def test_the_code_variant_sets_the_codes_arguments(variant, scenario, public_batch, local_batch,
                                                   epochs, omega):
  name = "fcclplus_code" if variant == "digits" else f"{variant}_fcclplus_code"
  c = (digits.get_config(name) if variant == "digits" else office.get_config(name))
  validate_config(c)
  assert (c.collaborative.batch_size, c.local.batch_size, c.local.epochs) == (
      public_batch, local_batch, epochs)
  assert c.collaborative.epochs == (2 if scenario == "office_home" else 1)
  assert c.fcclplus.fisl_weight == omega
  assert c.scenario.public_normalization == "fcclplus_code"
  assert (c.fcclplus.fccm_eps, c.fcclplus.feature_pass) == (0.0, "separate")
  if scenario == "digits":
    # percent_dict 0.0023, 0.013, 0.13 of MNIST's 60000, USPS's 7291, SVHN's 73257 images.
    assert dict(c.scenario.private_sizes) == {"mnist": 138, "usps": 94, "svhn": 9523,
                                              "syn": 1800}
  else:
    assert c.scenario.office_test == "whole_domain"
  # The paper's variant keeps the paper's text.
  paper = digits.get_config("fcclplus") if variant == "digits" else office.get_config(
      f"{variant}_fcclplus")
  assert (paper.collaborative.batch_size, paper.local.batch_size) == (512, 256)
  assert (paper.fcclplus.fccm_eps, paper.fcclplus.feature_pass) == (1e-6, "shared")
  assert paper.scenario.public_normalization == "library"


def test_the_code_protocol_of_the_other_methods():
  fedavg = digits.get_config("fedavg_code")
  assert fedavg.local.batch_size == 64  # best_args: fl_digits fedavg local_batch_size 64
  caltech = office.get_config("caltech_fedprox_code")
  assert (caltech.local.lr, caltech.local.batch_size) == (1e-2, 128)
  fccl = digits.get_config("fccl_code")
  assert fccl.fccl.fccm_eps == 0.0 and fccl.collaborative.batch_size == 256
  solo = digits.get_config("solo_code")  # BASE keeps the paper's 50 private epochs
  assert (solo.num_rounds, solo.local.epochs, solo.local.batch_size) == (50, 1, 128)


def test_a_variant_takes_one_scale_or_protocol():
  for bad in ("fcclplus_mid_quick", "fcclplus_code_mid", "fcclplus_code_quick"):
    with pytest.raises(ValueError, match="digits config: expected"):
      digits.get_config(bad)
  with pytest.raises(ValueError, match="office config: expected"):
    office.get_config("office31_fcclplus_mid_quick")


def test_the_mid_scale_is_the_code_protocol_on_narrow_backbones_for_40_rounds():
  for c in (digits.get_config("fcclplus_mid"), office.get_config("office31_fcclplus_mid")):
    validate_config(c)
    assert (c.models.width, c.num_rounds, c.local.epochs) == (0.125, 40, 20)
    assert (c.collaborative.batch_size, c.local.batch_size) == (256, 128)
    assert c.scenario.public_size == 5000  # 20 public steps of 256 a round
    assert (c.fcclplus.fccm_eps, c.fcclplus.feature_pass) == (0.0, "separate")
  base = office.get_config("office31_solo_mid")  # each method's local schedule, alone
  assert (base.num_rounds, base.local.epochs, base.local.lr_decay) == (40, 20, 0.9)
  assert dict(digits.get_config("solo_mid").scenario.private_sizes) == {
      "mnist": 138, "usps": 94, "svhn": 384, "syn": 256}


# --- the fields reach the run --------------------------------------------------------------------


def test_private_sizes_and_public_normalisation_reach_the_scenario(tmp_path):
  from fedjax_het.data import npz  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  np.savez(tmp_path / npz.BUNDLE[npz.PUBLIC_FILES["cifar100"]].filename,
           x=rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8), y=np.arange(40) % 100)
  c = digits.get_config("fcclplus_code")
  c.scenario.data_dir = str(tmp_path)
  c.scenario.sources = {"mnist": "synthetic", "usps": "synthetic", "svhn": "synthetic",
                        "syn": "synthetic"}
  c.scenario.private_sizes.update({"svhn": 30, "syn": 20})  # the synthetic stand-ins, small
  c.scenario.public_size = 16
  c.scenario.test_size = 10
  scenario = experiment_lib.build_scenario(c)
  assert [len(t.labels) for t in scenario.train] == [138, 94, 30, 20]
  # fccl+/datasets/cifar100.py: Normalize((0.4802, 0.4480, 0.3975), (0.2770, 0.2691, 0.2821)).
  np.testing.assert_allclose(scenario.public_mean, (0.4802, 0.4480, 0.3975))
  np.testing.assert_allclose(scenario.public_std, (0.2770, 0.2691, 0.2821))
  c.scenario.public_normalization = "library"
  library = experiment_lib.build_scenario(c)
  np.testing.assert_allclose(library.public_mean, augment.CIFAR100_MEAN)


def test_the_public_batch_reaches_the_public_phase():
  c = office.get_config("office31_fcclplus_code")
  spec = public.make_spec(c.collaborative, STATS[0], STATS[1])
  assert spec.batch_size == 256


def _distinct_participants(state):
  """The state with every participant's parameters moved apart (they start equal)."""
  params = state["groups"]["a"]["variables"]["params"]
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  moved = [v + 0.05 * jax.random.normal(k, v.shape) for v, k in zip(leaves, keys)]
  state["groups"]["a"]["variables"]["params"] = jax.tree_util.tree_unflatten(tree, moved)
  return state


def test_the_fisl_weight_scales_the_fisl_step():
  # FISL alone (use_fccm=False) with SGD: the step is lr * omega * grad(FISL), so omega = 1 (the
  # code's Office-Home) moves every weight a third of omega = 3's step.
  setup = _setup(2, TinyMLP())  # features = Dense "body"(x): FISL moves the body
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  steps = {}
  for omega in (1.0, 3.0):
    config = _config(use_fccm=False, fisl_weight=omega)
    config.collaborative.lr = 1e3  # a step far above float32 rounding of the weights
    phases = fcclplus.make_phases(config, setup)
    state = _distinct_participants(phases.init(jax.random.key(0), None))
    new, metrics = phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
    assert np.all(np.asarray(metrics["a"]["fisl"]) > 1e-3)
    steps[omega] = np.asarray(new["groups"]["a"]["variables"]["params"]["body"]["kernel"]
                              - state["groups"]["a"]["variables"]["params"]["body"]["kernel"])
  largest = np.abs(steps[3.0]).max()
  assert largest > 1e-3
  # An element whose gradient cancels to ~1 among terms of the steps' size (~1e4) keeps float32
  # rounding of ~1e-3 that differs between CPUs (1.3e-3 on an AVX2-only x86 core): the absolute
  # tolerance is 1e-6 of the largest step, the relative one 1e-3.
  np.testing.assert_allclose(3.0 * steps[1.0], steps[3.0], rtol=1e-3, atol=1e-6 * largest)


def test_fccm_without_epsilon_is_not_finite_on_a_constant_logit_column():
  # The saturated case the library's epsilon guards: a logit column that is constant over the
  # batch has variance 0; the code's standardisation (no epsilon) divides by 0.
  setup = _setup(2, TinyLinear())
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  fccm = {}
  for eps in (0.0, 1e-6):
    phases = fcclplus.make_phases(_config(fccm_eps=eps), setup)
    state = phases.init(jax.random.key(0), None)
    kernel = state["groups"]["a"]["variables"]["params"]["head"]["kernel"]
    state["groups"]["a"]["variables"]["params"]["head"]["kernel"] = kernel.at[..., 0].set(0.0)
    _, metrics = phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
    fccm[eps] = np.asarray(metrics["a"]["fccm"])
  assert not np.all(np.isfinite(fccm[0.0]))
  assert np.all(np.isfinite(fccm[1e-6]))
  # With every column varying, eps = 0 is Eq. 1 with the code's unbiased std, by hand.
  phases = fcclplus.make_phases(_config(fccm_eps=0.0, use_fisl=False), setup)
  state = phases.init(jax.random.key(0), None)
  _, metrics = phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
  x = np.asarray(images, np.float64).reshape(8, -1)
  params = state["groups"]["a"]["variables"]["params"]["head"]
  z = [x @ np.asarray(params["kernel"][i], np.float64) + np.asarray(params["bias"][i])
       for i in range(2)]
  target = np.mean(z, axis=0)

  def standardise(v):
    return (v - v.mean(0)) / v.std(0, ddof=1)

  for i in range(2):
    m = standardise(z[i]).T @ standardise(target) / 8
    want = np.sum((1 - np.diag(m)) ** 2) + losses.FCCM_OFF_DIAGONAL_WEIGHT * np.sum(
        (1 + m[~np.eye(3, dtype=bool)]) ** 2)
    np.testing.assert_allclose(metrics["a"]["fccm"][i], want, rtol=1e-4)


def test_the_separate_feature_pass_updates_the_batch_statistics_twice():
  # TinyBatchNorm: h = Dense(4)(x), BatchNorm(momentum 0.9) over the batch. One train-mode pass
  # sets the running mean to m r + (1 - m) mu (mu the batch mean of h); the code's second pass
  # on the same batch applies the update again: m^2 r + (1 - m^2) mu. Without dropout both
  # passes give the same features, so the parameters take the same step.
  m = 0.9
  setup = _setup(2, TinyBatchNorm())
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  results = {}
  for feature_pass in fcclplus.FEATURE_PASSES:
    phases = fcclplus.make_phases(_config(feature_pass=feature_pass), setup)
    state = phases.init(jax.random.key(0), None)
    stats = state["groups"]["a"]["variables"]["batch_stats"]
    # Start from running statistics far from the batch's, so one and two updates differ.
    stats = jax.tree_util.tree_map(lambda v: v + 5.0, stats)
    state["groups"]["a"]["variables"]["batch_stats"] = stats
    new, _ = phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
    results[feature_pass] = (state, new)
  state, _ = results["shared"]
  params = state["groups"]["a"]["variables"]["params"]
  stats = state["groups"]["a"]["variables"]["batch_stats"]
  (dense,) = [k for k in params if k.startswith("Dense")]
  (bn,) = list(stats)
  x = np.asarray(images, np.float64).reshape(8, -1)
  for i in range(2):
    h = x @ np.asarray(params[dense]["kernel"][i], np.float64) + np.asarray(
        params[dense]["bias"][i])
    mu, var = h.mean(0), h.var(0)
    r_mean, r_var = np.asarray(stats[bn]["mean"][i]), np.asarray(stats[bn]["var"][i])
    for feature_pass, momentum in (("shared", m), ("separate", m * m)):
      got = results[feature_pass][1]["groups"]["a"]["variables"]["batch_stats"][bn]
      np.testing.assert_allclose(got["mean"][i], momentum * r_mean + (1 - momentum) * mu,
                                 rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(got["var"][i], momentum * r_var + (1 - momentum) * var,
                                 rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      results["shared"][1]["groups"]["a"]["variables"]["params"],
      results["separate"][1]["groups"]["a"]["variables"]["params"])


def test_the_separate_feature_pass_draws_its_own_dropout_mask():
  # With dropout on the features, the second pass's mask differs from the first's: FISL sees
  # other features, so the step differs from the shared pass's; the same key repeats it.
  setup = _setup(2, TinyDropout())
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  kernels = {}
  for feature_pass in fcclplus.FEATURE_PASSES:
    phases = fcclplus.make_phases(_config(feature_pass=feature_pass), setup)
    state = phases.init(jax.random.key(0), None)
    runs = [phases.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))[0]
            for _ in range(2)]
    kernels[feature_pass] = [jax.tree_util.tree_leaves(r["groups"]["a"]["variables"]["params"])
                             for r in runs]
  for feature_pass in fcclplus.FEATURE_PASSES:
    for a, b in zip(*kernels[feature_pass]):
      np.testing.assert_array_equal(a, b)
  assert any(not np.allclose(a, b) for a, b in zip(kernels["shared"][0],
                                                    kernels["separate"][0]))


def test_the_protocol_fields_are_validated():
  for field, value, allowed in (
      ("fcclplus.feature_pass", "twice", r"\('shared', 'separate'\)"),
      ("scenario.public_normalization", "tinyimagenet", r"\('library', 'fcclplus_code'\)")):
    c = base_config("fcclplus")
    section, name = field.split(".")
    c[section][name] = value
    with pytest.raises(ValueError, match=rf"config.{field} must be one of {allowed}"):
      validate_config(c)
  c = base_config("fcclplus")
  c.fcclplus.fccm_eps = -1.0
  with pytest.raises(ValueError, match=r"config.fcclplus.fccm_eps must be a number >= 0"):
    validate_config(c)

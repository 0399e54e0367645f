"""FedMMD and FedFusion on tiny clients: hand-computed local steps, frozen streams, server EMA."""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import experiment
from fedjax_het.algorithms import common, fedavg, fedavg_family, fedfusion, fedmmd
from fedjax_het.config import base_config, validate_config
from fedjax_het.configs import _two_stream as two_stream
from fedjax_het.configs import mnist
from fedjax_het.engine import optim
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.models.base import Classifier, MLPTail
from fedjax_het.reports import common as reports_common
from fedjax_het.reports import tables
from tests.tiny_federation import LR, SIZES, flat_inputs, tiny_config, tiny_data, tiny_setup
from tests.tiny_models import TinyMLP

#: The rows FedFusion Table 2 scores again with local models (tables.FEDFUSION_LOCAL_ROWS).
LOCAL_MODEL_ROWS = tuple(r.key.removesuffix("_local") for r in tables.FEDFUSION_LOCAL_ROWS)


class TinyTrunk(nn.Module):
  """8x8 mean pooling to a 4x4x3 map, then a 1x1 conv to 2 channels and tanh."""
  conv_impl: str = "xla"

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    b = images.shape[0]
    pooled = images.reshape(b, 4, 8, 4, 8, 3).mean(axis=(2, 4))
    return jnp.tanh(nn.Conv(2, (1, 1), name="conv")(pooled))


def tiny_classifier():
  return Classifier(trunk=TinyTrunk(), tail=MLPTail(input_dim=32, hidden=(4,),
                                                    activate_last=False), num_classes=3)


def _row(tree, i):
  return jax.tree_util.tree_map(lambda v: v[i], tree)


def _allclose(got, want, rtol=1e-5, atol=1e-6):
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol),
                         got, want)


# Hand-written pieces (no fedjax_het.losses).

def _mlp(p, x):
  h = x @ p["body"]["kernel"] + p["body"]["bias"][None, :]
  return h, h @ p["head"]["kernel"] + p["head"]["bias"][None, :]


def _ce(logits, y):
  return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(len(y)), y])


# The 19 kernel variances of the FedMMD code, written out here (not imported).
VARIANCES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0,
             100.0, 1e3, 1e4, 1e5, 1e6)


def _mmd(x, y, variances, floor):
  def k(a, b):
    d = jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)
    return sum(jnp.exp(-d / (2.0 * s)) for s in variances)
  value = jnp.mean(k(x, x)) + jnp.mean(k(y, y)) - 2.0 * jnp.mean(k(x, y))
  return jnp.maximum(value, floor)


@pytest.mark.parametrize("constraint,outputs", [("mmd", "features"), ("l2", "logits")])
def test_fedmmd_local_step_is_the_hand_gradient_of_ce_plus_lambda_constraint(constraint,
                                                                              outputs):
  weight = 0.7
  setup = tiny_setup(2, TinyMLP())
  config = tiny_config("fedmmd", **{"fedmmd.constraint": constraint, "fedmmd.outputs": outputs,
                                    "fedmmd.weight": weight, "fedmmd.mmd_floor": 1e-4,
                                    "local.epochs": 2})
  algorithm = fedmmd.make_fedmmd(config, setup)
  data, images, labels = tiny_data(setup)
  inputs = flat_inputs(images)
  state = algorithm.init(jax.random.key(0), data)
  w0 = state["server"]["params"]
  # Two epochs, so the second step's local model differs from the frozen global stream.

  def hand_loss(p, x, y):
    features, logits = _mlp(p, x)
    g_features, g_logits = _mlp(w0, x)
    if constraint == "mmd":
      penalty = _mmd(g_features, features, VARIANCES, 1e-4)
    else:  # tf.nn.l2_loss: half the squared sum over the batch and the outputs
      penalty = 0.5 * jnp.sum((logits - g_logits) ** 2)
    return _ce(logits, y) + weight * penalty

  new, metrics = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  want = []
  for k in range(2):
    x, y = inputs[k], jnp.asarray(labels[k])
    p = w0
    for _ in range(2):
      g = jax.grad(hand_loss)(p, x, y)
      p = jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)
    want.append(p)
  total = SIZES[0] + SIZES[1]
  _allclose(new["server"]["params"],
            jax.tree_util.tree_map(lambda a, b: (SIZES[0] * a + SIZES[1] * b) / total, *want),
            rtol=1e-4, atol=1e-5)
  assert np.all(np.asarray(metrics["local"]["a"][constraint]) > 0)


def _fedmmd_and_local_loss(monkeypatch, config, setup):
  """(FedMMD from `config`, the local objective of `setup`'s only group as FedMMD trains it:
  with `config.models.dropout_rate` in the model's tail)."""
  captured, make_family = {}, fedavg_family.make_family

  def capture(cfg, s, *, name, objective_for, **kwargs):  # keeps the local objective
    captured["loss_fn"] = objective_for(common.with_model_dropout(cfg, s).groups[0])
    return make_family(cfg, s, name=name, objective_for=objective_for, **kwargs)

  monkeypatch.setattr(fedavg_family, "make_family", capture)
  algorithm = fedmmd.make_fedmmd(config, setup)
  return algorithm, captured["loss_fn"]


def test_fedmmd_global_stream_gets_no_gradient_and_equal_streams_cost_the_floor(monkeypatch):
  setup = tiny_setup(1, TinyMLP())
  algorithm, loss_fn = _fedmmd_and_local_loss(monkeypatch, tiny_config("fedmmd"), setup)
  data, images, labels = tiny_data(setup)
  variables = algorithm.init(jax.random.key(0), data)["server"]
  x = flat_inputs(images)[0].reshape(-1, 32, 32, 3)
  y = jnp.asarray(labels[0])
  mask = jnp.ones(len(y), bool)

  def total(params, global_params):
    aux = {"global": {"params": global_params, "batch_stats": {}}, "round": jnp.int32(0)}
    return loss_fn(params, {}, x, y, mask, None, aux)

  (value, (_, metrics)), grads = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(
      variables["params"], variables["params"])
  jax.tree_util.tree_map(lambda g: np.testing.assert_array_equal(g, np.zeros_like(g)), grads[1])
  # Identical streams: MMD^2 = 0, floored at the code's 1e-4; the loss is CE + 0.1 * 1e-4.
  assert float(metrics["mmd"]) == pytest.approx(1e-4)
  assert float(value) == pytest.approx(float(metrics["ce"]) + 0.1 * 1e-4, rel=1e-6)


def _tiny_trunk_map(p, x):
  """TinyTrunk by hand, flattened: tanh(1x1 conv of the 8x8 mean-pooled image), (B, 32)."""
  pooled = x.reshape(x.shape[0], 4, 8, 4, 8, 3).mean(axis=(2, 4))
  z = jnp.tanh(pooled @ p["trunk"]["conv"]["kernel"][0, 0]
               + p["trunk"]["conv"]["bias"][None, None, None, :])
  return z.reshape(x.shape[0], -1)


def test_fedmmd_trunk_outputs_are_the_flattened_trunk_maps_which_dropout_never_touches(
    monkeypatch):
  weight, floor = 0.7, 1e-4
  setup = tiny_setup(1, tiny_classifier())
  data, images, labels = tiny_data(setup)
  x = flat_inputs(images)[0].reshape(-1, 32, 32, 3)
  y = jnp.asarray(labels[0])
  mask = jnp.ones(len(y), bool)

  def objective(outputs, rate):
    config = tiny_config("fedmmd", **{"fedmmd.outputs": outputs, "fedmmd.weight": weight,
                                      "fedmmd.mmd_floor": floor})
    config.models.dropout_rate = rate
    validate_config(config)
    return _fedmmd_and_local_loss(monkeypatch, config, setup)

  algorithm, loss_fn = objective("trunk", 0.0)
  global_params = algorithm.init(jax.random.key(0), data)["server"]["params"]
  noise = iter(jax.random.split(jax.random.key(5), 8))
  local_params = jax.tree_util.tree_map(
      lambda v: v + 0.3 * jax.random.normal(next(noise), v.shape), global_params)
  aux = {"global": {"params": global_params, "batch_stats": {}}, "round": jnp.int32(0)}

  def hand_loss(p):
    h = _tiny_trunk_map(p, x) @ p["tail"]["fc1"]["kernel"] + p["tail"]["fc1"]["bias"][None, :]
    logits = h @ p["head"]["kernel"] + p["head"]["bias"][None, :]
    penalty = _mmd(_tiny_trunk_map(global_params, x), _tiny_trunk_map(p, x), VARIANCES, floor)
    return _ce(logits, y) + weight * penalty, penalty

  def loss(fn, p, rng):
    value, (_, metrics) = fn(p, {}, x, y, mask, rng, aux)
    return value, metrics

  (value, metrics), grads = jax.value_and_grad(lambda p: loss(loss_fn, p, None),
                                               has_aux=True)(local_params)
  want_value, want_penalty = hand_loss(local_params)
  assert float(want_penalty) > 100 * floor   # the floor is not what is compared
  np.testing.assert_allclose(float(metrics["mmd"]), float(want_penalty), rtol=1e-5)
  np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
  _allclose(grads, jax.grad(lambda p: hand_loss(p)[0])(local_params), rtol=1e-4, atol=1e-6)
  # With dropout (p = 0.5 after the tail's Dense layer) the trunk penalty is the same for any
  # mask, while the CE (and the penalty on the dropped-out features) changes with the mask.
  _, dropped = objective("trunk", 0.5)
  _, features_dropped = objective("features", 0.5)
  for seed in (1, 2):
    rng = jax.random.key(seed)
    _, with_dropout = loss(dropped, local_params, rng)
    np.testing.assert_array_equal(with_dropout["mmd"], metrics["mmd"])
    assert float(with_dropout["ce"]) != float(metrics["ce"])
  on_features = [float(loss(features_dropped, local_params, jax.random.key(seed))[1]["mmd"])
                 for seed in (1, 2)]
  assert on_features[0] != on_features[1]


def test_fedfusion_multi_starts_as_the_plain_model_and_freezes_the_global_trunk():
  # gamma = 0 and E_g = E_l at the start of a round: the first step of (E_l, tail, head) is
  # FedAvg's step of the plain model, and gamma's gradient is exactly 0 (d/dgamma = E_g - E_l).
  setup = tiny_setup(2, tiny_classifier())
  fields = {"fedavg.evaluate": "local", "local.weight_decay": 0.1}
  fusion_alg = fedfusion.make_fedfusion(tiny_config("fedfusion", **{"fedfusion.fusion": "multi",
                                                                    **fields}), setup)
  plain_alg = fedavg.make_fedavg(tiny_config("fedavg", **fields), setup)
  data, _, _ = tiny_data(setup)
  fused_state = fusion_alg.init(jax.random.key(0), data)
  plain_state = plain_alg.init(jax.random.key(0), data)
  # Same starting weights for the plain model and FedFusion's local branch.
  server = fused_state["server"]
  plain_state["server"]["params"] = {"trunk": server["params"]["local_trunk"],
                                     "tail": server["params"]["tail"],
                                     "head": server["params"]["head"]}
  plain_state["server_opt"] = plain_alg.init(jax.random.key(0), data)["server_opt"]
  # At init the frozen trunk is already a copy of the trainable one.
  _allclose(server["params"]["global_trunk"], server["params"]["local_trunk"], 0, 0)
  new_fused, _ = jax.jit(fusion_alg.round)(fused_state, data, jax.random.key(1), jnp.int32(0))
  new_plain, _ = jax.jit(plain_alg.round)(plain_state, data, jax.random.key(1), jnp.int32(0))
  for k in range(2):
    fused_k = _row(new_fused["groups"]["a"]["variables"]["params"], k)
    plain_k = _row(new_plain["groups"]["a"]["variables"]["params"], k)
    _allclose({"trunk": fused_k["local_trunk"], "tail": fused_k["tail"],
               "head": fused_k["head"]}, plain_k)
    np.testing.assert_array_equal(fused_k["fusion"]["gamma"], np.zeros(2))
    # The frozen trunk did not move, weight decay 0.1 notwithstanding.
    _allclose(fused_k["global_trunk"], server["params"]["global_trunk"], 0, 0)


def test_fedfusion_gamma_is_an_ema_of_the_cohort_mean_and_the_trunk_reloads_each_round():
  setup = tiny_setup(2, tiny_classifier())
  config = tiny_config("fedfusion", **{"fedfusion.fusion": "multi", "fedavg.evaluate": "local",
                                       "local.epochs": 3})
  algorithm = fedfusion.make_fedfusion(config, setup)
  data, _, _ = tiny_data(setup)
  state = algorithm.init(jax.random.key(0), data)
  gamma_old = jnp.asarray([0.2, -0.1])
  state["server"]["params"]["fusion"]["gamma"] = gamma_old
  round_fn = jax.jit(algorithm.round)
  new, _ = round_fn(state, data, jax.random.key(1), jnp.int32(0))
  trained = new["groups"]["a"]["variables"]["params"]
  gammas = trained["fusion"]["gamma"]  # (2, channels)
  assert not np.allclose(gammas, gamma_old[None])  # gamma trained (E_l moved after step 1)
  mean = (SIZES[0] * gammas[0] + SIZES[1] * gammas[1]) / (SIZES[0] + SIZES[1])
  np.testing.assert_allclose(new["server"]["params"]["fusion"]["gamma"],
                             0.9 * gamma_old + 0.1 * mean, rtol=1e-6, atol=1e-7)
  # Everything else is the plain weighted mean.
  np.testing.assert_allclose(
      new["server"]["params"]["tail"]["fc1"]["kernel"],
      (SIZES[0] * trained["tail"]["fc1"]["kernel"][0]
       + SIZES[1] * trained["tail"]["fc1"]["kernel"][1]) / (SIZES[0] + SIZES[1]), rtol=1e-5)
  # The server keeps the trunk the round's clients froze (what the authors' code evaluates) ...
  _allclose(new["server"]["params"]["global_trunk"], state["server"]["params"]["local_trunk"])
  # ... and the next round's clients freeze the new averaged trunk.
  newer, _ = round_fn(new, data, jax.random.key(2), jnp.int32(1))
  frozen = _row(newer["groups"]["a"]["variables"]["params"]["global_trunk"], 0)
  _allclose(frozen, new["server"]["params"]["local_trunk"], 0, 0)


def test_fedfusion_conv_averages_plainly_and_sends_no_frozen_trunk():
  setup = tiny_setup(3, tiny_classifier())
  config = tiny_config("fedfusion", **{"fedfusion.fusion": "conv",
                                       "fedavg.clients_per_round": 2})
  algorithm = fedfusion.make_fedfusion(config, setup)
  data, _, _ = tiny_data(setup)
  state = algorithm.init(jax.random.key(0), data)
  _, metrics = jax.jit(algorithm.round)(state, data, jax.random.key(1), jnp.int32(0))
  params = state["server"]["params"]
  sent = sum(np.asarray(v).nbytes for key, tree in params.items() if key != "global_trunk"
             for v in jax.tree_util.tree_leaves(tree))
  # trunk 1x1 conv 3->2 (8), fusion 1x1 conv 4->2 (10), fc1 32->4 (132), head 4->3 (15).
  assert sent == 4 * (8 + 10 + 132 + 15)
  assert float(metrics["server"]["bytes_up"]) == 2 * sent
  assert float(metrics["server"]["bytes_down"]) == 2 * sent


def test_exponential_round_schedule_decays_per_round_down_to_the_floor():
  schedule = optim.exponential_round_schedule(0.003, 0.5, min_lr=0.0004)
  # 0.003, 0.0015, 0.00075, 0.000375 (<= floor: the code stops decaying after this step).
  got = [float(schedule(r)) for r in range(6)]
  np.testing.assert_allclose(got, [0.003, 0.0015, 0.00075, 0.000375, 0.000375, 0.000375],
                             rtol=1e-6)
  np.testing.assert_allclose(float(optim.exponential_round_schedule(0.002, 0.99)(100)),
                             0.002 * 0.99 ** 100, rtol=1e-5)
  with pytest.raises(ValueError, match="rate"):
    optim.exponential_round_schedule(0.1, 1.5)


def test_fedmmd_fedfusion_configs_validate_and_reject_bad_fields():
  for method in ("fedmmd", "fedfusion"):
    validate_config(base_config(method))
  cases = [("fedmmd", "fedmmd.constraint", "kl", r"config.fedmmd.constraint must be one of"),
           ("fedmmd", "fedmmd.outputs", "pixels", r"config.fedmmd.outputs must be one of"),
           ("fedmmd", "fedmmd.l2_reduction", "sum", r"config.fedmmd.l2_reduction must be one"),
           ("fedfusion", "fedfusion.fusion", "attention",
            r"config.fedfusion.fusion must be one of \('conv', 'multi', 'single'\)"),
           ("fedfusion", "fedfusion.gamma_ema", 1.0,
            r"config.fedfusion.gamma_ema must be a number in \[0, 1\)"),
           ("fedfusion", "local.lr_schedule", "cosine",
            r"config.local.lr_schedule must be one of \('linear', 'exponential'\)"),
           ("fedmmd", "local.lr_decay_rate", 0.0, r"config.local.lr_decay_rate must be a number"),
           ("fedavg", "local.momentum", 0.9, r"config.local.momentum must be 0 unless")]
  for method, field, value, message in cases:
    config = base_config(method)
    config.update_from_flattened_dict({field: value})
    with pytest.raises(ValueError, match=message):
      validate_config(config)


def test_fedfusion_conv_identity_init_starts_as_the_plain_model():
  base = tiny_classifier()
  fused = fedfusion.fuse(base, "conv", conv_init="identity")
  images = jnp.asarray(np.random.default_rng(0).random((5, 32, 32, 3)), jnp.float32)
  variables = fedfusion.load_global_trunk(fused.init(jax.random.key(0), images, train=False))
  kernel = variables["params"]["fusion"]["conv"]["kernel"]
  np.testing.assert_array_equal(kernel[0, 0], np.concatenate([np.eye(2), np.zeros((2, 2))]))
  np.testing.assert_array_equal(variables["params"]["fusion"]["conv"]["bias"], np.zeros(2))
  plain = {"params": {"trunk": variables["params"]["local_trunk"],
                      "tail": variables["params"]["tail"], "head": variables["params"]["head"]}}
  np.testing.assert_allclose(fused.apply(variables, images, train=False)[1],
                             base.apply(plain, images, train=False)[1], rtol=1e-6, atol=1e-6)
  # The torch initialisation (the default) does not: an extra random layer.
  torch_init = fedfusion.load_global_trunk(
      fedfusion.fuse(base, "conv").init(jax.random.key(0), images, train=False))
  assert not np.allclose(torch_init["params"]["fusion"]["conv"]["kernel"], kernel)
  with pytest.raises(ValueError, match=r"config.fedfusion.conv_init must be one of"):
    config = base_config("fedfusion")
    config.fedfusion.conv_init = "zeros"
    validate_config(config)


def test_mid_variants_are_the_paper_setting_with_the_stated_cuts_and_reach_the_data(
    tmp_path, monkeypatch):
  """`_mid` (configs/_two_stream.py `MID`): every field of the paper setting but MID's, the
  paper's targets and rounds; the registry's mid tables are exactly MID's settings; the cut
  sizes reach the scenario the trainer builds (2000 training images per client and 1000 test
  images per permuted domain)."""
  assert set(two_stream.MID) == set(tables.TWO_STREAM_MID)
  for name, setting in (("fedmmd_shards", "shards"), ("fedfusion_permuted_conv", "permuted"),
                        ("fedavg_shards_nodropout", "shards")):
    paper = mnist.get_config(name).to_dict()
    mid = mnist.get_config(f"{name}_mid").to_dict()
    cuts = two_stream.MID[("mnist", setting)]
    paper.pop("name"), mid.pop("name")
    for field, value in cuts.items():
      group, key = field.split(".")
      assert mid[group][key] == value != paper[group][key]
      mid[group][key] = paper[group][key]
    assert mid == paper  # nothing else differs: rounds, targets, rates, batch, clients
  assert mnist.get_config("fedavg_shards_mid").eval.targets == (97.0, 98.0)
  assert mnist.get_config("fedavg_permuted_mid").num_rounds == 300
  for bad, message in (("fedavg_binary_mid", "_mid exists for the settings mnist shards, "
                        "mnist permuted; got mnist binary"),
                       ("fedavg_shards_mid_quick", "then _quick or _mid")):
    with pytest.raises(ValueError, match=message):
      mnist.get_config(bad)
  assert [t for t in tables.TABLES if "mid" in tables.TABLES[t].scales
          and tables.TABLES[t].family == "partitioned"] == ["fedfusion_table2",
                                                            "fedmmd_mnist_shards"]
  monkeypatch.setenv("FEDJAX_HET_DATA_DIR", str(tmp_path))  # no data: the synthetic stand-in
  config = mnist.get_config("fedavg_permuted_mid")
  scenario = experiment.build_scenario(config)
  assert [len(split.labels) for split in scenario.train] == [2000, 2000]
  assert {d: len(t.labels) for d, t in scenario.test.items()} == {"mnist_perm0": 1000,
                                                                  "mnist_perm1": 1000}


def test_fedfusion_table2s_identity_start_row_is_the_conv_row_but_for_conv_init():
  """The diagnosis row of FedFusion Table 2 trains the Conv row's config at every scale with
  only fedfusion.conv_init changed."""
  table = tables.get_table("fedfusion_table2")
  for scale in table.scales:
    conv, identity = (cell_configs.cell_config(cell) for cell in cells_lib.plan(
        table, scale, [0], ["fedfusion_conv", "fedfusion_conv_identity"]))
    assert (conv.fedfusion.conv_init, identity.fedfusion.conv_init) == ("torch", "identity")
    identity.fedfusion.conv_init = "torch"
    assert identity.to_dict() == conv.to_dict()


def test_fedfusion_table2s_local_model_rows_are_their_rows_but_for_the_evaluation():
  """The local-model diagnosis rows of FedFusion Table 2 train FedAvg's and Conv's configs at
  every scale with only fedavg.evaluate changed (global -> local)."""
  table = tables.get_table("fedfusion_table2")
  for scale in table.scales:
    for row in LOCAL_MODEL_ROWS:
      base, local = (cell_configs.cell_config(cell) for cell in cells_lib.plan(
          table, scale, [0], [row, f"{row}_local"]))
      assert (base.fedavg.evaluate, local.fedavg.evaluate) == ("global", "local")
      local.fedavg.evaluate = "global"
      assert local.to_dict() == base.to_dict()


def test_fedfusion_table2s_code_data_rows_are_their_rows_on_the_even_odd_split():
  """The code's-data diagnosis rows of FedFusion Table 2 train FedAvg's and Conv's configs at
  every scale with only the partition (permuted -> permuted_classes) and the evaluation
  (global -> local) changed, each read against the FedAvg row of the same data."""
  table = tables.get_table("fedfusion_table2")
  rows = {r.key: r for r in table.settings[0].rows}
  for scale in table.scales:
    for row in ("fedavg", "fedfusion_conv"):
      base, code = (cell_configs.cell_config(cell) for cell in cells_lib.plan(
          table, scale, [0], [row, f"{row}_code_data"]))
      assert (base.scenario.partition, code.scenario.partition) == ("permuted",
                                                                    "permuted_classes")
      assert code.fedavg.evaluate == "local"
      code.scenario.partition, code.fedavg.evaluate = "permuted", "global"
      assert code.to_dict() == base.to_dict()
  assert rows["fedfusion_conv_code_data"].reference == "fedavg_code_data"


def test_fedfusion_table2s_code_augmentation_rows_are_the_code_data_rows_augmented():
  """The rows of the code's data and augmentation train the code's-data rows' configs at every
  scale with only `fedavg.augmentation` set, each read against FedAvg's row of the same setting."""
  table = tables.get_table("fedfusion_table2")
  rows = {r.key: r for r in table.settings[0].rows}
  for scale in table.scales:
    for row in ("fedavg", "fedfusion_conv"):
      code, augmented = (cell_configs.cell_config(cell) for cell in cells_lib.plan(
          table, scale, [0], [f"{row}_code_data", f"{row}_code_data_aug"]))
      assert (code.fedavg.augmentation, augmented.fedavg.augmentation) == (
          "none", "resized_crop_flip")
      augmented.fedavg.augmentation = "none"
      assert augmented.to_dict() == code.to_dict()
  assert rows["fedfusion_conv_code_data_aug"].reference == "fedavg_code_data_aug"


def test_committed_local_model_cells_train_as_their_rows():
  """The local-model rows of FedFusion Table 2 change only what is scored: every committed
  seed's training metrics (losses, bytes, cohort) equal its row's, round by round, to the bit
  (the readings say so)."""
  root = pathlib.Path(__file__).resolve().parents[1] / "results" / "fedfusion_table2"

  def train_metrics(cell_dir):
    return [{k: v for k, v in r.items() if k.startswith("train/")}
            for r in reports_common.read_records(cell_dir / "metrics.jsonl")]

  pairs = [(scale, row, seed) for scale in ("quick", "mid") for row in LOCAL_MODEL_ROWS
           for seed in range(3)
           if (root / scale / f"{row}_local__seed{seed}" / "results.json").exists()
           and (root / scale / f"{row}__seed{seed}" / "results.json").exists()]
  if not pairs:
    pytest.skip("no committed local-model cell beside its row's")
  for scale, row, seed in pairs:
    plain = train_metrics(root / scale / f"{row}__seed{seed}")
    local = train_metrics(root / scale / f"{row}_local__seed{seed}")
    assert plain and local == plain, (scale, row, seed)

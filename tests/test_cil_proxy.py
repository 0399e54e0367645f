"""Tests of GLFC's proxy server in training (`fedjax_het.cil.proxy`) and its use by `algorithms.glfc`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses, models
from fedjax_het.cil import gradient_inversion as gi
from fedjax_het.algorithms import cil_replay
from fedjax_het.algorithms import glfc as glfc_lib
from fedjax_het.cil import masking
from fedjax_het.cil import proxy as proxy_lib
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import validate_config
from fedjax_het.train import train_and_evaluate
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import rounds
from tests.test_cil_train import set_field, tiny_cil_config, tiny_settings, tiny_stream
from tests.tiny_models import TinyLinear

C = 4
FAST = proxy_lib.ProxySettings(reconstruction_steps=6, monitor_images=3, perturbation_steps=2)
#: FAST with the mid configs' computation: the used slots only, 2 at a time, im2col encoder.
FAST_CHUNKED = proxy_lib.ProxySettings(reconstruction_steps=6, monitor_images=3,
                                       perturbation_steps=2, reconstruction_chunk=2,
                                       encoder_conv_impl="im2col")


def _variables(seed, model=None):
  return models.init_variables(model or TinyLinear(num_classes=C), jax.random.key(seed))


def _state(pool=2, settings=FAST):
  encoder = proxy_lib.make_encoder(C)
  return encoder, proxy_lib.init_proxy_state(jax.random.key(0), encoder, _variables(1), pool,
                                             settings, (32, 32, 3), C)


def _forward(model):
  return cil_replay.make_eval_forward(model, normalizer((0.5,) * 3, (0.25,) * 3), 4)


def _numpy_accuracy(model, variables, images, labels, valid, num_seen):
  _, logits = _forward(model)(variables, images)
  logits = np.asarray(logits)[:, :num_seen]
  correct = (logits.argmax(-1) == np.asarray(labels)) & np.asarray(valid)
  return correct.sum() / max(1, np.asarray(valid).sum())


@pytest.mark.parametrize("has_previous,has_current,signal,expect,exists", [
    (False, False, False, "previous", False),
    (False, False, True, "previous", False),
    (False, True, False, "previous", False),   # no Theta_{t-1} yet
    (False, True, True, "current", True),
    (True, True, False, "previous", True),
    (True, True, True, "current", True),
])
def test_old_model_choice(has_previous, has_current, signal, expect, exists):
  _, state = _state()
  state = state._replace(previous=_variables(2), current=_variables(3),
                         has_previous=jnp.asarray(has_previous),
                         has_current=jnp.asarray(has_current))
  chosen, ok = jax.jit(proxy_lib.old_model_for)(state, jnp.asarray(signal))
  chex.assert_trees_all_equal(chosen, getattr(state, expect))
  assert bool(ok) == exists


def test_client_gradients_use_the_nearest_mean_prototype_and_carry_its_label():
  model = TinyLinear(num_classes=C)
  variables = _variables(4)
  encoder, state = _state()
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
  labels = np.array([0, 0, 0, 2, 2, 2, 2, 1, 1, 1], np.int32)
  valid = np.arange(10) < 9                      # the last row is padding
  classes = jnp.asarray([2, 0, -1], jnp.int32)   # one empty slot
  settings = proxy_lib.ProxySettings(perturbation_steps=0)  # the clean prototype
  forward = _forward(model)
  grads, ok = jax.jit(lambda: proxy_lib.client_prototype_gradients(
      model, variables, encoder, state.encoder, images=jnp.asarray(images),
      labels=jnp.asarray(labels), valid=jnp.asarray(valid), classes=classes,
      class_mask=masking.seen_class_mask(3, C), key=jax.random.key(5), forward=forward,
      preprocess=normalizer((0.5,) * 3, (0.25,) * 3), proxy=settings))()
  np.testing.assert_array_equal(ok, [True, True, False])
  features = np.asarray(forward(variables, jnp.asarray(images))[0], np.float64)
  for slot, cls in enumerate([2, 0]):
    rows = np.nonzero((labels == cls) & valid)[0]
    f = features[rows] / np.linalg.norm(features[rows], axis=1, keepdims=True)
    proto = rows[np.argmin(np.linalg.norm(f - f.mean(0), axis=1))]  # NumPy reference
    expect = gi.prototype_gradient(encoder, state.encoder, images[proto] / 255.0, cls)
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda g, s=slot: g[s], grads), expect,
                                rtol=1e-4, atol=1e-5)
    assert int(gi.infer_label(jax.tree_util.tree_map(lambda g, s=slot: g[s], grads))) == cls


def test_perturbation_moves_the_shared_prototype():
  model = TinyLinear(num_classes=C)
  encoder, state = _state()
  images = jnp.asarray(np.random.default_rng(1).integers(0, 256, (4, 32, 32, 3), np.uint8))
  args = dict(images=images, labels=jnp.asarray([1, 1, 1, 1]), valid=jnp.ones((4,), bool),
              classes=jnp.asarray([1]), class_mask=masking.seen_class_mask(2, C),
              key=jax.random.key(0), forward=_forward(model),
              preprocess=normalizer((0.5,) * 3, (0.25,) * 3))
  clean, _ = proxy_lib.client_prototype_gradients(
      model, _variables(4), encoder, state.encoder, proxy=proxy_lib.ProxySettings(
          perturbation_steps=0), **args)
  moved, _ = proxy_lib.client_prototype_gradients(
      model, _variables(4), encoder, state.encoder, proxy=proxy_lib.ProxySettings(
          perturbation_steps=5, perturbation_lr=1.0), **args)
  diff = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), clean, moved)
  assert max(jax.tree_util.tree_leaves(diff)) > 0


def _pool(encoder, encoder_vars, images, labels):
  return jax.vmap(lambda x, y: gi.prototype_gradient(encoder, encoder_vars, x, y))(
      jnp.asarray(images), jnp.asarray(labels))


def test_server_update_rebuilds_the_monitor_set_and_selects_by_accuracy():
  model = TinyLinear(num_classes=C)
  forward = _forward(model)
  encoder, state = _state(pool=3)
  rng = np.random.default_rng(2)
  images = rng.uniform(0, 1, (3, 32, 32, 3)).astype(np.float32)
  labels = np.array([1, 0, 3], np.int32)
  pool = _pool(encoder, state.encoder, images, labels)
  valid = jnp.asarray([True, True, False])
  class_mask = masking.seen_class_mask(2, C)
  update = jax.jit(lambda s, g, gv, key: proxy_lib.server_update(
      s, g, gradients=pool, gradient_valid=gv, true_labels=jnp.asarray(labels), key=key,
      class_mask=class_mask, encoder=encoder, forward=forward, proxy=FAST))
  first = _variables(7)
  old_current = state.current
  state1, metrics1 = update(state, first, valid, jax.random.key(1))
  # The monitor set: FAST.monitor_images reconstructions per gradient, inferred labels.
  np.testing.assert_array_equal(state1.monitor_valid, np.repeat([True, True, False], 3))
  np.testing.assert_array_equal(state1.monitor_labels, np.repeat(labels, 3))
  expect_images, _ = gi.reconstruct_batch(encoder, state.encoder, pool, jnp.asarray(labels),
                                          jax.random.key(1), steps=6, keep_last=3,
                                          linesearch="none", learning_rate=1.0)
  # jit vs eager float32 rounding may move a pixel by one grey level
  np.testing.assert_allclose(np.asarray(state1.monitor_images, np.int32),
                             np.asarray(gi.to_uint8(expect_images), np.int32).reshape(
                                 9, 32, 32, 3), atol=1)
  assert int(metrics1["proxy/gradients"]) == 2 and int(metrics1["proxy/labels_correct"]) == 2
  acc1 = _numpy_accuracy(model, first, state1.monitor_images, state1.monitor_labels,
                         state1.monitor_valid, 2)
  np.testing.assert_allclose(metrics1["proxy/monitor_accuracy"], acc1, rtol=1e-6)
  # A new monitor set: the old current best becomes the previous one, the new model is kept.
  chex.assert_trees_all_equal(state1.previous, old_current)
  assert not bool(state1.has_previous) and bool(state1.has_current)
  assert bool(metrics1["proxy/selected"])
  chex.assert_trees_all_equal(state1.current, first)

  # No gradients: the monitor set stays; a model is kept only if at least as accurate.
  no = jnp.zeros((3,), bool)
  for seed in range(8, 16):
    candidate = _variables(seed)
    acc = _numpy_accuracy(model, candidate, state1.monitor_images, state1.monitor_labels,
                          state1.monitor_valid, 2)
    state2, metrics2 = update(state1, candidate, no, jax.random.key(2))
    np.testing.assert_array_equal(state2.monitor_images, state1.monitor_images)
    assert int(metrics2["proxy/gradients"]) == 0
    kept = acc >= float(state1.best_accuracy)
    assert bool(metrics2["proxy/selected"]) == kept
    chex.assert_trees_all_equal(state2.current, candidate if kept else state1.current)
    chex.assert_trees_all_equal(state2.previous, state1.previous)

  # The next pool: Theta_t becomes Theta_{t-1}.
  state3, _ = update(state1, _variables(20), valid, jax.random.key(3))
  chex.assert_trees_all_equal(state3.previous, state1.current)
  assert bool(state3.has_previous)


def test_empty_proxy_selects_nothing():
  model = TinyLinear(num_classes=C)
  encoder, state = _state(pool=1)
  pool = _pool(encoder, state.encoder, np.zeros((1, 32, 32, 3), np.float32), [0])
  new, metrics = jax.jit(lambda s: proxy_lib.server_update(
      s, _variables(9), gradients=pool, gradient_valid=jnp.zeros((1,), bool),
      true_labels=jnp.zeros((1,), jnp.int32), key=jax.random.key(0),
      class_mask=masking.seen_class_mask(2, C), encoder=encoder, forward=_forward(model),
      proxy=FAST))(state)
  assert not bool(metrics["proxy/selected"]) and float(metrics["proxy/monitor_accuracy"]) == -1
  assert not bool(new.has_current)


# ----------------------------------------------------------------------------
# The proxy inside GLFC's round.
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stream():
  return tiny_stream()


def _glfc_with_proxy(stream, transition="stream", proxy=FAST):
  return glfc_lib.GLFCSettings(memory_size=8, transition=transition, threshold=1.2,
                               distinct=False, max_per_class=8,
                               max_client_classes=int(stream.client_classes.sum(-1).max()),
                               old_model="proxy", proxy=proxy)


def _settings(**overrides):
  return tiny_settings(**{"batch_size": 16, **overrides})


# The chunked proxy's round (20-30 s on a 2-core CPU) is slow: the chunked and the whole-pool
# reconstructions build the same monitor set in the default suite
# (test_server_update_with_chunks_and_im2col_builds_the_same_monitor_set).
@pytest.mark.parametrize("sequential,proxy", [
    (False, FAST), pytest.param(False, FAST_CHUNKED, marks=pytest.mark.slow),
    pytest.param(True, FAST, marks=pytest.mark.slow)])
def test_glfc_round_with_proxy_traces_once_and_distils_from_the_proxy(stream, sequential,
                                                                       proxy, monkeypatch):
  made = []
  make_encoder = proxy_lib.make_encoder
  monkeypatch.setattr(proxy_lib, "make_encoder",
                      lambda *args: made.append(args) or make_encoder(*args))
  model = TinyLinear(num_classes=stream.num_classes)
  algorithm = glfc_lib.make_glfc(_settings(sequential=sequential),
                                 _glfc_with_proxy(stream, proxy=proxy),
                                 model, stream.mean, stream.std, stream.max_client_size,
                                 eval_batch_size=16)
  run = jax.jit(chex.assert_max_traces(
      rounds.make_run_rounds(rounds.make_round_fn(algorithm), 1), n=1))
  data = jax.device_put(cil_stream.stream_arrays(stream))
  state = rounds.initial_state(algorithm, jax.random.key(0), data)
  assert "old_model" not in state and "proxy" in state
  assert [args[2] for args in made] == [proxy.encoder_conv_impl]  # the encoder it computes with
  chex.clear_trace_counter()
  held = stream.client_classes.sum(-1)
  for r in range(4):  # rounds 0, 1 (task 0), 2, 3 (task 1)
    before = state
    state, metrics = run(state, data)
    metrics = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], metrics)
    task = int(metrics["task"])
    assert task == r // 2
    clients = metrics["clients"]
    first = np.asarray(before["clients"].task)[clients] < 0
    moved = ~first & np.any(stream.client_classes[task, clients]
                            != stream.client_classes[np.maximum(
                                np.asarray(before["clients"].task)[clients], 0), clients], -1)
    signal = first | moved  # transition="stream"
    assert int(metrics["glfc/signals"]) == signal.sum()
    # One gradient per class held by each signalling client, labels recovered.
    assert int(metrics["proxy/gradients"]) == held[task, clients][signal].sum()
    assert int(metrics["proxy/labels_correct"]) == int(metrics["proxy/gradients"])
    # Who distils (task >= 1): from Theta_t if signalling, else from an existing Theta_{t-1}.
    p = before["proxy"]
    exists = np.where(signal, bool(p.has_current), bool(p.has_previous & p.has_current))
    assert int(metrics["glfc/distilling"]) == (exists.sum() if task > 0 else 0)
    if int(metrics["proxy/gradients"]) > 0 or bool(before["proxy"].has_current):
      assert float(metrics["proxy/monitor_accuracy"]) >= 0
  assert bool(state["proxy"].has_current)


@pytest.mark.slow  # test_cil_glfc's end-to-end run trains the default config (proxy on)
def test_glfc_config_with_proxy_trains_end_to_end(tmp_path):
  config = tiny_cil_config("glfc")
  config.glfc.memory_size = 8
  config.glfc.proxy.reconstruction_steps = 5
  config.glfc.proxy.monitor_images = 2
  out = train_and_evaluate(config, tmp_path)
  assert out["rounds_done"] == 4
  records = out["records"]
  assert all("proxy/monitor_accuracy" in r and "proxy/gradients" in r for r in records)
  assert sum(r["proxy/gradients"] for r in records) > 0


@pytest.mark.parametrize("field,value,allowed", [
    ("glfc.old_model", "oracle", "one of ('proxy', 'previous_task_global')"),
    ("glfc.proxy.linesearch", "armijo", "one of ('zoom', 'none')"),
    ("glfc.proxy.monitor_images", 0, "an integer in [1, glfc.proxy.reconstruction_steps"),
    ("glfc.proxy.noise_gamma", -0.1, "a number >= 0"),
    ("glfc.proxy.perturbation_loss", "mse", "one of ('bce', 'ce')"),
    ("glfc.proxy.rebuild", "sometimes", "one of ('any_gradients', 'new_classes')"),
    ("glfc.proxy.reconstruction_chunk", -1, "an integer >= 0 (0: the whole pool)"),
    ("glfc.proxy.encoder_conv_impl", "fft", "one of ('xla', 'im2col'"),
])
def test_bad_proxy_fields_are_refused(field, value, allowed):
  config = tiny_cil_config("glfc")
  set_field(config, field, value)
  with pytest.raises(Exception, match=f"config.{field}") as error:
    validate_config(config)
  assert allowed in str(error.value)


def test_new_classes_rule_rebuilds_only_from_unseen_classes():
  model = TinyLinear(num_classes=C)
  settings = proxy_lib.ProxySettings(reconstruction_steps=6, monitor_images=3,
                                     perturbation_steps=2, rebuild="new_classes")
  encoder, state = _state(pool=3, settings=settings)
  images = np.random.default_rng(3).uniform(0, 1, (3, 32, 32, 3)).astype(np.float32)
  labels = np.array([1, 0, 3], np.int32)
  pool = _pool(encoder, state.encoder, images, labels)
  update = jax.jit(lambda s, g, gv: proxy_lib.server_update(
      s, g, gradients=pool, gradient_valid=gv, true_labels=jnp.asarray(labels),
      key=jax.random.key(1), class_mask=masking.seen_class_mask(4, C), encoder=encoder,
      forward=_forward(model), proxy=settings))
  state1, m1 = update(state, _variables(7), jnp.asarray([True, True, False]))
  np.testing.assert_array_equal(state1.known, [True, True, False, False])
  assert int(m1["proxy/rebuilt_from"]) == 2
  # The same classes again: no rebuild, no shift of the best models.
  state2, m2 = update(state1, _variables(8), jnp.asarray([True, True, False]))
  assert int(m2["proxy/gradients"]) == 2 and int(m2["proxy/rebuilt_from"]) == 0
  np.testing.assert_array_equal(state2.monitor_images, state1.monitor_images)
  chex.assert_trees_all_equal(state2.previous, state1.previous)
  # A new class among known ones: the monitor set holds the new class only; shift.
  state3, m3 = update(state2, _variables(9), jnp.asarray([True, True, True]))
  assert int(m3["proxy/rebuilt_from"]) == 1
  np.testing.assert_array_equal(state3.monitor_valid, np.repeat([False, False, True], 3))
  chex.assert_trees_all_equal(state3.previous, state2.current)
  np.testing.assert_array_equal(state3.known, [True, True, False, True])


# ----------------------------------------------------------------------------
# How the reconstructions are computed: the used slots only, the encoder's convolutions.
# ----------------------------------------------------------------------------


def _five_slot_pool():
  encoder = proxy_lib.make_encoder(C)
  variables = models.init_variables(encoder, jax.random.key(0), input_shape=(1, 32, 32, 3))
  images = np.random.default_rng(4).uniform(0, 1, (5, 32, 32, 3)).astype(np.float32)
  labels = jnp.asarray([1, 0, 3, 2, 1], jnp.int32)
  return encoder, variables, _pool(encoder, variables, images, labels), labels


# Slow: chunk 3 (one group of exactly the 3 used slots, about 10 s on a 2-core CPU); chunk 1
# (groups that hold the used slots exactly) and chunk 7 (one group) keep the check in the default
# suite.
@pytest.mark.parametrize("chunk", [1, 2, pytest.param(3, marks=pytest.mark.slow), 7])
def test_reconstruct_used_is_the_pools_reconstruction_of_the_used_slots(chunk):
  encoder, variables, pool, labels = _five_slot_pool()
  use = jnp.asarray([False, True, False, True, True])
  options = dict(steps=6, keep_last=3, learning_rate=1.0, linesearch="none")
  whole, whole_losses = jax.jit(lambda: gi.reconstruct_batch(
      encoder, variables, pool, labels, jax.random.key(1), **options))()
  used, used_losses = jax.jit(lambda: gi.reconstruct_used(
      encoder, variables, pool, labels, use, jax.random.key(1), chunk=chunk, **options))()
  assert used.shape == whole.shape and used_losses.shape == whole_losses.shape
  # Each used slot draws the pool's dummy for that slot: the same reconstruction up to the
  # rounding of a differently batched program.
  np.testing.assert_allclose(used[np.asarray(use)], whole[np.asarray(use)], atol=1e-3)
  np.testing.assert_allclose(used_losses[np.asarray(use)], whole_losses[np.asarray(use)],
                             rtol=1e-3)
  # ceil(3 / chunk) groups of the used slots first (pool order 1, 3, 4, then 0, 2): a slot
  # after the last group stays zero; one inside it may hold a reconstruction.
  groups = -(-3 // chunk)
  reached = [1, 3, 4, 0, 2][:groups * chunk]
  for slot in (0, 2):
    if slot not in reached:
      assert not np.any(np.asarray(used[slot])) and not np.any(np.asarray(used_losses[slot]))
    else:
      np.testing.assert_allclose(used[slot], whole[slot], atol=1e-3)


def test_reconstruct_used_with_nothing_used_reconstructs_nothing():
  encoder, variables, pool, labels = _five_slot_pool()
  images, histories = gi.reconstruct_used(encoder, variables, pool, labels,
                                          jnp.zeros((5,), bool), jax.random.key(1), chunk=2,
                                          steps=4, keep_last=1, learning_rate=1.0,
                                          linesearch="none")
  assert not np.any(np.asarray(images)) and not np.any(np.asarray(histories))
  with pytest.raises(ValueError, match="`chunk` must be an integer >= 1"):
    gi.reconstruct_used(encoder, variables, pool, labels, jnp.ones((5,), bool),
                        jax.random.key(1), chunk=0, steps=4)


def test_im2col_encoder_matches_the_stock_encoder_in_the_gradient_matching_loss():
  """The reconstruction differentiates the encoder's parameter gradient with respect to the
  image (second order): the im2col convolutions' hand-written backward must be differentiable
  to the stock convolutions' values."""
  stock, im2col = proxy_lib.make_encoder(C), proxy_lib.make_encoder(C, conv_impl="im2col")
  variables = models.init_variables(stock, jax.random.key(0), input_shape=(1, 32, 32, 3))
  rng = np.random.default_rng(5)
  target = gi.prototype_gradient(stock, variables,
                                 jnp.asarray(rng.uniform(0, 1, (32, 32, 3)), jnp.float32), 2)
  x = jnp.asarray(rng.normal(size=(32, 32, 3)), jnp.float32)

  def loss(encoder, x):
    return losses.gradient_matching_loss(
        gradients=gi.prototype_gradient(encoder, variables, x, 2), target_gradients=target)

  value, grad = jax.value_and_grad(lambda x: loss(stock, x))(x)
  value2, grad2 = jax.value_and_grad(lambda x: loss(im2col, x))(x)
  assert float(value) > 1.0  # far from the target: a loss and gradient worth comparing
  np.testing.assert_allclose(value2, value, rtol=1e-5)
  np.testing.assert_allclose(grad2, grad, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(grad))))


def test_server_update_with_chunks_and_im2col_builds_the_same_monitor_set():
  model = TinyLinear(num_classes=C)
  images = np.random.default_rng(6).uniform(0, 1, (4, 32, 32, 3)).astype(np.float32)
  labels = np.array([1, 0, 3, 2], np.int32)
  valid = jnp.asarray([True, False, True, True])
  out = {}
  for name, settings in (("pool", FAST), ("chunks", FAST_CHUNKED)):
    encoder, state = _state(pool=4, settings=settings)
    pool = _pool(encoder, state.encoder, images, labels)
    out[name] = jax.jit(lambda s: proxy_lib.server_update(
        s, _variables(7), gradients=pool, gradient_valid=valid, true_labels=jnp.asarray(labels),
        key=jax.random.key(1), class_mask=masking.seen_class_mask(4, C), encoder=encoder,
        forward=_forward(model), proxy=settings))(state)
  (pool_state, pool_metrics), (chunk_state, chunk_metrics) = out["pool"], out["chunks"]
  np.testing.assert_array_equal(chunk_state.monitor_valid, pool_state.monitor_valid)
  np.testing.assert_array_equal(chunk_state.monitor_labels, pool_state.monitor_labels)
  used = np.asarray(pool_state.monitor_valid)
  np.testing.assert_allclose(np.asarray(chunk_state.monitor_images, np.int32)[used],
                             np.asarray(pool_state.monitor_images, np.int32)[used], atol=1)
  for key in ("proxy/gradients", "proxy/rebuilt_from", "proxy/labels_correct",
              "proxy/selected"):
    assert int(chunk_metrics[key]) == int(pool_metrics[key]), key
  np.testing.assert_allclose(chunk_metrics["proxy/reconstruction_loss"],
                             pool_metrics["proxy/reconstruction_loss"], rtol=1e-4)


def test_proxy_settings_read_the_computation_fields():
  config = tiny_cil_config("glfc")
  assert proxy_lib.ProxySettings.from_config(config).reconstruction_chunk == 0
  assert proxy_lib.ProxySettings.from_config(config).encoder_conv_impl == "xla"
  config.glfc.proxy.reconstruction_chunk = 6
  config.glfc.proxy.encoder_conv_impl = "im2col"
  validate_config(config)
  settings = proxy_lib.ProxySettings.from_config(config)
  assert (settings.reconstruction_chunk, settings.encoder_conv_impl) == (6, "im2col")

"""GLFC's protocol switches: per-round client roles, every client's update, the shuffled pool.

`scenario.client_roles` (`cil.stream.draw_round_roles`), `glfc.update_all_clients`
(`algorithms.glfc`) and `glfc.proxy.shuffle_gradients` (`cil.proxy.shuffle_pool`), each
against an independent computation.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import losses, models
from fedjax_het.algorithms import cil_replay
from fedjax_het.algorithms import glfc as glfc_lib
from fedjax_het.cil import gradient_inversion as gi
from fedjax_het.cil import masking
from fedjax_het.cil import proxy as proxy_lib
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import validate_config
from fedjax_het.data import incremental
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import rounds
from fedjax_het.train import train_and_evaluate
from tests.test_cil_train import set_field, tiny_cil_config, tiny_settings
from tests.tiny_models import TinyLinear

A, O, B, N = (cil_stream.ROLE_ABSENT, cil_stream.ROLE_OLD, cil_stream.ROLE_IN_BETWEEN,
              cil_stream.ROLE_NEW)


# ----------------------------------------------------------------------------
# Per-round roles.
# ----------------------------------------------------------------------------


def _roles(shift, seed=0):
  return cil_stream.draw_round_roles(num_tasks=3, rounds_per_task=2, initial_clients=2,
                                     new_clients_per_task=1, shift_fraction=shift, seed=seed)


@pytest.mark.parametrize("shift,expect_tasks,expect_roles", [
    # No veteran moves: clients 0, 1 keep task 0's data; client 2 (joined in round 3) keeps
    # task 1's data in task 2; client 3 joins in round 5.
    (0.0, [[0, 0, -1, -1], [0, 0, -1, -1], [0, 0, -1, -1], [0, 0, 1, -1], [0, 0, 1, -1],
           [0, 0, 1, 2]],
     [[N, N, A, A], [N, N, A, A], [O, O, A, A], [O, O, N, A], [O, O, O, A], [O, O, O, N]]),
    # Every veteran moves: everyone holds the round's task.
    (1.0, [[0, 0, -1, -1], [0, 0, -1, -1], [1, 1, -1, -1], [1, 1, 1, -1], [2, 2, 2, -1],
           [2, 2, 2, 2]],
     [[N, N, A, A], [N, N, A, A], [B, B, A, A], [B, B, N, A], [B, B, B, A], [B, B, B, N]]),
])
def test_round_roles_match_a_hand_enumeration(shift, expect_tasks, expect_roles):
  # 3 tasks of 2 rounds; 2 initial clients, 1 more per task. Seed 0 draws the joining rounds
  # 3 (task 1's second round) and 5 (task 2's second round).
  tasks, roles, join = _roles(shift)
  np.testing.assert_array_equal(join, [0, 0, 3, 5])
  np.testing.assert_array_equal(tasks, expect_tasks)
  np.testing.assert_array_equal(roles, expect_roles)


def test_round_roles_are_redrawn_every_round():
  num_tasks, per_task, initial, new, shift = 4, 5, 6, 3, 0.5
  tasks, roles, join = cil_stream.draw_round_roles(
      num_tasks=num_tasks, rounds_per_task=per_task, initial_clients=initial,
      new_clients_per_task=new, shift_fraction=shift, seed=3)
  # Joining rounds: anywhere in the joining task, not only at its start.
  for t in range(1, num_tasks):
    ids = initial + (t - 1) * new + np.arange(new)
    assert ((join[ids] >= t * per_task) & (join[ids] < (t + 1) * per_task)).all()
  assert (join[initial:] % per_task != 0).any()
  latest = np.full(join.size, -1)   # an independent replay of the rules
  changed = 0
  for t in range(num_tasks):
    earlier = latest.copy()
    veterans = join < t * per_task
    between_sets = set()
    for r in range(t * per_task, (t + 1) * per_task):
      present = join <= r
      np.testing.assert_array_equal(roles[r] == A, ~present)
      np.testing.assert_array_equal(roles[r] == N, present & ~veterans)
      assert (roles[r][veterans] != N).all() and (roles[r][veterans] != A).all()
      assert (roles[r] == B).sum() == int(round(shift * veterans.sum()))
      np.testing.assert_array_equal(tasks[r][(roles[r] == B) | (roles[r] == N)], t)
      np.testing.assert_array_equal(tasks[r][roles[r] == O], earlier[roles[r] == O])
      assert (tasks[r][roles[r] == O] < t).all() and (tasks[r][roles[r] == O] >= 0).all()
      latest[(roles[r] == B) | (roles[r] == N)] = t
      between_sets.add(tuple(np.nonzero(roles[r] == B)[0]))
    changed += len(between_sets) > 1
  assert changed == num_tasks - 1  # every task after the first re-splits its veterans


def _config(method="glfc", roles="per_round"):
  config = tiny_cil_config(method)
  config.scenario.client_roles = roles
  return config


def test_per_round_stream_holds_each_task_s_draw_and_per_task_is_unchanged():
  config = _config()
  stream = cil_stream.build_stream(config)
  assert isinstance(stream, cil_stream.RoundRoleStream)
  tasks, roles, _ = cil_stream.draw_round_roles(
      num_tasks=2, rounds_per_task=2, initial_clients=3, new_clients_per_task=1,
      shift_fraction=config.scenario.shift_fraction, seed=0)
  np.testing.assert_array_equal(stream.round_tasks, tasks)
  np.testing.assert_array_equal(stream.round_roles, roles)
  # Every client present at a task holds its own draw of that task's classes.
  per_client = int(round(config.scenario.class_fraction * 2))
  for t in range(2):
    held = stream.client_classes[t][stream.client_joined[t]]
    np.testing.assert_array_equal(held.sum(-1), per_client)
    assert not held[:, [c for c in range(4) if c // 2 != t]].any()
  # per_task: the stream of data.incremental, fingerprint and all; rows = the round's task.
  default = cil_stream.build_stream(_config(roles="per_task"))
  direct = incremental.build_class_incremental_stream(
      num_tasks=2, num_classes=4, initial_clients=3, new_clients_per_task=1,
      source="synthetic", train_size=48, test_size=20, seed=0)
  assert type(default) is incremental.ClassIncrementalStream
  assert cil_stream.stream_fingerprint(default) == cil_stream.stream_fingerprint(direct)
  assert cil_stream.stream_fingerprint(stream) != cil_stream.stream_fingerprint(direct)
  data = cil_stream.stream_arrays(default)
  assert data.round_tasks is None and data.round_roles is None
  settings = tiny_settings()
  rows = jax.jit(lambda r: cil_stream.client_tasks(data, r, settings))
  for r in range(4):
    np.testing.assert_array_equal(rows(r), np.where(direct.client_joined[r // 2], r // 2, -1))
  per_round = cil_stream.stream_arrays(stream)
  for r in range(4):
    np.testing.assert_array_equal(cil_stream.client_tasks(per_round, r, settings), tasks[r])


# ----------------------------------------------------------------------------
# GLFC's round with the switches.
# ----------------------------------------------------------------------------


def _glfc(stream, **overrides):
  return glfc_lib.GLFCSettings(memory_size=6, transition="stream", threshold=1.2,
                               distinct=False, max_per_class=6,
                               max_client_classes=int(stream.client_classes.sum(-1).max()),
                               **overrides)


def _round(stream, settings, glfc, data):
  model = TinyLinear(num_classes=stream.num_classes)
  algorithm = glfc_lib.make_glfc(settings, glfc, model, stream.mean, stream.std,
                                 stream.max_client_size, eval_batch_size=16)
  return algorithm, jax.jit(rounds.make_round_fn(algorithm))


def _per_round_case():
  """A per-round stream of one round per task: round 1 is task 1. Veterans 0-2 are re-split
  (shift 0.5: 2 in-between, 1 old); client 3 joins. 2 clients sampled per round."""
  config = _config()
  config.cil.rounds_per_task = 1
  config.scenario.shift_fraction = 0.5
  stream = cil_stream.build_stream(config)
  assert sorted(stream.round_roles[1].tolist()) == [O, B, B, N]
  settings = tiny_settings(batch_size=16, rounds_per_task=1)
  return stream, settings, jax.device_put(cil_stream.stream_arrays(stream))


def _take(tree, ids):
  return jax.tree_util.tree_map(lambda x: np.asarray(x)[ids], tree)


def test_update_all_clients_updates_every_present_client_on_a_per_round_stream():
  stream, settings, data = _per_round_case()
  algorithm, on = _round(stream, settings, _glfc(stream, update_all_clients=True), data)
  state0, m0 = on(rounds.initial_state(algorithm, jax.random.key(4), data), data)
  state1, m1 = on(state0, data)
  model = TinyLinear(num_classes=4)
  forward = jax.jit(cil_replay.make_eval_forward(model, normalizer(stream.mean, stream.std), 16))
  stored = 0
  for r, (before, after, metrics) in enumerate(((None, state0, m0), (state0, state1, m1))):
    rows, roles = stream.round_tasks[r], stream.round_roles[r]
    sampled = np.asarray(metrics["clients"])
    assert (rows[sampled] >= 0).all()   # sampled among the clients present at the round
    for code, name in enumerate(cil_stream.ROLE_NAMES[1:], start=1):
      assert int(metrics[f"glfc/roles/{name}"]) == int((roles[sampled] == code).sum())
    # Every present client holds its row of the round; absent clients stay untouched.
    np.testing.assert_array_equal(np.asarray(after["clients"].task), rows)
    assert int(metrics["glfc/unsampled/updated"]) == (rows >= 0).sum() - sampled.size
    if before is None:
      continue
    # Round 1: each unsampled client's entropy is the received model's on its row's data,
    # and a client that moved stored its previous classes (transitions from the stream).
    for client in np.setdiff1d(np.arange(4), sampled):
      row = int(rows[client])
      valid = np.arange(stream.max_client_size) < stream.client_sizes[row, client]
      _, logits = forward(before["server"], stream.images[stream.client_indices[row, client]])
      entropy = losses.glfc.mean_prediction_entropy(
          logits=logits, class_mask=masking.seen_class_mask(4, 4), mask=valid)
      np.testing.assert_allclose(after["clients"].entropy[client], entropy, rtol=1e-5)
      previous = int(before["clients"].task[client])
      now = stream.client_classes[row, client]
      expected = ([] if previous < 0 or previous == row else
                  sorted(int(c) for c in np.nonzero(stream.client_classes[previous, client])[0]
                         if not now[c]))
      memory = _take(after["clients"].memory, client)
      labels = np.asarray(memory.labels)[np.asarray(memory.valid)]
      assert sorted(set(labels.tolist())) == expected
      if expected:
        assert labels.size == 6 // len(expected) * len(expected)
        stored += 1
  assert stored >= 1   # a non-sampled client stored exemplars of its previous classes


@pytest.mark.slow  # ~50 s on a busy 2-core CPU: a second compilation of the round
def test_update_all_clients_leaves_the_sampled_clients_as_without_it():
  stream, settings, data = _per_round_case()
  off_alg, off = _round(stream, settings, _glfc(stream), data)
  _, on = _round(stream, settings, _glfc(stream, update_all_clients=True), data)
  state0, _ = off(rounds.initial_state(off_alg, jax.random.key(4), data), data)
  after_off, m_off = off(state0, data)
  after_on, m_on = on(state0, data)
  sampled = np.asarray(m_off["clients"])
  np.testing.assert_array_equal(m_on["clients"], sampled)
  others = np.setdiff1d(np.arange(4), sampled)
  np.testing.assert_array_equal(np.asarray(after_off["clients"].task)[sampled],
                                stream.round_tasks[1][sampled])
  # The sampled clients and the model: as with the switch off.
  chex.assert_trees_all_equal(after_on["server"], after_off["server"])
  chex.assert_trees_all_equal(_take(after_on["clients"], sampled),
                              _take(after_off["clients"], sampled))
  # Off: the unsampled keep their state; on: they hold their round-1 rows.
  chex.assert_trees_all_equal(_take(after_off["clients"], others),
                              _take(state0["clients"], others))
  np.testing.assert_array_equal(np.asarray(after_on["clients"].task)[others],
                                stream.round_tasks[1][others])
  assert "glfc/unsampled/updated" not in m_off


# ----------------------------------------------------------------------------
# The shuffled gradient pool.
# ----------------------------------------------------------------------------


C = 4
SETTINGS = proxy_lib.ProxySettings(reconstruction_steps=4, monitor_images=2,
                                   perturbation_steps=0)


def _pool(encoder, encoder_vars, labels):
  images = np.random.default_rng(5).uniform(0, 1, (len(labels), 32, 32, 3)).astype(np.float32)
  return jax.vmap(lambda x, y: gi.prototype_gradient(encoder, encoder_vars, x, y))(
      jnp.asarray(images), jnp.asarray(labels))


def test_shuffle_pool_is_a_key_dependent_permutation():
  tree = {"w": jnp.arange(24.0).reshape(6, 2, 2), "b": jnp.arange(6.0)}
  valid = jnp.asarray([True, False, True, True, False, True])
  labels = jnp.arange(6, dtype=jnp.int32) + 10
  perms = []
  for seed in range(3):
    g, v, y, perm = jax.jit(proxy_lib.shuffle_pool)(jax.random.key(seed), tree, valid, labels)
    perm = np.asarray(perm)
    np.testing.assert_array_equal(np.sort(perm), np.arange(6))
    np.testing.assert_array_equal(g["w"], np.asarray(tree["w"])[perm])
    np.testing.assert_array_equal(g["b"], np.asarray(tree["b"])[perm])
    np.testing.assert_array_equal(v, np.asarray(valid)[perm])
    np.testing.assert_array_equal(y, np.asarray(labels)[perm])
    perms.append(tuple(perm))
  assert len(set(perms)) == 3   # another key, another order


@pytest.mark.slow  # ~100 s on a busy 2-core CPU: two proxy rounds, four reconstructions
def test_shuffled_proxy_reconstructs_the_same_gradients_in_the_shuffled_order():
  encoder = proxy_lib.make_encoder(C)
  model = TinyLinear(num_classes=C)
  forward = cil_replay.make_eval_forward(model, normalizer((0.5,) * 3, (0.25,) * 3), 4)
  state = proxy_lib.init_proxy_state(jax.random.key(0), encoder,
                                     models.init_variables(model, jax.random.key(1)),
                                     4, SETTINGS, (32, 32, 3), C)
  labels = np.array([2, 0, 3, 1], np.int32)
  valid = jnp.asarray([True, True, False, True])
  pool = _pool(encoder, state.encoder, labels)
  key = jax.random.key(9)
  new_global = models.init_variables(model, jax.random.key(2))

  def update(settings):
    return jax.jit(lambda s: proxy_lib.server_update(
        s, new_global, gradients=pool, gradient_valid=valid, true_labels=jnp.asarray(labels),
        key=key, class_mask=masking.seen_class_mask(C, C), encoder=encoder, forward=forward,
        proxy=settings))(state)

  plain, m_plain = update(SETTINGS)
  shuffled, m_shuffled = update(dataclasses.replace(SETTINGS, shuffle_gradients=True))
  # The permutation the proxy used (from its round key).
  _, _, _, perm = proxy_lib.shuffle_pool(jax.random.fold_in(key, proxy_lib.SHUFFLE_KEY_DATA),
                                         pool, valid, jnp.asarray(labels))
  perm = np.asarray(perm)
  assert not np.array_equal(perm, np.arange(4))
  # Slot i of the shuffled pool: gradient perm[i], reconstructed from slot i's dummy.
  keys = jax.random.split(key, 4)
  r = SETTINGS.monitor_images
  for i in range(4):
    gradient = jax.tree_util.tree_map(lambda g, j=perm[i]: g[j], pool)
    images, _ = gi.reconstruct(encoder, state.encoder, gradient, int(labels[perm[i]]), keys[i],
                               steps=SETTINGS.reconstruction_steps, keep_last=r,
                               learning_rate=SETTINGS.reconstruction_lr,
                               linesearch=SETTINGS.linesearch)
    got = np.asarray(shuffled.monitor_images[i * r:(i + 1) * r], np.int32)
    assert np.abs(got - np.asarray(gi.to_uint8(images), np.int32)).max() <= 1
    np.testing.assert_array_equal(shuffled.monitor_labels[i * r:(i + 1) * r], labels[perm[i]])
    assert bool(shuffled.monitor_valid[i * r]) == bool(valid[perm[i]])
  # The same set of labels and gradients used; the proxy's counts are order-free.
  def used(s):
    return sorted(np.asarray(s.monitor_labels)[np.asarray(s.monitor_valid)].tolist())
  assert used(shuffled) == used(plain)
  np.testing.assert_array_equal(shuffled.known, plain.known)
  for name in ("proxy/gradients", "proxy/rebuilt_from", "proxy/labels_correct"):
    assert int(m_shuffled[name]) == int(m_plain[name]), name


# ----------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("method,field,value,allowed", [
    ("glfc", "scenario.client_roles", "per_epoch", "one of ('per_task', 'per_round')"),
    ("fedavg_cil", "scenario.client_roles", "per_round", "'per_task' for config.algorithm"),
    ("glfc", "glfc.update_all_clients", None, "True or False"),
    ("glfc", "glfc.proxy.shuffle_gradients", None, "True or False"),
])
def test_bad_switch_values_are_refused(method, field, value, allowed):
  config = tiny_cil_config(method)
  set_field(config, field, value)
  with pytest.raises(Exception, match=f"config.{field}") as error:
    validate_config(config)
  assert allowed in str(error.value)


def test_switch_defaults_are_the_code_s_protocol():
  config = tiny_cil_config("glfc")
  assert config.scenario.client_roles == "per_task"
  assert config.glfc.update_all_clients is False
  assert config.glfc.proxy.shuffle_gradients is False
  settings = glfc_lib.GLFCSettings.from_config(config, np.ones((1, 1, 1), bool))
  assert not settings.update_all_clients and not settings.proxy.shuffle_gradients


@pytest.mark.slow  # ~135 s on a busy 2-core CPU
def test_glfc_with_every_protocol_switch_trains_end_to_end(tmp_path):
  config = _config()
  config.glfc.memory_size = 8
  config.glfc.transition = "stream"
  config.glfc.update_all_clients = True
  config.glfc.proxy.shuffle_gradients = True
  config.glfc.proxy.reconstruction_steps = 5
  config.glfc.proxy.monitor_images = 2
  out = train_and_evaluate(config, tmp_path)
  assert out["rounds_done"] == 4
  records = out["records"]
  assert sum(r["proxy/gradients"] for r in records) > 0
  assert all(r["proxy/labels_correct"] == r["proxy/gradients"] for r in records)
  assert all("glfc/roles/old" in r and "glfc/unsampled/updated" in r for r in records)
  assert "eval/accuracy/seen" in records[-1]

"""Engine building blocks: batching plans, the local-training scan, optimisers, grouping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import losses
from fedjax_het.engine import batching, clients, local, optim
from tests.tiny_models import TinyBatchNorm, TinyLinear


# --------------------------------------------------------------------------- batching


@pytest.mark.parametrize("size,max_size,batch", [(7, 7, 3), (5, 9, 4), (1, 6, 8), (9, 9, 9)])
def test_every_epoch_visits_each_valid_row_exactly_once(size, max_size, batch):
  plan = batching.plan_epochs(jax.random.key(0), jnp.int32(size), max_size=max_size, epochs=3,
                              batch_size=batch)
  steps = batching.steps_per_epoch(max_size, batch)
  for epoch in range(3):
    seen, active_steps = [], 0
    for slot in range(steps):
      rows, mask, active = batching.batch_indices(plan, jnp.int32(epoch * steps + slot),
                                                  batch_size=batch, steps=steps)
      seen += [int(r) for r, m in zip(rows, mask) if m]
      active_steps += int(active)
      assert bool(active) == bool(np.any(mask))
    assert sorted(seen) == list(range(size))
    assert active_steps == -(-size // batch)  # ceil: PyTorch's drop_last=False batches


def test_epoch_orders_differ_between_epochs_and_keys():
  plan = batching.plan_epochs(jax.random.key(0), jnp.int32(50), max_size=50, epochs=2,
                              batch_size=10)
  other = batching.plan_epochs(jax.random.key(1), jnp.int32(50), max_size=50, epochs=2,
                               batch_size=10)
  assert not np.array_equal(plan.orders[0], plan.orders[1])
  assert not np.array_equal(plan.orders[0], other.orders[0])


def test_public_batches_are_full_and_cover_every_image_each_epoch():
  batches = batching.public_batches(jax.random.key(0), 10, batch_size=4, epochs=2)
  assert batches.shape == (6, 4)
  for epoch in range(2):
    rows = np.asarray(batches[3 * epoch:3 * epoch + 3]).ravel()
    assert set(rows.tolist()) == set(range(10))  # 12 slots: 10 images + 2 refills


# --------------------------------------------------------------------------- optimisers


def test_fresh_adam_first_step_is_sign_sgd():
  """The FCCL+ code's per-batch Adam: the first step moves every weight by ~lr."""
  tx = optim.make_optimizer("adam")
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.array([0.5, -3e-3, 40.0])}
  new, _ = optim.apply_updates(tx, params, grads, tx.init(params), 1e-3)
  np.testing.assert_allclose(new["w"] - params["w"], -1e-3 * np.sign(grads["w"]), rtol=1e-4)


def test_adam_weight_decay_is_torch_l2_not_adamw():
  tx = optim.make_optimizer("adam", weight_decay=0.1)
  reference = optax.chain(optax.add_decayed_weights(0.1), optax.scale_by_adam())
  params, grads = {"w": jnp.array([2.0])}, {"w": jnp.array([0.3])}
  new, _ = optim.apply_updates(tx, params, grads, tx.init(params), 0.01)
  updates, _ = reference.update(grads, reference.init(params), params)
  np.testing.assert_allclose(new["w"], params["w"] - 0.01 * updates["w"], rtol=1e-6)


def test_linear_decay_matches_the_code_schedule():
  # Code: lr = lr0 * (1 - e/E * 0.9) set AFTER round e -> rounds 0 and 1 use lr0.
  rates = [float(optim.linear_decay(1e-3, r, 40)) for r in range(4)]
  np.testing.assert_allclose(rates, [1e-3, 1e-3, 1e-3 * (1 - 0.9 / 40), 1e-3 * (1 - 1.8 / 40)],
                             rtol=1e-6)


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match=r"optimizer must be one of \('adam', 'sgd'\)"):
    optim.make_optimizer("adagrad")


# --------------------------------------------------------------------------- local training


def _ce_loss(model):
  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    del rng, aux
    _, logits = model.apply({"params": params}, images, train=True)
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (batch_stats, {"ce": ce})
  return loss_fn


def _client(rng, size, max_size):
  images = np.zeros((max_size, 2, 2, 3), np.uint8)
  labels = np.zeros((max_size,), np.int32)
  images[:size] = rng.integers(0, 255, (size, 2, 2, 3))
  labels[:size] = rng.integers(0, 3, size)
  return images, labels


def test_local_trainer_full_batch_sgd_equals_hand_gradient_descent():
  """One epoch, batch >= data, SGD: one step of -lr * grad of the mean CE on the valid rows."""
  model = TinyLinear()
  rng = np.random.default_rng(0)
  images, labels = _client(rng, 5, 8)
  variables = {"params": model.init(jax.random.key(0), jnp.zeros((1, 2, 2, 3)), train=False)["params"],
               "batch_stats": {}}
  preprocess = lambda x: x.astype(jnp.float32) / 255.0
  train = local.make_local_trainer(loss_fn=_ce_loss(model), optimizer=optim.make_optimizer("sgd"),
                                   epochs=1, batch_size=8, max_size=8, preprocess=preprocess)
  new, metrics = train(variables, None, images, labels, jnp.int32(5), jax.random.key(1),
                       jnp.array([0.5]))
  x = preprocess(images[:5])
  grads = jax.grad(lambda p: losses.softmax_cross_entropy(
      logits=model.apply({"params": p}, x, train=True)[1], labels=labels[:5]))(variables["params"])
  want = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, variables["params"], grads)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         new["params"], want)
  assert set(metrics) == {"loss", "ce"}


def test_local_trainer_counts_steps_like_pytorch_and_skips_empty_slots():
  """Clients of 3 and 7 rows share one vmapped scan; steps past a client's data are no-ops."""
  model = TinyLinear()
  rng = np.random.default_rng(1)
  data = [_client(rng, 3, 7), _client(rng, 7, 7)]
  images = jnp.stack([d[0] for d in data])
  labels = jnp.stack([d[1] for d in data])
  sizes = jnp.array([3, 7], jnp.int32)
  counter = []

  def loss_fn(params, batch_stats, x, y, mask, rng_, aux):
    loss, aux_out = _ce_loss(model)(params, batch_stats, x, y, mask, rng_, aux)
    return loss, (aux_out[0], {"rows": jnp.sum(mask.astype(jnp.float32))})

  train = local.make_local_trainer(loss_fn=loss_fn, optimizer=optim.make_optimizer("sgd"),
                                   epochs=2, batch_size=2, max_size=7,
                                   preprocess=lambda x: x.astype(jnp.float32) / 255.0)
  init = model.init(jax.random.key(0), jnp.zeros((1, 2, 2, 3)), train=False)["params"]
  variables = jax.tree_util.tree_map(lambda p: jnp.stack([p, p]),
                                     {"params": init, "batch_stats": {}})
  _, metrics = jax.vmap(train, in_axes=(0, None, 0, 0, 0, 0, None))(
      variables, None, images, labels, sizes, jax.random.split(jax.random.key(2), 2),
      jnp.array([0.1, 0.1]))
  # Mean rows per active step: client 0 has batches of 2,1 (mean 1.5); client 1: 2,2,2,1 (1.75).
  np.testing.assert_allclose(metrics["rows"], [1.5, 1.75], rtol=1e-6)
  del counter


def test_exact_steps_one_client_at_a_time_equals_the_vmapped_padded_scan():
  """train_clients(sequential=True) (each client only its own steps) trains the same models as
  the vmapped padded scan (no-op steps past the data), BatchNorm statistics and metrics
  included."""
  model = TinyBatchNorm()
  rng = np.random.default_rng(3)
  sizes = (5, 16, 23, 1)  # partial batches of 5, none, 7 and 1 rows at batch 8
  data = [_client(rng, n, 23) for n in sizes]
  group_data = clients.GroupData(
      images=jnp.stack([d[0] for d in data]), labels=jnp.stack([d[1] for d in data]),
      sizes=jnp.array(sizes, jnp.int32), client_ids=jnp.arange(4, dtype=jnp.int32),
      active=jnp.ones((4,), bool))

  def loss_fn(params, batch_stats, x, y, mask, rng_, aux):
    del rng_, aux
    (_, logits), new = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                   train=True, mask=mask, mutable=["batch_stats"])
    ce = losses.softmax_cross_entropy(logits=logits, labels=y, mask=mask)
    return ce, (new["batch_stats"], {"rows": jnp.sum(mask.astype(jnp.float32))})

  train = local.make_local_trainer(loss_fn=loss_fn, optimizer=optim.make_optimizer("sgd"),
                                   epochs=2, batch_size=8, max_size=23,
                                   preprocess=lambda x: x.astype(jnp.float32) / 255.0)
  init = model.init(jax.random.key(0), jnp.zeros((1, 2, 2, 3)), train=False)
  variables = jax.tree_util.tree_map(lambda p: jnp.stack([p] * 4), dict(init))
  keys = jax.random.split(jax.random.key(4), 4)
  lrs = jnp.array([0.3, 0.2])
  padded = jax.jit(lambda v: local.train_clients(train, v, jnp.zeros((4,)), group_data, keys,
                                                 lrs))(variables)
  exact = jax.jit(lambda v: local.train_clients(train, v, jnp.zeros((4,)), group_data, keys,
                                                lrs, sequential=True))(variables)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                         exact, padded)
  # Mean valid rows per step that holds data: 5 | 8, 8 | 8, 8, 7 | 1.
  np.testing.assert_allclose(exact[1]["rows"], [5.0, 8.0, 23 / 3, 1.0], rtol=1e-6)
  assert not np.allclose(exact[0]["params"]["Dense_0"]["kernel"][0],
                         variables["params"]["Dense_0"]["kernel"][0])


@pytest.mark.parametrize("sequential", [False, True])
def test_local_trainer_with_epoch_passes_each_steps_local_epoch(sequential):
  """Clients of 3 and 7 rows, batch 2, 3 epochs: steps 2 and 4 per epoch; the loss sees the
  epoch of its step (mean over the steps that hold data = 1 for every client)."""
  model = TinyLinear()
  rng = np.random.default_rng(5)
  data = [_client(rng, 3, 7), _client(rng, 7, 7)]
  group_data = clients.GroupData(
      images=jnp.stack([d[0] for d in data]), labels=jnp.stack([d[1] for d in data]),
      sizes=jnp.array([3, 7], jnp.int32), client_ids=jnp.arange(2, dtype=jnp.int32),
      active=jnp.ones((2,), bool))

  def loss_fn(params, batch_stats, x, y, mask, rng_, aux, epoch):
    loss, aux_out = _ce_loss(model)(params, batch_stats, x, y, mask, rng_, aux)
    return loss, (aux_out[0], {"epoch": epoch.astype(jnp.float32),
                               "late": (epoch == 2).astype(jnp.float32)})

  train = local.make_local_trainer(loss_fn=loss_fn, optimizer=optim.make_optimizer("sgd"),
                                   epochs=3, batch_size=2, max_size=7,
                                   preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                                   with_epoch=True)
  init = model.init(jax.random.key(0), jnp.zeros((1, 2, 2, 3)), train=False)["params"]
  variables = jax.tree_util.tree_map(lambda p: jnp.stack([p, p]),
                                     {"params": init, "batch_stats": {}})
  _, metrics = jax.jit(lambda v: local.train_clients(
      train, v, jnp.zeros((2,)), group_data, jax.random.split(jax.random.key(2), 2),
      jnp.full((3,), 0.1), sequential=sequential))(variables)
  np.testing.assert_allclose(metrics["epoch"], [1.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(metrics["late"], [1 / 3, 1 / 3], rtol=1e-6)


# --------------------------------------------------------------------------- grouping


def test_group_clients_by_architecture_with_padding_slots():
  m1, m2 = TinyLinear(3), TinyLinear(4)
  groups = clients.group_clients(["a", "b", "a", "a"], [m1, m2, m1, m1], slot_multiple=4)
  assert [(g.name, g.clients, g.num_slots) for g in groups] == [("a", (0, 2, 3), 4),
                                                                 ("b", (1,), 4)]
  rng = np.random.default_rng(0)
  images = [rng.integers(0, 255, (n, 2, 2, 3), dtype=np.uint8) for n in (2, 3, 4, 5)]
  labels = [np.arange(n, dtype=np.int32) % 3 for n in (2, 3, 4, 5)]
  data = clients.stack_group_data(groups[0], images, labels, num_participants=4)
  assert data.images.shape == (4, 5, 2, 2, 3)
  np.testing.assert_array_equal(data.sizes, [2, 4, 5, 2])
  np.testing.assert_array_equal(data.client_ids, [0, 2, 3, 4])
  np.testing.assert_array_equal(data.active, [True, True, True, False])
  np.testing.assert_array_equal(data.images[1, :4], images[2])
  assert not data.images[1, 4:].any()  # zero padding rows
  values = clients.scatter_to_participants(groups, {"a": np.array([10, 12, 13, 99]),
                                                    "b": np.array([11, 0, 0, 0])}, 4)
  np.testing.assert_array_equal(values, [10, 11, 12, 13])


def test_client_keys_depend_only_on_the_participant_index():
  key = jax.random.key(0)
  a = clients.client_keys(key, jnp.array([3, 1]))
  b = clients.client_keys(key, jnp.array([1, 5, 3]))
  np.testing.assert_array_equal(jax.random.key_data(a[0]), jax.random.key_data(b[2]))
  np.testing.assert_array_equal(jax.random.key_data(a[1]), jax.random.key_data(b[0]))


# --------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("slots", [1, 3])
def test_vmap_slots_equals_vmap_and_skips_the_batching_trace_for_one_slot(slots):
  tracers = []

  def fn(w, x, key, scale):
    tracers.append(type(w).__name__)
    noise = jax.random.normal(key, (2,))
    return {"y": jnp.tanh(x @ w) * scale + noise[0], "norm": jnp.sum(w * w)}, noise

  w = jax.random.normal(jax.random.key(0), (slots, 4, 2))
  x = jax.random.normal(jax.random.key(1), (5, 4))
  keys = jax.random.split(jax.random.key(2), slots)
  expected = jax.vmap(fn, in_axes=(0, None, 0, None))(w, x, keys, 0.5)
  tracers.clear()
  got = jax.jit(clients.vmap_slots(fn, in_axes=(0, None, 0, None)))(w, x, keys, 0.5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                         got, expected)
  assert jax.tree_util.tree_map(jnp.shape, got) == jax.tree_util.tree_map(jnp.shape, expected)
  # One slot: fn is traced on slot 0 directly, no batching interpreter; several: vmap.
  assert tracers == (["DynamicJaxprTracer"] if slots == 1 else ["BatchTracer"])


def test_vmap_slots_rejects_axes_other_than_0_and_none():
  with pytest.raises(ValueError, match="in_axes must be 0 or None per argument"):
    clients.vmap_slots(lambda a: a, in_axes=(1,))(jnp.ones((1, 2)))
  with pytest.raises(ValueError, match="in_axes must be 0 or None per argument"):
    clients.vmap_slots(lambda a, b: a, in_axes=(0,))(jnp.ones((1, 2)), jnp.ones(2))


def test_round_decay_schedule_is_exact_in_the_first_two_rounds_and_linear_after():
  schedule = optim.round_decay_schedule(1e-3, 40, 0.9)
  assert float(schedule(0)) == float(schedule(1)) == float(np.float32(1e-3))
  assert float(optim.round_decay_schedule(1e-3, 40, 0.0)(7)) == pytest.approx(1e-3)
  np.testing.assert_allclose([float(schedule(r)) for r in (2, 21, 40)],
                             [1e-3 * (1 - 0.9 * r / 40) for r in (1, 20, 39)], rtol=1e-6)


def _constant_length_decay(base_lr, num_rounds, decay):
  """The decay with E a constant of the program: optax's linear schedule, as the engine built it
  before E became an argument of the round."""
  multiplier = optax.linear_schedule(init_value=1.0, end_value=1.0 - decay,
                                     transition_steps=num_rounds, transition_begin=1)
  return lambda round_index: base_lr * multiplier(round_index)


def _numpy_decay(base_lr, round_index, num_rounds, decay):
  """lr0 * (1 - decay * clip(r - 1, 0, E) / E) in float32 NumPy, operation by operation."""
  f32 = np.float32
  count = np.clip(round_index - 1, 0, num_rounds)
  fraction = f32(1) - f32(count) / f32(num_rounds)
  return f32(base_lr) * (f32(decay) * fraction + f32(1.0 - decay))


@pytest.mark.parametrize("base_lr,decay", [(1e-3, 0.9), (0.05, 0.99)])
def test_a_traced_run_length_gives_the_bits_of_a_constant_one(base_lr, decay):
  schedule = optim.round_decay_schedule(base_lr, 1, decay)  # E=1 is overridden below

  @jax.jit
  def traced(rounds, num_rounds):  # E an argument, as the engine passes it; one round at a time
    with optim.run_length(num_rounds):
      return jax.lax.map(schedule, rounds)

  # E = 6, 7, 12, 13, 15, ...: count / E and count * (1 / E) differ in float32 for some rounds.
  for num_rounds in [1, 3, 6, 13, 15, 40, 333]:
    rounds = jnp.arange(num_rounds + 3, dtype=jnp.int32)
    got = np.asarray(traced(rounds, jnp.int32(num_rounds)))
    constant = np.asarray(jax.jit(lambda r, e=num_rounds: jax.lax.map(
        _constant_length_decay(base_lr, e, decay), r))(rounds))
    assert got.dtype == constant.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), constant.view(np.uint32))
    # The formula by hand (XLA's reciprocal and fused multiply-add move the last bit).
    by_hand = np.array([_numpy_decay(base_lr, r, num_rounds, decay) for r in range(len(rounds))])
    np.testing.assert_allclose(got, by_hand, rtol=0, atol=5e-7 * base_lr)
  # The program is one for every E.
  rounds = jnp.arange(8, dtype=jnp.int32)
  assert (traced.lower(rounds, jnp.int32(3)).as_text()
          == traced.lower(rounds, jnp.int32(40)).as_text())


def test_fedproc_alpha_with_a_traced_run_length_gives_the_bits_of_a_constant_one():
  from fedjax_het.algorithms import fedproc  # pylint: disable=g-import-not-at-top

  def constant_alpha(r, num_rounds):  # the formula with E a constant of the program
    return jnp.clip(1.0 - jnp.asarray(r, jnp.float32) / max(num_rounds - 1, 1), 0.0, 1.0)

  @jax.jit
  def traced(rounds, num_rounds):
    with optim.run_length(num_rounds):
      return jax.lax.map(lambda r: fedproc.linear_alpha(r, 1), rounds)

  for num_rounds in [1, 2, 7, 8, 13, 41]:
    rounds = jnp.arange(num_rounds + 1, dtype=jnp.int32)
    got = np.asarray(traced(rounds, jnp.int32(num_rounds)))
    constant = np.asarray(jax.jit(lambda r, e=num_rounds: jax.lax.map(
        lambda x: constant_alpha(x, e), r))(rounds))
    np.testing.assert_array_equal(got.view(np.uint32), constant.view(np.uint32))


def test_run_length_overrides_a_schedule_only_inside_its_block():
  schedule = optim.round_decay_schedule(1.0, 10, 0.9)  # round 11: 1 - 0.9 * 10 / E
  with optim.run_length(20):
    assert float(schedule(11)) == pytest.approx(0.55)
    assert optim.num_rounds_in_run(5) == 20
    with optim.run_length(None):  # the schedule's own E
      assert float(schedule(11)) == pytest.approx(0.1)
  assert float(schedule(11)) == pytest.approx(0.1)
  assert optim.num_rounds_in_run(5) == 5


def test_injected_learning_rate_scales_the_step_and_survives_jit():
  tx = optim.make_optimizer("sgd", momentum=0.5)
  params = {"w": jnp.array([1.0, 2.0])}
  grads = {"w": jnp.array([0.5, -1.0])}
  step = jax.jit(lambda p, g, s, lr: optim.apply_updates(tx, p, g, s, lr))
  p1, s1 = step(params, grads, tx.init(params), 0.1)
  np.testing.assert_allclose(p1["w"], [1.0 - 0.05, 2.0 + 0.1], rtol=1e-6)
  p2, _ = step(p1, grads, s1, 0.2)  # momentum buffer 0.5 * g + g = 1.5 g at lr 0.2
  np.testing.assert_allclose(p2["w"], p1["w"] - 0.2 * 1.5 * grads["w"], rtol=1e-6)


# --------------------------------------------------------------------------- cohorts


def test_sample_cohort_draws_distinct_active_slots_and_covers_them_uniformly():
  from fedjax_het.engine import cohort
  active = jnp.array([True] * 7 + [False] * 3)
  counts = np.zeros(10)
  for seed in range(400):
    slots = np.asarray(cohort.sample_cohort(jax.random.key(seed), active, 3))
    assert len(set(slots.tolist())) == 3 and np.all(slots < 7)
    assert np.all(np.diff(slots) > 0)
    counts[slots] += 1
  assert counts[7:].sum() == 0
  np.testing.assert_allclose(counts[:7] / 400, 3 / 7, atol=0.08)  # each slot: p = 3/7
  with pytest.raises(ValueError, match=r"cohort_size must be in \[1, 10\]"):
    cohort.sample_cohort(jax.random.key(0), active, 11)


def test_gather_then_scatter_writes_back_only_the_cohort():
  from fedjax_het.engine import cohort
  tree = {"w": jnp.arange(12.0).reshape(6, 2)}
  slots = jnp.array([1, 4])
  taken = cohort.gather(tree, slots)
  np.testing.assert_array_equal(taken["w"], [[2.0, 3.0], [8.0, 9.0]])
  back = cohort.scatter(tree, slots, jax.tree_util.tree_map(lambda v: -v, taken))
  want = np.arange(12.0).reshape(6, 2)
  want[[1, 4]] *= -1
  np.testing.assert_array_equal(back["w"], want)


# --------------------------------------------------------------------------- aggregation


def test_weighted_mean_matches_numpy_and_ignores_zero_weights():
  from fedjax_het.engine import aggregation
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 3, 2)).astype(np.float32)
  w = np.array([10.0, 0.0, 30.0, 60.0])
  got = aggregation.weighted_mean({"x": jnp.asarray(x)}, jnp.asarray(w))["x"]
  want = sum(w[i] * x[i] for i in range(4)) / w.sum()
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got.shape == (3, 2)


def test_server_update_with_sgd_one_is_plain_averaging_and_momentum_is_fedavgm():
  import optax
  from fedjax_het.engine import aggregation
  server = {"w": jnp.array([1.0, -1.0])}
  mean = {"w": jnp.array([0.5, 0.0])}
  new, _ = aggregation.server_update(optax.sgd(1.0), server, mean, optax.sgd(1.0).init(server))
  np.testing.assert_allclose(new["w"], mean["w"], rtol=1e-7)
  # FedAvgM (Hsu et al. 2019): v <- beta v + delta, w <- w - lr v, delta = server - mean.
  tx = optax.sgd(0.5, momentum=0.9)
  state = tx.init(server)
  w, v = np.array([1.0, -1.0]), np.zeros(2)
  current = server
  for target in ([0.5, 0.0], [0.0, 0.5]):
    current, state = aggregation.server_update(tx, current, {"w": jnp.array(target)}, state)
    v = 0.9 * v + (w - np.array(target))
    w = w - 0.5 * v
    np.testing.assert_allclose(current["w"], w, rtol=1e-6)


def test_average_over_active_broadcasts_the_mean_of_real_slots():
  from fedjax_het.engine import aggregation
  tree = {"w": jnp.array([[1.0], [3.0], [100.0]])}
  out = aggregation.average_over_active(tree, jnp.array([True, True, False]))
  np.testing.assert_allclose(out["w"], [[2.0], [2.0], [2.0]])


# --------------------------------------------------------------------------- public phase


def test_public_phase_visits_every_public_image_each_epoch_and_averages_metrics():
  from fedjax_het.engine import public
  images = jnp.arange(10, dtype=jnp.uint8).reshape(10, 1, 1, 1) * jnp.ones((1, 2, 2, 3),
                                                                           jnp.uint8)
  spec = public.PublicSpec(batch_size=4, epochs=2, prepare=lambda k, x: x.astype(jnp.float32))

  def step(seen, batch, key):
    del key
    ids = batch[:, 0, 0, 0].astype(jnp.int32)
    return seen.at[ids].add(1), {"first": batch[0, 0, 0, 0]}

  seen, metrics = jax.jit(lambda s: public.public_phase(
      step, s, images, spec, order_key=jax.random.key(0), augment_key=jax.random.key(1),
      step_key=jax.random.key(2)))(jnp.zeros(10, jnp.int32))
  # 2 epochs x 3 full batches of 4 = 24 visits: each image twice, plus 2 refills per epoch.
  assert int(seen.sum()) == 24 and int(seen.min()) >= 2
  assert metrics["first"].shape == ()
  assert not public.has_public_phase(spec._replace(epochs=0), images)
  assert not public.has_public_phase(spec, images[:0])

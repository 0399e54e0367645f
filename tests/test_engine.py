"""Engine building blocks: batching plans, the local-training scan, optimisers, grouping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import losses
from fedjax_het.engine import batching, clients, local, optim
from tests.tiny_models import TinyLinear


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

"""A tiny homogeneous federation for hand-checkable FedAvg-family tests.

Clients of SIZES rows of random 32x32x3 images with identity normalisation
(mean 0, std 1 on [0, 1] inputs), full-batch local SGD by default.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.config import base_config
from fedjax_het.engine import api, clients
from tests.tiny_models import TinyLinear

STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
SIZES = (6, 4, 5)
LR = 0.5


def tiny_setup(k, model=None, num_rounds=4, archs=None):
  """k participants of one architecture (default TinyLinear), or one participant per name
  in `archs` (the same model under each name: a group per distinct name)."""
  model = model or TinyLinear()
  archs = list(archs) if archs is not None else ["a"] * k
  groups = clients.group_clients(archs, [model] * len(archs))
  return api.Setup(groups=groups, num_participants=len(archs), num_classes=3,
                   num_rounds=num_rounds, max_sizes={g.name: 6 for g in groups},
                   private_mean=STATS[0], private_std=STATS[1], public_mean=STATS[0],
                   public_std=STATS[1], max_test_size=4)


def tiny_config(method="fedavg", **fields):
  """`method`'s base config with one full-batch SGD step of lr LR per epoch, no decay."""
  c = base_config(method)
  c.local.optimizer = "sgd"
  c.local.lr = LR
  c.local.lr_decay = 0.0
  c.local.weight_decay = 0.0
  c.local.epochs = 1
  c.local.batch_size = 6          # >= every client: one full-batch step per epoch
  c.eval.batch_size = 4           # FedProc's class means: two batches, the second padded
  c.update_from_flattened_dict(fields)
  return c


def tiny_data(setup, labels=None, seed=0):
  """(FederatedArrays, uint8 images per client, int32 labels per client)."""
  rng = np.random.default_rng(seed)
  k = setup.num_participants
  images = [rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8) for n in SIZES[:k]]
  if labels is None:
    labels = [rng.integers(0, 3, n) for n in SIZES[:k]]
  labels = [np.asarray(y, np.int32) for y in labels]
  stacked = jax.device_put(clients.stack_group_data(setup.groups[0], images, labels,
                                                    num_participants=k, max_size=6))
  return api.FederatedArrays({"a": stacked}, jnp.zeros((0, 32, 32, 3), jnp.uint8), None), images, labels


def round_data_with_public(setup, *, public_size=8, seed=0, public_seed=3):
  """FederatedArrays of `grouped_data(setup, seed)`'s groups and `public_size` uint8 public
  images (no test sets): the data of a public-data method's round."""
  groups, _, _ = grouped_data(setup, seed)
  images = np.random.default_rng(public_seed).integers(0, 255, (public_size, 32, 32, 3),
                                                       np.uint8)
  return api.FederatedArrays(groups=groups, public=jnp.asarray(images), test=None)


def flat_inputs(images):
  """The model inputs of each client, flattened: (n, 3072) float32 in [0, 1]."""
  return [jnp.asarray(x, jnp.float32).reshape(len(x), -1) / 255.0 for x in images]


def grouped_data(setup, seed=0):
  """({group: GroupData}, images, labels) for up to four participants of 6, 4, 5, 3 rows."""
  rng = np.random.default_rng(seed)
  sizes = [6, 4, 5, 3][:setup.num_participants]
  images = [rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8) for n in sizes]
  labels = [rng.integers(0, 3, n).astype(np.int32) for n in sizes]
  return {g.name: jax.device_put(clients.stack_group_data(
      g, images, labels, num_participants=setup.num_participants, max_size=6))
          for g in setup.groups}, images, labels

"""Sharding participants over devices along a `clients` mesh axis.

Every per-group leaf of the state and of the private data has the client
(slot) axis leading; it is sharded with `NamedSharding(mesh, P("clients"))`.
The public set, the test sets and the bookkeeping (round counter, run key) are
replicated. Groups are padded with inactive slots to a multiple of the device
count (`clients.group_clients(slot_multiple=...)`), so any participant count
works. The round function is unchanged: XLA partitions the vmapped client axis
and inserts the cross-client reductions (the FCCL+ targets) itself. The mesh
axis is `Auto` so that `lax.scan` over local steps stays legal on a sharded
client axis.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

CLIENT_AXIS = "clients"


def client_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named `clients` over the first `num_devices` devices (default: all)."""
  devices = jax.devices()
  n = len(devices) if not num_devices else num_devices
  if n > len(devices):
    raise ValueError(f"sharding.num_devices={n} but only {len(devices)} devices are visible "
                     f"({devices[0].platform}).")
  return Mesh(np.asarray(devices[:n]), (CLIENT_AXIS,),
              axis_types=(jax.sharding.AxisType.Auto,))


def _client_sharded(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(CLIENT_AXIS))


def _replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def state_shardings(state: Any, mesh: Mesh) -> Any:
  """Shardings for a state: leaves under "groups" are client-sharded, others replicated."""
  return {key: jax.tree_util.tree_map(
      lambda _: _client_sharded(mesh) if key == "groups" else _replicated(mesh), value)
          for key, value in state.items()}


def data_shardings(data: Any, mesh: Mesh) -> Any:
  """Shardings for `FederatedArrays`: private group data client-sharded, the rest replicated."""
  return type(data)(
      groups=jax.tree_util.tree_map(lambda _: _client_sharded(mesh), data.groups),
      public=_replicated(mesh),
      test=jax.tree_util.tree_map(lambda _: _replicated(mesh), data.test))

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

Across processes (`initialize_distributed`, e.g. two CPU processes on one
machine or one process per host): `jax.devices()` then lists every process's
devices and the `clients` mesh spans all of them, so each process holds the
client slots of its own devices. Every process builds the same data on the
host (same config, same seed) and places it with the same shardings; each
keeps only its own shards of the client-sharded arrays and a full copy of the
replicated ones. Every process runs the same jitted programs; results needed on
the host (metrics, evaluation, diagnostics) are gathered to every process by
`fetch`, so every process computes the same records. Only the primary process
(`is_primary`) writes workdir files; orbax coordinates checkpoint writes
itself. The checkpoint directory must be one path that every process sees (a
shared filesystem across hosts).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_het.errors import ConfigError

CLIENT_AXIS = "clients"


def initialize_distributed(coordinator_address: str = "", num_processes: int = 1,
                           process_id: int = 0, *, num_cpu_devices: int = 0) -> None:
  """Joins this process to a multi-process run; call before any JAX computation.

  With `num_processes` > 1, calls `jax.distributed.initialize` (on the CPU
  with gloo collectives, so that a program spanning processes can all-reduce
  and all-gather across them); afterwards `jax.devices()` lists the devices of
  every process and `client_mesh` spans them all. Every process must be
  started with the same config and workdir, the same `coordinator_address`
  (host:port of process 0, reachable from every process) and `num_processes`,
  and its own `process_id` in [0, num_processes). With `num_processes` == 1
  nothing is initialised. `num_cpu_devices` > 0 makes this process's CPU backend show
  that many (simulated) devices; 0 keeps JAX's default.

  Raises `ConfigError` naming the flag (--num_processes, --process_id,
  --coordinator_address, --num_cpu_devices) and its allowed values.
  """
  if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
    raise ConfigError(f"--num_processes must be an integer >= 1, got {num_processes!r}.")
  if isinstance(num_cpu_devices, bool) or not isinstance(num_cpu_devices, int) or (
      num_cpu_devices < 0):
    raise ConfigError(f"--num_cpu_devices must be an integer >= 0 (0: JAX's default), got "
                      f"{num_cpu_devices!r}.")
  if num_processes > 1:
    if (isinstance(process_id, bool) or not isinstance(process_id, int)
        or not 0 <= process_id < num_processes):
      raise ConfigError(f"--process_id must be an integer in [0, {num_processes - 1}] "
                        f"(--num_processes={num_processes}), got {process_id!r}.")
    if not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:[0-9]+", str(coordinator_address or "")):
      raise ConfigError(f"--coordinator_address must be host:port of process 0 (e.g. "
                        f"localhost:12355) when --num_processes={num_processes}, got "
                        f"{coordinator_address!r}.")
  elif process_id not in (0, None):
    raise ConfigError(f"--process_id must be 0 when --num_processes=1, got {process_id!r}.")
  if num_cpu_devices:
    jax.config.update("jax_num_cpu_devices", num_cpu_devices)
  if num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes=num_processes,
                               process_id=process_id)


def is_primary() -> bool:
  """True in process 0, the one that writes workdir files (always True in one process)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches `barrier(name)`; a no-op in one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def primary_bytes(value: int | None) -> int | None:
  """Process 0's byte count (or None) in every process; `value` itself in one process.

  For decisions that must be the same everywhere, such as whether the round
  fits in memory: each process measures its own free memory, and two
  processes deciding differently would compile different programs.
  """
  if jax.process_count() == 1:
    return value
  mib = -1.0 if value is None else value / 2.0 ** 20  # float32 MiB: no int32 overflow
  agreed = float(multihost_utils.broadcast_one_to_all(np.float32(mib)))
  return None if agreed < 0 else int(agreed * 2.0 ** 20)


def primary_text(text: str | None, max_bytes: int = 4096) -> str | None:
  """Process 0's `text` (or None) in every process; `text` itself in one process.

  For an outcome that only process 0 sees (its workdir lock, say) and every
  process must act on: UTF-8 bytes, cut at `max_bytes`, broadcast from process 0.
  """
  if jax.process_count() == 1:
    return text
  data = np.zeros(max_bytes + 1, np.int32)  # [0]: length + 1 (0: None), then the bytes
  if text is not None:
    encoded = text.encode()[:max_bytes]
    data[0] = len(encoded) + 1
    data[1:len(encoded) + 1] = np.frombuffer(encoded, np.uint8)
  agreed = np.asarray(multihost_utils.broadcast_one_to_all(data))
  if agreed[0] == 0:
    return None
  return bytes(agreed[1:int(agreed[0])].astype(np.uint8)).decode(errors="replace")


def fetch(tree: Any) -> Any:
  """`jax.device_get(tree)`, also for arrays sharded across processes.

  A leaf that spans devices of other processes (not fully addressable) is
  all-gathered first, so every process gets the whole array (a copy: the
  gather changes no value); every process must call `fetch` with the same
  tree, in the same order, since the gather is a collective. Without such
  leaves (any single-process run) this is `jax.device_get`.
  """
  leaves = jax.tree_util.tree_leaves(tree)
  if all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves):
    return jax.device_get(tree)

  def get(leaf):
    if getattr(leaf, "is_fully_addressable", True):
      return jax.device_get(leaf)
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

  return jax.tree_util.tree_map(get, tree)


def client_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named `clients` over the first `num_devices` devices (default: all).

  In a multi-process run the mesh must span every process's devices, so
  `num_devices` must then be 0/None (all) or the global device count.
  """
  devices = jax.devices()
  n = len(devices) if not num_devices else num_devices
  if n > len(devices):
    raise ValueError(f"sharding.num_devices={n} but only {len(devices)} devices are visible "
                     f"({devices[0].platform}).")
  if jax.process_count() > 1 and n != len(devices):
    raise ConfigError(f"config.sharding.num_devices must be 0 or {len(devices)} (every device "
                      f"of the {jax.process_count()} processes) in a multi-process run, got {n}.")
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
      test=jax.tree_util.tree_map(lambda _: _replicated(mesh), data.test),
      num_rounds=None if data.num_rounds is None else _replicated(mesh))

"""The exemplar memory of the FL baselines of GLFC Table 1 (iCaRL + FL, SS-IL + FL, BiC + FL,
PODNet + FL).

Every such baseline keeps iCaRL's memory: at a
task transition read from the stream, a sampled client adds the classes of
its previous data that it does not hold now, by iCaRL herding on the
L2-normalised features of the received global model, m = memory_size //
(classes learned) per class (`algorithms.glfc.store_previous_classes`; the
memory holds pool indices). `replay_section` is the config section of that
memory, `ReplaySettings` its constants, `update_client` one sampled client's
update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import validation as v
from fedjax_het.algorithms import glfc as glfc_lib
from fedjax_het.cil import exemplars


def replay_section(memory_size: int) -> dict[str, Any]:
  """The memory's fields of a baseline's section: size per client and distinct picks."""
  return {"memory_size": memory_size,   # exemplars per client, images
          "distinct_exemplars": True}   # iCaRL's paper: each image at most once


def validate_replay_section(config: ml_collections.ConfigDict, section: str) -> None:
  v.require_section(config, section)
  v.check(config, f"{section}.memory_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, f"{section}.distinct_exemplars", v.is_bool, "True or False")


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
  memory_size: int
  distinct: bool
  max_per_class: int          # static herding length: memory // fewest classes of a client
  max_client_classes: int     # static: most classes one client holds in one task

  @classmethod
  def from_section(cls, section: ml_collections.ConfigDict, client_classes: np.ndarray
                   ) -> "ReplaySettings":
    memory = int(section.memory_size)
    max_per_class, most = glfc_lib.herding_sizes(client_classes, memory)
    return cls(memory_size=memory, distinct=bool(section.distinct_exemplars),
               max_per_class=max_per_class, max_client_classes=most)


class ClientState(NamedTuple):
  """Memory state of every client (leading axis K_max = all clients of the stream)."""
  memory: exemplars.ExemplarMemory   # "images" are pool indices (glfc.encode_pool_indices)
  task: jax.Array                    # (K,) int32 task of the data last trained on (-1: none)
  last_task: jax.Array               # (K,) int32 task of the data before that (-1: none)


def init_client_state(num_clients: int, memory_size: int) -> ClientState:
  memory = jax.vmap(lambda _: exemplars.init_memory(memory_size, (4,)))(jnp.arange(num_clients))
  return ClientState(memory=memory, task=jnp.full((num_clients,), -1, jnp.int32),
                     last_task=jnp.full((num_clients,), -1, jnp.int32))


def update_client(replay: ReplaySettings, forward: Any, global_vars: Any, client: ClientState,
                  client_id: jax.Array, task: jax.Array, data: Any, *, n_max: int,
                  num_classes: int) -> tuple[ClientState, jax.Array]:
  """One sampled client's transition and memory update (iCaRL + FL's), before training.

  Returns (its new state, whether it was at a task transition: its classes
  changed since it last trained).
  """
  current = data.client_classes[task, client_id]
  moved = client.task != task
  last_task = jnp.where(moved, client.task, client.last_task)
  before = data.client_classes[jnp.maximum(client.task, 0), client_id]
  transition = (client.task >= 0) & moved & jnp.any(before != current)
  memory = glfc_lib.store_previous_classes(
      client.memory, forward, global_vars, data, client_id, last_task=last_task,
      current=current, detected=transition, n_max=n_max, num_classes=num_classes,
      max_new_classes=replay.max_client_classes, max_per_class=replay.max_per_class,
      distinct=replay.distinct)
  return ClientState(memory=memory, task=jnp.asarray(task, jnp.int32),
                     last_task=last_task.astype(jnp.int32)), transition

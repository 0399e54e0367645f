"""Architecture groups: how heterogeneous participants become a few vmapped stacks.

Participants that share an architecture (same registry name and keyword
arguments) form a `ClientGroup`; their parameters, BatchNorm statistics and
private data are stacked on a leading client axis and updated with `jax.vmap`.
Different groups meet only through quantities on the shared public batch
(logits, similarity matrices), inside one jitted function.

A group may be padded with dummy "slots" so that its size divides the number of
devices of the `clients` mesh axis; dummy slots copy a real client's data, are
marked inactive, never contribute to cross-client means and are never reported.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np

from fedjax_het import models


@dataclasses.dataclass(frozen=True)
class ClientGroup:
  """Participants sharing one architecture.

  Attributes:
    name: group key, e.g. "resnet12" (unique within a run).
    model: the Flax module all members use.
    clients: global participant indices of the members, in order.
    num_slots: size of the stacked client axis (>= len(clients); the extra
      slots are inactive padding for sharding).
    public_model: the module of the forward passes on the shared public batch
      (`algorithms.common.public_forward`), when it differs from `model`: the
      same architecture with another convolution implementation, so the same
      variables (e.g. custom-VJP convolutions on the public batch, whose
      backward pass through several models at once is the round's memory peak,
      and im2col ones in the local phase). None: `model`.
  """
  name: str
  model: nn.Module
  clients: tuple[int, ...]
  num_slots: int
  public_model: nn.Module | None = None

  @property
  def num_clients(self) -> int:
    return len(self.clients)

  @property
  def model_on_public(self) -> nn.Module:
    """The module of the public-batch forward passes (`public_model`, else `model`)."""
    return self.model if self.public_model is None else self.public_model


def group_clients(architectures: Sequence[str], models: Sequence[nn.Module], *,
                  slot_multiple: int = 1,
                  public_models: Sequence[nn.Module] | None = None) -> tuple[ClientGroup, ...]:
  """Groups participants by architecture key, in order of first appearance.

  Args:
    architectures: one key per participant (e.g. the model registry name plus
      its options); participants with equal keys share a group.
    models: one module per participant (the first of each group is used).
    slot_multiple: pad each group's client axis to a multiple of this (the
      device count when clients are sharded).
    public_models: optional, one module per participant for the public batch
      (`ClientGroup.public_model`; the first of each group is used).

  Returns:
    The groups.
  """
  if len(architectures) != len(models):
    raise ValueError(f"got {len(architectures)} architectures but {len(models)} models.")
  if public_models is not None and len(public_models) != len(models):
    raise ValueError(f"got {len(models)} models but {len(public_models)} public_models.")
  if slot_multiple < 1:
    raise ValueError(f"slot_multiple must be >= 1, got {slot_multiple}.")
  members: dict[str, list[int]] = {}
  for index, key in enumerate(architectures):
    members.setdefault(key, []).append(index)
  return tuple(
      ClientGroup(name=key, model=models[indices[0]], clients=tuple(indices),
                  num_slots=math.ceil(len(indices) / slot_multiple) * slot_multiple,
                  public_model=None if public_models is None else public_models[indices[0]])
      for key, indices in members.items())


class GroupData(NamedTuple):
  """Private data of one group, stacked over its slots (leading axis S).

  Rows [0, sizes[s]) of slot s are valid; the rest is zero padding.
  """
  images: Any     # (S, N, 32, 32, 3) uint8
  labels: Any     # (S, N) int32
  sizes: Any      # (S,) int32
  client_ids: Any  # (S,) int32 global participant index (padding: K, K+1, ...)
  active: Any     # (S,) bool, False for padding slots
  # (S, H * W) int32: the pixel permutation each slot's images carry (stored image = original
  # image with its pixel positions taken in this order, `data.partition.permuted_pixels`), or
  # None when the scenario does not permute pixels. Read by augmentation that acts on the
  # unpermuted image (`data.augment.resized_crop_flip`).
  pixel_permutation: Any = None


def stack_group_data(group: ClientGroup, images: Sequence[np.ndarray],
                     labels: Sequence[np.ndarray], *, num_participants: int,
                     max_size: int | None = None,
                     pixel_permutations: Sequence[np.ndarray] | None = None) -> GroupData:
  """Stacks the private data of a group's members into padded numpy arrays.

  Args:
    group: the group.
    images: per participant (indexed by global index) uint8 (N_i, 32, 32, 3).
    labels: per participant int (N_i,).
    num_participants: K, used to number padding slots K, K+1, ...
    max_size: pad every slot to this many rows (default: the largest member).
    pixel_permutations: per participant (indexed by global index) the (H * W,) pixel
      permutation its images carry, or None (`GroupData.pixel_permutation`).

  Returns:
    GroupData of numpy arrays.
  """
  sizes = [len(labels[i]) for i in group.clients]
  rows = max(sizes) if max_size is None else max_size
  if rows < max(sizes):
    raise ValueError(f"max_size {rows} is smaller than the largest client ({max(sizes)}).")
  shape = images[group.clients[0]].shape[1:]
  x = np.zeros((group.num_slots, rows, *shape), np.uint8)
  y = np.zeros((group.num_slots, rows), np.int32)
  n = np.zeros((group.num_slots,), np.int32)
  ids = np.zeros((group.num_slots,), np.int32)
  active = np.zeros((group.num_slots,), bool)
  for slot in range(group.num_slots):
    source = group.clients[slot % group.num_clients]  # padding slots copy a real client
    size = len(labels[source])
    x[slot, :size] = images[source]
    y[slot, :size] = labels[source]
    n[slot] = size
    if slot < group.num_clients:
      ids[slot] = source
      active[slot] = True
    else:
      ids[slot] = num_participants + slot - group.num_clients
  permutation = None
  if pixel_permutations is not None:  # padding slots copy their source client's, as its images
    permutation = np.stack([np.asarray(pixel_permutations[group.clients[slot % group.num_clients]],
                                       np.int32) for slot in range(group.num_slots)])
  return GroupData(images=x, labels=y, sizes=n, client_ids=ids, active=active,
                   pixel_permutation=permutation)


def vmap_slots(fn: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0
               ) -> Callable[..., Any]:
  """`jax.vmap(fn, in_axes)` over a group's slot axis, without the vmap for ONE slot.

  A group of one slot (every group of a heterogeneous federation on one
  device) runs `fn` on slot 0 of the mapped arguments and puts the slot axis
  back on every output. JAX then does not run the model's jaxpr through its
  batching interpreter, which was about a third of the time spent tracing the
  heterogeneous FCCL+ round (quick config on a 2-core CPU: 17.7 s -> 11.3 s).
  The values equal those of the vmap of size 1 up to float rounding, not bit
  for bit: XLA fuses the unbatched program differently.
  `in_axes` is 0 or None per positional argument (None: unmapped), as vmap's.
  """
  def mapped(*args):
    axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
    if len(axes) != len(args) or any(axis not in (0, None) for axis in axes):
      raise ValueError(f"vmap_slots: in_axes must be 0 or None per argument, got {in_axes!r} "
                       f"for {len(args)} arguments.")
    sizes = {leaf.shape[0] for arg, axis in zip(args, axes) if axis is not None
             for leaf in jax.tree_util.tree_leaves(arg)}
    if sizes != {1}:
      return jax.vmap(fn, in_axes=in_axes)(*args)
    sliced = [arg if axis is None else jax.tree_util.tree_map(lambda a: a[0], arg)
              for arg, axis in zip(args, axes)]
    return jax.tree_util.tree_map(lambda a: jax.numpy.expand_dims(a, 0), fn(*sliced))
  return mapped


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """One key per slot from the participant's global index (grouping-invariant)."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(client_ids)


def scatter_to_participants(groups: Sequence[ClientGroup], per_group: dict[str, np.ndarray],
                            num_participants: int) -> np.ndarray:
  """Reassembles per-slot values of every group into participant order (drops padding)."""
  first = np.asarray(next(iter(per_group.values())))
  out = np.zeros((num_participants, *first.shape[1:]), first.dtype)
  for group in groups:
    values = np.asarray(per_group[group.name])
    for slot, participant in enumerate(group.clients):
      out[participant] = values[slot]
  return out


def slot_ids(group: ClientGroup, num_participants: int) -> np.ndarray:
  """Global index of every slot (padding slots numbered K, K+1, ...)."""
  padding = range(num_participants, num_participants + group.num_slots - group.num_clients)
  return np.asarray(list(group.clients) + list(padding), np.int32)


def slot_active(group: ClientGroup) -> np.ndarray:
  """True for the real members, False for padding slots."""
  return np.arange(group.num_slots) < group.num_clients


def init_group_variables(group: ClientGroup, key: jax.Array, *, shared: bool,
                         num_participants: int) -> dict[str, Any]:
  """Initial variables of every slot of a group, stacked on a leading axis.

  Each participant's initialisation key is folded from its global index, so the
  result does not depend on how participants are grouped or padded. With
  `shared=True` (one global model) every slot starts from the first member's
  initialisation.
  """
  keys = client_keys(key, jax.numpy.asarray(slot_ids(group, num_participants)))
  if shared:
    keys = jax.numpy.broadcast_to(keys[:1], keys.shape)
  return jax.vmap(lambda k: models.init_variables(group.model, k))(keys)


def where_active(active: jax.Array, new: Any, old: Any) -> Any:
  """Per-slot select: keep `old` in inactive (padding) slots."""
  def select(n, o):
    return jax.numpy.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
  return jax.tree_util.tree_map(select, new, old)

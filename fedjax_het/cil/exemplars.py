"""iCaRL herding and a fixed-capacity exemplar memory (GLFC Sec. 4.3).

GLFC clients "follow iCaRL to update their exemplar memory": when a task
transition is detected, the memory of capacity M (2000) is split evenly over
the classes learned so far, m = M // num_seen exemplars per class; the old
classes keep the first m exemplars of their herding order (iCaRL's
ReduceExemplarSet) and each newly learned class gets m exemplars chosen by
herding (iCaRL's ConstructExemplarSet) on L2-normalised features of the
current model.

Everything here has fixed shapes so that one compiled program serves every
task although m changes, the memory can live in a checkpointed training state
and a stack of memories can be vmapped over clients:

  * `herding_order(features, mask, *, max_select, distinct)`: the greedy
    herding order of one class, `max_select` steps (static).
  * `ExemplarMemory`: a flat buffer of M slots (uint8 images, labels, rank of
    each entry in its class's herding order, validity), plus the current
    `num_seen` and `per_class` = m.
  * `init_memory(capacity, image_shape)`, `add_classes(memory, ...)` (reduce
    the old classes, herd the new ones) and `memory_batch(memory)` ->
    (images, labels, valid).

Repeated picks. The authors' herding loop (GLFC `_construct_exemplar_set`)
never removes a picked row from the candidates, so the same image can be
picked several times (and then appears several times in the replay data);
iCaRL's paper picks distinct exemplars. `distinct=False` (default) follows
the GLFC code, `distinct=True` the iCaRL paper. Greedy herding is
prefix-consistent (the first m picks of a longer run are the picks of an
m-step run), so herding `max_select` steps once and keeping the first m is
exactly the code's m-step loop.

Deviations from the authors' code:
  * Distances are computed in float32 (the code mixes float32 features with a
    float64 running sum); near-ties may resolve differently.
  * A class that is learned again (its label is already in the memory) has
    its old entries replaced by the new herding result; in the code the
    tasks' classes are disjoint, so this does not arise there.

References:
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017 (Alg. 4, 5).
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022,
    Sec. 4.3; conditionWang/FCIL src/GLFC.py (`_construct_exemplar_set`,
    `_reduce_exemplar_sets`, `compute_class_mean`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: |M| of GLFC (exemplar memory of each client, in images).
GLFC_MEMORY_SIZE = 2000
#: Floor of the norm in the L2 normalisation (torch.nn.functional.normalize's eps).
NORMALIZE_EPS = 1e-12


def _l2_normalize(features: jax.Array) -> jax.Array:
  """Row-wise x / max(||x||, eps), as torch.nn.functional.normalize."""
  norm = jnp.sqrt(jnp.sum(jnp.square(features), axis=-1, keepdims=True))
  return features / jnp.maximum(norm, NORMALIZE_EPS)


def _check_rows(fn: str, name: str, x: jax.Array, rank: int, rows: int | None,
                layout: str) -> None:
  if jnp.ndim(x) != rank or (rows is not None and jnp.shape(x)[0] != rows):
    raise ValueError(f"{fn}: `{name}` must have shape {layout}"
                     f"{'' if rows is None else f' with {rows} rows'}, got shape "
                     f"{jnp.shape(x)}.")


def herding_order(features: jax.Array, mask: jax.Array | None = None, *, max_select: int,
                  distinct: bool = False) -> tuple[jax.Array, jax.Array]:
  """Greedy herding order of one class (iCaRL Alg. 4; GLFC's exemplar selection).

  The rows are L2-normalised first, f_i = phi_i / ||phi_i|| (as GLFC's
  `compute_class_mean` does), mu is the mean of the normalised valid rows
  (not re-normalised, as in the code), and step k = 0, 1, ... picks

    p_k = argmin_i || mu - (S_k + f_i) / (k + 1) ||,   S_{k+1} = S_k + f_{p_k},

  over the valid rows (the first index wins ties, like `np.argmin`).

  Args:
    features: (n, d) features of the class's images (the current model's
      feature extractor, eval mode).
    mask: optional (n,) bool: False rows are padding and never picked.
    max_select: number of steps (static).
    distinct: False (default, the GLFC code): a picked row stays a candidate
      and may be picked again. True (iCaRL's paper): each row at most once.

  Returns:
    (indices (max_select,) int32, valid (max_select,) bool). valid[k] is
    False when step k picked nothing: with `distinct=True` for k >= the
    number of valid rows, with `distinct=False` only when there is no valid
    row at all. indices[k] is 0 where valid[k] is False.
  """
  fn = "herding_order"
  _check_rows(fn, "features", features, 2, None, "(n, feature_dim)")
  n = features.shape[0]
  mask = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
  _check_rows(fn, "mask", mask, 1, n, "(n,)")
  if int(max_select) < 1:
    raise ValueError(f"{fn}: `max_select` must be a positive int, got {max_select!r}.")
  f = _l2_normalize(jnp.asarray(features, jnp.float32))
  count = jnp.sum(mask)
  mu = jnp.sum(jnp.where(mask[:, None], f, 0.0), axis=0) / jnp.maximum(count, 1)

  def step(carry, k):
    total, available = carry
    steps = (k + 1).astype(f.dtype)
    dist = jnp.sqrt(jnp.sum(jnp.square(mu[None, :] - (total[None, :] + f) / steps), axis=-1))
    dist = jnp.where(available, dist, jnp.inf)
    index = jnp.argmin(dist).astype(jnp.int32)
    ok = jnp.isfinite(dist[index])
    total = total + jnp.where(ok, f[index], 0.0)
    if distinct:
      available = available.at[index].set(False)
    return (total, available), (jnp.where(ok, index, 0), ok)

  _, (indices, valid) = jax.lax.scan(step, (jnp.zeros_like(mu), mask),
                                     jnp.arange(int(max_select), dtype=jnp.int32))
  return indices, valid


class ExemplarMemory(NamedTuple):
  """Fixed-capacity exemplar memory of one client (stack a leading axis for many).

  Valid entries come first, sorted by (label, rank); the remaining slots are
  empty (label -1, rank -1, zero image).

  Attributes:
    images: (M, H, W, C) uint8 exemplar images.
    labels: (M,) int32 class of each entry, -1 for an empty slot.
    ranks: (M,) int32 position of the entry in its class's herding order
      (0 = first pick), -1 for an empty slot. Reduction keeps rank < m.
    valid: (M,) bool, True for the stored exemplars.
    num_seen: () int32, the number of classes the memory is split over.
    per_class: () int32, m = min(M // num_seen, max_per_class) (0 before the
      first update).
  """
  images: jax.Array
  labels: jax.Array
  ranks: jax.Array
  valid: jax.Array
  num_seen: jax.Array
  per_class: jax.Array

  @property
  def capacity(self) -> int:
    return self.labels.shape[-1]


def init_memory(capacity: int = GLFC_MEMORY_SIZE,
                image_shape: Sequence[int] = (32, 32, 3)) -> ExemplarMemory:
  """An empty memory of `capacity` slots (GLFC: 2000).

  Args:
    capacity: M, the number of exemplar slots (static).
    image_shape: (H, W, C) of one image.

  Returns:
    An `ExemplarMemory` with every slot empty. `jax.vmap(lambda _:
    init_memory(M))(jnp.arange(K))` or `jax.tree.map` with `jnp.stack` gives
    a stack for K clients.
  """
  capacity = int(capacity)
  if capacity < 1:
    raise ValueError(f"init_memory: `capacity` must be a positive int, got {capacity!r}.")
  image_shape = tuple(int(s) for s in image_shape)
  return ExemplarMemory(
      images=jnp.zeros((capacity,) + image_shape, jnp.uint8),
      labels=jnp.full((capacity,), -1, jnp.int32),
      ranks=jnp.full((capacity,), -1, jnp.int32),
      valid=jnp.zeros((capacity,), bool),
      num_seen=jnp.zeros((), jnp.int32),
      per_class=jnp.zeros((), jnp.int32))


def exemplars_per_class(capacity: int, num_seen: int | jax.Array) -> jax.Array:
  """m = capacity // num_seen (GLFC `int(memory_size / learned_numclass)`); 0 if none seen."""
  num_seen = jnp.asarray(num_seen, jnp.int32)
  return jnp.where(num_seen > 0, capacity // jnp.maximum(num_seen, 1), 0).astype(jnp.int32)


def add_classes(memory: ExemplarMemory, *, images: jax.Array, labels: jax.Array,
                features: jax.Array, new_classes: jax.Array, num_seen: int | jax.Array,
                mask: jax.Array | None = None, max_per_class: int | None = None,
                distinct: bool = False) -> ExemplarMemory:
  """Reduces the old classes to m exemplars and herds m for each new class.

  GLFC `update_new_set` after a detected task transition: m = M // num_seen;
  every class already in the memory keeps the first m entries of its herding
  order (iCaRL ReduceExemplarSet), and each class of `new_classes` gets the
  first m picks of `herding_order` over its rows of `images` (iCaRL
  ConstructExemplarSet). Shapes do not depend on m or on how many classes
  are new, so one compiled function serves every task; vmap it over clients.

  Args:
    memory: the client's `ExemplarMemory`.
    images: (n, H, W, C) uint8 images of the client's training data (rows of
      other classes and padding rows are ignored).
    labels: (n,) int labels of `images`.
    features: (n, d) features of `images` under the current model (GLFC: the
      feature extractor on normalised images, eval mode); L2-normalised here.
    new_classes: (K,) int ids of the newly learned classes (GLFC's
      `last_class`, 6 per task); entries < 0 are padding. Ids must be
      distinct. K is static.
    num_seen: number of classes the memory is split over after this update
      (GLFC `learned_numclass`: the old classes plus the new ones). May be
      traced. It must be at least the number of distinct classes stored
      after the update; otherwise the entries that do not fit (highest
      labels, then highest ranks) are dropped.
    mask: optional (n,) bool validity of the rows.
    max_per_class: static length of the herding run (default: the memory
      capacity). m is min(M // num_seen, max_per_class); choose it >=
      M // (smallest num_seen) to get exactly the code's m (GLFC: 2000 // 6).
    distinct: see `herding_order` (default False: the GLFC code).

  Returns:
    The updated memory (valid entries first, sorted by (label, rank)).
  """
  fn = "add_classes"
  capacity = memory.labels.shape[-1]
  image_shape = memory.images.shape[1:]
  if images.dtype != jnp.uint8:
    raise ValueError(f"{fn}: `images` must be uint8 (the memory stores raw images), got "
                     f"{images.dtype}.")
  _check_rows(fn, "images", images, 1 + len(image_shape), None, "(n, H, W, C)")
  if tuple(images.shape[1:]) != tuple(image_shape):
    raise ValueError(f"{fn}: `images` must have image shape {tuple(image_shape)} (the "
                     f"memory's), got {tuple(images.shape[1:])}.")
  n = images.shape[0]
  _check_rows(fn, "labels", labels, 1, n, "(n,)")
  _check_rows(fn, "features", features, 2, n, "(n, feature_dim)")
  _check_rows(fn, "new_classes", new_classes, 1, None, "(num_new,)")
  max_per_class = capacity if max_per_class is None else int(max_per_class)
  if max_per_class < 1:
    raise ValueError(f"{fn}: `max_per_class` must be a positive int, got {max_per_class!r}.")
  if isinstance(num_seen, (int, np.integer)) and num_seen < 0:
    raise ValueError(f"{fn}: `num_seen` must be >= 0, got {num_seen!r}.")
  mask = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
  _check_rows(fn, "mask", mask, 1, n, "(n,)")
  labels = jnp.asarray(labels, jnp.int32)
  new_classes = jnp.asarray(new_classes, jnp.int32)
  per_class = jnp.minimum(exemplars_per_class(capacity, num_seen), max_per_class)

  # Old entries: drop classes learned again, keep the first m of each order.
  relearned = jnp.any((memory.labels[:, None] == new_classes[None, :])
                      & (new_classes[None, :] >= 0), axis=1)
  keep_old = memory.valid & ~relearned & (memory.ranks < per_class)

  # New classes: herding over each class's rows.
  def herd(cls):
    order, ok = herding_order(features, mask & (labels == cls), max_select=max_per_class,
                              distinct=distinct)
    return order, ok & (cls >= 0)

  orders, ok = jax.vmap(herd)(new_classes)  # (K, P)
  new_ranks = jnp.broadcast_to(jnp.arange(max_per_class, dtype=jnp.int32), orders.shape)
  keep_new = ok & (new_ranks < per_class)

  # All candidates, valid first, by (label, rank); the first M fill the memory.
  cand_labels = jnp.concatenate([memory.labels, jnp.repeat(new_classes, max_per_class)])
  cand_ranks = jnp.concatenate([memory.ranks, new_ranks.reshape(-1)])
  cand_keep = jnp.concatenate([keep_old, keep_new.reshape(-1)])
  order = jnp.lexsort((cand_ranks, cand_labels, ~cand_keep))[:capacity]
  valid = cand_keep[order]
  from_old = order < capacity
  old_rows = jnp.where(from_old, order, 0)
  new_rows = orders.reshape(-1)[jnp.where(from_old, 0, order - capacity)]
  picked = jnp.where(from_old.reshape((-1,) + (1,) * len(image_shape)),
                     memory.images[old_rows], images[new_rows])
  blank = valid.reshape((-1,) + (1,) * len(image_shape))
  return ExemplarMemory(
      images=jnp.where(blank, picked, jnp.zeros_like(picked)),
      labels=jnp.where(valid, cand_labels[order], -1),
      ranks=jnp.where(valid, cand_ranks[order], -1),
      valid=valid,
      num_seen=jnp.asarray(num_seen, jnp.int32),
      per_class=per_class)


def memory_batch(memory: ExemplarMemory) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(images (M, H, W, C) uint8, labels (M,) int32, valid (M,) bool) of the exemplars.

  Empty slots have valid False (label -1, zero image); mix them into the
  training data with the mask, e.g. concatenated to the client's padded
  dataset (GLFC trains on the current classes plus the exemplars).
  """
  return memory.images, memory.labels, memory.valid

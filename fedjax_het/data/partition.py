"""Client partitioners: IID, Dirichlet label skew, shards, PFLlib's pathological split,
binary and contiguous class splits, permuted pixels, per-client train/test splits, and GLFC
class-incremental task streams.

All are NumPy functions seeded by an explicit `np.random.Generator` (or seed),
returning integer index arrays into the dataset, one per client (use
`Split.take`). Nothing here touches the images except `permuted_pixels` and `take_pixels`.

References:
  [FedAvg] H. B. McMahan et al. Communication-Efficient Learning of Deep
    Networks from Decentralized Data. AISTATS 2017 (shards: sort by label,
    200 shards of 300, 2 per client).
  [Dirichlet] T.-M. H. Hsu, H. Qi, M. Brown. Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification. 2019.
  [FedMMD] X. Yao et al. Federated Learning with Additional Mechanisms on
    Clients to Reduce Communication Costs (binary split, permuted MNIST).
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022.
  [PFLlib] J. Zhang et al. PFLlib: A Beginner-Friendly and Comprehensive Personalized
    Federated Learning Library and Benchmark. JMLR 2025 (dataset/utils/dataset_utils.py:
    the "pat" partition and the per-client 75/25 split that HtFLlib's data use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


def _check_positive_int(name: str, value: int, minimum: int = 1) -> int:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
  return int(value)


def _check_labels(labels: np.ndarray) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"`labels` must be a 1-D integer array, got dtype {labels.dtype} shape "
                     f"{labels.shape}.")
  if labels.size and labels.min() < 0:
    raise ValueError(f"`labels` must be non-negative, found {labels.min()}.")
  return labels


def iid_partition(num_examples: int, num_clients: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
  """Uniformly random, disjoint, near-equal split of range(num_examples).

  Returns:
    num_clients int64 index arrays whose sizes differ by at most one and
    whose union is range(num_examples).
  """
  _check_positive_int("num_examples", num_examples, 0)
  _check_positive_int("num_clients", num_clients)
  return [np.sort(part) for part in np.array_split(rng.permutation(num_examples), num_clients)]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float,
                        rng: np.random.Generator, *, min_size: int = 10, balance: bool = True,
                        max_retries: int = 1000) -> list[np.ndarray]:
  """Dirichlet(alpha) label skew [Hsu et al. 2019], as in the FCCL/MOON code.

  For every class, the class's examples (shuffled) are divided among the
  clients in proportions drawn from Dir(alpha * 1_K). Small alpha gives each
  client few classes; large alpha approaches IID. With `balance`, a client
  that already holds >= N / K examples gets no share of later classes (the
  reference code's rule, which bounds client sizes). The draw is repeated
  until every client holds at least `min_size` examples.

  Args:
    labels: (N,) integer labels.
    num_clients: K >= 1.
    alpha: Dirichlet concentration, > 0.
    rng: random generator.
    min_size: minimum examples per client (the code uses 10).
    balance: apply the size cap described above.
    max_retries: give up (ValueError) after this many draws.

  Returns:
    K disjoint int64 index arrays covering all N examples, each shuffled.
  """
  labels = _check_labels(labels)
  _check_positive_int("num_clients", num_clients)
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f"`alpha` must be finite and > 0, got {alpha!r}.")
  n = labels.shape[0]
  if min_size * num_clients > n:
    raise ValueError(f"`min_size` * `num_clients` = {min_size * num_clients} exceeds the "
                     f"{n} examples.")
  classes = np.unique(labels)
  for _ in range(max_retries):
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for c in classes:
      idx = rng.permutation(np.nonzero(labels == c)[0])
      proportions = rng.dirichlet(np.full(num_clients, float(alpha)))
      if balance:
        proportions = proportions * (sizes < n / num_clients)
      total = proportions.sum()
      proportions = proportions / total if total > 0 else np.full(num_clients, 1 / num_clients)
      cuts = (np.cumsum(proportions) * len(idx)).astype(np.int64)[:-1]
      for k, piece in enumerate(np.split(idx, cuts)):
        parts[k].append(piece)
        sizes[k] += len(piece)
    if sizes.min() >= min_size:
      return [rng.permutation(np.concatenate(p)) for p in parts]
  raise ValueError(f"dirichlet_partition: no draw gave every client >= {min_size} examples in "
                   f"{max_retries} tries (alpha={alpha}, {num_clients} clients, {n} examples); "
                   "lower `min_size` or raise `alpha`.")


def shard_partition(labels: np.ndarray, num_clients: int, *, shards_per_client: int = 2,
                    shard_size: int = 300,
                    rng: np.random.Generator) -> list[np.ndarray]:
  """Pathological non-IID shards [McMahan et al. 2017; FedMMD].

  Sort the examples by label, cut them into `num_clients * shards_per_client`
  shards of `shard_size` consecutive examples, and give each client
  `shards_per_client` random shards. With MNIST's 60000 examples, 100 clients,
  2 shards of 300 each, most clients see exactly two digits.

  When the dataset holds more than `num_clients * shards_per_client *
  shard_size` examples, a uniformly random subset of that size is used
  (within a class the order is random, so shards are random samples of their
  class).

  Returns:
    num_clients disjoint int64 index arrays of shards_per_client * shard_size
    examples each.

  Raises:
    ValueError: if the shards need more examples than there are.
  """
  labels = _check_labels(labels)
  _check_positive_int("num_clients", num_clients)
  _check_positive_int("shards_per_client", shards_per_client)
  _check_positive_int("shard_size", shard_size)
  num_shards = num_clients * shards_per_client
  needed = num_shards * shard_size
  if needed > labels.shape[0]:
    raise ValueError(f"shard_partition: {num_shards} shards of {shard_size} need {needed} "
                     f"examples, the dataset has {labels.shape[0]}; lower `shard_size` or "
                     "`num_clients`.")
  chosen = rng.permutation(labels.shape[0])[:needed]
  ordered = chosen[np.argsort(labels[chosen], kind="stable")]
  shards = ordered.reshape(num_shards, shard_size)
  assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return [np.concatenate([shards[s] for s in row]) for row in assignment]


def pathological_partition(labels: np.ndarray, num_clients: int, *, classes_per_client: int,
                           rng: np.random.Generator, balance: bool = False,
                           min_size: int = 40) -> list[np.ndarray]:
  """PFLlib's "pathological" label skew (`separate_data(partition="pat")`, HtFLlib's data).

  Classes are handed out in label order: class c goes to the first
  ceil(K / C * classes_per_client) clients (in client order) that still have
  room for another class, each client taking at most `classes_per_client`
  classes, so with K = 20, C = 10 and 2 classes per client clients 0-3 hold
  classes {0, 1}, clients 4-7 {2, 3}, and so on. The examples of a class are
  split among its clients in a random order of the class: with `balance` in
  equal parts (the last client takes the remainder); without (PFLlib's
  default, "-" on its command line) the first clients take
  randint(max(n_c / m / 10, min_size / C), n_c / m) examples each (n_c the
  class size, m its clients) and the last client the rest.

  Args:
    labels: (N,) integer labels; the classes are 0 .. max(labels).
    num_clients: K >= 1.
    classes_per_client: classes a client holds (PFLlib's `class_per_client`: 2 for
      CIFAR-10, 10 for CIFAR-100 in FedTGP's pathological setting).
    rng: random generator.
    balance: equal shares of a class (PFLlib's "balance").
    min_size: PFLlib's `least_samples`, min(batch / (1 - train_ratio), N / K / 2) there
      (40 for CIFAR-10's 60000 images); only the lower bound of the unbalanced draw.

  Returns:
    K disjoint int64 index arrays (a client that receives no class is empty; with
    K * classes_per_client >= C every class is assigned and their union is range(N)).

  Raises:
    ValueError: a bad argument (naming it and the allowed values).
  """
  labels = _check_labels(labels)
  k = _check_positive_int("num_clients", num_clients)
  per_client = _check_positive_int("classes_per_client", classes_per_client)
  _check_positive_int("min_size", min_size, 0)
  num_classes = int(labels.max()) + 1 if labels.size else 0
  room = [per_client] * k
  parts: list[list[np.ndarray]] = [[] for _ in range(k)]
  takers = int(np.ceil(k / max(num_classes, 1) * per_client))
  for c in range(num_classes):
    chosen = [client for client in range(k) if room[client] > 0][:takers]
    if not chosen:
      break
    idx = rng.permutation(np.nonzero(labels == c)[0])
    share = len(idx) / len(chosen)
    if balance:
      sizes = [int(share)] * (len(chosen) - 1)
    else:
      low = max(share / 10, min_size / num_classes)
      sizes = [int(rng.integers(int(low), max(int(share), int(low) + 1)))
               for _ in range(len(chosen) - 1)]
    sizes.append(len(idx) - sum(sizes))
    start = 0
    for client, size in zip(chosen, sizes):
      parts[client].append(idx[start:start + size])
      start += size
      room[client] -= 1
  return [rng.permutation(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64)
          for p in parts]


def train_test_split_indices(num_examples: int, train_fraction: float,
                             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(train, test) index arrays of a shuffled split of range(num_examples).

  The train part takes floor(train_fraction * n) examples and the test part the rest,
  as scikit-learn's `train_test_split(train_size=train_fraction, shuffle=True)`, which
  PFLlib's `split_data` applies to every client (train_fraction 0.75).
  """
  n = _check_positive_int("num_examples", num_examples, 0)
  if not 0 < float(train_fraction) < 1:
    raise ValueError(f"`train_fraction` must be a number in (0, 1), got {train_fraction!r}.")
  order = rng.permutation(n)
  cut = int(np.floor(float(train_fraction) * n))
  return order[:cut].astype(np.int64), order[cut:].astype(np.int64)


def binary_class_split(labels: np.ndarray, *, num_classes: int = 10,
                       rng: np.random.Generator | None = None) -> list[np.ndarray]:
  """Two clients with disjoint halves of the classes (FedMMD's binary split).

  Args:
    labels: (N,) integer labels in [0, num_classes).
    num_classes: number of classes (even).
    rng: if None, client 0 holds classes [0, C/2) and client 1 the rest (the
      paper's 0-4 / 5-9); otherwise the halves are a random permutation.

  Returns:
    [indices of client 0, indices of client 1]: every example of a client's
    classes, in dataset order.
  """
  labels = _check_labels(labels)
  _check_positive_int("num_classes", num_classes, 2)
  if num_classes % 2:
    raise ValueError(f"`num_classes` must be even, got {num_classes}.")
  order = np.arange(num_classes) if rng is None else rng.permutation(num_classes)
  first = np.isin(labels, order[:num_classes // 2])
  second = np.isin(labels, order[num_classes // 2:])
  return [np.nonzero(first)[0], np.nonzero(second)[0]]


def class_groups(labels: np.ndarray, num_clients: int, *,
                 interleaved: bool = False) -> np.ndarray:
  """The classes present in `labels`, in label order, cut into `num_clients` groups.

  Contiguous groups (default): client k of the "class_split" partitions holds every example of
  group k: with 2 clients on 10 classes FedMMD's binary split (0-4 / 5-9, Sec. 4.2.1), with 5
  clients 2 classes each. Interleaved (`interleaved=True`, the "permuted_classes"
  partition): class c of the sorted classes goes to group c mod K, with 2 clients on MNIST the
  even and the odd digits, the two clients of the FedFusion authors' permuted-MNIST script
  (thu-media/FedFusion, mnist_main.py: subsets [0, 2, 4, 6, 8] and [1, 3, 5, 7, 9]).

  Args:
    labels: (N,) integer labels.
    num_clients: K >= 1, dividing the number of classes present.
    interleaved: deal the classes in turn instead of cutting them into contiguous runs.

  Returns:
    (K, C / K) int64 array of class ids; row k is client k's classes.

  Raises:
    ValueError: K does not divide the number of classes present.
  """
  labels = _check_labels(labels)
  k = _check_positive_int("num_clients", num_clients)
  classes = np.unique(labels).astype(np.int64)
  if classes.size % k:
    which = ("'permuted_classes' partition (2 clients: even / odd classes)" if interleaved else
             "'class_split' partitions (2 clients: FedMMD's binary split)")
    raise ValueError(f"`num_clients`={k} must divide the {classes.size} classes present for "
                     f"the {which}.")
  return classes.reshape(-1, k).T.copy() if interleaved else classes.reshape(k, -1)


def examples_of_classes(labels: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
  """Per row of `groups` (K, G), the indices (in dataset order) of the examples of its classes."""
  labels = _check_labels(labels)
  return [np.nonzero(np.isin(labels, group))[0] for group in np.asarray(groups)]


def client_permutation(client_index: int, *, seed: int, num_pixels: int = 32 * 32) -> np.ndarray:
  """The fixed pixel permutation of one client (independent of the client count)."""
  _check_positive_int("client_index", client_index, 0)
  return np.random.default_rng(np.random.SeedSequence([int(seed), 7919, int(client_index)])
                               ).permutation(num_pixels)


def make_permutations(num_clients: int, seed: int, *, num_pixels: int = 32 * 32) -> np.ndarray:
  """(num_clients, num_pixels) pixel permutations, one per client (permuted MNIST).

  Row k equals `client_permutation(k, seed=seed)`; use with `permuted_pixels`.
  """
  _check_positive_int("num_clients", num_clients)
  return np.stack([client_permutation(k, seed=seed, num_pixels=num_pixels)
                   for k in range(num_clients)])


def permuted_pixels(images: np.ndarray, client_index: int, *, seed: int) -> np.ndarray:
  """Applies client `client_index`'s fixed spatial pixel permutation.

  The same permutation is applied to every image of the client and to all
  channels of a pixel (the pixel positions are shuffled). "User-specific
  non-IID" data of FedMMD (permuted MNIST per client).

  Args:
    images: (N, H, W, C) array.
    client_index: client number (>= 0).
    seed: permutation seed shared by all clients of an experiment.

  Returns:
    Array of the same shape and dtype.
  """
  images = _check_images(images)
  return take_pixels(images, client_permutation(client_index, seed=seed,
                                                num_pixels=images.shape[1] * images.shape[2]))


def take_pixels(images: np.ndarray, permutation: np.ndarray) -> np.ndarray:
  """(N, H, W, C) images with their H * W pixel positions taken in `permutation`'s order.

  `permuted_pixels` with the permutation given (a row of `make_permutations`).
  """
  images = _check_images(images)
  n, h, w, c = images.shape
  permutation = np.asarray(permutation)
  if permutation.shape != (h * w,):
    raise ValueError(f"`permutation` must have shape ({h * w},) for {h}x{w} images, got "
                     f"{permutation.shape}.")
  return images.reshape(n, h * w, c)[:, permutation].reshape(n, h, w, c)


def _check_images(images: np.ndarray) -> np.ndarray:
  images = np.asarray(images)
  if images.ndim != 4:
    raise ValueError(f"`images` must have shape (N, H, W, C), got {images.shape}.")
  return images


class Task(NamedTuple):
  """One task of a class-incremental stream (see `class_incremental_tasks`).

  Attributes:
    task: task number t (0-based).
    classes: (classes_per_task,) original labels introduced by this task.
    seen_classes: all labels introduced in tasks 0..t, in class order.
    client_ids: (num_clients_t,) the clients present: 0 .. num_clients_t - 1.
    client_classes: per present client, the labels it holds in this task.
    client_indices: per present client, int64 indices of its examples.
    kept_old: (num_clients_t,) bool; True where the client kept its previous
      task's classes and data instead of moving to the new task.
  """
  task: int
  classes: np.ndarray
  seen_classes: np.ndarray
  client_ids: np.ndarray
  client_classes: tuple[np.ndarray, ...]
  client_indices: tuple[np.ndarray, ...]
  kept_old: np.ndarray


def class_incremental_tasks(labels: np.ndarray, *, num_tasks: int = 10,
                            classes_per_task: int = 10, initial_clients: int = 30,
                            new_clients_per_task: int = 10, class_fraction: float = 0.6,
                            shift_fraction: float = 0.9, overlap: bool = True,
                            rng: np.random.Generator) -> tuple[Task, ...]:
  """GLFC's federated class-incremental stream (CIFAR-100: 10 tasks of 10 classes).

  Rules (GLFC Sec. 5 and the authors' code):

  * Class order: one seeded permutation of the classes, fixed for the whole
    stream; task t introduces classes order[t*k : (t+1)*k] (k =
    classes_per_task). Classes therefore appear strictly in task order.
  * Clients: `initial_clients` at task 0, `new_clients_per_task` more join at
    each later task (client ids are consecutive).
  * Class assignment: a client that takes part in task t holds
    round(class_fraction * k) of the task's classes (60%: 6 of 10), a random
    subset drawn per client.
  * Task shift: at a new task, each existing client moves to the new task
    with probability `shift_fraction` (exactly round(shift_fraction * n)
    clients are chosen at random); the others ("old" clients,
    `kept_old=True`) keep the classes and examples they held at the previous
    task. New clients always take the new task.
  * Examples: with `overlap=True` (the GLFC code) a client receives every
    training example of each of its classes, so clients holding the same
    class share examples. With `overlap=False` the examples of a class are
    split disjointly (random, near-equal parts) among the clients that take
    that class in that task; since every class belongs to exactly one task,
    no example is then held by two clients at the same task. (A class with
    fewer examples than holders leaves some holders without examples of it;
    `client_classes` still lists the assigned classes.)

  Labels keep their original values; a model whose head grows per task
  wants labels re-indexed by class order: `remap = np.argsort(order)`,
  `new_label = remap[label]`, with `order = np.concatenate([t.classes for t in
  tasks])`.

  Args:
    labels: (N,) integer labels.
    num_tasks, classes_per_task: the stream uses num_tasks * classes_per_task
      distinct classes (must not exceed the classes present).
    initial_clients, new_clients_per_task: client counts.
    class_fraction: fraction of a task's classes a client holds, in (0, 1].
    shift_fraction: fraction of existing clients moving to a new task, [0, 1].
    overlap: see above.
    rng: random generator.

  Returns:
    Tuple of `Task`, one per task.
  """
  labels = _check_labels(labels)
  _check_positive_int("num_tasks", num_tasks)
  _check_positive_int("classes_per_task", classes_per_task)
  _check_positive_int("initial_clients", initial_clients)
  _check_positive_int("new_clients_per_task", new_clients_per_task, 0)
  if not 0 < class_fraction <= 1:
    raise ValueError(f"`class_fraction` must be in (0, 1], got {class_fraction!r}.")
  if not 0 <= shift_fraction <= 1:
    raise ValueError(f"`shift_fraction` must be in [0, 1], got {shift_fraction!r}.")
  present = np.unique(labels)
  needed = num_tasks * classes_per_task
  if needed > present.size:
    raise ValueError(f"class_incremental_tasks: {num_tasks} tasks of {classes_per_task} classes "
                     f"need {needed} classes, the labels hold {present.size}.")
  order = rng.permutation(present)[:needed]
  per_client = max(1, int(round(class_fraction * classes_per_task)))
  by_class = {int(c): np.nonzero(labels == c)[0] for c in order}

  tasks = []
  client_classes: list[np.ndarray] = []
  client_indices: list[np.ndarray] = []
  for t in range(num_tasks):
    task_classes = order[t * classes_per_task:(t + 1) * classes_per_task]
    existing = len(client_classes)
    joining = initial_clients if t == 0 else new_clients_per_task
    kept_old = np.zeros(existing + joining, dtype=bool)
    if t > 0 and existing:
      movers = int(round(shift_fraction * existing))
      stay = rng.permutation(existing)[movers:]
      kept_old[stay] = True
    movers_ids = [k for k in range(existing + joining) if not kept_old[k]]
    new_classes = {k: np.sort(rng.choice(task_classes, size=per_client, replace=False))
                   for k in movers_ids}
    # Examples of each class for the clients that take it in this task.
    new_indices: dict[int, list[np.ndarray]] = {k: [] for k in movers_ids}
    for c in task_classes:
      holders = [k for k in movers_ids if c in new_classes[k]]
      if not holders:
        continue
      idx = by_class[int(c)]
      if overlap:
        for k in holders:
          new_indices[k].append(idx)
      else:
        for k, part in zip(holders, np.array_split(rng.permutation(idx), len(holders))):
          new_indices[k].append(np.sort(part))
    client_classes = client_classes + [np.zeros(0, np.int64)] * joining
    client_indices = client_indices + [np.zeros(0, np.int64)] * joining
    for k in movers_ids:
      client_classes[k] = new_classes[k]
      parts = new_indices[k]
      client_indices[k] = (np.concatenate(parts) if parts else np.zeros(0, np.int64)).astype(
          np.int64)
    tasks.append(Task(task=t, classes=task_classes.copy(),
                      seen_classes=order[:(t + 1) * classes_per_task].copy(),
                      client_ids=np.arange(existing + joining),
                      client_classes=tuple(c.copy() for c in client_classes),
                      client_indices=tuple(i.copy() for i in client_indices),
                      kept_old=kept_old))
  return tuple(tasks)


def label_histogram(labels: np.ndarray, partition: Sequence[np.ndarray],
                    num_classes: int) -> np.ndarray:
  """(num_clients, num_classes) count of each class per client (for checks and plots)."""
  labels = _check_labels(labels)
  return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in partition])

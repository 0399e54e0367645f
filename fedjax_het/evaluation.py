"""Evaluation: top-k accuracy of every participant on every domain's test set.

FCCL+ reports, per participant i, the intra-domain accuracy (on its own
domain's test set) and the inter-domain accuracy (mean over the other domains'
test sets), top-1 for Digits/Office-Caltech and top-5 for Office31/Office-Home,
and the number in the tables is the mean of the last 3 rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models
from fedjax_het.engine import batching
from fedjax_het.engine.clients import ClientGroup, vmap_slots


class TestData(NamedTuple):
  """Test sets of all domains, padded to a common length."""
  images: Any  # (D, N, 32, 32, 3) uint8
  labels: Any  # (D, N) int32
  sizes: Any   # (D,) int32


def stack_test_sets(domains: Sequence[str], images: Mapping[str, np.ndarray],
                    labels: Mapping[str, np.ndarray]) -> TestData:
  """Pads the per-domain test sets into one `TestData` (numpy)."""
  rows = max(len(labels[d]) for d in domains)
  x = np.zeros((len(domains), rows, 32, 32, 3), np.uint8)
  y = np.zeros((len(domains), rows), np.int32)
  n = np.zeros((len(domains),), np.int32)
  for i, d in enumerate(domains):
    x[i, :len(labels[d])] = images[d]
    y[i, :len(labels[d])] = labels[d]
    n[i] = len(labels[d])
  return TestData(x, y, n)


def make_evaluator(groups: Sequence[ClientGroup], *, batch_size: int, max_size: int,
                   top_k: int, preprocess: Callable[[jax.Array], jax.Array]):
  """Builds `evaluate(state, test) -> {group: accuracy (slots, domains)}` (percent).

  Models run in eval mode (BatchNorm running statistics, no dropout). Test
  sets are processed in static batches with padding rows masked out.
  """
  batch_size = min(batch_size, max_size)
  steps = batching.steps_per_epoch(max_size, batch_size)

  def accuracy(model, variables, images, labels, size):
    def count(correct, step):
      start = step * batch_size
      rows = jnp.minimum(start + jnp.arange(batch_size), max_size - 1)
      _, logits, _ = models.apply_model(model, variables, preprocess(images[rows]), train=False)
      k = min(top_k, logits.shape[-1])
      _, top = jax.lax.top_k(logits, k)
      hit = jnp.any(top == labels[rows][:, None], axis=-1)
      valid = (start + jnp.arange(batch_size)) < size
      return correct + jnp.sum(hit & valid), None

    correct, _ = jax.lax.scan(count, jnp.zeros((), jnp.int32), jnp.arange(steps))
    return 100.0 * correct / jnp.maximum(size, 1)

  def evaluate(state, test: TestData):
    out = {}
    for group in groups:
      variables = state["groups"][group.name]["variables"]
      per_domain = jax.vmap(accuracy, in_axes=(None, None, 0, 0, 0))
      per_client = vmap_slots(lambda v: per_domain(group.model, v, test.images, test.labels,
                                                    test.sizes))
      out[group.name] = per_client(variables)
    return out

  return evaluate


def intra_inter(accuracy: np.ndarray, client_domains: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
  """Intra (own domain) and inter (mean of the other domains) accuracy per participant.

  Args:
    accuracy: (K, D) accuracy of participant k on domain d.
    client_domains: the domain index of each participant.

  Returns:
    (intra (K,), inter (K,)); inter is NaN when there is a single domain.
  """
  accuracy = np.asarray(accuracy, np.float64)
  k, d = accuracy.shape
  intra = np.array([accuracy[i, client_domains[i]] for i in range(k)])
  inter = np.array([np.mean([accuracy[i, j] for j in range(d) if j != client_domains[i]])
                    if d > 1 else np.nan for i in range(k)])
  return intra, inter

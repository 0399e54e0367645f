"""Self-check of the loss library: every loss, jitted and vmapped over clients.

    python experiments/self_check.py

Builds random inputs for 4 clients (stacked on a leading axis), evaluates each
exported loss under `jax.jit(jax.vmap(...))`, checks the values are finite and
that a few known identities hold, and prints a table with the per-call time.
Exits with status 1 if any check fails.
"""

from __future__ import annotations

import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import losses

NUM_CLIENTS, BATCH, CLASSES, FEATURES = 4, 64, 10, 32


def _inputs(key):
  keys = jax.random.split(key, 6)
  shape = (NUM_CLIENTS, BATCH, CLASSES)
  return {
      "logits": 3.0 * jax.random.normal(keys[0], shape),
      "target": 3.0 * jax.random.normal(keys[1], shape),
      "features": jax.random.normal(keys[2], (NUM_CLIENTS, BATCH, FEATURES)),
      "labels": jax.random.randint(keys[3], (NUM_CLIENTS, BATCH), 0, CLASSES),
      "other": jax.random.normal(keys[4], (NUM_CLIENTS, BATCH, FEATURES)),
      "prototypes": jax.random.normal(keys[5], (NUM_CLIENTS, CLASSES, FEATURES)),
  }


def _checks(x):
  """(name, per-client function of the inputs) for every loss family."""
  mask = jnp.arange(CLASSES) < 7
  return [
      ("FCCM (FCCL+ Eq. 2)", lambda d: losses.cross_correlation_loss(
          logits=d["logits"], target_logits=d["target"])),
      ("FISL (FCCL+ Eq. 5)", lambda d: losses.instance_similarity_loss(
          similarity=losses.instance_similarity_matrix(features=d["features"]),
          target_similarity=losses.instance_similarity_matrix(features=d["other"]))),
      ("FNTD (FCCL+ Eq. 13)", lambda d: losses.non_target_distillation_loss(
          student_logits=d["logits"], teacher_logits=d["target"], labels=d["labels"],
          temperature=3.0)),
      ("dual KD (FCCL Eq. 6)", lambda d: losses.dual_domain_distillation_loss(
          logits=d["logits"], previous_logits=d["target"], pretrained_logits=d["target"])),
      ("L_GC (GLFC Eq. 4)", lambda d: losses.class_aware_gradient_compensation_loss(
          logits=d["logits"], labels=d["labels"], num_old_classes=5)),
      ("L_RD (GLFC Eq. 5)", lambda d: losses.class_semantic_relation_distillation_loss(
          logits=d["logits"], labels=d["labels"], old_logits=d["target"][:, :5])),
      ("entropy (GLFC Eq. 7)", lambda d: losses.mean_prediction_entropy(logits=d["logits"])),
      ("MK-MMD^2 (FedMMD Eq. 2)", lambda d: losses.multi_kernel_mmd_squared(
          x=d["logits"], y=d["target"])),
      ("MOON", lambda d: losses.model_contrastive_loss(
          features=d["features"], global_features=d["other"],
          previous_features=jnp.roll(d["other"], 1, axis=0))),
      ("FedProc InfoNCE", lambda d: losses.prototype_contrastive_loss(
          features=d["features"], labels=d["labels"], prototypes=d["prototypes"],
          prototype_mask=mask)),
      ("RHFL SCE", lambda d: losses.symmetric_cross_entropy(logits=d["logits"], labels=d["labels"])),
      ("FedMD L1", lambda d: losses.consensus_l1_loss(logits=d["logits"],
                                                      consensus_logits=d["target"])),
      ("FedRS + CE", lambda d: losses.softmax_cross_entropy(
          logits=losses.restricted_softmax_logits(logits=d["logits"], class_mask=mask),
          labels=d["labels"])),
  ]


def _identities(x):
  """Known values: (description, got, expected)."""
  z = x["logits"][0]
  zs = (z - z.mean(0)) / z.std(0)
  diag = jnp.diagonal(losses.cross_correlation_matrix(logits=zs, target_logits=zs,
                                                      unbiased_std=False, eps=0.0))
  return [
      ("FCCM diagonal of identical inputs", float(jnp.max(jnp.abs(diag - 1.0))), 0.0),
      ("MMD^2 of a sample with itself", float(losses.multi_kernel_mmd_squared(x=z, y=z)), 0.0),
      ("KD of a model with itself", float(losses.knowledge_distillation_loss(
          student_logits=z, teacher_logits=z)), 0.0),
      ("entropy of uniform logits = ln C", float(losses.mean_prediction_entropy(
          logits=jnp.zeros((2, CLASSES)))), math.log(CLASSES)),
  ]


def main() -> int:
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {NUM_CLIENTS} clients, "
        f"batch {BATCH}, {CLASSES} classes")
  x = _inputs(jax.random.key(0))
  failures = 0
  print(f"{'loss':28s} {'per-client values':40s} {'us/call':>8s}")
  for name, fn in _checks(x):
    batched = jax.jit(jax.vmap(fn))
    values = np.asarray(batched(x))
    start = time.perf_counter()
    for _ in range(20):
      batched(x).block_until_ready()
    micros = (time.perf_counter() - start) / 20 * 1e6
    ok = values.shape == (NUM_CLIENTS,) and np.all(np.isfinite(values))
    failures += not ok
    shown = " ".join(f"{v:8.4f}" for v in values)
    print(f"{name:28s} {shown:40s} {micros:8.0f} {'' if ok else 'FAILED'}")
  print()
  for name, got, want in _identities(x):
    ok = abs(got - want) <= 1e-4 * max(1.0, abs(want))
    failures += not ok
    print(f"{name:40s} got {got:.6f} expected {want:.6f} {'ok' if ok else 'FAILED'}")
  print("\nself-check", "passed" if not failures else f"FAILED ({failures})")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())

"""Losses of the data-free heterogeneous-model methods of HtFLlib (FedProto, FD, FedTGP,
FedGH, FedKD).

Every loss is written as the authors' code computes it (TsingZ0/HtFLlib
system/flcore/clients/*.py, servers/*.py; FedTGP's own repository has the same client and
server), with the paper's equation named; each docstring lists where the code and the paper
differ and which one is followed.

Per-class statistics (prototypes, mean logits) are sums over the rows of a batch by label,
`class_sums`, a `jax.ops.segment_sum`: no loop over examples and no host round trip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (MATMUL_PRECISION, check_labels, check_rank,
                                     check_same_shape, loss_function, masked_mean)

#: The squared distances of `tgp_margin_contrastive_loss` are floored here before the square
#: root: finite values and gradients where a prototype meets its class's global prototype.
DISTANCE_FLOOR = 1e-12


def _weights(mask: jax.Array | None, batch: int, dtype) -> jax.Array:
  return jnp.ones((batch,), dtype) if mask is None else jnp.asarray(mask).astype(dtype)


def class_sums(*, values: jax.Array, labels: jax.Array, num_classes: int,
               mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(per-class sums (C, D), per-class counts (C,)) of the rows of `values` by label.

  Args:
    values: (B, D) rows (features or logits), treated as constants.
    labels: (B,) integer labels in [0, C).
    num_classes: C.
    mask: optional (B,) validity mask; padded rows add nothing.
  """
  check_rank("class_sums", "values", values, 2, "(batch, dim)")
  check_labels("class_sums", labels, values.shape[0])
  w = _weights(mask, values.shape[0], values.dtype)
  values = jax.lax.stop_gradient(values)
  sums = jax.ops.segment_sum(values * w[:, None], labels, num_segments=num_classes)
  counts = jax.ops.segment_sum(w, labels, num_segments=num_classes)
  return sums, counts


def class_means(sums: jax.Array, counts: jax.Array) -> jax.Array:
  """sums / counts per class, 0 for a class without rows (its count is 0)."""
  return sums / jnp.where(counts > 0, counts, 1.0)[..., None]


@loss_function()
def prototype_regularizer(*, features: jax.Array, labels: jax.Array, prototypes: jax.Array,
                          present: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """FedProto's regulariser (FedProto Eq. 6-8's R term; FedTGP Eq. 4's second term).

  mean over the valid rows b and the D feature entries of (h_b - P_{y_b})², where a row whose
  class has no global prototype (`present` False) contributes 0 but still counts in the
  mean: HtFLlib's `MSELoss()(proto_new, rep)` with proto_new the prototype of the row's class
  where one exists and the row's own detached feature elsewhere. The paper writes
  λ Σ_j ||C_j - C̄_j||² over the client's class prototypes; the code (followed) puts the
  squared distance on every example's feature, averaged over B x D.

  Args:
    features: (B, D) the client's features h.
    labels: (B,) integer labels.
    prototypes: (C, D) global prototypes, constants.
    present: (C,) bool, the classes that have a global prototype.
    mask: optional (B,) validity mask.

  Returns:
    Scalar mean squared distance (0 when no class has a prototype).
  """
  fn = "prototype_regularizer"
  check_rank(fn, "features", features, 2, "(batch, dim)")
  check_rank(fn, "prototypes", prototypes, 2, "(num_classes, dim)")
  check_labels(fn, labels, features.shape[0])
  targets = jax.lax.stop_gradient(prototypes)[labels]
  rows = jnp.mean(jnp.square(features - targets), axis=-1) * present[labels].astype(
      features.dtype)
  return masked_mean(fn, rows, mask)


@loss_function()
def soft_target_cross_entropy(*, logits: jax.Array, targets: jax.Array,
                              mask: jax.Array | None = None) -> jax.Array:
  """-mean_b Σ_c t_bc log softmax(z_b)_c with the targets t taken as given (constants).

  torch's `CrossEntropyLoss()(z, t)` with a float target, which HtFLlib's FD applies with
  t = raw mean logits (not probabilities): a target row need not sum to 1 and may be
  negative.
  """
  fn = "soft_target_cross_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "targets"), (logits, targets))
  rows = -jnp.sum(jax.lax.stop_gradient(targets) * jax.nn.log_softmax(logits, axis=-1), axis=-1)
  return masked_mean(fn, rows, mask)


@loss_function(static_argnames=("target",))
def logit_distillation_loss(*, logits: jax.Array, labels: jax.Array, class_logits: jax.Array,
                            present: jax.Array, mask: jax.Array | None = None,
                            target: str = "logits") -> jax.Array:
  """FD's distillation term (Jeong et al. 2018, Sec. 2's global average logit vectors).

  Every row b takes as target the global mean logit vector of its class, t_b =
  class_logits[y_b], where the class has one (`present`), else its own detached logits z_b
  (HtFLlib's `logit_new`), and the term is the soft-target cross-entropy of z_b against t_b.

  Args:
    logits: (B, C) the client's logits z.
    labels: (B,) integer labels.
    class_logits: (C, C) global mean logits per class, constants.
    present: (C,) bool, the classes with a global mean.
    mask: optional (B,) validity mask.
    target: "logits": t as it is (HtFLlib's `CrossEntropyLoss()(output, logit_new)`, a
      float target of raw logits); "softmax": softmax(t), a distribution (the
      distillation the FD paper describes; its regulariser compares the softmax outputs).

  Returns:
    Scalar mean over the valid rows.
  """
  fn = "logit_distillation_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  if target not in ("logits", "softmax"):
    raise ValueError(f"{fn}: `target` must be one of ('logits', 'softmax'), got {target!r}.")
  mine = present[labels][:, None]
  t = jnp.where(mine, jax.lax.stop_gradient(class_logits)[labels],
                jax.lax.stop_gradient(logits))
  if target == "softmax":
    t = jax.nn.softmax(t, axis=-1)
  return soft_target_cross_entropy.raw(logits=logits, targets=t, mask=mask)


def squared_distances(a: jax.Array, b: jax.Array) -> jax.Array:
  """(N, M) |a_n|² - 2 a_n · b_m + |b_m|² (FedTGP's server code's expansion)."""
  return (jnp.sum(jnp.square(a), axis=-1, keepdims=True)
          - 2.0 * jnp.matmul(a, b.T, precision=MATMUL_PRECISION)
          + jnp.sum(jnp.square(b), axis=-1)[None, :])


@loss_function(nonnegative=("margin",))
def tgp_margin_contrastive_loss(*, prototypes: jax.Array, labels: jax.Array,
                                global_prototypes: jax.Array, margin: jax.Array,
                                mask: jax.Array | None = None) -> jax.Array:
  """FedTGP's adaptive-margin-enhanced contrastive loss (FedTGP Eq. 6-7, the server's).

  For uploaded client prototypes p_b of class y_b and the trainable global prototypes
  P̂_c = F(c): d_bc = ||p_b - P̂_c||_2, then
      L = -mean_b log softmax(-(d_b + δ e_{y_b}))_{y_b},
  i.e. the distance to the own class enlarged by the margin δ (Eq. 7: exp(-(φ(C_i, P̂_i) +
  δ)) over the same plus Σ_{j≠i} exp(-φ(C_i, P̂_j))). HtFLlib's `update_TGP`: distances from
  the expanded squares, `CEloss(-dist, y)`.

  Deviation: the squared distance is floored at DISTANCE_FLOOR (1e-12) before the square
  root, so the loss and its gradient stay finite when a prototype coincides with its class's
  global prototype (torch's sqrt gives NaN for a rounding-negative square and an infinite
  gradient at 0). The values differ from the code's by at most 1e-6 per distance.

  Args:
    prototypes: (B, D) uploaded client prototypes (constants).
    labels: (B,) their classes.
    global_prototypes: (C, D) the trainable global prototypes (differentiated).
    margin: scalar δ >= 0 (FedTGP: min(max class gap, threshold)).
    mask: optional (B,) validity mask.
  """
  fn = "tgp_margin_contrastive_loss"
  check_rank(fn, "prototypes", prototypes, 2, "(batch, dim)")
  check_rank(fn, "global_prototypes", global_prototypes, 2, "(num_classes, dim)")
  check_labels(fn, labels, prototypes.shape[0])
  d2 = squared_distances(jax.lax.stop_gradient(prototypes), global_prototypes)
  dist = jnp.sqrt(jnp.maximum(d2, DISTANCE_FLOOR))
  one_hot = jax.nn.one_hot(labels, global_prototypes.shape[0], dtype=dist.dtype)
  scores = -(dist + margin * one_hot)
  log_probs = jax.nn.log_softmax(scores, axis=-1)
  rows = -jnp.sum(one_hot * log_probs, axis=-1)
  return masked_mean(fn, rows, mask)


def nearest_prototype_scores(features: jax.Array, prototypes: jax.Array,
                             present: jax.Array) -> jax.Array:
  """(B, C) scores -mean_d (h_b - P_c)² of FedProto's / FedTGP's inference, -inf where a
  class has no prototype: the arg max is HtFLlib's arg min of `MSELoss()(rep, proto)`."""
  d2 = jnp.mean(jnp.square(features[:, None, :] - prototypes[None, :, :]), axis=-1)
  return jnp.where(present[None, :], -d2, -jnp.inf)


@loss_function()
def fedkd_losses(*, logits: jax.Array, mentee_logits: jax.Array, features: jax.Array,
                 mapped_mentee_features: jax.Array, labels: jax.Array,
                 mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """FedKD's two objectives (Wu et al., Nat. Commun. 2022, Eq. 1-6), as HtFLlib computes them.

  With CE, CE_g the mentor's (private model's) and mentee's cross-entropies, p, p_g their
  softmax outputs, h the mentor's features and W h_g the mentee's features mapped by the
  client's W_h:
      L_d   = KL(p_g || p) / (CE + CE_g),    L_d_g = KL(p || p_g) / (CE + CE_g)
      L_h   = MSE(h, W h_g) / (CE + CE_g)   (Eq. 3-4: the adaptive hidden loss)
      loss  = CE + L_d + L_h,               loss_g = CE_g + L_d_g + L_h
  KL(t || p) is torch's `nn.KLDivLoss()(log p, t)` (reduction "mean": the mean over all
  B x C entries of t (log t - log p)) and MSE the mean over B x D. Nothing is detached: HtFLlib back-propagates loss and loss_g into every
  parameter before the three SGD steps, so each of the mentor, the mentee and W descends
  loss + loss_g (the sum is what a trainer differentiates). The paper's temperature-free
  adaptive weighting by 1 / (CE + CE_g) is the code's.

  Args:
    logits: (B, C) mentor logits; mentee_logits: (B, C).
    features: (B, D) mentor features; mapped_mentee_features: (B, D) W_h(mentee features).
    labels: (B,) integer labels.
    mask: optional (B,) validity mask (padded rows leave every term unchanged).

  Returns:
    (loss, loss_g).
  """
  fn = "fedkd_losses"
  check_same_shape(fn, ("logits", "mentee_logits"), (logits, mentee_logits))
  check_same_shape(fn, ("features", "mapped_mentee_features"),
                   (features, mapped_mentee_features))
  check_labels(fn, labels, logits.shape[0])
  w = _weights(mask, logits.shape[0], logits.dtype)
  total = jnp.sum(w)
  count = jnp.where(total > 0, total, 1.0)

  def ce(z):
    rows = -jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), labels[:, None], axis=-1)[:, 0]
    return jnp.sum(w * rows) / count

  def kl(log_p, log_t):  # KLDivLoss mean over the valid rows' B x C entries
    entries = jnp.exp(log_t) * (log_t - log_p)
    return jnp.sum(w[:, None] * entries) / (count * logits.shape[1])

  log_p, log_pg = jax.nn.log_softmax(logits, axis=-1), jax.nn.log_softmax(mentee_logits, axis=-1)
  ce_m, ce_g = ce(logits), ce(mentee_logits)
  norm = ce_m + ce_g
  mse = jnp.sum(w[:, None] * jnp.square(features - mapped_mentee_features)) / (
      count * features.shape[1])
  loss = ce_m + kl(log_p, log_pg) / norm + mse / norm
  loss_g = ce_g + kl(log_pg, log_p) / norm + mse / norm
  return loss, loss_g

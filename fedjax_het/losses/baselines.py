"""Losses of the baselines in the FCCL+ benchmark (FCCL+ Sec. 4, Tables VIII-XIII).

  * `proximal_term`: FedProx (Li et al., MLSys 2020), (mu/2)|w - w_global|^2.
  * `model_contrastive_loss`: MOON (Li et al., CVPR 2021), Eq. 3 of MOON.
  * `restricted_softmax_logits`: FedRS (Li & Zhan, KDD 2021).
  * `prototype_contrastive_loss`, `prototype_contrastive_objective`: FedProc
    (Mu et al., 2021), InfoNCE against global class prototypes.
  * `symmetric_cross_entropy`: RHFL (Fang & Ye, CVPR 2022) local loss (SCE of
    Wang et al., ICCV 2019).
  * `consensus_l1_loss`: FedMD (Li & Wang, 2019) digest phase.
  * `ensemble_distillation_loss`: FedDF (Lin et al., NeurIPS 2020).

Defaults follow the authors' code and the FCCL+ benchmark code.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (MATMUL_PRECISION, check_labels, check_rank,
                                     check_same_shape, check_same_structure,
                                     kl_divergence_rows, l2_normalize, loss_function,
                                     masked_mean)
from fedjax_het.losses.common import _softmax_cross_entropy_rows

#: Norm floor of the cosine similarities (as torch's CosineSimilarity eps^2).
COSINE_EPS = 1e-16


@loss_function(nonnegative=("mu",))
def proximal_term(*, params: Any, global_params: Any, mu: float = 0.01) -> jax.Array:
  """FedProx proximal term (mu / 2) * |w - w_global|^2 over all parameters.

  Args:
    params: pytree of the local model's parameters.
    global_params: pytree of the same structure (the round's global model);
      constant.
    mu: proximal weight (benchmark default 0.01).

  Returns:
    Scalar term to add to the local loss.
  """
  check_same_structure("proximal_term", ("params", "global_params"), (params, global_params))
  anchor = jax.lax.stop_gradient(global_params)
  squares = jax.tree_util.tree_map(lambda w, g: jnp.sum(jnp.square(w - g)), params, anchor)
  return 0.5 * mu * sum(jax.tree_util.tree_leaves(squares), jnp.zeros((), jnp.float32))


@loss_function(positive=("temperature",))
def model_contrastive_loss(*, features: jax.Array, global_features: jax.Array,
                           previous_features: jax.Array,
                           temperature: float = 0.5,
                           mask: jax.Array | None = None) -> jax.Array:
  """MOON model-contrastive loss (MOON Eq. 3).

  l_b = -log( exp(cos(z_b, z_glob_b)/tau) /
              (exp(cos(z_b, z_glob_b)/tau) + sum_p exp(cos(z_b, z_prev_pb)/tau)) ),
  averaged over the batch: the global model's representation is the positive,
  the previous local model(s)' the negative(s). Weight mu (1 in the benchmark)
  is applied by the caller.

  Args:
    features: (B, d) representation of the model being trained.
    global_features: (B, d) of the global model; constant.
    previous_features: (B, d) of the previous local model, or (P, B, d) for P
      previous models; constant.
    temperature: tau (benchmark 0.5).
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "model_contrastive_loss"
  check_rank(fn, "features", features, 2, "(batch, dim)")
  check_same_shape(fn, ("features", "global_features"), (features, global_features))
  if previous_features.ndim == 2:
    previous_features = previous_features[None]
  if previous_features.ndim != 3 or previous_features.shape[1:] != features.shape:
    raise ValueError(f"{fn}: `previous_features` must have shape (B, d) or (P, B, d) with "
                     f"(B, d) = {features.shape}, got {previous_features.shape}.")
  z = l2_normalize(features, COSINE_EPS)
  positive = jnp.sum(z * l2_normalize(jax.lax.stop_gradient(global_features), COSINE_EPS), -1)
  negatives = jnp.sum(z[None] * l2_normalize(jax.lax.stop_gradient(previous_features),
                                             COSINE_EPS), -1)
  logits = jnp.concatenate([positive[:, None], negatives.T], axis=-1) / temperature
  return masked_mean(fn, -jax.nn.log_softmax(logits, axis=-1)[:, 0], mask)


@loss_function(unit_interval=("alpha",))
def restricted_softmax_logits(*, logits: jax.Array, class_mask: jax.Array,
                              alpha: float = 0.5) -> jax.Array:
  """FedRS restricted softmax: scale the logits of locally absent classes.

  FedRS multiplies the classifier weights of classes the client does not hold
  by alpha, which for the logits z = W h is z_c -> alpha * z_c. Feed the
  result to `softmax_cross_entropy`.

  Args:
    logits: (B, C).
    class_mask: (C,) boolean, True for classes present in the client's data.
    alpha: scaling of absent classes (benchmark 0.5; 1 recovers plain logits).

  Returns:
    (B, C) restricted logits.
  """
  fn = "restricted_softmax_logits"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  if jnp.shape(class_mask) != (logits.shape[-1],):
    raise ValueError(f"{fn}: `class_mask` must have shape ({logits.shape[-1]},), got "
                     f"{jnp.shape(class_mask)}.")
  return jnp.where(jnp.asarray(class_mask, bool)[None, :], logits, alpha * logits)


def _prototype_infonce(fn, features, labels, prototypes, prototype_mask, temperature, mask):
  check_rank(fn, "features", features, 2, "(batch, dim)")
  check_labels(fn, labels, features.shape[0])
  check_rank(fn, "prototypes", prototypes, 2, "(num_classes, dim)")
  if prototypes.shape[-1] != features.shape[-1]:
    raise ValueError(f"{fn}: `prototypes` must have feature dim {features.shape[-1]}, got "
                     f"{prototypes.shape}.")
  if jnp.shape(prototype_mask) != (prototypes.shape[0],):
    raise ValueError(f"{fn}: `prototype_mask` must have shape ({prototypes.shape[0]},), got "
                     f"{jnp.shape(prototype_mask)}.")
  sample_mask, mask = mask, jnp.asarray(prototype_mask, bool)
  cosine = jnp.matmul(l2_normalize(features, COSINE_EPS),
                      l2_normalize(jax.lax.stop_gradient(prototypes), COSINE_EPS).T,
                      precision=MATMUL_PRECISION) / temperature
  # With no valid prototype at all every sample is skipped below; normalising
  # over all classes then only keeps the discarded branch finite.
  valid = mask | ~jnp.any(mask)
  log_normaliser = jax.nn.logsumexp(jnp.where(valid[None, :], cosine, -jnp.inf), axis=-1)
  log_prob = jnp.take_along_axis(cosine, labels[:, None], axis=-1)[:, 0] - log_normaliser
  has_prototype = mask[labels]
  return masked_mean(fn, -jnp.where(has_prototype, log_prob, 0.0), sample_mask)


@loss_function(positive=("temperature",))
def prototype_contrastive_loss(*, features: jax.Array, labels: jax.Array,
                               prototypes: jax.Array, prototype_mask: jax.Array,
                               temperature: float = 1.0,
                               mask: jax.Array | None = None) -> jax.Array:
  """FedProc prototype InfoNCE.

  For each sample whose class has a global prototype:
  -log( exp(cos(h_b, P_{y_b})/tau) / sum_{c valid} exp(cos(h_b, P_c)/tau) );
  samples without one contribute 0, and the sum is divided by the full batch
  size (as the benchmark code does). The code uses plain cosines, tau = 1.

  Args:
    features: (B, d) pooled features.
    labels: (B,) integer labels.
    prototypes: (C, d) global class prototypes (mean features); constant.
    prototype_mask: (C,) boolean, True where class c has a prototype.
    temperature: tau (code: 1).
    mask: optional (B,) validity mask of the batch rows (padding gets 0); the
      sum is divided by the number of valid rows.

  Returns:
    Scalar loss.
  """
  return _prototype_infonce("prototype_contrastive_loss", features, labels, prototypes,
                            prototype_mask, temperature, mask)


@loss_function(unit_interval=("alpha",), positive=("temperature",))
def prototype_contrastive_objective(*, logits: jax.Array, features: jax.Array,
                                    labels: jax.Array, prototypes: jax.Array,
                                    prototype_mask: jax.Array, alpha: float | jax.Array,
                                    temperature: float = 1.0,
                                    mask: jax.Array | None = None) -> jax.Array:
  """FedProc local objective alpha * InfoNCE + (1 - alpha) * CE.

  The benchmark anneals alpha = 1 - r / (E - 1) over rounds r = 0..E-1; pass
  it in (it may be traced).

  Args:
    logits: (B, C) classifier outputs.
    features, labels, prototypes, prototype_mask, temperature, mask: see
      `prototype_contrastive_loss`.
    alpha: weight of the InfoNCE term in [0, 1].

  Returns:
    Scalar loss.
  """
  fn = "prototype_contrastive_objective"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  infonce = _prototype_infonce(fn, features, labels, prototypes, prototype_mask, temperature,
                               mask)
  ce = masked_mean(fn, _softmax_cross_entropy_rows(logits, labels), mask)
  return alpha * infonce + (1.0 - alpha) * ce


@loss_function(nonnegative=("alpha", "beta"))
def symmetric_cross_entropy(*, logits: jax.Array, labels: jax.Array,
                            alpha: float = 0.1, beta: float = 1.0,
                            mask: jax.Array | None = None) -> jax.Array:
  """Symmetric cross-entropy, RHFL's local loss (SCE, Wang et al. 2019).

  alpha * CE + beta * RCE, with the reverse CE
  RCE_b = -sum_c clip(p_bc, 1e-7, 1) * log clip(onehot_bc, 1e-4, 1),
  exactly as in the RHFL code (the clips make log 0 finite: RCE is
  -log(1e-4) times the clipped probability mass off the label).

  Args:
    logits: (B, C).
    labels: (B,) integer labels.
    alpha: CE weight (RHFL 0.1).
    beta: RCE weight (RHFL 1.0).
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "symmetric_cross_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  ce = _softmax_cross_entropy_rows(logits, labels)
  probs = jnp.clip(jax.nn.softmax(logits, axis=-1), 1e-7, 1.0)
  onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  rce = -jnp.sum(probs * jnp.log(jnp.clip(onehot, 1e-4, 1.0)), axis=-1)
  return masked_mean(fn, alpha * ce + beta * rce, mask)


@loss_function()
def consensus_l1_loss(*, logits: jax.Array, consensus_logits: jax.Array,
                      mask: jax.Array | None = None) -> jax.Array:
  """FedMD digest loss: mean absolute difference to the consensus logits.

  The consensus is the mean of all participants' logits on the public batch
  (`torch.nn.L1Loss`, mean over batch and classes).

  Args:
    logits: (B, C) of the participant.
    consensus_logits: (B, C) mean logits; constant.
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "consensus_l1_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "consensus_logits"), (logits, consensus_logits))
  rows = jnp.mean(jnp.abs(logits - jax.lax.stop_gradient(consensus_logits)), axis=-1)
  return masked_mean(fn, rows, mask)


@loss_function(positive=("temperature",))
def ensemble_distillation_loss(*, student_logits: jax.Array, client_logits: jax.Array,
                               temperature: float = 1.0,
                               mask: jax.Array | None = None) -> jax.Array:
  """FedDF ensemble distillation on public data.

  The teacher is the mean of the K clients' logits; the loss is
  KL(softmax(teacher / tau) || softmax(student / tau)), batch mean.

  Args:
    student_logits: (B, C) of the model being distilled.
    client_logits: (K, B, C) logits of the ensemble members; constant.
    temperature: tau.
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "ensemble_distillation_loss"
  check_rank(fn, "student_logits", student_logits, 2, "(batch, num_classes)")
  check_rank(fn, "client_logits", client_logits, 3, "(num_clients, batch, num_classes)")
  if client_logits.shape[1:] != student_logits.shape:
    raise ValueError(f"{fn}: `client_logits` must have shape (K, {student_logits.shape[0]}, "
                     f"{student_logits.shape[1]}), got {client_logits.shape}.")
  teacher = jnp.mean(jax.lax.stop_gradient(client_logits), axis=0)
  return masked_mean(fn, kl_divergence_rows(teacher / temperature, student_logits / temperature),
                     mask)

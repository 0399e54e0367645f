"""FCCL (CVPR 2022) and FCCL+ (TPAMI) losses.

Collaborative phase (unlabeled public batch, all participants):
  * `cross_correlation_matrix` / `cross_correlation_loss`: FCCM, FCCL+ Eq. 1-2
    (FCCL Eq. 1-2).
  * `instance_similarity_matrix` / `instance_similarity_loss`: FISL, FCCL+
    Eq. 3-5. The collaborative objective is FCCM + omega * FISL (Eq. 6).

Local phase (private data):
  * `knowledge_distillation_loss`: temperature KD, FCCL+ Eq. 7-8.
  * `non_target_distillation_loss`: FNTD, FCCL+ Eq. 13 (local objective
    CE + FNTD, Eq. 14).
  * `dual_domain_distillation_loss`: FCCL Eq. 4-6 (local objective
    CE + lambda_Loc * dual, Eq. 7).

Every target (the participants' mean logits or similarities, the teacher's
logits) is wrapped in `stop_gradient`: the papers' code detaches them, and it
is what makes the simultaneous (vmapped) update of all participants equal to
the sequential loop.

References:
  [FCCL] W. Huang, M. Ye, B. Du. Learn from Others and Be Yourself in
    Heterogeneous Federated Learning. CVPR 2022.
  [FCCL+] W. Huang, M. Ye, Z. Shi, B. Du. Generalizable Heterogeneous
    Federated Cross-Correlation and Instance Similarity Learning. TPAMI.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (MATMUL_PRECISION, check_labels, check_min_batch,
                                     check_rank, check_same_shape, kl_divergence_rows,
                                     l2_normalize, loss_function, masked_mean)

#: lambda of FCCL+ Eq. 2 (weight of the off-diagonal term), as in the code.
FCCM_OFF_DIAGONAL_WEIGHT = 0.0051
#: mu of FCCL+ Eq. 3: the text says 0.02, Table VII 0.002, the code 0.02.
FISL_TEMPERATURE = 0.02
#: Added to the batch variance before the square root in FCCM's standardisation.
FCCM_EPS = 1e-6
#: Added to the squared feature norm before the square root in FISL.
FISL_EPS = 1e-12


def _standardize_columns(x: jax.Array, *, eps: float, unbiased_std: bool) -> jax.Array:
  """Per-column (over the batch) mean subtraction and division by the std."""
  batch = x.shape[0]
  centred = x - jnp.mean(x, axis=0, keepdims=True)
  ddof = 1 if unbiased_std else 0
  variance = jnp.sum(jnp.square(centred), axis=0, keepdims=True) / (batch - ddof)
  return centred * jax.lax.rsqrt(variance + eps)


def _cross_correlation(fn: str, logits, target_logits, *, eps, unbiased_std):
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "target_logits"), (logits, target_logits))
  check_min_batch(fn, "logits", logits, 2,
                  "the cross-correlation standardises each column over the batch")
  z = _standardize_columns(logits, eps=eps, unbiased_std=unbiased_std)
  t = _standardize_columns(target_logits, eps=eps, unbiased_std=unbiased_std)
  return jnp.matmul(z.T, t, precision=MATMUL_PRECISION) / logits.shape[0]


@loss_function(static_argnames=("unbiased_std",), nonnegative=("eps",))
def cross_correlation_matrix(*, logits: jax.Array, target_logits: jax.Array,
                             eps: float = FCCM_EPS,
                             unbiased_std: bool = True) -> jax.Array:
  """Cross-correlation matrix of two sets of logits, FCCL+ Eq. 1.

  Each logit column is standardised over the batch (mean subtracted, divided by
  sqrt(var + eps)) and M = Z_hat^T Zbar_hat / B.

  With `unbiased_std=False, eps=0` this is exactly Eq. 1 (the Pearson
  correlation of column u of `logits` with column v of `target_logits`, in
  [-1, 1]). The default follows the authors' code (`torch.std`, unbiased, then
  division by B), which equals (B-1)/B times Eq. 1; `eps` is this library's
  addition so that a constant column gives a finite value and gradient.

  Args:
    logits: (B, C) logits Z_i of one participant on the public batch.
    target_logits: (B, C) target Z_bar (mean over participants).
    eps: added to the per-column variance before the square root.
    unbiased_std: divide the variance by B-1 (code) instead of B (Eq. 1).

  Returns:
    (C, C) matrix M with M[u, v] correlating logits column u with target
    column v.

  Raises:
    ValueError: on a rank or shape mismatch, or a batch of fewer than 2.
  """
  return _cross_correlation("cross_correlation_matrix", logits, target_logits,
                            eps=eps, unbiased_std=unbiased_std)


@loss_function(static_argnames=("unbiased_std",),
               nonnegative=("off_diagonal_weight", "eps"))
def cross_correlation_loss(*, logits: jax.Array, target_logits: jax.Array,
                           off_diagonal_weight: float = FCCM_OFF_DIAGONAL_WEIGHT,
                           eps: float = FCCM_EPS,
                           unbiased_std: bool = True) -> jax.Array:
  """FCCM loss, FCCL+ Eq. 2 (FCCL Eq. 2).

  L = sum_u (1 - M_uu)^2 + lambda * sum_{u != v} (1 + M_uv)^2, with M from
  `cross_correlation_matrix`. Off-diagonal entries are pushed to -1 (target
  2*I - 1), not to 0 as in Barlow Twins, as in the paper and code.

  Args:
    logits: (B, C) logits of the participant being trained.
    target_logits: (B, C) mean logits of all participants (FCCL+) or of the
      others plus the participant's previous-round model (FCCL); treated as a
      constant (stop_gradient).
    off_diagonal_weight: lambda of Eq. 2 (default 0.0051).
    eps, unbiased_std: see `cross_correlation_matrix`.

  Returns:
    Scalar loss.
  """
  m = _cross_correlation("cross_correlation_loss", logits,
                         jax.lax.stop_gradient(target_logits),
                         eps=eps, unbiased_std=unbiased_std)
  eye = jnp.eye(m.shape[0], dtype=m.dtype)
  on_diagonal = jnp.sum(jnp.square(1.0 - jnp.diagonal(m)))
  off_diagonal = jnp.sum((1.0 - eye) * jnp.square(1.0 + m))
  return on_diagonal + off_diagonal_weight * off_diagonal


def _drop_diagonal(square: jax.Array) -> jax.Array:
  """(B, B) -> (B, B-1): row b keeps the entries c != b in increasing c."""
  b = square.shape[0]
  return square.reshape(-1)[1:].reshape(b - 1, b + 1)[:, :-1].reshape(b, b - 1)


@loss_function(positive=("temperature",), nonnegative=("eps",))
def instance_similarity_matrix(*, features: jax.Array,
                               temperature: float = FISL_TEMPERATURE,
                               eps: float = FISL_EPS) -> jax.Array:
  """Instance-similarity logits with the diagonal removed, FCCL+ Eq. 3-4.

  H is L2-normalised per example (x / sqrt(|x|^2 + eps), finite at x = 0),
  S = H H^T / mu, and the self-similarity on the diagonal is dropped, giving a
  B x (B-1) matrix whose row b lists the similarities to every other example
  in order. These are logits: FISL applies the softmax (Eq. 5).

  Args:
    features: (B, d) pooled features before the classifier.
    temperature: mu of Eq. 3 (default 0.02, the code's value; Table VII says
      0.002).
    eps: added to the squared norm before the square root.

  Returns:
    (B, B-1) similarity logits.
  """
  fn = "instance_similarity_matrix"
  check_rank(fn, "features", features, 2, "(batch, feature_dim)")
  check_min_batch(fn, "features", features, 2,
                  "the similarity to the other examples is undefined for one")
  h = l2_normalize(features, eps)
  similarity = jnp.matmul(h, h.T, precision=MATMUL_PRECISION) / temperature
  return _drop_diagonal(similarity)


@loss_function()
def instance_similarity_loss(*, similarity: jax.Array,
                             target_similarity: jax.Array) -> jax.Array:
  """FISL loss, FCCL+ Eq. 5.

  Row-wise KL(softmax(S_bar) || softmax(S_i)), averaged over the batch
  (`F.kl_div(..., reduction='batchmean')` in the code).

  Args:
    similarity: (B, B-1) similarity logits S_i of the participant.
    target_similarity: (B, B-1) S_bar, the mean of all participants'
      similarity logits (before the softmax); treated as a constant.

  Returns:
    Scalar loss.
  """
  fn = "instance_similarity_loss"
  check_rank(fn, "similarity", similarity, 2, "(batch, batch - 1)")
  check_same_shape(fn, ("similarity", "target_similarity"),
                   (similarity, target_similarity))
  return jnp.mean(kl_divergence_rows(jax.lax.stop_gradient(target_similarity), similarity))


@loss_function(positive=("temperature",))
def knowledge_distillation_loss(*, student_logits: jax.Array, teacher_logits: jax.Array,
                                temperature: float = 1.0,
                                mask: jax.Array | None = None) -> jax.Array:
  """Temperature knowledge distillation, FCCL+ Eq. 7-8.

  KL(softmax(z_T / tau) || softmax(z_S / tau)), averaged over the batch. The
  tau^2 factor of FCCL+ Eq. 10 is NOT included: multiply by it where the
  objective asks for it.

  Args:
    student_logits: (B, C).
    teacher_logits: (B, C); treated as a constant.
    temperature: tau.
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "knowledge_distillation_loss"
  check_rank(fn, "student_logits", student_logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("student_logits", "teacher_logits"), (student_logits, teacher_logits))
  teacher = jax.lax.stop_gradient(teacher_logits)
  return masked_mean(fn, kl_divergence_rows(teacher / temperature, student_logits / temperature),
                     mask)


def _non_target_log_probs(scaled_logits, non_target, renormalize):
  """Log-probabilities of the non-target classes (target column zeroed)."""
  if renormalize:
    masked = jnp.where(non_target, scaled_logits, -jnp.inf)
    log_probs = scaled_logits - jax.nn.logsumexp(masked, axis=-1, keepdims=True)
  else:
    log_probs = jax.nn.log_softmax(scaled_logits, axis=-1)
  # Zero the target column so nothing downstream exponentiates a value that
  # `jnp.where` would discard anyway (keeps gradients finite).
  return jnp.where(non_target, log_probs, 0.0)


@loss_function(static_argnames=("renormalize",), positive=("temperature",))
def non_target_distillation_loss(*, student_logits: jax.Array, teacher_logits: jax.Array,
                                 labels: jax.Array, temperature: float = 1.0,
                                 renormalize: bool = False,
                                 mask: jax.Array | None = None) -> jax.Array:
  """Federated Non-Target Distillation (FNTD), FCCL+ Eq. 13.

  L = tau^2 * mean_b sum_{u != t_b} p_T^u log(p_T^u / p_S^u), with
  p = softmax(z / tau) over ALL C classes and the target column t_b dropped
  afterwards. As in the authors' code the remaining C-1 probabilities are NOT
  renormalised and the result is scaled by tau^2.
  `renormalize=True` instead drops the target logit before the softmax (the
  FedNTD form), a documented alternative.

  Gradient on the target logit: FCCL+ Eq. 12 states that FNTD contributes 0
  there. That holds for `renormalize=True` only. In the written form (Eq. 13,
  and the authors' code) the target logit still enters every p_S^u through the
  softmax's normaliser, and dL/dz_S^t = tau (1 - p_T^t) p_S^t >= 0 per example
  (before the batch mean): the term pushes the target logit DOWN, against the
  cross-entropy, by up to tau. A model whose teacher (last round's model) is
  still near chance therefore learns its labels more slowly than with CE alone.

  Args:
    student_logits: (B, C) logits of the model being trained.
    teacher_logits: (B, C) logits of the previous round's end-of-local model
      theta^{e-1}; treated as a constant.
    labels: (B,) integer targets t_b.
    temperature: tau (3 for Digits/Office31, 1 for Office-Caltech/Home).
    renormalize: softmax over the C-1 non-target logits instead.
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "non_target_distillation_loss"
  check_rank(fn, "student_logits", student_logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("student_logits", "teacher_logits"), (student_logits, teacher_logits))
  check_labels(fn, labels, student_logits.shape[0])
  num_classes = student_logits.shape[-1]
  if num_classes < 2:
    raise ValueError(f"{fn}: needs at least 2 classes, got {num_classes}.")
  non_target = ~jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_)
  teacher = jax.lax.stop_gradient(teacher_logits) / temperature
  student = student_logits / temperature
  teacher_log_probs = _non_target_log_probs(teacher, non_target, renormalize)
  student_log_probs = _non_target_log_probs(student, non_target, renormalize)
  terms = jnp.where(non_target,
                    jnp.exp(teacher_log_probs) * (teacher_log_probs - student_log_probs), 0.0)
  return temperature**2 * masked_mean(fn, jnp.sum(terms, axis=-1), mask)


@loss_function(positive=("temperature",))
def dual_domain_distillation_loss(*, logits: jax.Array, previous_logits: jax.Array,
                                  pretrained_logits: jax.Array,
                                  temperature: float = 1.0,
                                  mask: jax.Array | None = None) -> jax.Array:
  """FCCL dual-domain knowledge distillation, FCCL Eq. 4-6.

  L_dual = KL(sigma(Z^{t-1}) || sigma(Z)) + KL(sigma(Z*) || sigma(Z)): the
  inter-domain term (Eq. 4) distils the participant's previous-round model,
  the intra-domain term (Eq. 5) its model pretrained on private data. The
  paper uses tau = 1; both terms are batch means (no tau^2 factor).

  Args:
    logits: (B, C) logits of the model being trained on private data.
    previous_logits: (B, C) logits of theta_i^{t-1}; constant.
    pretrained_logits: (B, C) logits of theta_i^*; constant.
    temperature: softmax temperature (paper: 1).
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar L_dual (Eq. 6).
  """
  fn = "dual_domain_distillation_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_same_shape(fn, ("logits", "previous_logits", "pretrained_logits"),
                   (logits, previous_logits, pretrained_logits))
  student = logits / temperature
  inter = kl_divergence_rows(jax.lax.stop_gradient(previous_logits) / temperature, student)
  intra = kl_divergence_rows(jax.lax.stop_gradient(pretrained_logits) / temperature, student)
  return masked_mean(fn, inter + intra, mask)

"""GLFC (CVPR 2022) losses: federated class-incremental learning.

  * `class_aware_gradient_compensation_loss`: L_GC, GLFC Eq. 2-4.
  * `class_semantic_relation_distillation_loss`: L_RD, GLFC Eq. 5. The local
    objective is 0.5 * L_GC + 0.5 * L_RD (Eq. 6; first task L_GC only).
  * `mean_prediction_entropy` and `task_transition_detected`: task-transition
    detection, GLFC Eq. 7.
  * `prototype_perturbation_loss`: L_GP, GLFC Eq. 10 (perturbed prototypes).
  * `gradient_matching_loss`: L_RT, GLFC Eq. 8 (proxy-server reconstruction).
  * `infer_label_from_last_layer_gradient`: the label of a shared gradient
    from the sign of its last-layer gradient (iDLG, used by GLFC Sec. 4.2).

Deviation from the paper text, following the authors' code: the classifier uses sigmoid outputs with binary
cross-entropy over all classes seen so far, rather than a softmax CE, and
L_RD is the BCE against the smoothed target rather than a KL divergence.

Reference:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (check_labels, check_rank, check_same_shape,
                                     check_same_structure, loss_function, masked_mean,
                                     sigmoid_binary_cross_entropy_elementwise)
from fedjax_het.losses.common import _softmax_cross_entropy_rows

#: r_h of GLFC Sec. 4.1: the entropy rise that signals a new task.
TASK_TRANSITION_THRESHOLD = 1.2
#: gamma of GLFC Eq. 10: scale of the Gaussian feature noise.
PROTOTYPE_NOISE_SCALE = 0.1


def _class_mask(fn: str, class_mask: jax.Array, logits: jax.Array) -> jax.Array:
  """A (C,) class mask as a (1, C) boolean row (checked against `logits`)."""
  class_mask = jnp.asarray(class_mask)
  if class_mask.shape != (logits.shape[-1],):
    raise ValueError(f"{fn}: `class_mask` must have shape (num_classes,) = "
                     f"({logits.shape[-1]},), got {class_mask.shape}.")
  return class_mask.astype(bool)[None, :]


def _mean_over_classes(fn: str, weights: Any, logits: jax.Array, targets: jax.Array,
                       class_mask: jax.Array | None) -> jax.Array:
  """Per row: mean over the (seen) classes of weights * BCE(logits, targets)."""
  if class_mask is None:
    return jnp.mean(weights * sigmoid_binary_cross_entropy_elementwise(logits, targets), axis=-1)
  seen = _class_mask(fn, class_mask, logits)
  # Unseen columns are selected away before the arithmetic: no value, no gradient.
  bce = sigmoid_binary_cross_entropy_elementwise(jnp.where(seen, logits, 0.0),
                                                 jnp.where(seen, targets, 0.0))
  total = jnp.sum(jnp.where(seen, weights * bce, 0.0), axis=-1)
  return total / jnp.maximum(jnp.sum(seen), 1).astype(total.dtype)


@loss_function(static_argnames=("compensate_first_task",), nonnegative=("eps",))
def class_aware_gradient_compensation_loss(*, logits: jax.Array, labels: jax.Array,
                                           num_old_classes: int | jax.Array,
                                           compensate_first_task: bool = False,
                                           eps: float = 0.0,
                                           class_mask: jax.Array | None = None,
                                           mask: jax.Array | None = None) -> jax.Array:
  """Class-aware gradient compensation L_GC, GLFC Eq. 2-4.

  g_b = |sigmoid(z_b)[y_b] - 1| is the gradient magnitude at the true class
  (Eq. 2). Samples whose label is an old class (y < `num_old_classes`) form
  one group, the others (new classes) another; each sample is re-weighted by
  w_b = g_b / G_group(b), the mean of g over its group in the batch (Eq. 3),
  and L_GC = mean_{b, c} w_b * BCE(z_bc, onehot_bc) (Eq. 4 with the code's
  sigmoid BCE, averaged over batch and classes like the code). Weights are
  constants (computed from detached predictions).

  float32 (deviation from the code's arithmetic, not its maths): g_b =
  1 - sigmoid(z_y) is sigmoid(-z_y), computed without the cancellation of
  the code's |sigmoid(z_y) - 1|, which is exactly 0 in float32 once z_y >
  ~17; a group whose samples are all that confident then gets 0 / 0 (NaN in
  the authors' torch code) instead of
  g_b / G. The ratio is formed in log space, log g_b = log_sigmoid(-z_y) and
  log G = logsumexp(log g over the group) - log(count), so it stays exact
  even where sigmoid(-z_y) itself underflows float32 (z_y > ~88).

  Empty groups: a group with no samples in the batch contributes nothing (no
  division by zero).

  First task (`num_old_classes == 0`): the authors' code uses w_b = 1 (plain
  BCE); `compensate_first_task=True` applies Eq. 4 literally (all samples are
  "new", w_b = g_b / G_new).

  Args:
    logits: (B, C) outputs over all classes seen so far.
    labels: (B,) integer labels.
    num_old_classes: classes [0, num_old_classes) are old (learned in earlier
      tasks). May be a traced integer.
    compensate_first_task: see above.
    eps: optional floor on the group mean G (default 0: none; the log-space
      ratio needs no guard). A positive floor changes w_b = g_b / G for
      groups with G < eps, i.e. confident groups (G ~ exp(-z_y)).
    class_mask: optional (C,) bool, True on the classes seen so far, for a
      fixed-size head (`fedjax_het.cil.masking`): the BCE is averaged over the
      seen columns only, so the result equals the loss on `logits[:, seen]`
      and unseen columns get no gradient (None: every column is seen).
    mask: optional (B,) boolean validity mask: padded rows join no group and
      the result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "class_aware_gradient_compensation_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_labels(fn, labels, logits.shape[0])
  onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  true_logit = jnp.sum(jax.lax.stop_gradient(logits) * onehot, axis=-1)
  log_g = jax.nn.log_sigmoid(-true_logit)  # log(1 - sigmoid(z_y)), no cancellation
  valid = jnp.ones(log_g.shape, bool) if mask is None else jnp.asarray(mask, bool)
  is_old = labels < num_old_classes

  def log_group_mean(member):
    member = member & valid
    count = jnp.sum(member)
    # An empty group gives -inf; it is only read by its (absent) members.
    peak = jnp.max(jnp.where(member, log_g, -jnp.inf))
    peak = jnp.where(count > 0, peak, 0.0)
    total = jnp.sum(jnp.where(member, jnp.exp(log_g - peak), 0.0))
    return peak + jnp.log(total) - jnp.log(jnp.maximum(count, 1).astype(log_g.dtype))

  log_mean = jnp.where(is_old, log_group_mean(is_old), log_group_mean(~is_old))
  log_mean = jnp.maximum(log_mean, jnp.log(jnp.asarray(eps, log_g.dtype)))  # log 0 = -inf
  weights = jnp.where(valid, jnp.exp(log_g - log_mean), 0.0)
  if not compensate_first_task:
    weights = jnp.where(jnp.asarray(num_old_classes) > 0, weights, jnp.ones_like(weights))
  return masked_mean(fn, _mean_over_classes(fn, weights[:, None], logits, onehot, class_mask),
                     mask)


@loss_function()
def class_semantic_relation_distillation_loss(*, logits: jax.Array, labels: jax.Array,
                                              old_logits: jax.Array,
                                              num_old_classes: int | jax.Array | None = None,
                                              class_mask: jax.Array | None = None,
                                              mask: jax.Array | None = None) -> jax.Array:
  """Class-semantic relation distillation L_RD, GLFC Eq. 5.

  The target is the one-hot label whose first C_old columns (the old classes)
  are replaced by the old model's probabilities sigmoid(old_logits); the loss
  is the BCE of `logits` against it, mean over batch and classes (the code's
  form of Eq. 5's divergence).

  Fixed-size heads (one compiled program for a whole task stream): pass
  `old_logits` with all C columns, `num_old_classes` (may be traced; the old
  classes are the prefix [0, num_old_classes)) and `class_mask` (the seen
  classes): the result equals the loss on the seen columns alone.

  Args:
    logits: (B, C) current local model outputs, C = C_old + C_new.
    labels: (B,) integer labels.
    old_logits: (B, C_old) outputs of the stored old model (or (B, C) with
      `num_old_classes`); constant.
    num_old_classes: optional number of old classes (default: C_old, the
      width of `old_logits`).
    class_mask: optional (C,) bool, True on the seen classes: the BCE is
      averaged over those columns only (None: all columns).
    mask: optional (B,) validity mask or weights; padded rows get 0 and the
      result is the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "class_semantic_relation_distillation_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  check_rank(fn, "old_logits", old_logits, 2, "(batch, num_old_classes)")
  check_labels(fn, labels, logits.shape[0])
  width = old_logits.shape[-1]
  if old_logits.shape[0] != logits.shape[0] or width > logits.shape[-1]:
    raise ValueError(
        f"{fn}: `old_logits` must have shape (batch, C_old) with batch "
        f"{logits.shape[0]} and C_old <= {logits.shape[-1]}, got {old_logits.shape}.")
  num_old = width if num_old_classes is None else num_old_classes
  target = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  old_probs = jax.nn.sigmoid(jax.lax.stop_gradient(old_logits))
  is_old = (jnp.arange(width) < num_old)[None, :]
  target = target.at[:, :width].set(jnp.where(is_old, old_probs, target[:, :width]))
  rows = _mean_over_classes(fn, 1.0, logits, target, class_mask)
  return masked_mean(fn, rows, mask)


@loss_function()
def mean_prediction_entropy(*, logits: jax.Array, class_mask: jax.Array | None = None,
                            mask: jax.Array | None = None) -> jax.Array:
  """Average softmax prediction entropy H_l^{r,t}, GLFC Eq. 7.

  H = mean_b -sum_c p_bc log p_bc with p = softmax(logits), computed from the
  log-softmax (the code adds 1e-5 inside the log instead).

  Args:
    logits: (B, C) predictions of the received global model on the client's
      current training data.
    class_mask: optional (C,) bool, True on the seen classes (a fixed-size
      head): the softmax runs over those classes only, as on the code's grown
      head (None: all classes).
    mask: optional (B,) validity mask (padding examples get 0).

  Returns:
    Scalar mean entropy over the valid examples (0 if none are valid).
  """
  fn = "mean_prediction_entropy"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  if class_mask is None:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    terms = jnp.exp(log_probs) * log_probs
  else:
    seen = _class_mask(fn, class_mask, logits)
    log_probs = jax.nn.log_softmax(jnp.where(seen, logits, -jnp.inf), axis=-1)
    terms = jnp.where(seen, jnp.exp(log_probs) * jnp.where(seen, log_probs, 0.0), 0.0)
  entropy = -jnp.sum(terms, axis=-1)
  return masked_mean(fn, entropy, mask)


@loss_function(nonnegative=("threshold",))
def task_transition_detected(*, entropy: jax.Array, previous_entropy: jax.Array,
                             threshold: float = TASK_TRANSITION_THRESHOLD) -> jax.Array:
  """Task-transition test of GLFC Sec. 4.1: H^r - H^{r-1} >= r_h.

  Args:
    entropy: mean prediction entropy this round (`mean_prediction_entropy`).
    previous_entropy: the same quantity in the previous round.
    threshold: r_h (default 1.2).

  Returns:
    Boolean array (same shape as `entropy`): True where a new task arrived.
  """
  return (entropy - previous_entropy) >= threshold


@loss_function(static_argnames=("kind",), nonnegative=("gamma",))
def prototype_perturbation_loss(*, features: jax.Array, labels: jax.Array,
                                noise: jax.Array, feature_variance: jax.Array,
                                kernel: jax.Array, bias: jax.Array,
                                gamma: float = PROTOTYPE_NOISE_SCALE,
                                kind: str = "bce",
                                class_mask: jax.Array | None = None) -> jax.Array:
  """Prototype perturbation loss L_GP, GLFC Eq. 10.

  The prototype's latent feature Phi(x) gets Gaussian noise gamma * N(0,
  sigma^2) (sigma^2: the variance of the features of the prototype's class)
  and is classified by the local model's linear head; the client descends the
  gradient of this loss with respect to x (Eq. 11), so `features` should be
  the differentiable output of the feature extractor.

  Args:
    features: (B, d) latent features Phi(x) of the prototype samples.
    labels: (B,) their labels.
    noise: (B, d) standard-normal draws.
    feature_variance: (B, d) sigma^2 per example and feature dimension.
    kernel: (d, C) weights of the linear classification head.
    bias: (C,) bias of the head.
    gamma: noise scale (paper: 0.1).
    kind: 'bce' (sigmoid BCE over all classes, the code and
      the authors' code) or 'ce' (softmax cross-entropy, the paper's D_CE).
    class_mask: optional (C,) bool, True on the seen classes of a fixed-size
      head: the BCE is averaged over those columns only and the softmax of
      'ce' spans them only (None: all columns, the code's growing head).

  Returns:
    Scalar loss.
  """
  fn = "prototype_perturbation_loss"
  if kind not in ("bce", "ce"):
    raise ValueError(f"{fn}: `kind` must be one of 'bce', 'ce', got {kind!r}.")
  check_rank(fn, "features", features, 2, "(batch, feature_dim)")
  check_same_shape(fn, ("features", "noise", "feature_variance"),
                   (features, noise, feature_variance))
  check_labels(fn, labels, features.shape[0])
  check_rank(fn, "kernel", kernel, 2, "(feature_dim, num_classes)")
  if kernel.shape[0] != features.shape[-1] or jnp.shape(bias) != (kernel.shape[1],):
    raise ValueError(
        f"{fn}: `kernel` must be (feature_dim={features.shape[-1]}, C) and `bias` "
        f"(C,), got {kernel.shape} and {jnp.shape(bias)}.")
  perturbed = features + gamma * jnp.sqrt(jnp.maximum(feature_variance, 0.0)) * noise
  logits = perturbed @ kernel + bias[None, :]
  if kind == "ce":
    if class_mask is not None:
      logits = jnp.where(_class_mask(fn, class_mask, logits), logits, -1e9)
    return jnp.mean(_softmax_cross_entropy_rows(logits, labels))
  onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  return jnp.mean(_mean_over_classes(fn, 1.0, logits, onehot, class_mask))


@loss_function()
def gradient_matching_loss(*, gradients: Any, target_gradients: Any) -> jax.Array:
  """Gradient-matching reconstruction loss L_RT, GLFC Eq. 8.

  L_RT = sum_i ||grad_{W_i} CE(Gamma(x_dummy), y) - grad_{W_i} Gamma_n||^2 over
  the layers W_i of the gradient encoder Gamma. The norm is squared, as in the
  DLG/iDLG code GLFC builds on. The proxy server minimises it over the dummy
  input (Eq. 9); `target_gradients` (the shared gradient) is constant.

  Args:
    gradients: pytree of gradients computed at the dummy input.
    target_gradients: pytree of the same structure: the received gradient.

  Returns:
    Scalar sum over all leaves of the squared differences.
  """
  check_same_structure("gradient_matching_loss", ("gradients", "target_gradients"),
                       (gradients, target_gradients))
  target = jax.lax.stop_gradient(target_gradients)
  squares = jax.tree_util.tree_map(lambda g, t: jnp.sum(jnp.square(g - t)), gradients, target)
  return sum(jax.tree_util.tree_leaves(squares), jnp.zeros((), jnp.float32))


@loss_function()
def infer_label_from_last_layer_gradient(*, kernel_gradient: jax.Array) -> jax.Array:
  """Ground-truth label of a single-example gradient (iDLG; GLFC Sec. 4.2).

  For softmax CE the gradient of the last layer's weights for class c is
  (p_c - y_c) * h; when the penultimate activations h are non-negative (the
  GLFC LeNet encoder uses sigmoids) only the true class has a negative column.
  The label is the argmin of the column sums.

  Args:
    kernel_gradient: (d, C) gradient of the last Dense kernel (Flax layout:
      inputs x outputs). vmap over a leading axis for several gradients.

  Returns:
    Scalar int32 label.
  """
  check_rank("infer_label_from_last_layer_gradient", "kernel_gradient", kernel_gradient, 2,
             "(feature_dim, num_classes)")
  return jnp.argmin(jnp.sum(kernel_gradient, axis=0)).astype(jnp.int32)

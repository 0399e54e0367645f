"""DDE's colliding-effect distillation [DDE Sec. 4.1], on iCaRL's sigmoid outputs.

DDE [DDE] restores the causal effect of the old data on the new training
through the collider of the old model's feature space: a sample x and its K
nearest neighbours x_1..x_K in the OLD model's feature space (among the new
data) collide there, so the prediction the new model is trained with is the
weighted effect

    P_DDE(Y | x) = W_0 P(Y | x) + sum_{k=1..K} W_k P(Y | x_k),
    W_0 >= W_k, sum W = 1.

The authors' code (JoyHuYY1412/DDE_CIL, `incremental_train_and_eval_DCE_MR_LF_TDE`)
weighs the sample by mu_1 = 1 and the neighbours' mean prediction by mu_2 = 1,
W_0 = 1/2 and W_k = 1/(2K) (`self_weight` = 1/2 here), takes the neighbours'
predictions without gradient (the new model on the neighbours, `no_grad`),
and selects the neighbours by the Euclidean distance between L2-normalised old
features, among the samples of the NEW classes other than x itself.

  * `colliding_neighbours`: the K nearest new-class rows of every row of a
    batch in the old model's normalised feature space, and the weights
    (W_0, W_1..W_K) of the colliding effect.
  * `colliding_effect_bce_loss`: iCaRL's loss [iCaRL Alg. 3] with the
    classification columns replaced by the colliding effect (below).

iCaRL's outputs are per-class sigmoids (a Bernoulli P(Y_c = 1 | x) per
class), so the colliding effect is taken per class column: q_c = W_0
sigmoid(z_c(x)) + sum_k W_k sigmoid(z_c(x_k)). DDE's loss replaces the base
method's classification loss and keeps its distillation (the code replaces
LUCIR's cross-entropy by the NLL of the joint prediction and keeps LUCIR's
feature distillation); in iCaRL's loss the classification part is the BCE of
the new-class columns against the one-hot label and the distillation part the
BCE of the old-class columns against the old model's sigmoid outputs, so the
new-class columns [C_old, C_seen) get BCE(q_c, onehot_c) and the old-class
columns [0, C_old) keep iCaRL's BCE(sigmoid(z_c(x)), sigmoid(z^old_c(x))).
log q_c and log(1 - q_c) = log sum_i W_i sigmoid(-z_c(x_i)) are log-sum-exps
of log-sigmoids: finite for float32 logits of any finite magnitude. With no
neighbour (W_0 = 1) the loss is iCaRL's (`losses.glfc.
class_semantic_relation_distillation_loss`) up to float rounding.

References:
  [DDE] X. Hu, K. Tang, C. Miao, X.-S. Hua, H. Zhang. Distilling Causal Effect
    of Data in Class-Incremental Learning. CVPR 2021 (code: JoyHuYY1412/DDE_CIL).
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import (MATMUL_PRECISION, check_labels, check_rank, loss_function,
                                     masked_mean, sigmoid_binary_cross_entropy_elementwise)

#: L2 normalisation floor of the old features (x / max(||x||, eps), torch's F.normalize).
NORMALIZE_EPS = 1e-12


@loss_function(static_argnames=("num_neighbours",), unit_interval=("self_weight",))
def colliding_neighbours(*, old_features: jax.Array, labels: jax.Array,
                         num_old_classes: int | jax.Array, num_neighbours: int,
                         self_weight: float = 0.5,
                         mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The K nearest neighbours of every row in the old feature space, and DDE's weights.

  Candidates of row b: the valid rows j != b whose label is a new class
  (labels[j] >= num_old_classes); none when num_old_classes = 0 (the first
  task: DDE has no old model there). Distance: Euclidean between the
  L2-normalised old features (the code's `pdist` on `F.normalize`d features).
  The K' = min(K, candidates) nearest candidates are the neighbours; the
  weights are W_0 = self_weight and W_k = (1 - self_weight) / K' for them
  (the code's (mu_1 P(x) + mu_2 mean_k P(x_k)) / (mu_1 + mu_2)), W_0 = 1 and
  no neighbour when a row has no candidate.

  Args:
    old_features: (B, D) the old model's features of the batch (constant).
    labels: (B,) integer labels.
    num_old_classes: C_old (may be traced); the old classes are [0, C_old).
    num_neighbours: K (static); at most B - 1 are used (a batch of B rows).
    self_weight: W_0 in (0, 1].
    mask: optional (B,) bool validity of the rows (padding is never a
      neighbour).

  Returns:
    (neighbours (B, K) int32 row indices, weights (B, 1 + K) float32: column 0
    is W_0, column k the weight of neighbours[:, k - 1], 0 where that slot
    holds no neighbour).
  """
  fn = "colliding_neighbours"
  check_rank(fn, "old_features", old_features, 2, "(batch, feature_dim)")
  batch = old_features.shape[0]
  check_labels(fn, labels, batch)
  if num_neighbours < 1:
    raise ValueError(f"{fn}: `num_neighbours` must be an integer >= 1, got {num_neighbours}.")
  valid = jnp.ones((batch,), bool) if mask is None else jnp.asarray(mask).astype(bool)
  f = jax.lax.stop_gradient(jnp.asarray(old_features, jnp.float32))
  norm = jnp.sqrt(jnp.sum(jnp.square(f), axis=-1, keepdims=True))
  f = f / jnp.maximum(norm, NORMALIZE_EPS)
  square = jnp.sum(jnp.square(f), axis=-1)
  distance = (square[:, None] + square[None, :]
              - 2.0 * jnp.matmul(f, f.T, precision=MATMUL_PRECISION))
  candidate = (valid & (labels >= num_old_classes) & (jnp.asarray(num_old_classes) > 0))[None, :]
  candidate = candidate & ~jnp.eye(batch, dtype=bool)
  k = min(num_neighbours, max(batch - 1, 1))
  score, index = jax.lax.top_k(jnp.where(candidate, -distance, -jnp.inf), k)
  found = score > -jnp.inf
  count = jnp.sum(found, axis=-1, keepdims=True).astype(jnp.float32)
  w0 = jnp.where(count > 0, jnp.float32(self_weight), 1.0)
  wk = jnp.where(found, (1.0 - w0) / jnp.maximum(count, 1.0), 0.0)
  pad = num_neighbours - k
  index = jnp.pad(index.astype(jnp.int32), ((0, 0), (0, pad)))
  wk = jnp.pad(wk, ((0, 0), (0, pad)))
  return index, jnp.concatenate([w0, wk], axis=-1)


@loss_function()
def colliding_effect_bce_loss(*, logits: jax.Array, labels: jax.Array, old_logits: jax.Array,
                              neighbours: jax.Array, weights: jax.Array,
                              num_old_classes: int | jax.Array,
                              class_mask: jax.Array | None = None,
                              mask: jax.Array | None = None) -> jax.Array:
  """iCaRL's BCE with DDE's colliding effect on the classification columns (module docstring).

  Per row b and seen class c:
    c <  C_old: BCE(sigmoid(z_bc), sigmoid(z^old_bc))                (iCaRL's distillation)
    c >= C_old: -[y_bc log q_bc + (1 - y_bc) log(1 - q_bc)],
                q_bc = W_b0 sigmoid(z_bc) + sum_k W_bk sigmoid(z_{n_bk, c})  (colliding effect)
  with y the one-hot label and n_bk the neighbours, whose logits are constants
  (the code's `no_grad` forward). Mean over the seen classes, then over the
  valid rows.

  Args:
    logits: (B, C) the current model's outputs.
    labels: (B,) integer labels.
    old_logits: (B, C) the old model's outputs (constant).
    neighbours: (B, K) int row indices (`colliding_neighbours`).
    weights: (B, 1 + K) W_0 and the neighbours' weights, rows summing to 1.
    num_old_classes: C_old (may be traced).
    class_mask: optional (C,) bool, the seen classes (None: all columns).
    mask: optional (B,) validity mask; the mean over the valid rows.

  Returns:
    Scalar loss.
  """
  fn = "colliding_effect_bce_loss"
  check_rank(fn, "logits", logits, 2, "(batch, num_classes)")
  batch, classes = logits.shape
  check_labels(fn, labels, batch)
  if old_logits.shape != logits.shape:
    raise ValueError(f"{fn}: `old_logits` must have the shape of `logits` {logits.shape}, "
                     f"got {old_logits.shape}.")
  check_rank(fn, "neighbours", neighbours, 2, "(batch, num_neighbours)")
  if neighbours.shape[0] != batch or weights.shape != (batch, neighbours.shape[1] + 1):
    raise ValueError(f"{fn}: `neighbours` must be (batch, K) and `weights` (batch, 1 + K) with "
                     f"batch {batch}, got {neighbours.shape} and {weights.shape}.")
  seen = (jnp.ones((classes,), bool) if class_mask is None
          else jnp.asarray(class_mask).astype(bool))[None, :]
  z = jnp.where(seen, logits, 0.0)   # unseen columns: no value, no gradient
  old = (jnp.arange(classes) < num_old_classes)[None, :]
  target_old = jax.nn.sigmoid(jax.lax.stop_gradient(old_logits))
  distil = sigmoid_binary_cross_entropy_elementwise(jnp.where(old, z, 0.0),
                                                    jnp.where(old, target_old, 0.0))
  members = jnp.concatenate([z[:, None, :], jax.lax.stop_gradient(z)[neighbours]], axis=1)
  w = jnp.asarray(weights, z.dtype)[:, :, None]
  log_w = jnp.where(w > 0, jnp.log(jnp.where(w > 0, w, 1.0)), -jnp.inf)
  log_q = jax.nn.logsumexp(log_w + jax.nn.log_sigmoid(members), axis=1)
  log_not_q = jax.nn.logsumexp(log_w + jax.nn.log_sigmoid(-members), axis=1)
  onehot = jax.nn.one_hot(labels, classes, dtype=z.dtype)
  classify = -(onehot * log_q + (1.0 - onehot) * log_not_q)
  per_class = jnp.where(old, distil, classify)
  rows = jnp.sum(jnp.where(seen, per_class, 0.0), axis=-1)
  rows = rows / jnp.maximum(jnp.sum(seen), 1).astype(rows.dtype)
  return masked_mean(fn, rows, mask)

"""GeoDL's geodesic distillation [GeoDL]: similarity along the geodesic between two subspaces.

For one batch, the old and the new model's features span two d-dimensional
subspaces S_old, S_new of R^D (points of the Grassmannian G(d, D)). GeoDL
measures the similarity of the two embeddings of a sample along the whole
geodesic flow Phi(t), t in [0, 1], from S_old to S_new, i.e. with the
geodesic flow kernel (GFK) [GFK]

    <x, y>_G = int_0^1 (Phi(t)^T x)^T (Phi(t)^T y) dt = x^T G y,
    G = int_0^1 Phi(t) Phi(t)^T dt   (D, D), symmetric positive semi-definite,

and distils it as one minus the cosine under G of each sample's old and new
feature [GeoDL; the authors' code `GFK_distill_cosine.py`]:

    L = mean_i [1 - x_i^T G y_i / (sqrt(x_i^T G x_i) sqrt(y_i^T G y_i))].

  * `feature_subspace`: the top-d principal directions of a batch of
    L2-normalised features (left singular vectors of the uncentred (D, B)
    feature matrix; padded rows are zeroed and contribute nothing).
  * `geodesic_flow_kernel`: G in closed form from two orthonormal bases.
  * `geodesic_similarity`: the cosine under G, row by row.
  * `geodesic_distillation_loss`: GeoDL's loss from two feature batches.

Closed form (`geodesic_flow_kernel`). With the SVD P_s^T P_t = U Gamma V^T
(Gamma = cos theta, theta the principal angles), A = P_s U (unit columns in
S_old) and Q = (I - P_s P_s^T) P_t V (column i of norm sin theta_i, the part
of P_t v_i orthogonal to S_old), the geodesic is

    Phi(t) = A diag(cos(t theta)) + Q diag(sin(t theta) / sin theta),

Phi(0) = A spans S_old, Phi(1) = A Gamma + Q = P_t V spans S_new. Integrating
cos^2, cos sin and sin^2 over t gives

    G = A L1 A^T + A L2 Q^T + Q L2 A^T + Q L3 Q^T,
    L1 = (1 + sinc(2 theta)) / 2,          sinc(x) = sin(x) / x,
    L2 = sin(theta) / (2 theta) = sinc(theta) / 2,
    L3 = (2 theta - sin 2 theta) / (4 theta sin^2 theta),

the GFK of [GFK] (its Lambda_1, Lambda_2, Lambda_3) written with R_s U_2
sin theta = -Q (R_s the orthogonal complement of S_old, R_s^T P_t = -U_2
sin(theta) V^T), so no (D, D - d) complement basis is formed and nothing is
divided by sin theta: L2 and L3 are the smooth functions above (L2 -> 1/2,
L3 -> 1/3 as theta -> 0). For coinciding subspaces (theta = 0) G = P_s P_s^T,
the projection onto them.

Sources: GeoDL's text is not among the project's source papers; the
geodesic, its kernel and the loss follow the GFK paper's closed form and
GeoDL's code (`GFK_distill_cosine.py`: `fit`, `gfk_G`), and the tests check
the kernel against a numerical integration of the projected features over t.

Numerical safeguards (float32):
  * theta = atan2(||q_i||, gamma_i), not arccos(gamma_i): accurate for small
    angles (arccos of a float32 cosine near 1 resolves no angle below ~3e-4)
    and never outside [0, pi/2] (cosines above 1 from rounding included).
  * L1 and L2 use `jnp.sinc` (finite at 0); L3 uses its Taylor series
    1/3 + 2 theta^2 / 45 below theta = 0.05, where the closed form loses
    its digits to cancellation.
  * The kernel is a constant of the step (`stop_gradient`), as in the
    authors' code (`gfk_G(...).detach()`): the gradient reaches the model
    through the features in the similarity, never through the SVDs, so
    (nearly) equal singular values, whose SVD derivatives have 1 / (s_i^2 -
    s_j^2) terms, and coinciding subspaces (arccos' infinite slope at 1)
    cannot produce inf or NaN gradients.
  * The norms under G are floored at `eps` (x^T G x >= 0 holds only up to
    rounding); the features are L2-normalised with `losses.incremental`'s
    NaN-free normalisation (x / max(||x||, 1e-12)).

References:
  [GeoDL] C. Simon, P. Koniusz, M. Harandi. On Learning the Geodesic Path for
    Incremental Learning. CVPR 2021 (code: chrysts/geodesic_continual_learning,
    algorithms/GFK_distill_cosine.py).
  [GFK] B. Gong, Y. Shi, F. Sha, K. Grauman. Geodesic Flow Kernel for
    Unsupervised Domain Adaptation. CVPR 2012 (the closed form of G).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.losses._core import check_rank, masked_mean
from fedjax_het.losses.incremental import _l2_normalize

#: Below this principal angle L3 is evaluated by its Taylor series (module docstring).
SMALL_ANGLE = 0.05
#: Floor of x^T G x in the cosine under G.
SIMILARITY_EPS = 1e-8

__all__ = ["SMALL_ANGLE", "SIMILARITY_EPS", "feature_subspace", "geodesic_distillation_loss",
           "geodesic_flow_kernel", "geodesic_similarity", "principal_angles"]


def _check_dim(fn: str, features: jax.Array, dim: int) -> None:
  limit = min(features.shape)
  if not 1 <= dim <= limit:
    raise ValueError(f"{fn}: `subspace_dim` must be in [1, min(batch, feature dim)] = "
                     f"[1, {limit}], got {dim}.")


def feature_subspace(*, features: jax.Array, subspace_dim: int,
                     mask: jax.Array | None = None) -> jax.Array:
  """(D, d) orthonormal basis of the top-d principal directions of a feature batch.

  The rows are L2-normalised (padded rows, `mask` False, set to zero) and the
  basis is the first d left singular vectors of the uncentred (D, B) matrix
  of the rows [GeoDL: the subspace of a model's features on the batch].

  Args:
    features: (B, D) features.
    subspace_dim: d, static, 1 <= d <= min(B, D).
    mask: optional (B,) validity mask.
  """
  fn = "feature_subspace"
  check_rank(fn, "features", features, 2, "(batch, dim)")
  _check_dim(fn, features, subspace_dim)
  x = _l2_normalize(jnp.asarray(features, jnp.float32))
  if mask is not None:
    x = x * jnp.asarray(mask).astype(x.dtype)[:, None]
  basis, _, _ = jnp.linalg.svd(x.T, full_matrices=False)
  return basis[:, :subspace_dim]


def _angles_and_frames(source_basis: jax.Array, target_basis: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(theta (d,), A = P_s U (D, d), Q = (I - P_s P_s^T) P_t V (D, d)) (module docstring)."""
  u, cosines, vt = jnp.linalg.svd(source_basis.T @ target_basis)
  target = target_basis @ vt.T
  q = target - source_basis @ (source_basis.T @ target)
  sines = jnp.sqrt(jnp.sum(jnp.square(q), axis=0))
  theta = jnp.arctan2(sines, jnp.maximum(cosines, 0.0))
  return theta, source_basis @ u, q


def principal_angles(*, source_basis: jax.Array, target_basis: jax.Array) -> jax.Array:
  """(d,) principal angles in [0, pi/2] between span(P_s) and span(P_t), largest cosine first.

  Args:
    source_basis: (D, d) orthonormal P_s.
    target_basis: (D, d) orthonormal P_t.
  """
  check_rank("principal_angles", "source_basis", source_basis, 2, "(dim, subspace_dim)")
  return _angles_and_frames(source_basis, target_basis)[0]


def _third_coefficient(theta: jax.Array) -> jax.Array:
  """L3 = (2 theta - sin 2 theta) / (4 theta sin^2 theta), its series for small theta."""
  small = theta < SMALL_ANGLE
  safe = jnp.where(small, 1.0, theta)
  closed = (2.0 * safe - jnp.sin(2.0 * safe)) / (4.0 * safe * jnp.square(jnp.sin(safe)))
  series = 1.0 / 3.0 + 2.0 * jnp.square(theta) / 45.0
  return jnp.where(small, series, closed)


def geodesic_flow_kernel(*, source_basis: jax.Array, target_basis: jax.Array) -> jax.Array:
  """G = int_0^1 Phi(t) Phi(t)^T dt (D, D) of the geodesic from span(P_s) to span(P_t).

  The closed form of the module docstring [GFK; GeoDL]. G is symmetric in its
  two arguments (the geodesic run backwards) and equals P P^T when the
  subspaces coincide.

  Args:
    source_basis: (D, d) orthonormal basis P_s of the old subspace.
    target_basis: (D, d) orthonormal basis P_t of the new subspace.

  Returns:
    (D, D) float32 kernel.
  """
  fn = "geodesic_flow_kernel"
  check_rank(fn, "source_basis", source_basis, 2, "(dim, subspace_dim)")
  if target_basis.shape != source_basis.shape:
    raise ValueError(f"{fn}: `target_basis` must have the shape of `source_basis` "
                     f"{source_basis.shape}, got {target_basis.shape}.")
  theta, a, q = _angles_and_frames(jnp.asarray(source_basis, jnp.float32),
                                   jnp.asarray(target_basis, jnp.float32))
  l1 = 0.5 * (1.0 + jnp.sinc(2.0 * theta / jnp.pi))   # jnp.sinc(x) = sin(pi x) / (pi x)
  l2 = 0.5 * jnp.sinc(theta / jnp.pi)
  l3 = _third_coefficient(theta)
  cross = (a * l2[None, :]) @ q.T
  return (a * l1[None, :]) @ a.T + cross + cross.T + (q * l3[None, :]) @ q.T


def geodesic_similarity(*, x: jax.Array, y: jax.Array, kernel: jax.Array,
                        eps: float = SIMILARITY_EPS) -> jax.Array:
  """(B,) cosine under G: x_i^T G y_i / (sqrt(max(x_i^T G x_i, eps)) sqrt(max(y_i^T G y_i, eps))).

  Args:
    x, y: (B, D) feature rows.
    kernel: (D, D) symmetric positive semi-definite G.
    eps: floor of the squared norms under G.
  """
  gx, gy = x @ kernel, y @ kernel
  xy = jnp.sum(gx * y, axis=-1)
  xx = jnp.sum(gx * x, axis=-1)
  yy = jnp.sum(gy * y, axis=-1)
  return xy * jax.lax.rsqrt(jnp.maximum(xx, eps)) * jax.lax.rsqrt(jnp.maximum(yy, eps))


def geodesic_distillation_loss(*, features: jax.Array, old_features: jax.Array,
                               subspace_dim: int, mask: jax.Array | None = None,
                               eps: float = SIMILARITY_EPS) -> jax.Array:
  """GeoDL's distillation loss [GeoDL]: mean over valid rows of 1 - cos_G(old_i, new_i).

  Both feature batches are L2-normalised; P_s spans the old features' top-d
  principal directions, P_t the new ones' (`feature_subspace`, valid rows
  only); G = `geodesic_flow_kernel`(P_s, P_t) is held constant
  (`stop_gradient`, the authors' code); the loss is the mean over the valid
  rows of one minus `geodesic_similarity` of the old and the new row. The
  gradient flows into `features` only (the old model's are a teacher).

  Args:
    features: (B, D) the current model's features.
    old_features: (B, D) the old model's features on the same images.
    subspace_dim: d, static, 1 <= d <= min(B, D).
    mask: optional (B,) validity mask (padded rows count nowhere).
    eps: floor of the squared norms under G.

  Returns:
    Scalar loss in [0, 2]; 0 when the two batches are equal.
  """
  fn = "geodesic_distillation_loss"
  check_rank(fn, "features", features, 2, "(batch, dim)")
  if old_features.shape != features.shape:
    raise ValueError(f"{fn}: `old_features` must have the shape of `features` "
                     f"{features.shape}, got {old_features.shape}.")
  _check_dim(fn, features, subspace_dim)
  new = _l2_normalize(jnp.asarray(features, jnp.float32))
  old = jax.lax.stop_gradient(_l2_normalize(jnp.asarray(old_features, jnp.float32)))
  source = feature_subspace(features=old, subspace_dim=subspace_dim, mask=mask)
  target = feature_subspace(features=jax.lax.stop_gradient(new), subspace_dim=subspace_dim,
                            mask=mask)
  kernel = jax.lax.stop_gradient(geodesic_flow_kernel(source_basis=source,
                                                      target_basis=target))
  similarity = geodesic_similarity(x=old, y=new, kernel=kernel, eps=eps)
  return masked_mean(fn, 1.0 - similarity, mask)

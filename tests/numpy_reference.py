"""Independent loop-based NumPy/float64 reference implementations of the loss library's math."""
import math

import numpy as np


# ----------------------------------------------------------------------------- helpers


def _log_softmax(row):
  """Stable log-softmax of a 1-D sequence, with max subtraction, by explicit loops."""
  vals = [float(v) for v in row]
  m = vals[0]
  for v in vals:
    if v > m:
      m = v
  total = 0.0
  for v in vals:
    total += math.exp(v - m)
  lse = m + math.log(total)
  return [v - lse for v in vals]


def _softmax(row):
  """Stable softmax of a 1-D sequence (exp of the loop-based log-softmax)."""
  return [math.exp(v) for v in _log_softmax(row)]


def _sigmoid(z):
  """Stable logistic sigmoid of a scalar."""
  z = float(z)
  if z >= 0:
    return 1.0 / (1.0 + math.exp(-z))
  e = math.exp(z)
  return e / (1.0 + e)


def _bce(z, y):
  """Stable sigmoid BCE: max(z,0) - z*y + log(1+exp(-|z|))."""
  z = float(z)
  y = float(y)
  return max(z, 0.0) - z * y + math.log1p(math.exp(-abs(z)))


def _dot(a, b):
  """Dot product of two 1-D arrays by an explicit loop."""
  s = 0.0
  for i in range(len(a)):
    s += float(a[i]) * float(b[i])
  return s


def _cos(a, b):
  """Cosine similarity a.b / (||a|| * ||b||)."""
  return _dot(a, b) / (math.sqrt(_dot(a, a)) * math.sqrt(_dot(b, b)))


def _kl_rows(p_logits, q_logits):
  """KL(softmax(p_logits) || softmax(q_logits)) for one row."""
  lp = _log_softmax(p_logits)
  lq = _log_softmax(q_logits)
  s = 0.0
  for j in range(len(lp)):
    s += math.exp(lp[j]) * (lp[j] - lq[j])
  return s


def _standardise(z, eps, unbiased_std):
  """Column-wise standardisation (z - mean) / sqrt(var + eps) by loops."""
  z = np.asarray(z, dtype=np.float64)
  B, C = z.shape
  out = np.zeros((B, C), dtype=np.float64)
  denom = (B - 1) if unbiased_std else B
  for u in range(C):
    mean = 0.0
    for b in range(B):
      mean += z[b, u]
    mean /= B
    var = 0.0
    for b in range(B):
      var += (z[b, u] - mean) ** 2
    var /= denom
    sd = math.sqrt(var + eps)
    for b in range(B):
      out[b, u] = (z[b, u] - mean) / sd
  return out


# ----------------------------------------------------------------------------- losses


def ref_cross_correlation_matrix(z, z_target, *, eps=1e-6, unbiased_std=True):
  """Cross-correlation matrix M_uv = (1/B) sum_b zhat_bu * that_bv (Barlow-Twins style eq.)."""
  zh = _standardise(z, eps, unbiased_std)
  th = _standardise(z_target, eps, unbiased_std)
  B, C = zh.shape
  M = np.zeros((C, C), dtype=np.float64)
  for u in range(C):
    for v in range(C):
      s = 0.0
      for b in range(B):
        s += zh[b, u] * th[b, v]
      M[u, v] = s / B
  return M


def ref_cross_correlation_loss(z, z_target, *, off_diagonal_weight=0.0051, eps=1e-6, unbiased_std=True):
  """Cross-correlation loss sum_u (1-M_uu)^2 + lambda * sum_{u!=v} (1+M_uv)^2."""
  M = ref_cross_correlation_matrix(z, z_target, eps=eps, unbiased_std=unbiased_std)
  C = M.shape[0]
  diag = 0.0
  off = 0.0
  for u in range(C):
    for v in range(C):
      if u == v:
        diag += (1.0 - M[u, u]) ** 2
      else:
        off += (1.0 + M[u, v]) ** 2
  return float(diag + off_diagonal_weight * off)


def ref_instance_similarity_matrix(h, *, temperature=0.02, eps=1e-12):
  """Instance similarity s_bc = <hn_b, hn_c> / tau for c != b (instance-similarity eq.)."""
  h = np.asarray(h, dtype=np.float64)
  B, D = h.shape
  hn = np.zeros((B, D), dtype=np.float64)
  for b in range(B):
    nrm = math.sqrt(_dot(h[b], h[b]) + eps)
    for d in range(D):
      hn[b, d] = h[b, d] / nrm
  S = np.zeros((B, B - 1), dtype=np.float64)
  for b in range(B):
    k = 0
    for c in range(B):
      if c == b:
        continue
      S[b, k] = _dot(hn[b], hn[c]) / temperature
      k += 1
  return S


def ref_instance_similarity_loss(s, s_target):
  """Instance similarity loss: batch mean of KL(softmax(s_target_b) || softmax(s_b))."""
  s = np.asarray(s, dtype=np.float64)
  s_target = np.asarray(s_target, dtype=np.float64)
  B = s.shape[0]
  total = 0.0
  for b in range(B):
    total += _kl_rows(s_target[b], s[b])
  return float(total / B)


def ref_kd_loss(student_logits, teacher_logits, *, temperature=1.0):
  """KD loss: batch mean of KL(softmax(t/T) || softmax(s/T)), no T^2 factor."""
  s = np.asarray(student_logits, dtype=np.float64)
  t = np.asarray(teacher_logits, dtype=np.float64)
  B, C = s.shape
  total = 0.0
  for b in range(B):
    total += _kl_rows([t[b, u] / temperature for u in range(C)],
                          [s[b, u] / temperature for u in range(C)])
  return float(total / B)


def ref_non_target_distillation_loss(student_logits, teacher_logits, labels, *, temperature=1.0,
                                     renormalize=False):
  """Non-target-class distillation: T^2 * mean_b KL over classes u != y_b (NTD eq.)."""
  s = np.asarray(student_logits, dtype=np.float64)
  t = np.asarray(teacher_logits, dtype=np.float64)
  B, C = s.shape
  T = float(temperature)
  total = 0.0
  for b in range(B):
    y = int(labels[b])
    if renormalize:
      tl = [t[b, u] / T for u in range(C) if u != y]
      sl = [s[b, u] / T for u in range(C) if u != y]
      total += _kl_rows(tl, sl)
    else:
      lpT = _log_softmax([t[b, u] / T for u in range(C)])
      lpS = _log_softmax([s[b, u] / T for u in range(C)])
      kl = 0.0
      for u in range(C):
        if u != y:
          kl += math.exp(lpT[u]) * (lpT[u] - lpS[u])
      total += kl
  return float(T * T * total / B)


def ref_dual_domain_distillation_loss(logits, previous_logits, pretrained_logits, *, temperature=1.0):
  """Dual-domain distillation: KD(previous) + KD(pretrained)."""
  return float(ref_kd_loss(logits, previous_logits, temperature=temperature)
                 + ref_kd_loss(logits, pretrained_logits, temperature=temperature))


def ref_softmax_cross_entropy(logits, labels):
  """Softmax cross-entropy: mean_b -log softmax(z_b)[y_b]."""
  z = np.asarray(logits, dtype=np.float64)
  B = z.shape[0]
  total = 0.0
  for b in range(B):
    total -= _log_softmax(z[b])[int(labels[b])]
  return float(total / B)


def ref_gradient_compensation_loss(logits, labels, *, num_old_classes, compensate_first_task=False):
  """Gradient compensation: per-sample BCE reweighted by g_b / mean group g (GCL eq.)."""
  z = np.asarray(logits, dtype=np.float64)
  B, C = z.shape
  g = [abs(_sigmoid(z[b, int(labels[b])]) - 1.0) for b in range(B)]
  is_old = [int(labels[b]) < num_old_classes for b in range(B)]
  if num_old_classes == 0 and not compensate_first_task:
    w = [1.0] * B
  else:
    sums = {True: 0.0, False: 0.0}
    counts = {True: 0, False: 0}
    for b in range(B):
      sums[is_old[b]] += g[b]
      counts[is_old[b]] += 1
    w = []
    for b in range(B):
      G = sums[is_old[b]] / counts[is_old[b]]
      w.append(0.0 if G == 0.0 else g[b] / G)
  total = 0.0
  for b in range(B):
    y = int(labels[b])
    for c in range(C):
      total += w[b] * _bce(z[b, c], 1.0 if c == y else 0.0)
  return float(total / (B * C))


def ref_relation_distillation_loss(logits, labels, old_logits):
  """Relation distillation: BCE against one-hot targets with old columns = sigmoid(old logits)."""
  z = np.asarray(logits, dtype=np.float64)
  zo = np.asarray(old_logits, dtype=np.float64)
  B, C = z.shape
  C_old = zo.shape[1]
  total = 0.0
  for b in range(B):
    for c in range(C):
      tgt = _sigmoid(zo[b, c]) if c < C_old else (1.0 if c == int(labels[b]) else 0.0)
      total += _bce(z[b, c], tgt)
  return float(total / (B * C))


def ref_mean_prediction_entropy(logits, mask=None):
  """Mean prediction entropy: sum_b m_b H(softmax(z_b)) / sum_b m_b."""
  z = np.asarray(logits, dtype=np.float64)
  B = z.shape[0]
  num = 0.0
  den = 0.0
  for b in range(B):
    m = 1.0 if mask is None else float(mask[b])
    lp = _log_softmax(z[b])
    H = 0.0
    for v in lp:
      H -= math.exp(v) * v
    num += m * H
    den += m
  return float(num / den)


def ref_prototype_perturbation_loss(features, labels, noise, feature_variance, kernel, bias, *,
                                   gamma=0.1, kind='bce'):
  """Prototype perturbation: classify f + gamma*sqrt(var)*noise with BCE or CE."""
  x = np.asarray(features, dtype=np.float64)
  n = np.asarray(noise, dtype=np.float64)
  var = np.asarray(feature_variance, dtype=np.float64)
  W = np.asarray(kernel, dtype=np.float64)
  bvec = np.asarray(bias, dtype=np.float64)
  B, D = x.shape
  C = W.shape[1]
  total = 0.0
  for b in range(B):
    f = [x[b, d] + gamma * math.sqrt(var[b, d]) * n[b, d] for d in range(D)]
    z = []
    for c in range(C):
      s = bvec[c]
      for d in range(D):
        s += f[d] * W[d, c]
      z.append(s)
    y = int(labels[b])
    if kind == 'bce':
      for c in range(C):
        total += _bce(z[c], 1.0 if c == y else 0.0) / C
    elif kind == 'ce':
      total -= _log_softmax(z)[y]
    else:
      raise ValueError(f"unknown kind {kind!r}")
  return float(total / B)


def ref_gradient_matching_loss(grads, target_grads):
  """Gradient matching: sum over tensors of ||g - t||^2."""
  total = 0.0
  for g, t in zip(grads, target_grads):
    g = np.asarray(g, dtype=np.float64).ravel()
    t = np.asarray(t, dtype=np.float64).ravel()
    for i in range(g.size):
      total += (g[i] - t[i]) ** 2
  return float(total)


def ref_infer_label_from_gradient(kernel_grad):
  """Label inference: argmin_c of column sums of the last-layer kernel gradient."""
  G = np.asarray(kernel_grad, dtype=np.float64)
  D, C = G.shape
  best_c, best_r = 0, None
  for c in range(C):
    r = 0.0
    for d in range(D):
      r += G[d, c]
    if best_r is None or r < best_r:
      best_c, best_r = c, r
  return int(best_c)


def ref_gaussian_kernel_matrix(x, y, *, bandwidths):
  """Multi-kernel Gaussian K_ij = sum_s exp(-||x_i - y_j||^2 / (2 s))."""
  x = np.asarray(x, dtype=np.float64)
  y = np.asarray(y, dtype=np.float64)
  N, D = x.shape
  M = y.shape[0]
  K = np.zeros((N, M), dtype=np.float64)
  for i in range(N):
    for j in range(M):
      d2 = 0.0
      for d in range(D):
        d2 += (x[i, d] - y[j, d]) ** 2
      k = 0.0
      for s in bandwidths:
        k += math.exp(-d2 / (2.0 * float(s)))
      K[i, j] = k
  return K


def _mean_all(K):
  """Mean of all entries of a 2-D array by loops."""
  s = 0.0
  for i in range(K.shape[0]):
    for j in range(K.shape[1]):
      s += K[i, j]
  return s / (K.shape[0] * K.shape[1])


def ref_mk_mmd_squared(x, y, *, bandwidths=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 5, 10, 15, 20, 25, 30,
                      35, 100, 1e3, 1e4, 1e5, 1e6)):
  """Biased MK-MMD^2 = max(0, mean Kxx + mean Kyy - 2 mean Kxy)."""
  kxx = _mean_all(ref_gaussian_kernel_matrix(x, x, bandwidths=bandwidths))
  kyy = _mean_all(ref_gaussian_kernel_matrix(y, y, bandwidths=bandwidths))
  kxy = _mean_all(ref_gaussian_kernel_matrix(x, y, bandwidths=bandwidths))
  return float(max(0.0, kxx + kyy - 2.0 * kxy))


def ref_two_stream_l2_loss(local_outputs, global_outputs, reduction="batch_mean"):
  """Two-stream L2: (1/B) sum_b ||local_b - global_b||^2, or TF's l2_loss: half the total sum."""
  a = np.asarray(local_outputs, dtype=np.float64)
  g = np.asarray(global_outputs, dtype=np.float64)
  B, C = a.shape
  total = 0.0
  for b in range(B):
    for c in range(C):
      total += (a[b, c] - g[b, c]) ** 2
  return float(total / 2.0) if reduction == "tf_l2_loss" else float(total / B)


def ref_proximal_term(params, global_params, *, mu=0.01):
  """FedProx proximal term (mu/2) * ||w - w_global||^2."""
  return float(mu / 2.0 * ref_gradient_matching_loss(params, global_params))


def ref_model_contrastive_loss(features, global_features, previous_features, *, temperature=0.5):
  """MOON model-contrastive loss: -log(e^{sim(z,zg)/T} / (e^{sim(z,zg)/T} + sum_p e^{sim(z,zp)/T}))."""
  f = np.asarray(features, dtype=np.float64)
  g = np.asarray(global_features, dtype=np.float64)
  prev = np.asarray(previous_features, dtype=np.float64)
  B = f.shape[0]
  P = prev.shape[0]
  total = 0.0
  for b in range(B):
    logits = [_cos(f[b], g[b]) / temperature]
    for p in range(P):
      logits.append(_cos(f[b], prev[p, b]) / temperature)
    total -= _log_softmax(logits)[0]
  return float(total / B)


def ref_restricted_softmax_logits(logits, class_mask, *, alpha=0.5):
  """Restricted softmax logits: scale logits of absent classes by alpha."""
  z = np.asarray(logits, dtype=np.float64)
  B, C = z.shape
  out = np.zeros((B, C), dtype=np.float64)
  for b in range(B):
    for c in range(C):
      out[b, c] = z[b, c] if bool(class_mask[c]) else alpha * z[b, c]
  return out


def ref_prototype_contrastive_loss(features, labels, prototypes, prototype_mask, *, temperature=1.0):
  """Prototype contrastive loss: -log softmax over valid prototypes of cos(f_b, p_c)/T at y_b."""
  f = np.asarray(features, dtype=np.float64)
  P = np.asarray(prototypes, dtype=np.float64)
  B = f.shape[0]
  C = P.shape[0]
  total = 0.0
  for b in range(B):
    y = int(labels[b])
    if not bool(prototype_mask[y]):
      continue
    valid = [c for c in range(C) if bool(prototype_mask[c])]
    logits = [_cos(f[b], P[c]) / temperature for c in valid]
    total -= _log_softmax(logits)[valid.index(y)]
  return float(total / B)


def ref_symmetric_cross_entropy(logits, labels, *, alpha=0.1, beta=1.0):
  """Symmetric cross-entropy alpha*CE + beta*RCE with clipped p and one-hot q."""
  z = np.asarray(logits, dtype=np.float64)
  B, C = z.shape
  ce = ref_softmax_cross_entropy(z, labels)
  rce = 0.0
  for b in range(B):
    p = _softmax(z[b])
    y = int(labels[b])
    for c in range(C):
      pc = min(max(p[c], 1e-7), 1.0)
      qc = min(max(1.0 if c == y else 0.0, 1e-4), 1.0)
      rce -= pc * math.log(qc)
  return float(alpha * ce + beta * rce / B)


def ref_consensus_l1_loss(logits, consensus_logits):
  """Consensus L1: mean over all entries of |z - z_consensus|."""
  a = np.asarray(logits, dtype=np.float64)
  c = np.asarray(consensus_logits, dtype=np.float64)
  B, C = a.shape
  total = 0.0
  for b in range(B):
    for k in range(C):
      total += abs(a[b, k] - c[b, k])
  return float(total / (B * C))


def ref_ensemble_distillation_loss(student_logits, client_logits, *, temperature=1.0):
  """Ensemble distillation: KD to the mean of the K client logits."""
  cl = np.asarray(client_logits, dtype=np.float64)
  K, B, C = cl.shape
  teacher = np.zeros((B, C), dtype=np.float64)
  for b in range(B):
    for c in range(C):
      s = 0.0
      for k in range(K):
        s += cl[k, b, c]
      teacher[b, c] = s / K
  return ref_kd_loss(student_logits, teacher, temperature=temperature)


# ----------------------------------------------------------------------------- smoke test

if __name__ == "__main__":
  rng = np.random.default_rng(0)
  B, C, D = 8, 5, 4
  z = rng.normal(size=(B, C))
  z2 = rng.normal(size=(B, C))
  t = rng.normal(size=(B, C))
  y = rng.integers(0, C, size=B)
  h = rng.normal(size=(B, D))

  results = {}
  results["cross_correlation_matrix"] = ref_cross_correlation_matrix(z, z2)
  results["cross_correlation_loss"] = ref_cross_correlation_loss(z, z2)
  S = ref_instance_similarity_matrix(h)
  S2 = ref_instance_similarity_matrix(rng.normal(size=(B, D)))
  results["instance_similarity_matrix"] = S
  results["instance_similarity_loss"] = ref_instance_similarity_loss(S, S2)
  results["kd_loss"] = ref_kd_loss(z, t, temperature=2.0)
  results["ntd_loss"] = ref_non_target_distillation_loss(z, t, y, temperature=2.0)
  results["ntd_loss_renorm"] = ref_non_target_distillation_loss(z, t, y, temperature=2.0, renormalize=True)
  results["dual_domain"] = ref_dual_domain_distillation_loss(z, t, z2, temperature=2.0)
  results["softmax_ce"] = ref_softmax_cross_entropy(z, y)
  results["gcl"] = ref_gradient_compensation_loss(z, y, num_old_classes=2)
  results["gcl_first"] = ref_gradient_compensation_loss(z, y, num_old_classes=0)
  results["relation"] = ref_relation_distillation_loss(z, y, t[:, :3])
  results["entropy"] = ref_mean_prediction_entropy(z, mask=(y % 2 == 0).astype(float))
  W = rng.normal(size=(D, C))
  bias = rng.normal(size=(C,))
  noise = rng.normal(size=(B, D))
  var = rng.uniform(0.1, 1.0, size=(B, D))
  results["proto_perturb_bce"] = ref_prototype_perturbation_loss(h, y, noise, var, W, bias)
  results["proto_perturb_ce"] = ref_prototype_perturbation_loss(h, y, noise, var, W, bias, kind='ce')
  grads = [rng.normal(size=(D, C)), rng.normal(size=(C,))]
  tgrads = [rng.normal(size=(D, C)), rng.normal(size=(C,))]
  results["grad_match"] = ref_gradient_matching_loss(grads, tgrads)
  results["infer_label"] = ref_infer_label_from_gradient(grads[0])
  x1 = rng.normal(size=(6, D))
  x2 = rng.normal(size=(7, D)) + 0.5
  results["gauss_kernel"] = ref_gaussian_kernel_matrix(x1, x2, bandwidths=(0.5, 1.0, 2.0))
  results["mk_mmd"] = ref_mk_mmd_squared(x1, x2)
  results["two_stream"] = ref_two_stream_l2_loss(z, t)
  results["proximal"] = ref_proximal_term(grads, tgrads)
  prev = rng.normal(size=(2, B, D))
  results["moon"] = ref_model_contrastive_loss(h, rng.normal(size=(B, D)), prev)
  cmask = np.array([True, False, True, True, False])
  results["restricted_logits"] = ref_restricted_softmax_logits(z, cmask)
  protos = rng.normal(size=(C, D))
  results["proto_contrastive"] = ref_prototype_contrastive_loss(h, y, protos, cmask, temperature=0.5)
  results["sce"] = ref_symmetric_cross_entropy(z, y)
  results["consensus_l1"] = ref_consensus_l1_loss(z, t)
  results["ensemble_kd"] = ref_ensemble_distillation_loss(z, rng.normal(size=(3, B, C)), temperature=2.0)
  for k, v in results.items():
    print(f"{k}: {v}")

  # (a) self cross-correlation with population std and eps=0 has M_uu == 1 -> zero diagonal term.
  za = rng.normal(size=(8, 3))
  Ma = ref_cross_correlation_matrix(za, za, eps=0.0, unbiased_std=False)
  off = 0.0
  for u in range(3):
    assert abs(Ma[u, u] - 1.0) < 1e-12, Ma[u, u]
    for v in range(3):
      if u != v:
        off += (1.0 + Ma[u, v]) ** 2
  la = ref_cross_correlation_loss(za, za, unbiased_std=False, eps=0.0)
  assert abs(la - 0.0051 * off) < 1e-12, (la, 0.0051 * off)

  # (b) MK-MMD^2 of a sample with itself is zero.
  assert abs(ref_mk_mmd_squared(x1, x1)) < 1e-12

  print("all smoke checks passed")

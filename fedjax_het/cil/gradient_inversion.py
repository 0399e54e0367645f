"""GLFC's prototype gradient communication (Sec. 4.2, Eq. 8-11).

Client side, when a new task is detected:
  * `select_prototype(features, mask)`: per new class, the image whose
    feature is nearest the class mean.
  * `class_feature_variance(features, mask)`: sigma^2 of Eq. 10.
  * `perturb_prototype(model, variables, image, label, key, ...)`: Eq. 10-11,
    a few SGD steps on the image under the prototype perturbation loss.
  * `prototype_gradient(encoder, encoder_variables, image, label)`: the
    gradient the client shares: grad_W CE(Gamma(x), y) of the fixed LeNet
    gradient encoder Gamma at the perturbed prototype.
Proxy server side:
  * `infer_label(gradients)`: the label from the sign of the last layer.
  * `reconstruct(encoder, encoder_variables, target_gradients, label, key)`
    and `reconstruct_batch`: gradient matching (Eq. 8-9) from a N(0, 1)
    dummy image with L-BFGS.
  * `to_uint8(images)`: reconstructions as uint8 images (for the monitor set).

Pixel space. As in the authors' code, the prototype handed to the encoder,
the dummy image and the reconstructions live in the unnormalised [0, 1]
space of torchvision's `ToTensor` (float32 (H, W, C) = uint8 / 255), not in
the dataset-normalised space the classifiers are trained in; the N(0, 1)
dummy is drawn in that space. The reconstructions may leave [0, 1];
`to_uint8` clips and rounds them (the code's `ToPILImage` wraps
out-of-range values modulo 256 instead). What the local model sees during
the perturbation is `preprocess(x)` (default: x itself, the code; see
`perturb_prototype`).

References:
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022,
    Sec. 4.2, Eq. 8-11; conditionWang/FCIL src/GLFC.py (`prototype_mask`),
    src/ProxyServer.py (`gradient2label`, `reconstruction`).
  [DLG] L. Zhu, Z. Liu, S. Han. Deep Leakage from Gradients. NeurIPS 2019.
  [iDLG] B. Zhao, K. R. Mopuri, H. Bilen. iDLG: Improved Deep Leakage from
    Gradients. arXiv:2001.02610, 2020.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_het import losses
from fedjax_het.models import apply_model

#: GLFC's client perturbation: 50 SGD steps, lr = local lr / 10 = 0.2, weight decay 1e-5.
PERTURBATION_STEPS = 50
PERTURBATION_LEARNING_RATE = 0.2
PERTURBATION_WEIGHT_DECAY = 1e-5
#: L-BFGS iterations of the proxy server's reconstruction. The GLFC code calls torch's
#: `LBFGS.step` 250 times, up to 20 iterations each (up to 5000); one step here is one
#: iteration, and 2000 reach 35-48 dB on a clean gradient where 250 stay near noise.
RECONSTRUCTION_STEPS = 2000
LBFGS_MEMORY_SIZE = 100

Params = Any


def _normalize_rows(features: jax.Array) -> jax.Array:
  norm = jnp.sqrt(jnp.sum(jnp.square(features), axis=-1, keepdims=True))
  return features / jnp.maximum(norm, 1e-12)


def _check_features(fn: str, features: jax.Array, mask: jax.Array | None) -> jax.Array:
  if jnp.ndim(features) != 2:
    raise ValueError(f"{fn}: `features` must have shape (n, feature_dim), got "
                     f"{jnp.shape(features)}.")
  n = features.shape[0]
  mask = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
  if mask.shape != (n,):
    raise ValueError(f"{fn}: `mask` must have shape (n,) = ({n},), got {mask.shape}.")
  return mask


def select_prototype(features: jax.Array, mask: jax.Array | None = None, *,
                     normalize: bool = True) -> jax.Array:
  """Index of the class's prototype: the row nearest the class mean (GLFC Sec. 4.2).

  As the code (`prototype_mask` via `compute_class_mean`): the rows are
  L2-normalised, the mean of the normalised valid rows is taken (not
  re-normalised), and the prototype minimises the Euclidean distance to it.

  Args:
    features: (n, d) features of one class's images under the current local
      model (eval mode, normalised inputs).
    mask: optional (n,) bool validity of the rows (padding never selected).
    normalize: L2-normalise the rows first (default True, the code).

  Returns:
    Scalar int32 row index (0 if no row is valid).
  """
  mask = _check_features("select_prototype", features, mask)
  f = jnp.asarray(features, jnp.float32)
  if normalize:
    f = _normalize_rows(f)
  mean = jnp.sum(jnp.where(mask[:, None], f, 0.0), axis=0) / jnp.maximum(jnp.sum(mask), 1)
  dist = jnp.sqrt(jnp.sum(jnp.square(mean[None, :] - f), axis=-1))
  return jnp.argmin(jnp.where(mask, dist, jnp.inf)).astype(jnp.int32)


def class_feature_variance(features: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """sigma^2 of GLFC Eq. 10: per-dimension variance of the class's features.

  The paper: "the variance of features of all samples belonging to" the
  class; the population variance (ddof 0) over the valid rows of the raw
  (un-normalised) features Phi(x), the space the noise is added in.

  Args:
    features: (n, d) features Phi(x) of the class's images.
    mask: optional (n,) bool validity of the rows.

  Returns:
    (d,) variances.
  """
  mask = _check_features("class_feature_variance", features, mask)
  f = jnp.asarray(features, jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1)
  mean = jnp.sum(jnp.where(mask[:, None], f, 0.0), axis=0) / count
  return jnp.sum(jnp.where(mask[:, None], jnp.square(f - mean[None, :]), 0.0), axis=0) / count


def _check_image(fn: str, image: jax.Array) -> None:
  if jnp.ndim(image) != 3:
    raise ValueError(f"{fn}: `image` must be one image of shape (H, W, C), got shape "
                     f"{jnp.shape(image)}; vmap over a batch.")


def perturb_prototype(model: nn.Module, variables: dict[str, Any], image: jax.Array,
                      label: int | jax.Array, key: jax.Array, *,
                      feature_variance: jax.Array, steps: int = PERTURBATION_STEPS,
                      learning_rate: float = PERTURBATION_LEARNING_RATE,
                      weight_decay: float = PERTURBATION_WEIGHT_DECAY,
                      gamma: float = losses.PROTOTYPE_NOISE_SCALE, kind: str = "bce",
                      preprocess: Callable[[jax.Array], jax.Array] | None = None,
                      class_mask: jax.Array | None = None
                      ) -> tuple[jax.Array, jax.Array]:
  """Perturbed prototype sample, GLFC Eq. 10-11.

  What is perturbed: the prototype IMAGE x (pixels, the [0, 1] space of the
  module docstring), by `steps` SGD steps x <- x - lr (dL_GP/dx + wd x)
  (torch SGD with weight decay, the code). The Gaussian noise lives in
  FEATURE space only: L_GP = `prototype_perturbation_loss` of the local
  model's head on Phi(preprocess(x)) + gamma * sqrt(sigma^2) * eps, eps ~
  N(0, I); a fresh eps is drawn at every step, eps_s =
  `jax.random.normal(jax.random.fold_in(key, s), (feature_dim,))`. The
  model and the noise are not perturbed, and the returned image is not
  clipped (the code sends the unclipped image to the encoder).

  The model runs in eval mode (BatchNorm running statistics), as the code's
  `proto_model`; its head spans the classes seen so far (the BCE target is
  one-hot over them).

  Deviations from the authors' code: the code has no feature noise at all
  (plain BCE of the model on x; `gamma=0` reproduces it); the paper's Eq. 10
  adds it (default gamma = 0.1). The code feeds the unnormalised ToTensor
  image to a model trained on normalised images; `preprocess` (e.g. the
  dataset normalisation) makes the two consistent, None keeps the code's
  behaviour.

  Args:
    model: the local classification model (a zoo `Classifier`).
    variables: its variables; `variables["params"]["head"]` is the linear
      head (kernel (d, C), bias (C,)).
    image: (H, W, C) float32 prototype in [0, 1].
    label: its class.
    key: PRNG key of the feature noise.
    feature_variance: (d,) sigma^2 of the class (`class_feature_variance`).
    steps, learning_rate, weight_decay: SGD on the image (50, 0.2, 1e-5).
    gamma: noise scale (0.1).
    kind: 'bce' (the code) or 'ce' (the paper's D_CE); see
      `prototype_perturbation_loss`.
    preprocess: maps a (1, H, W, C) batch in [0, 1] to the model's input.
    class_mask: optional (C,) bool seen classes of a fixed-size head (the
      loss spans them only; `prototype_perturbation_loss`).

  Returns:
    (perturbed image (H, W, C), losses (steps,)): L_GP before each step.
  """
  fn = "perturb_prototype"
  _check_image(fn, image)
  if int(steps) < 0:
    raise ValueError(f"{fn}: `steps` must be a non-negative int, got {steps!r}.")
  head = variables["params"]["head"]
  feature_dim = head["kernel"].shape[0]
  feature_variance = jnp.asarray(feature_variance, jnp.float32)
  if feature_variance.shape != (feature_dim,):
    raise ValueError(f"{fn}: `feature_variance` must have shape (feature_dim,) = "
                     f"({feature_dim},), got {feature_variance.shape}.")
  labels = jnp.reshape(jnp.asarray(label, jnp.int32), (1,))
  prep = (lambda x: x) if preprocess is None else preprocess

  def objective(x, noise):
    features, _, _ = apply_model(model, variables, prep(x[None]), train=False)
    return losses.prototype_perturbation_loss(
        features=features, labels=labels, noise=noise[None],
        feature_variance=feature_variance[None], kernel=head["kernel"], bias=head["bias"],
        gamma=gamma, kind=kind, class_mask=class_mask)

  def step(x, s):
    noise = jax.random.normal(jax.random.fold_in(key, s), (feature_dim,), jnp.float32)
    value, grad = jax.value_and_grad(objective)(x, noise)
    return x - learning_rate * (grad + weight_decay * x), value

  return jax.lax.scan(step, jnp.asarray(image, jnp.float32), jnp.arange(int(steps)))


def prototype_gradient(encoder: nn.Module, encoder_variables: dict[str, Any],
                       image: jax.Array, label: int | jax.Array) -> Params:
  """The gradient a client shares: grad_W CE(Gamma(x), y) (GLFC Sec. 4.2).

  Softmax cross-entropy of the gradient encoder Gamma (GLFC: the fixed
  LeNet, `get_model("lenet_encoder", 100)`) on the single image x with label
  y, differentiated with respect to all of Gamma's parameters.

  Args:
    encoder: the gradient encoder.
    encoder_variables: its variables ({"params", "batch_stats"}).
    image: (H, W, C) float32 in the [0, 1] pixel space (the perturbed
      prototype; the dummy image on the server).
    label: its class (0 <= label < the encoder's outputs).

  Returns:
    A pytree shaped like `encoder_variables["params"]`.
  """
  _check_image("prototype_gradient", image)
  labels = jnp.reshape(jnp.asarray(label, jnp.int32), (1,))

  def loss(params):
    _, logits, _ = apply_model(encoder, {**encoder_variables, "params": params},
                               jnp.asarray(image, jnp.float32)[None], train=False)
    return losses.softmax_cross_entropy(logits=logits, labels=labels)

  return jax.grad(loss)(encoder_variables["params"])


def infer_label(gradients: Params) -> jax.Array:
  """Label of a shared encoder gradient (iDLG; GLFC `gradient2label`).

  `infer_label_from_last_layer_gradient` on the encoder head's kernel
  gradient: the class whose kernel column sums to the most negative value
  (the encoder's sigmoid features are positive, so only the true class's
  column (p_y - 1) h is negative). It fails only when the encoder is
  saturated on the image (p_y = 1 in float32, every column ~0).

  Args:
    gradients: a `prototype_gradient` tree (or {"params": tree}); a leading
      batch axis on every leaf gives one label per gradient.

  Returns:
    int32 label, () or (batch,).
  """
  tree = gradients.get("params", gradients) if isinstance(gradients, dict) else gradients
  try:
    kernel = tree["head"]["kernel"]
  except (KeyError, TypeError) as error:
    raise ValueError("infer_label: `gradients` must be an encoder gradient tree with a "
                     "['head']['kernel'] leaf (a `prototype_gradient` result).") from error
  one = lambda k: losses.infer_label_from_last_layer_gradient(kernel_gradient=k)  # noqa: E731
  if jnp.ndim(kernel) == 3:
    return jax.vmap(one)(kernel)
  return one(kernel)


def reconstruct(encoder: nn.Module, encoder_variables: dict[str, Any], target_gradients: Params,
                label: int | jax.Array, key: jax.Array, *, steps: int = RECONSTRUCTION_STEPS,
                image_shape: Sequence[int] = (32, 32, 3), keep_last: int = 1,
                learning_rate: float | None = None, memory_size: int = LBFGS_MEMORY_SIZE,
                linesearch: str = "zoom", max_linesearch_steps: int = 15,
                init: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Proxy-server reconstruction by gradient matching, GLFC Eq. 8-9.

  Starts from a dummy image x ~ N(0, 1) (the [0, 1] pixel space of the
  module docstring) and minimises L_RT(x) = `gradient_matching_loss`(
  `prototype_gradient`(encoder, x, label), target_gradients) over x with
  `optax.lbfgs`, `steps` iterations in a `lax.scan` (jit- and vmap-safe).

  Differences from the code's `torch.optim.LBFGS(lr=0.1)` with 250 calls of
  `step(closure)`: torch runs up to 20 L-BFGS iterations per call (max_iter
  default, so up to 5000 iterations, each with ONE gradient evaluation) with
  a fixed step length lr = 0.1 (the first scaled by min(1, 1/|g|_1)), no
  line search, and stops early at max|g| <= 1e-7 or a change below 1e-9.
  Here one step is one L-BFGS iteration; with `linesearch="zoom"` (default)
  optax's zoom line search (strong Wolfe conditions, up to
  `max_linesearch_steps` evaluations) chooses the step length and
  `learning_rate` (None: 1) multiplies it; `linesearch="none"` takes the
  fixed step `learning_rate` like torch (0.1 is the code's). Both use the
  initial inverse-Hessian scaling s'y / y'y of the last pair (as torch) and
  no early stopping; history `memory_size` = 100 pairs, torch's default.
  250 steps here would be far fewer iterations than the code's (up to
  5000); the default is 2000. Measured on the GLFC LeNet (100 classes) with a uniform-noise
  32x32 image and its clean gradient, zoom: ~1 dB after 100 iterations,
  ~21 dB after 1000, 35-48 dB after 2000; fixed step 1.0: ~47 dB after 2000;
  fixed step 0.1 (torch's): ~30 dB after 2000. The code keeps the last 20
  iterates as 20 augmented samples per gradient (`keep_last=20`).

  Args:
    encoder, encoder_variables: the gradient encoder (as the clients').
    target_gradients: the received gradient (a `prototype_gradient` tree).
    label: the label (from `infer_label`).
    key: PRNG key of the dummy image.
    steps: L-BFGS iterations (static, >= keep_last).
    image_shape: (H, W, C) of the dummy.
    keep_last: how many final iterates to return (static).
    learning_rate, memory_size: optax.lbfgs settings (None: 1 with the zoom
      line search; a float is required with `linesearch="none"`).
    linesearch: "zoom" (optax's zoom line search) or "none" (fixed step).
    max_linesearch_steps: evaluations per zoom line search.
    init: optional (H, W, C) start instead of the N(0, 1) draw.

  Returns:
    (images (keep_last, H, W, C): the last iterates, the final one last;
    losses (steps,): L_RT after each iteration).
  """
  fn = "reconstruct"
  steps, keep_last = int(steps), int(keep_last)
  if keep_last < 1 or steps < keep_last:
    raise ValueError(f"{fn}: need 1 <= `keep_last` <= `steps`, got keep_last={keep_last}, "
                     f"steps={steps}.")
  image_shape = tuple(int(s) for s in image_shape)
  x0 = jax.random.normal(key, image_shape, jnp.float32) if init is None else jnp.asarray(
      init, jnp.float32)
  if x0.shape != image_shape:
    raise ValueError(f"{fn}: `init` must have shape {image_shape}, got {x0.shape}.")

  def objective(x):
    return losses.gradient_matching_loss(
        gradients=prototype_gradient(encoder, encoder_variables, x, label),
        target_gradients=target_gradients)

  if linesearch == "zoom":
    search = optax.scale_by_zoom_linesearch(max_linesearch_steps=int(max_linesearch_steps),
                                            initial_guess_strategy="one")
  elif linesearch == "none":
    if learning_rate is None:
      raise ValueError(f"{fn}: `linesearch='none'` needs a float `learning_rate` (the "
                       f"code's is 0.1), got None.")
    search = None
  else:
    raise ValueError(f"{fn}: `linesearch` must be one of 'zoom', 'none', got {linesearch!r}.")
  opt = optax.lbfgs(learning_rate=learning_rate, memory_size=int(memory_size),
                    linesearch=search)
  if search is None:
    value_and_grad = lambda x, state: jax.value_and_grad(objective)(x)  # noqa: E731
  else:  # reuses the value and gradient the line search computed at the new point
    value_and_grad = optax.value_and_grad_from_state(objective)
  first_kept = steps - keep_last

  def step(carry, k):
    x, state, kept = carry
    value, grad = value_and_grad(x, state=state)
    updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=objective)
    x = optax.apply_updates(x, updates)
    # The last `keep_last` iterates go to a fixed buffer: a single scan (the
    # objective is compiled once), nothing stacked over all `steps`.
    slot = jnp.clip(k - first_kept, 0, keep_last - 1)
    kept = jnp.where(k >= first_kept, kept.at[slot].set(x), kept)
    after = value if search is None else optax.tree_utils.tree_get(state, "value")
    return (x, state, kept), after

  kept = jnp.zeros((keep_last,) + image_shape, jnp.float32)
  (x, _, images), history = jax.lax.scan(step, (x0, opt.init(x0), kept),
                                         jnp.arange(steps, dtype=jnp.int32))
  if search is None:  # the scan saw L_RT before each step; shift to "after"
    history = jnp.concatenate([history[1:], objective(x)[None]])
  return images, history


def reconstruct_batch(encoder: nn.Module, encoder_variables: dict[str, Any],
                      target_gradients: Params, labels: jax.Array, key: jax.Array,
                      **kwargs: Any) -> tuple[jax.Array, jax.Array]:
  """`reconstruct` vmapped over a pool of N gradients (leading axis on every leaf).

  Args:
    encoder, encoder_variables: the gradient encoder.
    target_gradients: gradient trees stacked on a leading axis N.
    labels: (N,) labels (`infer_label(target_gradients)`).
    key: split into N dummy-image keys.
    **kwargs: static `reconstruct` options (steps, keep_last, ...).

  Returns:
    (images (N, keep_last, H, W, C), losses (N, steps)).
  """
  labels = jnp.asarray(labels, jnp.int32)
  if labels.ndim != 1:
    raise ValueError(f"reconstruct_batch: `labels` must have shape (N,), got {labels.shape}.")
  keys = jax.random.split(key, labels.shape[0])
  return jax.vmap(lambda g, y, k: reconstruct(encoder, encoder_variables, g, y, k, **kwargs))(
      target_gradients, labels, keys)


def reconstruct_used(encoder: nn.Module, encoder_variables: dict[str, Any],
                     target_gradients: Params, labels: jax.Array, use: jax.Array,
                     key: jax.Array, *, chunk: int, **kwargs: Any
                     ) -> tuple[jax.Array, jax.Array]:
  """`reconstruct_batch` over the slots of a pool that `use` marks, `chunk` slots at a time.

  The used slots are taken in pool order, `chunk` at a time, each group vmapped, in a loop of
  ceil(sum(use) / chunk) iterations: the cost follows the number of used gradients, where
  `reconstruct_batch` always reconstructs the whole pool (on a 2-core CPU, where a slot costs
  about the same alone or batched, 6 used slots of a pool of 60 cost a tenth of the whole pool:
  `benchmarks/results/proxy_reconstruction__glfc_mid_pool__cpu2.json`).
  Slot i draws its dummy from the same key as in `reconstruct_batch` (the i-th of
  `jax.random.split(key, N)`), so a used slot's reconstruction is `reconstruct_batch`'s up to
  the float rounding of a differently batched program.

  Args:
    encoder, encoder_variables: the gradient encoder.
    target_gradients: gradient trees stacked on a leading axis N.
    labels: (N,) labels; use: (N,) bool, the slots to reconstruct.
    key: split into N dummy-image keys.
    chunk: slots per vmapped group (static, >= 1).
    **kwargs: static `reconstruct` options (steps, keep_last, image_shape, ...).

  Returns:
    (images (N, keep_last, H, W, C), losses (N, steps)); zeros at the slots not used (and,
    in the last group, at most chunk - 1 unused slots may hold a reconstruction instead).
  """
  labels = jnp.asarray(labels, jnp.int32)
  use = jnp.asarray(use, bool)
  if labels.ndim != 1 or use.shape != labels.shape:
    raise ValueError(f"reconstruct_used: `labels` and `use` must have the same shape (N,), "
                     f"got {labels.shape} and {use.shape}.")
  chunk = int(chunk)
  if chunk < 1:
    raise ValueError(f"reconstruct_used: `chunk` must be an integer >= 1, got {chunk}.")
  n = labels.shape[0]
  keys = jax.random.split(key, n)
  groups = -(-n // chunk)
  # Used slots first, in pool order; padded with n (out of range: gathered clipped, dropped
  # on the scatter back).
  order = jnp.concatenate([jnp.argsort(~use, stable=True).astype(jnp.int32),
                           jnp.full((groups * chunk - n,), n, jnp.int32)])
  one = lambda g, y, k: reconstruct(encoder, encoder_variables, g, y, k, **kwargs)  # noqa: E731
  shapes = jax.eval_shape(jax.vmap(one), jax.tree_util.tree_map(lambda x: x[:1],
                                                                  target_gradients),
                          labels[:1], keys[:1])
  images = jnp.zeros((n,) + shapes[0].shape[1:], shapes[0].dtype)
  losses = jnp.zeros((n,) + shapes[1].shape[1:], shapes[1].dtype)

  def group(i, carry):
    images, losses = carry
    slots = jax.lax.dynamic_slice(order, (i * chunk,), (chunk,))
    take = lambda x: jnp.take(x, slots, axis=0, mode="clip")  # noqa: E731
    got_images, got_losses = jax.vmap(one)(jax.tree_util.tree_map(take, target_gradients),
                                           take(labels), take(keys))
    return (images.at[slots].set(got_images, mode="drop"),
            losses.at[slots].set(got_losses, mode="drop"))

  used_groups = -(-jnp.sum(use).astype(jnp.int32) // chunk)
  return jax.lax.fori_loop(0, used_groups, group, (images, losses))


def to_uint8(images: jax.Array) -> jax.Array:
  """[0, 1] float images -> uint8 round(255 x), clipped to [0, 255].

  The code's `ToPILImage` computes `(255 x).byte()` (truncation, and values
  outside [0, 1] wrap around); clipping and rounding is the sane version.
  """
  return jnp.clip(jnp.round(jnp.asarray(images, jnp.float32) * 255.0), 0, 255).astype(jnp.uint8)

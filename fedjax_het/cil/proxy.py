"""GLFC's proxy server in training: prototype gradients, reconstruction, best-old-model choice.

GLFC [Sec. 4.2, Eq. 8-12; Alg. 1] hands each client an OLD model for the
relation distillation L_RD, chosen by a proxy server S_P that never sees
client data:

  1. Client side (`client_prototype_gradients`): a sampled client that
     signals a task transition (GLFC: detected new classes) picks, for each
     class of its current data, the prototype image whose L2-normalised
     feature is nearest the class mean under its TRAINED local model
     (`gradient_inversion.select_prototype`), perturbs it by Eq. 10-11
     (`perturb_prototype`: SGD on the image under L_GP with Gaussian feature
     noise gamma * N(0, sigma^2)) and shares only the gradient of the fixed,
     untrained LeNet encoder Gamma at the perturbed image
     (`prototype_gradient`).
  2. Proxy side (`server_update`): with `glfc.proxy.shuffle_gradients` (see
     "The gradient pool's order" below) the proxy first shuffles the round's
     received gradients (`shuffle_pool`). When the round's pool of gradients is not
     empty (`glfc.proxy.rebuild = "any_gradients"`, the code; or, with
     "new_classes", the paper's text: when it holds gradients of classes the
     proxy has never reconstructed, and from those only), it infers each label from the sign of the last-layer gradient
     (`infer_label`), reconstructs each prototype by gradient matching with
     L-BFGS from a N(0, 1) dummy (Eq. 8-9, `reconstruct_batch`, vmapped over
     the pool) and keeps the last `monitor_images` iterates of every
     reconstruction as uint8 images: the MONITOR SET (it replaces the
     previous one). At that moment the best model so far becomes the
     "previous" best Theta_{t-1} and the best accuracy restarts.
     Every round it measures the new global model's accuracy on the monitor
     set (predictions over the seen classes) and keeps the model as the
     "current" best Theta_t when the accuracy is at least the best so far.
  3. At the next rounds (task t >= 1) the proxy sends (Theta_{t-1}, Theta_t):
     a client that signals a transition distils from Theta_t, the others from
     Theta_{t-1} [GLFC Sec. 4.2, "Selection of The Best Old Model"; the code's
     `model_back` and `GLFC.train`].

The gradient pool's order (`glfc.proxy.shuffle_gradients`): GLFC Sec. 4.2:
"S_P randomly shuffles all received gradients from selected clients of this
global round to construct a gradient pool ... This shuffling operation
prevents S_P from tracking certain selected clients by remarking special
gradient distributions". Unshuffled, the pool is laid out client by client
(slot i * S + j: the j-th class slot of the i-th sampled client, clients in
ascending id), so a slot's position names the client that sent it. With
`shuffle_gradients = True`, `server_update` first permutes the pool (the
gradients, their validity and the diagnostic true labels alike) by a
uniformly random permutation drawn from its round key (`shuffle_pool`), and
everything after it (label inference, which gradients are used, the
reconstructions, the monitor set) sees only the shuffled pool. The
permutation is not kept in the proxy's state. Numbers: every gradient's
label, whether it is used, and the monitor accuracy as a function of the
monitor SET are order-invariant, but the N(0, 1) dummy images are drawn per
pool slot (`gradient_inversion.reconstruct_batch` splits the key by slot),
so a shuffled pool pairs each gradient with another dummy draw: the same
distribution, other reconstructions and other monitor accuracies. The
default is therefore False (the recorded and pinned runs; the authors' code
does not shuffle: `ProxyServer.reconstruction` walks `pool_grad` label by label
in arrival order); True is the paper's privacy protocol.

How the reconstructions are computed (the same function either way, to float32 rounding):
`glfc.proxy.reconstruction_chunk` = 0 (default, the recorded runs) reconstructs every slot of
the pool in one vmapped program, the empty slots too, so a round costs the whole pool whenever
one gradient arrives; k > 0 reconstructs the slots in use only, k at a time
(`gradient_inversion.reconstruct_used`), so the cost follows the gradients received (each slot
keeps its dummy draw; the slots not in use hold zeros, masked out of the monitor set either
way). `glfc.proxy.encoder_conv_impl` ("xla" default; see `models.CONV_IMPLS`) computes the
encoder's convolutions, whose second-order gradient every iteration takes; on a CPU "im2col"
avoids XLA:CPU's slow vmapped convolution gradients. The mid configs use k = 6 and "im2col"
(`benchmarks/proxy_reconstruction.py` measures both against the whole pool).

State (`ProxyState`): the encoder's variables (fixed; drawn once from the run
key with the encoder's U(-0.5, 0.5) init), the two best models with their
existence flags, the best accuracy, and the monitor set (fixed size: pool
slots x monitor_images uint8 images + labels + validity) so that the round
compiles once and checkpoints exactly.

Deviations from the authors' code (conditionWang/FCIL, `ProxyServer.py`,
`GLFC.py:prototype_mask`):
  * The best accuracy restarts at every new monitor set (the code resets a
    `last_perf` it never reads, so its `best_perf` keeps the maximum over
    all earlier monitor sets and a later task's model can stay unselected;
    the paper selects "the best Theta_t ... until receiving gradients of new
    classes from the next task").
  * Relation distillation starts at task t >= 1 (paper: "starting from the
    second task"); the code's clients also distil in the first task from the
    proxy's model, over all current classes.
  * The perturbation adds the paper's feature noise (gamma = 0.1, Eq. 10;
    the code has none: `glfc.proxy.noise_gamma = 0` reproduces it), feeds
    the local model dataset-normalised images (the code feeds the
    unnormalised [0, 1] image to a model trained on normalised ones) and
    averages its BCE over the seen classes of the fixed-size head.
  * L-BFGS: optax's, `reconstruction_steps` = 2000 iterations at a fixed
    step 1.0 (the code: torch's LBFGS, 250 calls of up to 20 iterations at a
    fixed step 0.1; see `gradient_inversion.reconstruct`). The step 1.0 and no
    line search: one gradient evaluation per iteration. Measured on 9
    CIFAR-100 images (bundle) with a 20-class encoder, 2-core CPU: 1000
    iterations reach 20-27 dB PSNR for 8 of 9 images in 19 s for the 9, where
    300 iterations of the zoom line search stay at 7-11 dB and take 24 s. The monitor
    images are clipped to [0, 1] before quantisation (the code's ToPILImage
    wraps around) and evaluated without augmentation (the code passes the
    training transform: random crop and flip).
  * The monitor accuracy is over every monitor image (the code's loader
    drops the last incomplete batch of 64).
  * The encoder has one output per class of the stream (the code: 100 for
    CIFAR-100, the same there).

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022. Code: conditionWang/FCIL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.cil import gradient_inversion as gi
from fedjax_het.cil import masking
from fedjax_het.losses import glfc as glfc_losses

#: The proxy's encoder: GLFC's 4-layer LeNet (3 sigmoid convs + linear).
ENCODER = "lenet_encoder"
#: Reconstruction iterates kept per gradient as monitor images (the code's `num_image`).
MONITOR_IMAGES = 20
LINESEARCHES = ("zoom", "none")
#: When the proxy rebuilds its monitor set: on any received gradient (the code), or only on
#: gradients of classes it has never reconstructed (the paper's "gradients of new classes").
REBUILDS = ("any_gradients", "new_classes")
PERTURBATION_LOSSES = ("bce", "ce")
#: `server_update` shuffles the pool with `jax.random.fold_in(key, SHUFFLE_KEY_DATA)` (the
#: dummy images use `key` itself, so they do not change with the switch).
SHUFFLE_KEY_DATA = 1


def proxy_section() -> ml_collections.ConfigDict:
  """`config.glfc.proxy`: the proxy server's settings (paper / code values)."""
  return ml_collections.ConfigDict({
      "reconstruction_steps": gi.RECONSTRUCTION_STEPS,   # L-BFGS iterations per gradient
      "linesearch": "none",                              # fixed step (the code's), or "zoom"
      "reconstruction_lr": 1.0,                          # the step (the code's: 0.1)
      "monitor_images": MONITOR_IMAGES,                  # last iterates kept per gradient
      "perturbation_steps": gi.PERTURBATION_STEPS,       # SGD steps on the prototype (50)
      "perturbation_lr": gi.PERTURBATION_LEARNING_RATE,  # 0.2 = the code's local lr / 10
      "noise_gamma": glfc_losses.PROTOTYPE_NOISE_SCALE,  # gamma of Eq. 10 (0: the code)
      "perturbation_loss": "bce",                        # "bce" (code) or "ce" (paper's D_CE)
      "rebuild": "any_gradients",                        # or "new_classes" (paper's text)
      "shuffle_gradients": False,                        # True: shuffle the pool (paper)
      "reconstruction_chunk": 0,                         # 0: the whole pool; k: used, k a time
      "encoder_conv_impl": "xla",                        # the encoder's convolutions
  })


def validate_proxy_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.glfc.proxy`; errors name the field and the allowed values."""
  if "proxy" not in config.glfc:
    v.fail("glfc.proxy", "a section (build it with fedjax_het.cil.proxy.proxy_section())",
           None)
  number = v.finite_number
  v.check(config, "glfc.proxy.reconstruction_steps", v.int_at_least(1), "an integer >= 1")
  v.check(config, "glfc.proxy.linesearch", v.choice(LINESEARCHES), f"one of {LINESEARCHES}")
  v.check(config, "glfc.proxy.reconstruction_lr", lambda x: number(x) and x > 0,
          "a number > 0")
  steps = config.glfc.proxy.reconstruction_steps
  v.check(config, "glfc.proxy.monitor_images",
          lambda x: v.int_at_least(1)(x) and x <= steps,
          f"an integer in [1, glfc.proxy.reconstruction_steps={steps}]")
  v.check(config, "glfc.proxy.perturbation_steps", v.int_at_least(0), "an integer >= 0")
  v.check(config, "glfc.proxy.perturbation_lr", lambda x: number(x) and x >= 0,
          "a number >= 0")
  v.check(config, "glfc.proxy.noise_gamma", lambda x: number(x) and x >= 0, "a number >= 0")
  v.check(config, "glfc.proxy.perturbation_loss", v.choice(PERTURBATION_LOSSES),
          f"one of {PERTURBATION_LOSSES}")
  v.check(config, "glfc.proxy.rebuild", v.choice(REBUILDS), f"one of {REBUILDS}")
  if "shuffle_gradients" in config.glfc.proxy:
    v.check(config, "glfc.proxy.shuffle_gradients", v.is_bool, "True or False")
  if "reconstruction_chunk" in config.glfc.proxy:
    v.check(config, "glfc.proxy.reconstruction_chunk", v.int_at_least(0),
            "an integer >= 0 (0: the whole pool)")
  if "encoder_conv_impl" in config.glfc.proxy:
    v.check(config, "glfc.proxy.encoder_conv_impl", v.choice(models.CONV_IMPLS),
            f"one of {models.CONV_IMPLS}")


@dataclasses.dataclass(frozen=True)
class ProxySettings:
  """The proxy's Python constants (`ProxySettings.from_config(config)`)."""
  reconstruction_steps: int = gi.RECONSTRUCTION_STEPS
  linesearch: str = "none"
  reconstruction_lr: float = 1.0
  monitor_images: int = MONITOR_IMAGES
  perturbation_steps: int = gi.PERTURBATION_STEPS
  perturbation_lr: float = gi.PERTURBATION_LEARNING_RATE
  noise_gamma: float = glfc_losses.PROTOTYPE_NOISE_SCALE
  perturbation_loss: str = "bce"
  rebuild: str = "any_gradients"
  shuffle_gradients: bool = False
  reconstruction_chunk: int = 0
  encoder_conv_impl: str = "xla"

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "ProxySettings":
    p = config.glfc.proxy
    return cls(reconstruction_steps=int(p.reconstruction_steps), linesearch=p.linesearch,
               reconstruction_lr=float(p.reconstruction_lr),
               monitor_images=int(p.monitor_images),
               perturbation_steps=int(p.perturbation_steps),
               perturbation_lr=float(p.perturbation_lr), noise_gamma=float(p.noise_gamma),
               perturbation_loss=p.perturbation_loss, rebuild=p.rebuild,
               shuffle_gradients=bool(p.get("shuffle_gradients", False)),
               reconstruction_chunk=int(p.get("reconstruction_chunk", 0)),
               encoder_conv_impl=p.get("encoder_conv_impl", "xla"))


class ProxyState(NamedTuple):
  """What the proxy server keeps between rounds (module docstring)."""
  encoder: Any              # the LeNet encoder's variables (fixed)
  previous: Any             # Theta_{t-1}: the best model before the latest monitor set
  current: Any              # Theta_t: the best model on the latest monitor set
  has_previous: jax.Array   # () bool
  has_current: jax.Array    # () bool
  best_accuracy: jax.Array  # () float32 on the current monitor set (-1: none yet)
  monitor_images: jax.Array  # (P * R, H, W, C) uint8
  monitor_labels: jax.Array  # (P * R,) int32 (inferred labels)
  monitor_valid: jax.Array   # (P * R,) bool
  known: jax.Array           # (C,) bool: classes reconstructed so far (inferred labels)


def make_encoder(num_classes: int, image_size: int = 32, conv_impl: str = "xla") -> Any:
  """The gradient encoder Gamma: GLFC's LeNet with one output per class, for the stream's side
  (`conv_impl`: how its convolutions are computed, `glfc.proxy.encoder_conv_impl`)."""
  return models.get_model(ENCODER, num_classes, image_size=int(image_size),
                          conv_impl=conv_impl)


def init_proxy_state(key: jax.Array, encoder: Any, model_variables: Any, pool_size: int,
                     proxy: ProxySettings, image_shape: tuple[int, ...],
                     num_classes: int) -> ProxyState:
  """An empty proxy: a freshly drawn fixed encoder, no best model, an empty monitor set."""
  size = pool_size * proxy.monitor_images
  return ProxyState(
      encoder=models.init_variables(encoder, key, input_shape=(1,) + tuple(image_shape)),
      previous=model_variables,
      current=model_variables, has_previous=jnp.asarray(False),
      has_current=jnp.asarray(False), best_accuracy=jnp.asarray(-1.0, jnp.float32),
      monitor_images=jnp.zeros((size,) + tuple(image_shape), jnp.uint8),
      monitor_labels=jnp.zeros((size,), jnp.int32), monitor_valid=jnp.zeros((size,), bool),
      known=jnp.zeros((num_classes,), bool))


def old_model_for(proxy_state: ProxyState, signal: jax.Array) -> tuple[Any, jax.Array]:
  """The old model a client distils from, and whether it exists (GLFC Sec. 4.2).

  As the code's `GLFC.train`: with a current best, a client that signals a
  transition gets Theta_t (`current`), the others Theta_{t-1} (`previous`);
  before any current best a signalling client gets `previous` (which then
  does not exist either) and the others none.
  """
  use_current = signal & proxy_state.has_current
  variables = jax.tree_util.tree_map(lambda c, p: jnp.where(use_current, c, p),
                                     proxy_state.current, proxy_state.previous)
  exists = jnp.where(use_current, True, proxy_state.has_previous & proxy_state.has_current)
  return variables, exists


def client_prototype_gradients(model: Any, variables: Any, encoder: Any, encoder_variables: Any,
                               *, images: jax.Array, labels: jax.Array, valid: jax.Array,
                               classes: jax.Array, class_mask: jax.Array, key: jax.Array,
                               forward: Callable[..., Any],
                               preprocess: Callable[[jax.Array], jax.Array],
                               proxy: ProxySettings) -> tuple[Any, jax.Array]:
  """One client's shared gradients: one per class of its current data (GLFC Sec. 4.2).

  Args:
    model, variables: the client's trained local model.
    encoder, encoder_variables: the proxy's LeNet encoder.
    images: (n, H, W, C) uint8 current data of the client; `labels` (n,),
      `valid` (n,) bool.
    classes: (S,) int32 the classes to share (-1: an empty slot).
    class_mask: (C,) bool seen classes (the perturbation's BCE spans them).
    key: PRNG key of the feature noise.
    forward: `cil_replay.make_eval_forward(...)`: variables, uint8 images ->
      (features, logits) in eval mode.
    preprocess: the dataset normalisation (float [0, 1] -> model input).
    proxy: the settings.

  Returns:
    (gradients: the encoder's params tree with a leading S axis, valid (S,)
    bool: the slot holds a class with at least one image).
  """
  features, _ = forward(variables, images)

  def one(cls, slot_key):
    rows = valid & (labels == cls) & (cls >= 0)
    index = gi.select_prototype(features, rows)
    variance = gi.class_feature_variance(features, rows)
    image = images[index].astype(jnp.float32) / 255.0
    perturbed, _ = gi.perturb_prototype(
        model, variables, image, jnp.maximum(cls, 0), slot_key, feature_variance=variance,
        steps=proxy.perturbation_steps, learning_rate=proxy.perturbation_lr,
        gamma=proxy.noise_gamma, kind=proxy.perturbation_loss,
        preprocess=lambda x: preprocess(x * 255.0), class_mask=class_mask)
    gradient = gi.prototype_gradient(encoder, encoder_variables, perturbed,
                                     jnp.maximum(cls, 0))
    return gradient, jnp.any(rows)

  keys = jax.random.split(key, classes.shape[0])
  return jax.vmap(one)(classes, keys)


def shuffle_pool(key: jax.Array, gradients: Any, gradient_valid: jax.Array,
                 true_labels: jax.Array) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
  """The round's gradient pool in a uniformly random order (GLFC Sec. 4.2; module docstring).

  Args:
    key: the permutation's PRNG key (drawn from the round's key).
    gradients: the pool, an encoder params tree with a leading P axis.
    gradient_valid: (P,) bool; true_labels: (P,) int32.

  Returns:
    (gradients, gradient_valid, true_labels) permuted alike, and the
    permutation (P,) int32: new slot i holds old slot permutation[i].
  """
  permutation = jax.random.permutation(key, gradient_valid.shape[0]).astype(jnp.int32)
  take = lambda x: jnp.take(x, permutation, axis=0)  # noqa: E731
  return (jax.tree_util.tree_map(take, gradients), take(gradient_valid), take(true_labels),
          permutation)


def monitor_accuracy(logits: jax.Array, labels: jax.Array, valid: jax.Array,
                     class_mask: jax.Array) -> jax.Array:
  """Top-1 accuracy (fraction) over the valid monitor images, seen classes only."""
  correct = (masking.masked_predictions(logits, class_mask) == labels) & valid
  return jnp.sum(correct) / jnp.maximum(jnp.sum(valid), 1)


def server_update(proxy_state: ProxyState, new_global: Any, *, gradients: Any,
                  gradient_valid: jax.Array, true_labels: jax.Array, key: jax.Array,
                  class_mask: jax.Array,
                  encoder: Any, forward: Callable[..., Any], proxy: ProxySettings
                  ) -> tuple[ProxyState, dict[str, jax.Array]]:
  """The proxy's round (module docstring, step 2).

  Args:
    proxy_state: the proxy before the round.
    new_global: the round's aggregated global model.
    gradients: the pool, an encoder params tree with a leading P axis.
    gradient_valid: (P,) bool: the slot holds a shared gradient.
    true_labels: (P,) the classes the clients shared (diagnostics only: the
      proxy infers the labels from the gradients).
    key: PRNG key of the dummy images (and, folded with `SHUFFLE_KEY_DATA`,
      of the pool's shuffle).
    class_mask: (C,) bool seen classes (monitor predictions span them).
    encoder: the LeNet encoder module.
    forward: eval-mode forward of the classification model (uint8 images).
    proxy: the settings.

  Returns:
    (new proxy state, metrics): "proxy/gradients" pool size,
    "proxy/rebuilt_from" gradients the monitor set was rebuilt from (0: kept),
    "proxy/labels_correct" inferred labels equal to the shared classes,
    "proxy/reconstruction_loss" mean
    final L_RT over the pool (0 without gradients), "proxy/monitor_accuracy"
    the new global's accuracy on the monitor set (-1 when it is empty),
    "proxy/selected" whether it became the current best.
  """
  if proxy.shuffle_gradients:  # S_P builds its pool from the gradients in a random order
    gradients, gradient_valid, true_labels, _ = shuffle_pool(
        jax.random.fold_in(key, SHUFFLE_KEY_DATA), gradients, gradient_valid, true_labels)
  received = jnp.sum(gradient_valid).astype(jnp.int32)
  r = proxy.monitor_images
  labels = gi.infer_label(gradients)
  if proxy.rebuild == "new_classes":  # drop gradients of classes already reconstructed
    use = gradient_valid & ~proxy_state.known[labels]
  else:
    use = gradient_valid
  num = jnp.sum(use).astype(jnp.int32)
  num_classes = proxy_state.known.shape[0]
  known = proxy_state.known | jnp.any(
      jax.nn.one_hot(labels, num_classes, dtype=bool) & gradient_valid[:, None], axis=0)

  def rebuild(state):
    options = dict(steps=proxy.reconstruction_steps, keep_last=r,
                   learning_rate=proxy.reconstruction_lr, linesearch=proxy.linesearch,
                   image_shape=tuple(state.monitor_images.shape[1:]))
    if proxy.reconstruction_chunk:  # the used gradients only, k at a time
      images, losses = gi.reconstruct_used(encoder, state.encoder, gradients, labels, use, key,
                                           chunk=proxy.reconstruction_chunk, **options)
    else:  # every slot of the pool, one vmapped program
      images, losses = gi.reconstruct_batch(encoder, state.encoder, gradients, labels, key,
                                            **options)
    monitor = gi.to_uint8(images).reshape((-1,) + images.shape[2:])
    final = jnp.sum(jnp.where(use, losses[:, -1], 0.0)) / jnp.maximum(num, 1)
    return state._replace(
        previous=state.current, has_previous=state.has_current,
        best_accuracy=jnp.asarray(-1.0, jnp.float32), monitor_images=monitor,
        monitor_labels=jnp.repeat(labels, r), monitor_valid=jnp.repeat(use, r)
    ), final.astype(jnp.float32)

  state, final_loss = jax.lax.cond(num > 0, rebuild,
                                   lambda s: (s, jnp.asarray(0.0, jnp.float32)), proxy_state)
  state = state._replace(known=known)
  has_monitor = jnp.any(state.monitor_valid)
  _, logits = forward(new_global, state.monitor_images)
  accuracy = monitor_accuracy(logits, state.monitor_labels, state.monitor_valid, class_mask)
  selected = has_monitor & (accuracy >= state.best_accuracy)
  state = state._replace(
      current=jax.tree_util.tree_map(lambda n, c: jnp.where(selected, n, c), new_global,
                                     state.current),
      has_current=state.has_current | selected,
      best_accuracy=jnp.where(selected, accuracy, state.best_accuracy).astype(jnp.float32))
  metrics = {"proxy/gradients": received, "proxy/rebuilt_from": num,
             "proxy/labels_correct": jnp.sum(gradient_valid & (labels == true_labels)).astype(
                 jnp.int32),
             "proxy/reconstruction_loss": final_loss,
             "proxy/monitor_accuracy": jnp.where(has_monitor, accuracy, -1.0).astype(
                 jnp.float32),
             "proxy/selected": selected}
  return state, metrics

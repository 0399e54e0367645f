"""FedMatch in the heterogeneous FCCL+ benchmark: inter-client consistency and agreement-based
pseudo labels on public data, then private cross-entropy.

Reference: W. Jeong, J. Yoon, E. Yang, S. J. Hwang. Federated Semi-Supervised Learning with
Inter-Client Consistency & Disjoint Learning. ICLR 2021 (arXiv:2006.12097).

FedMatch is a federated semi-supervised method. Its unlabelled-data objective (FedMatch
Sec. 4.1) for a client with model theta_l and H frozen helper models theta_h_1..theta_h_H
(chosen by the server as the clients most similar to it), on an unlabelled example u:

  inter-client consistency: the client's prediction agrees with the helpers',
      L_ICC = 1/H sum_j KL( p*_{h_j}(y|u) || p_l(y|u) );                        (1)
  agreement-based pseudo label from the weakly augmented example alpha(u),
      y_hat = Max( 1(p_l(y|alpha(u))) + sum_j 1(p*_{h_j}(y|alpha(u))) ),        (2)
    1(.) the one-hot of a prediction's argmax, Max(.) the one-hot of the class with
    the most votes, used only where the prediction is confident (max_c p >= tau,
    tau = 0.85 in the paper);
  the consistency regularisation on the strongly augmented example pi(u),
      Phi = CE( y_hat, p_l(y|pi(u)) ) + L_ICC.                                  (3)
FedMatch's disjoint learning (Sec. 4.2) splits the parameters theta = sigma + psi
(sigma learns from labels, psi from Phi, with L1 / L2 terms tying psi to sigma) and
communicates sparse psi updates; it is not part of this benchmark variant (below). The
numbers (1)-(3) are this docstring's; they follow the order in which FedMatch Sec. 4.1
presents the consistency loss, the pseudo label and their sum.

The FCCL+ benchmark (FCCL+ Sec. 4.1, Tables VIII-IX) runs FedMatch with heterogeneous
participants: each has its own architecture and labelled private data, and all share an
unlabelled public set. Every round r (all K participants take part):
  0. Helpers of participant k (`fedmatch.num_helpers` = H): H = 0 (default) or K - 1:
     all K - 1 other participants. 0 < H < K - 1: the H participants nearest to k by
     model embedding, FedMatch's similarity: the softmax outputs of every model (eval
     mode) on one fixed batch of NOISE_IMAGES standard-normal inputs, flattened,
     Euclidean distance (ties: lower participant index first); chosen at the start of
     the round from the models after round r-1.
  1. Public phase, on every batch X of B0 = `collaborative.batch_size` public images
     (`collaborative.epochs` passes, fresh order per pass): a weak view alpha(X)
     (`collaborative.augmentation`, default "weak": random crop + flip) and a strong view
     pi(X) (`fedmatch.strong_augmentation`, default "strong": weak + colour jitter +
     grayscale, the FCCL+ strong augmentation) drawn independently. One train-mode forward
     of every participant on the concatenated [alpha(X); pi(X)] gives its weak-view logits
     Z_k^w and strong-view logits Z_k^s. Participant k descends
       L_k = lambda_c (1/H) sum_{j in helpers(k)} KL(softmax(Z_j^w) || softmax(Z_k^w))
             + lambda_p CE(Z_k^s, y_hat_k; kept rows)                          (Eq. 1, 3)
     with y_hat_k the pseudo labels of Eq. (2) from Z_k^w and the helpers' Z_j^w, kept
     where they agree (below), and every Z_j^w detached (`public_loss`,
     `agreement_pseudo_labels`); lambda_c = `fedmatch.consistency_weight`,
     lambda_p = `fedmatch.pseudo_label_weight`. One step with the collaborative optimiser
     (default Adam 1e-3 re-created per batch, `collaborative.optimizer_reset`), all
     participants simultaneously from the models they held at the start of the batch.
  2. Local training: `local.epochs` epochs of private cross-entropy (`config.local`; the
     supervised loss of FedMatch's labels-at-client scenario), a fresh optimiser per round.
The models are evaluated after step 2.

Pseudo labels (`agreement_pseudo_labels`): the voters are the participant itself and its
helpers, each voting for its argmax class on the weak view; y_hat is the class with the
most votes. A row is kept when
  * the participant's own prediction is confident: max_c softmax(Z_k^w)_c >= tau,
    tau = `fedmatch.confidence_threshold` (0.85, the paper's value), and
  * the voters agree: `fedmatch.agreement="plurality"` (default, Eq. 2): y_hat is the
    unique most-voted class (a tie between classes is a disagreement and drops the row;
    with two participants, any disagreement is a tie); "unanimous": every voter
    predicts y_hat.
The CE is the mean over the kept rows (0 when no row is kept).

Defaults follow the FCCL+ benchmark settings shared by every method (the same
`collaborative` and `local` sections as FCCL+: Adam 1e-3 re-created for every public
batch, public batch 512, weak augmentation; local Adam 1e-3 + L2 1e-5, 20 epochs of 256;
both rates decayed linearly over the run). FCCL+ Tables VIII / IX report FedMatch on
Digits at 26.58 (inter) / 82.69 (intra) average accuracy.

Interpretations and deviations (each a config field where it is a choice):
  * No parameter decomposition sigma / psi, no L1 / L2 terms, no sparse psi updates
    (Sec. 4.2): heterogeneous models cannot share or add parameters. Labelled and
    unlabelled learning are disjoint in time instead (the public phase trains on Eq. 3,
    the local phase on private labels), and what a helper contributes is its
    predictions on the shared public batch, not its parameters.
  * The unlabelled data is the shared public set, not private unlabelled data of each
    client; in the benchmark it is out of domain (CIFAR-100 for digit classifiers), so
    the pseudo labels are digit classes given to natural images.
  * Helpers: all other participants by default (the benchmark has 4 participants; the
    paper picks H of many clients, with an approximate nearest-neighbour search over the
    embeddings on the server); with 0 < H < K - 1 the H nearest are found exactly and
    recomputed every round.
  * The helpers' predictions are their train-mode outputs from the same forward pass
    (BatchNorm batch statistics, dropout active), as every public method of the
    benchmark computes its targets; the paper uses frozen copies of the helper models.
  * The KL of Eq. (1) is taken on the weak view alpha(u), the forward that also gives the
    pseudo labels, instead of on the un-augmented u (`collaborative.augmentation="none"`
    gives u itself for both).
  * One forward of the concatenated weak and strong views (FixMatch's interleaving):
    BatchNorm batch statistics are over both views and the running statistics are
    updated once per batch.
  * tau is applied to the participant's own prediction only (FixMatch's filter); the
    helpers vote with their argmax whatever their confidence. Max(.) of Eq. (2) is
    undefined on ties; a tie drops the row instead of picking a class.
  * Weights: Phi (Eq. 3) adds its two terms with equal weight, so both default to 1. The
    paper's overall scale lambda_ICCS and the supervised weight lambda_s balance the two
    losses of one objective; here the public and private phases have their own
    optimisers (Adam, nearly scale-invariant), so only the ratio of the two public terms
    matters.
  * The CE is the mean over the kept rows; FixMatch divides by the full batch size
    instead (the two differ by the fraction kept, `kept` in the metrics).
  * No warm-up: in round 1 the models are untrained, and few public rows pass tau.

State: state["groups"][group] = {"variables": per-slot model} (and "public_opt" with
`collaborative.optimizer_reset` "round" / "never").
Metrics: "collaborative" {group: {"loss": L_k, "kl": the helper-mean KL of Eq. 1,
"ce": the pseudo-label CE, "kept": fraction of the batch with a kept pseudo label}},
"local" {group: {"loss", "ce"}}.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, models, validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.engine import local, public
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import slot_active, slot_ids

AGREEMENTS = ("plurality", "unanimous")
#: Standard-normal inputs of the model embedding that picks the nearest helpers.
NOISE_IMAGES = 8
#: Seed of those inputs (the same for every participant and round).
NOISE_SEED = 0


def agreement_pseudo_labels(*, own_logits: jax.Array, peer_logits: jax.Array,
                            helper_weights: jax.Array, threshold: float,
                            agreement: str = "plurality") -> tuple[jax.Array, jax.Array]:
  """Agreement-based pseudo labels, Eq. (2) of the module docstring.

  Args:
    own_logits: (B, C) the participant's weak-view logits.
    peer_logits: (K, B, C) every participant's weak-view logits (the participant's own
      row included; it has helper weight 0).
    helper_weights: (K,) 1 for the participant's helpers, 0 otherwise.
    threshold: tau; the participant's own max probability must reach it.
    agreement: "plurality" (the unique most-voted class) or "unanimous" (every voter).

  Returns:
    (labels (B,) int32, the most-voted class; keep (B,) bool).
  """
  if agreement not in AGREEMENTS:
    raise ValueError(f"agreement must be one of {AGREEMENTS}, got {agreement!r}.")
  own_logits = jax.lax.stop_gradient(own_logits)
  peer_logits = jax.lax.stop_gradient(peer_logits)
  num_classes = own_logits.shape[-1]
  confident = jnp.max(jax.nn.softmax(own_logits, axis=-1), axis=-1) >= threshold
  votes = (jax.nn.one_hot(jnp.argmax(own_logits, axis=-1), num_classes)
           + jnp.einsum("k,kbc->bc", helper_weights.astype(jnp.float32),
                        jax.nn.one_hot(jnp.argmax(peer_logits, axis=-1), num_classes)))
  labels = jnp.argmax(votes, axis=-1).astype(jnp.int32)
  top = jnp.max(votes, axis=-1)
  if agreement == "plurality":
    agree = jnp.sum(votes == top[:, None], axis=-1) == 1
  else:
    agree = top == 1.0 + jnp.sum(helper_weights)
  return labels, confident & agree


def public_loss(*, own_weak: jax.Array, own_strong: jax.Array, peer_weak: jax.Array,
                helper_weights: jax.Array, threshold: float, agreement: str,
                consistency_weight: float, pseudo_label_weight: float
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """A participant's public loss on one batch, Eq. (1) and (3) of the module docstring.

  lambda_c (1/H) sum_j KL(softmax(Z_j^w) || softmax(Z^w)) + lambda_p CE(Z^s, y_hat; kept),
  with every KL and CE from log-softmax (finite for saturated logits) and the peers'
  logits constant.

  Args:
    own_weak: (B, C) the participant's weak-view logits Z^w.
    own_strong: (B, C) its strong-view logits Z^s (of the same public images).
    peer_weak: (K, B, C) every participant's weak-view logits; constant.
    helper_weights: (K,) 1 for the participant's H helpers, 0 otherwise (H = 0: no KL).
    threshold, agreement: the pseudo-label rule (`agreement_pseudo_labels`).
    consistency_weight: lambda_c.
    pseudo_label_weight: lambda_p.

  Returns:
    (scalar loss, {"loss", "kl", "ce", "kept"}).
  """
  kl_each = jax.vmap(lambda t: losses.knowledge_distillation_loss(
      student_logits=own_weak, teacher_logits=t))(jax.lax.stop_gradient(peer_weak))
  num_helpers = jnp.sum(helper_weights)
  kl = jnp.sum(helper_weights * kl_each) / jnp.maximum(num_helpers, 1.0)
  labels, keep = agreement_pseudo_labels(own_logits=own_weak, peer_logits=peer_weak,
                                         helper_weights=helper_weights, threshold=threshold,
                                         agreement=agreement)
  ce = losses.softmax_cross_entropy(logits=own_strong, labels=labels, mask=keep)
  loss = consistency_weight * kl + pseudo_label_weight * ce
  return loss, {"loss": loss, "kl": kl, "ce": ce,
                "kept": jnp.mean(keep.astype(jnp.float32))}


def all_other_participants(num_participants: int) -> jax.Array:
  """(K, K) helper weights: row k is 1 for every participant but k."""
  return 1.0 - jnp.eye(num_participants, dtype=jnp.float32)


def nearest_helpers(embeddings: jax.Array, num_helpers: int) -> jax.Array:
  """(K, K) helper weights: row k is 1 for the `num_helpers` participants nearest to k.

  Args:
    embeddings: (K, D) model embeddings.
    num_helpers: H in [0, K - 1].

  Returns:
    float32 0/1 matrix with zero diagonal and H ones per row; equal distances are
    resolved toward the lower participant index.
  """
  num = embeddings.shape[0]
  distance = jnp.sum(jnp.square(embeddings[:, None] - embeddings[None]), axis=-1)
  distance = jnp.where(jnp.eye(num, dtype=bool), jnp.inf, distance)
  nearest = jnp.argsort(distance, axis=-1, stable=True)[:, :num_helpers]
  return jnp.zeros((num, num), jnp.float32).at[jnp.arange(num)[:, None], nearest].set(1.0)


def resolve_num_helpers(num_helpers: int, num_participants: int) -> int:
  """H from `fedmatch.num_helpers` (0: all K - 1 others); raises naming the field."""
  others = num_participants - 1
  if not 0 <= num_helpers <= others:
    validation.fail("fedmatch.num_helpers",
                    f"an integer in [0, {others}] for {num_participants} participants "
                    f"(0: all {others} other participants)", num_helpers)
  return others if num_helpers == 0 else num_helpers


def two_view_pipeline(weak: str, strong: str, mean, std, *, crop: str):
  """(key, uint8 images) -> (weak view alpha(X), strong view pi(X)), normalised."""
  prepare_weak = public.public_pipeline(weak, mean, std, crop=crop)
  prepare_strong = public.public_pipeline(strong, mean, std, crop=crop)

  def prepare(key, images):
    weak_key, strong_key = jax.random.split(key)
    return prepare_weak(weak_key, images), prepare_strong(strong_key, images)

  return prepare


def make_spec(config: ml_collections.ConfigDict, setup: Setup) -> public.PublicSpec:
  """The public phase's batches with both views (`config.collaborative`, `config.fedmatch`)."""
  col = config.collaborative
  return public.PublicSpec(
      batch_size=int(col.batch_size), epochs=int(col.epochs),
      prepare=two_view_pipeline(col.augmentation, config.fedmatch.strong_augmentation,
                                setup.public_mean, setup.public_std, crop=col.crop))


class Phases(NamedTuple):
  """FedMatch's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state.
  select_helpers: state -> (K, K) helper weights (row k: participant k's helpers).
  public_step: (state, (weak, strong) views, key, round, helpers) -> (state, metrics):
    one step of every participant on Eq. (1) + (3) on one public batch.
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
  """
  init: Any
  select_helpers: Any
  public_step: Any
  local_update: Any


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """FedMatch's phases from `config.fedmatch`, `config.collaborative`, `config.local`."""
  cfg, loc = config.fedmatch, config.local
  num = setup.num_participants
  num_helpers = resolve_num_helpers(int(cfg.num_helpers), num)
  agreement = common.check_choice("fedmatch.agreement", cfg.agreement, AGREEMENTS)
  threshold = float(cfg.confidence_threshold)
  consistency_weight = float(cfg.consistency_weight)
  pseudo_label_weight = float(cfg.pseudo_label_weight)
  pieces = common.public_and_local_pieces(config, setup)
  col_tx, keep_optimizer = pieces.public_optimizer, pieces.reset != "batch"
  ids = {g.name: jnp.asarray(slot_ids(g, num)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  init = common.fresh_init(setup, public_optimizer=col_tx if keep_optimizer else None)

  def select_helpers(state):
    if num_helpers == num - 1:
      return all_other_participants(num)
    noise = jax.random.normal(jax.random.key(NOISE_SEED), (NOISE_IMAGES, 32, 32, 3))
    embeddings = {}
    for group in setup.groups:
      embed = lambda v, g=group: jax.nn.softmax(
          models.apply_model(g.model, v, noise, train=False)[1], axis=-1).reshape(-1)
      embeddings[group.name] = jax.vmap(embed)(state["groups"][group.name]["variables"])
    return nearest_helpers(common.to_participants(embeddings, setup), num_helpers)

  def public_step(state, views, key, round_index, helpers):
    weak, strong = views
    batch = weak.shape[0]
    params = {name: g["variables"]["params"] for name, g in state["groups"].items()}

    def total_loss(params):
      _, logits, stats = common.public_forward(setup, state, params,
                                               jnp.concatenate([weak, strong]), key, ids)
      peers = jax.lax.stop_gradient(common.to_participants(
          {name: z[:, :batch] for name, z in logits.items()}, setup))  # (K, B, C)
      total, metrics = 0.0, {}
      for group in setup.groups:
        z = logits[group.name]
        per_slot, metrics[group.name] = jax.vmap(lambda w, s, h: public_loss(
            own_weak=w, own_strong=s, peer_weak=peers, helper_weights=h, threshold=threshold,
            agreement=agreement, consistency_weight=consistency_weight,
            pseudo_label_weight=pseudo_label_weight))(
                z[:, :batch], z[:, batch:], common.to_slots(helpers, group))
        total = total + jnp.sum(jnp.where(active[group.name], per_slot, 0.0))
      return total, (metrics, stats)

    grads, (metrics, stats) = jax.grad(total_loss, has_aux=True)(params)
    return common.public_update(setup, state, grads, stats, col_tx, pieces.public_lr(round_index),
                                keep_optimizer=keep_optimizer), metrics

  local_update = private_training.make_private_update(setup, pieces.trainers, int(loc.epochs),
                                                      pieces.local_lr)

  return Phases(init=init, select_helpers=select_helpers, public_step=public_step,
                local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one FedMatch round over all K participants, from the shapes.

  On each public batch (`common.public_batches`) every participant sends its weak-view logits
  Z_k^w (B, C) and receives its H helpers' (H x B x C): up K x batches x B x C x 4 bytes,
  down H times that. With 0 < H < K - 1 every participant also sends its model embedding
  (NOISE_IMAGES x C softmax outputs) once a round, from which the server picks the helpers.
  """
  num = setup.num_participants
  helpers = resolve_num_helpers(int(config.fedmatch.num_helpers), num)
  batch, batches = common.public_batches(int(config.collaborative.batch_size),
                                         int(config.collaborative.epochs), num_public)
  logits = num * batches * batch * setup.num_classes * 4
  up, down = logits, helpers * logits
  if batches and helpers != num - 1:
    up += num * NOISE_IMAGES * setup.num_classes * 4
  return up, down


def make_fedmatch(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedMatch as an `Algorithm`: helpers, public consistency + pseudo labels, private CE.

  The round is given as two stages, the helpers with the public phase, then the
  private CE (`Algorithm.stages`), so the trainer can compile each as its own
  program (`config.round_programs`). The public stage's metrics hold the round's
  ["server"]["bytes_up" | "bytes_down"] (`communication_bytes`).
  """
  phases = make_phases(config, setup)
  return common.public_then_local_algorithm(
      "fedmatch", config, setup, phases.init, spec=make_spec(config, setup),
      step=phases.public_step, step_args=lambda state, data: (phases.select_helpers(state),),
      local_update=phases.local_update, communication_bytes=communication_bytes)


def default_config() -> ml_collections.ConfigDict:
  """The config sections FedMatch reads: `collaborative` (public), `local`, `fedmatch`."""
  return ml_collections.ConfigDict({
      "collaborative": public.default_config(),  # its augmentation is the weak view alpha
      "local": local.default_config(),
      "fedmatch": {
          "confidence_threshold": 0.85,    # tau of the pseudo labels (the FedMatch paper)
          "consistency_weight": 1.0,       # lambda_c of the inter-client KL, Eq. (1)
          "pseudo_label_weight": 1.0,      # lambda_p of the pseudo-label CE, Eq. (3)
          "num_helpers": 0,                # H; 0: all other participants
          "agreement": "plurality",        # Eq. (2) Max of the votes; "unanimous"
          "strong_augmentation": "strong",  # the view pi(u) of the pseudo-label CE
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedmatch`, `config.collaborative` and `config.local`.

  `fedmatch.num_helpers` is checked against the number of participants when the
  method is built (`resolve_num_helpers`).
  """
  public.validate_config(config)
  local.validate_config(config)
  validation.require_section(config, "fedmatch")
  v = validation
  number = validation.finite_number
  v.check(config, "fedmatch.confidence_threshold", lambda x: number(x) and 0 <= x <= 1,
          "a number in [0, 1]")
  for field in ("consistency_weight", "pseudo_label_weight"):
    v.check(config, f"fedmatch.{field}", lambda x: number(x) and x >= 0, "a number >= 0")
  if not config.fedmatch.consistency_weight and not config.fedmatch.pseudo_label_weight:
    v.fail("fedmatch.pseudo_label_weight",
           "a number > 0 when fedmatch.consistency_weight is 0 (the public loss would be 0)",
           config.fedmatch.pseudo_label_weight)
  v.check(config, "fedmatch.num_helpers", v.int_at_least(0),
          "an integer >= 0 (0: all other participants)")
  v.check(config, "fedmatch.agreement", v.choice(AGREEMENTS), f"one of {AGREEMENTS}")
  v.check(config, "fedmatch.strong_augmentation", v.choice(public.AUGMENTATIONS),
          f"one of {public.AUGMENTATIONS}")

"""RCFL: federated aggregation of class scores on a global set, α-weighted by label overlap.

Reference: G. K. Gudur, B. S. Balaji, S. K. Perepu. Resource-Constrained Federated
Learning with Heterogeneous Labels and Models. 3rd International Workshop on
Artificial Intelligence of Things (AIoT) at ACM SIGKDD 2020 (arXiv:2011.03206);
FCCL (CVPR 2022) reference [16], a baseline of its Tables 1-3.

RCFL's setting: every participant (a "local user") trains its own model, of any
architecture, on private data whose label set L_i may differ from the others'.
Instead of model weights, participants send class scores computed on a global
dataset that everyone holds; the server aggregates the scores label by label,
weighting labels that all participants share against labels that only some of them
hold (the "α-weighted federated aggregation of scores", which "leverages overlapping
information gain across labels"); every participant then distils its model toward
the aggregated scores on the global set and trains on its private data again. Here
the global dataset is the run's unlabelled public set.

Warm-up (before round 1, `rcfl.warmup_epochs`, 0 = none): every participant trains
on its private data alone (cross-entropy; `local.optimizer`, `local.batch_size`,
constant rate `local.lr`): RCFL's iteration starts with local training, so the
scores of round 1 come from trained models. The default, 20 epochs, is one local
phase of the benchmark (`local.epochs`).

Every round r (all K participants take part), on every batch X of B0 =
`collaborative.batch_size` public images of `collaborative.epochs` passes (fresh
order per pass, augmented as `collaborative.augmentation`):
  1. Scores: participant i sends p_i = softmax(f_i(X)) (B0 x C, train-mode forward).
  2. α-weighted aggregation on the server (`aggregate_scores`), with h_ic = 1 when
     class c is in L_i, n_c = sum_i h_ic the number of participants holding c:
        m_c  = sum_i h_ic p_ic / n_c                     (mean over c's holders)
        w_c  = α      if n_c = K   (a label all participants share)
               1 - α  if 0 < n_c < K (a label only some participants hold)
               0      if n_c = 0
        t_c  = w_c m_c / sum_c' w_c' m_c'                (a distribution over C)
     per image, detached.
  3. Distil: one step of every participant on
        L_dist(i) = 1/B0 sum_b KL(t_b || softmax(f_i(X)_b))
     (`distillation_loss`), with the collaborative optimiser (default Adam 1e-3,
     fresh per batch, `collaborative.optimizer_reset`; rate lr0 (1 - 0.9 max(r-1, 0)/E),
     `collaborative.lr_decay`).
  Then `local.epochs` epochs of private cross-entropy with `config.local` (Adam 1e-3,
  L2 1e-5, the same linear decay), a fresh optimiser every round.

In FCCL's scenarios (Digits, Office-Home, Office31, Office-Caltech) every participant's
task covers every class: L_i is all C classes (`rcfl.label_sets="all"`, the default), so
n_c = K for every c, only the shared-label branch is exercised and t is the plain mean of
the K participants' softmax scores; α then has no effect. `rcfl.label_sets="data"` takes
L_i as the classes present in participant i's private data, which exercises the
partially-held branch when a participant lacks a class.

Interpretations and deviations (where the paper leaves a choice open):
  * The form of the α weighting above (a per-class weight α for shared labels and
    1 - α for the others, then renormalised per image) is this library's reading of
    "α-weighted aggregation of scores" across overlapping and non-overlapping labels;
    α = `rcfl.alpha`, default 0.75 (shared labels, confirmed by every participant, weigh
    more). A class nobody holds gets target 0. Where α = 0 (or 1) leaves every held class
    weight 0 (every held class shared, or none), the held classes weigh alike.
  * Scores are softmax probabilities (temperature 1) and the distillation loss is the
    KL divergence toward the aggregated distribution, with log-softmax on the student
    and 0 log 0 = 0 on the target, so saturated logits give finite values.
  * Batch-wise communication, as this library's FedMD and FedDF: each public batch is
    scored, aggregated and distilled before the next, so later batches see the models
    distilled so far; RCFL scores the whole global set once per round and then trains
    toward those fixed scores.
  * One train-mode forward pass per participant and batch gives both the communicated
    scores and the distillation gradient (`common.consensus_step`): all participants
    step simultaneously from the models they held at the start of the batch.
  * The global set is the unlabelled public set of the scenario (CIFAR-100 in FCCL's
    tables), not a labelled sample of the participants' classes.
  * No parameters are averaged, also in the homogeneous variants (`_homogeneous`): RCFL
    communicates scores only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.engine import local, public
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import slot_active

LABEL_SETS = ("all", "data")


def aggregate_scores(scores: jax.Array, holds: jax.Array, *, alpha: float,
                     num_participants: int | None = None) -> jax.Array:
  """RCFL's α-weighted aggregation of class scores (the module docstring's step 2).

  Args:
    scores: (S, B, C) class probabilities of S participant slots on B global images.
    holds: (S, C) bool or 0/1, h_ic: class c is in participant i's label set (all False for
      a padding slot, which then contributes nothing).
    alpha: weight of the labels all `num_participants` participants hold; the labels only
      some of them hold weigh 1 - alpha.
    num_participants: K, the real participants (default S).

  Returns:
    (B, C) aggregated scores t, each row a distribution over the held classes.
  """
  k = scores.shape[0] if num_participants is None else num_participants
  h = holds.astype(scores.dtype)
  count = jnp.sum(h, axis=0, keepdims=True)                     # n_c, (1, C)
  mean = jnp.einsum("sc,sbc->bc", h, scores) / jnp.maximum(count, 1.0)
  weight = jnp.where(count >= k, alpha, jnp.where(count > 0, 1.0 - alpha, 0.0))
  # alpha = 0 (1) with every held class shared (partially held): the held classes alike.
  weight = jnp.where(jnp.sum(weight) > 0, weight, (count > 0).astype(weight.dtype))
  weight = weight.astype(scores.dtype)
  weighted = weight * mean
  total = jnp.sum(weighted, axis=-1, keepdims=True)              # (B, 1)
  # Every holder's mass underflowed onto classes it does not hold: the weights alone.
  fallback = weight / jnp.maximum(jnp.sum(weight), jnp.finfo(scores.dtype).tiny)
  return jnp.where(total > 0, weighted / jnp.where(total > 0, total, 1.0),
                   jnp.broadcast_to(fallback, weighted.shape))


def distillation_loss(*, logits: jax.Array, target: jax.Array,
                      mask: jax.Array | None = None) -> jax.Array:
  """1/B sum_b KL(target_b || softmax(logits_b)): the distillation toward aggregated scores.

  Args:
    logits: (B, C) the student's logits.
    target: (B, C) a distribution per row (`aggregate_scores`); treated as a constant.
    mask: optional (B,) validity mask; padded rows get 0.

  Returns:
    Scalar loss, finite for any finite logits (log-softmax; 0 log 0 = 0 on the target).
  """
  target = jax.lax.stop_gradient(target)
  log_p = jax.nn.log_softmax(logits, axis=-1)
  per_row = jnp.sum(jax.scipy.special.xlogy(target, target) - target * log_p, axis=-1)  # (B,)
  if mask is None:
    return jnp.mean(per_row)
  mask = mask.astype(per_row.dtype)
  return jnp.sum(per_row * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def label_sets(groups: Any, num_classes: int, mode: str) -> dict[str, jax.Array]:
  """{group: (slots, C) bool} h_ic: every class ("all") or the classes of the private data.

  Args:
    groups: {group: `clients.GroupData`}; rows [0, sizes[s]) of slot s are valid.
    num_classes: C.
    mode: "all" or "data" (`rcfl.label_sets`).
  """
  out = {}
  for name, g in groups.items():
    slots, rows = g.labels.shape
    if mode == "all":
      out[name] = jnp.ones((slots, num_classes), bool)
      continue
    valid = jnp.arange(rows)[None, :] < jnp.asarray(g.sizes)[:, None]
    one_hot = jax.nn.one_hot(g.labels, num_classes, dtype=jnp.float32)
    out[name] = jnp.max(one_hot * valid[..., None], axis=1) > 0
  return out


class Phases(NamedTuple):
  """RCFL's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state (includes the private warm-up).
  distill_step: (state, public images, key, round, {group: (slots, C) label sets}) ->
    (state, metrics): scores, α-weighted aggregation and distillation on one public batch.
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
  """
  init: Any
  distill_step: Any
  local_update: Any


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """RCFL's phases from `config.rcfl`, `config.collaborative`, `config.local`."""
  cfg, loc = config.rcfl, config.local
  alpha = float(cfg.alpha)
  pieces = common.public_and_local_pieces(config, setup)
  col_tx, keep_optimizer = pieces.public_optimizer, pieces.reset != "batch"
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  init = private_training.warm_started_init(setup, loc, int(cfg.warmup_epochs),
                                            public_optimizer=col_tx if keep_optimizer else None)

  def distill(z, target):
    kl = distillation_loss(logits=z, target=target)
    return kl, {"kl": kl}

  def distill_step(state, images, key, round_index, holds):
    def target_fn(logits):
      names = [g.name for g in setup.groups]
      scores = jnp.concatenate([jax.nn.softmax(logits[n], axis=-1) for n in names])
      held = jnp.concatenate([holds[n] & active[n][:, None] for n in names])
      return aggregate_scores(scores, held, alpha=alpha,
                              num_participants=setup.num_participants)

    return common.consensus_step(setup, state, images, key, distill, col_tx,
                                 pieces.public_lr(round_index), keep_optimizer=keep_optimizer,
                                 target_fn=target_fn)

  local_update = private_training.make_private_update(setup, pieces.trainers, int(loc.epochs),
                                                      pieces.local_lr)

  return Phases(init=init, distill_step=distill_step, local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one RCFL round over all K participants, from the shapes.

  On each public batch (`common.public_batches`) every participant sends its class scores
  p_i (B, C) and receives the aggregated scores t (B, C): K x batches x B x C x 4 bytes each
  way. The label sets (C flags per participant) are shared once before training and not
  counted.
  """
  batch, batches = common.public_batches(int(config.collaborative.batch_size),
                                         int(config.collaborative.epochs), num_public)
  total = setup.num_participants * batches * batch * setup.num_classes * 4
  return total, total


def make_rcfl(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """RCFL as an `Algorithm`: (scores, α-weighted aggregation, distillation) per public batch,
  then private training.

  The round is given as these two stages (`Algorithm.stages`), so the trainer can compile
  each as its own program (`config.round_programs`). The public stage's metrics hold the
  round's ["server"]["bytes_up" | "bytes_down"] (`communication_bytes`).
  """
  phases = make_phases(config, setup)
  mode = common.check_choice("rcfl.label_sets", config.rcfl.label_sets, LABEL_SETS)
  return common.public_then_local_algorithm(
      "rcfl", config, setup, phases.init,
      step=phases.distill_step,
      step_args=lambda state, data: (label_sets(data.groups, setup.num_classes, mode),),
      local_update=phases.local_update, communication_bytes=communication_bytes)


def default_config() -> ml_collections.ConfigDict:
  """The config sections RCFL reads: `collaborative` (distillation), `local`, `rcfl`."""
  return ml_collections.ConfigDict({
      "collaborative": public.default_config(),
      "local": local.default_config(),
      "rcfl": {
          "alpha": 0.75,          # weight of labels all participants hold; others 1 - alpha
          "label_sets": "all",    # "all": every class (FCCL's scenarios); "data": private data's
          "warmup_epochs": 20,    # private epochs before round 1 (one local phase)
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.rcfl`, `config.collaborative` and `config.local`."""
  public.validate_config(config)
  local.validate_config(config)
  validation.require_section(config, "rcfl")
  v = validation
  v.check(config, "rcfl.alpha", lambda x: v.finite_number(x) and 0 <= x <= 1,
          "a number in [0, 1]")
  v.check(config, "rcfl.label_sets", v.choice(LABEL_SETS), f"one of {LABEL_SETS}")
  v.check(config, "rcfl.warmup_epochs", v.int_at_least(0), "an integer >= 0")

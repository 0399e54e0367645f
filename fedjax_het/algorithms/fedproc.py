"""FedProc (Mu et al., 2021): FedAvg plus prototypical contrastive learning on global prototypes.

Local objective of client k in round r, on a private batch:
    l = alpha(r) * L_proto + (1 - alpha(r)) * CE,
    L_proto = mean_b -log( exp(cos(h_b, P_{y_b}) / tau) / sum_{c valid} exp(cos(h_b, P_c) / tau) ),
with h the pooled features of the model being trained, P the global class
prototypes of the previous round (constants) and tau = `fedproc.temperature`
(1: the plain cosines of the FCCL+ benchmark code). Samples whose class has no
prototype contribute 0 to L_proto (`losses.prototype_contrastive_loss`).
alpha follows `fedproc.alpha_schedule`: "linear" (default) anneals
alpha(r) = 1 - r / (E - 1) over the rounds r = 0..E-1 of the run
(E = `num_rounds`; E = 1 gives alpha = 1), as the FCCL+ benchmark code does;
"constant" uses `fedproc.alpha` (0.5, the value FCCL+ Table VII lists) in
every round.

The round is FedAvg's (`fedavg.py`, `config.fedavg`, `config.server`) plus
the prototypes:
  1. sample the cohort; every sampled client starts from w_r and receives the
     global prototypes P (`state["prototypes"]`: "vectors" (C, d), "mask" (C,));
  2. `local.epochs` epochs of minibatch training on the objective above;
  3. each sampled client runs its trained model (eval mode, no augmentation)
     over all its private rows and sends its per-class mean features;
  4. model averaging and server step as FedAvg; the server's new prototype of
     class c is the uniform mean of the class-c means of the cohort's clients
     that hold class c. Classes no sampled client holds are masked for the
     next round.
Round 0 has no prototypes yet: a round without any valid prototype trains on
CE alone (alpha is set to 0), instead of weighting CE by 1 - alpha(0) = 0.

Communication (`bytes_up` / `bytes_down`): the model variables plus C x d
float32 prototypes each way per sampled client (the class-presence flags are
not counted).

Deviations: the global prototypes are rebuilt from the current cohort only
(a class held by no sampled client has no prototype in the next round rather
than keeping an older one); the class means use the eval-mode model
(BatchNorm running statistics), over `eval.batch_size`-row batches.

Reference: X. Mu, Y. Shen, K. Cheng, X. Geng, J. Fu, T. Zhang, Z. Zhang.
FedProc: Prototypical Contrastive Federated Learning on Non-IID Data.
arXiv:2109.12273, 2021.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, models, validation
from fedjax_het.algorithms import common, fedavg_family
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import batching, optim
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import ClientGroup

ALPHA_SCHEDULES = ("linear", "constant")


def linear_alpha(round_index: jax.Array, num_rounds: int | jax.Array) -> jax.Array:
  """alpha(r) = 1 - r / (E - 1) (the FCCL+ benchmark code), 1 when E = 1, clipped to [0, 1].

  E is `num_rounds`, or inside an `optim.run_length` block the E it gives."""
  total = optim.num_rounds_in_run(num_rounds)
  span = max(total - 1, 1) if isinstance(total, int) else jnp.maximum(total - 1, 1)
  alpha = 1.0 - optim.divide_as_by_constant(jnp.asarray(round_index, jnp.float32), span)
  return jnp.clip(alpha, 0.0, 1.0)


def make_class_means(group: ClientGroup, *, num_classes: int, max_size: int, batch_size: int,
                     preprocess: Callable[[jax.Array], jax.Array]) -> Callable[..., tuple]:
  """Builds `class_means(variables, images, labels, size) -> (means (C, d), counts (C,))`.

  One client's eval-mode pooled features over its valid private rows, averaged
  per class (classes it does not hold: mean 0, count 0), in static batches.
  """
  batch_size = min(batch_size, max_size)
  steps = batching.steps_per_epoch(max_size, batch_size)
  dim = group.model.feature_dim

  def class_means(variables, images, labels, size):
    def accumulate(carry, step):
      sums, counts = carry
      index = step * batch_size + jnp.arange(batch_size)
      rows = jnp.minimum(index, max_size - 1)
      features, _, _ = models.apply_model(group.model, variables, preprocess(images[rows]),
                                          train=False)
      onehot = jax.nn.one_hot(labels[rows], num_classes) * (index < size)[:, None]
      sums = sums + jnp.einsum("bc,bd->cd", onehot, features,
                               precision=jax.lax.Precision.HIGHEST)
      return (sums, counts + jnp.sum(onehot, axis=0)), None

    zeros = (jnp.zeros((num_classes, dim)), jnp.zeros((num_classes,)))
    (sums, counts), _ = jax.lax.scan(accumulate, zeros, jnp.arange(steps))
    return sums / jnp.maximum(counts, 1.0)[:, None], counts

  return class_means


def aggregate_prototypes(means: jax.Array, counts: jax.Array) -> dict[str, jax.Array]:
  """Global prototypes from the cohort's (M, C, d) class means and (M, C) class counts.

  Prototype c is the uniform mean over the clients holding class c; classes
  nobody holds are masked (vector 0).
  """
  holds = (counts > 0).astype(means.dtype)
  holders = jnp.sum(holds, axis=0)
  vectors = jnp.einsum("mc,mcd->cd", holds, means, precision=jax.lax.Precision.HIGHEST)
  return {"vectors": vectors / jnp.maximum(holders, 1.0)[:, None], "mask": holders > 0}


def make_fedproc(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedProc from `config.fedproc`, `config.fedavg`, `config.local`, `config.server`."""
  cfg = config.fedproc
  temperature = float(cfg.temperature)
  schedule = common.check_choice("fedproc.alpha_schedule", cfg.alpha_schedule, ALPHA_SCHEDULES)
  constant_alpha = float(cfg.alpha)
  num_rounds, num_classes = setup.num_rounds, setup.num_classes
  group = fedavg_family.the_group(setup, "fedproc")
  dim = group.model.feature_dim

  def alpha_at(round_index):
    if schedule == "linear":
      return linear_alpha(round_index, num_rounds)
    return jnp.float32(constant_alpha)

  def objective_for(group):
    forward = common.forward_fn(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      features, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      prototypes = aux["prototypes"]
      # No global prototype yet (round 0): CE only.
      alpha = jnp.where(jnp.any(prototypes["mask"]), alpha_at(aux["round"]), 0.0)
      ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
      infonce = losses.prototype_contrastive_loss(
          features=features, labels=labels, prototypes=prototypes["vectors"],
          prototype_mask=prototypes["mask"], temperature=temperature, mask=mask)
      loss = alpha * infonce + (1.0 - alpha) * ce
      return loss, (new_stats, {"ce": ce, "infonce": infonce, "alpha": alpha})

    return loss_fn

  class_means = make_class_means(
      group, num_classes=num_classes, max_size=setup.max_sizes[group.name],
      batch_size=int(config.eval.batch_size),
      preprocess=normalizer(setup.private_mean, setup.private_std))

  def update(old, trained, members):
    del old  # rebuilt from this round's cohort
    means, counts = jax.vmap(class_means)(trained, members.images, members.labels,
                                          members.sizes)
    prototypes = aggregate_prototypes(means, counts)
    return prototypes, {"prototype_classes": jnp.sum(prototypes["mask"]).astype(jnp.float32)}

  prototype_bytes = num_classes * dim * 4  # float32
  prototypes = fedavg_family.ServerState(
      name="prototypes",
      init=lambda: {"vectors": jnp.zeros((num_classes, dim)),
                    "mask": jnp.zeros((num_classes,), bool)},
      update=update, bytes_up=prototype_bytes, bytes_down=prototype_bytes)
  return fedavg_family.make_family(config, setup, name="fedproc", objective_for=objective_for,
                                   server_state=prototypes)


def default_config() -> ml_collections.ConfigDict:
  c = fedavg_family.family_default_config()
  c.fedproc = ml_collections.ConfigDict({
      "temperature": 1.0,            # tau of the prototype InfoNCE (benchmark code: plain cosines)
      "alpha_schedule": "linear",    # "linear": alpha = 1 - r / (E - 1); "constant": fedproc.alpha
      "alpha": 0.5,                  # used by "constant" (FCCL+ Table VII lists 0.5)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  fedavg_family.validate_config(config)
  validation.require_section(config, "fedproc")
  validation.check(config, "fedproc.temperature", validation.positive, "a number > 0")
  validation.check(config, "fedproc.alpha_schedule", validation.choice(ALPHA_SCHEDULES),
                   f"one of {ALPHA_SCHEDULES}")
  validation.check(config, "fedproc.alpha", lambda x: 0 <= x <= 1, "a number in [0, 1]")

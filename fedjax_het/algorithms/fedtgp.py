"""FedTGP: trainable global prototypes with adaptive-margin contrastive learning (AAAI 2024).

Every round (all K clients take part):
  1. Local training: `local.epochs` epochs of SGD (HtFLlib: lr 0.01, batch 10, 1 epoch) on
        L = CE(f(h), y) + λ · mean_{b, d} (h_b - P̂_{y_b})²_d
     (FedTGP Eq. 4, the regulariser `losses.htfl.prototype_regularizer`), P̂ the global
     prototypes of the previous round (none in round 1: CE alone), λ = `fedtgp.lamda`.
  2. Client prototypes (Eq. 3): C_k^(j) = the mean over the client's training rows of class
     j of the eval-mode features of its trained model (HtFLlib's `collect_protos`,
     `htfl_common.class_statistics_pass`), uploaded for every class the client holds.
  3. Adaptive margin (Eq. 8): the class centres C̄^(j) (unweighted means of the uploaded
     prototypes of class j), gap_j = min_{i≠j} ||C̄^(i) - C̄^(j)||_2 over the uploaded classes
     (a class without an upload, or the only one, takes the smallest gap), and
     δ = min(max_j gap_j, τ) with τ = `fedtgp.margin_threshold`.
  4. Server training (Eq. 5-7): the trainable global prototypes P̂_c = F(c), F an embedding
     (C x D, N(0, 1)) -> Linear(D, D) -> ReLU -> Linear(D, D) (HtFLlib's
     `Trainable_Global_Prototypes`, hidden width = feature dim), kept across rounds, trained
     for `fedtgp.server_epochs` epochs of SGD (rate = `local.lr`, HtFLlib's
     `server_learning_rate = args.local_learning_rate`) over the uploaded (prototype, class)
     pairs in shuffled batches of `local.batch_size` (the code's server batch is the
     client batch size) on `losses.htfl.tgp_margin_contrastive_loss` with margin δ.
  5. The new global prototypes P̂_c = F(c) for every class go to every client.
Inference: the class of the nearest global prototype in mean squared distance (HtFLlib's
`test_metrics`). `fedtgp.classifier = "head"` evaluates each client's own head instead (its
logits' top-k; the head is trained by the CE term): not the paper's inference, a diagnosis;
training is unchanged.

Defaults and their sources: λ = 10, 100 server epochs, τ = 100 (FedTGP `run_me.sh` and
HtFLlib `total.sh`: `-lam 10 -se 100 -mart 100`), local SGD as `htfl_common.local_config`,
features pooled to `htfl.feature_dim` = 512.

Deviations from the code: the server's squared distances are floored at 1e-12 before the
square root (`tgp_margin_contrastive_loss`); the client prototypes average every training
row (the code's loader drops the last partial batch); each local epoch visits the rows in a
fresh random order and keeps the last partial batch (the code: `shuffle=False,
drop_last=True`); HtFLlib evaluates before a round's training, this library after it.

Reference: J. Zhang, Y. Liu, Y. Hua, J. Cao. FedTGP: Trainable Global Prototypes with
Adaptive-Margin-Enhanced Contrastive Learning for Data and Model Heterogeneity in Federated
Learning. AAAI 2024 (arXiv:2401.03230). Code read: TsingZ0/FedTGP and TsingZ0/HtFLlib
system/flcore/clients/clienttgp.py, servers/servertgp.py (identical).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import validation
from fedjax_het.algorithms import htfl_common
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.losses import htfl as htfl_losses
from fedjax_het.models.layers import dense

#: The gap of a class without an upload before it takes the smallest gap (the code's 1e9).
NO_GAP = 1e9


class TrainableGlobalPrototypes(nn.Module):
  """F(c) = Linear(ReLU(Linear(E[c]))): HtFLlib's `Trainable_Global_Prototypes`.

  Embedding N(0, 1) (torch's `nn.Embedding`), Linear layers with torch's default init.
  """
  num_classes: int
  feature_dim: int
  hidden_dim: int

  @nn.compact
  def __call__(self) -> jax.Array:
    table = self.param("embedding", nn.initializers.normal(1.0),
                       (self.num_classes, self.feature_dim))
    hidden = nn.relu(dense(self.hidden_dim, self.feature_dim, name="middle")(table))
    return dense(self.feature_dim, self.hidden_dim, name="fc")(hidden)


def adaptive_margin(centres: jax.Array, present: jax.Array, threshold: float) -> jax.Array:
  """δ = min(max_j gap_j, threshold) (FedTGP Eq. 8; HtFLlib's `receive_protos`).

  gap_j = the smallest L2 distance from class j's centre to another present class's centre;
  a class that is absent, or has no present neighbour, takes the smallest gap of all.
  """
  d2 = htfl_losses.squared_distances(centres, centres)
  dist = jnp.sqrt(jnp.maximum(d2, 0.0))
  num = centres.shape[0]
  pair = present[:, None] & present[None, :] & ~jnp.eye(num, dtype=bool)
  gap = jnp.min(jnp.where(pair, dist, NO_GAP), axis=1)
  gap = jnp.where(present, gap, NO_GAP)
  smallest = jnp.min(gap)
  gap = jnp.where(gap > 1e8, smallest, gap)
  return jnp.minimum(jnp.max(gap), threshold)


def make_fedtgp(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedTGP as an `Algorithm` (module docstring)."""
  cfg, loc = config.fedtgp, config.local
  lamda, threshold = float(cfg.lamda), float(cfg.margin_threshold)
  server_epochs = int(cfg.server_epochs)
  server_batch = int(cfg.server_batch_size) or int(loc.batch_size)
  server_lr = float(cfg.server_lr) or float(loc.lr)
  setup = htfl_common.feature_setup(config, setup)
  dim, num_classes = htfl_common.feature_dim(setup), setup.num_classes
  tgp = TrainableGlobalPrototypes(num_classes, dim, int(cfg.hidden_dim) or dim)
  collect = {g.name: htfl_common.class_statistics_pass(g, setup, batch_size=int(loc.batch_size))
             for g in setup.groups}

  def loss_for(group):  # CE + λ · the prototype regulariser (Eq. 4)
    return htfl_common.dropping_outputs(htfl_common.prototype_loss_for(group, lamda))

  phase = htfl_common.local_phase(config, setup, loss_for)

  def server_loss(params, prototypes, labels, mask, margin):
    return htfl_losses.tgp_margin_contrastive_loss(
        prototypes=prototypes, labels=labels, global_prototypes=tgp.apply({"params": params}),
        margin=margin, mask=mask)

  def init(key, data):
    del data
    client_key, server_key = jax.random.split(key)
    return {"groups": htfl_common.init_clients(setup, client_key), "tgp": tgp.init(server_key)["params"],
            "global_protos": jnp.zeros((num_classes, dim), jnp.float32),
            "proto_present": jnp.zeros((num_classes,), bool)}

  def round_fn(state, data, key, round_index):
    keys = jax.random.split(key, 5)
    local_key, server_key = keys[3], keys[4]
    aux_one = (state["global_protos"], state["proto_present"])
    groups, metrics, sums, counts = {}, {}, {}, {}
    for group in setup.groups:
      g = state["groups"][group.name]
      trained, metrics[group.name] = phase.train(
          group, g["variables"], htfl_common.broadcast_slots(aux_one, group.num_slots), data,
          local_key, round_index)
      variables = phase.keep_active(group, trained, g["variables"])
      sums[group.name], counts[group.name] = collect[group.name](variables,
                                                                 data.groups[group.name])
      groups[group.name] = {**g, "variables": variables}
    centres, present, holders = htfl_common.aggregate_class_means(setup, sums, counts)
    margin = adaptive_margin(centres, present, threshold)
    protos, labels, valid = htfl_common.uploaded_pairs(setup, sums, counts)
    params, last_loss = htfl_common.server_sgd_epochs(
        lambda p, x, y, m: server_loss(p, x, y, m, margin), state["tgp"], (protos, labels),
        valid, key=server_key, epochs=server_epochs, batch_size=server_batch,
        learning_rate=server_lr)
    global_protos = tgp.apply({"params": params})
    up = htfl_common.float_bytes(jnp.sum(holders) * dim)
    down = htfl_common.float_bytes(setup.num_participants * num_classes * dim)
    new_state = {**state, "groups": groups, "tgp": params, "global_protos": global_protos,
                 "proto_present": jnp.ones((num_classes,), bool)}
    return new_state, {"local": metrics,
                       "server": {"bytes_up": up, "bytes_down": down, "margin": margin,
                                  "server_loss": last_loss}}

  return Algorithm(name="fedtgp", init=init, round=round_fn,
                   evaluate=htfl_common.prototype_evaluate(config, setup, "fedtgp"))


def default_config() -> ml_collections.ConfigDict:
  """`local` (HtFLlib's SGD), `htfl` (pooled feature dimension) and `fedtgp`."""
  c = htfl_common.default_sections()
  c.fedtgp = ml_collections.ConfigDict({
      "lamda": 10.0,              # λ of the prototype regulariser (run_me.sh: -lam 10)
      "server_epochs": 100,       # epochs of TGP training per round (-se 100)
      "margin_threshold": 100.0,  # τ, the margin's cap (-mart 100)
      "server_lr": 0.0,           # 0: local.lr (the code's server_learning_rate)
      "server_batch_size": 0,     # 0: local.batch_size (the code's server batch)
      "hidden_dim": 0,            # 0: the feature dimension (the code's server_hidden_dim)
      "classifier": "prototype",  # inference: "prototype" (paper, code) or "head" (diagnosis)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedtgp`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "fedtgp")
  v = validation
  v.check(config, "fedtgp.lamda", lambda x: v.finite_number(x) and x >= 0, "a number >= 0")
  v.check(config, "fedtgp.server_epochs", v.int_at_least(0), "an integer >= 0")
  v.check(config, "fedtgp.margin_threshold", lambda x: v.finite_number(x) and x >= 0,
          "a number >= 0")
  v.check(config, "fedtgp.server_lr", lambda x: v.finite_number(x) and x >= 0,
          "a number >= 0 (0: local.lr)")
  for field in ("server_batch_size", "hidden_dim"):
    v.check(config, f"fedtgp.{field}", v.int_at_least(0), "an integer >= 0 (0: the default)")
  classifiers = htfl_common.PROTOTYPE_CLASSIFIERS
  v.check(config, "fedtgp.classifier", v.choice(classifiers), f"one of {classifiers}")

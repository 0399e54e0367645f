"""FedProto: clients share class prototypes; the server averages them (Tan et al., AAAI 2022).

Every round (all K clients take part, HtFLlib's `-jr 1`):
  1. Local training: `local.epochs` epochs of SGD (HtFLlib: lr 0.01, batch 10, 1 epoch) on
        L = CE(f(h), y) + λ · mean_{b, d} (h_b - C̄_{y_b})²_d
     (FedProto Eq. 8; the regulariser is `losses.htfl.prototype_regularizer`, HtFLlib's
     `MSELoss()` over the batch's B x D feature entries, a row of a class without a global
     prototype counting 0) with λ = `fedproto.lamda` and h the backbone's features pooled to
     `htfl.feature_dim` (512, HtFLlib's `BaseHeadSplit`). In round 1 no prototype exists and
     the loss is CE alone.
  2. Local prototypes (Eq. 5): C_k^(j) = the mean of the client's train-mode features h of
     class j over every batch it trained on this round, taken before each step's update
     (HtFLlib collects `rep.detach()` inside the training loop); summed per class by a
     segment sum that rides in the local trainer's carried state
     (`htfl_common.accumulating_loss`).
  3. Server (Eq. 6): C̄^(j) = the unweighted mean of C_k^(j) over the clients k holding
     class j (HtFLlib's `proto_aggregation`; Eq. 6 weights client k by its share
     |D_k,j| / N_j of the class's examples, the code does not: `fedproto.weighting`
     "uniform" (the code, default) or "size" (Eq. 6: the sum of the clients' feature sums
     over the sum of their counts)).
Inference (HtFLlib's `test_metrics`): the class of the nearest global prototype in mean
squared distance, not the head; classes without a global prototype are never predicted.
`fedproto.classifier = "head"` evaluates each client's own head instead (its logits' top-k;
the head is trained by the CE term): not the paper's inference, a diagnosis of how much of
FedProto's accuracy is its classifier's; training is unchanged.

Defaults and their sources: λ = 10 (`-lam 10` in HtFLlib's `total.sh` for FedProto; FedTGP
`run_me.sh` uses 10 for FedTGP's own regulariser, `main.py`'s default is 1), local SGD as
`htfl_common.local_config`.

Deviations from the code: each epoch visits the client's rows in a fresh random order and
keeps the last partial batch (HtFLlib's loader is `shuffle=False, drop_last=True`: the same
order every epoch, the last partial batch dropped); HtFLlib's round r evaluates before
training, this library after (its round-r numbers are HtFLlib's round r + 1).

Reference: Y. Tan, G. Long, L. Liu, T. Zhou, Q. Lu, J. Jiang, C. Zhang. FedProto: Federated
Prototype Learning across Heterogeneous Clients. AAAI 2022. Code read: TsingZ0/HtFLlib
system/flcore/clients/clientproto.py, servers/serverproto.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import validation
from fedjax_het.algorithms import htfl_common
from fedjax_het.engine.api import Algorithm, Setup

WEIGHTINGS = ("uniform", "size")


def make_fedproto(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedProto as an `Algorithm` (module docstring)."""
  cfg = config.fedproto
  lamda = float(cfg.lamda)
  weighting = cfg.weighting
  if weighting not in WEIGHTINGS:
    validation.fail("fedproto.weighting", f"one of {WEIGHTINGS}", weighting)
  setup = htfl_common.feature_setup(config, setup)
  dim, num_classes = htfl_common.feature_dim(setup), setup.num_classes

  def loss_for(group):  # CE + λ · the prototype regulariser (Eq. 8), features summed
    return htfl_common.accumulating_loss(htfl_common.prototype_loss_for(group, lamda),
                                         num_classes, "features")

  phase = htfl_common.local_phase(config, setup, loss_for)
  active = phase.active

  def init(key, data):
    del data
    return {"groups": htfl_common.init_clients(setup, key),
            "global_protos": jnp.zeros((num_classes, dim), jnp.float32),
            "proto_present": jnp.zeros((num_classes,), bool)}

  def round_fn(state, data, key, round_index):
    local_key = jax.random.split(key, 4)[3]
    groups, metrics, sums, counts = htfl_common.train_collecting(
        phase, setup, state["groups"], data, local_key, round_index,
        (state["global_protos"], state["proto_present"]), dim)
    if weighting == "uniform":
      protos, present, holders = htfl_common.aggregate_class_means(setup, sums, counts)
    else:
      total = sum(jnp.sum(jnp.where(active[n][:, None, None], sums[n], 0.0), axis=0)
                  for n in sums)
      count = sum(jnp.sum(jnp.where(active[n][:, None], counts[n], 0.0), axis=0) for n in counts)
      present = count > 0
      protos = total / jnp.where(present, count, 1.0)[:, None]
      holders = sum(jnp.sum((counts[n] > 0) & active[n][:, None], axis=0) for n in counts)
    up = htfl_common.float_bytes(jnp.sum(holders) * dim)
    down = htfl_common.float_bytes(setup.num_participants * jnp.sum(present) * dim)
    new_state = {**state, "groups": groups, "global_protos": protos, "proto_present": present}
    return new_state, {"local": metrics,
                       "server": {"bytes_up": up, "bytes_down": down,
                                  "classes_with_prototype": jnp.sum(present).astype(jnp.float32)}}

  return Algorithm(name="fedproto", init=init, round=round_fn,
                   evaluate=htfl_common.prototype_evaluate(config, setup, "fedproto"))


def default_config() -> ml_collections.ConfigDict:
  """`local` (HtFLlib's SGD), `htfl` (pooled feature dimension) and `fedproto`."""
  c = htfl_common.default_sections()
  c.fedproto = ml_collections.ConfigDict({
      "lamda": 10.0,            # λ of the prototype regulariser (HtFLlib total.sh: -lam 10)
      "weighting": "uniform",   # server mean over clients: "uniform" (code) or "size" (Eq. 6)
      "classifier": "prototype",  # inference: "prototype" (paper, code) or "head" (diagnosis)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedproto`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "fedproto")
  validation.check(config, "fedproto.lamda",
                   lambda v: validation.finite_number(v) and v >= 0, "a number >= 0")
  validation.check(config, "fedproto.weighting", validation.choice(WEIGHTINGS),
                   f"one of {WEIGHTINGS}")
  classifiers = htfl_common.PROTOTYPE_CLASSIFIERS
  validation.check(config, "fedproto.classifier", validation.choice(classifiers),
                   f"one of {classifiers}")

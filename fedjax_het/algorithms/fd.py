"""FD (Federated Distillation): clients exchange per-class mean logits (Jeong et al., 2018).

Every round (all K clients take part):
  1. Local training: `local.epochs` epochs of SGD (HtFLlib: lr 0.01, batch 10, 1 epoch) on
        L = CE(z, y) + λ · CE_soft(z, t_y)
     where t_y is the global mean logit vector of the row's class (the row's own detached
     logits where the class has none) and CE_soft(z, t) = -Σ_c t_c log softmax(z)_c with t
     used as it is (`losses.htfl.logit_distillation_loss`, `fd.target="logits"`: HtFLlib's
     `CrossEntropyLoss()(output, logit_new)` with a float target of raw logits);
     `fd.target="softmax"` takes softmax(t), the distillation toward the global average
     prediction that the FD paper describes. λ = `fd.lamda`. In round 1 there is no global
     logit and the loss is CE alone.
  2. Local logits: the mean train-mode logits of each class over every batch the client
     trained on this round, before each step's update (HtFLlib collects `output.detach()`
     in the training loop), summed per class by a segment sum that rides in the local
     trainer's carried state (`htfl_common.accumulating_loss`).
  3. Server: per class, the unweighted mean of the clients' class means over the clients
     holding the class (HtFLlib's `proto_aggregation`); sent back to every client.
Inference: each client's own model (its head's logits).

Defaults and their sources: λ = 1 (`-lam 1` for FD in HtFLlib's `total.sh`), local SGD as
`htfl_common.local_config`, features pooled to `htfl.feature_dim` = 512 before the head
(HtFLlib's `BaseHeadSplit`, which every HtFLlib method uses; FD itself exchanges no features).

Deviations from the code: each epoch visits the client's rows in a fresh random order and
keeps the last partial batch (HtFLlib: `shuffle=False, drop_last=True`); HtFLlib evaluates
before a round's training, this library after it.

Reference: E. Jeong, S. Oh, H. Kim, J. Park, M. Bennis, S.-L. Kim. Communication-Efficient
On-Device Machine Learning: Federated Distillation and Augmentation under Non-IID Private
Data. NeurIPS 2018 workshop (arXiv:1811.11479). Code read: TsingZ0/HtFLlib
system/flcore/clients/clientfd.py, servers/serverfd.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import htfl_common
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.losses import htfl as htfl_losses

TARGETS = ("logits", "softmax")


def make_fd(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FD as an `Algorithm` (module docstring)."""
  cfg = config.fd
  lamda = float(cfg.lamda)
  target = cfg.target
  if target not in TARGETS:
    validation.fail("fd.target", f"one of {TARGETS}", target)
  setup = htfl_common.feature_setup(config, setup, shared_features=False)
  num_classes = setup.num_classes

  def loss_for(group):
    forward = htfl_common.split_forward(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      class_logits, present = aux
      features, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
      kd = htfl_losses.logit_distillation_loss(logits=logits, labels=labels,
                                               class_logits=class_logits, present=present,
                                               mask=mask, target=target)
      # No global logit yet (round 1): the code adds nothing; the target would be z itself.
      kd = jnp.where(jnp.any(present), kd, 0.0)
      return ce + lamda * kd, (new_stats, {"ce": ce, "distill": kd},
                               {"features": features, "logits": logits})

    return htfl_common.accumulating_loss(loss_fn, num_classes, "logits")

  phase = htfl_common.local_phase(config, setup, loss_for)

  def init(key, data):
    del data
    return {"groups": htfl_common.init_clients(setup, key),
            "global_logits": jnp.zeros((num_classes, num_classes), jnp.float32),
            "logit_present": jnp.zeros((num_classes,), bool)}

  def round_fn(state, data, key, round_index):
    local_key = jax.random.split(key, 4)[3]
    groups, metrics, sums, counts = htfl_common.train_collecting(
        phase, setup, state["groups"], data, local_key, round_index,
        (state["global_logits"], state["logit_present"]), num_classes)
    means, present, holders = htfl_common.aggregate_class_means(setup, sums, counts)
    up = htfl_common.float_bytes(jnp.sum(holders) * num_classes)
    down = htfl_common.float_bytes(setup.num_participants * jnp.sum(present) * num_classes)
    return ({**state, "groups": groups, "global_logits": means, "logit_present": present},
            {"local": metrics, "server": {"bytes_up": up, "bytes_down": down}})

  return Algorithm(name="fd", init=init, round=round_fn,
                   evaluate=htfl_common.make_evaluate(config, setup))


def default_config() -> ml_collections.ConfigDict:
  """`local` (HtFLlib's SGD), `htfl` (pooled feature dimension) and `fd`."""
  c = htfl_common.default_sections()
  c.fd = ml_collections.ConfigDict({
      "lamda": 1.0,          # weight of the distillation term (HtFLlib total.sh: -lam 1)
      "target": "logits",    # "logits": the code's raw-logit target; "softmax": probabilities
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fd`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "fd")
  validation.check(config, "fd.lamda", lambda v: validation.finite_number(v) and v >= 0,
                   "a number >= 0")
  validation.check(config, "fd.target", validation.choice(TARGETS), f"one of {TARGETS}")

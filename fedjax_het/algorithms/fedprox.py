"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds a proximal term.

Local objective of client k in round t (FedProx Eq. 2):
    h_k(w; w_t) = F_k(w) + (mu / 2) ||w - w_t||^2,
F_k the cross-entropy on its private batch, w_t the round's server model
(a constant), mu = `fedprox.mu` (0.01, the FCCL+ benchmark default). Sampling,
aggregation and the server step are FedAvg's (`fedavg.py`, `config.fedavg`,
`config.server`). With mu = 0 FedProx is FedAvg.

Deviation: the paper lets clients solve the local problem inexactly with a
variable amount of work; here every sampled client runs `local.epochs` epochs,
as in the FCCL+ benchmark code.

Reference: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith.
Federated Optimization in Heterogeneous Networks. MLSys 2020.
"""

from __future__ import annotations

import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, fedavg_family
from fedjax_het.engine.api import Algorithm, Setup


def make_fedprox(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedProx from `config.fedprox`, `config.fedavg`, `config.local`, `config.server`."""
  mu = float(config.fedprox.mu)

  def objective_for(group):
    forward = common.forward_fn(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      _, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
      proximal = losses.proximal_term(params=params, global_params=aux["global"]["params"],
                                      mu=mu)
      return ce + proximal, (new_stats, {"ce": ce, "proximal": proximal})

    return loss_fn

  return fedavg_family.make_family(config, setup, name="fedprox", objective_for=objective_for)


def default_config() -> ml_collections.ConfigDict:
  c = fedavg_family.family_default_config()
  c.fedprox = ml_collections.ConfigDict({"mu": 0.01})  # FedProx Eq. 2; FCCL+ benchmark value
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  fedavg_family.validate_config(config)
  validation.require_section(config, "fedprox")
  validation.check(config, "fedprox.mu", lambda x: x >= 0, "a number >= 0")

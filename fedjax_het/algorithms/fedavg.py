"""FedAvg (McMahan et al., AISTATS 2017) with client sampling and an optax server optimiser.

Every communication round t:
  1. Sample `fedavg.clients_per_round` of the K participants uniformly without
     replacement (0: all of them, the FCCL+ benchmark setting). The draw uses the
     round's key, so a resumed run samples the same cohorts.
  2. Every sampled client starts from the server model w_t and runs
     `local.epochs` epochs of minibatch training on its private data
     (`local.optimizer` with `local.momentum` for SGD, fresh state every
     round; `local.lr` per round by `local.lr_schedule`: "linear", the
     FCCL/FCCL+ code's linear decay by `local.lr_decay` over the run, or
     "exponential", lr * `local.lr_decay_rate` ** round floored at
     `local.min_lr`, the FedFusion code's schedule). The local objective is cross-entropy;
     methods of the FedAvg family (FedProx, ...) pass their own objective to
     `fedavg_family.make_family`.
  3. The cohort's models are averaged, weighted by local data size n_k
     (`fedavg.weighting="size"`, McMahan's w = sum_k n_k w_k / n) or uniformly
     ("uniform", the FCCL+ benchmark code's `aggregate_nets(freq=None)`);
     parameters and BatchNorm statistics alike.
  4. Server: w_{t+1} = w_t - optax_step(w_t - mean) with `config.server`
     ("sgd" lr 1: w_{t+1} = mean, plain FedAvg; "momentum": FedAvgM;
     "adam": FedAdam). BatchNorm statistics are set to the average.

The round is the FedAvg family's (`fedavg_family.make_family`) with cross-entropy as
the local objective; `fedavg_family` describes what the family's round also offers
(the cohort's client loop, the server metrics, dropout, "global" / "local"
evaluation) and the hooks of the other members.

Reference: B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas.
Communication-Efficient Learning of Deep Networks from Decentralized Data.
AISTATS 2017. Server optimisers: S. Reddi et al., Adaptive Federated
Optimization, ICLR 2021; T. Hsu, H. Qi, M. Brown, Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification, 2019.
"""

from __future__ import annotations

import ml_collections

from fedjax_het.algorithms import fedavg_family
from fedjax_het.engine.api import Algorithm, Setup


def make_fedavg(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedAvg from `config.fedavg`, `config.local`, `config.server`."""
  return fedavg_family.make_family(config, setup, name="fedavg",
                                   objective_for=fedavg_family.cross_entropy_objective)


def default_config() -> ml_collections.ConfigDict:
  return fedavg_family.family_default_config()


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks the FedAvg family's sections (`fedavg_family.validate_config`)."""
  fedavg_family.validate_config(config)

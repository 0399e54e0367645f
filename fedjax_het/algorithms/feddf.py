"""FedDF in the heterogeneous FCCL+ benchmark: ensemble distillation on public data + local CE.

Reference: T. Lin, L. Kong, S. U. Stich, M. Jaggi. Ensemble Distillation for
Robust Model Fusion in Federated Learning. NeurIPS 2020 (arXiv:2006.07242).

The FCCL+ benchmark has no server model for heterogeneous participants: every
participant is both an ensemble member and a student. Every round r (all K
participants take part), in the benchmark's order (`feddf.order`, default
"distill_then_local"):
  1. Ensemble distillation on every batch X of B0 = `collaborative.batch_size`
     public images (`collaborative.epochs` passes, fresh order per pass,
     augmented as `collaborative.augmentation`):
       teacher  Z_bar = 1/K sum_j Z_j(X), the mean of ALL participants'
                train-mode logits, the student's own included, detached;
       loss     L_i = 1/B0 sum_b KL(softmax(Z_bar_b / T) || softmax(Z_i,b / T))
                (`losses.ensemble_distillation_loss`; torch `KLDivLoss(
                reduction="batchmean")`), T = `feddf.temperature` (1 in the
                code; no T^2 factor);
     one step of every participant with the collaborative optimiser: default
     SGD lr 1e-3 with L2 weight decay `feddf.weight_decay` = 1e-5 (torch
     `SGD(lr, weight_decay=1e-5)`, re-created per batch, stateless), rate
     lr0 (1 - 0.9 max(r-1, 0)/E).
  2. Local training: `local.epochs` epochs of private cross-entropy with
     `config.local` (Adam 1e-3, L2 1e-5, the same linear decay), a fresh
     optimiser every round.
The models are evaluated after step 2. Homogeneous variant
(`feddf.average_parameters=True`, one architecture): every participant starts
from the same initialisation and the participants' parameters and BatchNorm
statistics are averaged before the local training, as the benchmark code does.

When the ensemble is computed: once per public batch, from the models every
participant holds at the start of that batch, i.e. before this batch's
update of any participant (the code computes all K detached targets, then
steps the participants one by one; one train-mode forward gives both here,
`common.consensus_step`). So the teacher of the first batch of round r is
the ensemble of the models after round r-1's local training ("after local
training, each participant is distilled toward the ensemble"), and later
batches see the models distilled so far. Round 1 distils the initial models.

Interpretations and deviations:
  * `feddf.order="local_then_distill"` runs the local training first and
    distils the freshly trained models in the same round (the FedDF paper's
    order: fuse after the local updates), so the evaluated models are the
    distilled ones.
  * One forward pass per participant and batch: the code runs a second
    train-mode forward for the student, which gives the same logits but
    updates the BatchNorm running statistics a second time.
  * The code's torch form softmax(Z).log() turns an underflowed student
    probability into -inf (NaN gradients for saturated logits);
    `ensemble_distillation_loss` uses log-softmax and stays finite.
  * The benchmark code's Digits settings use public batches of 256 and local
    batches of 128; the defaults here are the FCCL+ paper's 512 and 256 for
    every method (`collaborative.batch_size`, `local.batch_size`).
  * The FedDF paper distils a server model (initialised from the parameter
    average) with Adam and early stopping on a validation set; neither exists
    in the heterogeneous benchmark.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.engine import aggregation, local, public
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import slot_active
from fedjax_het.engine.optim import make_optimizer

ORDERS = ("distill_then_local", "local_then_distill")


class Phases(NamedTuple):
  """FedDF's phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state.
  distill_step: (state, public images, key, round) -> (state, metrics): one
    ensemble-distillation step of every participant on one public batch.
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
  """
  init: Any
  distill_step: Any
  local_update: Any


def distillation_optimizer(config: ml_collections.ConfigDict) -> Any:
  """FedDF's collaborative optimiser: `collaborative.optimizer` with L2 weight decay
  `feddf.weight_decay` (the benchmark code's torch `SGD(lr, weight_decay=1e-5)`)."""
  return make_optimizer(config.collaborative.optimizer,
                        weight_decay=float(config.feddf.weight_decay))


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """FedDF's phases from `config.feddf`, `config.collaborative`, `config.local`."""
  cfg, loc = config.feddf, config.local
  tau = float(cfg.temperature)
  average = common.check_parameter_averaging("feddf.average_parameters",
                                              cfg.average_parameters, setup)
  pieces = common.public_and_local_pieces(config, setup,
                                         public_optimizer=distillation_optimizer(config))
  col_tx, keep_optimizer = pieces.public_optimizer, pieces.reset != "batch"
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}
  init = common.fresh_init(setup, shared=average,
                           public_optimizer=col_tx if keep_optimizer else None)

  def distill(z, teacher):
    kl = losses.ensemble_distillation_loss(student_logits=z, client_logits=teacher[None],
                                           temperature=tau)
    return kl, {"kl": kl}

  def distill_step(state, images, key, round_index):
    return common.consensus_step(setup, state, images, key, distill, col_tx,
                                 pieces.public_lr(round_index), keep_optimizer=keep_optimizer)

  def average_all(variables):  # homogeneous variant: average before local training
    return {name: aggregation.average_over_active(v, active[name])
            for name, v in variables.items()}

  local_update = private_training.make_private_update(setup, pieces.trainers, int(loc.epochs),
                                                      pieces.local_lr,
                                                      prepare=average_all if average else None)

  return Phases(init=init, distill_step=distill_step, local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one FedDF round over all K participants, from the shapes.

  Logits as FedMD (FCCL+ Table II, |B0| x C): on each public batch (`common.public_batches`)
  every participant sends its logits Z_i (B, C) and receives the ensemble Z_bar (B, C):
  K x batches x B x C x 4 bytes each way. The homogeneous variant
  (`feddf.average_parameters`) also sends every model up and the average down once a round.
  """
  batch, batches = common.public_batches(int(config.collaborative.batch_size),
                                         int(config.collaborative.epochs), num_public)
  total = setup.num_participants * batches * batch * setup.num_classes * 4
  if bool(config.feddf.average_parameters):
    total += sum(g.num_clients * common.model_bytes(g.model) for g in setup.groups)
  return total, total


def make_feddf(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedDF as an `Algorithm`: public ensemble distillation and local CE, in `feddf.order`.

  The round is given as these two stages, in that order (`Algorithm.stages`), so
  the trainer can compile each as its own program (`config.round_programs`). The
  distillation stage's metrics hold the round's ["server"]["bytes_up" | "bytes_down"]
  (`communication_bytes`).
  """
  phases = make_phases(config, setup)
  order = common.check_choice("feddf.order", config.feddf.order, ORDERS)
  return common.public_then_local_algorithm(
      "feddf", config, setup, phases.init, step=phases.distill_step,
      local_update=phases.local_update, communication_bytes=communication_bytes,
      public_optimizer=distillation_optimizer(config),
      local_first=order == "local_then_distill")


def default_config() -> ml_collections.ConfigDict:
  """The config sections FedDF reads, with the FCCL+ benchmark code's defaults."""
  collaborative = public.default_config()
  collaborative.optimizer = "sgd"  # the benchmark code's distillation optimiser
  return ml_collections.ConfigDict({
      "collaborative": collaborative,
      "local": local.default_config(),
      "feddf": {
          "temperature": 1.0,            # T of the KL (the code: softmax without temperature)
          "weight_decay": 1e-5,          # L2 of the distillation optimiser (torch SGD)
          "order": "distill_then_local",  # the benchmark's round; "local_then_distill"
          "average_parameters": False,    # True: homogeneous variant (FedAvg before local)
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.feddf`, `config.collaborative` and `config.local`."""
  public.validate_config(config)
  local.validate_config(config)
  validation.require_section(config, "feddf")
  v = validation
  v.check(config, "feddf.temperature", v.positive, "a number > 0")
  v.check(config, "feddf.weight_decay", lambda x: x >= 0 and not isinstance(x, bool),
          "a number >= 0")
  v.check(config, "feddf.order", v.choice(ORDERS), f"one of {ORDERS}")
  v.check(config, "feddf.average_parameters", v.is_bool, "True or False")
  if config.feddf.average_parameters and len(set(config.models.architectures)) > 1:
    v.fail("feddf.average_parameters",
           "False unless every participant uses the same architecture", True)

"""FedFusion (Yao et al.): FedAvg with the frozen global feature extractor fused into local training.

The model of a run (`config.models.architectures`, one zoo model with a
trunk, e.g. `fedavg_mnist_cnn` or `fedavg_cifar_cnn`) is wrapped into
`models.fedfusion.FedFusion`: its trunk E_l (trainable), a copy E_g of the
trunk (frozen), a fusion operator F and the model's classifier C (tail and
head). Every round (FedFusion Algorithm 2):

  1. The server samples the cohort (`config.fedavg`) and sends its model G_r.
  2. Each sampled client sets L = C o F o E_l <- G_r and E_g <- the trunk of
     G_r (frozen for the round: eval mode, no gradient, no weight decay,
     `prepare_server` below), then trains E_l, F and C on
     CE(C(F(E_l(x), E_g(x))), y) for `local.epochs` epochs. E_g(x) is
     computed once per batch (in the forward pass; no gradient flows back).
  3. The server averages the cohort's models, the fusion parameters included
     (Algorithm 2 line 7, data-size weighting by `fedavg.weighting`). For
     "multi" and "single" the fusion weight gamma is smoothed across rounds
     by an exponential moving average, gamma_{r+1} = m * gamma_r + (1 - m) *
     mean_k gamma_k with m = `fedfusion.gamma_ema` = 0.9 (the authors' code:
     `gamma = (1 - mu) * gamma + mu * shadow`, mu = 0.9, shadow the previous
     global gamma); here it is a server optimiser step, SGD with rate 1 - m
     on gamma's pseudo-gradient (`server - mean`), while every other
     parameter takes `config.server`'s step.

Fusion operators (`fedfusion.fusion`, FedFusion Eq. 6-8): "conv" (a 1x1
convolution of the concatenated maps, 2C -> C), "multi" (a per-channel
gamma, gamma * E_g + (1 - gamma) * E_l) and "single" (one scalar gamma);
gamma starts at 0, so a "multi"/"single" model starts as the plain model.
The "conv" layer starts from PyTorch's default initialisation, as the code
(`fedfusion.conv_init="torch"`): an extra random layer between the trunk and
the classifier, which trains slower than the plain model at the paper's
small learning rates (measured here on MNIST: 75.5% vs 81.2% after 4
centralised epochs, 2000 images, SGD 0.002 with momentum); "identity"
(kernel [I; 0], bias 0) starts it as the plain model instead (this
library's option, not the paper's).

The global model the server evaluates is the averaged fused model, whose
frozen trunk is still the one the round's clients used (the previous round's
trunk), exactly what the authors' code tests. `bytes_up` / `bytes_down` count
the trunk, fusion and classifier once: the frozen trunk is a copy of the
received trunk and is never sent.

Dropout: `config.models.dropout_rate` (0.2 in the paper settings of
`fedjax_het/configs/_two_stream.py` and in `mnist_fedfusion`, the authors'
code's p for every fusion operator and for FedAvg's model; 0 or absent in their
`_nodropout` variants) puts dropout after the fully connected layers of the
classifier C (the tail, fed by the fused map), active in local training only,
never in the frozen trunk or in evaluation (`common.with_model_dropout`).

Learning rate: the paper decays it exponentially per round (0.985 on the
artificial non-IID CIFAR-10 split, 0.99 on permuted MNIST): set
`local.lr_schedule="exponential"`, `local.lr_decay_rate`, `local.min_lr`
(the code floors the rate at 1e-4), as the `*_fedfusion_*` configs do.

Deviations:
  * The authors' code keeps each client's SGD momentum buffer across rounds
    (its optimiser is built once per client); here the local optimiser state
    is fresh every round, as in FedAvg.
  * The code averages the models uniformly; Algorithm 2 weights them by data
    size (the default here, `fedavg.weighting="size"`; equal when the clients
    hold equal data, as in the paper's binary split).

Reference: X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun. Towards Faster and
Better Federated Learning: A Feature Fusion Approach. ICIP 2019; and
Federated Learning with Additional Mechanisms on Clients to Reduce
Communication Costs, 2019 (arXiv:1908.05891), Sec. 3.2, Algorithm 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import optax

from fedjax_het import validation
from fedjax_het.algorithms import common, fedavg_family
from fedjax_het.engine import aggregation
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.errors import ConfigError
from fedjax_het.models.fedfusion import (CONV_INITS, FUSION_OPERATORS, FedFusion, FusionOperator,
                                         fedfusion_local_variables, fedfusion_set_global,
                                         fedfusion_trainable_mask)


def fuse(base: Any, fusion: str, conv_init: str = "torch") -> FedFusion:
  """The FedFusion model around a zoo `Classifier` (its trunk twice, its tail and head)."""
  if not all(hasattr(base, a) for a in ("trunk", "tail", "num_classes")):
    raise ConfigError(f"FedFusion needs a model with a convolutional trunk and a classifier "
                      f"tail (the zoo's Classifier models), got {type(base).__name__}.")
  conv_impl = getattr(base.trunk, "conv_impl", "xla")
  return FedFusion(local_trunk=base.trunk.clone(), global_trunk=base.trunk.clone(),
                   fusion=FusionOperator(fusion, conv_impl, conv_init), tail=base.tail.clone(),
                   num_classes=base.num_classes, head_init_bound=base.head_init_bound)


def load_global_trunk(variables: Any) -> Any:
  """FedFusion variables with the frozen trunk set to (a copy of) the trainable trunk."""
  return fedfusion_set_global(variables, fedfusion_local_variables(variables))


def without_global_trunk(variables: Any) -> Any:
  """The variables a client and the server exchange (the frozen trunk is a local copy)."""
  return {collection: {k: v for k, v in tree.items() if k != "global_trunk"}
          for collection, tree in variables.items()}


def gamma_ema_server_tx(rest: optax.GradientTransformation, ema: float
                        ) -> optax.GradientTransformation:
  """`rest` on every parameter but the fusion gamma, which moves by (1 - ema) toward the mean."""
  def labels(params):
    return {key: jax.tree_util.tree_map(
        lambda _, k=key: "gamma" if k == "fusion" and "gamma" in params["fusion"] else "rest",
        value) for key, value in params.items()}
  return optax.multi_transform({"gamma": optax.sgd(1.0 - ema), "rest": rest}, labels)


def fused_setup(config: ml_collections.ConfigDict, setup: Setup) -> Setup:
  """`setup` with its one group's model wrapped into FedFusion (`config.fedfusion.fusion`),
  its tail with `config.models.dropout_rate` (`common.with_model_dropout`)."""
  fusion = common.check_choice("fedfusion.fusion", config.fedfusion.fusion, FUSION_OPERATORS)
  conv_init = common.check_choice("fedfusion.conv_init", config.fedfusion.conv_init, CONV_INITS)
  group = fedavg_family.the_group(common.with_model_dropout(config, setup), "fedfusion")
  # `model_on_public` stays the fused model too (FedFusion itself has no public batch).
  public_model = (None if group.public_model is None
                  else fuse(group.public_model, fusion, conv_init))
  return dataclasses.replace(setup, groups=(dataclasses.replace(
      group, model=fuse(group.model, fusion, conv_init), public_model=public_model),))


def make_fedfusion(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedFusion from `config.fedfusion`, `config.fedavg`, `config.local`, `config.server`."""
  fusion = common.check_choice("fedfusion.fusion", config.fedfusion.fusion, FUSION_OPERATORS)
  ema = float(config.fedfusion.gamma_ema)
  server_tx = aggregation.server_optimizer_from_config(config.server)
  if fusion in ("multi", "single"):
    server_tx = gamma_ema_server_tx(server_tx, ema)
  return fedavg_family.make_family(
      config, fused_setup(config, setup), name="fedfusion",
      objective_for=fedavg_family.cross_entropy_objective, prepare_server=load_global_trunk,
      server_tx=server_tx, decay_mask=fedfusion_trainable_mask, communicated=without_global_trunk)


def default_config() -> ml_collections.ConfigDict:
  c = fedavg_family.family_default_config()
  c.fedfusion = ml_collections.ConfigDict({
      "fusion": "conv",     # FedFusion Eq. 6-8: "conv" | "multi" | "single"
      "gamma_ema": 0.9,     # multi/single: server EMA of gamma (the code's mu); 0: plain mean
      "conv_init": "torch",  # conv: "torch" (the code) | "identity" (starts as the base model)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  fedavg_family.validate_config(config)
  validation.require_section(config, "fedfusion")
  validation.check(config, "fedfusion.fusion", validation.choice(FUSION_OPERATORS),
                   f"one of {FUSION_OPERATORS}")
  validation.check(config, "fedfusion.gamma_ema", lambda v: 0 <= v < 1, "a number in [0, 1)")
  validation.check(config, "fedfusion.conv_init", validation.choice(CONV_INITS),
                   f"one of {CONV_INITS}")

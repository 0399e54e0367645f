"""FedMMD (Yao et al.): FedAvg whose clients train a local stream beside the frozen global one.

Every round (FedMMD Algorithm 1) each sampled client t receives the global
model Theta^G, keeps it frozen as the reference stream, initialises its local
model from it (Theta^L <- Theta^G) and minimises on its private batches
(FedMMD Eq. 3-5)

    L(Theta^L | Theta^G, X, Y) = CE(theta^L(X), Y) + lambda * D(theta^G(X), theta^L(X)),

then the server averages the local models as FedAvg does (`fedavg.py`:
sampling, data-size weighting, `config.server`). The constraint D
(`fedmmd.constraint`):

  * "mmd" (the paper): the squared multi-kernel MMD between the two streams'
    outputs on the batch, 19 Gaussian kernels of variances 1e-6 ... 1e6
    (`losses.multi_kernel_mmd_squared`, biased estimator), lambda = 0.1
    (`fedmmd.weight`). `fedmmd.mmd_floor`: the authors' code floors MMD^2 at
    1e-4 (the default; below it the term has no gradient), 0 clips at 0 as
    the paper's MMD^2 >= 0.
  * "l2" (the authors' final code): lambda * tf.nn.l2_loss(local - global),
    half the squared sum over the batch and the outputs
    (`losses.two_stream_l2_loss`, `fedmmd.l2_reduction="tf_l2_loss"`, so the
    code's lambda = 0.001 on MNIST, 0.01 on CIFAR-10 transfer), or the
    batch-mean (`"batch_mean"`).

`fedmmd.outputs` picks the two streams' outputs the constraint compares:
"features" (the penultimate layer, the zoo models' `features`), "logits"
(the code's L2 variant works on logits) or "trunk" (the convolutional trunk's
feature map, flattened to (B, h * w * c): the output the authors' FedFusion
`CifarModel.forward` returns beside its logits, and the features FedFusion
fuses; before the fully connected layers and their dropout). The global
stream runs in eval mode (running BatchNorm statistics, no dropout) and gets
no gradient.

Dropout: `config.models.dropout_rate` (0.2 in the paper settings of
`fedjax_het/configs/_two_stream.py` and in `mnist_fedmmd`, the authors'
FedFusion code's p; 0 or absent in their `_nodropout` variants) puts the
dropout the paper's CNNs have (Sec. 4.1) after their fully connected layers,
active in local training only, never in the frozen global stream
(`common.with_model_dropout`, applied by `fedavg_family.make_family`). So with
dropout, "features" compares the local stream's dropped-out features with
the global stream's full ones, and "trunk" compares two maps no dropout
touches.

Deviations: the paper does not say which layer's "outputs" MMD compares; the
default here is the features for "mmd" as in the DAN/DSN domain-adaptation
losses it cites (`fedmmd.outputs="logits"` or `"trunk"` for the other
readings).
Local optimiser state is fresh every round (see `fedavg.py`).

Reference: X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun. Federated Learning
with Additional Mechanisms on Clients to Reduce Communication Costs. 2019
(arXiv:1908.05891).
"""

from __future__ import annotations

import jax
import ml_collections

from fedjax_het import losses, models, validation
from fedjax_het.algorithms import common, fedavg_family
from fedjax_het.engine.api import Algorithm, Setup

CONSTRAINTS = ("mmd", "l2")
OUTPUTS = ("features", "logits", "trunk")


def make_objective(config: ml_collections.ConfigDict) -> fedavg_family.ObjectiveFor:
  """group -> FedMMD's local loss (Eq. 3-5) from `config.fedmmd`; `aux["global"]` is the stream."""
  cfg = config.fedmmd
  constraint = common.check_choice("fedmmd.constraint", cfg.constraint, CONSTRAINTS)
  outputs = common.check_choice("fedmmd.outputs", cfg.outputs, OUTPUTS)
  weight, floor = float(cfg.weight), float(cfg.mmd_floor)
  reduction = common.check_choice("fedmmd.l2_reduction", cfg.l2_reduction,
                                  losses.L2_REDUCTIONS)

  def two_stream(local_out, global_out, mask):
    if constraint == "mmd":
      return losses.multi_kernel_mmd_squared(x=global_out, y=local_out, floor=floor, mask=mask)
    return losses.two_stream_l2_loss(local_outputs=local_out, global_outputs=global_out,
                                     reduction=reduction, mask=mask)

  def objective_for(group):
    forward = streams_fn(group, outputs, train=True)
    frozen = streams_fn(group, outputs, train=False)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      local_out, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      global_out = frozen(aux["global"]["params"], aux["global"]["batch_stats"], images)[0]
      ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
      penalty = two_stream(local_out, jax.lax.stop_gradient(global_out), mask)
      return ce + weight * penalty, (new_stats, {"ce": ce, constraint: penalty})

    return loss_fn

  return objective_for


def streams_fn(group, outputs: str, *, train: bool):
  """(params, batch_stats, images, rng, mask) -> (the `outputs` the constraint compares,
  logits, new batch_stats) of one stream: "features", "logits", or "trunk" (the trunk's
  feature map flattened to (B, h * w * c), from the same forward pass)."""
  if outputs != "trunk":
    forward = common.forward_fn(group, train=train)

    def plain(params, batch_stats, images, rng=None, mask=None):
      features, logits, new_stats = forward(params, batch_stats, images, rng, mask)
      return (logits if outputs == "logits" else features), logits, new_stats
    return plain

  def with_trunk(params, batch_stats, images, rng=None, mask=None):
    feature_map, _, logits, new_variables = models.apply_model_with_trunk(
        group.model, {"params": params, "batch_stats": batch_stats}, images, train=train,
        rng=rng, mask=mask)
    return (feature_map.reshape(feature_map.shape[0], -1), logits,
            new_variables["batch_stats"])
  return with_trunk


def make_fedmmd(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedMMD from `config.fedmmd`, `config.fedavg`, `config.local`, `config.server` (and
  `config.models.dropout_rate`, read by `fedavg_family.make_family`)."""
  return fedavg_family.make_family(config, setup, name="fedmmd",
                                   objective_for=make_objective(config))


def default_config() -> ml_collections.ConfigDict:
  c = fedavg_family.family_default_config()
  c.fedmmd = ml_collections.ConfigDict({
      "constraint": "mmd",          # "mmd" (paper, Eq. 5) | "l2" (the authors' final code)
      "weight": 0.1,                # lambda (paper: 0.1 for MMD; code's L2: 0.001 / 0.01)
      "outputs": "features",        # the streams' outputs compared: "features" | "logits" | "trunk"
      "mmd_floor": losses.MMD_CODE_FLOOR,  # the code's floor of MMD^2; 0: clip at 0
      "l2_reduction": "tf_l2_loss",  # "tf_l2_loss" (code) | "batch_mean"
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  fedavg_family.validate_config(config)
  validation.require_section(config, "fedmmd")
  validation.check(config, "fedmmd.constraint", validation.choice(CONSTRAINTS),
                   f"one of {CONSTRAINTS}")
  validation.check(config, "fedmmd.outputs", validation.choice(OUTPUTS), f"one of {OUTPUTS}")
  validation.check(config, "fedmmd.weight", lambda v: v >= 0, "a number >= 0")
  validation.check(config, "fedmmd.mmd_floor", lambda v: v >= 0, "a number >= 0")
  validation.check(config, "fedmmd.l2_reduction", validation.choice(losses.L2_REDUCTIONS),
                   f"one of {losses.L2_REDUCTIONS}")

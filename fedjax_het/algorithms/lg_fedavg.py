"""LG-FedAvg (Liang et al., 2020) and FedGH (Yi et al., ACM MM 2023): a head shared by every
architecture on top of heterogeneous feature extractors.

Both keep one global head g (Linear(D, C) on the features pooled to D = `htfl.feature_dim`,
HtFLlib's `BaseHeadSplit`, so every backbone's head has one shape), start from participant
0's initial head (HtFLlib's servers copy client 0's), and every round (all K clients):
  1. Every client's head is replaced by g (HtFLlib's `set_parameters`, before evaluation
     and training); its feature extractor stays its own.
  2. Local training: `local.epochs` epochs of SGD on CE of the whole model, head included
     (HtFLlib: lr 0.01, batch 10, 1 epoch).
  3. Server:
     * LG-FedAvg (`lg_fedavg`; Liang et al. Algorithm 1 with the global part = the head, as
       HtFLlib runs it): g = Σ_k (n_k / n) g_k, the clients' heads averaged with weights
       their training-set sizes (HtFLlib's `receive_ids` / `aggregate_parameters`).
     * FedGH (`fedgh`; Yi et al. Sec. 3, Eq. 3-5): each client uploads its class
       prototypes, the means of the eval-mode features of its trained model over its
       training rows per class (HtFLlib's `collect_protos`); the server trains g on the
       uploaded (prototype, class) pairs with CE for `fedgh.server_epochs` epochs of SGD at
       `fedgh.server_lr` in shuffled batches of `local.batch_size` (HtFLlib's `train_head`,
       the client batch size).
Inference: every client's feature extractor with the global head g (its head after step 1
of the next round, which is what HtFLlib evaluates). `lg_fedavg.classifier` /
`fedgh.classifier = "local"` evaluates each client's own head after its local training
instead (the head it uploads or, in FedGH, the one the prototypes left behind): not the
papers' inference, a diagnosis of how much the global head costs; training is unchanged.

Defaults and their sources: FedGH server lr 0.01 and 1 server epoch (HtFLlib `total.sh`:
`-slr 0.01 -se 1`); local SGD as `htfl_common.local_config`; features pooled to 512.

Deviations from the code: FedGH's prototypes average every training row (the code's loader
drops the last partial batch); each local epoch visits the rows in a fresh random order
and keeps the last partial batch; HtFLlib evaluates before a round's training, this
library after it.

References: P. P. Liang, T. Liu, L. Ziyin, N. B. Allen, R. P. Auerbach, D. Brent,
R. Salakhutdinov, L.-P. Morency. Think Locally, Act Globally: Federated Learning with Local
and Global Representations. arXiv:2001.01523, 2020. L. Yi, G. Wang, X. Liu, Z. Shi, H. Yu.
FedGH: Heterogeneous Federated Learning with Generalized Global Header. ACM MM 2023. Code
read: TsingZ0/HtFLlib system/flcore/clients/clientlg.py, clientgh.py, servers/serverlg.py,
servergh.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, htfl_common
from fedjax_het.engine.api import Algorithm, Setup


#: `lg_fedavg.classifier` / `fedgh.classifier`: the global head (the papers' and HtFLlib's
#: inference) or each client's own head after its local training (a diagnosis).
CLASSIFIERS = ("global", "local")


def with_head(variables, head, num_slots):
  """Stacked variables whose "head" parameters are `head` in every slot."""
  params = {**variables["params"], "head": htfl_common.broadcast_slots(head, num_slots)}
  return {**variables, "params": params}


def make_global_head_method(name: str, config: ml_collections.ConfigDict, setup: Setup,
                            *, server: str) -> Algorithm:
  """LG-FedAvg (`server="average"`) or FedGH (`server="prototypes"`), module docstring."""
  loc = config.local
  setup = htfl_common.feature_setup(config, setup)
  dim, num_classes = htfl_common.feature_dim(setup), setup.num_classes
  phase = htfl_common.local_phase(config, setup, common.cross_entropy_loss_for)
  if server == "prototypes":
    cfg = config.fedgh
    server_epochs, server_lr = int(cfg.server_epochs), float(cfg.server_lr)
    server_batch = int(cfg.server_batch_size) or int(loc.batch_size)
    collect = {g.name: htfl_common.class_statistics_pass(g, setup,
                                                         batch_size=int(loc.batch_size))
               for g in setup.groups}
  first = next(g for g in setup.groups if 0 in g.clients)
  head_floats = (dim + 1) * num_classes

  def head_loss(head, prototypes, labels, mask):
    logits = prototypes @ head["kernel"] + head["bias"][None, :]
    return losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)

  def init(key, data):
    del data
    groups = htfl_common.init_clients(setup, key)
    head = jax.tree_util.tree_map(lambda x: x[first.clients.index(0)],
                                  groups[first.name]["variables"]["params"]["head"])
    return {"groups": groups, "head": head}

  def round_fn(state, data, key, round_index):
    keys = jax.random.split(key, 5)
    local_key, server_key = keys[3], keys[4]
    groups, metrics, sums, counts, heads, weights = {}, {}, {}, {}, {}, {}
    for group in setup.groups:
      g = state["groups"][group.name]
      start = with_head(g["variables"], state["head"], group.num_slots)
      trained, metrics[group.name] = phase.train(
          group, start, jnp.zeros((group.num_slots,)), data, local_key, round_index)
      variables = phase.keep_active(group, trained, start)
      groups[group.name] = {**g, "variables": variables}
      heads[group.name] = variables["params"]["head"]
      weights[group.name] = jnp.where(phase.active[group.name],
                                      data.groups[group.name].sizes.astype(jnp.float32), 0.0)
      if server == "prototypes":
        sums[group.name], counts[group.name] = collect[group.name](variables,
                                                                   data.groups[group.name])
    k = setup.num_participants
    if server == "average":
      head = htfl_common.weighted_tree_mean(heads, weights)
      server_metrics = {"bytes_up": htfl_common.float_bytes(k * head_floats),
                        "bytes_down": htfl_common.float_bytes(k * head_floats)}
    else:
      protos, labels, valid = htfl_common.uploaded_pairs(setup, sums, counts)
      head, last_loss = htfl_common.server_sgd_epochs(
          head_loss, state["head"], (protos, labels), valid, key=server_key,
          epochs=server_epochs, batch_size=server_batch, learning_rate=server_lr)
      server_metrics = {"bytes_up": htfl_common.float_bytes(jnp.sum(valid) * (dim + 1)),
                        "bytes_down": htfl_common.float_bytes(k * head_floats),
                        "server_loss": last_loss}
    return {**state, "groups": groups, "head": head}, {"local": metrics,
                                                       "server": server_metrics}

  section = "lg_fedavg" if server == "average" else "fedgh"
  classifier = config.get(section, {}).get("classifier", "global")
  if classifier not in CLASSIFIERS:
    validation.fail(f"{section}.classifier", f"one of {CLASSIFIERS}", classifier)
  if classifier == "local":   # the clients' trained variables, their own heads included
    evaluate = htfl_common.make_evaluate(config, setup)
  else:
    evaluate = htfl_common.make_evaluate(
        config, setup, variables=lambda state, group: with_head(
            state["groups"][group]["variables"], state["head"],
            next(g.num_slots for g in setup.groups if g.name == group)))
  return Algorithm(name=name, init=init, round=round_fn, evaluate=evaluate)


def make_lg_fedavg(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """LG-FedAvg: the clients' heads averaged (module docstring)."""
  return make_global_head_method("lg_fedavg", config, setup, server="average")


def make_fedgh(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedGH: a global head trained on the clients' prototypes (module docstring)."""
  return make_global_head_method("fedgh", config, setup, server="prototypes")


def default_config() -> ml_collections.ConfigDict:
  """LG-FedAvg's sections: `local` (HtFLlib's SGD), `htfl` (pooled feature dimension) and
  `lg_fedavg` (the inference's head)."""
  c = htfl_common.default_sections()
  c.lg_fedavg = ml_collections.ConfigDict({
      "classifier": "global",   # inference: "global" head (paper, code) or "local" (diagnosis)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks LG-FedAvg's `config.lg_fedavg`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "lg_fedavg")
  validation.check(config, "lg_fedavg.classifier", validation.choice(CLASSIFIERS),
                   f"one of {CLASSIFIERS}")


def fedgh_default_config() -> ml_collections.ConfigDict:
  """FedGH's sections: `local`, `htfl` and `fedgh` (the server's head training)."""
  c = htfl_common.default_sections()
  c.fedgh = ml_collections.ConfigDict({
      "server_epochs": 1,        # epochs of head training per round (total.sh: -se 1)
      "server_lr": 0.01,         # SGD rate of the head training (-slr 0.01)
      "server_batch_size": 0,    # 0: local.batch_size (the code's server batch)
      "classifier": "global",    # inference: "global" head (paper, code) or "local" (diagnosis)
  })
  return c


def fedgh_validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedgh`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "fedgh")
  v = validation
  v.check(config, "fedgh.server_epochs", v.int_at_least(0), "an integer >= 0")
  v.check(config, "fedgh.server_lr", v.positive, "a number > 0")
  v.check(config, "fedgh.server_batch_size", v.int_at_least(0),
          "an integer >= 0 (0: local.batch_size)")
  v.check(config, "fedgh.classifier", v.choice(CLASSIFIERS), f"one of {CLASSIFIERS}")

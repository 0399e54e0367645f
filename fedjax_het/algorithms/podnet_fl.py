"""PODNet + FL: PODNet run by every client of GLFC's task stream, FedAvg of the models.

`make(config, setup)` is the registered method "podnet_fl" (config.algorithm =
"podnet_fl"): PODNet [PODNet] run locally by every client, the models (and
the classifier's proxies and scale) averaged by FedAvg each round, as GLFC's
paper combines every class-incremental method with FL [GLFC Sec. 5], on the
same stream and with iCaRL + FL's exemplar memory (`algorithms.cil_replay`).
One round, for the sampled clients:

  1. the client receives the global model; at a task transition (read from
     the stream) it adds the classes of its previous data to its exemplar
     memory by iCaRL herding on the received model's features (memory
     `podnet.memory_size` per client, m = memory // classes learned per class);
  2. it trains on its current data plus its exemplars (`cil_replay.
     replay_rows`, as iCaRL + FL) with PODNet's loss

        L = L_NCA + f_t (lambda_flat L_POD-flat + lambda_spatial L_POD-spatial),

     f_t = sqrt(C_seen / k) from task 1 on and 0 in task 0 (the PODNet
     code's `scheduled_factor`: C_seen the classes seen so far, k the new
     ones), lambda_flat = `podnet.flat_weight` = 1, lambda_spatial =
     `podnet.spatial_weight` = 3 (the code's CIFAR-100 values):
       * L_NCA: the NCA loss with margin delta = `podnet.margin` = 0.6 over
         the seen classes (`losses.incremental.nca_loss`) of the local
         similarity classifier (LSC, `losses.incremental.
         local_similarity_scores`): K = `podnet.proxies_per_class` = 10
         proxies per class, cosine similarity, softmax over a class's
         proxies, the learned scale eta (initial 1, as the code's
         `learned_scaling`);
       * L_POD-spatial (`losses.incremental.pod_spatial_loss`) over the
         backbone's stage outputs (`models.base.STAGE_COLLECTION`: the four
         ResNet stages of glfc_resnet18, the two conv + pool stages of
         simple_cnn), L_POD-flat (`losses.incremental.pod_flat_loss`) on the
         final embedding, both against the old model, the global model at
         the end of the previous task (iCaRL + FL's);
  3. the server averages the trained variables (plain mean), the LSC's
     proxies and scale included.

Classifier (`evaluate`): the global model's LSC, the argmax of the class
similarities over the seen classes (PODNet's CNN classifier, `eval_type:
cnn` of its CIFAR-100 options).

Interpretations and deviations:
  * The LSC is a parameter subtree "podnet_lsc" ({"proxies": (C, K, D),
    "scale": ()}) beside the model's parameters; the model's own Dense head
    is not used (it receives no gradient; weight decay still shrinks it).
    All C classes' proxies exist from the start (fixed shapes); the NCA
    loss sees the seen classes only, so unseen proxies get no gradient
    until their task.
  * New classes' proxies are drawn at random at initialisation (normal, std
    1 / sqrt(D)); PODNet imprints them from the new classes' features
    (k-means per class), which needs every client's data at the task start.
  * NCA margin on the true class only, as the paper's equation (the code's
    subtraction of delta from every similarity cancels in the loss); the
    margin term does not train the scale eta (`losses.incremental.nca_loss`:
    with it, eta crossed 0 and the quick run stayed at chance).
  * PODNet's last stage, a classifier-only fine-tuning on a class-balanced
    subset (20 epochs at lr 0.05), is not run. PODNet's optimiser (SGD lr
    0.1, cosine schedule, 160 epochs, weight decay 5e-4) is not used: the
    FL baseline trains with the trainer's `local` section like the other
    methods of GLFC Table 1.
  * POD-spatial squares the activations before pooling and L2-normalises
    the concatenated width- and height-pooled vectors (the code's
    `collapse_channels: spatial`); its distance is the L2 norm per example,
    averaged over the batch and the stages. POD-flat is 1 - cosine (the
    code's `embeddings_similarity`).
  * The distillation runs on every row (current data and exemplars), as the
    code does (`only_old: false`).
  * Exemplars: iCaRL + FL's herding memory (`algorithms.cil_replay`), the
    one memory of GLFC's FL baselines; PODNet's own herding on its class
    means is not used. The task transition is read from the stream.

References:
  [PODNet] A. Douillard, M. Cord, C. Ollion, T. Robert, E. Valle. PODNet:
    Pooled Outputs Distillation for Small-Tasks Incremental Learning. ECCV
    2020 (code: arthurdouillard/incremental_learning.pytorch,
    options/podnet/podnet_cnn_cifar100.yaml).
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import models
from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay
from fedjax_het.cil import masking
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import batched_class_counts
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.losses import incremental as incremental_losses
from fedjax_het.models.base import STAGE_COLLECTION

#: The parameter subtree of the local similarity classifier (module docstring).
LSC = "podnet_lsc"


def default_config() -> ml_collections.ConfigDict:
  """`config.podnet`: the memory (iCaRL + FL's) and PODNet's CIFAR-100 settings."""
  return ml_collections.ConfigDict({"podnet": {
      **cil_replay.replay_section(cil_replay.ICARL_MEMORY_SIZE),
      "proxies_per_class": 10,    # the code's classifier_config.proxy_per_class
      "margin": 0.6,              # NCA margin delta
      "flat_weight": 1.0,         # pod_flat.scheduled_factor
      "spatial_weight": 3.0,      # pod_spatial.scheduled_factor
  }})


def validate_config(config: ml_collections.ConfigDict) -> None:
  cil_replay.validate_replay_section(config, "podnet")
  v.check(config, "podnet.proxies_per_class", v.int_at_least(1), "an integer >= 1")
  for field in ("margin", "flat_weight", "spatial_weight"):
    v.check(config, f"podnet.{field}", lambda x: v.finite_number(x) and x >= 0,
            "a number >= 0")


def split_variables(variables: Any) -> tuple[Any, Any]:
  """(the model's variables, the LSC's parameters) of a PODNet variables dict."""
  params = {name: value for name, value in variables["params"].items() if name != LSC}
  return {"params": params, "batch_stats": variables["batch_stats"]}, variables["params"][LSC]


def init_podnet_variables(model: Any, key: jax.Array, num_classes: int,
                          proxies_per_class: int) -> Any:
  """The model's variables plus the LSC: proxies N(0, 1/D) (C, K, D) and scale 1."""
  model_key, proxy_key = jax.random.split(key)
  variables = models.init_variables(model, model_key)
  dim = model.feature_dim
  proxies = jax.random.normal(proxy_key, (num_classes, proxies_per_class, dim),
                              jnp.float32) / math.sqrt(dim)
  params = dict(variables["params"])
  params[LSC] = {"proxies": proxies, "scale": jnp.ones((), jnp.float32)}
  return {"params": params, "batch_stats": variables["batch_stats"]}


def apply_with_stages(model: Any, variables: Any, images: jax.Array, *, train: bool,
                      mask: jax.Array | None = None
                      ) -> tuple[jax.Array, tuple[jax.Array, ...], Any]:
  """(features (B, D), stage outputs, new batch_stats) of a CIL model.

  The stage outputs are those the trunk sows into `STAGE_COLLECTION`
  ("stage1", "stage2", ... in order; float32). `variables` are the model's
  own (`split_variables`). Train mode: batch statistics over the valid rows
  (`mask`) and their update, as `models.apply_model`; eval mode: running
  statistics, `batch_stats` returned unchanged.
  """
  mutable = [STAGE_COLLECTION, "batch_stats"] if train else [STAGE_COLLECTION]
  kwargs = {"mask": mask} if (train and mask is not None) else {}
  (features, _), updates = model.apply(variables, images, train=train, mutable=mutable,
                                       **kwargs)
  sown = _sown_stages(updates.get(STAGE_COLLECTION, {}))
  if not sown:
    raise ValueError(f"apply_with_stages: {type(model).__name__} sows no stage outputs into "
                     f"{STAGE_COLLECTION!r}; PODNet needs a model whose trunk does "
                     "(glfc_resnet18, simple_cnn).")
  names = sorted(sown, key=lambda name: int(name.removeprefix("stage")))
  stages = tuple(jnp.asarray(sown[name], jnp.float32) for name in names)
  batch_stats = dict(updates["batch_stats"]) if train else variables["batch_stats"]
  return jnp.asarray(features, jnp.float32), stages, batch_stats


def _tree_bytes(tree: Any) -> int:
  """Bytes of a pytree's arrays (size x itemsize), from the shapes."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def _sown_stages(collection: Any) -> dict[str, jax.Array]:
  """{"stage<i>": value} of every "stage<i>" entry sown anywhere in `collection`."""
  found = {}
  for name, value in collection.items():
    if name.startswith("stage") and name.removeprefix("stage").isdigit():
      found[name] = value[0]   # sow keeps a tuple of the values sown; one per call here
    elif hasattr(value, "items"):
      found.update(_sown_stages(value))
  return found


def podnet_local_loss(model: Any, *, classes_per_task: int, margin: float, flat_weight: float,
                      spatial_weight: float) -> local.LocalLossFn:
  """PODNet's loss on one batch (module docstring).

  aux: "old_model" (PODNet variables of the global model at the end of the
  previous task), "task" () int32 t (seen classes [0, (t + 1) k)).
  """
  k = classes_per_task

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    del rng
    model_vars, lsc = split_variables({"params": params, "batch_stats": batch_stats})
    features, stages, new_stats = apply_with_stages(model, model_vars, images, train=True,
                                                    mask=mask)
    old_vars, _ = split_variables(aux["old_model"])
    old_features, old_stages, _ = apply_with_stages(model, old_vars, images, train=False)
    old_features, old_stages = jax.lax.stop_gradient((old_features, old_stages))
    task = aux["task"]
    seen = (task + 1) * k
    scores = incremental_losses.local_similarity_scores(features=features,
                                                        proxies=lsc["proxies"])
    nca = incremental_losses.nca_loss(similarities=scores, labels=labels, scale=lsc["scale"],
                                      margin=margin, num_seen_classes=seen, mask=mask)
    flat = incremental_losses.pod_flat_loss(features=features, old_features=old_features,
                                            mask=mask)
    spatial = incremental_losses.pod_spatial_loss(feature_maps=stages,
                                                  old_feature_maps=old_stages, mask=mask)
    factor = jnp.where(task > 0, jnp.sqrt(seen / k), 0.0).astype(jnp.float32)
    loss = nca + factor * (flat_weight * flat + spatial_weight * spatial)
    return loss, (new_stats, {"nca": nca, "flat": flat, "spatial": spatial})

  return loss_fn


def make_lsc_counts(model: Any, mean: Any, std: Any, num_classes: int, batch_size: int):
  """`counts(variables, images, labels, num_seen) -> (correct, total, predicted)` of the LSC.

  The argmax of the global model's class similarities over the seen classes
  [0, num_seen) (`cil.stream.batched_class_counts`; `num_seen` may be traced).
  """
  forward = cil_replay.make_eval_forward(model, normalizer(mean, std), batch_size)

  def counts(variables, images, labels, num_seen):
    model_vars, lsc = split_variables(variables)
    class_mask = masking.seen_class_mask(num_seen, num_classes)

    def scores(x):
      features, _ = forward(model_vars, x)
      return (incremental_losses.local_similarity_scores(features=features,
                                                         proxies=lsc["proxies"]), class_mask)

    return batched_class_counts(scores, num_classes, images, labels, batch_size)

  return counts


def make_podnet_fl(settings: Any, replay: cil_replay.ReplaySettings, model: Any, mean: Any,
                   std: Any, max_client_size: int, *, proxies_per_class: int = 10,
                   margin: float = 0.6, flat_weight: float = 1.0, spatial_weight: float = 3.0,
                   eval_batch_size: int = 500) -> Algorithm:
  """PODNet + FL on the task stream as an `Algorithm` (module docstring).

  State: {"server": PODNet variables (the model's, plus "podnet_lsc" in
  "params"), "old_model": the same at the end of the previous task,
  "clients": `cil_replay.ClientState`}. Metrics: "train/loss", "train/nca",
  "train/flat", "train/spatial" (cohort means), "podnet/exemplars" (mean
  stored exemplars of the cohort), "podnet/transitions" (sampled clients at
  a task transition), "podnet/scale" (the global LSC scale),
  "train/server/bytes_up" (the M sampled clients' variables, M |theta|, the
  LSC included) and ".../bytes_down" (the global variables to each, and from
  task 1 on the old model too: M |theta| or 2 M |theta|), "task", "clients".
  """
  m, c, k = settings.clients_per_round, settings.num_classes, settings.classes_per_task
  n_max, mem = int(max_client_size), replay.memory_size
  loss_fn = podnet_local_loss(model, classes_per_task=k, margin=margin,
                              flat_weight=flat_weight, spatial_weight=spatial_weight)
  _, trainer, forward, client_map = cil_replay.make_replay_training(
      settings, loss_fn, model, mean, std, n_max + mem, eval_batch_size)
  lsc_counts = make_lsc_counts(model, mean, std, c, eval_batch_size)

  def init(key, data):
    variables = init_podnet_variables(model, key, c, proxies_per_class)
    return {"server": variables, "old_model": variables,
            "clients": cil_replay.init_client_state(data.client_joined.shape[1], mem)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key, task, server, old_model = cil_replay.round_start(
        state, key, round_index, settings)
    model_vars, _ = split_variables(server)
    clients, updated, _, members, transitions = cil_replay.sample_replay_cohort(
        sample_key, state["clients"], data, task, settings, client_map, replay, forward,
        model_vars, n_max=n_max)
    aux = {"old_model": aggregation.broadcast(old_model, m),
           "task": jnp.broadcast_to(task, (m,)).astype(jnp.int32)}
    new_server, local_metrics = cil_replay.train_and_average(
        trainer, server, aux, members, clients, train_key, settings, round_index)
    size = _tree_bytes(server)   # the model and the LSC, from the shapes
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        "train/nca": jnp.mean(local_metrics["nca"]),
        "train/flat": jnp.mean(local_metrics["flat"]),
        "train/spatial": jnp.mean(local_metrics["spatial"]),
        **cil_replay.replay_metrics("podnet", updated, transitions),
        "podnet/scale": new_server["params"][LSC]["scale"],
        "train/server/bytes_up": jnp.float32(m * size),
        "train/server/bytes_down": (m * size * (1 + (task > 0))).astype(jnp.float32),
        "task": task, "clients": clients}
    return ({"server": new_server, "old_model": old_model,
             "clients": cohort.scatter(state["clients"], clients, updated)}, metrics)

  def evaluate(state, test):
    images, labels, num_seen = test
    return lsc_counts(state["server"], images, labels, num_seen)

  return Algorithm(name="podnet_fl", init=init, round=round_fn, evaluate=evaluate)


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """PODNet + FL from a class-incremental config (`make_podnet_fl`)."""
  section = config.podnet
  return make_podnet_fl(setup.settings,
                        cil_replay.ReplaySettings.from_section(section, setup.client_classes),
                        setup.model, setup.mean, setup.std, setup.max_client_size,
                        proxies_per_class=int(section.proxies_per_class),
                        margin=float(section.margin), flat_weight=float(section.flat_weight),
                        spatial_weight=float(section.spatial_weight),
                        eval_batch_size=setup.eval_batch_size)

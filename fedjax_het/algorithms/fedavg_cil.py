"""FedAvg on GLFC's class-incremental task stream: the lower bound of GLFC Table 1.

Plain fine-tuning [GLFC Sec. 5, Table 1 "FedAvg"]: no exemplars, no
distillation. Each round samples `cil.clients_per_round` of the clients that
have joined by the round's task (`cil.stream.task_of_round`), trains them on
their current task's data with `engine.local` (a fresh local optimiser each
round, the learning rates of `local.lr_schedule`), and the new global model
IS the data-size weighted mean of the trained models (parameters and
BatchNorm statistics alike).

Deviation: GLFC's classifier loss is a sigmoid BCE over the seen classes;
this baseline uses the softmax cross-entropy restricted to the seen classes
(the "fine-tuning" of the class-incremental literature; `mask_logits`:
unseen logits are a finite -1e9 and get exactly zero gradient). Weight decay
still shrinks the unseen head columns (their gradient is zero, their decay
is not); with GLFC's 1e-5 this is negligible.

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, models
from fedjax_het.algorithms import common
from fedjax_het.cil import masking
from fedjax_het.cil import stream as cil_stream
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import GroupData, client_keys
from fedjax_het.engine.optim import make_optimizer


def default_config() -> ml_collections.ConfigDict:
  """No section of its own: the stream's run-wide sections (`cil.stream.stream_config`)."""
  return ml_collections.ConfigDict()


def validate_config(config: ml_collections.ConfigDict) -> None:
  del config  # the run-wide sections are checked by `cil.stream.validate_stream_config`


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """FedAvg on the task stream from a class-incremental config (`make_fedavg_cil`)."""
  del config
  return make_fedavg_cil(setup.settings, setup.model, setup.mean, setup.std,
                         setup.max_client_size, eval_batch_size=setup.eval_batch_size)


def masked_cross_entropy_loss(model: Any) -> local.LocalLossFn:
  """The local loss: softmax cross-entropy over the seen classes (`aux["class_mask"]`)."""

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=rng, mask=mask)
    logits = masking.mask_logits(logits, aux["class_mask"])
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    return ce, (new_variables["batch_stats"], {"ce": ce})

  return loss_fn


def make_fedavg_cil(settings: cil_stream.StreamSettings, model: Any, mean: Any, std: Any,
                    max_client_size: int, *, eval_batch_size: int = 500) -> Algorithm:
  """FedAvg on the task stream as an `Algorithm` (state {"server": variables}).

  The round's data is a `StreamArrays`; its metrics: "train/loss" (data-size
  weighted mean of the cohort's local losses), "train/server/bytes_up" and
  ".../bytes_down" (the M sampled clients' models up, the global model down to each:
  M |theta| bytes each way, `common.tree_bytes`), "task", "clients" (M,) the
  sampled client indices. `evaluate(state, (test_images, test_labels,
  num_seen))` gives the global model's per-class (correct, total, predicted)
  counts (`cil.stream.make_class_counts`).
  """
  m, c = settings.clients_per_round, settings.num_classes
  tx = make_optimizer(settings.optimizer, weight_decay=settings.weight_decay,
                      momentum=settings.momentum)
  trainer = local.make_local_trainer(
      loss_fn=masked_cross_entropy_loss(model), optimizer=tx, epochs=settings.epochs,
      batch_size=settings.batch_size, max_size=max_client_size,
      preprocess=normalizer(mean, std))

  def init(key, data):
    del data
    return {"server": models.init_variables(model, key)}

  def round_fn(state, data, key, round_index):
    sample_key, train_key = jax.random.split(key)
    task = cil_stream.task_of_round(round_index, settings)
    joined = data.client_joined[task]
    clients = cohort.sample_cohort(sample_key, joined, m)
    rows = data.client_indices[task][clients]            # (M, n_max)
    sizes = data.client_sizes[task][clients]             # (M,)
    members = GroupData(images=data.images[rows], labels=data.labels[rows], sizes=sizes,
                        client_ids=clients, active=jnp.ones((m,), bool))
    class_mask = masking.seen_class_mask((task + 1) * settings.classes_per_task, c)
    start = aggregation.broadcast(state["server"], m)
    aux = {"class_mask": jnp.broadcast_to(class_mask, (m, c))}
    trained, local_metrics = local.train_clients(
        trainer, start, aux, members, client_keys(train_key, clients),
        cil_stream.epoch_learning_rates(settings, round_index), sequential=settings.sequential)
    server = aggregation.weighted_mean(trained, sizes)
    weights = sizes.astype(jnp.float32) / jnp.sum(sizes)
    loss = jnp.tensordot(weights, local_metrics["loss"], axes=1)
    traffic = common.stream_bytes(m * common.tree_bytes(state["server"]),
                                  m * common.tree_bytes(state["server"]))
    return {"server": server}, {"train/loss": loss, **traffic, "task": task, "clients": clients}

  def evaluate(state, test):
    images, labels, num_seen = test
    counts = cil_stream.make_class_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], images, labels, num_seen)

  return Algorithm(name="fedavg_cil", init=init, round=round_fn, evaluate=evaluate)

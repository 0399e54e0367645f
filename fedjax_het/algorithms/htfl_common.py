"""Pieces the data-free heterogeneous-model methods of HtFLlib share (FedProto, FD, FedTGP,
LG-FedAvg, FedGH, FedKD).

* `default_sections()`: HtFLlib's local training (SGD lr 0.01 without momentum or weight
  decay, batch 10, 1 local epoch, a constant rate: `total.sh` / FedTGP's `run_me.sh`,
  `-lr 0.01 -lbs 10 -ls 1`) as `config.local`, and `config.htfl.feature_dim` (512: every
  backbone's features pooled to 512 entries before its head, HtFLlib's `BaseHeadSplit`
  with `-fd 512`; 0 keeps the backbones' own features) and `config.htfl.eval_domains`
  ("own": every client on its own test split, HtFLlib's protocol; "all": on every split)
  and `config.htfl.client_loop` (how a group's clients train: "vmap" together, each as
  many steps as the group's largest client, the GPU/TPU layout; "map" one after another,
  each only its own steps, the least work on a CPU; "auto" picks by backend).
* `feature_setup`: the run's setup with every group's model pooled to `htfl.feature_dim`
  (`models.with_feature_dim`).
* Per-class statistics: `accumulating_loss` wraps a per-batch loss so that local training
  also sums a per-class quantity (features or logits, train mode, before the step's update:
  what HtFLlib's FedProto and FD collect while they train) in the carried BatchNorm state,
  by a segment sum per batch; `class_statistics_pass` sums the eval-mode features of a
  client's training rows after training (HtFLlib's `collect_protos`, FedTGP and FedGH).
  Both are vmapped over a group's slots: no loop over examples, no host round trip.
* `aggregate_class_means`: the server's unweighted mean over the clients that hold a class
  (HtFLlib's `proto_aggregation`).
* `make_evaluate`: top-k accuracy of every slot on every test domain with a method's own
  scores (nearest global prototype for FedProto / FedTGP, `prototype_evaluate`, or their
  clients' own heads with `classifier="head"`) or with its variables changed (the global head of LG-FedAvg / FedGH).
* The round's skeleton: `local_phase` reads `config.local` once into a `LocalPhase` (epochs,
  the rate of each round, every group's slots and trainer), whose `train` runs one group's
  local training; `init_clients` gives every client its own variables; `train_collecting`
  is the local phase of FedProto and FD (every group trains with the global per-class
  quantity and sums its own); `weighted_tree_mean` averages one stacked tree over every
  group's slots (LG-FedAvg's heads, FedKD's mentee copies). A method's module keeps the
  order of its round and its server step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import losses, models, validation
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import batching, local
from fedjax_het.engine.api import Setup
from fedjax_het.engine.clients import (ClientGroup, client_keys, init_group_variables,
                                       slot_active, slot_ids, vmap_slots, where_active)
from fedjax_het.engine.optim import round_decay_schedule
from fedjax_het.errors import ConfigError
from fedjax_het.losses import htfl as htfl_losses

SECTION = "htfl"


def local_config() -> ml_collections.ConfigDict:
  """`config.local` at HtFLlib's values (module docstring)."""
  c = local.default_config()
  c.optimizer = "sgd"
  c.lr = 0.01
  c.lr_decay = 0.0
  c.weight_decay = 0.0
  c.batch_size = 10
  c.epochs = 1
  return c


def default_sections() -> ml_collections.ConfigDict:
  """`local` (HtFLlib's local SGD) and `htfl` (the pooled feature dimension)."""
  return ml_collections.ConfigDict({
      "local": local_config(),
      SECTION: {"feature_dim": models.HTFL_FEATURE_DIM,
                # "own": each client on its own test split (HtFLlib); "all": on every split
                "eval_domains": "own",
                # a group's clients: "vmap" (GPU/TPU), "map" (CPU), "auto" by backend
                "client_loop": "auto"},
  })


def validate_sections(config: ml_collections.ConfigDict) -> None:
  """Checks `config.local` and `config.htfl`."""
  local.validate_config(config)
  validation.require_section(config, SECTION)
  validation.check(config, f"{SECTION}.feature_dim", validation.int_at_least(0),
                   "an integer >= 0 (0: the backbones' own feature dimensions)")
  validation.check(config, f"{SECTION}.eval_domains", validation.choice(EVAL_DOMAINS),
                   f"one of {EVAL_DOMAINS}")
  validation.check(config, f"{SECTION}.client_loop", validation.choice(CLIENT_LOOPS),
                   f"one of {CLIENT_LOOPS}")


def feature_setup(config: ml_collections.ConfigDict, setup: Setup, *,
                  shared_features: bool = True) -> Setup:
  """`setup` whose group models pool their features to `htfl.feature_dim` entries.

  `shared_features`: the method compares features across architectures (prototypes, a
  shared head), so every group must end with the same feature dimension (ConfigError
  naming the field otherwise, with feature_dim 0).
  """
  dim = int(config[SECTION].feature_dim)
  groups = setup.groups if dim == 0 else tuple(
      dataclasses.replace(g, model=models.with_feature_dim(g.model, dim),
                          public_model=None if g.public_model is None
                          else models.with_feature_dim(g.public_model, dim))
      for g in setup.groups)
  if shared_features:
    dims = {g.name: int(g.model.feature_dim) for g in groups}
    if len(set(dims.values())) > 1:
      raise ConfigError(f"config.{SECTION}.feature_dim must be an integer >= 1 when the "
                        f"architectures' feature dimensions differ ({dims}), got {dim}.")
  return dataclasses.replace(setup, groups=groups)


def feature_dim(setup: Setup) -> int:
  """The common feature dimension of the groups (after `feature_setup`)."""
  return int(setup.groups[0].model.feature_dim)


@dataclasses.dataclass(frozen=True)
class LocalPhase:
  """The local phase of an HtFL round, `config.local` read once (`local_phase`).

  Attributes:
    epochs: local epochs per round.
    lr: round index -> the local learning rate of that round.
    ids: group name -> (S,) participant id of every slot (the clients' RNG streams).
    active: group name -> (S,) bool, the slots that hold a client (not padding).
    trainers: group name -> its `local.LocalTrainer`.
    sequential: the clients of a group train one after another, each only its own steps
      (`htfl.client_loop` "map"), else vmapped.
  """
  epochs: int
  lr: Callable[[jax.Array], jax.Array]
  ids: dict[str, jax.Array]
  active: dict[str, jax.Array]
  trainers: dict[str, Any]
  sequential: bool = False

  def train(self, group: ClientGroup, variables: Any, aux: Any, data: Any,
            local_key: jax.Array, round_index: jax.Array) -> tuple[Any, Any]:
    """`local.train_clients` of `group`'s slots from `variables` with `aux` (one per slot)
    on `data.groups[group.name]`: (trained variables, metrics)."""
    return local.train_clients(
        self.trainers[group.name], variables, aux, data.groups[group.name],
        client_keys(local_key, self.ids[group.name]),
        jnp.full((self.epochs,), self.lr(round_index)), sequential=self.sequential)

  def keep_active(self, group: ClientGroup, new: Any, old: Any) -> Any:
    """`new` in the slots that hold a client, `old` in the padding slots."""
    return where_active(self.active[group.name], new, old)


def local_phase(config: ml_collections.ConfigDict, setup: Setup,
                loss_for: Callable[[ClientGroup], Any] | None = None, *,
                trainers: dict[str, Any] | None = None) -> LocalPhase:
  """`config.local` (epochs, lr with its linear decay over the run, batch size, optimizer,
  weight decay) as a `LocalPhase`; the trainers are `local.make_group_trainers` of
  `loss_for`, or `trainers` (a method with its own optimizer, FedKD)."""
  loc = config.local
  epochs = int(loc.epochs)
  if trainers is None:
    trainers = local.make_group_trainers(setup, loss_for, optimizer=loc.optimizer,
                                         weight_decay=float(loc.weight_decay), epochs=epochs,
                                         batch_size=int(loc.batch_size))
  return LocalPhase(
      epochs=epochs,
      lr=round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay)),
      ids={g.name: jnp.asarray(slot_ids(g, setup.num_participants)) for g in setup.groups},
      active={g.name: jnp.asarray(slot_active(g)) for g in setup.groups},
      trainers=trainers, sequential=client_loop(config) == "map")


def client_loop(config: ml_collections.ConfigDict) -> str:
  """`htfl.client_loop` with "auto" resolved: "map" on a CPU (vmap buys no parallelism
  there, and one client after another runs only the steps that hold data), else "vmap"."""
  return local.resolve_client_loop(str(config[SECTION].client_loop))


def init_clients(setup: Setup, key: jax.Array) -> dict[str, dict[str, Any]]:
  """group name -> {"variables": its slots' own variables} (no shared initialisation)."""
  return {g.name: {"variables": init_group_variables(
      g, key, shared=False, num_participants=setup.num_participants)} for g in setup.groups}


def train_collecting(phase: LocalPhase, setup: Setup, state_groups: dict[str, Any], data: Any,
                     local_key: jax.Array, round_index: jax.Array, aux_one: Any, dim: int
                     ) -> tuple[dict[str, Any], dict[str, Any], dict[str, jax.Array],
                                dict[str, jax.Array]]:
  """Every group's local training with `aux_one` (the global per-class quantity) in every
  slot, its trainer an `accumulating_loss` one summing a quantity of `dim` entries per class.

  Returns:
    (groups: the state's groups with the trained variables in the active slots, metrics,
    sums: group -> (S, C, dim), counts: group -> (S, C)).
  """
  groups, metrics, sums, counts = {}, {}, {}, {}
  for group in setup.groups:
    g = state_groups[group.name]
    joint = with_accumulators(g["variables"], group.num_slots, setup.num_classes, dim)
    trained, metrics[group.name] = phase.train(
        group, joint, broadcast_slots(aux_one, group.num_slots), data, local_key, round_index)
    variables, sums[group.name], counts[group.name] = without_accumulators(trained)
    groups[group.name] = {**g, "variables": phase.keep_active(group, variables,
                                                              g["variables"])}
  return groups, metrics, sums, counts


def weighted_tree_mean(trees: dict[str, Any], weights: dict[str, jax.Array]) -> Any:
  """sum over groups and slots of w * tree / sum of w: `trees` group -> a tree stacked over
  the group's slots, `weights` group -> (S,)."""
  total = sum(jnp.sum(w) for w in weights.values())
  return jax.tree_util.tree_map(
      lambda *leaves: sum(leaves) / total,
      *[jax.tree_util.tree_map(lambda x, w=weights[n]: jnp.tensordot(w, x, axes=1), trees[n])
        for n in trees])


def split_forward(group: ClientGroup, *, train: bool):
  """(params, batch_stats, images, rng, mask) -> (features, logits, new batch_stats)."""
  def forward(params, batch_stats, images, rng=None, mask=None):
    features, logits, new = models.apply_model(
        group.model, {"params": params, "batch_stats": batch_stats}, images, train=train,
        rng=rng, mask=mask)
    return features, logits, new["batch_stats"]
  return forward


def prototype_loss_for(group: ClientGroup, lamda: float) -> Callable[..., Any]:
  """CE(f(h), y) + λ · mean_{b, d} (h_b - P_{y_b})²_d with aux = (P (C, D), present (C,)):
  FedProto's client objective (Eq. 8) and FedTGP's (Eq. 4), `losses.htfl.
  prototype_regularizer` (a row of a class without a prototype counts 0).

  Returns `loss_fn(params, batch_stats, images, labels, mask, rng, aux) -> (loss, (new_stats,
  {"ce", "proto"}, {"features", "logits"}))`, the form `accumulating_loss` takes
  (`dropping_outputs` gives a local trainer's form).
  """
  forward = split_forward(group, train=True)

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    prototypes, present = aux
    features, logits, new_stats = forward(params, batch_stats, images, rng, mask)
    ce = losses.softmax_cross_entropy(logits=logits, labels=labels, mask=mask)
    reg = htfl_losses.prototype_regularizer(features=features, labels=labels,
                                            prototypes=prototypes, present=present, mask=mask)
    return ce + lamda * reg, (new_stats, {"ce": ce, "proto": reg},
                              {"features": features, "logits": logits})

  return loss_fn


def dropping_outputs(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
  """A `prototype_loss_for`-form loss as a local trainer's: (loss, (new_stats, metrics))."""
  def wrapped(*args):
    loss, (new_stats, metrics, _) = loss_fn(*args)
    return loss, (new_stats, metrics)
  return wrapped


def accumulating_loss(loss_fn: Callable[..., Any], num_classes: int,
                      which: str) -> Callable[..., Any]:
  """`loss_fn` whose per-class sums of its `which` output ride in the carried state.

  `loss_fn(params, model_stats, images, labels, mask, rng, aux) -> (loss, (new_stats,
  metrics, outputs))` with outputs {"features", "logits"}; the returned loss takes
  batch_stats = {"model": model_stats, "sums": (C, D), "counts": (C,)} and adds the batch's
  detached `outputs[which]` per class (`losses.htfl.class_sums`). The local trainer keeps
  the state of the steps that hold data only, so the sums are over exactly the batches a
  client trains on, every epoch.
  """
  def wrapped(params, batch_stats, images, labels, mask, rng, aux):
    loss, (new_stats, metrics, outputs) = loss_fn(params, batch_stats["model"], images, labels,
                                                  mask, rng, aux)
    sums, counts = htfl_losses.class_sums(values=outputs[which], labels=labels,
                                          num_classes=num_classes, mask=mask)
    carried = {"model": new_stats, "sums": batch_stats["sums"] + sums,
               "counts": batch_stats["counts"] + counts}
    return loss, (carried, metrics)
  return wrapped


def with_accumulators(variables: Any, num_slots: int, num_classes: int, dim: int) -> Any:
  """Stacked {"params", "batch_stats"} -> the same with batch_stats {"model", "sums" (S, C,
  D), "counts" (S, C)} zeroed (the input of an `accumulating_loss` trainer)."""
  return {"params": variables["params"],
          "batch_stats": {"model": variables["batch_stats"],
                          "sums": jnp.zeros((num_slots, num_classes, dim), jnp.float32),
                          "counts": jnp.zeros((num_slots, num_classes), jnp.float32)}}


def without_accumulators(trained: Any) -> tuple[Any, jax.Array, jax.Array]:
  """(model variables, sums, counts) of an `accumulating_loss` trainer's output."""
  stats = trained["batch_stats"]
  return ({"params": trained["params"], "batch_stats": stats["model"]}, stats["sums"],
          stats["counts"])


def class_statistics_pass(group: ClientGroup, setup: Setup, *, batch_size: int,
                          which: str = "features") -> Callable[..., tuple[jax.Array, jax.Array]]:
  """`(stacked variables, GroupData) -> (sums (S, C, D), counts (S, C))` of every slot's
  eval-mode `which` ("features" or "logits") over its training rows, by class.

  HtFLlib's `collect_protos` (FedTGP, FedGH): after local training, the model in eval mode
  over the client's training loader. Deviation: every row counts; the code's loader drops the
  last partial batch (`drop_last=True`), at most batch_size - 1 rows.
  """
  preprocess = normalizer(setup.private_mean, setup.private_std)
  max_size = setup.max_sizes[group.name]
  batch = min(int(batch_size), max_size)
  steps = batching.steps_per_epoch(max_size, batch)
  num_classes = setup.num_classes

  def one(variables, images, labels, size):
    def body(carry, step):
      rows = jnp.minimum(step * batch + jnp.arange(batch), max_size - 1)
      mask = step * batch + jnp.arange(batch) < size
      features, logits, _ = models.apply_model(group.model, variables, preprocess(images[rows]),
                                               train=False)
      sums, counts = htfl_losses.class_sums(
          values=features if which == "features" else logits, labels=labels[rows],
          num_classes=num_classes, mask=mask)
      return (carry[0] + sums, carry[1] + counts), None

    dim = group.model.feature_dim if which == "features" else num_classes
    init = (jnp.zeros((num_classes, dim), jnp.float32), jnp.zeros((num_classes,), jnp.float32))
    (sums, counts), _ = jax.lax.scan(body, init, jnp.arange(steps))
    return sums, counts

  def run(variables, data):
    return vmap_slots(one)(variables, data.images, data.labels, data.sizes)

  return run


def aggregate_class_means(setup: Setup, sums: dict[str, jax.Array],
                          counts: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(global means (C, D), present (C,), holders (C,)): per class the unweighted mean over the
  real clients that hold it of their class means (HtFLlib's `proto_aggregation`: every
  uploading client counts once, whatever its number of examples); 0 and False for a class
  no client holds. `holders` counts the clients per class."""
  total, holders = 0.0, 0.0
  for group in setup.groups:
    active = jnp.asarray(slot_active(group))[:, None]
    held = (counts[group.name] > 0) & active                          # (S, C)
    means = htfl_losses.class_means(sums[group.name], counts[group.name])   # (S, C, D)
    total = total + jnp.sum(jnp.where(held[..., None], means, 0.0), axis=0)
    holders = holders + jnp.sum(held.astype(jnp.float32), axis=0)
  present = holders > 0
  return total / jnp.where(present, holders, 1.0)[:, None], present, holders


def uploaded_pairs(setup: Setup, sums: dict[str, jax.Array],
                   counts: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Every (client, class) prototype a round uploads, flattened in participant-slot order:
  (prototypes (P, D), labels (P,), valid (P,)) with P = slots x C over the groups; valid
  marks the real clients' classes with examples (FedTGP's and FedGH's `uploaded_protos`)."""
  protos, labels, valid = [], [], []
  for group in setup.groups:
    s = counts[group.name].shape[0]
    active = jnp.asarray(slot_active(group))[:, None]
    protos.append(htfl_losses.class_means(sums[group.name], counts[group.name]).reshape(
        s * setup.num_classes, -1))
    labels.append(jnp.tile(jnp.arange(setup.num_classes, dtype=jnp.int32), s))
    valid.append(((counts[group.name] > 0) & active).reshape(-1))
  return jnp.concatenate(protos), jnp.concatenate(labels), jnp.concatenate(valid)


def server_sgd_epochs(loss_fn: Callable[..., jax.Array], params: Any, data: tuple[Any, ...],
                      valid: jax.Array, *, key: jax.Array, epochs: int, batch_size: int,
                      learning_rate: float) -> tuple[Any, jax.Array]:
  """Plain SGD on the server over the valid rows of `data`, shuffled every epoch.

  torch's `DataLoader(rows, batch_size, shuffle=True, drop_last=False)` with SGD (FedTGP's
  `update_TGP`, FedGH's `train_head`): each epoch a fresh random order of the V valid rows
  in ceil(V / B) batches, the last one partial, one SGD step per batch on
  `loss_fn(params, *batch_rows, mask)` (a mean over the batch's valid rows). V is known on
  the device only, so the steps run in a `lax.fori_loop` of epochs x ceil(V / B) iterations.

  Returns:
    (params, the last step's loss).
  """
  rows = valid.shape[0]
  num_valid = jnp.sum(valid.astype(jnp.int32))
  steps = (num_valid + batch_size - 1) // batch_size
  grad_fn = jax.value_and_grad(loss_fn)

  def body(i, carry):
    params, _ = carry
    epoch, step = i // jnp.maximum(steps, 1), i % jnp.maximum(steps, 1)
    scores = jnp.where(valid, jax.random.uniform(jax.random.fold_in(key, epoch), (rows,)), 2.0)
    order = jnp.argsort(scores)
    take = step * batch_size + jnp.arange(batch_size)
    mask = take < num_valid
    idx = order[jnp.minimum(take, rows - 1)]
    batch = tuple(x[idx] for x in data)
    loss, grads = grad_fn(params, *batch, mask)
    params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return params, loss

  return jax.lax.fori_loop(0, epochs * steps, body, (params, jnp.zeros((), jnp.float32)))


EVAL_DOMAINS = ("own", "all")
#: `htfl.client_loop`'s values (module docstring).
CLIENT_LOOPS = local.CLIENT_LOOPS


def make_evaluate(config: ml_collections.ConfigDict, setup: Setup, *,
                  scores: Callable[[jax.Array, jax.Array, Any], jax.Array] | None = None,
                  shared: Callable[[Any], Any] = lambda state: None,
                  variables: Callable[[Any, str], Any] | None = None
                  ) -> Callable[[Any, Any], dict[str, jax.Array]]:
  """`evaluate(state, test) -> {group: accuracy (slots, domains)}` in percent.

  Args:
    config: the run's config (`eval.batch_size`, `eval.top_k`, `htfl.eval_domains`).
    setup: the (feature-pooled) setup.
    scores: (features, logits, shared) -> (B, C) class scores whose top-k are the
      predictions; None: the logits.
    shared: state -> what `scores` reads besides the model (global prototypes).
    variables: (state, group name) -> the stacked variables evaluated; None:
      state["groups"][group]["variables"].

  `htfl.eval_domains`: "own" evaluates every client on its own test domain only (HtFLlib's
  protocol: each client's test split; participant p's domain is domain p when there is one
  test domain per participant, domain 0 when there is one shared test set), the other
  entries are NaN (so eval/inter/* is NaN: not evaluated); "all" evaluates every client on
  every domain (inter = the mean over the other clients' test splits), K times the work.
  The test rows run in static batches; padding rows are masked.
  """
  preprocess = normalizer(setup.private_mean, setup.private_std)
  top_k = int(config.eval.top_k)
  max_size = max(int(setup.max_test_size), 1)
  batch = min(int(config.eval.batch_size), max_size)
  steps = batching.steps_per_epoch(max_size, batch)
  mode = config[SECTION].get("eval_domains", "own")
  if mode not in EVAL_DOMAINS:
    validation.fail(f"{SECTION}.eval_domains", f"one of {EVAL_DOMAINS}", mode)

  def accuracy(model, v, extra, images, labels, size):
    def body(correct, step):
      start = step * batch
      rows = jnp.minimum(start + jnp.arange(batch), max_size - 1)
      features, logits, _ = models.apply_model(model, v, preprocess(images[rows]), train=False)
      s = logits if scores is None else scores(features, logits, extra)
      _, top = jax.lax.top_k(s, min(top_k, s.shape[-1]))
      hit = jnp.any(top == labels[rows][:, None], axis=-1)
      valid = start + jnp.arange(batch) < size
      return correct + jnp.sum(hit & valid), None

    correct, _ = jax.lax.scan(body, jnp.zeros((), jnp.int32), jnp.arange(steps))
    return 100.0 * correct / jnp.maximum(size, 1)

  def own_domains(group, num_domains):
    if num_domains == 1:
      return np.zeros((group.num_slots,), np.int32)
    if num_domains != setup.num_participants:
      raise ConfigError(f"config.{SECTION}.eval_domains='own' needs one test domain per "
                        f"participant ({setup.num_participants}) or one shared test set, got "
                        f"{num_domains} domains; use 'all'.")
    ids = np.asarray(list(group.clients) + [0] * (group.num_slots - group.num_clients))
    return ids.astype(np.int32)

  def evaluate(state, test):
    extra = shared(state)
    num_domains = test.images.shape[0]
    out = {}
    for group in setup.groups:
      v = (state["groups"][group.name]["variables"] if variables is None
           else variables(state, group.name))
      if mode == "all":
        per_domain = jax.vmap(accuracy, in_axes=(None, None, None, 0, 0, 0))
        out[group.name] = vmap_slots(
            lambda w, g=group: per_domain(g.model, w, extra, test.images, test.labels,
                                          test.sizes))(v)
        continue
      own = own_domains(group, num_domains)
      acc = vmap_slots(lambda w, x, y, n, g=group: accuracy(g.model, w, extra, x, y, n))(
          v, test.images[own], test.labels[own], test.sizes[own])
      columns = jnp.arange(num_domains)[None, :] == jnp.asarray(own)[:, None]
      out[group.name] = jnp.where(columns, acc[:, None], jnp.nan)
    return out

  return evaluate


def prototype_scores(features: jax.Array, logits: jax.Array, extra: Any) -> jax.Array:
  """FedProto's / FedTGP's inference: the nearest global prototype (`extra` = (prototypes,
  present)); the logits are not used."""
  del logits
  prototypes, present = extra
  return htfl_losses.nearest_prototype_scores(features, prototypes, present)


#: The classifiers of FedProto's and FedTGP's evaluation (`fedproto.classifier`,
#: `fedtgp.classifier`): the nearest global prototype (the papers' and HtFLlib's inference), or
#: each client's own head, which both methods train with cross-entropy (a diagnosis).
PROTOTYPE_CLASSIFIERS = ("prototype", "head")


def prototype_evaluate(config: ml_collections.ConfigDict, setup: Setup, section: str):
  """`make_evaluate` by the nearest of the state's "global_protos" whose "proto_present"
  (`config[section].classifier == "prototype"`), or by each client's own logits ("head")."""
  classifier = config[section].get("classifier", "prototype")
  if classifier not in PROTOTYPE_CLASSIFIERS:
    validation.fail(f"{section}.classifier", f"one of {PROTOTYPE_CLASSIFIERS}", classifier)
  if classifier == "head":
    return make_evaluate(config, setup)
  return make_evaluate(config, setup, scores=prototype_scores,
                       shared=lambda state: (state["global_protos"], state["proto_present"]))


def broadcast_slots(tree: Any, num_slots: int) -> Any:
  """`tree` with a leading slot axis of `num_slots` copies."""
  return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (num_slots, *jnp.shape(x))), tree)


def float_bytes(count: Any) -> jax.Array:
  """Bytes of `count` float32 numbers (a float32 scalar, possibly traced)."""
  return jnp.asarray(count, jnp.float32) * 4.0


def check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ConfigError(f"config.{name} must be an integer >= {minimum}, got {value!r}.")
  return int(value)

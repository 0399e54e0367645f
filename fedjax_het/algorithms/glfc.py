"""GLFC on the class-incremental task stream: its clients (Sec. 4.1) and its proxy server (Sec. 4.2).

`make(config, setup)` is the registered method "glfc" (config.algorithm =
"glfc", trained by `fedjax_het.train` like every method): the round of GLFC [GLFC Alg. 1] as the authors' code runs it
(`src/GLFC.py`, `src/Fed_utils.py:local_train`), for the sampled clients:

  1. the client receives the global model and computes its mean softmax
     prediction entropy on its current data over the seen classes (Eq. 7);
     a rise of >= r_h = 1.2 over the entropy it computed the last time it was
     sampled signals a task transition (`glfc.transition = "entropy"`; or
     `"stream"`: the transition is read from the stream, for ablations);
  2. at a signalled transition it adds the classes of its PREVIOUS data
     (those it no longer holds and has not stored yet; the code's
     `last_class`) to its exemplar memory: m = memory_size // (classes it has
     learned), old classes keep their first m herding picks, each added class
     gets m picks by iCaRL herding on the L2-normalised features of the
     received global model (the client's local model at that moment, eval
     mode; `cil.exemplars.add_classes`);
  3. it trains on its current data plus its exemplars, SGD, the local
     objective 0.5 * L_GC + 0.5 * L_RD (Eq. 6; L_GC alone in the first task
     and while no old model exists), sigmoid BCE over the seen classes
     (`class_mask`; `losses.glfc`), with the learning rate of
     `local.lr_schedule` (`cil.stream.epoch_learning_rates`; default the
     code's step decays within a task);
  4. a client that signalled a transition (its first round counts: all its
     classes are new) shares one perturbed-prototype gradient per class of
     its current data with the proxy server (`cil.proxy`);
  5. the server averages the trained models (plain mean, the code's FedAvg);
     the proxy reconstructs the round's prototypes (if any), and keeps the
     best global model on its monitor set.

Ablations of GLFC Table 1 (each a config field; the defaults are GLFC):
  * `glfc.use_gradient_compensation = False` ("Ours-w/oCGC"): L_GC is
    replaced by the plain sigmoid BCE averaged over the seen classes (every
    sample's weight 1: `losses.glfc.class_aware_gradient_compensation_loss`
    with no old group).
  * `glfc.use_relation_distillation = False` ("Ours-w/oCRD"): L_RD is
    replaced by iCaRL's distillation on the old classes only, the old model's
    sigmoid outputs as BCE targets of the old-class logits
    (`losses.incremental.old_class_distillation_loss`); L_RD's target also
    holds the one-hot label on the new classes (the relation between old and
    new classes that the paper's CRD adds).
  * `glfc.old_model = "previous_task_global"` ("Ours-w/oPRS", below).
  * Loss weights: lambda_1 * L_GC + lambda_2 * L_RD from task 1 on
    (`glfc.gc_weight`, `glfc.rd_weight`, paper and code 0.5 / 0.5; Eq. 6)
    and `glfc.first_task_gc_weight` * L_GC in the first task and while no
    old model exists (1.0: L_GC alone).

The perturbation learning rate of the clients' prototype-gradient LeNet,
`glfc.proxy.perturbation_lr`: the paper's text gives 0.1, the authors' code
0.2 (its local lr / 10); the default is the code's 0.2 (`cil.proxy`).

The old model (L_RD), `glfc.old_model`:
  * "proxy" (default, the paper): GLFC's proxy server (`cil.proxy`) holds the
    best global model on the previous monitor set (Theta_{t-1}) and on the
    current one (Theta_t); from task 1 on a sampled client that signals a
    transition distils from Theta_t, the others from Theta_{t-1} (Sec. 4.2,
    the code's `GLFC.train`). State `state["proxy"]` (`proxy.ProxyState`).
  * "previous_task_global" (ablation: GLFC without its proxy): the global
    model at the END OF THE PREVIOUS TASK (`state["old_model"]`, replaced at
    the first round of every task); every sampled client of a task t >= 1
    distils from it.

Per-client state (`ClientState`, client axis leading, K_max = all clients of
the stream; only the sampled clients' rows change in a round, every joined
client's with `glfc.update_all_clients`):
  * `memory`: the exemplar memory (`cil.exemplars.ExemplarMemory`). Its
    "images" are the exemplars' POOL INDICES, 4 bytes each (an int32 bitcast
    to uint8 (4,), `cil_replay.encode_pool_indices`), not the 3072-byte images: every
    exemplar is an image of the stream's pool, so this is exact, and the
    memories cost K_max * M * 4 bytes (paper: 120 * 2000 * 4 = 0.96 MB)
    instead of 737 MB on the device and in every checkpoint.
  * `entropy`: the entropy of the last round the client was sampled in (with
    `glfc.update_all_clients`: of the last round; the code's `last_entropy`,
    0 at the start).
  * `task` / `last_task`: the task of the data the client last trained on, and
    of the data before that (-1: none): rows of the stream's per-task arrays.
    The classes to store at a transition are those of `last_task` that the
    client does not hold now.

Client roles (`scenario.client_roles`, `cil.stream.CLIENT_ROLES`): on the
default "per_task" stream the old / in-between / new groups are drawn once
per task (the code) and a client holds row `task` of the per-task arrays. On
a "per_round" stream (GLFC Sec. 3: "we randomly determine {S_o, S_b, S_n} at
each global round, and S_n are irregularly added at any global round";
`cil.stream.draw_round_roles` states the reading) a client holds row
`cil.stream.client_tasks(...)[client]` at each round: an old client its
latest earlier task's data, an in-between or new client its current task's
data; the cohort is sampled among the clients joined by the round, and the
round also reports the cohort's roles ("glfc/roles/{old,in_between,new}").
Everything else (entropy rule, exemplars, prototypes) reads the client's
row, so the same round serves both.

The entropy rule is checked against the stream: every round reports, over the
sampled clients, `glfc/transitions/true` (the client's classes changed since
it last trained), `.../detected` (the rule fired; a client's first round
counts only when it is a true transition, since its previous entropy is the
code's initial 0), `.../hit` (both) and `.../false` (fired, not true).

Deviations from the authors' code (the proxy's are listed in `cil.proxy`):
  * L_GC's old/new grouping uses the class prefix [0, t*k) (`losses.glfc`),
    turned on once the client has exemplars (the code: on once its learned
    classes are non-empty, grouping by those classes). It differs only for a
    client that kept an old task's data: the code counts those current
    samples as "new", here they are "old".
  * By default only sampled clients update their memory and entropy; a
    client not sampled at a task change detects it the next time it is
    sampled. `glfc.update_all_clients = True` follows the paper (Sec. 4.3:
    "all clients are required to compute the average entropy ... at the
    beginning of each global round, and follow iCaRL to update their
    exemplar memory") and the code (`participant_exemplar_storing` runs
    `beforeTrain` + `update_new_set` for every non-sampled client each
    round): every joined client runs step 1-2 above with the round's
    received global model (the model before aggregation, as the code's
    `model_g` at that point), so a non-sampled client's entropy, transition
    state and exemplars follow the stream round by round; when it is sampled
    later its entropy has already risen, so it does not signal then (as in
    the code). The sampled clients' results are unchanged. Cost: one
    `prepare` (a forward pass over the client's data, herding at a
    transition) for each of the K_max clients every round, run `cil.
    clients_per_round` clients at a time (`map_clients_in_groups`: the
    memory of one cohort; vmapped within a group unless `cil.client_loop`
    is "map"); not-yet-joined clients are skipped. Each updated unsampled
    client receives the global model (counted in "train/server/bytes_down").
    Extra metrics:
    "glfc/unsampled/updated" (non-sampled clients updated) and
    "glfc/unsampled/detected" (transitions they detected).
  * Herding runs over the client's own previous data (the code: every
    training image of the class; the same with the default "overlap" data).

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022. Code: conditionWang/FCIL.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import models
from fedjax_het.algorithms import cil_replay, common
from fedjax_het import validation as v
from fedjax_het.cil import exemplars, masking
from fedjax_het.cil import proxy as proxy_lib
from fedjax_het.cil import stream as cil_stream
from fedjax_het.cil.stream import epoch_learning_rates, make_class_counts, task_of_round
from fedjax_het.engine import aggregation, cohort, local
from fedjax_het.engine.api import Algorithm
from fedjax_het.engine.clients import client_keys
from fedjax_het.losses import glfc as glfc_losses
from fedjax_het.losses import incremental as incremental_losses

TRANSITIONS = ("entropy", "stream")
#: Where the old model of L_RD comes from: GLFC's proxy server (`cil.proxy`), or the
#: global model at the end of the previous task (GLFC without its proxy).
OLD_MODELS = ("proxy", "previous_task_global")


def glfc_section() -> ml_collections.ConfigDict:
  """`config.glfc`: GLFC's client-side settings (paper / code values)."""
  return ml_collections.ConfigDict({
      "memory_size": exemplars.GLFC_MEMORY_SIZE,     # |M| per client, images
      "transition": "entropy",                       # "entropy" (Eq. 7) or "stream"
      "entropy_threshold": glfc_losses.TASK_TRANSITION_THRESHOLD,  # r_h
      "distinct_exemplars": False,                   # False: the code's herding (repeats)
      "old_model": "proxy",                          # or "previous_task_global" (no proxy)
      "use_gradient_compensation": True,             # False: plain BCE ("w/oCGC")
      "use_relation_distillation": True,             # False: iCaRL's old-class KD ("w/oCRD")
      "gc_weight": 0.5,                              # lambda_1 of Eq. 6 (from task 1 on)
      "rd_weight": 0.5,                              # lambda_2 of Eq. 6 (from task 1 on)
      "first_task_gc_weight": 1.0,                   # L_GC's weight without an old model
      "update_all_clients": False,                   # True: every joined client, every round
      "proxy": proxy_lib.proxy_section(),            # the proxy server (cil.proxy)
  })


def validate_glfc_config(config: ml_collections.ConfigDict) -> None:
  v.require_section(config, "glfc")
  v.check(config, "glfc.memory_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "glfc.transition", v.choice(TRANSITIONS), f"one of {TRANSITIONS}")
  v.check(config, "glfc.entropy_threshold",
          lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0,
          "a number >= 0")
  v.check(config, "glfc.distinct_exemplars", v.is_bool, "True or False")
  v.check(config, "glfc.old_model", v.choice(OLD_MODELS), f"one of {OLD_MODELS}")
  v.check(config, "glfc.use_gradient_compensation", v.is_bool, "True or False")
  v.check(config, "glfc.use_relation_distillation", v.is_bool, "True or False")
  if "update_all_clients" in config.glfc:
    v.check(config, "glfc.update_all_clients", v.is_bool, "True or False")
  for name in ("gc_weight", "rd_weight", "first_task_gc_weight"):
    v.check(config, f"glfc.{name}",
            lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0,
            "a number >= 0")
  proxy_lib.validate_proxy_config(config)


@dataclasses.dataclass(frozen=True)
class GLFCSettings:
  memory_size: int
  transition: str
  threshold: float
  distinct: bool
  max_per_class: int          # static herding length: memory // fewest classes of a client
  max_client_classes: int     # static: most classes one client holds in one task
  old_model: str = "previous_task_global"
  proxy: proxy_lib.ProxySettings = proxy_lib.ProxySettings()
  gradient_compensation: bool = True
  relation_distillation: bool = True
  gc_weight: float = 0.5
  rd_weight: float = 0.5
  first_task_gc_weight: float = 1.0
  update_all_clients: bool = False   # every joined client updates memory and entropy each round

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, client_classes: np.ndarray
                  ) -> "GLFCSettings":
    memory = int(config.glfc.memory_size)
    max_per_class, most = cil_replay.herding_sizes(client_classes, memory)
    return cls(memory_size=memory, transition=config.glfc.transition,
               threshold=float(config.glfc.entropy_threshold),
               distinct=bool(config.glfc.distinct_exemplars),
               max_per_class=max_per_class, max_client_classes=most,
               old_model=config.glfc.old_model,
               proxy=proxy_lib.ProxySettings.from_config(config),
               gradient_compensation=bool(config.glfc.use_gradient_compensation),
               relation_distillation=bool(config.glfc.use_relation_distillation),
               gc_weight=float(config.glfc.gc_weight), rd_weight=float(config.glfc.rd_weight),
               first_task_gc_weight=float(config.glfc.first_task_gc_weight),
               update_all_clients=bool(config.glfc.get("update_all_clients", False)))


class ClientState(NamedTuple):
  """GLFC state of every client (leading axis K_max; module docstring)."""
  memory: exemplars.ExemplarMemory
  entropy: jax.Array     # (K,) float32
  task: jax.Array        # (K,) int32
  last_task: jax.Array   # (K,) int32


def init_client_state(num_clients: int, memory_size: int) -> ClientState:
  memory = jax.vmap(lambda _: exemplars.init_memory(memory_size, (4,)))(jnp.arange(num_clients))
  return ClientState(memory=memory, entropy=jnp.zeros((num_clients,), jnp.float32),
                     task=jnp.full((num_clients,), -1, jnp.int32),
                     last_task=jnp.full((num_clients,), -1, jnp.int32))


def glfc_local_loss(model: Any, *, relation_distillation: bool = True, gc_weight: float = 0.5,
                    rd_weight: float = 0.5, first_task_gc_weight: float = 1.0
                    ) -> local.LocalLossFn:
  """The local objective of GLFC Eq. 6 on one batch.

  aux: "class_mask" (C,) seen classes, "old_model" variables, "use_old" ()
  bool (a task >= 1: gc_weight * L_GC + rd_weight * L_RD; else
  first_task_gc_weight * L_GC), "num_old" () int32 old classes of L_RD (t *
  k), "gc_old" () int32 old classes of L_GC (t * k once the client has
  exemplars, else 0: the code's plain BCE; always 0 without gradient
  compensation). `relation_distillation=False` replaces L_RD by iCaRL's
  old-class distillation (`losses.incremental.old_class_distillation_loss`).
  """

  def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
    variables = {"params": params, "batch_stats": batch_stats}
    _, logits, new_variables = models.apply_model(model, variables, images, train=True,
                                                  rng=rng, mask=mask)
    _, old_logits, _ = models.apply_model(model, aux["old_model"], images, train=False)
    old_logits = jax.lax.stop_gradient(old_logits)
    gc = glfc_losses.class_aware_gradient_compensation_loss(
        logits=logits, labels=labels, num_old_classes=aux["gc_old"],
        class_mask=aux["class_mask"], mask=mask)
    if relation_distillation:
      rd = glfc_losses.class_semantic_relation_distillation_loss(
          logits=logits, labels=labels, old_logits=old_logits, num_old_classes=aux["num_old"],
          class_mask=aux["class_mask"], mask=mask)
    else:
      rd = incremental_losses.old_class_distillation_loss(
          logits=logits, old_logits=old_logits, num_old_classes=aux["num_old"], mask=mask)
    first = gc if first_task_gc_weight == 1.0 else first_task_gc_weight * gc
    loss = jnp.where(aux["use_old"], gc_weight * gc + rd_weight * rd, first)
    return loss, (new_variables["batch_stats"], {"gc": gc, "rd": rd})

  return loss_fn


def _state_and_detected(prepared: tuple[Any, ...]) -> tuple[ClientState, jax.Array]:
  new_client, _, _, flags = prepared
  return new_client, flags["detected"]


def map_clients_in_groups(f: Any, client_states: Any, num_clients: int, group: int,
                          client_map: Any) -> Any:
  """`f(client_state, client_id)` for every client 0..K-1, `group` clients at a time.

  The clients are taken in groups of `group` (the cohort size: the memory of
  one cohort's `prepare`), one group after another (`lax.map`), each group
  through `client_map` (vmapped, or one client after another on CPU). The
  last group is filled with clients 0, 1, ... again; their results are
  dropped. Returns f's outputs with a leading axis K.
  """
  groups = -(-num_clients // group)
  ids = (jnp.arange(groups * group, dtype=jnp.int32) % num_clients).reshape(groups, group)
  out = jax.lax.map(lambda g: client_map(f, (cohort.gather(client_states, g), g)), ids)
  return jax.tree_util.tree_map(lambda x: x.reshape((groups * group,) + x.shape[2:])[:num_clients],
                                out)


def make_glfc(settings: Any, glfc: GLFCSettings, model: Any, mean: Any, std: Any,
              max_client_size: int, *, eval_batch_size: int = 500,
              image_size: int = 32) -> Algorithm:
  """GLFC's client side on the task stream as an `Algorithm` (module docstring).

  `settings` is the run's `cil.stream.StreamSettings`. State: {"server":
  variables, "clients": `ClientState`, and "proxy": `proxy.ProxyState`
  (glfc.old_model "proxy") or "old_model": variables (the global model at
  the end of the previous task)}. The round's data is a
  `cil.stream.StreamArrays`. Metrics: "train/loss", "train/gc", "train/rd"
  (means over the cohort), "glfc/entropy" (cohort mean), "glfc/transitions/
  {true,detected,hit,false}", "glfc/signals" (clients that signalled),
  "glfc/distilling" (clients with an old model) (counts over the cohort),
  "glfc/exemplars" (mean stored exemplars of the cohort after the update),
  with the proxy its "proxy/..." metrics (`proxy.server_update`),
  "train/server/bytes_up" / ".../bytes_down" (the round's communication, `common`), "task",
  "clients"; on a "per_round" stream "glfc/roles/{old,in_between,new}" (the
  cohort's roles), with `glfc.update_all_clients` "glfc/unsampled/{updated,
  detected}" (module docstring).
  """
  m, c, k = settings.clients_per_round, settings.num_classes, settings.classes_per_task
  n_max, mem = int(max_client_size), glfc.memory_size
  preprocess, trainer, forward, client_map = cil_replay.make_replay_training(
      settings, glfc_local_loss(model, relation_distillation=glfc.relation_distillation,
                                gc_weight=glfc.gc_weight, rd_weight=glfc.rd_weight,
                                first_task_gc_weight=glfc.first_task_gc_weight),
      model, mean, std, n_max + mem, eval_batch_size)

  use_proxy = glfc.old_model == "proxy"
  slots = glfc.max_client_classes
  encoder = (proxy_lib.make_encoder(c, image_size, glfc.proxy.encoder_conv_impl) if use_proxy
             else None)

  def init(key, data):
    num_clients = data.client_joined.shape[1]
    variables = models.init_variables(model, key)
    state = {"server": variables, "clients": init_client_state(num_clients, mem)}
    if use_proxy:
      state["proxy"] = proxy_lib.init_proxy_state(
          jax.random.fold_in(key, 1), encoder, variables, m * slots, glfc.proxy,
          data.images.shape[1:], c)
    else:
      state["old_model"] = variables
    return state

  def prepare(global_vars, client, client_id, task, source, data):
    """Entropy, transition and memory update of ONE client (before training).

    `source` is the row of the per-task arrays the client holds this round
    (`cil.stream.client_tasks`: the round's task on a "per_task" stream).
    """
    class_mask = masking.seen_class_mask((task + 1) * k, c)
    rows = data.client_indices[source, client_id]
    size = data.client_sizes[source, client_id]
    valid = jnp.arange(n_max) < size
    _, logits = forward(global_vars, data.images[rows])
    entropy = glfc_losses.mean_prediction_entropy(logits=logits, class_mask=class_mask,
                                                  mask=valid)
    current = data.client_classes[source, client_id]
    moved = client.task != source
    last_task = jnp.where(moved, client.task, client.last_task)
    before = data.client_classes[jnp.maximum(client.task, 0), client_id]
    true = (client.task >= 0) & moved & jnp.any(before != current)
    if glfc.transition == "stream":
      detected = true
      signal = true | (client.task < 0)  # a client's first data are new classes too
    else:
      fired = glfc_losses.task_transition_detected(entropy=entropy,
                                                   previous_entropy=client.entropy,
                                                   threshold=glfc.threshold)
      # First round of a client: the code's initial entropy 0 makes the rule fire; there is
      # nothing to store then, so count it only where it is a real transition.
      detected = fired & (client.task >= 0)
      signal = fired  # the code's `signal`: shares prototypes, picks the proxy's model

    memory = cil_replay.store_previous_classes(
        client.memory, forward, global_vars, data, client_id, last_task=last_task,
        current=current, detected=detected, n_max=n_max, num_classes=c,
        max_new_classes=glfc.max_client_classes, max_per_class=glfc.max_per_class,
        distinct=glfc.distinct)
    new_client = ClientState(memory=memory, entropy=entropy.astype(jnp.float32),
                             task=jnp.asarray(source, jnp.int32),
                             last_task=last_task.astype(jnp.int32))
    train_rows, train_size = cil_replay.replay_rows(rows, size, memory, n_max)
    flags = {"true": true, "detected": detected, "signal": signal, "entropy": entropy}
    return new_client, train_rows, train_size, flags

  def prototype_gradients(trained_vars, client_id, signal, key, source, class_mask, data,
                          encoder_vars):
    """A signalling client's shared gradients (`proxy.client_prototype_gradients`)."""
    (classes,) = jnp.nonzero(data.client_classes[source, client_id], size=slots, fill_value=-1)
    classes = classes.astype(jnp.int32)
    rows = data.client_indices[source, client_id]
    valid = jnp.arange(n_max) < data.client_sizes[source, client_id]

    def share(_):
      return proxy_lib.client_prototype_gradients(
          model, trained_vars, encoder, encoder_vars, images=data.images[rows],
          labels=data.labels[rows], valid=valid, classes=classes, class_mask=class_mask,
          key=key, forward=forward, preprocess=preprocess, proxy=glfc.proxy)

    def nothing(_):
      zeros = jax.tree_util.tree_map(lambda p: jnp.zeros((slots,) + p.shape, p.dtype),
                                     encoder_vars["params"])
      return zeros, jnp.zeros((slots,), bool)

    gradients, slot_valid = jax.lax.cond(signal, share, nothing, None)
    return gradients, slot_valid & signal, classes

  def round_fn(state, data, key, round_index):
    sample_key, train_key, share_key, proxy_key = jax.random.split(key, 4)
    task = task_of_round(round_index, settings)
    sources = cil_stream.client_tasks(data, round_index, settings)   # (K,), -1: absent
    server = state["server"]
    clients, updated, _, members, flags = cil_replay.replay_cohort(
        sample_key, state["clients"], data, task, m, client_map,
        lambda cs, cid: prepare(server, cs, cid, task, sources[cid], data),
        joined=sources >= 0)
    client_states = state["clients"]
    extra_metrics = {}
    unsampled = jnp.zeros((), jnp.float32)   # clients receiving the model without training
    if glfc.update_all_clients:  # the code's participant_exemplar_storing, every client
      num_clients = sources.shape[0]
      others = (sources >= 0) & ~jnp.zeros((num_clients,), bool).at[clients].set(True)
      everyone, detected_all = map_clients_in_groups(
          lambda cs, cid: _state_and_detected(prepare(server, cs, cid, task,
                                                      jnp.maximum(sources[cid], 0), data)),
          client_states, num_clients, m, client_map)
      client_states = jax.tree_util.tree_map(
          lambda new, old: jnp.where(others.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
          everyone, client_states)
      extra_metrics["glfc/unsampled/updated"] = jnp.sum(others).astype(jnp.int32)
      unsampled = jnp.sum(others.astype(jnp.float32))
      extra_metrics["glfc/unsampled/detected"] = jnp.sum(others & detected_all).astype(
          jnp.int32)
    roles = cil_stream.client_roles(data, round_index)
    if roles is not None:  # the cohort's roles on a "per_round" stream
      for code, name in enumerate(cil_stream.ROLE_NAMES[1:], start=1):
        extra_metrics[f"glfc/roles/{name}"] = jnp.sum(roles[clients] == code).astype(jnp.int32)
    class_mask = masking.seen_class_mask((task + 1) * k, c)
    has_memory = updated.memory.num_seen > 0
    signal = flags["signal"]
    if use_proxy:  # Theta_t for signalling clients, Theta_{t-1} for the others
      old_models, old_exists = jax.vmap(
          lambda sig: proxy_lib.old_model_for(state["proxy"], sig))(signal)
    else:
      old_model = cil_replay.previous_task_model(server, state["old_model"], round_index,
                                                 settings.rounds_per_task)
      old_models, old_exists = aggregation.broadcast(old_model, m), jnp.ones((m,), bool)
    use_old = (task > 0) & old_exists
    aux = {"class_mask": jnp.broadcast_to(class_mask, (m, c)),
           "old_model": old_models,
           "use_old": use_old,
           "num_old": jnp.broadcast_to(task * k, (m,)).astype(jnp.int32),
           "gc_old": (jnp.where(has_memory, task * k, 0) if glfc.gradient_compensation
                      else jnp.zeros((m,))).astype(jnp.int32)}
    learning_rates = epoch_learning_rates(settings, round_index)
    trained, local_metrics = local.train_clients(
        trainer, aggregation.broadcast(server, m), aux, members,
        client_keys(train_key, clients), learning_rates, sequential=settings.sequential)
    new_server = aggregation.weighted_mean(trained, jnp.ones((m,), jnp.float32))
    true, detected = flags["true"], flags["detected"]
    metrics = {
        "train/loss": jnp.mean(local_metrics["loss"]),
        "train/gc": jnp.mean(local_metrics["gc"]),
        "train/rd": jnp.mean(local_metrics["rd"]),
        "glfc/entropy": jnp.mean(flags["entropy"]),
        "glfc/transitions/true": jnp.sum(true).astype(jnp.int32),
        "glfc/transitions/detected": jnp.sum(detected).astype(jnp.int32),
        "glfc/transitions/hit": jnp.sum(true & detected).astype(jnp.int32),
        "glfc/transitions/false": jnp.sum(detected & ~true).astype(jnp.int32),
        "glfc/signals": jnp.sum(signal).astype(jnp.int32),
        "glfc/distilling": jnp.sum(use_old).astype(jnp.int32),
        "glfc/exemplars": jnp.mean(jnp.sum(updated.memory.valid, axis=-1).astype(jnp.float32)),
        "task": task, "clients": clients, **extra_metrics}
    new_state = {"server": new_server,
                 "clients": cohort.scatter(client_states, clients, updated)}
    if use_proxy:
      encoder_vars = state["proxy"].encoder
      gradients, valid, classes = client_map(
          lambda tv, cid, sig, kk, src: prototype_gradients(tv, cid, sig, kk, src, class_mask,
                                                            data, encoder_vars),
          (trained, clients, signal, client_keys(share_key, clients), sources[clients]))
      pool = jax.tree_util.tree_map(lambda g: g.reshape((m * slots,) + g.shape[2:]),
                                    gradients)
      new_state["proxy"], proxy_metrics = proxy_lib.server_update(
          state["proxy"], new_server, gradients=pool, gradient_valid=valid.reshape(-1),
          true_labels=classes.reshape(-1), key=proxy_key, class_mask=class_mask,
          encoder=encoder, forward=forward, proxy=glfc.proxy)
      metrics.update(proxy_metrics)
      num_shared = jnp.sum(valid.astype(jnp.float32))  # one encoder gradient per class
      shared = num_shared * common.tree_bytes(encoder_vars["params"])
    else:
      new_state["old_model"] = old_model
      shared = 0.0
    # Communication: the cohort's models (and the prototype gradients for the proxy) up; the
    # global model, and the old model of L_RD to every client distilling from it, down (with
    # glfc.update_all_clients the global model also to every unsampled client it updates).
    model_size = common.tree_bytes(server)
    metrics.update(common.stream_bytes(
        m * model_size + shared,
        model_size * (m + unsampled + jnp.sum(use_old.astype(jnp.float32)))))
    return new_state, metrics

  def evaluate(state, test):
    images, labels, num_seen = test
    counts = make_class_counts(model, mean, std, c, labels.shape[0], eval_batch_size)
    return counts(state["server"], images, labels, num_seen)

  return Algorithm(name="glfc", init=init, round=round_fn, evaluate=evaluate)


def default_config() -> ml_collections.ConfigDict:
  """GLFC's own section, `config.glfc` (`glfc_section`)."""
  return ml_collections.ConfigDict({"glfc": glfc_section()})


validate_config = validate_glfc_config


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """GLFC from a class-incremental config (`make_glfc`)."""
  return make_glfc(setup.settings, GLFCSettings.from_config(config, setup.client_classes),
                   setup.model, setup.mean, setup.std, setup.max_client_size,
                   eval_batch_size=setup.eval_batch_size, image_size=setup.image_size)

"""FedKD: a shared small mentee learned by adaptive mutual distillation (Wu et al., Nat.
Commun. 2022), as HtFLlib runs it for heterogeneous models.

Every client keeps its private model (the mentor, never sent), a copy of the shared mentee
(HtFLlib: `BaseHeadSplit(args, 0)`, participant 0's backbone with features pooled to
`htfl.feature_dim`) and its own W_h (Linear(D, D) without bias, kept on the client). Every
round (all K clients):
  1. Local training: `local.epochs` epochs of SGD (lr 0.01, batch 10, 1 epoch) in which the
     mentor, the mentee copy and W_h descend loss + loss_g of `losses.htfl.fedkd_losses`
     (Eq. 1-6: CE + the adaptive distillation KL / (CE + CE_g) + the adaptive hidden loss
     MSE(h, W_h h_g) / (CE + CE_g), nothing detached, as HtFLlib back-propagates both
     losses into every parameter before stepping), each model's gradient clipped to norm 10
     (`torch.nn.utils.clip_grad_norm_`), the mentee at `fedkd.mentee_lr`.
  2. Upload: with `fedkd.compression = "svd"` (HtFLlib's default) every client sends its
     mentee copy SVD-truncated (`svd_truncate`, HtFLlib's `decomposition`) at the round's
     energy share T_r = T_start + r / R (T_end - T_start) (round r = 0, 1, ..., R rounds;
     `fedkd.energy_start` 0.95, `fedkd.energy_end` 0.98, `-Ts` / `-Te`); "none" sends it whole.
  3. Server: the received mentees (reconstructed) are averaged uniformly over the clients
     (HtFLlib's `aggregate_parameters`: 1 / #clients), truncated again at T_r ("svd") and
     sent back; BatchNorm running statistics are buffers, not parameters, in the code, so
     each client's mentee keeps its own.
Inference: each client's private model.

The truncation (HtFLlib's `decomposition` and `recover`, after FedKD's own code): a parameter
with more than one dimension whose torch layout has more than one row (a Linear's output
features, a Conv's output channels) is split into matrices, the whole (out, in) matrix of a
Linear and the (kh, kw) kernel of every (out, in) pair of a Conv, each factored u s v by SVD.
Over the n singular-value positions j, E_j = the sum of s_j^2 over the matrices; the rank kept
is t = the smallest k in 0, ..., n - 1 with E_0 + ... + E_{k-1} > T (E_0 + ... + E_{n-1}),
and 0 when no k qualifies: the code never keeps all n, so a parameter whose last singular
value holds at least 1 - T of its energy arrives as zeros (a random (10, 512) head, ten
singular values of about equal size, at T = 0.95, for instance). An all-zero parameter, a
vector and a parameter of one row travel whole. Received: u[:, :t] s[:t] v[:t] of each matrix.
The byte counts count the float32 numbers sent: t (m + n' + 1) for each m x n' matrix.

Defaults and their sources: mentee lr 0.01 (`-mlr 0.01`), compression "svd" with
`-Ts 0.95 -Te 0.98` (HtFLlib's `total.sh` for FedKD, `main.py`'s defaults), local SGD as
`htfl_common.local_config`, features pooled to 512.

Deviations: each local epoch visits the rows in a fresh random order and keeps the last
partial batch; HtFLlib evaluates before a round's training, this library after it; the SVD
runs in float32 on the device (the code: NumPy's float32 LAPACK on the host).

Reference: C. Wu, F. Wu, L. Lyu, Y. Huang, X. Xie. Communication-efficient federated learning
via knowledge distillation. Nature Communications 13, 2032 (2022). Code read: TsingZ0/HtFLlib
system/flcore/clients/clientkd.py, servers/serverkd.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_het import models, validation
from fedjax_het.algorithms import common, htfl_common
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import local, optim
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.engine.clients import ClientGroup, init_group_variables
from fedjax_het.losses import htfl as htfl_losses

#: HtFLlib's gradient clipping (`clip_grad_norm_(..., 10)` on each model and on W_h).
CLIP_NORM = 10.0
PARTS = ("private", "mentee", "w")
#: `fedkd.compression`: HtFLlib's SVD truncation of the exchanged mentee, or none.
COMPRESSIONS = ("svd", "none")
#: HtFLlib's energy shares T_start and T_end (`-Ts 0.95 -Te 0.98`).
ENERGY_START, ENERGY_END = 0.95, 0.98


def energy_share(round_index: jax.Array, num_rounds: int | jax.Array, start: float,
                 end: float) -> jax.Array:
  """T_r = start + r / R (end - start): HtFLlib's energy of round r = 0, 1, ... (serverkd's
  update after round r - 1)."""
  fraction = optim.divide_as_by_constant(jnp.asarray(round_index, jnp.float32), num_rounds)
  return start + fraction * (end - start)


def _torch_layout(x: jax.Array) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
  """A flax parameter as the stack of matrices the code factors, and the way back: a Dense
  kernel (in, out) is one matrix (its transpose's SVD has the same singular values), a Conv
  kernel (kh, kw, in, out) the (out, in) stack of (kh, kw) matrices."""
  if x.ndim == 4:
    return jnp.transpose(x, (3, 2, 0, 1)), lambda y: jnp.transpose(y, (2, 3, 1, 0))
  return x, lambda y: y


def svd_truncate(x: jax.Array, energy: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One parameter as HtFLlib's FedKD sends and receives it (module docstring).

  Args:
    x: a flax parameter (Dense kernel (in, out), Conv kernel (kh, kw, in, out), or a vector).
    energy: T, the energy share.

  Returns:
    (the received parameter, the number of floats sent), both float32.
  """
  rows = x.shape[-1] if x.ndim in (2, 4) else 1      # the torch layout's first dimension
  if rows <= 1:
    return x, jnp.asarray(x.size, jnp.float32)
  stack, back = _torch_layout(x)
  u, sv, vt = jnp.linalg.svd(stack, full_matrices=False)
  per_position = jnp.sum(jnp.reshape(sv ** 2, (-1, sv.shape[-1])), axis=0)     # E_j, (n,)
  total = jnp.sum(per_position)
  before = jnp.cumsum(per_position) - per_position                            # E_0..E_{k-1}
  qualifies = before > energy * total
  rank = jnp.where(jnp.any(qualifies), jnp.argmax(qualifies), 0)
  kept = jnp.where(jnp.arange(sv.shape[-1]) < rank, sv, 0.0)
  received = back(jnp.matmul(u * kept[..., None, :], vt)).astype(x.dtype)
  matrices = stack.size // (stack.shape[-2] * stack.shape[-1])
  sent = (matrices * rank * (stack.shape[-2] + stack.shape[-1] + 1)).astype(jnp.float32)
  whole = total == 0
  return (jnp.where(whole, x, received),
          jnp.where(whole, jnp.asarray(x.size, jnp.float32), sent))


def compress_tree(params: Any, energy: jax.Array) -> tuple[Any, jax.Array]:
  """`svd_truncate` of every leaf: (the received tree, the floats sent in all)."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  pairs = [svd_truncate(leaf, energy) for leaf in leaves]
  return (jax.tree_util.tree_unflatten(treedef, [p[0] for p in pairs]),
          sum(p[1] for p in pairs))


def make_optimizer(mentee_lr_ratio: float) -> optax.GradientTransformation:
  """SGD over {"private", "mentee", "w"}: each part's gradient clipped to norm 10, the mentee's
  rate `mentee_lr_ratio` times the injected learning rate."""
  def build(learning_rate):
    clipped = optax.multi_transform(
        {"private": optax.clip_by_global_norm(CLIP_NORM),
         "mentee": optax.chain(optax.clip_by_global_norm(CLIP_NORM),
                               optax.scale(mentee_lr_ratio)),
         "w": optax.clip_by_global_norm(CLIP_NORM)},
        lambda params: {part: part for part in params})
    return optax.chain(clipped, optax.scale_by_learning_rate(learning_rate))
  return optax.inject_hyperparams(build)(learning_rate=0.0)


def make_fedkd(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FedKD as an `Algorithm` (module docstring)."""
  cfg, loc = config.fedkd, config.local
  if loc.optimizer != "sgd" or float(loc.weight_decay) or float(loc.get("momentum", 0.0)):
    validation.fail("local.optimizer", "'sgd' without weight decay or momentum for fedkd "
                    "(HtFLlib's FedKD)", loc.optimizer)
  setup = htfl_common.feature_setup(config, setup)
  dim = htfl_common.feature_dim(setup)
  first = next(g for g in setup.groups if 0 in g.clients)
  mentee = first.model
  mentee_group = ClientGroup(name="mentee", model=mentee, clients=(0,), num_slots=1)
  mentee_forward = common.forward_fn(mentee_group, train=True)
  optimizer = make_optimizer(float(cfg.mentee_lr) / float(loc.lr))
  preprocess = normalizer(setup.private_mean, setup.private_std)

  def loss_for(group):
    forward = common.forward_fn(group, train=True)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux):
      del aux
      r_private, r_mentee = jax.random.split(rng)
      h, z, private_stats = forward(params["private"], batch_stats["private"], images,
                                    r_private, mask)
      h_g, z_g, mentee_stats = mentee_forward(params["mentee"], batch_stats["mentee"], images,
                                              r_mentee, mask)
      loss, loss_g = htfl_losses.fedkd_losses(
          logits=z, mentee_logits=z_g, features=h, mapped_mentee_features=h_g @ params["w"],
          labels=labels, mask=mask)
      return loss + loss_g, ({"private": private_stats, "mentee": mentee_stats},
                             {"mentor": loss, "mentee": loss_g})

    return loss_fn

  phase = htfl_common.local_phase(config, setup, trainers={g.name: local.make_local_trainer(
      loss_fn=loss_for(g), optimizer=optimizer, epochs=int(loc.epochs),
      batch_size=int(loc.batch_size), max_size=setup.max_sizes[g.name], preprocess=preprocess)
      for g in setup.groups})
  mentee_floats = sum(int(x.size) for x in jax.tree_util.tree_leaves(jax.eval_shape(
      lambda: models.init_variables(mentee, jax.random.key(0))["params"])))

  def init(key, data):
    del data
    private_key, mentee_key, w_key = jax.random.split(key, 3)
    shared = models.init_variables(mentee, mentee_key)
    bound = 1.0 / jnp.sqrt(dim)   # torch's Linear(D, D, bias=False) init
    groups = {}
    for g in setup.groups:
      groups[g.name] = {
          "variables": init_group_variables(g, private_key, shared=False,
                                            num_participants=setup.num_participants),
          "mentee_stats": htfl_common.broadcast_slots(shared["batch_stats"], g.num_slots),
          "w_h": jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(w_key, i), (dim, dim),
                                                       minval=-bound, maxval=bound))(
              phase.ids[g.name])}
    return {"groups": groups, "mentee": shared["params"]}

  compression = cfg.get("compression", "none")
  if compression not in COMPRESSIONS:
    validation.fail("fedkd.compression", f"one of {COMPRESSIONS}", compression)
  energy_start = float(cfg.get("energy_start", ENERGY_START))
  energy_end = float(cfg.get("energy_end", ENERGY_END))

  def round_fn(state, data, key, round_index):
    local_key = jax.random.split(key, 4)[3]
    energy = energy_share(round_index, optim.num_rounds_in_run(setup.num_rounds),
                          energy_start, energy_end)
    groups, metrics, copies, sent_up = {}, {}, {}, {}
    for group in setup.groups:
      g, s = state["groups"][group.name], group.num_slots
      joint = {"params": {"private": g["variables"]["params"],
                          "mentee": htfl_common.broadcast_slots(state["mentee"], s),
                          "w": g["w_h"]},
               "batch_stats": {"private": g["variables"]["batch_stats"],
                               "mentee": g["mentee_stats"]}}
      trained, metrics[group.name] = phase.train(group, joint, jnp.zeros((s,)), data, local_key,
                                                 round_index)
      private = {"params": trained["params"]["private"],
                 "batch_stats": trained["batch_stats"]["private"]}
      groups[group.name] = {
          **g, "variables": phase.keep_active(group, private, g["variables"]),
          "mentee_stats": phase.keep_active(group, trained["batch_stats"]["mentee"],
                                            g["mentee_stats"]),
          "w_h": phase.keep_active(group, trained["params"]["w"], g["w_h"])}
      copies[group.name] = trained["params"]["mentee"]
      if compression == "svd":
        copies[group.name], floats = jax.vmap(compress_tree, in_axes=(0, None))(
            copies[group.name], energy)
        sent_up[group.name] = jnp.sum(jnp.where(phase.active[group.name], floats, 0.0))
    mentee_params = htfl_common.weighted_tree_mean(
        copies, {n: phase.active[n].astype(jnp.float32) for n in copies})
    k = setup.num_participants
    up = down = jnp.asarray(k * mentee_floats, jnp.float32)
    server = {}
    if compression == "svd":
      mentee_params, floats = compress_tree(mentee_params, energy)
      up, down = sum(sent_up.values()), k * floats
      server = {"energy": energy, "mentee_floats_sent": floats}
    return ({**state, "groups": groups, "mentee": mentee_params},
            {"local": metrics,
             "server": {"bytes_up": htfl_common.float_bytes(up),
                        "bytes_down": htfl_common.float_bytes(down), **server}})

  return Algorithm(name="fedkd", init=init, round=round_fn,
                   evaluate=htfl_common.make_evaluate(config, setup))


def default_config() -> ml_collections.ConfigDict:
  """`local` (HtFLlib's SGD), `htfl` (pooled feature dimension) and `fedkd`."""
  c = htfl_common.default_sections()
  c.fedkd = ml_collections.ConfigDict({
      "mentee_lr": 0.01,        # -mlr 0.01
      "compression": "svd",     # the exchanged mentee SVD-truncated ("none": sent whole)
      "energy_start": ENERGY_START,   # T of round 0 (-Ts 0.95)
      "energy_end": ENERGY_END,       # T approached at round R (-Te 0.98)
  })
  return c


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fedkd`, `config.htfl` and `config.local`."""
  htfl_common.validate_sections(config)
  validation.require_section(config, "fedkd")
  validation.check(config, "fedkd.mentee_lr", validation.positive, "a number > 0")
  validation.check(config, "fedkd.compression", validation.choice(COMPRESSIONS),
                   f"one of {COMPRESSIONS}")
  for field in ("energy_start", "energy_end"):
    validation.check(config, f"fedkd.{field}",
                     lambda v: validation.finite_number(v) and 0 <= v <= 1, "a number in [0, 1]")

"""FCCL+ (FCCL+ Algorithm 1): FCCM + FISL on public data, CE + FNTD locally.

`round` below is the whole method: every communication round e,
  1. Collaborative updating on each unlabeled public batch: every participant
     computes logits Z_i and instance-similarity logits S_i (one forward pass
     returning both); the targets are the means over ALL participants of the
     detached Z_i and S_i (FCCL+ Alg. 1: Z_bar = 1/K sum_i Z_i, S_bar likewise),
     and each participant descends L_colla = L_FCCM + omega * L_FISL (Eq. 6).
     Each loss depends only on its own participant's parameters, so all
     participants update simultaneously: one gradient of the sum over all
     participants (targets stop-gradient) gives every participant's gradient.
  2. Homogeneous variant only: parameter (and BatchNorm statistics) averaging.
  3. Local updating on private data: L_local = CE + FNTD(teacher) (Eq. 14),
     the teacher being the participant's model at the END of the previous
     round's local updating (theta^{e-1}; round 0: the initial model;
     `fcclplus.fntd_teacher`).

Defaults follow the authors' code; every deviation is a config field:
  * collaborative optimiser: Adam(lr 1e-3) re-created for every participant on
    every public batch (`collaborative.optimizer_reset="batch"`: in effect
    sign-SGD with step lr); "round" / "never" keep the state longer.
  * local optimiser: Adam(lr 1e-3), torch-style L2 weight decay 1e-5, new
    state every round.
  * both learning rates decay linearly: round r uses lr0 (1 - 0.9 max(r-1,0)/E).
  * the FNTD teacher runs in train mode (batch statistics) as in the code
    (`fcclplus.teacher_train_mode`).
  * `fcclplus.feature_pass`: "shared" (default; a deviation) takes the FISL features and
    the FCCM logits from one train-mode forward pass; "separate" (the FCCL+ code's
    `col_update`: `net(images)`, then `net.features(images)`) takes the features from a
    second train-mode pass on the same batch, which starts from the BatchNorm statistics
    the first pass updated (so they are updated twice per public batch) and draws its own
    dropout mask (EfficientNet-B0's dropout on the pooled feature). Both passes carry
    gradients; without dropout the second pass's features equal the first's, so the
    gradient is the same and only the running statistics differ.
  * `fcclplus.fccm_eps`: the epsilon added to each logit column's variance in FCCM's
    standardisation (default 1e-6, the library's guard against a constant column); the
    FCCL+ code has none (0).
  * ablations: `fcclplus.use_fisl=False` (FCCM only), `fcclplus.use_fccm=False` (FISL
    only; FCCL+ Table X's rows without FCCM), `fcclplus.local_distillation`
    in {"fntd", "kd" (CE + tau^2 KD, Eq. 10), "kd_then_fntd", "none", "dual", "ewc"};
    "kd_then_fntd" is Table XVII's schedule: KD in the first
    round(fcclplus.kd_fraction * local.epochs) local epochs of every round, FNTD in the rest
    (one optimiser over all of them).
  * `fcclplus.local_distillation="dual"`: the conference version's local objective,
    FCCL+ Eq. 19 = FCCL (CVPR 2022) Eq. 4-7 dual-domain distillation,
      L_local = CE + lambda_Loc (KL(softmax(Z^{e-1}/tau) || softmax(Z/tau))
                                 + KL(softmax(Z*/tau) || softmax(Z/tau))),
    Z^{e-1} the logits of the FNTD teacher above (theta^{e-1}), Z* those of theta^*, the
    participant's model pretrained on its private data alone. As in FCCL (`fccl.py`, whose
    pieces are reused: `private_training.pretrain_variables`,
    `losses.dual_domain_distillation_loss`),
    `init` then first pretrains every participant (SOLO, `fcclplus.pretrain_epochs` epochs
    of Adam, lr cosine-annealed from `fcclplus.pretrain_lr` to `fcclplus.pretrain_min_lr`,
    batch `local.batch_size`), training starts from theta^* (homogeneous variant:
    participant 0's), theta^{0} = theta^* is round 1's previous model, and the state keeps
    "pretrained"; lambda_Loc = `fcclplus.dual_weight`, tau = `fcclplus.dual_temperature`
    (FCCL's defaults 1 and 1). Both teachers run in `fcclplus.teacher_train_mode`
    (FCCL: eval mode). The metric `local/distill` is lambda_Loc L_dual. This is the local
    objective of FCCL+ Table X's rows without FNTD (FCCM only: `use_fisl=False`, FISL
    only: `use_fccm=False`, FCCM + FISL), of Table XIII (FISL only) and of Table XIV
    (FCCM + FISL, omega varied): "For the local updating phase without FNTD module,
    experiments remain same optimization objective as our conference version in Eq. 19"
    (FCCL+ Sec. 4.3). The other choices neither pretrain nor keep "pretrained".
  * `fcclplus.fntd_teacher`: the teacher T of the local objective (FCCL+ Eq. 13-14; the
    previous model of "kd", "kd_then_fntd" and "dual" and EWC's anchor too).
    "previous_local" (default, Eq. 14): theta^{e-1}, the participant's model at the end of
    the previous round's local updating. "after_collaborative": theta^e, the model after this
    round's collaborative updating, i.e. the model local updating starts from (homogeneous
    variant: after the averaging). FCCL+ Fig. 9 compares the two ("theta^{e-1} (after local
    updating) and theta^e (after collaborative updating)") and finds theta^{e-1} better. The
    state keeps "teacher" = theta^{e-1} either way.
  * `fcclplus.local_distillation="ewc"`: FCCL+ Table XVI's replacement of FNTD by the EWC
    penalty (Kirkpatrick et al., PNAS 2017, Eq. 3; `losses/ewc.py`),
      L_local = CE + (lambda / 2) sum_i F_i (theta_i - theta*_i)^2,
    theta* the teacher above (theta^{e-1} by default), lambda = `fcclplus.ewc_weight` (Table
    XVI tries 0.01, 0.1, 0.7, 1.0; default 1.0), F the diagonal Fisher of theta* on the
    participant's private data, computed once per round before local updating, per
    participant (vmapped over the group's slots) inside the jitted round: the mean over the
    participant's examples of the squared per-example gradient of log p(y | x; theta*),
    theta* in eval mode (running BatchNorm statistics, no dropout: a per-example gradient
    needs a per-example forward pass), `fcclplus.ewc_batch_size` examples at a time. Labels
    (`fcclplus.ewc_labels`): "sampled" (default) draws y from the model's own softmax, one
    label per example, the Monte-Carlo estimate of the Fisher information EWC defines;
    "true" uses the private labels (the empirical Fisher, Kunstner et al., NeurIPS 2019).
    The paper gives neither choice nor code for its EWC row. F covers the parameters
    ("params"), not the BatchNorm statistics. `local/distill` is the penalty.
  * the metric `local/distill` (FNTD) can be slightly negative (about -0.02):
    the authors' form is the KL sum without the target class's term and
    without renormalising over the C-1 non-target classes, and such a partial
    sum is not bounded below by 0 (`non_target_distillation_loss(renormalize=True)`
    is a true KL divergence).

Reference: W. Huang, M. Ye, Z. Shi, B. Du. Generalizable Heterogeneous Federated
Cross-Correlation and Instance Similarity Learning. TPAMI.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import losses, validation
from fedjax_het.algorithms import common, private_training
from fedjax_het.data.augment import normalizer
from fedjax_het.engine import aggregation, local, public
from fedjax_het.engine.api import Algorithm, Setup, Stage
from fedjax_het.engine.clients import (client_keys, init_group_variables, slot_active, slot_ids,
                                       vmap_slots, where_active)
from fedjax_het.engine.optim import apply_updates, make_optimizer, round_decay_schedule
from fedjax_het.losses import ewc as ewc_lib

LOCAL_DISTILLATIONS = ("fntd", "kd", "kd_then_fntd", "none", "dual", "ewc")
#: Where FISL's features come from: the FCCM forward pass, or a second pass (the code's).
FEATURE_PASSES = ("shared", "separate")
#: Folded into a public batch's key for the second ("separate") pass's dropout masks.
FEATURE_PASS_KEY_STREAM = 0xFEA
#: The teacher T of the local objective (FCCL+ Eq. 13-14, Fig. 9): theta^{e-1}, the model at
#: the end of the previous round's local updating, or theta^e, the model after this round's
#: collaborative updating.
FNTD_TEACHERS = ("previous_local", "after_collaborative")
#: Folded into the local phase's key for the EWC labels' key (the training keys are unchanged).
EWC_KEY_STREAM = 0xE3C
#: Labels of EWC's Fisher: drawn from the model's predictive distribution, or the true ones.
EWC_LABELS = ("sampled", "true")


class Phases(NamedTuple):
  """FCCL+'s phases as pure functions (the round composes them; tests call them alone).

  init: (key, data) -> state.
  reset_optimizer: (state) -> state with fresh collaborative optimiser states.
  collaborative_step: (state, public images, key, round) -> (state, metrics):
    one FCCM + FISL step of every participant on one public batch.
  local_update: (state, {group: GroupData}, key, round) -> (state, metrics).
  """
  init: Any
  reset_optimizer: Any
  collaborative_step: Any
  local_update: Any


def make_phases(config: ml_collections.ConfigDict, setup: Setup) -> Phases:
  """FCCL+'s phases from `config.fcclplus`, `config.collaborative`, `config.local`."""
  cfg, col, loc = config.fcclplus, config.collaborative, config.local
  lam = float(cfg.off_diagonal_weight)
  fccm_eps = float(cfg.fccm_eps)
  separate_features = common.check_choice("fcclplus.feature_pass", cfg.feature_pass,
                                          FEATURE_PASSES) == "separate"
  omega = float(cfg.fisl_weight)
  mu = float(cfg.fisl_temperature)
  tau = float(cfg.fntd_temperature)
  use_fisl = bool(cfg.use_fisl)
  use_fccm = bool(cfg.use_fccm)
  distillation = common.check_choice("fcclplus.local_distillation", cfg.local_distillation,
                                     LOCAL_DISTILLATIONS)
  renormalize = bool(cfg.fntd_renormalize)
  kd_epochs = int(round(float(cfg.kd_fraction) * int(loc.epochs)))
  dual = distillation == "dual"
  dual_weight = float(cfg.dual_weight)
  dual_tau = float(cfg.dual_temperature)
  teacher_train_mode = bool(cfg.teacher_train_mode)
  teacher_choice = common.check_choice("fcclplus.fntd_teacher",
                                       cfg.get("fntd_teacher", "previous_local"), FNTD_TEACHERS)
  ewc = distillation == "ewc"
  ewc_weight = float(cfg.get("ewc_weight", 1.0))
  ewc_labels = common.check_choice("fcclplus.ewc_labels", cfg.get("ewc_labels", "sampled"),
                                   EWC_LABELS)
  ewc_chunk = int(cfg.get("ewc_batch_size", ewc_lib.FISHER_CHUNK_SIZE))
  average = common.check_parameter_averaging("fcclplus.average_parameters",
                                              cfg.average_parameters, setup)
  reset = common.check_choice("collaborative.optimizer_reset", col.optimizer_reset,
                              public.OPTIMIZER_RESETS)
  col_tx = make_optimizer(col.optimizer)
  col_lr = round_decay_schedule(float(col.lr), setup.num_rounds, float(col.lr_decay))
  loc_lr = round_decay_schedule(float(loc.lr), setup.num_rounds, float(loc.lr_decay))
  ids = {g.name: jnp.asarray(slot_ids(g, setup.num_participants)) for g in setup.groups}
  active = {g.name: jnp.asarray(slot_active(g)) for g in setup.groups}

  def init(key, data):
    groups = {}
    for group in setup.groups:
      variables = init_group_variables(group, key, shared=setup.homogeneous,
                                       num_participants=setup.num_participants)
      groups[group.name] = {"variables": variables, "teacher": variables}
    if dual:  # FCCL's SOLO pretraining (fccl.py `init`): theta^* starts training, theta^0 = theta^*
      pretrained = private_training.pretrain_variables(
          setup, {name: g["variables"] for name, g in groups.items()}, data.groups,
          jax.random.fold_in(key, 1), epochs=int(cfg.pretrain_epochs),
          batch_size=int(loc.batch_size), lr=float(cfg.pretrain_lr),
          min_lr=float(cfg.pretrain_min_lr))
      for group in setup.groups:
        start = pretrained[group.name]
        if average:  # as FCCL: every homogeneous participant starts from participant 0's
          start = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v[:1], v.shape), start)
        groups[group.name] = {"variables": start, "teacher": pretrained[group.name],
                              "pretrained": pretrained[group.name]}
    if reset != "batch":
      for g in groups.values():
        g["collab_opt"] = jax.vmap(col_tx.init)(g["variables"]["params"])
    return {"groups": groups}

  def reset_optimizer(state):
    return common.with_fresh_public_optimizer(state, col_tx, entry="collab_opt")

  def collaborative_step(state, images, key, round_index):
    lr = col_lr(round_index)
    params = {name: g["variables"]["params"] for name, g in state["groups"].items()}

    def total_loss(params):
      features, logits, stats = common.public_forward(setup, state, params, images, key, ids)
      if separate_features:  # the code's second train-mode pass: features, statistics again
        updated = {"groups": {name: {"variables": {"batch_stats": s}}
                              for name, s in stats.items()}}
        features, _, stats = common.public_forward(
            setup, updated, params, images, jax.random.fold_in(key, FEATURE_PASS_KEY_STREAM),
            ids)
      similarity = jax.vmap(lambda h: losses.instance_similarity_matrix(features=h,
                                                                         temperature=mu))
      similarities = {name: similarity(h) for name, h in features.items()} if use_fisl else {}
      logits_target = common.mean_over_participants(logits, setup)
      similarity_target = (common.mean_over_participants(similarities, setup)
                           if use_fisl else None)
      total, metrics = 0.0, {}
      for group in setup.groups:
        fccm = jax.vmap(lambda z: losses.cross_correlation_loss(
            logits=z, target_logits=logits_target, off_diagonal_weight=lam,
            eps=fccm_eps))(logits[group.name])
        if use_fisl:
          fisl = jax.vmap(lambda s: losses.instance_similarity_loss(
              similarity=s, target_similarity=similarity_target))(similarities[group.name])
        else:
          fisl = jnp.zeros_like(fccm)
        # Without FCCM (ablation) its value is still logged but takes no part in the gradient.
        per_client = (fccm if use_fccm else 0.0) + omega * fisl
        total = total + jnp.sum(jnp.where(active[group.name], per_client, 0.0))
        metrics[group.name] = {"fccm": fccm, "fisl": fisl}
      return total, (metrics, stats)

    grads, (metrics, stats) = jax.grad(total_loss, has_aux=True)(params)
    groups = {}
    for group in setup.groups:
      g = state["groups"][group.name]
      opt_state = (jax.vmap(col_tx.init)(params[group.name]) if reset == "batch"
                   else g["collab_opt"])
      new_params, new_opt = jax.vmap(
          lambda p, gr, o: apply_updates(col_tx, p, gr, o, lr))(params[group.name],
                                                                grads[group.name], opt_state)
      new_vars = where_active(active[group.name],
                              {"params": new_params, "batch_stats": stats[group.name]},
                              g["variables"])
      groups[group.name] = {**g, "variables": new_vars}
      if reset != "batch":
        groups[group.name]["collab_opt"] = new_opt
    return {**state, "groups": groups}, metrics

  def local_loss_for(group):
    forward = common.forward_fn(group, train=True)
    teacher_forward = common.forward_fn(group, train=teacher_train_mode)

    def loss_fn(params, batch_stats, images, labels, mask, rng, aux, epoch):
      if dual:
        student_rng, teacher_rng, pretrained_rng = jax.random.split(rng, 3)
      else:
        student_rng, teacher_rng = jax.random.split(rng)
      _, z, new_stats = forward(params, batch_stats, images, student_rng, mask)
      ce = losses.softmax_cross_entropy(logits=z, labels=labels, mask=mask)
      if distillation == "none":
        distill = jnp.zeros_like(ce)
      elif ewc:  # EWC Eq. 3 around the teacher theta*, its Fisher computed once per round
        distill = ewc_lib.ewc_penalty(params=params, anchor_params=aux["teacher"]["params"],
                                      fisher=aux["fisher"], weight=ewc_weight)
      elif dual:  # FCCL Eq. 4-7 (FCCL+ Eq. 19), the same loss as fccl.py's local update
        teacher, pre = aux["teacher"], aux["pretrained"]
        _, z_prev, _ = teacher_forward(teacher["params"], teacher["batch_stats"], images,
                                       teacher_rng, mask)
        _, z_pre, _ = teacher_forward(pre["params"], pre["batch_stats"], images,
                                      pretrained_rng, mask)
        distill = dual_weight * losses.dual_domain_distillation_loss(
            logits=z, previous_logits=z_prev, pretrained_logits=z_pre, temperature=dual_tau,
            mask=mask)
      else:
        teacher = aux["teacher"]
        _, zt, _ = teacher_forward(teacher["params"], teacher["batch_stats"], images,
                                   teacher_rng, mask)
        fntd = lambda: losses.non_target_distillation_loss(  # noqa: E731
            student_logits=z, teacher_logits=zt, labels=labels, temperature=tau,
            renormalize=renormalize, mask=mask)
        kd = lambda: tau**2 * losses.knowledge_distillation_loss(  # noqa: E731
            student_logits=z, teacher_logits=zt, temperature=tau, mask=mask)
        if distillation == "fntd":
          distill = fntd()
        elif distillation == "kd":
          distill = kd()
        else:  # kd_then_fntd: both are cheap next to the forward passes
          distill = jnp.where(epoch < kd_epochs, kd(), fntd())
      return ce + distill, (new_stats, {"ce": ce, "distill": distill})

    return loss_fn

  trainers = local.make_group_trainers(
      setup, local_loss_for, optimizer=loc.optimizer, weight_decay=float(loc.weight_decay),
      epochs=int(loc.epochs), batch_size=int(loc.batch_size), with_epoch=True)

  preprocess = normalizer(setup.private_mean, setup.private_std)

  def fisher_for(group):
    """(teacher variables, images, labels, size, key) -> the teacher's Fisher diagonal on the
    participant's private data (eval mode: running BatchNorm statistics, no dropout)."""
    forward = common.forward_fn(group, train=False)

    def fisher(teacher, images, labels, size, key):
      logits_fn = lambda p, x: forward(p, teacher["batch_stats"], x[None])[1][0]  # noqa: E731
      mask = jnp.arange(images.shape[0]) < size
      sampled = ewc_labels == "sampled"
      return ewc_lib.fisher_diagonal(
          logits_fn=logits_fn, params=teacher["params"], inputs=preprocess(images),
          labels=None if sampled else labels, key=key if sampled else None, mask=mask,
          chunk_size=ewc_chunk)

    return fisher

  fishers = {group.name: vmap_slots(fisher_for(group)) for group in setup.groups}

  def local_update(state, data, key, round_index):
    learning_rates = jnp.full((int(loc.epochs),), loc_lr(round_index))
    groups, metrics = {}, {}
    for group in setup.groups:
      g = state["groups"][group.name]
      variables = g["variables"]
      if average:
        variables = aggregation.average_over_active(variables, active[group.name])
      # theta^{e-1} (end of the previous round's local updating) or theta^e (the model local
      # updating starts from, after this round's collaborative phase and any averaging).
      teacher = g["teacher"] if teacher_choice == "previous_local" else variables
      aux = {"teacher": teacher}
      if dual:
        aux["pretrained"] = g["pretrained"]
      if ewc:
        d = data[group.name]
        aux["fisher"] = fishers[group.name](
            teacher, d.images, d.labels, d.sizes,
            client_keys(jax.random.fold_in(key, EWC_KEY_STREAM), ids[group.name]))
      new_vars, m = local.train_clients(
          trainers[group.name], variables, aux, data[group.name],
          client_keys(key, ids[group.name]), learning_rates)
      new_vars = where_active(active[group.name], new_vars, variables)
      groups[group.name] = {**g, "variables": new_vars, "teacher": new_vars}
      metrics[group.name] = m
    return {**state, "groups": groups}, metrics

  return Phases(init=init, reset_optimizer=reset_optimizer,
                collaborative_step=collaborative_step, local_update=local_update)


def communication_bytes(config: ml_collections.ConfigDict, setup: Setup,
                        num_public: int) -> tuple[int, int]:
  """(bytes up, bytes down) of one FCCL+ round over all participants, from the shapes.

  On each of the round's public batches (`collaborative.epochs` x ceil(N0 / B) full batches
  of B = min(`collaborative.batch_size`, N0) images, `batching.public_batches`) every
  participant sends what the targets are means of, its logits Z_i (B, C) when FCCM is on and
  its similarity logits S_i (B, B-1) when FISL is on, and receives the targets Z_bar and
  S_bar of the same shapes (FCCL+ Alg. 1). The homogeneous variant
  (`fcclplus.average_parameters`) also sends every participant's variables (parameters and
  BatchNorm statistics) up and the average down once a round. The public images (shared
  beforehand) and the local phase cost nothing; float32 throughout.
  """
  cfg, col = config.fcclplus, config.collaborative
  per_batch = 0
  if int(col.epochs) > 0 and num_public > 0:
    batch = min(int(col.batch_size), max(num_public, 2))
    batches = int(col.epochs) * -(-num_public // batch)
    if bool(cfg.use_fccm):
      per_batch += batch * setup.num_classes * 4
    if bool(cfg.use_fisl):
      per_batch += batch * (batch - 1) * 4
    per_batch *= batches
  total = setup.num_participants * per_batch
  if bool(cfg.average_parameters):
    total += sum(group.num_clients * common.variables_bytes(group) for group in setup.groups)
  return total, total


def with_communication_metrics(stage: Stage, config: ml_collections.ConfigDict,
                               setup: Setup) -> Stage:
  """`stage` whose metrics also hold "server": {"bytes_up", "bytes_down"} of the round
  (`communication_bytes`; the shapes are static, so this adds no computation)."""
  def run(state, data, key, round_index):
    state, metrics = stage.run(state, data, key, round_index)
    num_public = 0 if data.public is None else int(data.public.shape[0])
    up, down = communication_bytes(config, setup, num_public)
    return state, {**metrics, "server": {"bytes_up": jnp.float32(up),
                                         "bytes_down": jnp.float32(down)}}

  return Stage(stage.name, run)


def make_fcclplus(config: ml_collections.ConfigDict, setup: Setup) -> Algorithm:
  """FCCL+ as an `Algorithm`: public phase (FCCM + FISL), then local CE + FNTD.

  The round is given as these two stages (`Algorithm.stages`), so the trainer
  can compile each as its own program (`config.round_programs`). The public
  stage's metrics include the round's communication, metrics["server"]
  ["bytes_up" | "bytes_down"] (`communication_bytes`).
  """
  phases = make_phases(config, setup)
  spec = public.make_spec(config.collaborative, setup.public_mean, setup.public_std)
  reset_each_round = config.collaborative.optimizer_reset == "round"
  public_stage, local_stage = common.public_and_local_stages(
      spec, phases.collaborative_step, phases.local_update,
      reset=phases.reset_optimizer if reset_each_round else None)

  return common.public_data_algorithm(
      "fcclplus", config, setup, phases.init,
      stages=(with_communication_metrics(public_stage, config, setup), local_stage))


def default_config() -> ml_collections.ConfigDict:
  """The config sections FCCL+ reads, with the paper/code defaults."""
  return ml_collections.ConfigDict({
      "collaborative": public.default_config(),
      "local": local.default_config(),
      "fcclplus": {
          "off_diagonal_weight": losses.FCCM_OFF_DIAGONAL_WEIGHT,  # lambda, Eq. 2
          "fccm_eps": losses.FCCM_EPS,   # on FCCM's column variances; the code's: 0
          "feature_pass": "shared",      # FISL's features: "shared" | "separate" (the code's)
          "fisl_weight": 3.0,                                      # omega, Eq. 6
          "fisl_temperature": losses.FISL_TEMPERATURE,             # mu, Eq. 3
          "fntd_temperature": 3.0,                                 # tau: 3 Digits/Office31
          "fntd_renormalize": False,
          "teacher_train_mode": True,
          "use_fisl": True,
          "use_fccm": True,
          "local_distillation": "fntd",
          "kd_fraction": 0.5,   # "kd_then_fntd": share of local epochs with KD (Table XVII)
          # local_distillation="dual" only (FCCL Eq. 4-7; the defaults of config.fccl):
          "dual_weight": 1.0,                                      # lambda_Loc, FCCL Eq. 7
          "dual_temperature": 1.0,                                 # tau, FCCL Eq. 4-5
          "pretrain_epochs": 50,                                   # SOLO pretraining of theta^*
          "pretrain_lr": 1e-3,
          "pretrain_min_lr": 1e-6,
          "average_parameters": False,                             # True: homogeneous variant
          # The teacher T of the local objective (FCCL+ Eq. 13-14, Fig. 9): "previous_local"
          # (theta^{e-1}, the paper's) | "after_collaborative" (theta^e).
          "fntd_teacher": "previous_local",
          # local_distillation="ewc" only (FCCL+ Table XVI; EWC Eq. 3 around the teacher):
          "ewc_weight": 1.0,                # lambda (Table XVI: 0.01, 0.1, 0.7, 1.0)
          "ewc_labels": "sampled",          # the Fisher's labels: "sampled" | "true"
          "ewc_batch_size": ewc_lib.FISHER_CHUNK_SIZE,  # examples per vmapped Fisher chunk
      },
  })


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.fcclplus`, `config.collaborative` and `config.local`."""
  public.validate_config(config)
  local.validate_config(config)
  validation.require_section(config, "fcclplus")
  v = validation
  v.check(config, "fcclplus.off_diagonal_weight", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fcclplus.fccm_eps", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fcclplus.feature_pass", v.choice(FEATURE_PASSES), f"one of {FEATURE_PASSES}")
  v.check(config, "fcclplus.fisl_weight", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fcclplus.fisl_temperature", v.positive, "a number > 0")
  v.check(config, "fcclplus.fntd_temperature", v.positive, "a number > 0")
  for flag in ("fntd_renormalize", "teacher_train_mode", "use_fisl", "use_fccm",
               "average_parameters"):
    v.check(config, f"fcclplus.{flag}", v.is_bool, "True or False")
  if not (config.fcclplus.use_fccm or config.fcclplus.use_fisl):
    v.fail("fcclplus.use_fccm", "True when fcclplus.use_fisl is False (one collaborative loss "
           "at least)", False)
  v.check(config, "fcclplus.local_distillation", v.choice(LOCAL_DISTILLATIONS),
          f"one of {LOCAL_DISTILLATIONS}")
  v.check(config, "fcclplus.kd_fraction", lambda x: 0 <= x <= 1, "a number in [0, 1]")
  v.check(config, "fcclplus.dual_weight", lambda x: x >= 0, "a number >= 0")
  v.check(config, "fcclplus.dual_temperature", v.positive, "a number > 0")
  v.check(config, "fcclplus.pretrain_epochs", v.int_at_least(0), "an integer >= 0")
  v.check(config, "fcclplus.pretrain_lr", v.positive, "a number > 0")
  v.check(config, "fcclplus.pretrain_min_lr", lambda x: 0 <= x <= config.fcclplus.pretrain_lr,
          "a number in [0, fcclplus.pretrain_lr]")
  # Configs written before these fields existed lack them (the defaults then apply).
  if "fntd_teacher" in config.fcclplus:
    v.check(config, "fcclplus.fntd_teacher", v.choice(FNTD_TEACHERS), f"one of {FNTD_TEACHERS}")
  if "ewc_weight" in config.fcclplus:
    v.check(config, "fcclplus.ewc_weight", lambda x: v.finite_number(x) and x >= 0,
            "a finite number >= 0")
  if "ewc_labels" in config.fcclplus:
    v.check(config, "fcclplus.ewc_labels", v.choice(EWC_LABELS), f"one of {EWC_LABELS}")
  if "ewc_batch_size" in config.fcclplus:
    v.check(config, "fcclplus.ewc_batch_size", v.int_at_least(1), "an integer >= 1")
  if config.fcclplus.average_parameters and len(set(config.models.architectures)) > 1:
    v.fail("fcclplus.average_parameters",
           "False unless every participant uses the same architecture", True)

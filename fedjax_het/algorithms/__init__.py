"""Federated methods: one module each, registered by name for `config.algorithm`.

  fcclplus  FCCL+ (TPAMI): FCCM + FISL on public data, CE + FNTD locally.
  fccl      FCCL (CVPR 2022): cross-correlation + dual-domain distillation.
  solo      private training only (the BASE row).
  fedavg    FedAvg (AISTATS 2017) with client sampling; FedAvgM / FedAdam by `config.server`.
  fedprox   FedProx (MLSys 2020): FedAvg + (mu / 2) ||w - w_global||^2 locally.
  moon      MOON (CVPR 2021): FedAvg + model-contrastive loss (global vs previous local model).
  fedproc   FedProc (2021): FedAvg + prototype InfoNCE against global class prototypes.
  fedrs     FedRS (KDD 2021): FedAvg with a restricted softmax (missing classes' logits scaled).
  fedmmd    FedMMD (Yao et al.): FedAvg + MK-MMD (or L2) between the local and frozen global stream.
  fedfusion FedFusion (Yao et al.): FedAvg with the frozen global trunk fused into local training.
  rhfl      RHFL (CVPR 2022): public KL alignment with client confidence re-weighting, local SCE.
  fedmd     FedMD (2019): L1 digest of the mean logits on a public subset, then private CE.
  feddf     FedDF (NeurIPS 2020): KL distillation toward the all-participant logit ensemble.
  fedmatch  FedMatch (ICLR 2021): inter-client KL + agreement pseudo labels on public data, CE.
  fml       FML (Shen et al. 2020; FCCL Tables 1-3): deep mutual learning of each private
            model with a shared meme model, FedAvg of the memes.
  rcfl      RCFL (Gudur et al. 2020; FCCL Tables 1-3): class scores on public data, aggregated
            per class with an α weighting of shared against partially held labels, KL
            distillation toward them, then private CE.

Data-free methods of heterogeneous models (HtFLlib's benchmark; FedTGP / FedKTL tables;
`htfl_common` holds their shared pieces: HtFLlib's local SGD, the features pooled to 512,
per-class statistics by segment sums, the prototype evaluator):

  fedproto  FedProto (AAAI 2022): class prototypes averaged on the server, the prototype
            regulariser (lambda), inference by the nearest global prototype.
  fd        FD / FedDistill (Jeong et al. 2018): per-class mean logits exchanged, a
            distillation term toward the global mean logits of each row's class.
  fedtgp    FedTGP (AAAI 2024): trainable global prototypes trained on the server with the
            adaptive-margin contrastive loss, the prototype regulariser on the clients.
  lg_fedavg LG-FedAvg (Liang et al. 2020): the clients' heads averaged (size-weighted) into
            one global head over heterogeneous feature extractors.
  fedgh     FedGH (ACM MM 2023): a global head trained on the server on the clients'
            uploaded class prototypes.
  fedkd     FedKD (Nat. Commun. 2022): a shared mentee (participant 0's backbone) learned
            with each private mentor by adaptive mutual distillation, averaged on the server.

On GLFC's class-incremental task stream (`scenario.name="class_incremental"`,
`cil.stream`; `Method.class_incremental`):

  glfc       GLFC (CVPR 2022): exemplars, entropy-based transition detection, L_GC + L_RD,
             the proxy server that picks the old model from reconstructed prototypes.
  icarl_fl   iCaRL + FL (GLFC Table 1): iCaRL on every client, FedAvg of the models.
  fedavg_cil FedAvg on the task stream (GLFC Table 1's lower bound: fine-tuning).
  ssil_fl    SS-IL + FL (GLFC Table 1): separated softmax, task-wise KD, ratio-preserving
             batches on every client, FedAvg of the models.
  bic_fl     BiC + FL (GLFC Table 1): KD weighted n_old / n_seen, a bias correction layer
             per task fitted on held-out exemplars by the clients, FedAvg of both.
  podnet_fl  PODNet + FL: POD-spatial/POD-flat distillation, local similarity classifier
             with NCA loss on every client, iCaRL + FL's memory, FedAvg of the models.
  dde_icarl_fl DDE + iCaRL + FL (GLFC Table 1): iCaRL with DDE's colliding-effect distillation
             and momentum effect removal in the NME classifier, FedAvg of the models.
  geodl_icarl_fl GeoDL + iCaRL + FL (GLFC Table 1): iCaRL plus GeoDL's distillation along the
             geodesic between the old and new feature subspaces, FedAvg of the models.

A class-incremental method's `make(config, setup)` receives a
`cil.stream.StreamSetup` instead of an `engine.api.Setup`; its `evaluate(state,
(test_images, test_labels, num_seen))` gives per-class (correct, total,
predicted) counts; the one trainer runs it like any other.

The FedAvg family (fedavg, fedprox, moon, fedproc, fedrs, fedmmd, fedfusion) shares
`fedavg_family.make_family`; members pass their local objective and, where needed, its hooks
(per-client state, extra server state, per-client constants from the data).

Shared modules hold what several methods use, and a method's module imports them, never
another method's module (`tests/test_import_graph.py`): `common` (cross-group targets,
forwards, the public-data methods' stages, evaluation, communication bytes),
`fedavg_family` (the FedAvg round with a pluggable local objective), `private_training`
(every participant on its own data: SOLO's phase, private updates, pretraining, warm start),
`htfl_common` (the HtFLlib methods' pieces, above) and `cil_replay` (the exemplar memory and
replay blocks of the class-incremental methods, iCaRL + FL's round).

How to add a method (the whole recipe, docs/engine.md "Adding a method";
`tests/test_round_api.py` does steps 1-3 with a toy FedAvg in the test file alone):

1. Write `make(config, setup) -> engine.api.Algorithm`. Read the config into
   Python constants here (never pass a ConfigDict into jit). Return
   `Algorithm(name, init, round, evaluate, diagnostics=None)`:
     * `init(key, data) -> state`: per-participant entries under
       `state["groups"][group.name]` with the slot axis leading (at least
       "variables" for the shared evaluator), global entries at the top level.
     * `round(state, data, key, round_index) -> (state, metrics)`: the method's
       round as engine blocks, in the paper's order, e.g. for FedAvg
           slots  = cohort.sample_cohort(k_sample, active, m)
           models = aggregation.broadcast(state["server"], m)
           models, m = local.train_clients(trainer, models, aux,
                                           cohort.gather(data.groups[g], slots), keys, lrs)
           mean   = aggregation.weighted_mean(models, sizes)
           server, opt = aggregation.server_update(optax.sgd(1.0), server, mean, opt)
       metrics = {phase: {group: {name: (slots,)}}} or {phase: {name: ()}}.
     * `evaluate(state, test) -> {group: (slots, domains)}` accuracy in percent
       (`common.make_evaluate(config, setup)` evaluates every slot's variables).
2. Write `default_config() -> ConfigDict` of the sections the method reads (its
   own `config.<name>` namespace plus engine sections such as
   `engine.local.default_config()`), and `validate_config(config)` that checks
   them with `fedjax_het.validation` (errors name the field and the allowed
   values).
3. Register it: one top-level statement below, `register("name", make=module.make_name,
   default_config=module.default_config, validate_config=module.validate_config)`
   (`class_incremental=True` for a method of the task stream). Every built-in method
   registers by exactly this call (`tests/test_import_graph.py`); a method defined
   outside the package makes the same call. Then `fedjax_het.config.base_config("name")`
   builds its config and `fedjax_het.train.train_and_evaluate` runs it. The trainer,
   the engine and `config.py` do not change.
4. Its scenario configs: the name in the `METHODS` tuple of its family module in
   `fedjax_het/configs/` (digits.py, htfl.py, _two_stream.py, cifar100.py) and the
   method's settings in that family's `get_config` (digits.py: `method_settings`,
   `quick_settings`); it then trains as `--config=<family>_<name>_quick`.
5. A paper table's row: `Row(key="name", label=..., variant=<the family's
   get_config argument>)` in `fedjax_het/reports/tables.py`, its label in
   `METHOD_LABELS`, the paper's numbers in `reports/paper_numbers.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import ml_collections

from fedjax_het.algorithms import (fccl, fcclplus, fedavg, fedavg_cil, feddf, fedfusion, fedmatch,
                                   fedmd, fedmmd, fedproc, fedprox, fedrs, glfc, icarl_fl, moon, rhfl,
                                   solo)
from fedjax_het.algorithms import (bic_fl, dde_icarl_fl, podnet_fl,  # CIL baselines (GLFC Table 1)
                                   ssil_fl)
from fedjax_het.algorithms import fml, rcfl  # FML, RCFL (FCCL Tables 1-3)
from fedjax_het.algorithms import geodl_icarl_fl  # GeoDL + iCaRL + FL (GLFC Table 1)
from fedjax_het.algorithms import fd, fedproto, fedtgp  # data-free HtFL methods (HtFLlib)
from fedjax_het.algorithms import lg_fedavg  # LG-FedAvg and FedGH (a shared global head)
from fedjax_het.algorithms import fedkd  # FedKD (a shared mentee, mutual distillation)
from fedjax_het.engine.api import Algorithm, Setup
from fedjax_het.errors import ConfigError


class Method(NamedTuple):
  """A registered method: its builder, its config sections and their validation.

  `class_incremental`: the method trains on the class-incremental task stream
  (`cil.stream`; its `make` receives a `cil.stream.StreamSetup`), else on the
  participants of a domain or partitioned scenario (an `engine.api.Setup`).
  """
  make: Callable[[ml_collections.ConfigDict, Setup], Algorithm]
  default_config: Callable[[], ml_collections.ConfigDict]
  validate_config: Callable[[ml_collections.ConfigDict], None]
  class_incremental: bool = False


METHODS: dict[str, Method] = {}


def register(name: str, *, make, default_config, validate_config,
             class_incremental: bool = False) -> None:
  """Makes `name` a valid `config.algorithm` (re-registering a name replaces it)."""
  METHODS[name] = Method(make=make, default_config=default_config,
                         validate_config=validate_config, class_incremental=class_incremental)


def get_method(name: str) -> Method:
  """The registered method `name`; unknown names raise, listing the valid ones."""
  if name not in METHODS:
    raise ConfigError(f"config.algorithm must be one of {tuple(METHODS)}, got {name!r}.")
  return METHODS[name]


register("fcclplus", make=fcclplus.make_fcclplus, default_config=fcclplus.default_config,
         validate_config=fcclplus.validate_config)
register("fccl", make=fccl.make_fccl, default_config=fccl.default_config,
         validate_config=fccl.validate_config)
register("solo", make=solo.make_solo, default_config=solo.default_config,
         validate_config=solo.validate_config)
register("fedavg", make=fedavg.make_fedavg, default_config=fedavg.default_config,
         validate_config=fedavg.validate_config)
register("fedprox", make=fedprox.make_fedprox, default_config=fedprox.default_config,
         validate_config=fedprox.validate_config)
register("moon", make=moon.make_moon, default_config=moon.default_config,
         validate_config=moon.validate_config)
register("fedproc", make=fedproc.make_fedproc, default_config=fedproc.default_config,
         validate_config=fedproc.validate_config)
register("fedrs", make=fedrs.make_fedrs, default_config=fedrs.default_config,
         validate_config=fedrs.validate_config)
register("fedmmd", make=fedmmd.make_fedmmd, default_config=fedmmd.default_config,
         validate_config=fedmmd.validate_config)
register("fedfusion", make=fedfusion.make_fedfusion, default_config=fedfusion.default_config,
         validate_config=fedfusion.validate_config)
register("rhfl", make=rhfl.make_rhfl, default_config=rhfl.default_config,
         validate_config=rhfl.validate_config)
register("fedmd", make=fedmd.make_fedmd, default_config=fedmd.default_config,
         validate_config=fedmd.validate_config)
register("feddf", make=feddf.make_feddf, default_config=feddf.default_config,
         validate_config=feddf.validate_config)
register("fedmatch", make=fedmatch.make_fedmatch, default_config=fedmatch.default_config,
         validate_config=fedmatch.validate_config)
register("fml", make=fml.make_fml, default_config=fml.default_config,
         validate_config=fml.validate_config)
register("rcfl", make=rcfl.make_rcfl, default_config=rcfl.default_config,
         validate_config=rcfl.validate_config)
register("fedproto", make=fedproto.make_fedproto, default_config=fedproto.default_config,
         validate_config=fedproto.validate_config)
register("fd", make=fd.make_fd, default_config=fd.default_config,
         validate_config=fd.validate_config)
register("fedtgp", make=fedtgp.make_fedtgp, default_config=fedtgp.default_config,
         validate_config=fedtgp.validate_config)
register("lg_fedavg", make=lg_fedavg.make_lg_fedavg, default_config=lg_fedavg.default_config,
         validate_config=lg_fedavg.validate_config)
register("fedgh", make=lg_fedavg.make_fedgh, default_config=lg_fedavg.fedgh_default_config,
         validate_config=lg_fedavg.fedgh_validate_config)
register("fedkd", make=fedkd.make_fedkd, default_config=fedkd.default_config,
         validate_config=fedkd.validate_config)
register("glfc", make=glfc.make, default_config=glfc.default_config,
         validate_config=glfc.validate_config, class_incremental=True)
register("icarl_fl", make=icarl_fl.make, default_config=icarl_fl.default_config,
         validate_config=icarl_fl.validate_config, class_incremental=True)
register("fedavg_cil", make=fedavg_cil.make, default_config=fedavg_cil.default_config,
         validate_config=fedavg_cil.validate_config, class_incremental=True)
register("ssil_fl", make=ssil_fl.make, default_config=ssil_fl.default_config,
         validate_config=ssil_fl.validate_config, class_incremental=True)
register("bic_fl", make=bic_fl.make, default_config=bic_fl.default_config,
         validate_config=bic_fl.validate_config, class_incremental=True)
register("podnet_fl", make=podnet_fl.make, default_config=podnet_fl.default_config,
         validate_config=podnet_fl.validate_config, class_incremental=True)
register("dde_icarl_fl", make=dde_icarl_fl.make, default_config=dde_icarl_fl.default_config,
         validate_config=dde_icarl_fl.validate_config, class_incremental=True)
register("geodl_icarl_fl", make=geodl_icarl_fl.make, default_config=geodl_icarl_fl.default_config,
         validate_config=geodl_icarl_fl.validate_config, class_incremental=True)

__all__ = ["METHODS", "Method", "get_method", "register"]

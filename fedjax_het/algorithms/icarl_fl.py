"""iCaRL + FL: the "iCaRL + FL" baseline of GLFC Table 1 on the class-incremental trainer.

`make(config, setup)` is the registered method "icarl_fl" (config.algorithm
= "icarl_fl", trained by `fedjax_het.train` like every method): iCaRL [iCaRL] run by every client, the models
averaged by FedAvg, as GLFC's paper uses it as a baseline [GLFC Sec. 5: the
class-incremental methods "combined with FL"]. One round, for the sampled
clients (the same sampling, gathering and local training as `algorithms.glfc`; the round is
`cil_replay.make_icarl_fl`, which GeoDL + iCaRL + FL runs with its own local loss, built from
`algorithms.cil_replay`'s blocks):

  1. the client receives the global model. It knows when its data changed
     (the task transition is read from the stream; iCaRL has no detection
     rule): at a transition the classes of its previous data that it does not
     hold now are added to its exemplar memory by iCaRL herding on the
     L2-normalised features of the received global model (eval mode), m =
     memory_size // (classes learned) per class, old classes reduced to their
     first m picks [iCaRL Alg. 4, 5] (`cil_replay.store_previous_classes`; the
     memory holds pool indices, `cil_replay.encode_pool_indices`);
  2. it trains on its current data plus its exemplars (`cil_replay.replay_rows`)
     with iCaRL's loss [iCaRL Alg. 3]: sigmoid BCE over the seen classes
     against the one-hot target whose old-class columns [0, t*k) are replaced
     by sigmoid(old model's logits) (`losses.glfc.
     class_semantic_relation_distillation_loss`, which is exactly that; in
     task 0 num_old_classes = 0 makes it the plain BCE). The old model is the
     global model at the end of the previous task (`state["old_model"]`,
     replaced at the first round of every task; iCaRL's "network before the
     update"), the same for every client, stored once;
  3. the server averages the trained models (plain mean, like `algorithms.glfc`);
  4. nearest-mean-of-exemplars statistics [iCaRL Alg. 1]: every sampled
     client computes, with the NEW global model (eval mode), the per-class sums
     of L2-normalised features and the counts over its training set (current
     data plus exemplars: together they cover every class it has seen). The
     server keeps (C, D) sums and (C,) counts: the rows of the classes
     reported this round are replaced by the cohort's totals (a pooled mean
     over the cohort's images of the class), the other rows keep their value
     from the last round they were reported in.

Classifier (`evaluate`): nearest mean of exemplars. The class means mu_y =
sum_y / count_y are L2-normalised; a test image is assigned, among the seen
classes that have a mean, to the class whose normalised mean is nearest
(Euclidean) to its L2-normalised feature [iCaRL Alg. 1]. The result is the
per-class (correct, total, predicted) counts of `cil.stream.make_class_counts`,
so the trainer's tables and metrics are unchanged. `icarl.classifier = "head"` evaluates
the same global model with its own sigmoid head instead (top-1 of the logits of the seen
classes, `cil.stream.make_class_counts`, as GLFC and FedAvg evaluate): not iCaRL's classifier,
the diagnosis of how much of iCaRL + FL's accuracy is the classifier's rather than the
training's (GLFC Table 1's quick-scale reading in docs/results.md).

Federated choices and deviations from iCaRL's paper / code:
  * Class means are federated statistics of the last cohort that reported the
    class: a class no sampled client holds this round keeps its STALE mean,
    computed with an older global model (the feature extractor moved on
    since). Recomputing every mean every round would need every client, not
    the cohort, to take part.
  * Means are computed over the client's current data plus its exemplars, in
    the federation's pooled form (sum of normalised features / count over the
    cohort). iCaRL computes each class mean from its exemplar set only; its
    code (and `algorithms.glfc`'s `compute_class_mean`) also averages the features
    of horizontally flipped images, which is not done here (no augmentation
    in the trainer).
  * The task transition is read from the stream (as `glfc.transition =
    "stream"`); only sampled clients update their memory (a client not
    sampled at a task change stores its previous classes the next time it
    is sampled, from the data it last trained on).
  * Exemplars are distinct (`icarl.distinct_exemplars = True`, iCaRL's paper;
    False gives the GLFC code's herding with repeats).
  * The old model's logits are computed in task 0 as well (where they have no
    effect: num_old_classes = 0), to keep one program for the whole stream.
  * Local SGD, lr and schedule as the trainer's `local` section
    (`cil.stream.epoch_learning_rates`); iCaRL's own optimiser settings (lr
    2.0, 70 epochs, decays at 49 and 63, batch 128, weight decay 1e-5) are not
    used: the FL baseline trains like the other methods of Table 1.

References:
  [iCaRL] S.-A. Rebuffi, A. Kolesnikov, G. Sperl, C. H. Lampert. iCaRL:
    Incremental Classifier and Representation Learning. CVPR 2017 (Alg. 1-5).
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022, Table 1 ("iCaRL + FL").
"""

from __future__ import annotations

import ml_collections

from fedjax_het import validation as v
from fedjax_het.algorithms import cil_replay
from fedjax_het.cil import stream as cil_stream
from fedjax_het.engine.api import Algorithm


def icarl_section() -> ml_collections.ConfigDict:
  """`config.icarl`: iCaRL's settings (paper values)."""
  return ml_collections.ConfigDict({
      "memory_size": cil_replay.ICARL_MEMORY_SIZE,   # exemplars per client, images
      "distinct_exemplars": True,                    # iCaRL's paper: each image at most once
      "classifier": "nme",                           # or "head" (module docstring)
  })


#: `icarl.classifier`: iCaRL's nearest mean of exemplars, or the model's own head.
CLASSIFIERS = cil_replay.CLASSIFIERS


def validate_icarl_config(config: ml_collections.ConfigDict) -> None:
  """Checks `config.icarl`; errors name the field and the allowed values."""
  if "icarl" not in config:
    v.fail("icarl", "a section when config.algorithm is 'icarl_fl' (build the config with "
           "fedjax_het.config.base_config('icarl_fl'))", None)
  v.check(config, "icarl.memory_size", v.int_at_least(1), "an integer >= 1")
  v.check(config, "icarl.distinct_exemplars", v.is_bool, "True or False")
  v.check(config, "icarl.classifier", v.choice(CLASSIFIERS), f"one of {CLASSIFIERS}")


def default_config() -> ml_collections.ConfigDict:
  """iCaRL's own section, `config.icarl` (`icarl_section`)."""
  return ml_collections.ConfigDict({"icarl": icarl_section()})


validate_config = validate_icarl_config


def make(config: ml_collections.ConfigDict, setup: cil_stream.StreamSetup) -> Algorithm:
  """iCaRL + FL from a class-incremental config (`cil_replay.make_icarl_fl`)."""
  return cil_replay.make_icarl_fl(
      setup.settings, cil_replay.ReplaySettings.from_section(config.icarl, setup.client_classes),
      setup.model, setup.mean, setup.std, setup.max_client_size,
      eval_batch_size=setup.eval_batch_size, classifier=config.icarl.classifier)

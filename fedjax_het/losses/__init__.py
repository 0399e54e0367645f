"""Pure, jit-compiled loss functions of the five papers and the baselines.

Every function takes keyword arguments only, works under `jax.jit` and
`jax.vmap` over a leading client axis, never reduces over clients, and checks
shapes with an error that names the argument. Targets and teachers are
constants (`stop_gradient`). See each docstring for the paper and equation.

FCCL / FCCL+ (`fccl`):
  cross_correlation_matrix, cross_correlation_loss (FCCM, FCCL+ Eq. 1-2),
  instance_similarity_matrix, instance_similarity_loss (FISL, Eq. 3-5),
  knowledge_distillation_loss (Eq. 7-8), non_target_distillation_loss (FNTD,
  Eq. 13), dual_domain_distillation_loss (FCCL Eq. 4-6).
GLFC (`glfc`):
  class_aware_gradient_compensation_loss (Eq. 2-4),
  class_semantic_relation_distillation_loss (Eq. 5), mean_prediction_entropy
  and task_transition_detected (Eq. 7), prototype_perturbation_loss (Eq. 10),
  gradient_matching_loss (Eq. 8), infer_label_from_last_layer_gradient.
FedMMD (`mmd`):
  gaussian_kernel_matrix, multi_kernel_mmd_squared (Eq. 2, 5),
  two_stream_l2_loss.
Baselines (`baselines`):
  proximal_term (FedProx), model_contrastive_loss (MOON),
  restricted_softmax_logits (FedRS), prototype_contrastive_loss and
  prototype_contrastive_objective (FedProc), symmetric_cross_entropy (RHFL),
  consensus_l1_loss (FedMD), ensemble_distillation_loss (FedDF).
The data-free heterogeneous-model methods of HtFLlib (FedProto, FD, FedTGP, FedGH, FedKD)
keep their losses in the submodule `fedjax_het.losses.htfl` (class_sums, class_means,
prototype_regularizer, logit_distillation_loss, soft_target_cross_entropy,
tgp_margin_contrastive_loss, nearest_prototype_scores, fedkd_losses); they are imported from
there, so this package's `__all__` lists the losses of the property tests only.
Shared (`common`):
  softmax_cross_entropy, sigmoid_binary_cross_entropy.
"""

from fedjax_het.losses.baselines import (consensus_l1_loss, ensemble_distillation_loss,
                                         model_contrastive_loss, prototype_contrastive_loss,
                                         prototype_contrastive_objective, proximal_term,
                                         restricted_softmax_logits, symmetric_cross_entropy)
from fedjax_het.losses.common import sigmoid_binary_cross_entropy, softmax_cross_entropy
from fedjax_het.losses.fccl import (FCCM_EPS, FCCM_OFF_DIAGONAL_WEIGHT, FISL_TEMPERATURE,
                                    cross_correlation_loss, cross_correlation_matrix,
                                    dual_domain_distillation_loss, instance_similarity_loss,
                                    instance_similarity_matrix, knowledge_distillation_loss,
                                    non_target_distillation_loss)
from fedjax_het.losses.glfc import (PROTOTYPE_NOISE_SCALE, TASK_TRANSITION_THRESHOLD,
                                    class_aware_gradient_compensation_loss,
                                    class_semantic_relation_distillation_loss,
                                    gradient_matching_loss, infer_label_from_last_layer_gradient,
                                    mean_prediction_entropy, prototype_perturbation_loss,
                                    task_transition_detected)
from fedjax_het.losses.mmd import (L2_REDUCTIONS, MMD_BANDWIDTHS, MMD_CODE_FLOOR,
                                   gaussian_kernel_matrix, multi_kernel_mmd_squared,
                                   two_stream_l2_loss)

__all__ = [
    "FCCM_EPS", "FCCM_OFF_DIAGONAL_WEIGHT", "FISL_TEMPERATURE", "L2_REDUCTIONS", "MMD_BANDWIDTHS",
    "MMD_CODE_FLOOR", "PROTOTYPE_NOISE_SCALE", "TASK_TRANSITION_THRESHOLD",
    "class_aware_gradient_compensation_loss", "class_semantic_relation_distillation_loss",
    "consensus_l1_loss", "cross_correlation_loss", "cross_correlation_matrix",
    "dual_domain_distillation_loss", "ensemble_distillation_loss", "gaussian_kernel_matrix",
    "gradient_matching_loss", "infer_label_from_last_layer_gradient",
    "instance_similarity_loss", "instance_similarity_matrix", "knowledge_distillation_loss",
    "mean_prediction_entropy", "model_contrastive_loss", "multi_kernel_mmd_squared",
    "non_target_distillation_loss", "prototype_contrastive_loss",
    "prototype_contrastive_objective", "prototype_perturbation_loss", "proximal_term",
    "restricted_softmax_logits", "sigmoid_binary_cross_entropy", "softmax_cross_entropy",
    "symmetric_cross_entropy", "task_transition_detected", "two_stream_l2_loss",
]

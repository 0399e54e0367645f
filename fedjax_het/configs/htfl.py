"""HtFLlib's scenario: 20 clients of heterogeneous backbones, label skew, per-client test splits.

The setting of the data-free heterogeneous-model FL tables of FedTGP (Zhang et al., AAAI
2024, Tables 1-3) and FedKTL (Zhang et al., CVPR 2024, Table 1), run by HtFLlib
(TsingZ0/HtFLlib; FedTGP's code TsingZ0/FedTGP), with the data PFLlib prepares
(TsingZ0/PFLlib dataset/utils/dataset_utils.py).

Commands (from the repository root, FEDJAX_HET_DATA_DIR=/work/shared/data or the bundle's
directory):

  python experiments/train.py --config=htfl_cifar10_practical_htfe4_fedproto_quick  # minutes, CPU
  python experiments/train.py --config=htfl_cifar10_practical_htfe8_fedtgp          # paper (GPU)
  python experiments/reproduce.py --table=htfl_cifar10_practical --scale=quick

Variants: <dataset>_<skew>_<group>_<method>[_quick]
  dataset   cifar10, or cifar100 (see "Data")
  skew      practical: Dirichlet(0.1) label skew (PFLlib "dir", alpha = 0.1); pathological:
            2 classes per client on CIFAR-10, 10 on CIFAR-100 (PFLlib "pat", unbalanced)
  group     the HtFE model groups of HtFLlib's main.py / FedTGP Sec. 5.1, client i getting
            backbone i mod k:
              htfe2 {4-layer CNN, ResNet-18}
              htfe3 {ResNet-10, ResNet-18, ResNet-34}
              htfe4 {4-layer CNN, GoogLeNet, MobileNetV2, ResNet-18}
              htfe8 {4-layer CNN, GoogLeNet, MobileNetV2, ResNet-18, -34, -50, -101, -152}
  method    fedproto, fd, fedtgp, lg_fedavg, fedgh, fedkd (this library's modules of the
            methods, whichever are registered), fml (the existing FML module); with a public
            set (see "Public-data methods"): fedmd, fcclplus, fccl, feddf, rhfl

Protocol, read from the authors' code (HtFLlib system/main.py and total.sh, FedTGP
system/run_me.sh; the same in both):
  * 20 clients (`-nc 20`), all in every round (`-jr 1`), `-fd 512`: every backbone's
    classifier replaced by AdaptiveAvgPool1d(512) and a Linear(512, C) head (BaseHeadSplit;
    `htfl.feature_dim` = 512, `models.with_feature_dim`).
  * Local training: SGD lr 0.01 (`-lr 0.01`), no momentum, no weight decay, constant rate
    (`-ld` off), batch 10 (`-lbs 10`), 1 local epoch (`-ls 1`).
  * Rounds: `-gr` defaults to 2000 with auto-break (`-ab 1`, `-tc 100`: a run stops when the
    best accuracy is 100 rounds old; FedTGP's README: "larger than 1000"); 2000 rounds here,
    no auto-break (the best round is read from the whole run).
  * Method settings: FedProto lambda 10, FD lambda 1, FedTGP lambda 10, 100 server epochs,
    margin threshold 100; FedGH server lr 0.01, 1 server epoch; FedKD mentee lr 0.01,
    T_start 0.95, T_end 0.98; FML alpha = beta = 0.5 (`total.sh`).
  * Metric: HtFLlib's accuracy of a round is the number of correct test predictions over all
    clients' test splits divided by their total size (each client's model on its own split),
    and a run's number is its best round (`average_data`: mean and std of the best round over
    `-t 3` runs). This library reports each client's accuracy on its own split
    (eval/intra/<client>, `htfl.eval_domains="own"`; inter is then NaN: not evaluated) and the
    mean over clients of the last `eval.last_rounds` = 3 rounds; the HtFLlib number follows
    from metrics.jsonl and metadata.json's test sizes (`reports.partitioned.htfl_accuracy`).
    Every round is evaluated (`eval.every = 1`).

Data (`scenario.dataset` = "<dataset>_pfllib", `data.partitioned`): PFLlib pools CIFAR's
official training and test images (60000), partitions the pool over the 20 clients and
splits every client 75/25 into train/test. The bundle's cifar10.npz holds 1000 training
images per class and the full test set: the pool here is those 10000 + 10000 images. The
bundle has no official CIFAR-100 training split (cifar100_glfc.npz: 120 training / 50 test
images per class, GLFC's subset), so the CIFAR-100 variants pool 12000 + 5000 images, 17000
instead of 60000, and their numbers are not comparable with the papers'; there is no
Tiny-ImageNet beyond a 5000-image public subset, so no Tiny-ImageNet variant. Without the
data the run stops (no synthetic substitute: `scenario.synthetic_fallback` False).

Backbones: the 4-layer CNN is HtFLlib's FedAvgCNN (`htfl_cnn`); ResNet-10/18/34, GoogLeNet
and MobileNetV2 are the zoo's CIFAR variants (3x3 stem without max-pool; HtFLlib uses
torchvision's ImageNet-stem ResNets, GoogLeNet and its own ImageNet MobileNetV2 on 32x32
images: a deviation). ResNet-50/101/152 (htfe8) are torchvision's Bottleneck layouts and
init (models/resnet.py) with the same CIFAR stem; their 2048 features are pooled to 512 in
windows of 4, as BaseHeadSplit's AdaptiveAvgPool1d(512) replacing torchvision's `fc` does.

Public-data methods (fedmd, fcclplus, fccl, feddf, rhfl; not in HtFLlib, no published number
in this scenario): the library's modules of the FCCL+ benchmark, side by side with the
data-free methods. The scenario gets a public set (`scenario.public_name`,
`scenario.public_size`, `data.partitioned`): 5000 CIFAR-100 images for CIFAR-10 clients (the
bundle's public_cifar100_5000.npz, FCCL+'s public set), 5000 Tiny-ImageNet images for CIFAR-100
clients (classes the private data does not hold), normalised with their own statistics. Local
training is HtFLlib's (SGD lr 0.01, batch 10, 1 epoch per round, as for FML); the public phase,
the warm-ups (FedMD 40 private epochs, FCCL 50) and every method setting are the modules'
defaults (the FCCL+ benchmark's: Adam 1e-3 in public batches of 512, one public epoch a round
with linear decay over the run). Their backbones keep their own feature dimensions (no pooling
to 512: they exchange logits on the public set). They evaluate every client on every client's
test split with the FCCL+ benchmark's evaluator: eval/intra (each client on its own split) is
the number the table reads, the same metric as the data-free rows' `htfl.eval_domains="own"`,
and eval/inter (the mean over the other clients' splits) comes beside it. The evaluation is
not what sets their memory (FedMD, HtFE4, quick: XLA's memory analysis gives the evaluation
program 0.8 GiB of temporaries with custom_vjp convolutions), so they keep the benchmark's
evaluator and its inter number at K times the evaluation work of "own".

Memory: a public-data round's largest program is its public stage. FedMD's digest, FedDF's
distillation and the FCCL / FCCL+ / RHFL collaborative steps take one gradient through every
participant's train-mode forward on the shared public batch (`algorithms.common.
public_forward`), so the activations of all 20 clients on that batch are alive at once. With
the FCCL+ benchmark's batch of 512 the quick FedMD HtFE4 round needs 31.2 GiB (im2col
convolutions) or 21.6 GiB (custom_vjp) by XLA's memory analysis (XLA:CPU's memory scheduler;
a 2-core CPU with 23 GiB, November 2026), more than that machine holds; with 64 it needs 3.9
GiB (im2col) and trains. The quick variants therefore take public batches of 64
(`QUICK_PUBLIC_BATCH`: the same public images per round in 16 optimiser steps instead of 2);
the paper variants keep the benchmark's 512, whose round at full width needs about 8 times
the quick one's activations (8 times the channels): the trainer's memory check
(`runtime.resources.check_round_memory`) names `collaborative.batch_size` when a device cannot
hold it.

Quick variants (_quick): width 1/8 backbones with features pooled to 64 (= 512 / 8), a pool
of 2000 + 1000 images (stratified subsamples of the train and test splits), 5 rounds, test
batch 256, a public set of 1000 images in batches of 64 and 1-epoch warm-ups; FD distils
toward the softmax of the global class logits (`fd.target="softmax"`, the FD paper's
distillation) instead of HtFLlib's raw logits: a soft-target cross-entropy whose target has
negative entries is unbounded below (-t_c log p_c -> -inf as p_c -> 0 for t_c < 0), and on
these narrow models it diverged (CIFAR-10 practical, HtFE2, seed 0: a client's CE 7.2e7 in
round 3, NaN in round 4); every other setting as above.
"""

from __future__ import annotations

import ml_collections

from fedjax_het import algorithms
from fedjax_het.config import base_config

DATASETS = ("cifar10", "cifar100")
SKEWS = ("practical", "pathological")
#: HtFLlib's HtFE groups in this zoo's names (module docstring).
GROUPS = {
    "htfe2": ("htfl_cnn", "resnet18"),
    "htfe3": ("resnet10", "resnet18", "resnet34"),
    "htfe4": ("htfl_cnn", "googlenet", "mobilenet_v2", "resnet18"),
    "htfe8": ("htfl_cnn", "googlenet", "mobilenet_v2", "resnet18", "resnet34", "resnet50",
              "resnet101", "resnet152"),
}
NUM_CLIENTS = 20
#: The methods of this family (those registered are valid).
METHODS = ("fedproto", "fd", "fedtgp", "lg_fedavg", "fedgh", "fedkd", "fml", "fedmd",
           "fcclplus", "fccl", "feddf", "rhfl")
#: The methods that need a public set, and the public set of each private dataset: one whose
#: classes the private data does not hold, 5000 images (FCCL+'s public size).
PUBLIC_METHODS = ("fedmd", "fcclplus", "fccl", "feddf", "rhfl")
PUBLIC_SETS = {"cifar10": "cifar100", "cifar100": "tinyimagenet"}
PUBLIC_SIZE, QUICK_PUBLIC = 5000, 1000
#: The public-data methods' public batch at the quick scale (`collaborative.batch_size`; the
#: FCCL+ benchmark's 512 otherwise): see "Memory" in the module docstring.
QUICK_PUBLIC_BATCH = 64
#: The public-data methods' private warm-ups (FedMD's `warmup_epochs`, FCCL's
#: `pretrain_epochs`) at the quick scale.
QUICK_WARMUP = 1
#: PFLlib's classes per client of the pathological split.
PATHOLOGICAL_CLASSES = {"cifar10": 2, "cifar100": 10}
QUICK_WIDTH, QUICK_ROUNDS, QUICK_TRAIN, QUICK_TEST = 0.125, 5, 2000, 1000


def methods() -> tuple[str, ...]:
  """The methods of `METHODS` that are registered."""
  return tuple(m for m in METHODS if m in algorithms.METHODS)


def parse(arg: str) -> tuple[str, str, str, str, bool]:
  """"cifar10_practical_htfe4_lg_fedavg_quick" -> ("cifar10", "practical", "htfe4",
  "lg_fedavg", True); ValueError naming the allowed values otherwise."""
  parts = arg.split("_")
  quick = parts[-1] == "quick"
  if quick:
    parts = parts[:-1]
  method = "_".join(parts[3:])
  if (len(parts) < 4 or parts[0] not in DATASETS or parts[1] not in SKEWS
      or parts[2] not in GROUPS or method not in methods()):
    raise ValueError(f"htfl config: expected <dataset>_<skew>_<group>_<method>[_quick] with "
                     f"dataset in {DATASETS}, skew in {SKEWS}, group in {tuple(GROUPS)} and "
                     f"method in {methods()}, got {arg!r}.")
  return parts[0], parts[1], parts[2], method, quick


def method_settings(c: ml_collections.ConfigDict, method: str) -> None:
  """HtFLlib's `total.sh` settings of `method` (module docstring); the FCCL+-benchmark
  modules (FML and the public-data methods) train locally as HtFLlib does."""
  if method == "fml" or method in PUBLIC_METHODS:
    c.local.optimizer = "sgd"
    c.local.lr = 0.01
    c.local.lr_decay = 0.0
    c.local.weight_decay = 0.0
    c.local.batch_size = 10
    c.local.epochs = 1
  if method == "fml":  # the existing FML module, with HtFLlib's weights
    c.fml.alpha = 0.5
    c.fml.beta = 0.5
    c.fml.weighting = "size"      # HtFLlib's aggregate_parameters: train-sample weights


def get_config(arg: str = "cifar10_practical_htfe4_fedproto") -> ml_collections.ConfigDict:
  """`arg` = <dataset>_<skew>_<group>_<method>[_quick] (module docstring)."""
  dataset, skew, group, method, quick = parse(arg)
  c = base_config(method)
  c.name = f"htfl_{arg}"
  c.num_rounds = 2000
  c.scenario.name = "partitioned"
  c.scenario.dataset = f"{dataset}_pfllib"
  c.scenario.num_clients = NUM_CLIENTS
  if skew == "practical":
    c.scenario.partition = "dirichlet"
    c.scenario.dirichlet_alpha = 0.1
  else:
    c.scenario.partition = "shards"   # PFLlib's "pat" for the *_pfllib datasets
    c.scenario.shards_per_client = PATHOLOGICAL_CLASSES[dataset]
  c.scenario.synthetic_fallback = False
  c.scenario.public_size = 0
  if method in PUBLIC_METHODS:
    c.scenario.public_name = PUBLIC_SETS[dataset]
    c.scenario.public_size = PUBLIC_SIZE
  backbones = GROUPS[group]
  c.models.architectures = tuple(backbones[i % len(backbones)] for i in range(NUM_CLIENTS))
  c.eval.every = 1
  c.eval.last_rounds = 3
  c.eval.batch_size = 500
  c.checkpoint.every = 50
  c.logging.diagnostic_rounds = ()
  method_settings(c, method)
  if quick:
    c.num_rounds = QUICK_ROUNDS
    c.models.width = QUICK_WIDTH
    if "htfl" in c:
      c.htfl.feature_dim = int(512 * QUICK_WIDTH)
    c.scenario.train_size = QUICK_TRAIN
    c.scenario.test_size = QUICK_TEST
    c.eval.batch_size = 256
    c.checkpoint.every = 1
    if method in PUBLIC_METHODS:
      c.scenario.public_size = QUICK_PUBLIC
      c.collaborative.batch_size = QUICK_PUBLIC_BATCH
      if method == "fedmd":
        c.fedmd.warmup_epochs = QUICK_WARMUP
      if method in ("fccl", "fcclplus"):
        c[method].pretrain_epochs = QUICK_WARMUP
    if method == "fd":
      c.fd.target = "softmax"  # the raw-logit target diverged at this scale (docstring)
  return c

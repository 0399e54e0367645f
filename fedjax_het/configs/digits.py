"""Digits: MNIST, USPS, SVHN, SYN participants with heterogeneous backbones (FCCL+ Sec. 4).

Commands (from the repository root):

  python experiments/train.py --config=digits_fcclplus_quick      # the README main job
  python experiments/train.py --config=digits_fcclplus            # paper setting (GPU; fits a
                                                                  # 24 GiB, 2-core CPU: about 20 min a round)
  python experiments/train.py --config=digits_moon_quick          # a FedAvg-family baseline
  python experiments/train.py --config=fedjax_het/configs/digits.py:fccl \
      --config.num_rounds=5 --workdir=/tmp/fccl

Variants (the part after "digits.py:" or "digits_"):
  fcclplus, fccl, solo                  heterogeneous: MNIST->ResNet10, USPS->ResNet12,
                                        SVHN->EfficientNet-B0, SYN->MobileNetV2 (Table VI)
  fcclplus_homogeneous, fccl_homogeneous, solo_homogeneous
                                        ResNet12 for all, parameter averaging (FCCL+ Table XV)
  fedavg, fedprox, moon, fedproc, fedrs the homogeneous FedAvg family of FCCL+ Table XV: one
                                        global ResNet12, all four participants every round,
                                        uniform averaging, each participant's own model
                                        evaluated (Table VII: FedProx mu = 0.01; MOON
                                        tau = 0.5, mu = 1; FedProc alpha annealed
                                        1 - r/(E-1); FedRS alpha = 0.5)
  rhfl, rhfl_homogeneous                RHFL (CVPR 2022): the heterogeneous backbones above (or
                                        ResNet12 for all, no averaging); SCE alpha = 0.1,
                                        beta = 1 (Table VII); confidence re-weighting on
  fedmd, feddf                          FedMD (warm-up: 40 private epochs; L1 digest of the
                                        mean logits, public_subset images per round, then
                                        private CE) and FedDF (KL to the all-participant logit
                                        ensemble with SGD, then private CE) on the
                                        heterogeneous backbones above; _homogeneous: ResNet12
                                        for all (FedDF also averages before local training)
  fedmatch                              FedMatch: public KL + agreement pseudo labels, private CE
  fml, fml_homogeneous                  FML (FCCL Tables 1-3): private models on the backbones
                                        above, each with a copy of a shared meme model (the
                                        first backbone, ResNet10; _homogeneous: ResNet12)
                                        trained by mutual learning, memes averaged each round
  rcfl, rcfl_homogeneous                RCFL (FCCL Tables 1-3): warm-up (20 private epochs),
                                        then per public batch softmax scores aggregated per
                                        class (alpha-weighted: shared vs partially held
                                        labels; every class is shared here), KL distillation,
                                        then private CE; _homogeneous: ResNet12 for all, no
                                        averaging
  fccl_cvpr                             FCCL with the conference code's protocol (FCCL CVPR
                                        2022 code): batch 512 in both phases, private epochs
                                        (40, 35, 3, 4) per participant, constant Adam 1e-3
                                        without weight decay in both phases, pretraining 40
                                        epochs of constant Adam 1e-3 in batches of 256
  <any of the above>_code               the FCCL+ authors' code protocol (`code_protocol_settings`:
                                        batches 256 / 128, private sizes 138 / 94 / 9523 / 1800,
                                        public CIFAR-100 with Tiny-ImageNet's statistics, FCCM
                                        without epsilon, FISL features from a second pass)
  <any of the above>_mid                the mid scale (`mid_settings`): the code protocol on
                                        width-1/8 backbones, 40 rounds of 20 local epochs, 20
                                        public steps of 256 a round, SVHN / SYN private sets
                                        384 / 256, test sets of 500; BASE 40 rounds of the same
                                        20 epochs: about an hour a cell on a 2-core CPU
  <any of the above>_quick              narrow backbones (width 1/8), 5 rounds, 5 local epochs
                                        (SOLO included: the same local budget), private
                                        sizes 150/80/2000/1500, 1024 public images in
                                        batches of 512, test sets of 300, a constant local
                                        learning rate (as SOLO's) for the methods compared
                                        with SOLO: minutes on a 2-core CPU

Data (see metadata.json of a run): every domain is read from digits.npz in the data
directory (FEDJAX_HET_DATA_DIR or --config.scenario.data_dir), which
`python -m fedjax_het.data.download mnist usps svhn cifar100` writes (SYN: `... syn --from
<archive>`; docs/data.md). Other sources per domain: `--config.scenario.sources.svhn=tfds`
(TensorFlow Datasets' prepared `svhn_cropped`) or `...=folder:/path/to/SynthDigits`. Every
config here opts in to `synthetic_fallback`: a domain the data directory lacks is replaced by
the embedded synthetic domain, logged loudly and listed in metadata.json / results.md. A
finished run whose domain was the synthetic stand-in under another source (`tfds`,
`synthetic`) is the same run where that domain is the stand-in again (`fedjax_het.grid.progress`). The public set is CIFAR-100 (5000
images, public_cifar100_5000.npz) or, without it, the synthetic public set.

Paper setting (full configs): 40 rounds, public batch 512 (1 epoch of 5000 images), local
batch 256 for 20 epochs, Adam 1e-3 both phases with linear decay, private sizes
150/80/5000/1800, full test sets, top-1 accuracy, mean of the last 3 rounds.

Expected results (paper, real data incl. SVHN/SYN, CIFAR-100 public, full-width backbones):
FCCL+ Tables VIII / IX, Digits AVG inter -> / intra <-:
  BASE (solo) 25.68 / 73.14,  FCCL 33.51 / 85.69,  FCCL+ 50.49 / 90.57.
  FedMD 26.38 / 80.70,  FedDF 30.43 / 83.38.
FCCL+ Table XV (homogeneous ResNet12), Digits AVG inter -> / intra <-:
  FedAvg 75.54 / 90.05,  FedProx 86.80 / 92.77,  MOON 77.85 / 87.20 (row tau = 1;
  66.16 / 82.50 for tau = 5),  FedProc 71.77 / 83.76,  FedRS 63.97 / 81.65.
The quick configs show the mechanics, not those numbers; measured figures for them are in
docs/results.md.
"""

from __future__ import annotations

import ml_collections

from fedjax_het.config import base_config

HETEROGENEOUS = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")
FEDAVG_FAMILY = ("fedavg", "fedprox", "moon", "fedproc", "fedrs")
METHODS = ("fcclplus", "fccl", "solo") + FEDAVG_FAMILY + ("rhfl", "fedmd", "feddf", "fedmatch",
                                                           "fml", "rcfl")


def get_config(arg: str = "fcclplus") -> ml_collections.ConfigDict:
  """`arg` = <method>[_homogeneous][_quick], method in `METHODS`, or "fccl_cvpr"."""
  parts = arg.split("_")
  method, flags = parts[0], set(parts[1:])
  if (method not in METHODS or not flags <= {"homogeneous", "quick", "mid", "code", "cvpr"}
      or len(flags & {"quick", "mid"}) > 1 or ("code" in flags and flags & {"mid", "quick"})
      or ("cvpr" in flags and (method != "fccl" or flags != {"cvpr"}))):
    raise ValueError(f"digits config: expected <method>[_homogeneous][_code|_mid|_quick] with "
                     f"method in {METHODS}, or fccl_cvpr, got {arg!r}.")
  c = base_config(method)
  c.name = f"digits_{arg}"
  c.scenario.name = "digits"
  c.scenario.sources = ml_collections.ConfigDict(
      {"mnist": "real", "usps": "real", "svhn": "real", "syn": "real"})
  c.scenario.synthetic_fallback = True
  c.scenario.public_name = "cifar100"
  c.models.architectures = HETEROGENEOUS
  if method == "fcclplus":
    c.fcclplus.fntd_temperature = 3.0  # tau = 3 for Digits
  method_settings(c, method, flags, num_participants=4)
  if "cvpr" in flags:
    fccl_cvpr_settings(c, private_epochs=CVPR_PRIVATE_EPOCHS, public_epochs=1)
  if "code" in flags:
    code_protocol_settings(c, method, "digits")
  if "mid" in flags:
    mid_settings(c, method, "digits")
  if "quick" in flags:
    quick_settings(c, method)
    if "collaborative" in c:
      c.collaborative.batch_size = 512  # the paper's public batch: 2 public steps per round
    # SVHN and SYN below Table V's 5000 / 1800 to fit the budget, but not so far below that the
    # width-1/8 EfficientNet-B0 / MobileNetV2 only memorise them: with 1000 / 600 images they
    # fit their training data and stayed near chance on the synthetic test sets (12-13%).
    c.scenario.private_sizes = ml_collections.ConfigDict(
        {"mnist": 150, "usps": 80, "svhn": 2000, "syn": 1500})
    if method not in FEDAVG_FAMILY:
      # The local phase at BASE's constant learning rate: the paper's linear decay spans 40
      # rounds, and over 5 it would leave the methods compared with BASE (SOLO) at 46% of
      # BASE's rate in the last round. The public phase keeps its decay.
      c.local.lr_decay = 0.0
  return c


def method_settings(c: ml_collections.ConfigDict, method: str, flags: set[str], *,
                    num_participants: int) -> None:
  """The per-method settings of every FCCL+-benchmark scenario (digits.py and office.py)."""
  if method == "solo":
    # BASE: 50 epochs of private training, one epoch per round, constant lr.
    c.num_rounds = 50
    c.logging.diagnostic_rounds = (1, 25, 50)
  if method in FEDAVG_FAMILY:
    # FCCL+ Table XV: one global ResNet12, all participants every round, uniform average.
    c.models.architectures = ("resnet12",) * num_participants
    c.fedavg.weighting = "uniform"
    c.fedavg.evaluate = "local"  # Table XV reports each participant's own model
    c.logging.diagnostic_rounds = ()
  if "homogeneous" in flags:
    c.models.architectures = ("resnet12",) * num_participants
    if method in ("fcclplus", "fccl", "feddf"):
      c[method].average_parameters = True


#: The FCCL (CVPR 2022) code's private epochs per participant (MNIST, USPS, SVHN, SYN).
CVPR_PRIVATE_EPOCHS = (40, 35, 3, 4)


def fccl_cvpr_settings(c: ml_collections.ConfigDict, *, private_epochs: tuple[int, ...],
                       public_epochs: int) -> None:
  """FCCL with the conference code's protocol (digits.py and office.py `fccl_cvpr`).

  The CVPR code trains both phases with batches of 512 and a constant Adam 1e-3 without
  weight decay (a fresh Adam per public batch, one per participant and round locally), runs
  `private_epochs[i]` private epochs for participant i and `public_epochs` public epochs per
  round, and pretrains every participant 40 epochs with a constant Adam 1e-3 in batches of
  256. The paper states batch 512 and Adam 1e-3 for both phases (FCCL Sec. 4).
  """
  c.num_rounds = 40
  c.collaborative.batch_size = 512
  c.collaborative.epochs = public_epochs
  c.collaborative.lr = 1e-3
  c.collaborative.lr_decay = 0.0
  c.collaborative.optimizer = "adam"
  c.collaborative.optimizer_reset = "batch"
  # A sequence is another type than the default's int: the section is rebuilt around it.
  c.local = ml_collections.ConfigDict({**c.local.to_dict(), "epochs": tuple(private_epochs)})
  c.local.batch_size = 512
  c.local.lr = 1e-3
  c.local.lr_decay = 0.0
  c.local.weight_decay = 0.0
  c.local.optimizer = "adam"
  c.fccl.pretrain_epochs = 40
  c.fccl.pretrain_lr = 1e-3
  c.fccl.pretrain_min_lr = 1e-3  # constant: the cosine from lr to lr
  c.fccl.pretrain_batch_size = 256


#: The FCCL+ authors' code's per-scenario arguments (`fccl+/utils/best_args.py`) where they
#: differ from the paper's text (public batch 512, local batch 256, 20 local epochs, 1 public
#: epoch, Adam 1e-3): (public batch, local batch, local epochs, public epochs, local lr) for the
#: methods the code has; the other methods of the benchmark take its `fcclplus` row.
CODE_ARGS = {
    "digits": {"fcclplus": (256, 128, 20, 1, 1e-3), "fccl": (256, 128, 20, 1, 1e-3),
               "feddf": (256, 128, 20, 1, 1e-3), "fedavg": (None, 64, 20, None, 1e-3),
               "fedprox": (None, 64, 20, None, 1e-3), "moon": (None, 64, 20, None, 1e-3)},
    "office31": {"fcclplus": (256, 128, 20, 1, 1e-3), "fccl": (256, 128, 20, 1, 1e-3),
                 "feddf": (256, 128, 20, 1, 1e-3), "fedavg": (None, 64, 20, None, 1e-3),
                 "fedprox": (None, 64, 20, None, 1e-3), "moon": (None, 64, 20, None, 1e-3)},
    "office_caltech": {"fcclplus": (128, 128, 20, 1, 1e-3), "fccl": (128, 128, 20, 1, 1e-3),
                       "feddf": (256, 128, 20, 1, 1e-3),
                       "fedavg": (None, 128, 20, None, 1e-2),
                       "fedprox": (None, 128, 20, None, 1e-2),
                       "moon": (None, 128, 20, None, 1e-2)},
    "office_home": {"fcclplus": (176, 128, 15, 2, 1e-3), "fccl": (256, 128, 10, 1, 1e-3),
                    "feddf": (256, 128, 10, 1, 1e-3), "fedavg": (None, 128, 20, None, 1e-2),
                    "fedprox": (None, 128, 10, None, 1e-2), "moon": (None, 128, 10, None, 1e-2)},
}
#: The code's Digits private sizes: fractions of each official train set
#: (`fccl+/datasets/digits.py` percent_dict: MNIST 0.0023 of 60000, USPS 0.013 of 7291, SVHN
#: 0.13 of 73257). SYN's fraction (0.23) is of a train folder whose size the code does not
#: fix; SYN keeps Table V's 1800.
CODE_DIGITS_PRIVATE_SIZES = {"mnist": 138, "usps": 94, "svhn": 9523, "syn": 1800}
#: The code's FISL weight omega (`dis_power`) where it differs from the paper's 3: Office-Home.
CODE_FISL_WEIGHT = {"office_home": 1.0}


def code_protocol_settings(c: ml_collections.ConfigDict, method: str, scenario: str) -> None:
  """The FCCL+ authors' code protocol (the `_code` variants; the mid scale runs it too).

  Every difference from the paper's text, with its source in WenkeHuang/FCCL (`fccl+/`):
    * batch sizes, local and public epochs, local lr: `utils/best_args.py` (`CODE_ARGS`);
    * Digits private sizes: fractions of each train set, `datasets/digits.py`;
    * Office-Home's FISL weight omega = 1 (`dis_power`), `utils/best_args.py`;
    * public CIFAR-100 normalised with Tiny-ImageNet's statistics, `datasets/cifar100.py`
      (`scenario.public_normalization="fcclplus_code"`);
    * FCCM without an epsilon on the column variances, `models/fcclplus.py`, `models/fccl.py`
      (`fcclplus.fccm_eps = fccl.fccm_eps = 0`);
    * FISL's features from a second train-mode forward pass, `models/fcclplus.py` `col_update`
      (`fcclplus.feature_pass="separate"`);
    * Office test sets: the whole domain, training images included, `datasets/office31.py` etc.
      (`scenario.office_test="whole_domain"`).
  Not reproduced: the code draws Office private data from the first 80% of each class-sorted
  domain, which leaves the last classes out of private data (docs/methods.md).
  """
  args = CODE_ARGS[scenario]
  public_batch, local_batch, local_epochs, public_epochs, local_lr = args.get(
      method, args["fcclplus"])
  c.local.batch_size = local_batch
  c.local.lr = local_lr
  if method != "solo":  # BASE keeps its own schedule (the paper's 50 private epochs)
    c.local.epochs = local_epochs
  if "collaborative" in c and public_batch is not None:
    c.collaborative.batch_size = public_batch
    c.collaborative.epochs = public_epochs
  if scenario == "digits":
    c.scenario.private_sizes = ml_collections.ConfigDict(CODE_DIGITS_PRIVATE_SIZES)
  else:
    c.scenario.office_test = "whole_domain"
  c.scenario.public_normalization = "fcclplus_code"
  if method == "fcclplus":
    c.fcclplus.fccm_eps = 0.0
    c.fcclplus.feature_pass = "separate"
    c.fcclplus.fisl_weight = CODE_FISL_WEIGHT.get(scenario, c.fcclplus.fisl_weight)
  if method == "fccl":
    c.fccl.fccm_eps = 0.0


#: The mid scale's Digits private sizes: the code's MNIST and USPS sizes; SVHN and SYN (the
#: embedded synthetic stand-ins when their data is absent) cut to 3 and 2 local batches of 128
#: so that a 40-round cell of 20 local epochs fits about an hour on a 2-core CPU (their local
#: steps cost about 2.5 ms an image at width 1/8 there, `benchmarks/results/fcclplus_phases__
#: digits_fcclplus_quick-mid_batches__cpu2.json`; with 600 / 400 images and test sets of 1000 a
#: round took 118 s, `train__digits_fcclplus_mid-3_rounds-svhn600_syn400_test1000__cpu2.json`).
MID_DIGITS_PRIVATE_SIZES = {"mnist": 138, "usps": 94, "svhn": 384, "syn": 256}
#: The mid scale's test sets per domain (0: whole): Digits' are capped, evaluated every round.
MID_TEST_SIZE = {"digits": 500}


def mid_settings(c: ml_collections.ConfigDict, method: str, scenario: str) -> None:
  """The mid scale (the `_mid` variants): the code protocol's rounds, public steps, local
  epochs and batches on width-1/8 backbones, about an hour a cell on a 2-core CPU.

  What differs from the code protocol (`code_protocol_settings`): backbones at width 1/8 (the
  quick configs' width; at it an Office31 FCCL+ round takes 91 s on a 2-core CPU,
  `benchmarks/results/train__office_office31_fcclplus_mid-3_rounds__cpu2.json`, so 40 rounds about
  an hour; its phases: `fcclplus_phases__office_office31_fcclplus_quick-mid_batches-*`); BASE (SOLO) trains
  40 rounds of the methods' local epochs with their learning-rate decay, i.e. each method's
  local schedule without collaboration (the paper's BASE is 50 private epochs: rounds 2-3 of
  its curve); Digits' SVHN and SYN private sets (`MID_DIGITS_PRIVATE_SIZES`) and test sets
  (`MID_TEST_SIZE`) smaller.
  """
  code_protocol_settings(c, method, scenario)
  c.models.width = 0.125
  c.num_rounds = 40
  if method == "solo":
    c.local.epochs = CODE_ARGS[scenario]["fcclplus"][2]
    c.local.lr_decay = 0.9  # the methods' linear decay over the 40 rounds
  if scenario == "digits":
    c.scenario.private_sizes = ml_collections.ConfigDict(MID_DIGITS_PRIVATE_SIZES)
  c.scenario.test_size = MID_TEST_SIZE.get(scenario, 0)
  if method not in FEDAVG_FAMILY:
    c.logging.diagnostic_rounds = (1, 20, 40)


def quick_settings(c: ml_collections.ConfigDict, method: str) -> None:
  """The quick variants' budget shared by digits.py and office.py (each adds its data sizes)."""
  c.models.width = 0.125
  c.num_rounds = 5  # SOLO too: the same 25 local epochs as every quick method
  c.local.epochs = 5
  c.local.batch_size = 64
  c.scenario.public_size = 1024
  c.scenario.test_size = 300
  c.eval.batch_size = 300
  if method == "fccl":
    c.fccl.pretrain_epochs = 5
  if method == "fcclplus":
    c.fcclplus.pretrain_epochs = 5  # read only by fcclplus.local_distillation="dual"
  if method == "fedmd":
    c.fedmd.warmup_epochs = 5
    c.fedmd.public_subset = 512  # half of the quick public set, redrawn every round
  if method == "rcfl":
    c.rcfl.warmup_epochs = 5  # one quick local phase
  if method not in FEDAVG_FAMILY:
    c.logging.diagnostic_rounds = (1, c.num_rounds)

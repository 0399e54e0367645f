"""CIFAR-10 over 100 clients with Dirichlet(0.5) label skew: the FedAvg family at scale.

Commands (from the repository root):

  python experiments/train.py --config=cifar10_fedavg_quick      # minutes on a 2-core CPU
  python experiments/train.py --config=cifar10_fedavg            # 100 clients, 10 per round
  python experiments/train.py --config=cifar10_fedprox --config.fedavg.clients_per_round=20
  python experiments/train.py --config=cifar10_fedavg --config.server.optimizer=adam \
      --config.server.lr=0.01                                   # FedAdam
  python experiments/train.py --config=cifar10_fedfusion_classes2_multi_quick

Variants: <method>[_quick], method one of the FedAvg family (fedavg, fedprox, moon,
fedproc, fedrs, fedmmd, fedfusion), this file's setting below; and the FedMMD /
FedFusion paper settings <method>_<setting>[_<variant>][_nodropout][_quick] with setting
binary, iid, classes5 or classes2 (FedFusion Table 1 (a) / (b) in our reading; see
fedjax_het/configs/_two_stream.py, whose CNNs have the papers' dropout, p = 0.2, unless
`_nodropout`), e.g. cifar10_fedmmd_binary, cifar10_fedfusion_iid_multi_quick,
cifar10_fedavg_classes5_quick. This file's setting (the MOON / FedAvg non-IID
CIFAR-10 benchmark): 100 clients, Dirichlet(0.5) label skew (Hsu et al. 2019), 10 clients sampled per round, the FedAvg
CIFAR CNN (McMahan et al. 2017), local SGD lr 0.01 momentum-free, batch 50, E = 5 epochs,
data-size weighted averaging, plain server averaging; global test accuracy per round, and
`eval.targets` (50%) gives the rounds to reach it in results.md. The CNN here has no
dropout (no `models.dropout_rate` field).

Data: cifar10.npz of the offline bundle (FEDJAX_HET_DATA_DIR or
--config.scenario.data_dir). Without it the configs fall back to the synthetic digit
domain (logged loudly and recorded in metadata.json / results.md), so the quick variant
runs on a bare machine; its numbers then say nothing about CIFAR-10.

Quick variant: 10000 training images over the 100 clients, 10 per round, 10 rounds of E = 2.
"""

from __future__ import annotations


import ml_collections

from fedjax_het.config import base_config

# The FedMMD / FedFusion paper settings (<method>_<setting>[_<variant>][_quick]).
from fedjax_het.configs import _two_stream as two_stream

FEDAVG_FAMILY = ("fedavg", "fedprox", "moon", "fedproc", "fedrs", "fedmmd", "fedfusion")


def get_config(arg: str = "fedavg") -> ml_collections.ConfigDict:
  """`arg` = <method>[_quick] (this file's setting), or a FedMMD/FedFusion paper setting."""
  if two_stream.parse("cifar10", arg) is not None:
    return two_stream.get_config("cifar10", arg)
  method, _, rest = arg.partition("_")
  if method not in FEDAVG_FAMILY or rest not in ("", "quick"):
    raise ValueError(f"cifar10 config: expected <method>[_quick] with method in "
                     f"{FEDAVG_FAMILY}, got {arg!r}.")
  c = base_config(method)
  c.name = f"cifar10_{arg}"
  c.num_rounds = 100
  c.scenario.name = "partitioned"
  c.scenario.dataset = "cifar10"
  c.scenario.num_clients = 100
  c.scenario.partition = "dirichlet"
  c.scenario.dirichlet_alpha = 0.5
  c.scenario.synthetic_fallback = True
  c.scenario.public_size = 0
  c.models.architectures = ("fedavg_cifar_cnn",)
  c.fedavg.clients_per_round = 10
  c.fedavg.weighting = "size"
  c.fedavg.evaluate = "global"
  c.local.optimizer = "sgd"
  c.local.lr = 0.01
  c.local.lr_decay = 0.0
  c.local.weight_decay = 0.0
  c.local.batch_size = 50
  c.local.epochs = 5
  c.eval.batch_size = 1000
  c.eval.every = 1
  c.eval.targets = (50.0,)
  c.checkpoint.every = 10
  if rest == "quick":
    c.num_rounds = 10
    c.local.epochs = 2
    c.scenario.train_size = 10000
    c.scenario.test_size = 1000
    c.checkpoint.every = 1
  return c

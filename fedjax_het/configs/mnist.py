"""MNIST over 100 clients with McMahan's pathological non-IID split (2 shards each).

Commands (from the repository root):

  python experiments/train.py --config=mnist_fedavg_quick
  python experiments/train.py --config=mnist_fedavg
  python experiments/train.py --config=mnist_fedavg --config.scenario.partition=iid
  python experiments/train.py --config=mnist_fedfusion_permuted_conv_quick
  python experiments/train.py --config=mnist_fedmmd_shards

Variants: <method>[_nodropout][_quick], method one of the FedAvg family (fedavg, fedprox,
moon, fedproc, fedrs, fedmmd, fedfusion), this file's setting below; and the FedMMD /
FedFusion paper settings <method>_<setting>[_<variant>][_nodropout][_quick] with setting
binary, shards or permuted (see fedjax_het/configs/_two_stream.py, whose CNNs have the
papers' dropout, p = 0.2, unless `_nodropout`).

This file's setting (McMahan et al. 2017, "pathological non-IID"): the 60000 MNIST
training images sorted by label, cut into 200 shards of 300, 2 shards per client (so most
clients see two digits), 10 of the 100 clients per round (C = 0.1), the FedAvg MNIST CNN,
local SGD lr 0.05, batch 10, E = 5; global test accuracy per round; `eval.targets`
(97%, the paper's CNN target is 99%) gives the rounds to reach it in results.md.

Data: MNIST from digits.npz of the offline bundle (FEDJAX_HET_DATA_DIR or
--config.scenario.data_dir); without it the synthetic MNIST-style digit domain is used,
logged and recorded.

Quick variant: 3000 training images (30 per client), 10 rounds of E = 5.

Dropout: `mnist_fedmmd` and `mnist_fedfusion` train the FedAvg CNN with the dropout
FedMMD/FedFusion describe ("a fully connected layer with 512 units (with a ReLU activation
and random dropout)", Sec. 4.1) at the authors' FedFusion code's rate
(`models.dropout_rate = 0.2`, after fc 512, in local training only); their `_nodropout`
variants (`mnist_fedmmd_nodropout`, `mnist_fedfusion_nodropout_quick`) set it to 0. The other
methods of this file's setting (`mnist_fedavg`, `mnist_fedprox`, ...) keep McMahan et al.'s
CNN without dropout (no `models.dropout_rate` field).
"""

from __future__ import annotations


import ml_collections

from fedjax_het.config import base_config

# The FedMMD / FedFusion paper settings (<method>_<setting>[_<variant>][_quick]).
from fedjax_het.configs import _two_stream as two_stream

FEDAVG_FAMILY = ("fedavg", "fedprox", "moon", "fedproc", "fedrs", "fedmmd", "fedfusion")
#: The methods of this file's setting that train the CNN with dropout (FedMMD / FedFusion).
DROPOUT_METHODS = ("fedmmd", "fedfusion")


def get_config(arg: str = "fedavg") -> ml_collections.ConfigDict:
  """`arg` = <method>[_nodropout][_quick] (this file's setting), or a FedMMD/FedFusion paper
  setting."""
  if two_stream.parse("mnist", arg) is not None:
    return two_stream.get_config("mnist", arg)
  method, _, rest = arg.partition("_")
  dropout = method in DROPOUT_METHODS
  if method in DROPOUT_METHODS and rest.split("_")[0] == two_stream.NO_DROPOUT:
    dropout, rest = False, rest[len(two_stream.NO_DROPOUT) + 1:]
  if method not in FEDAVG_FAMILY or rest not in ("", "quick"):
    raise ValueError(f"mnist config: expected <method>[_quick] with method in "
                     f"{FEDAVG_FAMILY} (fedmmd, fedfusion: <method>[_{two_stream.NO_DROPOUT}]"
                     f"[_quick]), got {arg!r}.")
  c = base_config(method)
  c.name = f"mnist_{arg}"
  c.num_rounds = 100
  c.scenario.name = "partitioned"
  c.scenario.dataset = "mnist"
  c.scenario.num_clients = 100
  c.scenario.partition = "shards"
  c.scenario.shards_per_client = 2
  c.scenario.synthetic_fallback = True
  c.scenario.public_size = 0
  c.models.architectures = ("fedavg_mnist_cnn",)
  if method in DROPOUT_METHODS:
    c.models.dropout_rate = two_stream.DROPOUT_RATE if dropout else 0.0
  c.fedavg.clients_per_round = 10
  c.fedavg.weighting = "size"
  c.fedavg.evaluate = "global"
  c.local.optimizer = "sgd"
  c.local.lr = 0.05
  c.local.lr_decay = 0.0
  c.local.weight_decay = 0.0
  c.local.batch_size = 10
  c.local.epochs = 5
  c.eval.batch_size = 1000
  c.eval.targets = (97.0,)
  c.checkpoint.every = 10
  if rest == "quick":
    c.num_rounds = 10
    c.local.epochs = 5
    c.scenario.train_size = 3000
    c.scenario.test_size = 1000
    c.checkpoint.every = 1
  return c

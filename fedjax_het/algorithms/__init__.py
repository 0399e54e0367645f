"""Federated methods, each a `make_<method>(config, setup) -> Algorithm`.

  fcclplus: FCCL+ (TPAMI), `fcclplus.py`.
  fccl:     FCCL (CVPR 2022), `fccl.py`.
  solo:     private training only (the BASE row), `solo.py`.

`ALGORITHMS` maps the `config.algorithm` names to the builders.
"""

from fedjax_het.algorithms.base import Algorithm, FederatedArrays, Setup
from fedjax_het.algorithms.fccl import make_fccl
from fedjax_het.algorithms.fcclplus import make_fcclplus
from fedjax_het.algorithms.solo import make_solo

ALGORITHMS = {"fcclplus": make_fcclplus, "fccl": make_fccl, "solo": make_solo}

__all__ = ["ALGORITHMS", "Algorithm", "FederatedArrays", "Setup", "make_fccl", "make_fcclplus",
           "make_solo"]

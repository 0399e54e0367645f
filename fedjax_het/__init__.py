"""fedjax_het: heterogeneous federated learning research in JAX/Flax.

Sub-packages:
  losses: pure, jit-compiled loss functions of FCCL, FCCL+, GLFC, FedMMD and
    the benchmark baselines (keyword-only, vmappable over a client axis).
"""

__version__ = "0.1.0"

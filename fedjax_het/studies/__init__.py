"""Studies of finished runs: what the papers measure beside their tables.

  new_client  FedFusion Fig. 6: a held-out client's local epochs to converge from a finished
              run's global model and from a random start (experiments/new_client.py)
  figures     the FCCL / FCCL+ figures of finished runs: t-SNE of features, cross-correlation
              heatmaps, L_Loc per round (experiments/figures.py)
  privacy     GLFC's privacy report: prototypes reconstructed from raw and perturbed LeNet
              gradients (experiments/glfc_privacy.py)

Each reads a run's workdir or builds its own small computation; none is imported by the
training loop.
"""

"""Figures of a run (needs matplotlib: `pip install 'fedjax_het[viz]'`).

  * `plot_accuracy_curves`: intra- and inter-domain accuracy of every
    participant per round, from metrics.jsonl records.
  * `plot_cross_correlation`: the cross-correlation matrix of every participant
    with the participants' mean logits on a public batch, at selected rounds
    (FCCL+ Fig. 8, FCCL Fig. 5).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    return plt
  except ImportError:
    logging.warning("matplotlib is not installed (pip install 'fedjax_het[viz]'): no plots.")
    return None


def plot_accuracy_curves(records: Sequence[Mapping[str, Any]], client_names: Sequence[str],
                         path: pathlib.Path, *, title: str = "",
                         kinds: Sequence[str] = ("intra", "inter")) -> bool:
  """Saves accuracy per participant vs round, one panel per kind (intra/inter or accuracy).

  Returns False without matplotlib.
  """
  plt = _pyplot()
  if plt is None:
    return False
  kinds = sorted(kinds, key=lambda k: {"intra": 0, "inter": 1}.get(k, 2))
  evaluated = [r for r in records if f"eval/{kinds[0]}/{client_names[0]}" in r]
  fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), sharey=True,
                           squeeze=False)
  axes = axes[0]
  for ax, kind in zip(axes, kinds):
    rounds = [r["round"] for r in evaluated]
    if len(client_names) <= 10:
      for name in client_names:
        ax.plot(rounds, [r[f"eval/{kind}/{name}"] for r in evaluated], marker=".", label=name)
    else:  # many participants: the spread over them instead of one line each
      per_round = np.array([[r[f"eval/{kind}/{n}"] for n in client_names] for r in evaluated])
      ax.fill_between(rounds, per_round.min(axis=1), per_round.max(axis=1), alpha=0.3,
                      label=f"min-max over {len(client_names)} participants")
    ax.plot(rounds, [r[f"eval/{kind}/mean"] for r in evaluated], "k--", label="mean")
    ax.set_title(f"{kind}-domain accuracy" if kind in ("intra", "inter") else "test accuracy")
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("accuracy (%)")
  axes[-1].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_cross_correlation(matrices: Mapping[int, np.ndarray], client_names: Sequence[str],
                           path: pathlib.Path) -> bool:
  """Saves a grid (rounds x participants) of C x C cross-correlation heatmaps."""
  plt = _pyplot()
  if plt is None or not matrices:
    return False
  rounds = sorted(matrices)
  fig, axes = plt.subplots(len(rounds), len(client_names),
                           figsize=(2.4 * len(client_names), 2.4 * len(rounds)), squeeze=False)
  image = None
  for row, r in enumerate(rounds):
    for col, name in enumerate(client_names):
      ax = axes[row][col]
      image = ax.imshow(matrices[r][col], vmin=-1, vmax=1, cmap="RdBu_r")
      ax.set_xticks([])
      ax.set_yticks([])
      if row == 0:
        ax.set_title(name, fontsize=9)
      if col == 0:
        ax.set_ylabel(f"round {r}", fontsize=9)
  fig.colorbar(image, ax=axes, shrink=0.8)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True

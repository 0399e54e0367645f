"""Figures of a run (needs matplotlib: `pip install 'fedjax_het[viz]'`).

  * `plot_accuracy_curves`: intra- and inter-domain (or plain test) accuracy of
    every participant per round, from metrics.jsonl records, with the chance
    level 100/C.
  * `plot_cross_correlation`: the cross-correlation matrix of every participant
    with the participants' mean logits on a public batch, at selected rounds
    (FCCL+ Fig. 8, FCCL Fig. 5).

Each public function saves the Figure that a `_..._figure` builder returns, so
tests can inspect the matplotlib objects.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MAX_LINES = 10  # more participants than this: mean and min-max band instead of one line each
MAX_COLUMNS = 10  # cross-correlation panels drawn per round (the first participants)

# Panel titles: which test set(s) each kind of accuracy is measured on.
ACCURACY_TITLES = {
    "intra": "intra-domain accuracy\n(each participant on its own domain's test set)",
    "inter": "inter-domain accuracy\n(each participant, mean over the other domains' test sets)",
    "accuracy": "test accuracy",
}
CROSS_CORRELATION_CAPTION = (
    "Entry (u, v): correlation over the public batch of the participant's logit u with the "
    "participants' mean logit v.\nFCCM's loss (FCCL+ Eq. 2) pulls the diagonal to 1 (red) and, "
    "with weight λ = 0.0051, the off-diagonal entries toward -1 (blue).")


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    return plt
  except ImportError:
    logging.warning("matplotlib is not installed (pip install 'fedjax_het[viz]'): no plots.")
    return None


def _save(plt, fig, path: pathlib.Path) -> bool:
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_accuracy_curves(records: Sequence[Mapping[str, Any]], client_names: Sequence[str],
                         path: pathlib.Path, *, title: str = "",
                         kinds: Sequence[str] = ("intra", "inter"),
                         num_classes: int | None = None) -> bool:
  """Saves accuracy per participant vs round, one panel per kind (intra/inter or accuracy).

  With `num_classes`, a dashed line marks chance accuracy 100/num_classes.
  Returns False without matplotlib.
  """
  plt = _pyplot()
  if plt is None:
    return False
  return _save(plt, _accuracy_figure(plt, records, client_names, title=title, kinds=kinds,
                                     num_classes=num_classes), path)


def _accuracy_figure(plt, records: Sequence[Mapping[str, Any]], client_names: Sequence[str], *,
                     title: str, kinds: Sequence[str], num_classes: int | None):
  """The Figure of `plot_accuracy_curves`."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  kinds = sorted(kinds, key=lambda k: {"intra": 0, "inter": 1}.get(k, 2))
  evaluated = [r for r in records if f"eval/{kinds[0]}/{client_names[0]}" in r]
  rounds = [r["round"] for r in evaluated]
  fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.2), sharey=True,
                           squeeze=False, layout="constrained")
  axes = axes[0]
  for ax, kind in zip(axes, kinds):
    if len(client_names) <= MAX_LINES:
      for name in client_names:
        ax.plot(rounds, [r[f"eval/{kind}/{name}"] for r in evaluated], marker=".", lw=1,
                label=name)
    else:  # many participants: the spread over them instead of one line each
      per_round = np.array([[r[f"eval/{kind}/{n}"] for n in client_names] for r in evaluated])
      per_round = per_round.reshape(len(rounds), len(client_names))
      ax.fill_between(rounds, per_round.min(axis=1), per_round.max(axis=1), alpha=0.3,
                      label=f"min-max over {len(client_names)} participants")
    ax.plot(rounds, [r[f"eval/{kind}/mean"] for r in evaluated], "k-", lw=2,
            label="mean over participants")
    if num_classes:
      ax.axhline(100.0 / num_classes, color="grey", ls="--", lw=1,
                 label=f"chance (1/C = {100.0 / num_classes:.3g}%)")
    ax.set_title(ACCURACY_TITLES.get(kind, f"{kind} accuracy"), fontsize=10)
    ax.set_xlabel("communication round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("test accuracy (%)")
  axes[-1].legend(fontsize=8, loc="best")
  if title:
    fig.suptitle(title)
  return fig


def plot_cross_correlation(matrices: Mapping[int, np.ndarray], client_names: Sequence[str],
                           path: pathlib.Path) -> bool:
  """Saves a grid (rounds x participants) of C x C cross-correlation heatmaps.

  `matrices[round]` is (K, C, C): participant k's matrix M_k, M_k[u, v] the
  correlation of its logit u with the participants' mean logit v (see
  `algorithms.common.cross_correlation_diagnostics`). Returns False without
  matplotlib or matrices.
  """
  plt = _pyplot()
  if plt is None or not matrices:
    return False
  return _save(plt, _cross_correlation_figure(plt, matrices, client_names), path)


def _cross_correlation_figure(plt, matrices: Mapping[int, np.ndarray],
                              client_names: Sequence[str]):
  """The Figure of `plot_cross_correlation`."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  rounds = sorted(matrices)
  shown = list(client_names[:MAX_COLUMNS])
  num_classes = np.asarray(matrices[rounds[0]]).shape[-1]
  ticks = (range(num_classes) if num_classes <= 10 else  # class indices, a few when C is large
           [int(t) for t in MaxNLocator(nbins=5, integer=True).tick_values(0, num_classes - 1)
            if 0 <= t < num_classes])
  height = 2.3 * len(rounds) + 1.6
  fig, axes = plt.subplots(len(rounds), len(shown), squeeze=False, layout="constrained",
                           figsize=(max(2.3 * len(shown) + 1.8, 8.5), height))
  fig.get_layout_engine().set(rect=(0, 0.45 / height, 1, 1 - 0.45 / height))  # caption room
  image = None
  for row, r in enumerate(rounds):
    for col, name in enumerate(shown):
      ax = axes[row][col]
      image = ax.imshow(np.asarray(matrices[r][col]), vmin=-1, vmax=1, cmap="RdBu_r")
      ax.set_xticks(ticks)
      ax.set_yticks(ticks)
      ax.tick_params(labelsize=7)
      ax.set_title(f"{name}, round {r}", fontsize=9)
      if col == 0:
        ax.set_ylabel("participant's logit u (class)", fontsize=8)
      if row == len(rounds) - 1:
        ax.set_xlabel("mean logit v (class)", fontsize=8)
  bar = fig.colorbar(image, ax=axes, shrink=0.9)
  bar.set_label("cross-correlation M[u, v]\n(1 on the diagonal = aligned)", fontsize=9)
  more = (f" (first {len(shown)} of {len(client_names)} participants)"
          if len(shown) < len(client_names) else "")
  fig.suptitle("Cross-correlation of each participant's logits with the participants' mean "
               f"logits{more}\non the public batch, round{'s' if len(rounds) > 1 else ''} "
               f"{', '.join(map(str, rounds))}; u, v = logit dimension (class index)",
               fontsize=10)
  fig.text(0.5, 0.05 / height, CROSS_CORRELATION_CAPTION, ha="center", va="bottom", fontsize=8)
  return fig

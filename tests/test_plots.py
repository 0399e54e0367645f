"""Figures explain themselves: axis labels, integer rounds, chance line, colour bar."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_het import plots

matplotlib = pytest.importorskip("matplotlib")
plt = plots._pyplot()  # pylint: disable=protected-access
_accuracy_figure = plots._accuracy_figure  # pylint: disable=protected-access
_cross_correlation_figure = plots._cross_correlation_figure  # pylint: disable=protected-access


def _records(names, kinds, rounds=(2, 4, 6)):
  rng = np.random.default_rng(0)
  records = [{"round": 1, "train/loss": 1.0}]  # a round without evaluation
  for r in rounds:
    record = {"round": r}
    for kind in kinds:
      values = rng.uniform(0, 100, len(names))
      record.update({f"eval/{kind}/{n}": float(v) for n, v in zip(names, values)})
      record[f"eval/{kind}/mean"] = float(values.mean())
    records.append(record)
  return records


def _tick_labels(ax):
  ax.figure.canvas.draw()
  return [t.get_text().replace("\u2212", "-") for t in ax.get_xticklabels() if t.get_text()]


def test_accuracy_figure_has_integer_rounds_labels_titles_and_chance_line():
  names = ["mnist", "usps"]
  fig = _accuracy_figure(plt, _records(names, ("intra", "inter")), names, title="run",
                         kinds=("inter", "intra"), num_classes=10)
  axes = fig.axes
  assert [("intra" in a.get_title(), "inter" in a.get_title()) for a in axes] == [
      (True, False), (False, True)]
  assert "own domain" in axes[0].get_title() and "other domains" in axes[1].get_title()
  for ax in axes:
    labels = _tick_labels(ax)
    assert labels and all(label.lstrip("-").isdigit() for label in labels), labels
    assert ax.get_xlabel() == "communication round"
    chance = [line for line in ax.get_lines() if line.get_label().startswith("chance")]
    assert len(chance) == 1 and chance[0].get_linestyle() == "--"
    assert np.allclose(chance[0].get_ydata(), 10.0)
  assert axes[0].get_ylabel() == "test accuracy (%)"
  legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
  assert {"mnist", "usps", "mean over participants"} <= set(legend)
  assert fig.get_suptitle() == "run"
  plt.close(fig)


def test_accuracy_without_num_classes_has_no_chance_line_and_plain_title():
  names = ["a", "b"]
  fig = _accuracy_figure(plt, _records(names, ("accuracy",)), names, title="",
                         kinds=("accuracy",), num_classes=None)
  (ax,) = fig.axes
  assert ax.get_title() == "test accuracy"
  assert not [line for line in ax.get_lines() if line.get_label().startswith("chance")]
  plt.close(fig)


def test_many_clients_draw_a_mean_and_a_band_not_one_legend_entry_each(tmp_path):
  names = [str(i) for i in range(100)]
  records = _records(names, ("accuracy",))
  fig = _accuracy_figure(plt, records, names, title="", kinds=("accuracy",),
                         num_classes=100)
  (ax,) = fig.axes
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert len(legend) <= 4, legend
  assert any("min-max over 100" in t for t in legend)
  assert len(ax.get_lines()) == 2  # the mean and the chance line
  plt.close(fig)
  assert plots.plot_accuracy_curves(records, names, tmp_path / "accuracy.png",
                                    kinds=("accuracy",), num_classes=100)
  assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_cross_correlation_figure_labels_axes_ticks_colour_bar_and_caption(tmp_path):
  names, num_classes = ["mnist", "usps", "svhn"], 10
  eye = np.broadcast_to(np.eye(num_classes), (len(names), num_classes, num_classes))
  matrices = {1: np.zeros_like(eye), 5: eye.copy()}
  fig = _cross_correlation_figure(plt, matrices, names)
  fig.canvas.draw()
  panels = [a for a in fig.axes if a.get_images()]
  assert len(panels) == 6
  assert {a.get_title() for a in panels} == {f"{n}, round {r}" for n in names for r in (1, 5)}
  for ax in panels:
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in range(num_classes)]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in range(num_classes)]
  assert all(a.get_ylabel() for a in panels[::3]) and all(a.get_xlabel() for a in panels[3:])
  (bar_axes,) = [a for a in fig.axes if not a.get_images()]
  assert "cross-correlation" in bar_axes.get_ylabel()
  assert "rounds 1, 5" in fig.get_suptitle()
  assert any("pulls the diagonal to 1 (red)" in t.get_text() and "toward -1 (blue)" in t.get_text()
             for t in fig.texts)
  plt.close(fig)
  assert plots.plot_cross_correlation(matrices, names, tmp_path / "cc.png")
  assert (tmp_path / "cc.png").stat().st_size > 0


def test_cross_correlation_with_many_classes_and_participants_stays_readable():
  names = [str(i) for i in range(30)]
  matrices = {3: np.zeros((30, 100, 100))}
  fig = _cross_correlation_figure(plt, matrices, names)
  fig.canvas.draw()
  panels = [a for a in fig.axes if a.get_images()]
  assert len(panels) == plots.MAX_COLUMNS
  assert "first 10 of 30" in fig.get_suptitle()
  labels = [t.get_text() for t in panels[0].get_xticklabels() if t.get_text()]
  assert 2 <= len(labels) <= 8 and all(label.isdigit() for label in labels), labels
  plt.close(fig)

"""Class-incremental metrics and GLFC's Table 1 layout (NumPy, float64, outside jit).

The record: after each task i, the global model is evaluated on the test
examples of every class and the per-class counts of correct top-1 predictions
(restricted to the seen classes, `masking.masked_class_counts`) are stored,
one row per task. From it:

  * `accuracy_matrix(correct, total, classes_per_task)`: a[i, j], the
    accuracy on task j's classes after task i (NaN for j > i: not learned
    yet), and the accuracy on all classes seen after task i, the number GLFC
    reports per task ("10, 20, ..., 100" columns of Table 1). Accuracies are
    example-weighted (correct / total over the classes involved), as the
    authors' code computes them on the test set of classes [0, seen).
  * `average_incremental_accuracy(seen_accuracy)`: the mean over tasks of the
    all-seen accuracy, the "Avg." column of GLFC Tables 1-4 [iCaRL's average
    incremental accuracy]. (Check: GLFC's Table 1 row "Ours" averages to
    66.92 -> 66.9.)
  * `forgetting(per_task)`: average forgetting, the forgetting measure of
    [Chaudhry et al. 2018]: after the last task T-1, f_j = max_{i in
    [j, T-2]} a[i, j] - a[T-1, j] for every old task j < T-1, averaged over
    j. GLFC reports no forgetting number; this is the usual companion
    metric.
  * `table1_header`, `table1_row`: GLFC Table 1 as markdown (percent, one
    decimal, "Avg." last).

Accuracies are fractions in [0, 1] everywhere; only the table prints percent.

References:
  [GLFC] J. Dong et al. Federated Class-Incremental Learning. CVPR 2022.
  [iCaRL] S.-A. Rebuffi et al. iCaRL: Incremental Classifier and
    Representation Learning. CVPR 2017.
  [Chaudhry et al. 2018] A. Chaudhry, P. K. Dokania, T. Ajanthan, P. H. S.
    Torr. Riemannian Walk for Incremental Learning: Understanding Forgetting
    and Intransigence. ECCV 2018.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class AccuracyMatrix(NamedTuple):
  """Accuracies of a class-incremental run (fractions in [0, 1], float64).

  Attributes:
    per_task: (R, T): [i, j] = accuracy on task j's classes after task i; NaN
      for j > i. R = T for a finished run (R < T: the rows recorded so far).
    seen: (R,): accuracy on all classes seen after task i.
  """
  per_task: np.ndarray
  seen: np.ndarray


def _check_k(classes_per_task) -> int:
  if not isinstance(classes_per_task, (int, np.integer)) or isinstance(classes_per_task, bool) \
      or classes_per_task < 1:
    raise ValueError(f"`classes_per_task` must be an integer >= 1, got {classes_per_task!r}.")
  return int(classes_per_task)


def _check_fractions(name: str, values: np.ndarray) -> None:
  if values.size and (not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1):
    raise ValueError(f"`{name}` must hold finite accuracies as fractions in [0, 1] (percent "
                     f"values: divide by 100), got values in [{np.nanmin(values)}, "
                     f"{np.nanmax(values)}].")


def accuracy_matrix(correct, total, classes_per_task: int) -> AccuracyMatrix:
  """Per-task and all-seen accuracies from per-class counts.

  Args:
    correct: (R, C) non-negative counts; row i = correct test predictions per
      true class after task i (class-order indices). Columns of classes not
      yet seen are ignored.
    total: (C,) or (R, C) test examples per class (>= correct).
    classes_per_task: k; C must be a multiple of k (T = C // k tasks).

  Returns:
    AccuracyMatrix; an entry whose classes have no test example is NaN.

  Raises:
    ValueError: bad shapes, negative counts, correct > total, or more rows
      than tasks.
  """
  k = _check_k(classes_per_task)
  correct = np.asarray(correct, dtype=np.float64)
  total = np.asarray(total, dtype=np.float64)
  if correct.ndim != 2:
    raise ValueError(f"`correct` must have shape (tasks_done, num_classes), got "
                     f"{correct.shape}.")
  rows, num_classes = correct.shape
  if num_classes % k:
    raise ValueError(f"`correct` has {num_classes} classes, not a multiple of "
                     f"`classes_per_task`={k}.")
  num_tasks = num_classes // k
  if rows > num_tasks:
    raise ValueError(f"`correct` has {rows} rows (tasks done) but {num_classes} classes make "
                     f"only {num_tasks} tasks of {k}.")
  if total.shape not in ((num_classes,), (rows, num_classes)):
    raise ValueError(f"`total` must have shape ({num_classes},) or {correct.shape}, got "
                     f"{total.shape}.")
  total = np.broadcast_to(total, correct.shape)
  if np.any(correct < 0) or np.any(total < 0) or np.any(correct > total):
    raise ValueError("`correct` and `total` must be non-negative counts with correct <= total.")
  by_task_correct = correct.reshape(rows, num_tasks, k).sum(axis=-1)
  by_task_total = total.reshape(rows, num_tasks, k).sum(axis=-1)
  learned = np.arange(num_tasks)[None, :] <= np.arange(rows)[:, None]
  with np.errstate(invalid="ignore", divide="ignore"):
    per_task = np.where(learned & (by_task_total > 0), by_task_correct / by_task_total, np.nan)
    seen_correct = np.where(learned, by_task_correct, 0).sum(axis=1)
    seen_total = np.where(learned, by_task_total, 0).sum(axis=1)
    seen = np.where(seen_total > 0, seen_correct / seen_total, np.nan)
  return AccuracyMatrix(per_task=per_task, seen=seen)


def average_incremental_accuracy(seen_accuracy) -> float:
  """Mean over tasks of the all-seen accuracy (GLFC's "Avg."), a fraction.

  Args:
    seen_accuracy: (T,) fractions in [0, 1], e.g. `AccuracyMatrix.seen`.
  """
  seen = np.asarray(seen_accuracy, dtype=np.float64)
  if seen.ndim != 1 or seen.size == 0:
    raise ValueError(f"`seen_accuracy` must be a non-empty 1-D sequence, got shape "
                     f"{seen.shape}.")
  _check_fractions("seen_accuracy", seen)
  return float(seen.mean())


def forgetting(per_task) -> float:
  """Average forgetting after the last recorded task [Chaudhry et al. 2018].

  f_j = max_{i in [j, R-2]} a[i, j] - a[R-1, j] for each old task j < R-1
  (R rows), averaged over j. Positive: accuracy lost on old tasks.

  Args:
    per_task: (R, T) accuracy matrix (`AccuracyMatrix.per_task`), R >= 2;
      entries with j <= i must be finite fractions.

  Raises:
    ValueError: fewer than 2 rows (no old task), or a NaN where j <= i.
  """
  a = np.asarray(per_task, dtype=np.float64)
  if a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < a.shape[0]:
    raise ValueError(f"`per_task` must have shape (R, T) with 2 <= R <= T (forgetting needs an "
                     f"old task), got {a.shape}.")
  last = a.shape[0] - 1
  old = a[:, :last]
  lower = np.tril(np.ones(old.shape, bool))  # j <= i
  _check_fractions("per_task (entries j <= i)", old[lower])
  best = np.max(np.where(lower[:last], old[:last], -np.inf), axis=0)
  return float(np.mean(best - old[last]))


def _columns(num_tasks: int, classes_per_task: int) -> list[str]:
  return [str((i + 1) * classes_per_task) for i in range(num_tasks)]


def table1_header(num_tasks: int, classes_per_task: int, *, method: str = "Methods") -> str:
  """The header and alignment lines of `table1_row`'s markdown table."""
  if not isinstance(num_tasks, (int, np.integer)) or isinstance(num_tasks, bool) or (
      num_tasks < 1):
    raise ValueError(f"`num_tasks` must be an integer >= 1, got {num_tasks!r}.")
  k = _check_k(classes_per_task)
  columns = [method] + _columns(int(num_tasks), k) + ["Avg."]
  return ("| " + " | ".join(columns) + " |\n|" + "---|" + "---:|" * (len(columns) - 1))


def table1_row(method: str, seen_accuracy: Sequence[float], classes_per_task: int, *,
               decimals: int = 1) -> str:
  """One markdown row of GLFC Table 1: accuracy after each task, then "Avg.".

  The columns are the numbers of seen classes k, 2k, ..., T*k (see
  `table1_header`); values are percent with `decimals` decimals; "Avg." is
  `average_incremental_accuracy` of the unrounded values.

  Args:
    method: the row label.
    seen_accuracy: (T,) all-seen accuracies, fractions in [0, 1].
    classes_per_task: k (only checked here; it names the header columns).
    decimals: digits after the point (>= 0).

  Returns:
    e.g. "| GLFC | 90.0 | 82.3 | ... | 66.9 |".
  """
  if not isinstance(method, str) or not method or "|" in method or "\n" in method:
    raise ValueError(f"`method` must be a non-empty string without '|' or newlines, got "
                     f"{method!r}.")
  _check_k(classes_per_task)
  if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, bool) or decimals < 0:
    raise ValueError(f"`decimals` must be an integer >= 0, got {decimals!r}.")
  average = average_incremental_accuracy(seen_accuracy)  # validates
  values = list(np.asarray(seen_accuracy, dtype=np.float64)) + [average]
  return "| " + " | ".join([method] + [f"{100 * v:.{int(decimals)}f}" for v in values]) + " |"

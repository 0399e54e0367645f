"""Class-incremental report (GLFC): accuracy after each task, Avg. and forgetting.

The metrics (`fedjax_het.cil.metrics`, re-exported here): after each task i the
global model's accuracy on task j's classes, a[i, j], and on all classes seen
so far, seen[i]; the average incremental accuracy Avg. = mean_i seen[i]
(GLFC's "Avg."); the average forgetting after the last task T-1,
mean over old tasks j < T-1 of (max_{i in [j, T-2]} a[i, j] - a[T-1, j]).
Accuracies are fractions in [0, 1]; the tables print percent with one decimal,
as GLFC does.

One run: `run_table` is results.md's GLFC Table 1 row (from the task-end
records' per-class counts). Over seeds: `summarize` gives mean ± sample std
(ddof=1) of every column over the seeds that finished, and `render_setting`
lays the rows out with the paper's row beneath each, then pairs every row with
GLFC seed by seed (`seed_by_seed`: each seed draws the same stream for every
method): its Avg. and forgetting minus GLFC's on each seed and the verdict,
above or below GLFC on every seed or changing sign (`common.seed_verdict`).
Nothing here trains or reads files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedjax_het.cil.metrics import (accuracy_matrix, average_incremental_accuracy, forgetting,
                                    table1_header, table1_row)
from fedjax_het.errors import ConfigError
from fedjax_het.reports import common

#: Row labels of GLFC Table 1's methods.
METHOD_LABELS = {"fedavg_cil": "FedAvg (fine-tuning)", "glfc": "GLFC", "icarl_fl": "iCaRL + FL",
                 "ssil_fl": "SS-IL + FL", "bic_fl": "BiC + FL", "podnet_fl": "PODNet + FL",
                 "dde_icarl_fl": "DDE + iCaRL + FL", "geodl_icarl_fl": "GeoDL + iCaRL + FL"}


def method_label(config: Any) -> str:
  """A class-incremental config's row label (GLFC without its proxy is marked)."""
  label = METHOD_LABELS.get(config.algorithm, config.algorithm)
  if config.algorithm == "glfc" and config.glfc.old_model != "proxy":
    label += f" (no proxy: old model = {config.glfc.old_model})"
  if config.algorithm == "glfc" and not config.glfc.get("use_gradient_compensation", True):
    label += " (w/o CGC)"
  if config.algorithm == "glfc" and not config.glfc.get("use_relation_distillation", True):
    label += " (w/o CRD)"
  return label


def run_table(records: list[dict[str, Any]], num_tasks: int, k: int,
              label: str) -> tuple[str, dict[str, Any]]:
  """GLFC Table 1 (markdown) and the numbers of one run, from its task-end records.

  Args:
    records: the run's metrics records; a task-end record holds
      "eval/class_correct" and "eval/class_total" (per class) and "task".
    num_tasks: the stream's tasks.
    k: classes per task.
    label: the row label.

  Returns:
    (markdown, {"method", "tasks_done", "classes_per_task", "seen_accuracy"
    (fractions per task done), "average_incremental_accuracy", "forgetting"
    (None before the second task), "per_task_accuracy", "class_correct",
    "class_total", "rounds"}); ("(no task finished)", {"tasks_done": n}) when
    no task (or not the first tasks in order) finished.
  """
  ends = {int(r["task"]): r for r in records if "eval/class_correct" in r}
  done = [t for t in range(num_tasks) if t in ends]
  if done != list(range(len(done))) or not done:
    return "(no task finished)", {"tasks_done": len(done)}
  correct = np.array([ends[t]["eval/class_correct"] for t in done], np.int64)
  total = np.array([ends[t]["eval/class_total"] for t in done], np.int64)
  matrix = accuracy_matrix(correct, total, k)
  numbers: dict[str, Any] = {
      "method": label, "tasks_done": len(done), "classes_per_task": k,
      "seen_accuracy": [float(a) for a in matrix.seen],
      "average_incremental_accuracy": average_incremental_accuracy(matrix.seen),
      "forgetting": forgetting(matrix.per_task) if len(done) >= 2 else None,
      "per_task_accuracy": [[None if np.isnan(a) else float(a) for a in row]
                            for row in matrix.per_task],
      "class_correct": correct.tolist(), "class_total": total.tolist(),
      "rounds": [int(ends[t]["round"]) for t in done]}
  table = f"{table1_header(len(done), k)}\n{table1_row(label, matrix.seen, k)}"
  if numbers["forgetting"] is not None:
    table += f"\n\nAverage forgetting: {100 * numbers['forgetting']:.1f} (percentage points)."
  return table, numbers


def summarize(results: Mapping[str, Mapping[int, Mapping[str, Any]]], *, num_tasks: int,
              classes_per_task: int) -> dict[str, Any]:
  """Mean and std over seeds of each row's Table 1 numbers.

  Args:
    results: {row: {seed: its results.json numbers ("seen_accuracy" fractions
      per task, "average_incremental_accuracy", "forgetting",
      "classes_per_task", "method")}}, rows in table order (a row with no seed
      is left out).
    num_tasks: the shared number of tasks (the table's columns).
    classes_per_task: the shared classes per task.

  Returns:
    {"num_tasks", "classes_per_task", "columns": [k, 2k, ..., T*k],
     "rows_done": [...], "rows": {row: {"method": the runs' method label,
     "seeds": [...], "seen_accuracy": [stat per task],
     "average_incremental_accuracy": stat, "forgetting": stat or None}}};
     stats as `common.seed_stat` (fractions; "std" ddof=1, None with one seed).

  Raises:
    ConfigError: a run whose numbers do not have the shared layout.
  """
  rows: dict[str, Any] = {}
  for name, per_seed in results.items():
    if not per_seed:
      continue
    seeds = sorted(int(s) for s in per_seed)
    for seed in seeds:
      numbers = per_seed[seed]
      got = (len(numbers.get("seen_accuracy", [])), numbers.get("classes_per_task"))
      if got != (num_tasks, classes_per_task):
        raise ConfigError(f"{name} seed {seed}: its results cover {got[0]} task(s) of "
                          f"{got[1]} classes, not the table's {num_tasks} tasks of "
                          f"{classes_per_task} classes.")

    def stat(values: Sequence[float], seeds=seeds) -> dict[str, Any]:
      return common.seed_stat(dict(zip(seeds, map(float, values))))

    seen = np.array([per_seed[s]["seen_accuracy"] for s in seeds], np.float64)
    lost = [per_seed[s].get("forgetting") for s in seeds]
    rows[name] = {
        "method": str(per_seed[seeds[0]].get("method", name)), "seeds": seeds,
        "seen_accuracy": [stat(seen[:, t]) for t in range(num_tasks)],
        "average_incremental_accuracy": stat(
            [per_seed[s]["average_incremental_accuracy"] for s in seeds]),
        "forgetting": None if any(f is None for f in lost) else stat(lost)}
  return {"num_tasks": num_tasks, "classes_per_task": classes_per_task,
          "columns": [(t + 1) * classes_per_task for t in range(num_tasks)],
          "rows_done": list(rows), "rows": rows}


def layout(results: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> tuple[int, int] | None:
  """(num_tasks, classes per task) of the first finished run, None without one."""
  for per_seed in results.values():
    for numbers in per_seed.values():
      return len(numbers["seen_accuracy"]), int(numbers["classes_per_task"])
  return None


def format_fraction(stat: Mapping[str, Any] | None) -> str:
  """A fraction's mean ± std as GLFC prints it: percent, one decimal; "–" without it."""
  if stat is None:
    return "–"
  std = None if stat["std"] is None else 100 * stat["std"]
  return common.format_cell(100 * stat["mean"], std, digits=1)


def markdown_table(summary: Mapping[str, Any], rows: Sequence[tuple[str, str]],
                   paper: Mapping[str, Mapping[str, Any]], *, show_diff: bool,
                   source: str = "paper") -> str:
  """GLFC Table 1: rows, n, classes seen after each task, Avg., forgetting; under each
  row the paper's row where it prints one (and with `show_diff` Avg. − paper)."""
  columns = [str(c) for c in summary["columns"]]
  header = ["method", "n", *columns, "Avg.", "Forgetting"] + (
      ["Avg. − paper"] if show_diff else [])
  lines = [common.markdown_row(header), "|---|---|" + "---:|" * (len(header) - 2)]
  for key, label in rows:
    row = summary["rows"].get(key)
    printed = paper.get(key)
    if row is None:
      cells = [label, "0"] + ["–"] * (len(columns) + 2)
    else:
      cells = ([label, str(len(row["seeds"]))]
               + [format_fraction(s) for s in row["seen_accuracy"]]
               + [format_fraction(row["average_incremental_accuracy"]),
                  format_fraction(row["forgetting"])])
    # A paper row of the first n < T tasks (GLFC Table 3 prints 10 of 20) stands under the
    # first n columns and is compared with the mean of the runs' first n tasks.
    prefix = bool(printed) and len(printed["seen"]) < len(columns) and all(
        int(c) == (t + 1) * int(columns[0]) for t, c in enumerate(columns))
    if show_diff:
      if row is not None and printed and prefix:
        first = row["seen_accuracy"][:len(printed["seen"])]
        mean = 100 * float(np.mean([stat["mean"] for stat in first]))
        cells.append(f"{mean - printed['avg']:+.1f}")
      else:
        cells.append(f"{100 * row['average_incremental_accuracy']['mean'] - printed['avg']:+.1f}"
                     if row is not None and printed else "")
    lines.append(common.markdown_row(cells))
    if printed:
      seen = list(printed["seen"]) if len(printed["seen"]) == len(columns) else []
      padded = ([f"{v:.1f}" for v in printed["seen"]]
                + [""] * (len(columns) - len(printed["seen"]))) if prefix else []
      paper_cells = ([f"↳ {source}", ""] + ([f"{v:.1f}" for v in seen] or padded or
                                            ["(other layout)"] + [""] * (len(columns) - 1))
                     + [f"{printed['avg']:.1f}", "–"] + ([""] if show_diff else []))
      lines.append(common.markdown_row(paper_cells))
  return "\n".join(lines)


#: The row the others are read against seed by seed when the table names no base: GLFC, the
#: paper's method.
REFERENCE = "glfc"
#: The quantities compared seed by seed (percent of `seed_values`).
SEED_KIND_LABELS = {"avg": "Avg.", "forgetting": "Forgetting"}


def seed_values(summary: Mapping[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
  """{row: {"avg": {seed: Avg.}, "forgetting": {seed: forgetting}}} in percent, of
  `summarize`'s output (no "forgetting" for a row without it)."""
  out: dict[str, dict[str, dict[int, float]]] = {}
  for row, numbers in summary["rows"].items():
    out[row] = {"avg": {s: 100 * v for s, v in
                        numbers["average_incremental_accuracy"]["per_seed"].items()}}
    if numbers["forgetting"] is not None:
      out[row]["forgetting"] = {s: 100 * v for s, v in numbers["forgetting"]["per_seed"].items()}
  return out


def seed_by_seed(summary: Mapping[str, Any], rows: Sequence[str],
                 reference: str = REFERENCE) -> dict[str, Any] | None:
  """Every row's Avg. and forgetting minus the reference row's on each seed both finished
  (percentage points), with their verdicts (`common.seed_comparison`); None without a
  reference row with a finished seed. Each seed draws the same class order, clients and
  stream for every method, so the pairing is meaningful."""
  if reference not in summary["rows"]:
    return None
  return common.seed_comparison(seed_values(summary), reference, rows, tuple(SEED_KIND_LABELS))


def render_setting(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
                   *, show_diff: bool) -> tuple[str, dict[str, Any]]:
  """A setting's Table 1 and its numbers.

  Args:
    table: the `tables.Table`.
    setting: its `tables.Setting` (paper: {row: {"seen", "avg"}} in percent).
    cells: {row: {seed: {"results", ...}}} of the finished cells.
    show_diff: the runs are in the paper's setting (adds Avg. − paper).
  """
  results = {r.key: {s: c["results"] for s, c in cells.get(r.key, {}).items()}
             for r in setting.rows}
  found = layout(results)
  if found is None:
    tasks = len(next(iter(setting.paper.values()))["seen"]) if setting.paper else 0
    summary = {"num_tasks": tasks, "classes_per_task": 100 // tasks if tasks else 0,
               "columns": [(t + 1) * (100 // tasks) for t in range(tasks)],
               "rows_done": [], "rows": {}}
  else:
    summary = summarize(results, num_tasks=found[0], classes_per_task=found[1])
  text = (f"Accuracy (%) on all classes seen after each task ({summary['num_tasks']} tasks of "
          f"{summary['classes_per_task']} classes); Avg. = average incremental accuracy (mean "
          "over tasks); Forgetting = average forgetting after the last task (percentage "
          "points).")
  source = f"paper ({table.paper.split(' (')[0]} {table.source})"
  body = markdown_table(summary, [(r.key, r.label) for r in setting.rows], setting.paper,
                        show_diff=show_diff, source=source)
  numbers: dict[str, Any] = {"summary": summary, "paper": dict(setting.paper)}
  comparison = seed_by_seed(summary, [r.key for r in setting.rows], table.base or REFERENCE)
  if comparison is not None:
    labels = {r.key: r.label for r in setting.rows}
    reference = common.short_label(labels.get(comparison["reference"],
                                              comparison["reference"]))
    body += (f"\n\nSeed by seed against {reference} (each seed draws the same stream for every "
             f"method): Avg. and forgetting minus {reference}'s on each seed both rows "
             "finished, in percentage points; a tie (0.00) has no sign, and fewer than 2 "
             "paired seeds give no verdict\n\n"
             + common.seed_table(comparison, labels, kind_labels=SEED_KIND_LABELS,
                                 reference_label=reference))
    numbers["seed_by_seed"] = comparison
  return f"{text}\n\n{body}\n", numbers


def plot_seen_accuracy(curves: Any, path: Any, title: str) -> bool:
  """Accuracy on the seen classes vs classes seen: one line per (label, x, per_seed).

  `per_seed` is (seeds, tasks) in percent: the mean is drawn, with the
  min-max band when there are several seeds. Returns False (nothing written)
  without matplotlib.
  """
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  if plt is None:
    return False
  fig, ax = plt.subplots(figsize=(6, 4.4), layout="constrained")
  for label, x, per_seed in curves:
    per_seed = np.atleast_2d(np.asarray(per_seed, np.float64))
    line, = ax.plot(x, per_seed.mean(axis=0), "o-", label=label)
    if len(per_seed) > 1:
      ax.fill_between(x, per_seed.min(axis=0), per_seed.max(axis=0), alpha=0.2,
                      color=line.get_color())
    ax.set_xticks(x)
  ax.set_xlabel("number of classes seen")
  ax.set_ylabel("test accuracy on seen classes (%)")
  ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(title, fontsize=9)
  return plots._save(plt, fig, path)  # pylint: disable=protected-access


def figure(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
           path: Any, *, title: str) -> bool:
  """accuracy vs classes seen, a line per row (mean over seeds, min-max band)."""
  del table
  curves = []
  for row in setting.rows:
    per_seed = cells.get(row.key, {})
    if not per_seed:
      continue
    first = next(iter(per_seed.values()))["results"]
    k = int(first["classes_per_task"])
    x = [(t + 1) * k for t in range(len(first["seen_accuracy"]))]
    curves.append((row.label, x, [[100 * a for a in c["results"]["seen_accuracy"]]
                                  for c in per_seed.values()]))
  return bool(curves) and plot_seen_accuracy(curves, path, title)

"""Domain-shift report (FCCL / FCCL+ scenarios): inter- and intra-domain accuracy.

One run: `run_table` is results.md's table (per participant and AVG, each the
mean of the run's last `config.eval.last_rounds` evaluated rounds).

Over seeds: a cell's numbers are its `results.json`,
  {"inter": {<participant>: acc, ..., "AVG": acc}, "intra": {...}, ...}
(percent). `summarize` gives per (row, kind, column) the mean and the sample
standard deviation (ddof=1) over the seeds that finished (the mean alone with
one seed), and Δ vs BASE: a row's AVG (mean over seeds) minus the base row's
(BASE = solo in the papers). `render_setting` lays a setting out as the papers
do: rows = methods, columns = participants, AVG, Δ vs BASE, with the paper's
number beside each cell (beside our Δ, the Δ the paper prints, never one
computed from its AVGs; none where it prints none), and, in the paper's
setting, AVG minus the paper's AVG. Below the tables, `seed_by_seed` pairs every
row with BASE seed by seed (each seed draws the same data for every method):
its AVG minus BASE's on each seed and the verdict, above or below BASE on
every seed or changing sign (`common.seed_verdict`).
Nothing here trains or reads files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het.reports import common
from fedjax_het.reports import paper_numbers

KINDS = ("inter", "intra")
KIND_LABELS = {"inter": "inter →", "intra": "intra ↩"}

#: One run's per-participant table (results.md), shared with the partitioned family.
run_table = common.results_table


def summarize(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], *,
              kinds: Sequence[str] = KINDS, base: str | None = "solo",
              domains: Sequence[str] = ()) -> dict[str, Any]:
  """Mean and std over seeds per (row, kind, column), and Δ vs BASE.

  Args:
    cells: {row: {seed: results.json numbers}}; rows in table order (a row
      with no finished seed is left out of "rows").
    kinds: the accuracy kinds (table sections).
    base: the row of Δ vs BASE (None, or absent from `cells`: no Δ).
    domains: the preferred column order (the paper's); participants the
      results have beyond them follow in their own order.

  Returns:
    {"columns": [participants..., "AVG"], "rows_done": [...], "seeds": {row:
     [...]}, "rows": {row: {kind: {column: {"mean", "std" (None with one
     seed), "n", "per_seed": {seed: acc}}}}}, "delta": {row: {kind: AVG mean -
     base's}} (empty without the base row)}.
  """
  rows_done = [r for r in cells if cells[r]]
  found: list[str] = []
  for row in rows_done:
    for numbers in cells[row].values():
      for name in numbers.get(kinds[0], {}):
        if name != "AVG" and name not in found:
          found.append(name)
  columns = [d for d in domains if d in found] + [d for d in found if d not in domains]
  columns.append("AVG")
  rows: dict[str, Any] = {}
  for row in rows_done:
    rows[row] = {}
    for kind in kinds:
      rows[row][kind] = {}
      for column in columns:
        per_seed = {int(seed): float(numbers[kind][column])
                    for seed, numbers in sorted(cells[row].items())
                    if column in numbers.get(kind, {})}
        if per_seed:
          rows[row][kind][column] = common.seed_stat(per_seed)
  delta: dict[str, Any] = {}
  if base is not None and base in rows:
    for row in rows_done:
      delta[row] = {kind: rows[row][kind]["AVG"]["mean"] - rows[base][kind]["AVG"]["mean"]
                    for kind in kinds
                    if "AVG" in rows[row][kind] and "AVG" in rows[base][kind]}
  return {"columns": columns, "rows_done": rows_done,
          "seeds": {r: sorted(int(s) for s in cells[r]) for r in rows_done},
          "rows": rows, "delta": delta}


def seed_values(summary: Mapping[str, Any], kinds: Sequence[str] = KINDS
                ) -> dict[str, dict[str, dict[int, float]]]:
  """{row: {kind: {seed: AVG}}} of `summarize`'s output: each finished seed's AVG."""
  return {row: {kind: dict(per_kind[kind]["AVG"]["per_seed"]) for kind in kinds
                if "AVG" in per_kind.get(kind, {})}
          for row, per_kind in summary["rows"].items()}


def seed_by_seed(summary: Mapping[str, Any], rows: Sequence[str], base: str | None,
                 kinds: Sequence[str] = KINDS) -> dict[str, Any] | None:
  """Every row's AVG minus the base row's on each seed both finished, per kind, with its
  verdict (`common.seed_comparison`); None without a base row with a finished seed.

  Each seed draws the same private and public data for every method, so the pairing is
  meaningful: "above BASE on every seed" is a statement about the runs, not about the means.
  """
  if base is None or base not in summary["rows"]:
    return None
  return common.seed_comparison(seed_values(summary, kinds), base, rows, kinds)


def markdown_table(summary: Mapping[str, Any], kind: str, *, rows: Sequence[tuple[str, str]],
                   paper: Mapping[str, Mapping[str, float]], base: str | None,
                   domains: Sequence[str], show_diff: bool,
                   row_sources: Mapping[str, str] | None = None,
                   paper_delta: Mapping[str, float] | None = None) -> str:
  """One kind's table.

  Args:
    summary: `summarize`'s output.
    kind: "inter" or "intra".
    rows: (row key, label) of every row of the table, run or not, in order.
    paper: {row: {column: the paper's number}} for this kind.
    base: the base row (Δ vs BASE column when the paper or the grid has it).
    domains: the paper's participants: its AVG is shown only when the
      columns are exactly these.
    show_diff: add "AVG − paper" (the runs are in the paper's setting).
    row_sources: {row: text} where a row's paper numbers have their own source.
    paper_delta: {row: the Δ vs BASE the paper prints} for this kind; a row
      without one (or None: the paper prints no Δ) shows our Δ alone.

  Returns:
    The markdown table: row, n, participants, AVG, [Δ vs BASE], [AVG − paper],
    [paper note]; each cell "mean ± std (paper p)", "–" for a row with no
    finished seed.
  """
  columns = summary["columns"] if summary["rows_done"] else [*domains, "AVG"]
  full = tuple(columns[:-1]) == tuple(domains)
  with_delta = base is not None and any(r == base for r, _ in rows)
  sources = {r: s for r, s in (row_sources or {}).items() if s}
  header = ["method", "n", *columns] + (["Δ vs BASE"] if with_delta else []) + (
      ["AVG − paper"] if show_diff else []) + (["paper's row"] if sources else [])
  lines = [common.markdown_row(header), common.markdown_rule(len(header))]
  paper_delta = paper_delta or {}
  for key, label in rows:
    numbers = summary["rows"].get(key, {}).get(kind, {})
    printed = paper.get(key, {})
    n = max((s["n"] for s in numbers.values()), default=0)
    cells = [label, str(n)]
    for column in columns:
      reference = printed.get(column) if (column != "AVG" or full) else None
      if column in numbers:
        cells.append(common.format_cell(numbers[column]["mean"], numbers[column]["std"],
                                        reference))
      else:
        cells.append("–" if reference is None else f"– (paper {reference:.2f})")
    if with_delta:
      printed_delta = paper_delta.get(key) if full else None
      if key == base:
        cells.append("-")
      elif kind in summary["delta"].get(key, {}):
        cells.append(common.format_delta(summary["delta"][key][kind], printed_delta))
      else:
        cells.append("–" if printed_delta is None else f"– (paper {printed_delta:+.2f})")
    if show_diff:
      ours = numbers.get("AVG")
      cells.append(f"{ours['mean'] - printed['AVG']:+.2f}"
                   if ours and full and "AVG" in printed else "")
    if sources:
      cells.append(sources.get(key, ""))
    lines.append(common.markdown_row(cells))
  return "\n".join(lines)


def render_setting(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
                   *, show_diff: bool) -> tuple[str, dict[str, Any]]:
  """A setting's sections (one per kind of `table.kinds`) and their numbers.

  Args:
    table: the `tables.Table`.
    setting: its `tables.Setting`.
    cells: {row: {seed: {"results": results.json, ...}}} of the finished cells.
    show_diff: the runs are in the paper's setting (adds AVG − paper).

  Returns:
    (markdown, {"summary", "paper"[, "seed_by_seed"][, "paper_delta"]}):
    "seed_by_seed" is `seed_by_seed`'s comparison with BASE (the markdown's
    last section), where the table has a BASE row with a finished seed;
    "paper_delta" is the setting's printed Δ vs BASE, {kind: {row: Δ}}, where
    the paper prints one.
  """
  domains = paper_numbers.DOMAINS.get(setting.scenario, ())
  results = {r.key: {s: c["results"] for s, c in cells.get(r.key, {}).items()}
             for r in setting.rows}
  summary = summarize(results, kinds=table.kinds, base=table.base, domains=domains)
  parts = []
  for kind in table.kinds:
    source = table.kind_sources.get(kind, f"{table.paper.split(' (')[0]} {table.source}")
    parts += [f"{KIND_LABELS.get(kind, kind)} (paper: {source})", "",
              markdown_table(summary, kind, rows=[(r.key, r.label) for r in setting.rows],
                             paper=setting.paper.get(kind, {}), base=table.base,
                             domains=domains, show_diff=show_diff,
                             row_sources={r.key: r.source for r in setting.rows},
                             paper_delta=setting.paper_delta.get(kind, {})), ""]
  numbers: dict[str, Any] = {"summary": summary, "paper": dict(setting.paper)}
  comparison = seed_by_seed(summary, [r.key for r in setting.rows], table.base, table.kinds)
  if comparison is not None:
    labels = {r.key: r.label for r in setting.rows}
    reference = common.short_label(labels[table.base])
    parts += [f"Seed by seed against {reference} (each seed draws the same data for every "
              f"method): AVG minus {reference}'s AVG on each seed both rows finished; a tie "
              "(0.00) has no sign, and fewer than 2 paired seeds give no verdict", "",
              common.seed_table(comparison, labels, kind_labels=KIND_LABELS,
                                reference_label=reference), ""]
    numbers["seed_by_seed"] = comparison
  if setting.paper_delta:
    numbers["paper_delta"] = {kind: dict(rows) for kind, rows in setting.paper_delta.items()}
  return "\n".join(parts).rstrip() + "\n", numbers


def figure(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
           path: Any, *, title: str) -> bool:
  """Mean accuracy over participants per round, a line per row (min-max band over seeds)."""
  curves = {r.key: {kind: common.mean_curves([c.get("records", []) for c in
                                              cells[r.key].values()], kind)
                    for kind in table.kinds}
            for r in setting.rows if cells.get(r.key)}
  if not curves:
    return False
  return common.plot_curves(curves, path, title=title, kinds=table.kinds,
                            labels={r.key: r.label for r in setting.rows})

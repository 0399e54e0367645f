"""The convergence study: a method against BASE round by round, over seeds (issue: do the
papers' gaps open with rounds, and at which round).

For each setting of a domain-shift table at one scale, the finished cells of two rows (BASE
= `solo` and a method, FCCL+ by default) give per seed the AVG inter- and intra-domain
accuracy of every evaluated round (`eval/<kind>/mean` in metrics.jsonl). Per round:
each row's mean and sample standard deviation (ddof=1) over its seeds, and the paired gap
(method minus BASE on the same seed, which draws the same data for both) with its mean and
standard deviation over the seeds both rows finished. The gap "opens" at the first round
from which it is above zero on every paired seed at every later evaluated round (None when
it never does). `render` writes the markdown block, `figure` the curves (mean ± std bands).
Nothing here trains.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedjax_het.reports import common
from fedjax_het.reports import document
from fedjax_het.reports import tables as tables_lib

KINDS = ("inter", "intra")
#: The paper's BASE: "models are optimized on private data for 50 epochs" (FCCL+ Sec. 4.1).
PAPER_BASE_EPOCHS = 50
#: The rounds the markdown table shows (those the runs evaluated); the figure shows every round.
ROUNDS_SHOWN = (1, 2, 3, 5, 10, 15, 20, 25, 30, 35, 40)


def per_seed_curves(cells: Mapping[int, Mapping[str, Any]], kind: str
                    ) -> dict[int, dict[int, float]]:
  """{seed: {round: AVG accuracy}} of `kind` from each finished cell's records."""
  name = f"eval/{kind}/mean"
  return {int(seed): {int(r["round"]): float(r[name]) for r in cell.get("records", [])
                      if name in r}
          for seed, cell in cells.items()}


def _stat(values: Sequence[float]) -> dict[str, Any]:
  """{"mean", "std" (None with one value), "n"}; mean and std None with no value (a row with
  no finished cell yet)."""
  if not values:
    return {"mean": None, "std": None, "n": 0}
  mean, std = common.mean_std([float(v) for v in values])
  return {"mean": mean, "std": std, "n": len(values)}


def gap_opens(gaps: Mapping[int, Mapping[int, float]], rounds: Sequence[int]) -> int | None:
  """The first of `rounds` from which every seed's gap is > 0 at that round and every later
  one of `rounds`; None when the last round has a seed at or below zero (or no seed)."""
  if not gaps or not rounds:
    return None
  opens = None
  for r in reversed(rounds):
    if all(g[r] > 0 for g in gaps.values()):
      opens = r
    else:
      break
  return opens


def study(base_cells: Mapping[int, Mapping[str, Any]],
          method_cells: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
  """Per kind: the rounds every cell evaluated, each row's per-round statistics, the paired
  gap per seed and per round, and the round the gap opens.

  Args:
    base_cells, method_cells: {seed: finished cell (document.read_cell)}.

  Returns:
    {kind: {"rounds": [...], "base": {round: stat}, "method": {round: stat}, "gap": {round:
    stat}, "gap_per_seed": {seed: {round: gap}}, "paired_seeds": [...], "opens": round or
    None}}, stat = {"mean", "std" (None with one value), "n"}.
  """
  out: dict[str, Any] = {}
  for kind in KINDS:
    base, method = per_seed_curves(base_cells, kind), per_seed_curves(method_cells, kind)
    curves = list(base.values()) + list(method.values())
    rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    paired = sorted(set(base) & set(method))
    gaps = {s: {r: method[s][r] - base[s][r] for r in rounds} for s in paired}
    out[kind] = {
        "rounds": rounds,
        "base": {r: _stat([c[r] for c in base.values()]) for r in rounds},
        "method": {r: _stat([c[r] for c in method.values()]) for r in rounds},
        "gap": {r: _stat([g[r] for g in gaps.values()]) for r in rounds} if paired else {},
        "gap_per_seed": gaps, "paired_seeds": paired, "opens": gap_opens(gaps, rounds)}
  return out


def _cell(stat: Mapping[str, Any] | None, *, signed: bool = False) -> str:
  if not stat or stat["n"] == 0:
    return "–"
  text = f"{stat['mean']:+.2f}" if signed else f"{stat['mean']:.2f}"
  return text if stat["std"] is None else f"{text} ± {stat['std']:.2f}"


def base_budget_round(base_cells: Mapping[int, Mapping[str, Any]]) -> int | None:
  """The first round by whose end BASE has trained the paper's 50 private epochs
  (ceil(50 / local.epochs) of its recorded config); None without a readable config."""
  epochs = set()
  for cell in base_cells.values():
    record = _read_json(pathlib.Path(cell.get("path", "")) / "run.json") or {}
    value = record.get("config", {}).get("local.epochs")
    if isinstance(value, int) and value > 0:
      epochs.add(value)
  if len(epochs) != 1:
    return None
  return -(-PAPER_BASE_EPOCHS // epochs.pop())


def _read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def render(table: tables_lib.Table, scale: str, results_dir: pathlib.Path, *,
           method: str = "fcclplus", base: str = "solo") -> tuple[str, dict[str, Any]]:
  """(markdown, numbers) of the study over every setting of `table` at `scale`."""
  cells = document.collect(table, scale, pathlib.Path(results_dir))
  for per_row in cells.values():
    for per_seed in per_row.values():
      for cell in per_seed.values():
        cell["path"] = str(pathlib.Path(results_dir) / cell["workdir"])
  labels = {r.key: r.label for s in table.settings for r in s.rows}
  parts = [f"### {table.id} ({scale} scale): {labels.get(method, method)} against "
           f"{labels.get(base, base)}, round by round"]
  numbers: dict[str, Any] = {"table": table.id, "scale": scale, "method": method,
                             "base": base, "settings": {}}
  for setting in table.settings:
    found = cells.get(setting.key, {})
    result = study(found.get(base, {}), found.get(method, {}))
    numbers["settings"][setting.key] = result
    runs = [c for row in (base, method) for c in found.get(row, {}).values()]
    seeds = {row: sorted(found.get(row, {})) for row in (base, method)}
    paper = {kind: setting.paper.get(kind, {}) for kind in KINDS}
    printed = {kind: setting.paper_delta.get(kind, {}).get(method) for kind in KINDS}
    lines = [f"#### {setting.label}" if len(table.settings) > 1 or setting.label else "", ""]
    listed = {row: ", ".join(map(str, seeds[row])) or "none" for row in (base, method)}
    paired = ", ".join(map(str, result["inter"]["paired_seeds"])) or "none"
    lines.append(f"- seeds: {labels.get(base, base)} {listed[base]}; {labels.get(method, method)} "
                 f"{listed[method]}; the gap (method − BASE, per seed) pairs seeds {paired}; "
                 "each cell is mean ± sample std (ddof=1) over seeds at that round")
    lines.append("- " + document.runs_line(runs).replace("device", "runs: device", 1))
    for kind in KINDS:
      r = result[kind]
      last = r["rounds"][-1] if r["rounds"] else None
      paper_text = ""
      if "AVG" in paper[kind].get(base, {}) and "AVG" in paper[kind].get(method, {}):
        paper_text = (f"; the paper after 40 rounds: {paper[kind][base]['AVG']:.2f} and "
                      f"{paper[kind][method]['AVG']:.2f}"
                      + (f", Δ {printed[kind]:+.2f}" if printed[kind] is not None else ""))
      if last is None:
        lines.append(f"- {kind}: no finished cell")
        continue
      if not r["paired_seeds"]:
        lines.append(f"- {kind}: no gap yet (no seed has both rows finished){paper_text}")
        continue
      opens = ("above zero on every paired seed from round "
               f"{r['opens']} to round {last}" if r["opens"] is not None else
               f"not above zero on every paired seed at round {last}")
      lines.append(f"- {kind}: the gap is {opens}{paper_text}")
    budget = base_budget_round(found.get(base, {}))
    rounds = result["inter"]["rounds"]
    if budget is not None and budget in rounds:
      compared = []
      for kind in KINDS:
        base_curves = per_seed_curves(found.get(base, {}), kind)
        method_curves = per_seed_curves(found.get(method, {}), kind)
        paired = [method_curves[s][rounds[-1]] - base_curves[s][budget]
                  for s in sorted(set(base_curves) & set(method_curves))]
        compared.append(f"{kind} {_cell(result[kind]['base'][budget])}, "
                        f"{labels.get(method, method)} at round {rounds[-1]} minus it "
                        f"{_cell(_stat(paired), signed=True)}")
        result[kind]["base_at_paper_budget"] = {"round": budget, "gap": _stat(paired)}
      lines.append(f"- {labels.get(base, base)} after the paper's {PAPER_BASE_EPOCHS} private "
                   f"epochs (round {budget} here): {'; '.join(compared)} (the paper sets "
                   f"{labels.get(method, method)} after 40 rounds beside BASE after "
                   f"{PAPER_BASE_EPOCHS} epochs)")
    shown = [x for x in ROUNDS_SHOWN if x in result["inter"]["rounds"]]
    last = result["inter"]["rounds"][-1] if result["inter"]["rounds"] else None
    if last is not None and last not in shown:
      shown.append(last)
    header = ["round"] + [f"{labels.get(row, row)} {kind}" for kind in KINDS
                          for row in (base, method)] + [f"gap {kind}" for kind in KINDS]
    lines += ["", common.markdown_row(header), common.markdown_rule(len(header))]
    for x in shown:
      row = [str(x)]
      row += [_cell(result[kind][side].get(x)) for kind in KINDS for side in ("base", "method")]
      row += [_cell(result[kind]["gap"].get(x), signed=True) for kind in KINDS]
      lines.append(common.markdown_row(row))
    parts.append("\n".join(lines).strip("\n"))
  return "\n\n".join(parts) + "\n", numbers


def figure(tables: Sequence[tables_lib.Table], scale: str, results_dir: pathlib.Path,
           path: pathlib.Path, *, method: str = "fcclplus", base: str = "solo") -> bool:
  """One panel per (setting, kind): each row's mean AVG accuracy per round with a ± one
  standard deviation band over seeds. False without matplotlib or finished cells."""
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  if plt is None:
    return False
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  panels = []
  for table in tables:
    cells = document.collect(table, scale, pathlib.Path(results_dir))
    labels = {r.key: r.label for s in table.settings for r in s.rows}
    for setting in table.settings:
      found = cells.get(setting.key, {})
      result = study(found.get(base, {}), found.get(method, {}))
      if result["inter"]["rounds"]:
        panels.append((setting.label, result, labels, setting.paper))
  if not panels:
    return False
  fig, axes = plt.subplots(len(panels), len(KINDS), figsize=(11, 3.6 * len(panels)),
                           squeeze=False)
  for i, (label, result, labels, paper) in enumerate(panels):
    for j, kind in enumerate(KINDS):
      ax, r = axes[i][j], result[kind]
      for side, row, color in (("base", base, "tab:blue"), ("method", method, "tab:red")):
        if not r[side] or r[side][r["rounds"][0]]["n"] == 0:
          continue  # the row has no finished cell yet
        mean = np.array([r[side][x]["mean"] for x in r["rounds"]])
        std = np.array([r[side][x]["std"] or 0.0 for x in r["rounds"]])
        n = max(r[side][x]["n"] for x in r["rounds"])
        ax.plot(r["rounds"], mean, color=color, label=f"{labels.get(row, row)} (n = {n})")
        ax.fill_between(r["rounds"], mean - std, mean + std, color=color, alpha=0.2)
        printed = paper.get(kind, {}).get(row, {}).get("AVG")
        if printed is not None:
          ax.axhline(printed, color=color, linestyle=":", linewidth=1,
                     label=f"{labels.get(row, row)}, the paper")
      ax.set_title(f"{label}: {kind}-domain AVG accuracy")
      ax.set_xlabel("communication round")
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
      ax.set_ylabel("test accuracy (%)")
      ax.grid(alpha=0.3)
      ax.legend(title="mean ± std over seeds", fontsize=8)
  fig.suptitle(f"{labels.get(method, method)} against {labels.get(base, base)} ({scale} scale)")
  fig.tight_layout()
  return plots._save(plt, fig, path)  # pylint: disable=protected-access


# --- docs/results.md --------------------------------------------------------------------------

_BEGIN, _END = "<!-- convergence:{scale} -->", "<!-- /convergence -->"


def block(text: str, scale: str) -> str | None:
  """The content of the study's block at `scale` in `text` (None without one)."""
  begin = _BEGIN.format(scale=scale)
  if begin not in text:
    return None
  return text.split(begin, 1)[1].split(_END, 1)[0].strip("\n") + "\n"


def rewrite(text: str, scale: str, content: str) -> str:
  """`text` with the study's block at `scale` replaced by `content` (appended when absent)."""
  begin = _BEGIN.format(scale=scale)
  new = f"{begin}\n{content.rstrip()}\n{_END}"
  if begin in text:
    head, rest = text.split(begin, 1)
    return head + new + rest.split(_END, 1)[1]
  return text.rstrip("\n") + "\n\n" + new + "\n"


#: The tables of the study (`experiments/convergence.py`'s default): FCCL+ Tables VIII/IX on
#: Office31 and Digits, then their mid-scale diagnoses (`tables._diagnoses`).
STUDY_TABLES = ("fcclplus_office31", "fcclplus_digits", "fcclplus_office31_width",
                "fcclplus_digits_real")


def has_cells(table: tables_lib.Table, scale: str, results_dir: pathlib.Path, *,
              method: str = "fcclplus", base: str = "solo") -> bool:
  """Whether a setting of `table` has a finished cell of `method` or `base` at `scale`."""
  cells = document.collect(table, scale, pathlib.Path(results_dir))
  return any(per_row.get(row) for per_row in cells.values() for row in (method, base))


def render_all(tables: Sequence[tables_lib.Table], scale: str, results_dir: pathlib.Path, *,
               method: str = "fcclplus", base: str = "solo") -> tuple[str, dict[str, Any]]:
  """The block's markdown and numbers over the `tables` (in order) that have a finished cell
  of either row (`has_cells`)."""
  texts, numbers = [], {}
  for table in tables:
    if not has_cells(table, scale, results_dir, method=method, base=base):
      continue
    text, numbers[table.id] = render(table, scale, results_dir, method=method, base=base)
    texts.append(text)
  return "\n".join(texts), numbers

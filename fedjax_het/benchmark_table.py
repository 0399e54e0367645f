"""The FCCL+ Table VIII/IX layout over a grid of runs: methods x seeds (pure functions).

`experiments/benchmark.py` trains every (method, seed) cell and hands the cells'
`results.json` numbers to `summarize`, then writes `render_markdown`'s document
(and `summarize`'s numbers as JSON). Nothing here trains or reads files.

A cell's numbers are those of its `results.json`:
  {"inter": {<participant>: acc, ..., "AVG": acc}, "intra": {...}, ...}
(each the mean over the run's last `config.eval.last_rounds` evaluated rounds,
in percent). Over seeds a table cell is the mean and the sample standard
deviation (ddof=1); with one seed the mean alone. "Δ vs BASE" is a method's AVG
(mean over seeds) minus SOLO's (BASE in the paper); without SOLO in the grid
there is no Δ column.

`PAPER_ACCURACY` holds the published numbers of FCCL+ (Huang et al., "Generalizable
Heterogeneous Federated Cross-Correlation and Instance Similarity Learning",
TPAMI 2023), Tables VIII (inter-domain, →) and IX (intra-domain, ↩), all with
CIFAR-100 as the public set; they are shown beside a cell only in the paper's
setting (full configs, real data everywhere, no overrides), see `paper_setting`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

KINDS = ("inter", "intra")
KIND_LABELS = {"inter": "inter →", "intra": "intra ↩"}
BASE_METHOD = "solo"
#: The methods of FCCL+ Tables VIII/IX, in the paper's row order.
TABLE_METHODS = ("solo", "fedmd", "feddf", "fedmatch", "rhfl", "fccl", "fcclplus")
METHOD_LABELS = {"solo": "BASE (solo)", "fedmd": "FedMD", "feddf": "FedDF",
                 "fedmatch": "FedMatch", "rhfl": "RHFL", "fccl": "FCCL", "fcclplus": "FCCL+"}
STD_CONVENTION = "sample standard deviation (ddof=1)"

#: The participants (domains) of each scenario, in the column order of the paper's tables.
PAPER_DOMAINS = {
    "digits": ("mnist", "usps", "svhn", "syn"),                      # M, U, SV, SY
    "office_caltech": ("amazon", "caltech", "dslr", "webcam"),       # AM, CA, D, W
    "office31": ("amazon", "dslr", "webcam"),                        # AM, D, W
    "office_home": ("art", "clipart", "product", "real_world"),      # A, C, P, R
}

# FCCL+ (TPAMI 2023) Table VIII (inter-domain generalization, →) and Table IX
# (intra-domain discriminability, ↩), public data CIFAR-100, mean accuracy (%) of
# the last three communication rounds. Each row: the domains of PAPER_DOMAINS in
# order, then AVG, as printed. Every number of the four scenarios x seven
# methods could be read; none is left out. The paper's Δ column is not stored:
# the paper Δ shown is AVG - BASE AVG, which equals the printed Δ except for
# FCCL inter on Office-Caltech (printed -3.07, AVGs give -2.06) and on
# Office-Home (printed +7.49, AVGs give +7.57). Printed AVGs kept although a few
# differ from the mean of their row's domains by more than rounding: Digits
# intra FedDF 83.38 (domains: 82.89), FedMatch 82.69 (82.51), FCCL 85.69
# (85.76); Office31 inter FedDF 28.96 (28.95). tests/test_benchmark_runner.py
# checks all of this.
PAPER_ACCURACY: dict[str, dict[str, dict[str, tuple[float, ...]]]] = {
    "inter": {  # Table VIII
        "digits": {
            "solo": (15.29, 13.91, 39.24, 34.30, 25.68),
            "fedmd": (8.97, 12.61, 40.89, 43.03, 26.38),
            "feddf": (13.23, 19.29, 45.25, 43.95, 30.43),
            "fedmatch": (9.22, 14.76, 46.28, 36.05, 26.58),
            "rhfl": (19.15, 16.72, 51.74, 48.65, 34.06),
            "fccl": (20.74, 20.60, 44.68, 48.02, 33.51),
            "fcclplus": (40.13, 50.53, 48.31, 63.00, 50.49),
        },
        "office_caltech": {
            "solo": (28.20, 32.11, 19.99, 28.11, 27.10),
            "fedmd": (21.09, 35.13, 21.76, 30.57, 27.13),
            "feddf": (23.87, 28.29, 16.27, 22.82, 22.81),
            "fedmatch": (19.25, 32.21, 13.80, 22.66, 21.98),
            "rhfl": (19.11, 27.50, 16.55, 23.83, 21.74),
            "fccl": (25.16, 33.68, 17.52, 23.81, 25.04),
            "fcclplus": (29.56, 36.82, 24.02, 31.33, 30.43),
        },
        "office31": {
            "solo": (21.08, 27.93, 34.14, 27.72),
            "fedmd": (26.26, 32.37, 40.58, 33.07),
            "feddf": (24.74, 26.70, 35.40, 28.96),
            "fedmatch": (22.23, 31.98, 40.15, 31.45),
            "rhfl": (20.52, 20.59, 36.32, 25.81),
            "fccl": (26.69, 34.01, 39.88, 33.52),
            "fcclplus": (31.87, 35.16, 44.62, 37.21),
        },
        "office_home": {
            "solo": (18.89, 19.36, 21.97, 21.02, 20.31),
            "fedmd": (16.85, 23.13, 28.78, 25.01, 23.44),
            "feddf": (17.38, 21.76, 25.17, 22.97, 21.82),
            "fedmatch": (19.05, 25.24, 28.73, 24.35, 24.34),
            "rhfl": (15.67, 20.70, 22.02, 26.06, 21.11),
            "fccl": (25.55, 26.41, 30.14, 29.41, 27.88),
            "fcclplus": (26.67, 26.07, 25.96, 33.02, 27.93),
        },
    },
    "intra": {  # Table IX
        "digits": {
            "solo": (70.20, 74.19, 74.57, 73.60, 73.14),
            "fedmd": (77.30, 80.05, 77.73, 87.72, 80.70),
            "feddf": (82.95, 78.84, 78.46, 91.30, 83.38),
            "fedmatch": (82.69, 78.31, 79.79, 89.23, 82.69),
            "rhfl": (86.69, 80.39, 88.44, 97.90, 88.35),
            "fccl": (88.84, 84.42, 78.55, 91.23, 85.69),
            "fcclplus": (90.54, 86.92, 87.11, 97.72, 90.57),
        },
        "office_caltech": {
            "solo": (74.11, 61.35, 75.16, 78.31, 72.23),
            "fedmd": (71.78, 57.29, 68.37, 72.20, 67.41),
            "feddf": (70.01, 56.49, 65.18, 64.86, 64.13),
            "fedmatch": (73.38, 60.25, 68.58, 73.56, 68.94),
            "rhfl": (73.35, 58.92, 70.91, 74.47, 69.41),
            "fccl": (75.09, 60.46, 74.95, 73.56, 71.01),
            "fcclplus": (75.26, 59.90, 75.80, 75.48, 71.60),
        },
        "office31": {
            "solo": (72.95, 77.31, 80.88, 77.04),
            "fedmd": (71.39, 76.24, 80.13, 75.92),
            "feddf": (72.25, 74.50, 80.34, 75.69),
            "fedmatch": (71.08, 76.04, 80.92, 76.01),
            "rhfl": (70.98, 73.90, 78.87, 74.58),
            "fccl": (72.37, 78.44, 81.26, 77.35),
            "fcclplus": (72.92, 78.61, 81.26, 77.59),
        },
        "office_home": {
            "solo": (65.27, 60.50, 74.68, 54.28, 63.68),
            "fedmd": (66.17, 60.63, 76.35, 56.60, 64.93),
            "feddf": (66.10, 60.44, 75.70, 55.98, 64.55),
            "fedmatch": (81.50, 65.40, 79.81, 65.06, 72.94),
            "rhfl": (56.68, 73.79, 76.29, 63.63, 67.59),
            "fccl": (81.51, 65.42, 79.84, 65.16, 72.98),
            "fcclplus": (69.74, 74.65, 78.02, 69.02, 72.85),
        },
    },
}


def paper_numbers(scenario: str, method: str, kind: str) -> dict[str, float]:
  """{domain: acc, ..., "AVG": acc} of the paper for this row, or {} if the paper has none."""
  row = PAPER_ACCURACY.get(kind, {}).get(scenario, {}).get(method)
  if row is None:
    return {}
  return dict(zip((*PAPER_DOMAINS[scenario], "AVG"), row))


def source_kind(source: str) -> str:
  """"real", "synthetic" (asked for), "substituted" (synthetic in place of an unavailable
  source) or "none" (an empty public set), from a `metadata.json` source string."""
  if source == "none":
    return "none"
  if source.startswith("synthetic"):
    return "substituted" if "substituted for" in source else "synthetic"
  return "real"


def provenance(metadatas: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
  """{domain or "public": distinct sources over the cells} from their `metadata.json`s."""
  sources: dict[str, list[str]] = {}
  for metadata in metadatas:
    for name, source in metadata.get("sources", {}).items():
      seen = sources.setdefault(name, [])
      if source not in seen:
        seen.append(source)
  return sources


def provenance_line(sources: Mapping[str, Sequence[str]]) -> str:
  """"mnist real (...), svhn SYNTHETIC (substituted for 'tfds'), ..." for the header."""
  if not sources:
    return "unknown (no cell has a metadata.json yet)"
  parts = []
  for name, values in sources.items():
    kinds = {source_kind(v) for v in values}
    shown = "; ".join(values)
    if kinds == {"real"}:
      parts.append(f"{name} real ({shown})")
    elif kinds == {"none"}:
      parts.append(f"{name} none")
    else:
      parts.append(f"{name} SYNTHETIC ({shown})")
  return ", ".join(parts)


def all_real(sources: Mapping[str, Sequence[str]]) -> bool:
  """True when every domain and the public set used real data in every cell."""
  return bool(sources) and all(source_kind(v) == "real" for vs in sources.values() for v in vs)


def paper_setting(*, scenario: str, quick: bool, sources: Mapping[str, Sequence[str]],
                  overrides: Sequence[str] = (),
                  domains: Sequence[str] | None = None) -> tuple[bool, str]:
  """(whether the paper's numbers apply, why not / why).

  They apply to full configs (not quick) on real data everywhere (no synthetic
  or substituted domain, real public set) with no override of a field that
  changes results, for a scenario of the paper with its participants
  (`domains`, when given, in any order).
  """
  reasons = []
  if scenario not in PAPER_DOMAINS:
    reasons.append(f"the paper has no {scenario!r} scenario")
  elif domains is not None and sorted(domains) != sorted(PAPER_DOMAINS[scenario]):
    reasons.append(f"participants {', '.join(domains)} instead of the paper's "
                   f"{', '.join(PAPER_DOMAINS[scenario])}")
  if quick:
    reasons.append("quick configs")
  synthetic = [name for name, vs in sources.items() if any(source_kind(v) != "real" for v in vs)]
  if synthetic:
    reasons.append(f"synthetic data for {', '.join(synthetic)}")
  elif not sources:
    reasons.append("data provenance unknown")
  if overrides:
    reasons.append(f"overrides {', '.join(overrides)}")
  if reasons:
    return False, "no (" + "; ".join(reasons) + "): paper numbers not shown"
  return True, ("yes (full configs, real data): the paper's number (FCCL+ TPAMI Tables VIII/IX) "
                "is shown in parentheses")


def _mean_std(values: Sequence[float]) -> tuple[float, float | None]:
  mean = float(np.mean(values))
  std = float(np.std(values, ddof=1)) if len(values) > 1 else None
  return mean, std


def summarize(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], *,
              kinds: Sequence[str] = KINDS) -> dict[str, Any]:
  """Mean and std over seeds per (method, kind, column), and Δ vs BASE.

  Args:
    cells: {method: {seed: results.json numbers}}; methods in row order (a
      method with no finished seed is left out).
    kinds: the accuracy kinds (table sections).

  Returns:
    {"columns": [participants..., "AVG"], "methods": [...], "seeds": {method: [...]},
     "rows": {method: {kind: {column: {"mean", "std" (None with one seed), "n",
     "per_seed": {seed: acc}}}}}, "delta": {method: {kind: AVG mean - BASE's}}
     (empty when BASE, i.e. solo, is not in the grid)}.
  """
  methods = [m for m in cells if cells[m]]
  columns: list[str] = []
  for method in methods:
    for numbers in cells[method].values():
      for name in numbers.get(kinds[0], {}):
        if name != "AVG" and name not in columns:
          columns.append(name)
  columns.append("AVG")
  rows: dict[str, Any] = {}
  for method in methods:
    rows[method] = {}
    for kind in kinds:
      rows[method][kind] = {}
      for column in columns:
        per_seed = {int(seed): float(numbers[kind][column])
                    for seed, numbers in sorted(cells[method].items())
                    if column in numbers.get(kind, {})}
        if not per_seed:
          continue
        mean, std = _mean_std(list(per_seed.values()))
        rows[method][kind][column] = {"mean": mean, "std": std, "n": len(per_seed),
                                      "per_seed": per_seed}
  delta: dict[str, Any] = {}
  if BASE_METHOD in rows:
    for method in methods:
      delta[method] = {kind: rows[method][kind]["AVG"]["mean"]
                       - rows[BASE_METHOD][kind]["AVG"]["mean"] for kind in kinds
                       if "AVG" in rows[method][kind] and "AVG" in rows[BASE_METHOD][kind]}
  return {"columns": columns, "methods": methods,
          "seeds": {m: sorted(int(s) for s in cells[m]) for m in methods},
          "rows": rows, "delta": delta}


def format_cell(mean: float, std: float | None, paper: float | None = None, *,
                digits: int = 2) -> str:
  """"45.31 ± 1.20 (paper 50.49)"; no "±" without a std, no "(paper)" without a number.

  `digits` decimals for all three (rounds to a target use 1).
  """
  text = (f"{mean:.{digits}f}" if std is None or math.isnan(std)
          else f"{mean:.{digits}f} ± {std:.{digits}f}")
  return text if paper is None else f"{text} (paper {paper:.{digits}f})"


def format_delta(delta: float, paper: float | None = None) -> str:
  text = f"{delta:+.2f}"
  return text if paper is None else f"{text} (paper {paper:+.2f})"


def markdown_table(summary: Mapping[str, Any], kind: str, *, scenario: str,
                   show_paper: bool) -> str:
  """One table: rows = methods, columns = participants, AVG and (with solo) Δ vs BASE."""
  columns = summary["columns"]
  with_delta = bool(summary["delta"])
  header = ["method", *columns] + (["Δ vs BASE"] if with_delta else [])
  lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
  # The paper's AVG is over all its domains: shown only when the columns are those domains.
  full_domains = tuple(columns[:-1]) == PAPER_DOMAINS.get(scenario)
  paper_base = paper_numbers(scenario, BASE_METHOD, kind)
  for method in summary["methods"]:
    row = summary["rows"][method][kind]
    paper = paper_numbers(scenario, method, kind) if show_paper else {}
    cells = [METHOD_LABELS.get(method, method)]
    for column in columns:
      if column not in row:
        cells.append("")
        continue
      number = paper.get(column) if (column != "AVG" or full_domains) else None
      cells.append(format_cell(row[column]["mean"], row[column]["std"], number))
    if with_delta:
      if method == BASE_METHOD:
        cells.append("-")
      elif kind in summary["delta"].get(method, {}):
        paper_delta = (paper["AVG"] - paper_base["AVG"]
                       if show_paper and full_domains and "AVG" in paper and paper_base else None)
        cells.append(format_delta(summary["delta"][method][kind], paper_delta))
      else:
        cells.append("")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def std_line(num_seeds: int) -> str:
  if num_seeds > 1:
    return f"mean ± {STD_CONVENTION} over {num_seeds} seeds"
  return "one seed: the mean alone, no standard deviation"


def render_markdown(summary: Mapping[str, Any], *, scenario: str, quick: bool,
                    seeds: Sequence[int], provenance_text: str, setting_text: str,
                    show_paper: bool, last_rounds: int | None = None,
                    overrides: Sequence[str] = (), done: int | None = None,
                    total: int | None = None, kinds: Sequence[str] = KINDS,
                    configs_text: str | None = None) -> str:
  """benchmark.md: a header (scenario, configs, seeds, data, std convention) and one table
  per kind (inter →, intra ↩)."""
  seeds_text = ", ".join(str(s) for s in seeds)
  each = ("the mean of its last evaluated rounds" if not last_rounds else
          "its last evaluated round" if last_rounds == 1 else
          f"the mean of its last {last_rounds} evaluated rounds")
  lines = [f"# Benchmark: {scenario} ({'quick' if quick else 'full'} configs), "
           f"seed{'s' if len(seeds) != 1 else ''} {seeds_text}", ""]
  if done is not None and total is not None and done < total:
    lines += [f"**Partial: {done} of {total} cells finished.**", ""]
  lines += [
      "- configs: "
      + (configs_text or f"experiments/configs/{scenario}.py:<method>{'_quick' if quick else ''}")
      + (f", overrides: {', '.join(overrides)}" if overrides else ""),
      f"- seeds: {seeds_text} (one run per seed, run one after another)",
      f"- cell: accuracy (%) of each run is {each}; {std_line(len(seeds))}",
      "- Δ vs BASE: the method's AVG minus BASE (solo)'s AVG, both means over seeds"
      if summary["delta"] else "- no Δ vs BASE column: solo (BASE) is not in the grid",
      f"- data: {provenance_text}",
      f"- paper setting: {setting_text}",
  ]
  for kind in kinds:
    lines += ["", f"## {KIND_LABELS.get(kind, kind)}", "",
              markdown_table(summary, kind, scenario=scenario, show_paper=show_paper)]
  return "\n".join(lines) + "\n"


def mean_curves(records_per_seed: Sequence[Sequence[Mapping[str, Any]]],
                kind: str) -> tuple[list[int], list[float], list[float], list[float]]:
  """(rounds, mean, min, max over seeds) of eval/<kind>/mean at the rounds every seed evaluated."""
  name = f"eval/{kind}/mean"
  per_seed = [{int(r["round"]): float(r[name]) for r in records if name in r}
              for records in records_per_seed]
  if not per_seed:
    return [], [], [], []
  rounds = sorted(set.intersection(*(set(s) for s in per_seed)))
  values = np.array([[s[r] for r in rounds] for s in per_seed]).reshape(len(per_seed), len(rounds))
  return (rounds, values.mean(axis=0).tolist(), values.min(axis=0).tolist(),
          values.max(axis=0).tolist())


CURVE_TITLES = {
    "inter": "inter-domain accuracy →, AVG over participants\n"
             "(each participant on the other domains' test sets)",
    "intra": "intra-domain accuracy ↩, AVG over participants\n"
             "(each participant on its own domain's test set)",
}


def plot_benchmark_curves(curves: Mapping[str, Mapping[str, tuple[list, list, list, list]]],
                          path: Any, *, title: str, num_classes: int | None = None,
                          labels: Mapping[str, str] | None = None,
                          kinds: Sequence[str] = KINDS,
                          titles: Mapping[str, str] | None = None,
                          targets: Sequence[float] = ()) -> bool:
  """Saves one panel per kind (inter, intra): a line per method (mean over seeds) with its
  min-max band over seeds, and chance 100/num_classes. Returns False without matplotlib.

  `curves[method][kind]` is `mean_curves`'s (rounds, mean, min, max). `kinds`
  picks the panels (`titles` their titles, default CURVE_TITLES) and `targets`
  (accuracies in percent) draws a dotted horizontal line at each.
  """
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  if plt is None:
    return False
  figure = benchmark_figure(plt, curves, title=title, num_classes=num_classes, labels=labels,
                            kinds=kinds, titles=titles, targets=targets)
  return plots._save(plt, figure, path)  # pylint: disable=protected-access


def benchmark_figure(plt, curves: Mapping[str, Mapping[str, tuple[list, list, list, list]]], *,
                     title: str, num_classes: int | None = None,
                     labels: Mapping[str, str] | None = None, kinds: Sequence[str] = KINDS,
                     titles: Mapping[str, str] | None = None, targets: Sequence[float] = ()):
  """The Figure of `plot_benchmark_curves`."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  labels = labels or {}
  titles = {**CURVE_TITLES, **(titles or {})}
  fig, axes = plt.subplots(1, len(kinds), figsize=(6.0 * len(kinds), 4.4), sharex=True,
                           sharey=True, squeeze=False, layout="constrained")
  axes = axes[0]
  banded, top, all_rounds = False, 100.0 / num_classes if num_classes else 0.0, set()
  top = max(top, *targets) if targets else top
  for ax, kind in zip(axes, kinds):
    for method, per_kind in curves.items():
      rounds, mean, low, high = per_kind.get(kind, ([], [], [], []))
      if not rounds:
        continue
      line, = ax.plot(rounds, mean, marker=".", lw=1.5, label=labels.get(method, method))
      if any(h > l for l, h in zip(low, high)):
        ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.15, lw=0)
        banded = True
      top = max(top, *high)
      all_rounds.update(rounds)
    if num_classes:
      ax.axhline(100.0 / num_classes, color="grey", ls="--", lw=1,
                 label=f"chance (1/C = {100.0 / num_classes:.3g}%)")
    for target in targets:
      ax.axhline(target, color="black", ls=":", lw=1, label=f"target {target:g}%")
    ax.set_title(titles.get(kind, kind), fontsize=10)
    ax.set_xlabel("communication round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  if all_rounds:  # integer rounds; a lone round gets a unit-wide axis
    axes[0].set_xlim(min(all_rounds) - 0.5, max(all_rounds) + 0.5)
    if len(all_rounds) <= 12:
      axes[0].set_xticks(sorted(all_rounds))
  axes[0].set_ylim(0, min(100.0, top * 1.1 + 1.0))
  axes[0].set_ylabel("test accuracy (%)")
  axes[-1].legend(fontsize=8, loc="best",
                  title="method" + (" (band: min-max over seeds)" if banded else ""),
                  title_fontsize=8)
  fig.suptitle(title)
  return fig

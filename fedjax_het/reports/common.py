"""What every family's report shares: statistics over seeds, number formats, data provenance,
the per-participant table of one run, and the accuracy-per-round figure.

Conventions: accuracies in percent; over seeds a cell is the mean and the sample standard
deviation (ddof=1) of the seeds that finished, the mean alone with one seed.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STD_CONVENTION = "sample standard deviation (ddof=1)"

KIND_LABELS = {"inter": "inter →", "intra": "intra ↩", "accuracy": "accuracy"}

#: More participants than this: a run's table shows AVG / min / max only.
MAX_TABLE_COLUMNS = 10


# --- statistics ---------------------------------------------------------------------------


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
  """(mean, sample std with ddof=1), the std None for a single value."""
  if not len(values):
    raise ValueError("mean_std needs at least one value.")
  mean = float(np.mean(values))
  std = float(np.std(values, ddof=1)) if len(values) > 1 else None
  return mean, std


def seed_stat(per_seed: Mapping[int, float]) -> dict[str, Any]:
  """{"mean", "std" (ddof=1, None with one seed), "n", "per_seed"} of {seed: value}."""
  mean, std = mean_std([float(v) for v in per_seed.values()])
  return {"mean": mean, "std": std, "n": len(per_seed),
          "per_seed": {int(s): float(v) for s, v in per_seed.items()}}


def std_line(num_seeds: int) -> str:
  """How the cells are summarised over `num_seeds` seeds, for a table's header."""
  if num_seeds > 1:
    return f"mean ± {STD_CONVENTION} over the seeds that finished"
  return "one seed: the mean alone, no standard deviation"


# --- seed by seed ----------------------------------------------------------------------------
#
# Every method of a table draws the same data (the same stream, partition and private sets) on
# a given seed, so two rows pair up seed by seed: the verdicts below say whether a row is above
# or below a reference row on every seed both finished, or whether the difference changes sign.

#: The verdicts of `seed_verdict`.
VERDICTS = ("above", "below", "changes", "above_or_equal", "below_or_equal", "equal",
            "too_few")


def paired_differences(values: Mapping[int, float], reference: Mapping[int, float]
                       ) -> dict[int, float]:
  """{seed: values[seed] - reference[seed]} over the seeds both have, in seed order."""
  return {int(s): float(values[s]) - float(reference[s])
          for s in sorted(set(values) & set(reference), key=int)}


def seed_verdict(differences: Mapping[int, float] | Sequence[float]) -> str:
  """The verdict of a row's per-seed differences from a reference row.

  Args:
    differences: {seed: row - reference} (or the differences alone), the
      seeds both rows finished.

  Returns:
    "above" (every difference > 0), "below" (every one < 0), "changes" (at
    least one > 0 and one < 0); with a tie (a difference of exactly 0.0):
    "above_or_equal" / "below_or_equal" (the other differences share a sign)
    or "equal" (all ties); "too_few" with fewer than 2 paired seeds, where no
    verdict is drawn. A tie has no sign: it is no sign change (+, 0, + is
    "above_or_equal", not "changes"), and it breaks "on every seed" (so not
    "above"); +, 0, - still changes sign.
  """
  values = list(differences.values()) if isinstance(differences, Mapping) else list(differences)
  if len(values) < 2:
    return "too_few"
  up, down = any(v > 0 for v in values), any(v < 0 for v in values)
  ties = any(v == 0 for v in values)
  if up and down:
    return "changes"
  if up:
    return "above_or_equal" if ties else "above"
  if down:
    return "below_or_equal" if ties else "below"
  return "equal"


def verdict_text(verdict: str, reference: str, seeds: int) -> str:
  """A verdict in words: "above BASE on every seed", "changes sign", "1 seed" (too few)."""
  return {"above": f"above {reference} on every seed",
          "below": f"below {reference} on every seed",
          "changes": "changes sign",
          "above_or_equal": f"above or equal to {reference} on every seed",
          "below_or_equal": f"below or equal to {reference} on every seed",
          "equal": f"equal to {reference} on every seed",
          }.get(verdict, f"{seeds} seed{'' if seeds == 1 else 's'}")


def format_differences(differences: Mapping[int, float], *, digits: int = 2) -> str:
  """"+1.20, -0.45, 0.00": the differences in seed order, a tie (exactly 0) unsigned; "–"
  without any."""
  if not differences:
    return "–"
  return ", ".join(f"{0.0:.{digits}f}" if v == 0 else f"{v:+.{digits}f}"
                   for v in differences.values())


def seed_comparison(values: Mapping[str, Mapping[str, Mapping[int, float]]], reference: str,
                    rows: Sequence[str], kinds: Sequence[str]) -> dict[str, Any]:
  """Each row's per-seed differences from the reference row and their verdicts.

  Args:
    values: {row: {kind: {seed: value}}} of the finished cells.
    reference: the row the others are read against (BASE, FedAvg, GLFC).
    rows: the rows in table order (the reference among them or not).
    kinds: the quantities compared (inter / intra, final accuracy, Avg.).

  Returns:
    {"reference": reference, "kinds": [...], "rows": {row: {kind: {"seeds":
     [paired seeds], "per_seed": {seed: row - reference}, "verdict":
     `seed_verdict`'s}}}} for every row but the reference.
  """
  out: dict[str, Any] = {}
  base = values.get(reference, {})
  for row in rows:
    if row == reference:
      continue
    out[row] = {}
    for kind in kinds:
      differences = paired_differences(values.get(row, {}).get(kind, {}), base.get(kind, {}))
      out[row][kind] = {"seeds": list(differences), "per_seed": differences,
                        "verdict": seed_verdict(differences)}
  return {"reference": reference, "kinds": list(kinds), "rows": out}


def seed_table(comparison: Mapping[str, Any], labels: Mapping[str, str], *,
               kind_labels: Mapping[str, str], reference_label: str, digits: int = 2,
               row_reference_labels: Mapping[str, str] | None = None) -> str:
  """`seed_comparison` as a markdown table: method, seeds, then per kind the differences in
  seed order and the verdict (a kind whose paired seeds differ from the row's first kind's
  names each seed); `row_reference_labels` names the reference of a row read against
  another row than `reference_label`'s."""
  kinds = comparison["kinds"]
  header = ["method", "seeds"]
  for kind in kinds:
    header += [f"{kind_labels.get(kind, kind)} Δ per seed", "verdict"]
  lines = [markdown_row(header), markdown_rule(len(header))]
  for row, per_kind in comparison["rows"].items():
    seeds = per_kind[kinds[0]]["seeds"]
    cells = [labels.get(row, row), ", ".join(map(str, seeds)) or "–"]
    for kind in kinds:
      entry = per_kind[kind]
      text = format_differences(entry["per_seed"], digits=digits)
      if entry["seeds"] and entry["seeds"] != seeds:
        text = ", ".join(f"seed {s} {t}" for s, t in zip(entry["seeds"], text.split(", ")))
      against = dict(row_reference_labels or {}).get(row, reference_label)
      cells += [text, verdict_text(entry["verdict"], against, len(entry["seeds"]))]
    lines.append(markdown_row(cells))
  return "\n".join(lines)


def short_label(label: str) -> str:
  """A row label without its parenthesis: "BASE (solo)" -> "BASE"."""
  return label.split(" (")[0]


# --- formats ------------------------------------------------------------------------------


def format_cell(mean: float, std: float | None, paper: float | None = None, *,
                digits: int = 2) -> str:
  """"45.31 ± 1.20 (paper 50.49)"; no "±" without a std, no "(paper)" without a number.

  `digits` decimals for all three (rounds to a target use 1).
  """
  text = (f"{mean:.{digits}f}" if std is None or math.isnan(std)
          else f"{mean:.{digits}f} ± {std:.{digits}f}")
  return text if paper is None else f"{text} (paper {paper:.{digits}f})"


def format_delta(delta: float, paper: float | None = None) -> str:
  """"+4.75", or "+4.75 (paper +4.75)" with the paper's delta."""
  text = f"{delta:+.2f}"
  return text if paper is None else f"{text} (paper {paper:+.2f})"


def markdown_row(cells: Sequence[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def markdown_rule(columns: int) -> str:
  return "|---" * columns + "|"


# --- data provenance ----------------------------------------------------------------------


def source_kind(source: str) -> str:
  """"real", "synthetic" (asked for), "substituted" (synthetic in place of an unavailable
  source) or "none" (an empty public set), from a `metadata.json` source string."""
  if source == "none":
    return "none"
  if source.startswith("synthetic"):
    return "substituted" if "substituted for" in source else "synthetic"
  return "real"


def short_source(source: str) -> str:
  """A source without the machine's directories: "npz:/d/office31.npz[amazon]" ->
  "npz:office31.npz[amazon]", "folder:/d/OfficeHome/Art" -> "folder:Art" (a note after
  "; " kept: "npz:/d/cifar10.npz; PFLlib's data: ..." -> "npz:cifar10.npz; PFLlib's ..."); a synthetic
  source's seed (the cell's seed) as "seed=<cell seed>"."""
  head, sep, note = source.partition("; ")  # a note after the path ("...npz; PFLlib's data")
  match = re.fullmatch(r"(npz|folder):(.*?)(\[[^\]]*\])?", head)
  if match:
    kind, path, part = match.groups()
    return f"{kind}:{pathlib.PurePath(path).name}{part or ''}{sep}{note}"
  if source.startswith("synthetic"):
    return re.sub(r"seed=\d+", "seed=<cell seed>", source)
  return source


def provenance(metadatas: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
  """{domain or "public": distinct sources over the cells} from their `metadata.json`s, each
  as `short_source` gives it (so the cells of one row over seeds count once)."""
  sources: dict[str, list[str]] = {}
  for metadata in metadatas:
    for name, source in metadata.get("sources", {}).items():
      source = short_source(source)
      seen = sources.setdefault(name, [])
      if source not in seen:
        seen.append(source)
  return sources


def provenance_line(sources: Mapping[str, Sequence[str]]) -> str:
  """"mnist real (...), svhn SYNTHETIC (substituted for 'tfds'), ..." for a header."""
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
    elif kinds == {"real", "none"}:  # rows with the source and rows without one (no public set)
      real = "; ".join(v for v in values if source_kind(v) == "real")
      parts.append(f"{name} real ({real}) where a row has one, none elsewhere")
    else:
      parts.append(f"{name} SYNTHETIC ({shown})")
  return ", ".join(parts)


def all_real(sources: Mapping[str, Sequence[str]]) -> bool:
  """True when every source of every cell is real data (an absent public set, "none", is
  fine: the partitioned and class-incremental settings have none)."""
  kinds = {source_kind(v) for vs in sources.values() for v in vs}
  return bool(kinds) and kinds <= {"real", "none"} and "real" in kinds


def _sizes_of(metadata: Mapping[str, Any]) -> str:
  parts = []
  train = metadata.get("train_sizes") or {}
  if train:
    if len(train) <= MAX_TABLE_COLUMNS:
      parts.append("train " + ", ".join(f"{k} {v}" for k, v in train.items()))
    else:
      parts.append(f"train {sum(train.values())} images over {len(train)} clients")
  test = metadata.get("test_sizes") or {}
  if test:
    parts.append("test " + ", ".join(f"{k} {v}" for k, v in test.items()))
  if metadata.get("public_size"):
    parts.append(f"public {metadata['public_size']}")
  if metadata.get("pool_size"):
    parts.append(f"training pool {metadata['pool_size']} images")
  if metadata.get("test_size"):
    parts.append(f"test {metadata['test_size']} images")
  return "; ".join(parts)


def sizes_line(metadatas: Sequence[Mapping[str, Any]]) -> str:
  """The data sizes of the cells (from `metadata.json`), "unknown" without any, each
  distinct one once when they differ between cells."""
  seen = list(dict.fromkeys(s for s in map(_sizes_of, metadatas) if s))
  if not seen:
    return "unknown"
  return seen[0] if len(seen) == 1 else " | ".join(seen) + " (differ between cells)"


# --- one run: the per-participant table of results.md -------------------------------------


def results_table(records: Sequence[Mapping[str, Any]], client_names: Sequence[str], *,
                  last_rounds: int, method: str,
                  kinds: Sequence[str] = ("inter", "intra")) -> tuple[str, dict[str, Any]]:
  """Accuracy per participant and AVG, each the mean over the last evaluated rounds.

  With kinds ("inter", "intra") this is the FCCL+ Table VIII/IX layout (domain
  shift); ("accuracy",) is one row of test accuracy (a partitioned dataset).
  With more than `MAX_TABLE_COLUMNS` participants the markdown table shows
  AVG, min and max over participants (the dict keeps every participant). A kind
  without a number in any record (None or NaN: the inter-domain accuracy of a
  one-domain scenario) has no row and no entry.

  Returns:
    (markdown table, the same numbers as a dict: {"method", "rounds": the
    rounds averaged, kind: {participant: acc, ..., "AVG": acc}}).
  """
  evaluated = [r for r in records if f"eval/{kinds[0]}/{client_names[0]}" in r][-last_rounds:]
  if not evaluated:
    return "(no evaluated rounds)", {}
  numbers: dict[str, Any] = {"method": method, "rounds": [r["round"] for r in evaluated]}
  wide = len(client_names) > MAX_TABLE_COLUMNS
  columns = ["AVG", "min", "max"] if wide else [*client_names, "AVG"]
  lines = [f"| {method}{f' ({len(client_names)} participants)' if wide else ''} | "
           + " | ".join(columns) + " |", markdown_rule(len(columns) + 1)]
  for kind in kinds:
    raw = [[r.get(f"eval/{kind}/{c}") for r in evaluated] for c in client_names]
    if all(v is None or not math.isfinite(v) for row in raw for v in row):
      continue  # no number (HtFL's one-domain scenario has no inter-domain accuracy)
    values = [float(np.mean(row)) for row in raw]
    average = float(np.mean(values))
    numbers[kind] = dict(zip(client_names, values), AVG=average)
    shown = [average, min(values), max(values)] if wide else [*values, average]
    lines.append(f"| {KIND_LABELS.get(kind, kind)} | " + " | ".join(f"{v:.2f}" for v in shown)
                 + " |")
  return "\n".join(lines), numbers


# --- accuracy per round, over seeds ---------------------------------------------------------


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


def plot_curves(curves: Mapping[str, Mapping[str, tuple[list, list, list, list]]], path: Any, *,
                title: str, num_classes: int | None = None,
                labels: Mapping[str, str] | None = None, kinds: Sequence[str] = ("inter", "intra"),
                titles: Mapping[str, str] | None = None, targets: Sequence[float] = ()) -> bool:
  """Saves one panel per kind: a line per row (mean over seeds) with its min-max band over
  seeds, and chance 100/num_classes. Returns False without matplotlib.

  `curves[row][kind]` is `mean_curves`'s (rounds, mean, min, max). `titles` the
  panels' titles (default CURVE_TITLES); `targets` (accuracies in percent)
  draws a dotted horizontal line at each.
  """
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  if plt is None:
    return False
  figure = curves_figure(plt, curves, title=title, num_classes=num_classes, labels=labels,
                         kinds=kinds, titles=titles, targets=targets)
  return plots._save(plt, figure, path)  # pylint: disable=protected-access


def curves_figure(plt, curves: Mapping[str, Mapping[str, tuple[list, list, list, list]]], *,
                  title: str, num_classes: int | None = None,
                  labels: Mapping[str, str] | None = None,
                  kinds: Sequence[str] = ("inter", "intra"),
                  titles: Mapping[str, str] | None = None, targets: Sequence[float] = ()):
  """The Figure of `plot_curves`."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  labels = labels or {}
  titles = {**CURVE_TITLES, **(titles or {})}
  fig, axes = plt.subplots(1, len(kinds), figsize=(6.0 * len(kinds), 4.4), sharex=True,
                           sharey=True, squeeze=False, layout="constrained")
  axes = axes[0]
  banded, top, all_rounds = False, 100.0 / num_classes if num_classes else 0.0, set()
  top = max(top, *targets) if targets else top
  for ax, kind in zip(axes, kinds):
    for row, per_kind in curves.items():
      rounds, mean, low, high = per_kind.get(kind, ([], [], [], []))
      if not rounds:
        continue
      line, = ax.plot(rounds, mean, marker=".", lw=1.5, label=labels.get(row, row))
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


def read_records(path: pathlib.Path) -> list[dict[str, Any]]:
  """The JSON records of a metrics.jsonl file, one a line ([] without the file); a last line
  cut short by a kill mid-append is dropped, a bad line before it raises."""
  if not path.exists():
    return []
  lines = [line for line in path.read_text().splitlines() if line.strip()]
  records = []
  for index, line in enumerate(lines):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if index < len(lines) - 1:
        raise
  return records

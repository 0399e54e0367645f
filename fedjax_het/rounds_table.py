"""Rounds to a target accuracy and communication, over methods x seeds (pure functions).

The tables of Yao et al. (FedMMD / FedFusion) for a grid of runs:
`experiments/rounds_benchmark.py` trains every (method, seed) cell of one
setting (`experiments/configs/_two_stream.py`) and hands each cell's
`results.json` numbers and `metrics.jsonl` records to `summarize`, then writes
`render_markdown`'s document, `summarize`'s numbers as JSON and
`plot_rounds_curves`'s figure. Nothing here trains or reads files.

The accuracy of a run is its headline accuracy (`headline_kind`, the rule of
`fedjax_het.train.headline_kind`): the global test accuracy
(`eval/accuracy/mean`), or for the permuted setting, whose clients each have a
permuted test split, the mean over those splits (`eval/intra/mean`, what the
paper reports).

  * Table 1 layout (final accuracy): the run's `results.json` headline mean,
    i.e. the mean of its last `eval.last_rounds` evaluated rounds; over seeds
    mean ± sample std (ddof=1, `benchmark_table._mean_std`), the mean alone
    with one seed.
  * Table 2 layout (rounds to a target): per seed the first evaluated round
    whose accuracy is >= the target (`first_round_reaching`, the rule of
    `fedjax_het.train.rounds_to_target`). A seed that never reaches it in its
    N rounds is censored: it counts as N rounds and the cell reads
    "> mean (k/S reached)", a strict lower bound on the mean over seeds (that
    seed needs more than N); no std then. The reduction vs FedAvg is
    1 - mean rounds(method) / mean rounds(FedAvg) in percent; with a censored
    method it is an upper bound ("< x%"), with a censored FedAvg a lower bound
    ("> x%"), with both censored undetermined ("n/a").
  * Communication: bytes per round (`train/server/bytes_up` + `bytes_down`:
    the whole cohort's uploads and downloads, `algorithms.fedavg`) and the
    bytes up to each target, the sum over the rounds up to the round that
    reached it (= rounds x bytes per round, the per-round bytes being fixed),
    with the same censoring and reduction vs FedAvg; MB = 10^6 bytes.

`PAPER` holds the paper's numbers for the settings it reports; they are shown
beside ours only in the paper's setting (full configs, real data, no override
that changes results), see `paper_setting`, with the differences that remain
(the offline bundle's training set is smaller than the paper's, ...) listed
under the tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het import benchmark_table as table

#: The method tokens of the runner, in the paper's row order, and their config variants.
METHODS = ("fedavg", "fedmmd", "fedmmd_l2", "fedfusion_conv", "fedfusion_multi",
           "fedfusion_single")
REFERENCE = "fedavg"
METHOD_LABELS = {"fedavg": "FedAvg", "fedmmd": "FedMMD (MMD)",
                 "fedmmd_l2": "FedMMD (L2, authors' code)", "fedfusion_conv": "FedFusion+Conv",
                 "fedfusion_multi": "FedFusion+Multi", "fedfusion_single": "FedFusion+Single"}
BYTES_UNIT, BYTES_UNIT_NAME = 1e6, "MB"

PAPER_CITATION = ("X. Yao, T. Huang, C. Wu, R.-X. Zhang, L. Sun, \"Federated Learning with "
                  "Additional Mechanisms on Clients to Reduce Communication Costs\", "
                  "arXiv:1908.05891, 2019")

#: FedFusion Table 1 ("convergence accuracy", %), columns (a)-(d) as printed, one per
#: Figure 5 panel: (a), (b) "the artificial non-IID partitions of CIFAR10", (c) permuted
#: MNIST, (d) IID CIFAR-10. (a) and (b) are not mapped to a setting here: the paper does not
#: say which partitions they are, and FedMMD's binary 5/5-class split of the same CIFAR-10
#: with the same CNN reaches 72% only after 326 FedAvg rounds (Sec. 4.2.1), far below (a)'s
#: 89.89%, so (a) is not taken to be the `binary` setting.
FEDFUSION_TABLE1 = {
    "fedavg": {"a": 89.89, "b": 92.21, "c": 95.20, "d": 80.01},
    "fedfusion_single": {"a": 89.77, "b": 92.32, "c": 95.25, "d": 80.85},
    "fedfusion_multi": {"a": 90.51, "b": 92.78, "c": 95.43, "d": 82.95},
    "fedfusion_conv": {"a": 90.11, "b": 92.53, "c": 95.79, "d": 82.15},
}

#: The paper's numbers per (dataset, setting): "final" (%), "rounds" {target: {method:
#: rounds}} and the printed "reduction" {target: {method: %}}; "train_images" the size of
#: the paper's training set; "notes" the differences that remain in the paper's setting.
#: "fedmmd" is the paper's FedMMD (the MMD constraint).
PAPER: dict[tuple[str, str], dict[str, Any]] = {
    ("mnist", "permuted"): {
        "where": "FedFusion Table 1 column (c) and Table 2",
        "final": {m: row["c"] for m, row in FEDFUSION_TABLE1.items()},
        "rounds": {"94": {"fedavg": 100, "fedfusion_single": 87, "fedfusion_multi": 78,
                          "fedfusion_conv": 34},
                   "95": {"fedavg": 256, "fedfusion_single": 227, "fedfusion_multi": 201,
                          "fedfusion_conv": 92}},
        "reduction": {"94": {"fedfusion_single": 13.0, "fedfusion_multi": 22.0,
                             "fedfusion_conv": 66.0},
                      "95": {"fedfusion_single": 11.3, "fedfusion_multi": 21.5,
                             "fedfusion_conv": 64.1}},
        "train_images": 60000,
        "notes": ("batch 64 and E = 5 are the authors' code defaults (the paper gives neither)",),
    },
    ("cifar10", "iid"): {
        "where": "FedFusion Table 1 column (d)",
        "final": {m: row["d"] for m, row in FEDFUSION_TABLE1.items()},
        "train_images": 50000,
        "notes": (),
    },
    ("cifar10", "binary"): {
        "where": "FedMMD Sec. 4.2.1 (text on Fig. 4a)",
        "rounds": {"72": {"fedavg": 326, "fedmmd": 260}},
        "reduction": {"72": {"fedmmd": 20.2}},
        "train_images": 50000,
        "notes": ("the paper's FedMMD runs use a constant rate 2e-3 (Sec. 4.2.1); the configs "
                  "decay 0.003 x 0.985^r as FedFusion does",),
    },
    ("mnist", "shards"): {
        "where": "FedMMD Sec. 4.2.2 (text on Fig. 4d)",
        "rounds": {"98": {"fedavg": 128, "fedmmd": 72}},
        "reduction": {"98": {"fedmmd": 23.4}},
        "train_images": 60000,
        "notes": ("printed as is: 72 vs 128 rounds, \"a reduction of 23.4%\", but "
                  "1 - 72/128 = 43.8% (1 - 98/128 = 23.4%): one of the two printed numbers "
                  "is off",
                  "the paper gives no learning rate for this split; the config uses SGD 0.05 "
                  "(McMahan et al.)"),
    },
}


def config_variant(method: str, setting: str, *, quick: bool) -> str:
  """"fedfusion_conv", "permuted" -> "fedfusion_permuted_conv[_quick]" (the config arg)."""
  base, _, variant = method.partition("_")
  return "_".join(x for x in (base, setting, variant, "quick" if quick else "") if x)


def target_key(target: float) -> str:
  """The key of a target in results.json's "rounds_to_target": 94.0 -> "94"."""
  return f"{float(target):g}"


def headline_kind(results: Mapping[str, Any]) -> str:
  """"accuracy" when a run reports plain accuracy, else "intra" (fedjax_het.train's rule)."""
  return "accuracy" if "accuracy" in results else "intra"


def accuracy_curve(records: Sequence[Mapping[str, Any]], kind: str
                   ) -> tuple[list[int], list[float]]:
  """(evaluated rounds, eval/<kind>/mean at each) from metrics records."""
  name = f"eval/{kind}/mean"
  pairs = [(int(r["round"]), float(r[name])) for r in records if name in r]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def first_round_reaching(records: Sequence[Mapping[str, Any]], kind: str,
                         target: float) -> int | None:
  """The first evaluated round whose eval/<kind>/mean is >= target (percent), or None."""
  for round_index, value in zip(*accuracy_curve(records, kind)):
    if value >= target:
      return round_index
  return None


def bytes_per_round(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """{"up", "down", "total": mean bytes per round, "constant": same every round}."""
  ups = [float(r["train/server/bytes_up"]) for r in records if "train/server/bytes_up" in r]
  downs = [float(r["train/server/bytes_down"]) for r in records
           if "train/server/bytes_down" in r]
  if not ups or not downs:
    return {"up": None, "down": None, "total": None, "constant": None}
  up, down = sum(ups) / len(ups), sum(downs) / len(downs)
  return {"up": up, "down": down, "total": up + down,
          "constant": len(set(ups)) == 1 and len(set(downs)) == 1}


def bytes_through(records: Sequence[Mapping[str, Any]], last_round: int) -> float | None:
  """Bytes sent and received (whole cohort) in rounds 1..last_round, None without the metric."""
  rows = [r for r in records if int(r["round"]) <= last_round and "train/server/bytes_up" in r]
  if not rows:
    return None
  return float(sum(r["train/server/bytes_up"] + r.get("train/server/bytes_down", 0.0)
                   for r in rows))


def num_rounds(records: Sequence[Mapping[str, Any]]) -> int:
  """The rounds a run trained (its last record's round)."""
  return max((int(r["round"]) for r in records), default=0)


def censored_stat(per_seed: Mapping[int, float | None],
                  censored_at: Mapping[int, float]) -> dict[str, Any]:
  """Mean (and std) over seeds of a quantity some seeds may not reach.

  Args:
    per_seed: {seed: value, or None when the seed never reached the target}.
    censored_at: {seed: the value a seed that did not reach counts as} (its
      number of rounds, or its bytes over the whole run).

  Returns:
    {"mean", "std" (ddof=1; None with one seed or any censored seed), "n",
     "reached" (seeds that reached), "bound": "exact" (all reached) or
     "lower" (the true mean is larger than "mean"), "per_seed"}; None for no seed.
  """
  if not per_seed:
    return None
  values = [float(v) if v is not None else float(censored_at[s]) for s, v in per_seed.items()]
  reached = sum(v is not None for v in per_seed.values())
  mean, std = table._mean_std(values)  # pylint: disable=protected-access
  exact = reached == len(values)
  return {"mean": mean, "std": std if exact else None, "n": len(values), "reached": reached,
          "bound": "exact" if exact else "lower",
          "per_seed": {int(s): (None if v is None else float(v)) for s, v in per_seed.items()}}


def reduction(stat: Mapping[str, Any] | None,
              reference: Mapping[str, Any] | None) -> dict[str, Any] | None:
  """1 - stat / reference (means over seeds), in percent, with its bound.

  Returns {"percent", "bound"}: "exact"; "at_most" (the method is censored:
  it needs more, so the true reduction is smaller); "at_least" (the reference
  is censored); "undetermined" (both censored, "percent" None). None without
  one of the two.
  """
  if stat is None or reference is None or reference["mean"] <= 0:
    return None
  mine, theirs = stat["bound"] == "lower", reference["bound"] == "lower"
  if mine and theirs:
    return {"percent": None, "bound": "undetermined"}
  percent = 100.0 * (1.0 - stat["mean"] / reference["mean"])
  return {"percent": percent,
          "bound": "at_most" if mine else "at_least" if theirs else "exact"}


def summarize(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], *,
              targets: Sequence[float], reference: str = REFERENCE) -> dict[str, Any]:
  """The numbers of the tables from the cells.

  Args:
    cells: {method: {seed: {"results": results.json, "records": metrics.jsonl
      records}}}, methods in row order (one with no finished seed is left out).
    targets: the accuracies (percent) to reach, config.eval.targets.
    reference: the method the reductions are relative to (FedAvg).

  Returns:
    {"methods", "seeds": {method: [...]}, "kind": the headline accuracy,
     "targets": ["94", ...], "reference": reference or None when not in the
     grid, "final": {method: stat}, "rounds": {method: {target: censored stat}},
     "rounds_reduction": {method: {target: reduction}}, "bytes_per_round":
     {method: {"up", "down", "total", "constant"}} (means over seeds),
     "bytes": {method: {target: censored stat, "all": stat of the whole run}},
     "bytes_reduction": {method: {target: reduction}}}; stats as
     `censored_stat`, "final" with "per_seed" accuracies.
  """
  methods = [m for m in cells if cells[m]]
  keys = [target_key(t) for t in targets]
  kinds = {headline_kind(c["results"]) for m in methods for c in cells[m].values()
           if c.get("results")}
  kind = kinds.pop() if len(kinds) == 1 else "accuracy" if "accuracy" in kinds else "intra"
  final, rounds, data, per_round = {}, {}, {}, {}
  for method in methods:
    seeds = sorted(cells[method])
    accuracies = {s: float(cells[method][s]["results"][kind]["AVG"]) for s in seeds
                  if "AVG" in cells[method][s].get("results", {}).get(kind, {})}
    if accuracies:
      mean, std = table._mean_std(list(accuracies.values()))  # pylint: disable=protected-access
      final[method] = {"mean": mean, "std": std, "n": len(accuracies), "per_seed": accuracies}
    records = {s: cells[method][s].get("records", []) for s in seeds}
    lasts = {s: num_rounds(records[s]) for s in seeds}
    reached = {key: {s: first_round_reaching(records[s], kind, float(key)) for s in seeds}
               for key in keys}
    rounds[method] = {key: censored_stat(reached[key], lasts) for key in keys}
    whole = {s: bytes_through(records[s], lasts[s]) for s in seeds}
    if all(v is not None for v in whole.values()):
      through = {key: {s: (None if reached[key][s] is None else
                           bytes_through(records[s], reached[key][s])) for s in seeds}
                 for key in keys}
      data[method] = {key: censored_stat(through[key], whole) for key in keys}
      data[method]["all"] = censored_stat(whole, whole)
      each = [bytes_per_round(records[s]) for s in seeds]
      per_round[method] = {
          "up": sum(e["up"] for e in each) / len(each),
          "down": sum(e["down"] for e in each) / len(each),
          "total": sum(e["total"] for e in each) / len(each),
          "constant": all(e["constant"] for e in each)
                      and len({(e["up"], e["down"]) for e in each}) == 1}
  ref = reference if reference in methods else None
  return {
      "methods": methods, "seeds": {m: sorted(int(s) for s in cells[m]) for m in methods},
      "kind": kind, "targets": keys, "reference": ref, "final": final, "rounds": rounds,
      "rounds_reduction": {m: {k: reduction(rounds[m][k], rounds[ref][k]) for k in keys}
                           for m in methods} if ref else {},
      "bytes_per_round": per_round, "bytes": data,
      "bytes_reduction": {m: {k: reduction(data[m][k], data[ref][k]) for k in keys}
                          for m in data} if ref in data else {},
  }


# --- the paper's setting ------------------------------------------------------------------


def paper_setting(*, dataset: str, setting: str, quick: bool,
                  sources: Mapping[str, Sequence[str]],
                  overrides: Sequence[str] = ()) -> tuple[bool, str]:
  """(whether the paper's numbers apply, why not / why).

  They apply to a (dataset, setting) in `PAPER` with full configs (not quick)
  on real data (no synthetic or substituted source; these settings have no
  public set, source "none") and no override of a field that changes results.
  """
  reasons = []
  if (dataset, setting) not in PAPER:
    reasons.append(f"the paper reports no numbers for {dataset} {setting}")
  if quick:
    reasons.append("quick configs")
  synthetic = [name for name, vs in sources.items()
               if any(table.source_kind(v) not in ("real", "none") for v in vs)]
  if synthetic:
    reasons.append(f"synthetic data for {', '.join(synthetic)}")
  elif not sources:
    reasons.append("data provenance unknown")
  if overrides:
    reasons.append(f"overrides {', '.join(overrides)}")
  if reasons:
    return False, "no (" + "; ".join(reasons) + "): paper numbers not shown"
  where = PAPER[(dataset, setting)]["where"]
  return True, (f"yes (full configs, real data): the paper's numbers ({where}) are shown in "
                "parentheses")


def all_real(sources: Mapping[str, Sequence[str]]) -> bool:
  """True when every source of every cell is real data (no public set, "none", is fine)."""
  kinds = {table.source_kind(v) for vs in sources.values() for v in vs}
  return bool(kinds) and kinds <= {"real", "none"} and "real" in kinds


def paper_caveats(dataset: str, setting: str, train_images: int | None) -> list[str]:
  """What still differs from the paper in its setting: training set size, the notes."""
  paper = PAPER.get((dataset, setting), {})
  lines = []
  if train_images is not None and paper.get("train_images") not in (None, train_images):
    lines.append(f"the runs train on {train_images} images in all (the offline bundle), the "
                 f"paper on {paper['train_images']}")
  return lines + list(paper.get("notes", ()))


# --- formatting ---------------------------------------------------------------------------


def format_censored(stat: Mapping[str, Any] | None, paper: float | None = None, *,
                    digits: int = 1, scale: float = 1.0) -> str:
  """"34.0 ± 2.0 (paper 34.0)", "> 287.3 (2/3 reached)" or "" without a stat."""
  if stat is None:
    return ""
  mean = stat["mean"] / scale
  if stat["bound"] == "exact":
    std = None if stat["std"] is None else stat["std"] / scale
    return table.format_cell(mean, std, paper, digits=digits)
  text = f"> {mean:.{digits}f} ({stat['reached']}/{stat['n']} reached)"
  return text if paper is None else f"{text} (paper {paper:.{digits}f})"


def format_reduction(value: Mapping[str, Any] | None, paper: float | None = None, *,
                     is_reference: bool = False) -> str:
  """"60.0%", "> 12.5%", "< 3.0%", "n/a (neither reached)", "(ref)"; "" without a value."""
  if is_reference:
    return "(ref)"
  if value is None:
    return ""
  if value["bound"] == "undetermined":
    text = "n/a (neither reached)"
  else:
    sign = {"exact": "", "at_least": "> ", "at_most": "< "}[value["bound"]]
    text = f"{sign}{value['percent']:.1f}%"
  return text if paper is None else f"{text} (paper {paper:.1f}%)"


def _label(method: str) -> str:
  return METHOD_LABELS.get(method, method)


def _row(cells: Sequence[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def final_table(summary: Mapping[str, Any], paper: Mapping[str, Any] | None = None) -> str:
  """Table 1 layout: final accuracy (%) per method."""
  paper = paper or {}
  lines = [_row(["method", "final accuracy (%)"]), "|---|---|"]
  for method in summary["methods"]:
    stat = summary["final"].get(method)
    text = ("" if stat is None else
            table.format_cell(stat["mean"], stat["std"], paper.get("final", {}).get(method)))
    lines.append(_row([_label(method), text]))
  return "\n".join(lines)


def rounds_table(summary: Mapping[str, Any], paper: Mapping[str, Any] | None = None) -> str:
  """Table 2 layout: per target, rounds to reach it and the reduction vs the reference."""
  paper = paper or {}
  keys, ref = summary["targets"], summary["reference"]
  header = ["method"]
  for key in keys:
    header += [f"rounds to {key}%"] + ([f"reduce ({key}%)"] if ref else [])
  lines = [_row(header), "|---" * len(header) + "|"]
  for method in summary["methods"]:
    cells = [_label(method)]
    for key in keys:
      cells.append(format_censored(summary["rounds"][method][key],
                                   paper.get("rounds", {}).get(key, {}).get(method)))
      if ref:
        cells.append(format_reduction(summary["rounds_reduction"][method][key],
                                      paper.get("reduction", {}).get(key, {}).get(method),
                                      is_reference=method == ref))
    lines.append(_row(cells))
  return "\n".join(lines)


def bytes_table(summary: Mapping[str, Any]) -> str:
  """Bytes per round (up / down, whole cohort) and in total up to each target, MB."""
  keys, ref = summary["targets"], summary["reference"]
  with_reduction = bool(summary["bytes_reduction"])
  unit = BYTES_UNIT_NAME
  header = ["method", f"per round ↑ / ↓ ({unit})"]
  for key in keys:
    header += [f"total to {key}% ({unit})"] + ([f"saved ({key}%)"] if with_reduction else [])
  header.append(f"total, whole run ({unit})")
  lines = [_row(header), "|---" * len(header) + "|"]
  for method in summary["methods"]:
    per_round = summary["bytes_per_round"].get(method)
    if per_round is None:
      lines.append(_row([_label(method)] + ["(no byte counts)"] + [""] * (len(header) - 2)))
      continue
    cells = [_label(method), f"{per_round['up'] / BYTES_UNIT:.2f} / "
                             f"{per_round['down'] / BYTES_UNIT:.2f}"
                             + ("" if per_round["constant"] else " (mean; varies)")]
    for key in keys:
      cells.append(format_censored(summary["bytes"][method][key], scale=BYTES_UNIT))
      if with_reduction:
        cells.append(format_reduction(summary["bytes_reduction"].get(method, {}).get(key),
                                      is_reference=method == ref))
    cells.append(format_censored(summary["bytes"][method]["all"], scale=BYTES_UNIT))
    lines.append(_row(cells))
  return "\n".join(lines)


KIND_TEXT = {
    "accuracy": "global test accuracy (eval/accuracy/mean)",
    "intra": "the global model's accuracy averaged over the clients' permuted test splits "
             "(eval/intra/mean)",
}


def render_markdown(summary: Mapping[str, Any], *, dataset: str, setting: str, quick: bool,
                    seeds: Sequence[int], provenance_text: str, setting_text: str,
                    show_paper: bool, last_rounds: int | None = None,
                    num_rounds_text: str | None = None, configs_text: str = "",
                    overrides: Sequence[str] = (), done: int | None = None,
                    total: int | None = None, caveats: Sequence[str] = ()) -> str:
  """rounds.md: a header and the three tables (final accuracy, rounds, bytes)."""
  paper = PAPER.get((dataset, setting)) if show_paper else None
  seeds_text = ", ".join(str(s) for s in seeds)
  each = ("the mean of its last evaluated rounds" if not last_rounds else
          "its last evaluated round" if last_rounds == 1 else
          f"the mean of its last {last_rounds} evaluated rounds")
  ref = summary["reference"]
  lines = [f"# Rounds to target: {dataset} {setting} ({'quick' if quick else 'full'} configs), "
           f"seed{'s' if len(seeds) != 1 else ''} {seeds_text}", ""]
  if done is not None and total is not None and done < total:
    lines += [f"**Partial: {done} of {total} cells finished.**", ""]
  lines += [
      f"- configs: {configs_text}" + (f", overrides: {', '.join(overrides)}" if overrides else ""),
      f"- seeds: {seeds_text} (one run per seed, run one after another)"
      + (f"; {num_rounds_text}" if num_rounds_text else ""),
      f"- accuracy: {KIND_TEXT.get(summary['kind'], summary['kind'])}, in %",
      f"- {table.std_line(len(seeds))}; a target some seed never reaches reads "
      "\"> m (k/S reached)\": m counts that seed's rounds as the run's length, a strict "
      "lower bound, no std",
      ("- reduce / saved: 1 - mean(method) / mean(FedAvg); \"> x%\" when FedAvg is censored, "
       "\"< x%\" when the method is, n/a when both are" if ref else
       "- no reduction columns: FedAvg (the reference) is not in the grid"),
      f"- communication: bytes sent up / down per round by the whole cohort "
      f"(train/server/bytes_up, bytes_down), and up + down summed over the rounds up to the "
      f"target; {BYTES_UNIT_NAME} = 10^6 bytes",
      f"- data: {provenance_text}",
      f"- paper setting: {setting_text}",
  ]
  if paper is not None:
    lines.append(f"- paper: {PAPER_CITATION}, {paper['where']}")
    lines += [f"- differs from the paper: {c}" for c in caveats]
  lines += ["", f"## Final accuracy (Table 1 layout): {each}", "",
            final_table(summary, paper)]
  if summary["targets"]:
    lines += ["", "## Rounds to reach the target accuracy (Table 2 layout)", "",
              rounds_table(summary, paper),
              "", "## Communication", "", bytes_table(summary)]
  else:
    lines += ["", "(no eval.targets in the configs: no rounds-to-target tables)"]
  return "\n".join(lines) + "\n"


# --- the figure ---------------------------------------------------------------------------


def plot_rounds_curves(cells: Mapping[str, Mapping[int, Mapping[str, Any]]], path: Any, *,
                       kind: str, targets: Sequence[float], title: str,
                       num_classes: int | None = None) -> bool:
  """Accuracy vs round, a line per method (mean over seeds, min-max band), the targets as
  dotted lines (the paper's Figs. 4-5), in `benchmark_table`'s style. False without
  matplotlib."""
  curves = {m: {kind: table.mean_curves([c.get("records", []) for c in per_seed.values()], kind)}
            for m, per_seed in cells.items() if per_seed}
  return table.plot_benchmark_curves(
      curves, path, title=title, num_classes=num_classes,
      labels={m: _label(m) for m in curves}, kinds=(kind,),
      titles={kind: KIND_TEXT.get(kind, kind).replace(" (", "\n(")}, targets=targets)

"""Partitioned-dataset report (FedMMD / FedFusion): final accuracy, rounds and bytes to target.

One run: `run_table` is results.md's accuracy row (`common.results_table` with
kinds ("accuracy",)), and `first_round_reaching` the round a run first reaches
a target (the rule of `fedjax_het.experiment.rounds_to_target`).

The accuracy of a run is its headline accuracy (`headline_kind`): the global
test accuracy (`eval/accuracy/mean`), or for the permuted setting, whose
clients each have a permuted test split, the mean over those splits
(`eval/intra/mean`, what the paper reports).

Over seeds (`summarize`, from each cell's results.json and metrics.jsonl):
  * final accuracy (FedFusion Table 1 layout): the results.json headline mean
    (the mean of the run's last `eval.last_rounds` evaluated rounds); mean ±
    sample std (ddof=1) over seeds, the mean alone with one seed.
  * rounds to a target (FedFusion Table 2 layout): per seed the first
    evaluated round whose accuracy is >= the target. A seed that never reaches
    it in its N rounds is censored: it counts as N rounds and the cell reads
    "> mean (k/S reached)", a strict lower bound on the mean over seeds (that
    seed needs more than N); no std then. The reduction vs FedAvg is 1 - mean
    rounds(row) / mean rounds(FedAvg) in percent; with a censored row it is an
    upper bound ("< x%"), with a censored FedAvg a lower bound ("> x%"), with
    both censored undetermined ("n/a").
  * communication: bytes per round (`train/server/bytes_up` + `bytes_down`,
    the whole cohort) and the bytes up to each target (the sum over the rounds
    up to the round that reached it), with the same censoring and reduction vs
    FedAvg; MB = 10^6 bytes.
  * seed by seed (`seed_by_seed`): each row's final accuracy minus FedAvg's on
    each seed both finished (each seed draws the same data for every method)
    and the verdict, above or below FedAvg on every seed or changing sign
    (`common.seed_verdict`).
Nothing here trains or reads files.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het.reports import common

REFERENCE = "fedavg"
BYTES_UNIT, BYTES_UNIT_NAME = 1e6, "MB"

#: One run's accuracy table (results.md).
run_table = functools.partial(common.results_table, kinds=("accuracy",))

KIND_TEXT = {
    "accuracy": "global test accuracy (eval/accuracy/mean)",
    "intra": "the mean over the clients of each client's accuracy on its own test data "
             "(eval/intra/mean): on permuted MNIST the global model on the client's permuted "
             "test split; on label-skewed data (CIFAR-10 classes5 / classes2, the HtFL "
             "scenarios) the client's own model on its own test images",
}


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
                  censored_at: Mapping[int, float]) -> dict[str, Any] | None:
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
  mean, std = common.mean_std(values)
  exact = reached == len(values)
  return {"mean": mean, "std": std if exact else None, "n": len(values), "reached": reached,
          "bound": "exact" if exact else "lower",
          "per_seed": {int(s): (None if v is None else float(v)) for s, v in per_seed.items()}}


def reduction(stat: Mapping[str, Any] | None,
              reference: Mapping[str, Any] | None) -> dict[str, Any] | None:
  """1 - stat / reference (means over seeds), in percent, with its bound.

  Returns {"percent", "bound"}: "exact"; "at_most" (the row is censored: it
  needs more, so the true reduction is smaller); "at_least" (the reference is
  censored); "undetermined" (both censored, "percent" None). None without one
  of the two.
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
              targets: Sequence[float], reference: str = REFERENCE,
              references: Mapping[str, str] | None = None) -> dict[str, Any]:
  """The numbers of the tables from the cells.

  Args:
    cells: {row: {seed: {"results": results.json, "records": metrics.jsonl
      records}}}, rows in table order (one with no finished seed is left out).
    targets: the accuracies (percent) to reach (config.eval.targets).
    reference: the row the reductions are relative to (FedAvg).
    references: {row: the row its reductions are relative to instead} (a diagnosis row read
      against its own counterpart, e.g. FedFusion+Conv's local models against FedAvg's).

  Returns:
    {"rows_done", "seeds": {row: [...]}, "kind": the headline accuracy,
     "targets": ["94", ...], "reference": reference or None when not in the
     grid, "base": reference, "references": {row: the row it is read against} (the rows
     with cells and those of `references`), "final": {row: stat}, "rounds": {row: {target:
     censored stat}},
     "rounds_reduction": {row: {target: reduction}}, "bytes_per_round":
     {row: {"up", "down", "total", "constant"}} (means over seeds),
     "bytes": {row: {target: censored stat, "all": stat of the whole run}},
     "bytes_reduction": {row: {target: reduction}}}; stats as `censored_stat`,
     "final" as `common.seed_stat`.
  """
  rows = [r for r in cells if cells[r]]
  keys = [target_key(t) for t in targets]
  kinds = {headline_kind(c["results"]) for r in rows for c in cells[r].values()
           if c.get("results")}
  kind = kinds.pop() if len(kinds) == 1 else "accuracy" if "accuracy" in kinds else "intra"
  final, rounds, data, per_round = {}, {}, {}, {}
  for row in rows:
    seeds = sorted(cells[row])
    accuracies = {s: float(cells[row][s]["results"][kind]["AVG"]) for s in seeds
                  if "AVG" in cells[row][s].get("results", {}).get(kind, {})}
    if accuracies:
      final[row] = common.seed_stat(accuracies)
    records = {s: cells[row][s].get("records", []) for s in seeds}
    lasts = {s: num_rounds(records[s]) for s in seeds}
    reached = {key: {s: first_round_reaching(records[s], kind, float(key)) for s in seeds}
               for key in keys}
    rounds[row] = {key: censored_stat(reached[key], lasts) for key in keys}
    whole = {s: bytes_through(records[s], lasts[s]) for s in seeds}
    if all(v is not None for v in whole.values()):
      through = {key: {s: (None if reached[key][s] is None else
                           bytes_through(records[s], reached[key][s])) for s in seeds}
                 for key in keys}
      data[row] = {key: censored_stat(through[key], whole) for key in keys}
      data[row]["all"] = censored_stat(whole, whole)
      each = [bytes_per_round(records[s]) for s in seeds]
      per_round[row] = {
          "up": sum(e["up"] for e in each) / len(each),
          "down": sum(e["down"] for e in each) / len(each),
          "total": sum(e["total"] for e in each) / len(each),
          "constant": all(e["constant"] for e in each)
                      and len({(e["up"], e["down"]) for e in each}) == 1}
  ref = reference if reference in rows else None
  refs = {r: reference for r in rows} | dict(references or {})
  return {
      "rows_done": rows, "seeds": {r: sorted(int(s) for s in cells[r]) for r in rows},
      "kind": kind, "targets": keys, "reference": ref, "base": reference, "references": refs,
      "final": final, "rounds": rounds,
      "rounds_reduction": {r: {k: reduction(rounds[r][k], rounds[refs[r]][k]) for k in keys}
                           for r in rows if refs[r] in rows},
      "bytes_per_round": per_round, "bytes": data,
      "bytes_reduction": {r: {k: reduction(data[r][k], data[refs[r]][k]) for k in keys}
                          for r in data if refs[r] in data},
  }


def htfl_accuracy(records: Sequence[Mapping[str, Any]], test_sizes: Mapping[str, int], *,
                  last_rounds: int = 3) -> dict[str, Any]:
  """Both numbers of an HtFL cell from its metrics.jsonl records and metadata.json's
  "test_sizes" ({client domain: rows}).

  Returns {"htfllib": the best evaluated round's accuracy over all clients' test splits
  pooled, Σ_k acc_k n_k / Σ_k n_k (HtFLlib's `evaluate` and `average_data`), "best_round",
  "library": the mean over the last `last_rounds` evaluated rounds of eval/intra/mean (the
  clients' unweighted mean)}; None entries without evaluated rounds.
  """
  names = [n for n in test_sizes if any(f"eval/intra/{n}" in r for r in records)]
  total = float(sum(test_sizes[n] for n in names))
  pooled = [(int(r["round"]), sum(float(r[f"eval/intra/{n}"]) * test_sizes[n] for n in names)
             / total) for r in records if names and all(f"eval/intra/{n}" in r for n in names)]
  means = [float(r["eval/intra/mean"]) for r in records if "eval/intra/mean" in r]
  best = max(pooled, key=lambda pair: pair[1]) if pooled else (None, None)
  return {"htfllib": best[1], "best_round": best[0],
          "library": float(sum(means[-last_rounds:]) / len(means[-last_rounds:]))
          if means else None}


# --- formatting ---------------------------------------------------------------------------


def format_censored(stat: Mapping[str, Any] | None, paper: float | None = None, *,
                    digits: int = 1, scale: float = 1.0) -> str:
  """"34.0 ± 2.0 (paper 34.0)", "> 287.3 (2/3 reached)", "–" without a stat."""
  if stat is None:
    return "–" if paper is None else f"– (paper {paper:.{digits}f})"
  mean = stat["mean"] / scale
  if stat["bound"] == "exact":
    std = None if stat["std"] is None else stat["std"] / scale
    return common.format_cell(mean, std, paper, digits=digits)
  text = f"> {mean:.{digits}f} ({stat['reached']}/{stat['n']} reached)"
  return text if paper is None else f"{text} (paper {paper:.{digits}f})"


def format_reduction(value: Mapping[str, Any] | None, paper: float | None = None, *,
                     is_reference: bool = False) -> str:
  """"60.0%", "> 12.5%", "< 3.0%", "n/a (both censored)", "(ref)"; "–" without a value."""
  if is_reference:
    return "(ref)"
  if value is None:
    return "–" if paper is None else f"– (paper {paper:.1f}%)"
  if value["bound"] == "undetermined":
    text = "n/a (both censored)"
  else:
    sign = {"exact": "", "at_least": "> ", "at_most": "< "}[value["bound"]]
    text = f"{sign}{value['percent']:.1f}%"
  return text if paper is None else f"{text} (paper {paper:.1f}%)"


def _n(summary: Mapping[str, Any], row: str) -> str:
  return str(len(summary["seeds"].get(row, [])))


def final_table(summary: Mapping[str, Any], rows: Sequence[tuple[str, str]],
                paper: Mapping[str, Any], *, show_diff: bool) -> str:
  """FedFusion Table 1 layout: final accuracy (%) per row, the paper's beside it."""
  header = ["method", "n", "final accuracy (%)"] + (["− paper"] if show_diff else [])
  lines = [common.markdown_row(header), common.markdown_rule(len(header))]
  for key, label in rows:
    stat, printed = summary["final"].get(key), paper.get("final", {}).get(key)
    text = (common.format_cell(stat["mean"], stat["std"], printed) if stat else
            "–" if printed is None else f"– (paper {printed:.2f})")
    cells = [label, _n(summary, key), text]
    if show_diff:
      cells.append(f"{stat['mean'] - printed:+.2f}" if stat and printed is not None else "")
    lines.append(common.markdown_row(cells))
  return "\n".join(lines)


def rounds_table(summary: Mapping[str, Any], rows: Sequence[tuple[str, str]],
                 paper: Mapping[str, Any], *, targets: Sequence[str]) -> str:
  """FedFusion Table 2 layout: per target, rounds to reach it and the reduction vs FedAvg."""
  ref = summary["reference"] or (REFERENCE if any(k == REFERENCE for k, _ in rows) else None)
  header = ["method", "n"]
  for key in targets:
    header += [f"rounds to {key}%"] + ([f"reduce ({key}%)"] if ref else [])
  lines = [common.markdown_row(header), common.markdown_rule(len(header))]
  for row, label in rows:
    cells = [label, _n(summary, row)]
    for key in targets:
      cells.append(format_censored(summary["rounds"].get(row, {}).get(key),
                                   paper.get("rounds", {}).get(key, {}).get(row)))
      if ref:
        cells.append(format_reduction(summary["rounds_reduction"].get(row, {}).get(key),
                                      paper.get("reduction", {}).get(key, {}).get(row),
                                      is_reference=row == ref))
    lines.append(common.markdown_row(cells))
  return "\n".join(lines)


def bytes_table(summary: Mapping[str, Any], rows: Sequence[tuple[str, str]]) -> str:
  """Bytes per round (up / down, whole cohort) and in total up to each target, MB."""
  keys, ref = summary["targets"], summary["reference"]
  with_reduction = bool(summary["bytes_reduction"])
  unit = BYTES_UNIT_NAME
  header = ["method", "n", f"per round ↑ / ↓ ({unit})"]
  for key in keys:
    header += [f"total to {key}% ({unit})"] + ([f"saved ({key}%)"] if with_reduction else [])
  header.append(f"total, whole run ({unit})")
  lines = [common.markdown_row(header), common.markdown_rule(len(header))]
  for row, label in rows:
    per_round = summary["bytes_per_round"].get(row)
    if per_round is None:
      what = "(no byte counts)" if row in summary["rows_done"] else "–"
      lines.append(common.markdown_row([label, _n(summary, row), what]
                                       + [""] * (len(header) - 3)))
      continue
    cells = [label, _n(summary, row),
             f"{per_round['up'] / BYTES_UNIT:.2f} / {per_round['down'] / BYTES_UNIT:.2f}"
             + ("" if per_round["constant"] else " (mean; varies)")]
    for key in keys:
      cells.append(format_censored(summary["bytes"][row][key], scale=BYTES_UNIT))
      if with_reduction:
        cells.append(format_reduction(summary["bytes_reduction"].get(row, {}).get(key),
                                      is_reference=row == ref))
    cells.append(format_censored(summary["bytes"][row]["all"], scale=BYTES_UNIT))
    lines.append(common.markdown_row(cells))
  return "\n".join(lines)


def cell_targets(cells: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[float]:
  """The targets the cells' results.json report rounds to (config.eval.targets)."""
  found: list[float] = []
  for per_seed in cells.values():
    for cell in per_seed.values():
      for key in cell.get("results", {}).get("rounds_to_target", {}):
        if float(key) not in found:
          found.append(float(key))
  return sorted(found)


def seed_values(summary: Mapping[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
  """{row: {"final": {seed: final accuracy}}} of `summarize`'s output."""
  return {row: {"final": dict(stat["per_seed"])} for row, stat in summary["final"].items()}


def seed_by_seed(summary: Mapping[str, Any], rows: Sequence[str]) -> dict[str, Any] | None:
  """Every row's final accuracy minus its reference row's (FedAvg, or the row
  `summary["references"]` names) on each seed both finished, with its verdict
  (`common.seed_comparison`, kind "final"), and {"references": {row: its reference}}; None
  without a reference row with a finished seed. Each seed draws the same partition and data
  for a row and its reference, so the pairing is meaningful."""
  reference = summary["reference"] or summary["base"]
  own = summary["references"]
  if not any(own.get(row, reference) in summary["final"] for row in rows):
    return None
  values = seed_values(summary)
  comparison = {"reference": reference, "kinds": ["final"], "rows": {}, "references": {}}
  for row in rows:
    if row != reference:
      other = own.get(row, reference)
      comparison["rows"][row] = common.seed_comparison(values, other, [row],
                                                       ("final",))["rows"][row]
      comparison["references"][row] = other
  return comparison


def render_setting(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
                   *, show_diff: bool) -> tuple[str, dict[str, Any]]:
  """A setting's tables (final accuracy and, seed by seed, its difference from FedAvg; rounds
  to each target; bytes) and numbers ({"summary", "paper"[, "seed_by_seed"]}).

  Args:
    table: the `tables.Table`.
    setting: its `tables.Setting` (paper: a `paper_numbers.TWO_STREAM` entry).
    cells: {row: {seed: {"results", "records", ...}}} of the finished cells.
    show_diff: the runs are in the paper's setting (adds final − paper).
  """
  paper = setting.paper or {}
  htfllib = paper.get("metric") == "htfllib"  # the paper's numbers are HtFLlib's metric
  done = {r.key: dict(cells[r.key]) for r in setting.rows if cells.get(r.key)}
  targets = cell_targets(done)
  own_references = {r.key: r.reference for r in setting.rows if r.reference}
  summary = summarize(done, targets=targets, reference=table.base or REFERENCE,
                      references=own_references)
  keys = summary["targets"] or sorted(paper.get("rounds", {}), key=float)
  rows = [(r.key, r.label) for r in setting.rows]
  labels = dict(rows)
  each = {len(c["results"].get("rounds", [])) for per_seed in done.values()
          for c in per_seed.values()}
  averaged = ("the mean of its last evaluated rounds" if len(each) != 1 else
              "its last evaluated round" if each == {1} else
              f"the mean of its last {each.pop()} evaluated rounds")
  parts = [f"Accuracy: {KIND_TEXT.get(summary['kind'], summary['kind'])}, in %; a target some "
           "seed never reaches reads \"> m (k/S reached)\", m counting that seed's rounds as "
           "the run's length (a strict lower bound, no std); reduce / saved: 1 − mean(row) / "
           "mean(FedAvg), \"> x%\" when FedAvg is censored, \"< x%\" when the row is, n/a when "
           "both are (each has a seed that never reached the target)"
           + ("" if not own_references else
              "; " + "; ".join(f"{common.short_label(labels[row])}: against "
                               f"{common.short_label(labels.get(other, other))}"
                               for row, other in own_references.items()))
           + ".",
           "", (f"Final accuracy (each run: {averaged})" if htfllib else
                f"Final accuracy (FedFusion Table 1 layout; each run: {averaged})"), "",
           final_table(summary, rows, {} if htfllib else paper, show_diff=show_diff), ""]
  numbers_htfllib = {}
  if htfllib:
    per_row = {row: {s: htfl_accuracy(c.get("records", []),
                                      c.get("metadata", {}).get("test_sizes", {}))["htfllib"]
                     for s, c in per_seed.items()} for row, per_seed in done.items()}
    numbers_htfllib = {row: common.seed_stat({s: v for s, v in values.items() if v is not None})
                       for row, values in per_row.items()
                       if any(v is not None for v in values.values())}
    lines = [common.markdown_row(["method", "n", "HtFLlib's metric (%)"]),
             common.markdown_rule(3)]
    for key, label in rows:
      stat, printed = numbers_htfllib.get(key), paper.get("final", {}).get(key)
      lines.append(common.markdown_row([
          label, str(stat["n"]) if stat else "0",
          common.format_cell(stat["mean"], stat["std"], printed) if stat else
          "–" if printed is None else f"– (paper {printed:.2f})"]))
    parts += [f"HtFLlib's metric, as the paper reports it: each run's best evaluated round, its "
              f"accuracy pooled over the clients' test splits; the paper's number beside it "
              f"({paper.get('where', '')})", "", "\n".join(lines), ""]
  comparison = seed_by_seed(summary, [r.key for r in setting.rows])
  numbers: dict[str, Any] = {"summary": summary, "paper": dict(paper)}
  if htfllib:
    numbers["htfllib"] = numbers_htfllib
  if comparison is not None:
    reference = common.short_label(labels.get(comparison["reference"],
                                              comparison["reference"]))
    own = {row: common.short_label(labels.get(other, other))
           for row, other in own_references.items()}
    against = "".join(f"; {common.short_label(labels[row])} against {label}"
                      for row, label in own.items())
    same = "a row and its reference" if own else "every method"
    minus = "its reference" if own else reference
    parts += [f"Final accuracy seed by seed against {reference}{against} (each seed draws "
              f"the same data for {same}): the row's minus {minus}'s on each seed both rows "
              "finished; a tie (0.00) has no sign, and fewer than 2 paired seeds give no "
              "verdict", "",
              common.seed_table(comparison, labels, kind_labels={"final": "final accuracy"},
                                reference_label=reference, row_reference_labels=own), ""]
    numbers["seed_by_seed"] = comparison
  if keys:
    parts += ["Rounds to reach the target accuracy (FedFusion Table 2 layout)", "",
              rounds_table(summary, rows, paper, targets=keys), ""]
  if summary["rows_done"]:
    parts += [f"Communication ({BYTES_UNIT_NAME} = 10^6 bytes, up + down, whole cohort)", "",
              bytes_table(summary, rows), ""]
  return "\n".join(parts).rstrip() + "\n", numbers


def figure(table: Any, setting: Any, cells: Mapping[str, Mapping[int, Mapping[str, Any]]],
           path: Any, *, title: str) -> bool:
  """Accuracy vs round, a line per row (mean over seeds, min-max band), the targets dotted."""
  done = {r.key: cells[r.key] for r in setting.rows if cells.get(r.key)}
  if not done:
    return False
  kinds = {headline_kind(c["results"]) for per_seed in done.values() for c in per_seed.values()}
  kind = "accuracy" if "accuracy" in kinds else "intra"
  curves = {r: {kind: common.mean_curves([c.get("records", []) for c in per_seed.values()],
                                         kind)} for r, per_seed in done.items()}
  return common.plot_curves(
      curves, path, title=title, labels={r.key: r.label for r in setting.rows}, kinds=(kind,),
      titles={kind: KIND_TEXT.get(kind, kind).replace(" (", "\n(")},
      targets=cell_targets(done))

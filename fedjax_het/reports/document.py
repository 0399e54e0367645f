"""A table's document from what its results directory holds, and the docs/results.md blocks.

`render(table, scale, results_dir)` reads every finished cell of the table
(`results/<table>/<scale>/<cell>/`: results.json, metrics.jsonl,
metadata.json and cell.json, the record `fedjax_het.grid.provenance` keeps of who trained
it where) and lays it out: a header (paper, table, protocol, scale, data
provenance and sizes, whether the runs are in the paper's setting, the devices,
commits and wall time that produced them) and each setting's tables from its
family's report (`domain_shift`, `partitioned`, `class_incremental`). The
document depends on nothing but those files, so it is the same whenever it is
rendered from the same results: `table.md` beside the cells and a block of
docs/results.md (between `<!-- reproduce:<table>:<scale> -->` and
`<!-- /reproduce -->`, in its "Reproduced tables" section) are two copies of it.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het.reports import class_incremental, common, domain_shift, partitioned
from fedjax_het.reports import tables as tables_lib

FAMILY_REPORTS = {"domain_shift": domain_shift, "partitioned": partitioned,
                  "class_incremental": class_incremental}
CELL_FILE = "cell.json"

DOC_TITLE = "# Results\n"
DOC_SECTION = """## Reproduced tables

Each block below is one paper table at one scale, as
`python experiments/reproduce.py --table=<id> --scale=<quick|mid|paper> --results-dir=results
--report` renders it from the cells the repository ships under `results/<id>/<scale>/`
(tests/test_reproduce.py keeps the two equal); `python experiments/reproduce.py --list` lists
every table id and its finished cells. A cell is the mean ± sample std over the seeds that
finished (n shown), with the paper's number beside it; quick-scale blocks come from the
`_quick` configs (narrow models, few rounds, small data) and show that training works, not
the paper's numbers. `python experiments/reproduce.py --table=<id> --scale=quick
--seeds=0,1,2` trains the table on your machine into `runs/reproduce/` and writes
`beside_shipped.md` there, your cells' numbers beside these and the paper's. On a GPU,
`python experiments/reproduce.py --queue=gpu --scale=paper --deadline-secs=540 --copy-to=DIR
--results-dir=results` trains the next unfinished paper-scale cells in priority order (FCCL+
and BASE on Office31, then on Digits, FedFusion Table 2, GLFC Table 1) and stops within 9
minutes; a rerun goes on where it stopped.
"""

_BLOCK = re.compile(r"<!-- reproduce:([A-Za-z0-9_]+):([a-z]+) -->\n(.*?)<!-- /reproduce -->\n",
                    re.S)


# --- reading results/ -----------------------------------------------------------------------


def _read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def read_records(cell_dir: pathlib.Path) -> list[dict[str, Any]]:
  """A cell's metrics.jsonl records (`common.read_records`)."""
  return common.read_records(cell_dir / "metrics.jsonl")


def read_cell(cell_dir: pathlib.Path) -> dict[str, Any] | None:
  """A finished cell's files, None unless its cell.json says "finished" and results.json
  exists: {"results", "records", "metadata", "cell", "workdir"}."""
  cell = _read_json(cell_dir / CELL_FILE)
  results = _read_json(cell_dir / "results.json")
  if not cell or cell.get("status") != "finished" or results is None:
    return None
  return {"results": results, "records": read_records(cell_dir),
          "metadata": _read_json(cell_dir / "metadata.json") or {}, "cell": cell,
          "workdir": str(cell_dir)}


def collect(table: tables_lib.Table, scale: str, results_dir: pathlib.Path
            ) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
  """{setting: {row: {seed: read_cell(...)}}} of the table's finished cells, any seed (each
  "workdir" relative to results_dir)."""
  out: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
  for setting in table.settings:
    per_row: dict[str, dict[int, dict[str, Any]]] = {}
    for row in setting.rows:
      probe = tables_lib.cell_dir(results_dir, table, setting, row, 0, scale)
      pattern = re.compile(re.escape(probe.name.rsplit("seed", 1)[0]) + r"seed(\d+)$")
      found = {}
      if probe.parent.is_dir():
        for path in sorted(probe.parent.iterdir()):
          match = pattern.fullmatch(path.name)
          if match and path.is_dir():
            cell = read_cell(path)
            if cell is not None:
              cell["workdir"] = path.relative_to(results_dir).as_posix()
              found[int(match.group(1))] = cell
      if found:
        per_row[row.key] = dict(sorted(found.items()))
    out[setting.key] = per_row
  return out


# --- the header -------------------------------------------------------------------------------


def paper_setting(table: tables_lib.Table, scale: str,
                  cells: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
  """(whether the cells are in the paper's setting, the reason).

  The paper's setting: paper scale, real data everywhere (every domain and the
  public set; an absent public set is fine), no --set override that changes
  results and no custom configure hook in any cell.
  """
  reasons = []
  if scale != "paper":
    reasons.append(f"{scale} scale")
  sources = common.provenance([c["metadata"] for c in cells])
  synthetic = [name for name, vs in sources.items()
               if any(common.source_kind(v) not in ("real", "none") for v in vs)]
  if not cells:
    reasons.append("no finished cell")
  elif synthetic:
    reasons.append(f"synthetic data for {', '.join(synthetic)}")
  elif not sources:
    reasons.append("data provenance unknown")
  overrides = list(dict.fromkeys(o for c in cells for o in c["cell"].get("overrides", [])))
  if overrides:
    reasons.append(f"overrides {', '.join(overrides)}")
  if any(c["cell"].get("custom_configure") for c in cells):
    reasons.append("a custom configure hook")
  if reasons:
    return False, ("no (" + "; ".join(reasons) + "): the paper's numbers are shown for "
                   "reference, not compared")
  return True, "yes (paper scale, real data, no overrides): ours − paper is shown"


def _counted(values: Sequence[str]) -> str:
  counts: dict[str, int] = {}
  for value in values:
    counts[value] = counts.get(value, 0) + 1
  return ", ".join(f"{v} ({n} cell{'s' if n != 1 else ''})" for v, n in counts.items())


def ran_stacked(record: Mapping[str, Any]) -> bool:
  """Whether a cell.json's seed trained (in any invocation) inside one vmapped program of
  several seeds, whose numbers are near, not equal to, the seed trained alone."""
  return bool(record.get("stacked_seeds")) or any(
      i.get("stacked_seeds") for i in record.get("invocations", []))


def runs_line(cells: Sequence[Mapping[str, Any]]) -> str:
  """Devices, code revisions (git commits) and wall time of the runs that trained the cells
  (their cell.json)."""
  if not cells:
    return "no finished cell"
  devices = [c["cell"].get("device_kind") or "unknown" for c in cells]
  commits = [(c["cell"].get("commit") or "unknown")[:10]
             + ((" with local changes (their patch beside the cell)"
                 if c["cell"].get("patch_sha256") else " with local changes")
                if c["cell"].get("dirty") else "") for c in cells]
  modes = ["its seed in a program of several stacked seeds" if ran_stacked(c["cell"])
           else "its seed alone" for c in cells]
  seconds = [c["cell"].get("seconds") for c in cells]
  known = [s for s in seconds if s is not None]
  wall = (f"{sum(known):.1f} s in all ({len(known)} cell{'s' if len(known) != 1 else ''}"
          + (f"; {len(seconds) - len(known)} unknown" if len(known) < len(seconds) else "")
          + ")")
  return (f"device {_counted(devices)}; code revision {_counted(commits)}; trained "
          f"{_counted(modes)}; wall time {wall}")


def _variant_text(setting: tables_lib.Setting, row: tables_lib.Row, scale: str) -> str:
  fields = ", ".join(f"{k}={v!r}" for k, v in dict(row.fields(scale)).items())  # last wins
  if not (row.config or setting.config):
    return f"`{row.config_variant(scale)}`"
  return (f"`{tables_lib.config_file_name(row.config or setting.config)}:"
          f"{row.config_variant(scale)}`"
          + (f" with {fields}" if fields else ""))


# --- the document -----------------------------------------------------------------------------


def render(table: tables_lib.Table, scale: str, results_dir: pathlib.Path
           ) -> tuple[str, dict[str, Any]]:
  """The table's document (markdown) and its numbers (table.json), from results_dir."""
  cells = collect(table, scale, results_dir)
  flat = [c for per_row in cells.values() for per_seed in per_row.values()
          for c in per_seed.values()]
  metadatas = [c["metadata"] for c in flat if c.get("metadata")]
  sources = common.provenance(metadatas)
  in_paper, reason = paper_setting(table, scale, flat)
  seeds = sorted({s for per_row in cells.values() for per_seed in per_row.values()
                  for s in per_seed})
  most = max((len(per_seed) for per_row in cells.values() for per_seed in per_row.values()),
             default=1)
  report = FAMILY_REPORTS[table.family]
  lines = [f"## {table.id} ({scale} scale): {table.title}", "",
           f"Paper: {table.paper}, {table.source}. Protocol: {table.protocol}.", "",
           f"- cells: {len(flat)} finished ({'seed' if len(seeds) == 1 else 'seeds'} "
           f"{', '.join(map(str, seeds)) or 'none'}); "
           f"{common.std_line(most)} (n shown)",
           f"- data: {common.provenance_line(sources)}",
           f"- data sizes: {common.sizes_line(metadatas)}",
           f"- the paper's setting: {reason}",
           f"- runs: {runs_line(flat)}"]
  copies = [c["cell"]["copy_of"] for c in flat if c["cell"].get("copy_of")]
  if copies:
    lines.append(f"- shared runs: {len(copies)} of the cells are the same run (config and seed) "
                 "as a finished cell of another table, copied from it: "
                 f"{_counted([source.split('/')[0] for source in copies])}; each cell's "
                 "cell.json names its source (`copy_of`)")
  numbers: dict[str, Any] = {
      "table": table.id, "scale": scale, "title": table.title, "paper": table.paper,
      "source": table.source, "protocol": table.protocol, "family": table.family,
      "std": common.STD_CONVENTION + " over the seeds that finished (null with one)",
      "in_paper_setting": in_paper, "paper_setting_reason": reason,
      "data_sources": sources, "data_sizes": common.sizes_line(metadatas),
      "runs": runs_line(flat),
      "wall_seconds": sum(c["cell"].get("seconds") or 0.0 for c in flat), "settings": {}}
  for setting in table.settings:
    text, setting_numbers = report.render_setting(table, setting, cells[setting.key],
                                                  show_diff=in_paper)
    if len(table.settings) > 1 or setting.label:
      lines += ["", f"### {setting.label}"]
    lines += ["", text.rstrip()]
    lines += ["", "Rows: " + "; ".join(f"{r.label} = {_variant_text(setting, r, scale)}"
                                        for r in setting.rows) + "."]
    if setting.cells_of:
      lines.append(f"Cells: those of table {setting.cells_of}.")
    lines += [f"- {note}" for note in setting.notes]
    setting_numbers["cells"] = {
        row: {str(seed): {"workdir": c["workdir"], "seconds": c["cell"].get("seconds"),
                          "device_kind": c["cell"].get("device_kind"),
                          "commit": c["cell"].get("commit"),
                          **({"copy_of": c["cell"]["copy_of"]} if c["cell"].get("copy_of")
                             else {})}
              for seed, c in per_seed.items()}
        for row, per_seed in cells[setting.key].items()}
    numbers["settings"][setting.key] = setting_numbers
  if table.notes:
    lines += ["", "Notes:"] + [f"- {note}" for note in table.notes]
  return "\n".join(lines).rstrip() + "\n", numbers


def seed_values(table: tables_lib.Table, numbers: Mapping[str, Any],
                cells: Mapping[str, Mapping[str, Mapping[int, Mapping[str, Any]]]],
                setting: str, row: str, kind: str) -> dict[int, float | None]:
  """{seed: value} of a row's finished cells: what the rendered table shows of `kind`.

  Args:
    table: the table.
    numbers: `render`'s numbers of the table at one scale.
    cells: `collect`'s cells of the table at that scale.
    setting: the setting key.
    row: the row key.
    kind: inter / intra (domain shift: the AVG, also where the paper prints one kind only;
      inter:<participant> / intra:<participant>: that participant's column), final
      (partitioned: the final accuracy), reach:T (partitioned: the first round at or above
      T%, None for a seed that never reaches it), round:R (partitioned: the accuracy at round
      R), avg / forgetting (class incremental, percent).

  Returns:
    {seed: value} in seed order ({} for a row without a finished cell); ValueError for a
    kind the row's cells do not have.
  """
  summary = numbers["settings"][setting]["summary"]
  if table.family == "domain_shift":
    results_of = {r: {s: c["results"] for s, c in per_seed.items()}
                  for r, per_seed in cells[setting].items()}
    domain_summary = domain_shift.summarize(results_of, base=None)
    what, _, column = kind.partition(":")
    if column:
      per_column = domain_summary["rows"].get(row, {}).get(what, {})
      if row in domain_summary["rows"] and column not in per_column:
        raise ValueError(f"{table.id} {setting} {row}: no {kind!r} (has "
                         f"{sorted(f'{what}:{c}' for c in per_column)})")
      return dict(per_column.get(column, {}).get("per_seed", {}))
    values = domain_shift.seed_values(domain_summary)
  elif table.family == "partitioned":
    if kind.startswith(("reach:", "round:")):
      what, _, number = kind.partition(":")
      out: dict[int, float | None] = {}
      for seed, cell in cells[setting].get(row, {}).items():
        if what == "reach":
          out[seed] = partitioned.first_round_reaching(cell["records"], summary["kind"],
                                                       float(number))
        else:
          curve = dict(zip(*partitioned.accuracy_curve(cell["records"], summary["kind"])))
          out[seed] = curve.get(int(number))
      return out
    values = partitioned.seed_values(summary)
  else:
    values = class_incremental.seed_values(summary)
  if row not in values:
    return {}
  if kind not in values[row]:
    raise ValueError(f"{table.id} {setting} {row}: no {kind!r} (has {sorted(values[row])})")
  return dict(values[row][kind])


def headline(family: str, results: Mapping[str, Any]) -> dict[str, float]:
  """A cell's headline numbers by name: domain shift "inter AVG" and "intra AVG";
  partitioned "accuracy" (the headline kind's AVG); class incremental "Avg." (percent)."""
  if family == "domain_shift":
    return {f"{kind} AVG": float(results[kind]["AVG"]) for kind in ("inter", "intra")
            if "AVG" in results.get(kind, {})}
  if family == "partitioned":
    kind = partitioned.headline_kind(results)
    return {"accuracy": float(results[kind]["AVG"])} if "AVG" in results.get(kind, {}) else {}
  value = results.get("average_incremental_accuracy")
  return {} if value is None else {"Avg.": 100.0 * float(value)}


def render_beside(table: tables_lib.Table, scale: str, results_dir: pathlib.Path,
                  shipped_dir: pathlib.Path) -> str:
  """The headline numbers of the cells in `results_dir` (a user's runs) beside those of the
  same cells the repository ships in `shipped_dir`, and the paper's where it prints them:
  mean ± sample std (n) over each side's finished seeds."""
  yours, shipped = collect(table, scale, results_dir), collect(table, scale, shipped_dir)
  lines = [f"## {table.id} ({scale} scale): your cells beside the shipped ones", "",
           f"Yours: {results_dir / table.id / scale}. Shipped: {shipped_dir / table.id / scale}. "
           "Each cell: mean ± sample std (ddof=1) over the finished seeds (n)."]

  def stat(cells: Mapping[int, Mapping[str, Any]], name: str) -> str:
    values = [headline(table.family, c["results"]).get(name) for c in cells.values()]
    values = [v for v in values if v is not None]
    if not values:
      return "–"
    mean, std = common.mean_std(values)
    return f"{common.format_cell(mean, std)} ({len(values)})"

  for setting in table.settings:
    names = list(dict.fromkeys(
        name for side in (yours, shipped) for per_seed in side[setting.key].values()
        for c in per_seed.values() for name in headline(table.family, c["results"])))
    if not names:
      continue
    header = ["method"] + [f"{name}: {who}" for name in names for who in ("yours", "shipped")]
    paper = {name: {row: setting.paper.get(name.split()[0], {}).get(row, {}).get("AVG")
                    for row in (r.key for r in setting.rows)} for name in names
             } if table.family == "domain_shift" else {}
    if paper:
      header += [f"{name}: paper" for name in names]
    lines += ["", f"### {setting.label}" if setting.label else "", "",
              common.markdown_row(header), common.markdown_rule(len(header))]
    for row in setting.rows:
      cells = [row.label] + [stat(side[setting.key].get(row.key, {}), name)
                             for name in names for side in (yours, shipped)]
      if paper:
        cells += ["–" if paper[name][row.key] is None else f"{paper[name][row.key]:.2f}"
                  for name in names]
      lines.append(common.markdown_row(cells))
  return "\n".join(line for i, line in enumerate(lines)
                   if line or (i and lines[i - 1])).rstrip() + "\n"


def figures(table: tables_lib.Table, scale: str, results_dir: pathlib.Path,
            out_dir: pathlib.Path) -> list[pathlib.Path]:
  """Each setting's accuracy figure (<setting>_accuracy.png, or accuracy.png) in out_dir."""
  report = FAMILY_REPORTS[table.family]
  cells = collect(table, scale, results_dir)
  written = []
  for setting in table.settings:
    name = f"{setting.key}_accuracy.png" if len(table.settings) > 1 else "accuracy.png"
    title = f"{table.id} ({scale} scale)" + (f": {setting.label}" if setting.label else "")
    if report.figure(table, setting, cells[setting.key], out_dir / name, title=title):
      written.append(out_dir / name)
  return written


# --- docs/results.md ----------------------------------------------------------------------------


def blocks(text: str) -> list[tuple[str, str, str]]:
  """The (table id, scale, content) of every reproduce block of a document."""
  return [(m.group(1), m.group(2), m.group(3)) for m in _BLOCK.finditer(text)]


def rewrite(text: str, table_id: str, scale: str, content: str) -> str:
  """`text` with the block of (table_id, scale) replaced by `content`; a new block goes at the
  end, after DOC_SECTION (added first when the document lacks it; an empty document also gets
  DOC_TITLE). Everything else of the document stays as it is."""
  block = f"<!-- reproduce:{table_id}:{scale} -->\n{content.rstrip()}\n<!-- /reproduce -->\n"
  for match in _BLOCK.finditer(text):
    if (match.group(1), match.group(2)) == (table_id, scale):
      return text[:match.start()] + block + text[match.end():]
  if DOC_SECTION.splitlines()[0] not in text.splitlines():
    text = (text.rstrip("\n") + "\n\n" if text.strip() else DOC_TITLE + "\n") + DOC_SECTION
  return text.rstrip("\n") + "\n\n" + block


def stale_blocks(text: str, results_dir: pathlib.Path,
                 registry: Mapping[str, tables_lib.Table] | None = None) -> list[str]:
  """"<table>:<scale>" of every block of `text` that differs from what `render` gives from
  results_dir now (an unknown table id counts as stale)."""
  registry = tables_lib.TABLES if registry is None else registry
  stale = []
  for table_id, scale, content in blocks(text):
    table = registry.get(table_id)
    if table is None or content.rstrip() != render(table, scale, results_dir)[0].rstrip():
      stale.append(f"{table_id}:{scale}")
  return stale

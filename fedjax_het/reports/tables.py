"""The registry of the papers' tables that `experiments/reproduce.py` reproduces.

A `Table` is one table id: the paper and table it reproduces, the protocol, the
scenario family whose report renders it (`domain_shift`, `partitioned`,
`class_incremental`), and one or more `Setting`s (a scenario, or a dataset and
partition), each with its `Row`s: a method or variant, its config file and
variant (paper scale; the quick scale adds "_quick"), the config fields the row
sets on both scales, and where its paper numbers come from. The paper's numbers
themselves are transcribed in `paper_numbers` and referenced here; a table
whose numbers the paper does not print says so in its notes.

A cell is (setting, row, seed) at a scale; `fedjax_het.grid` trains it into
`results/<table>/<scale>/<cell>/`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_het.configs import _two_stream
from fedjax_het.errors import ConfigError
from fedjax_het.reports import paper_numbers as numbers

FAMILIES = ("domain_shift", "partitioned", "class_incremental")
#: quick: the `_quick` configs (narrow models, few rounds: minutes on a CPU); mid: the `_mid`
#: configs (about an hour a cell at most on a 2-core CPU: for FCCL+ the code protocol's rounds,
#: public steps and local epochs on width-1/8 backbones; for FedMMD's MNIST shards and
#: FedFusion's permuted MNIST the paper protocol with fewer test, training images or local
#: epochs, configs/_two_stream.py; for GLFC Table 1 a width-1/8 ResNet-18 and 2 local epochs a
#: round, configs/cifar100.py; the tables whose configs have it, `Table.scales`); paper: the
#: paper's configs.
SCALES = ("quick", "mid", "paper")


@dataclasses.dataclass(frozen=True)
class Row:
  """A method or variant of a table.

  Attributes:
    key: the row's name in --methods and in its cells' directory names.
    label: the row label of the rendered table.
    variant: the config variant at paper scale (get_config's argument).
    quick_variant: the variant at quick scale ("" -> variant + "_quick").
    overrides: (dotted config field, value) pairs set on both scales.
    quick_overrides: (field, value) pairs set after `overrides` at quick scale only (a
      row whose paper value would not fit the quick config, e.g. FCCL+ Table XIX's local
      epochs).
    source: where the row's paper numbers come from, when that is more than
      the table's own source (e.g. the conference protocol); "" otherwise.
    config: the row's config family (a module of `fedjax_het.configs`) when it is not its
      setting's ("").
    reference: the row this row's differences, reductions and seed-by-seed verdicts are read
      against when it is not the table's base ("": the base); partitioned tables only (a
      diagnosis row against its own counterpart, e.g. FedFusion+Conv's local models against
      FedAvg's).
  """
  key: str
  label: str
  variant: str
  quick_variant: str = ""
  overrides: tuple[tuple[str, Any], ...] = ()
  source: str = ""
  config: str = ""
  quick_overrides: tuple[tuple[str, Any], ...] = ()
  reference: str = ""

  def config_variant(self, scale: str) -> str:
    if scale == "quick":
      return self.quick_variant or f"{self.variant}_quick"
    if scale == "mid":
      return f"{self.variant}_mid"
    return self.variant

  def fields(self, scale: str) -> tuple[tuple[str, Any], ...]:
    """The (field, value) pairs set on the config at `scale`, in order."""
    return self.overrides + (self.quick_overrides if scale == "quick" else ())


@dataclasses.dataclass(frozen=True, eq=False)
class Setting:
  """One scenario of a table.

  Attributes:
    key: "" for a table of one setting, else its name in cell names.
    label: its heading in the rendered table.
    config: the config family (a module of `fedjax_het.configs`, e.g. "digits"); a path
      to a config file (relative to the repository root) also works.
    rows: the rows, in the paper's order.
    scenario: domain shift: the `paper_numbers.DOMAINS` scenario (the
      columns); partitioned: "<dataset>_<setting>"; class incremental: "".
    paper: the paper's numbers, in the family's layout: domain shift
      {kind: {row: {column: value}}}; partitioned a `paper_numbers.TWO_STREAM`
      entry; class incremental {row: {"seen": (...), "avg": value}}.
    cells_of: the table id whose cells this setting shares ("" -> its own): a
      setting of another table with the very same rows.
    notes: what a reader needs about this setting.
    paper_delta: domain shift: the paper's printed Δ vs BASE, {kind: {row: Δ}}
      (`paper_numbers`, as printed, never computed); a row or kind without one
      has no paper Δ beside ours.
  """
  key: str
  label: str
  config: str
  rows: tuple[Row, ...]
  scenario: str = ""
  paper: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  cells_of: str = ""
  notes: tuple[str, ...] = ()
  paper_delta: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
  """A table id of `experiments/reproduce.py`.

  Attributes:
    id: the --table value.
    title: a one-line title.
    paper: the short citation of the paper.
    source: the table(s) of that paper.
    protocol: the paper's protocol in one sentence.
    family: one of FAMILIES.
    settings: the settings, each with its rows.
    kinds: domain shift: the accuracy kinds the paper prints ("inter",
      "intra").
    base: the row Δ vs BASE is taken against (None: no Δ column).
    notes: what a reader needs about the whole table.
    kind_sources: domain shift: the paper's table of each kind, when the kinds
      come from different tables ({"inter": "Table VIII", ...}).
    scales: the scales of `SCALES` whose configs the rows have.
  """
  id: str
  title: str
  paper: str
  source: str
  protocol: str
  family: str
  settings: tuple[Setting, ...]
  kinds: tuple[str, ...] = ("inter", "intra")
  base: str | None = None
  notes: tuple[str, ...] = ()
  kind_sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  scales: tuple[str, ...] = ("quick", "paper")

  def setting(self, key: str) -> Setting:
    for setting in self.settings:
      if setting.key == key:
        return setting
    raise KeyError(key)

  @property
  def row_keys(self) -> list[str]:
    return list(dict.fromkeys(r.key for s in self.settings for r in s.rows))


# --- domain shift: FCCL+ and FCCL ---------------------------------------------------------

FCCLPLUS = "FCCL+ (Huang et al., TPAMI 2023)"
FCCL = "FCCL (Huang et al., CVPR 2022)"
FCCLPLUS_PROTOCOL = ("heterogeneous backbones per domain (FCCL+ Table VI), private sizes of "
                     "Table V, 5000 CIFAR-100 public images, 40 rounds of 20 local epochs, BASE "
                     "50 private epochs; mean accuracy of the last 3 rounds, top-1 (Digits, "
                     "Office-Caltech) or top-5 (Office31, Office-Home)")
FCCL_PROTOCOL = ("the conference protocol: heterogeneous backbones per domain, private sizes "
                 "150/80/5000/1800 (Digits) and 1400/2000/2500/2000 (Office-Home), 5000 "
                 "CIFAR-100 public images, 40 rounds, SOLO 50 private epochs (also the initial "
                 "models); top-1 (Digits) or top-5 (Office-Home)")

METHOD_LABELS = {"solo": "BASE (solo)", "fedmd": "FedMD", "feddf": "FedDF",
                 "fedmatch": "FedMatch", "rhfl": "RHFL", "fccl": "FCCL", "fcclplus": "FCCL+",
                 "fedavg": "FedAvg", "fedprox": "FedProx", "moon": "MOON", "fedproc": "FedProc",
                 "fedrs": "FedRS", "fml": "FML", "rcfl": "RCFL", "fedproto": "FedProto",
                 "fd": "FD (FedDistill)", "fedtgp": "FedTGP", "lg_fedavg": "LG-FedAvg",
                 "fedgh": "FedGH", "fedkd": "FedKD"}
#: The methods of FCCL+ Tables VIII/IX, in the paper's row order.
FCCLPLUS_METHODS = ("solo", "fedmd", "feddf", "fedmatch", "rhfl", "fccl", "fcclplus")
#: The FCCL rows of FCCL+'s tables come from the benchmark's FCCL, whose collaborative target
#: is the mean of every participant's current logits, its own included; the conference code
#: (the default of the configs) puts the participant's previous-round model in its own slot.
BENCHMARK_FCCL = (("fccl.own_slot", "current"),)
#: FCCL+ Tables VIII/IX rows that are FCCL (CVPR) Tables 1/2's numbers digit for digit.
CONFERENCE_ROWS = ("solo", "fedmd", "feddf", "fedmatch", "fccl")
CONFERENCE_SCENARIOS = ("digits", "office_home")
CONFERENCE_SOURCE = "= FCCL (CVPR 2022) Tables 1/2: the conference protocol"
#: The variant prefix of each scenario in its config file.
SCENARIO_CONFIGS = {"digits": ("digits", ""),
                    "office_caltech": ("office", "caltech_"),
                    "office31": ("office", "office31_"),
                    "office_home": ("office", "home_")}
SCENARIO_LABELS = {"digits": "Digits", "office_caltech": "Office-Caltech",
                   "office31": "Office31", "office_home": "Office-Home"}
SCENARIO_NOTES = {
    "digits": ("the four domains are read from digits.npz, which `python -m "
               "fedjax_het.data.download mnist usps svhn` and `... syn --from <archive>` "
               "write; a domain it lacks is the embedded synthetic domain, and the provenance "
               "line says so",),
    "office_caltech": ("the caltech domain needs an image folder: --set "
                       "scenario.sources.caltech=folder:<path> (fedjax_het/configs/office.py)",),
    "office_home": ("every Office-Home domain needs an image folder: --set "
                    "scenario.sources.<art|clipart|product|real_world>=folder:<path>",),
}


def _paper(table: Mapping[str, Mapping[str, Mapping[str, tuple[float, ...]]]], scenario: str,
           rows: Sequence[str], row_keys: Mapping[str, str] | None = None
           ) -> dict[str, dict[str, dict[str, float]]]:
  """{kind: {row: {column: value}}} of a `paper_numbers` domain table (rows it prints)."""
  row_keys = row_keys or {}
  out: dict[str, dict[str, dict[str, float]]] = {}
  for kind in table:
    for row in rows:
      printed = numbers.domain_row(table, kind, scenario, row_keys.get(row, row))
      if printed:
        out.setdefault(kind, {})[row] = printed
  return out


def _paper_delta(deltas: Mapping[str, Mapping[str, Mapping[str, float]]], scenario: str,
                 rows: Sequence[str]) -> dict[str, dict[str, float]]:
  """{kind: {row: printed Δ}} of a `paper_numbers` Δ table ({kind: {scenario: {row: Δ}}}),
  the rows it prints a Δ for."""
  out: dict[str, dict[str, float]] = {}
  for kind, scenarios in deltas.items():
    printed = {row: scenarios[scenario][row] for row in rows
               if row in scenarios.get(scenario, {})}
    if printed:
      out[kind] = printed
  return out


def _ds_setting(scenario: str, rows: Sequence[Row], paper: Mapping[str, Any],
                notes: Sequence[str] = (), *,
                deltas: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
                ) -> Setting:
  """A domain-shift setting; `deltas`: the paper's printed Δ table, if it prints one."""
  path, _ = SCENARIO_CONFIGS[scenario]
  return Setting(key=scenario, label=SCENARIO_LABELS[scenario], config=path, rows=tuple(rows),
                 scenario=scenario, paper=paper,
                 notes=tuple(notes) + SCENARIO_NOTES.get(scenario, ()),
                 paper_delta=_paper_delta(deltas or {}, scenario, [r.key for r in rows]))


def _row(scenario: str, key: str, method: str, *, label: str | None = None,
         flags: str = "", overrides: Sequence[tuple[str, Any]] = (), source: str = "",
         quick_overrides: Sequence[tuple[str, Any]] = ()) -> Row:
  _, prefix = SCENARIO_CONFIGS[scenario]
  return Row(key=key, label=label or METHOD_LABELS.get(key, key),
             variant=f"{prefix}{method}{flags}", overrides=tuple(overrides), source=source,
             quick_overrides=tuple(quick_overrides))


#: Where Tables VIII/IX's printed Δ (shown beside ours) is not the printed AVG minus BASE's.
TABLE8_9_DELTA_SLIPS = {
    "office_caltech": "the paper's Δ beside ours is the printed one: FCCL inter prints -3.07 "
                      "where the printed AVGs give -2.06",
    "office_home": "the paper's Δ beside ours is the printed one: FCCL inter prints +7.49 "
                   "where the printed AVGs give +7.57",
}


def _fcclplus_table8_9(scenario: str) -> Table:
  conference = scenario in CONFERENCE_SCENARIOS
  rows = [_row(scenario, m, m, overrides=BENCHMARK_FCCL if m == "fccl" else (),
               source=CONFERENCE_SOURCE if conference and m in CONFERENCE_ROWS else "")
          for m in FCCLPLUS_METHODS]
  notes = ["the FCCL row runs the benchmark's FCCL (fccl.own_slot=current: every participant's "
           "current logits in the collaborative target), as FCCL+'s benchmark does"]
  if scenario in TABLE8_9_DELTA_SLIPS:
    notes.append(TABLE8_9_DELTA_SLIPS[scenario])
  if conference:
    notes.append("the paper's BASE, FedMD, FedDF, FedMatch and FCCL rows of this scenario are "
                 "FCCL (CVPR 2022) Tables 1 and 2's numbers digit for digit, i.e. they were "
                 "produced under the conference protocol (its FCCL puts the previous-round "
                 "model in the participant's own slot), not rerun for FCCL+; table "
                 "fccl_tables1_2 runs that protocol")
  return Table(
      id=f"fcclplus_{scenario}", title=f"FCCL+ Tables VIII/IX: {SCENARIO_LABELS[scenario]}",
      paper=FCCLPLUS, source="Tables VIII (inter →) and IX (intra ↩)",
      protocol=FCCLPLUS_PROTOCOL, family="domain_shift", base="solo",
      kind_sources=dict({"inter": "FCCL+ Table VIII",
                                           "intra": "FCCL+ Table IX"}),
      settings=(_ds_setting(scenario, rows,
                            _paper(numbers.FCCLPLUS_TABLE8_9, scenario, FCCLPLUS_METHODS),
                            deltas=numbers.FCCLPLUS_TABLE8_9_DELTA),),
      notes=tuple(notes), scales=SCALES)


#: The backbone width of the width diagnosis (`fcclplus_office31_width`): twice the mid scale's.
DIAGNOSIS_WIDTH = 0.25
#: The backbone widths of the BASE width diagnosis (`fcclplus_office31_base_width`): (row key
#: suffix, width), the mid scale's first, the paper's full width last.
BASE_WIDTHS = (("w8", 0.125), ("w4", 0.25), ("w2", 0.5), ("w1", 1.0))
#: The paper's BASE (50 private epochs, FCCL+ Sec. 4.1) as that diagnosis runs it: evaluated
#: rounds x local epochs.
BASE_ROUNDS, BASE_EPOCHS = 5, 10
#: The real Digits domains of the bundle, their Table VI backbones (`fcclplus_digits_real`).
REAL_DIGITS = (("mnist", "resnet10"), ("usps", "resnet12"))


def _variant_row(row: Row, key: str, label: str, fields: Sequence[tuple[str, Any]]) -> Row:
  """`row` with `fields` set after its own overrides, as a row that is not the paper's: its own
  key and label, no paper source."""
  return dataclasses.replace(row, key=key, label=label, source="",
                             overrides=row.overrides + tuple(fields))


def _fcclplus_diagnosis(scenario: str, suffix: str, title: str,
                        fields: Sequence[tuple[str, Any]], note: str, *,
                        same_participants: bool = True,
                        keys: Sequence[str] = ("solo", "fcclplus"),
                        variants: Sequence[tuple[str, str, str, tuple[tuple[str, Any], ...],
                                                 str]] = ()) -> Table:
  """The rows `keys` of Tables VIII/IX (BASE and FCCL+ unless told) at mid scale with
  `fields` set on every row: a diagnosis of a mid-scale disagreement with the paper, not a
  paper table (mid scale only; the paper's numbers of those rows beside). Without
  `same_participants` (the fields change the federation) only the paper's per-domain intra
  numbers stay: its AVGs and Δ average other participants, and its inter numbers score each
  model on other domains' test sets. `variants` adds rows that are not the paper's, each
  (key, label, the kept row or earlier variant it changes, its further fields, the note that
  says why), after the kept rows and without paper numbers."""
  base = _fcclplus_table8_9(scenario)
  [full] = base.settings
  rows = [dataclasses.replace(r, overrides=r.overrides + tuple(fields))
          for r in full.rows if r.key in keys]
  labels = [r.label.removesuffix(" (solo)") for r in rows]
  names = " and ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 1 else labels)
  by_key = {r.key: r for r in rows}
  for key, label, of, more, _ in variants:  # `of` may be an earlier variant
    by_key[key] = _variant_row(by_key[of], key, label, more)
    rows.append(by_key[key])

  def pick(by_kind: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {kind: {k: v for k, v in by_row.items() if k in keys}
            for kind, by_row in by_kind.items()}

  paper = pick(full.paper)
  if not same_participants:
    paper = {"intra": {row: {column: value for column, value in columns.items()
                             if column != "AVG"} for row, columns in paper["intra"].items()}}
  setting = dataclasses.replace(full, rows=tuple(rows), paper=paper,
                                paper_delta=pick(full.paper_delta) if same_participants else {})
  notes = [f"not the paper's table: the mid-scale cells of fcclplus_{scenario}'s {names} "
           f"rows with {', '.join(f'{k}={v}' for k, v in fields)}; {note}"]
  notes += [n for n in base.notes if "fccl" in keys and n.startswith("the FCCL row")]
  notes += [note for *_, note in variants]
  return dataclasses.replace(
      base, id=f"fcclplus_{scenario}_{suffix}",
      title=f"FCCL+ Tables VIII/IX: {SCENARIO_LABELS[scenario]}, {names} {title} (diagnosis)",
      settings=(setting,), scales=("mid",), notes=tuple(notes))


def _width_label(width: float) -> str:
  return "full width" if width == 1 else f"width 1/{round(1 / width)}"


def _fcclplus_base_width(scenario: str) -> Table:
  """BASE of Tables VIII/IX as the paper defines it, 50 private epochs of each participant
  alone, on the backbones at each of `BASE_WIDTHS`: a diagnosis of the mid scale's BASE, whose
  inter-domain AVG stays under the paper's at width 1/8 while its intra matches (mid scale
  only; the paper's BASE numbers beside every row; Δ against the width-1/8 row).

  The rows run the mid BASE's config (the code protocol's batches and data) with
  `BASE_ROUNDS` evaluated rounds of `BASE_EPOCHS` local epochs at a constant learning rate (the
  paper gives BASE no schedule; the mid BASE's first 50 epochs run at 1 and 0.9775 of the
  rate) and `eval.last_rounds=1`: the final number is the one after epoch 50."""
  base = _fcclplus_table8_9(scenario)
  [full] = base.settings
  [solo] = [r for r in full.rows if r.key == "solo"]
  budget = (("num_rounds", BASE_ROUNDS), ("local.epochs", BASE_EPOCHS),
            ("local.lr_decay", 0.0), ("eval.last_rounds", 1))
  rows = tuple(dataclasses.replace(
      solo, key=f"solo_{suffix}", label=f"BASE, {_width_label(width)}",
      overrides=solo.overrides + (("models.width", width),) + budget)
      for suffix, width in BASE_WIDTHS)
  paper = {kind: {r.key: dict(by_row["solo"]) for r in rows}
           for kind, by_row in full.paper.items() if "solo" in by_row}
  setting = dataclasses.replace(full, rows=rows, paper=paper, paper_delta={})
  return dataclasses.replace(
      base, id=f"fcclplus_{scenario}_base_width",
      title=f"FCCL+ Tables VIII/IX: {SCENARIO_LABELS[scenario]}, BASE after the paper's "
            f"{BASE_ROUNDS * BASE_EPOCHS} private epochs at {len(BASE_WIDTHS)} backbone widths "
            "(diagnosis)",
      settings=(setting,), scales=("mid",), base=rows[0].key,
      notes=(f"not the paper's table: BASE (each participant alone) of fcclplus_{scenario}'s "
             f"mid cells for {BASE_ROUNDS * BASE_EPOCHS} private epochs (the paper's BASE; "
             f"{BASE_ROUNDS} rounds of {BASE_EPOCHS} local epochs at a constant rate, the "
             "number after the last) with models.width = "
             f"{', '.join(str(w) for _, w in BASE_WIDTHS)}; the paper column is its BASE "
             "row, at full width, beside every row; Δ vs BASE is against the width-1/8 row: "
             "does the backbone width hold the mid BASE's inter-domain accuracy under the "
             "paper's?",))


def _fccl_variant(scenario: str, *, suffix: str, beside: tuple[str, ...], key: str,
                  label: str, field: str, value: Any, title: str, question: str) -> Table:
  """Rows `beside` of Tables VIII/IX (their cells are twins of fcclplus_<scenario>'s, the
  paper's numbers beside them) and the FCCL row with `field` = `value` (row `key`, no paper
  source); quick only; Δ against the first row."""
  base = _fcclplus_table8_9(scenario)
  [full] = base.settings
  rows = {r.key: r for r in full.rows}
  variant = _variant_row(rows["fccl"], key, label, ((field, value),))
  paper = {kind: {k: dict(by_row[k]) for k in beside if k in by_row}
           for kind, by_row in full.paper.items()}
  setting = dataclasses.replace(full, rows=(*(rows[k] for k in beside), variant), paper=paper,
                                paper_delta={})
  return dataclasses.replace(
      base, id=f"fcclplus_{scenario}_{suffix}",
      title=f"FCCL+ Tables VIII/IX: {SCENARIO_LABELS[scenario]}, {title} (diagnosis)",
      settings=(setting,), scales=("quick",), base=beside[0],
      notes=(f"not the paper's table: {question}",))


def _fccl_teachers(scenario: str) -> Table:
  """The FCCL row of Tables VIII/IX beside FCCL with its two local teachers (the previous
  round's model and the pretrained one, FCCL Eq. 4-7) run in train mode (`fccl.teacher_train_mode`,
  batch statistics, as the FCCL+ code runs its FNTD teacher) instead of the FCCL code's eval
  mode (running statistics): a diagnosis of FCCL below BASE at quick scale while Table X's FCCM
  row, the same objective in the FCCL+ module with train-mode teachers, is not (quick only;
  Δ against the FCCL row; the paper's FCCL numbers beside the FCCL row)."""
  return _fccl_variant(
      scenario, suffix="fccl_teachers", beside=("fccl",), key="fccl_train_teachers",
      label="FCCL, teachers in train mode (not the paper's)",
      field="fccl.teacher_train_mode", value=True,
      title="FCCL with its local teachers in eval or train mode",
      question=f"the FCCL row of fcclplus_{scenario} (teachers in eval mode, the FCCL code's) "
               "and the same config with fccl.teacher_train_mode=True; Δ vs BASE is against "
               "the FCCL row: do the teachers' running BatchNorm statistics hold FCCL under "
               "BASE at quick scale?")


def _fccl_keys(scenario: str) -> Table:
  """BASE and FCCL of Tables VIII/IX beside FCCL drawing its initial weights and pretraining
  batches as fcclplus.py does (`fccl.init_keys="run"`: the run's key and fold_in(key, 1)
  instead of the halves of its split), so that each seed's FCCL starts from its BASE's
  weights: a diagnosis of FCCL below BASE on every seed at quick scale while Table X's FCCM
  row (the same objective in the FCCL+ module, which draws its keys that way) is not (quick
  only; Δ against BASE; the paper's BASE and FCCL numbers beside their rows)."""
  return _fccl_variant(
      scenario, suffix="fccl_keys", beside=("solo", "fccl"), key="fccl_run_keys",
      label="FCCL, FCCL+'s initial keys (not the paper's)", field="fccl.init_keys",
      value="run", title="FCCL starting from its BASE's initial weights",
      question=f"BASE and FCCL of fcclplus_{scenario} and the FCCL config with "
               "fccl.init_keys='run' (initial weights from the run's key, as BASE's and "
               "FCCL+'s, and SOLO pretraining batches from fold_in(key, 1), as FCCL+'s dual "
               "variant): is FCCL under BASE at quick scale because of its own random draws?")


def _diagnoses() -> list[Table]:
  return [
      _fcclplus_diagnosis(
          "office31", "width", "on width-1/4 backbones", (("models.width", DIAGNOSIS_WIDTH),),
          "the mid scale's backbones are width 1/8, the paper's full width: does backbone "
          "width hold FCCL+'s gap over BASE (under half the paper's at mid scale) down?"),
      _fcclplus_base_width("office31"),
      _fccl_teachers("digits"),
      _fccl_keys("digits"),
      _fcclplus_diagnosis(
          "digits", "real", "on the real domains alone (MNIST and USPS)",
          (("scenario.domains", tuple(d for d, _ in REAL_DIGITS)),
           ("models.architectures", tuple(a for _, a in REAL_DIGITS))),
          "the data bundle has no SVHN or SYN, so the mid cells' third and fourth "
          "participants train on synthetic stand-ins near chance: does leaving them out of "
          "the federation change FCCL+'s gain on the real domains (far under the paper's at "
          "mid scale), and FCCL's place under BASE between domains? Two participants, so "
          "inter is each model on the other's test set and no AVG is the paper's",
          same_participants=False, keys=("solo", "fccl", "fcclplus"),
          variants=(("fccl_no_distill", "FCCL, cross-entropy alone in the local phase (not "
                     "the paper's)", "fccl", (("fccl.local_distill_weight", 0.0),),
                     "the row FCCL, cross-entropy alone in the local phase is the FCCL row "
                     "with fccl.local_distill_weight=0 (λ_Loc = 0 in FCCL Eq. 7: no "
                     "dual-domain distillation, the collaborative phase unchanged), the "
                     "diagnosis of whether the dual-domain distillation or the collaborative "
                     "phase moves FCCL's USPS model away from its own data over the rounds"),
                    ("fccl_no_collaboration", "FCCL, cross-entropy alone and no collaborative "
                     "phase (not the paper's)", "fccl_no_distill",
                     (("collaborative.epochs", 0),),
                     "the row FCCL, cross-entropy alone and no collaborative phase is the FCCL "
                     "row with fccl.local_distill_weight=0 and collaborative.epochs=0: each "
                     "participant's 50 SOLO epochs, then 40 rounds of its local epochs with "
                     "cross-entropy alone and nothing shared; against the row with "
                     "cross-entropy alone it isolates the collaborative phase, against BASE "
                     "FCCL's SOLO pretraining and initial keys"))),
  ]


#: FCCL+ Table XV's rows: (key, method, homogeneous flag, overrides).
_TABLE15_ROWS = (
    ("solo", "solo", "_homogeneous", ()),
    ("fedavg", "fedavg", "", ()),
    ("fedprox", "fedprox", "", ()),
    ("fedmd", "fedmd", "_homogeneous", ()),
    ("feddf", "feddf", "_homogeneous", ()),
    ("moon_tau5", "moon", "", (("moon.temperature", 5.0),)),
    ("moon_tau1", "moon", "", (("moon.temperature", 1.0),)),
    ("fedproc", "fedproc", "", ()),
    ("fedrs", "fedrs", "", (("fedrs.form", "count"),)),
    ("fccl", "fccl", "_homogeneous",
     BENCHMARK_FCCL + (("fccl.average_placement", "after_local"),)),
    ("fcclplus", "fcclplus", "_homogeneous", ()),
)
_TABLE15_LABELS = {"moon_tau5": "MOON (τ = 5)", "moon_tau1": "MOON (τ = 1)"}


def _fcclplus_table15() -> Table:
  settings = []
  for scenario in ("digits", "office31"):
    rows = [_row(scenario, key, method, flags=flags, overrides=overrides,
                 label=_TABLE15_LABELS.get(key))
            for key, method, flags, overrides in _TABLE15_ROWS]
    settings.append(_ds_setting(scenario, rows, _paper(numbers.FCCLPLUS_TABLE15, scenario,
                                                       [r.key for r in rows]),
                                deltas=numbers.FCCLPLUS_TABLE15_DELTA))
  return Table(
      id="fcclplus_table15", title="FCCL+ Table XV: model homogeneity (ResNet12 for all)",
      paper=FCCLPLUS, source="Table XV", family="domain_shift", base="solo",
      protocol=FCCLPLUS_PROTOCOL.replace("heterogeneous backbones per domain (FCCL+ Table VI)",
                                         "ResNet12 for every participant"),
      settings=tuple(settings),
      notes=("FedAvg, FedProx, MOON, FedProc and FedRS: one global ResNet12, all participants "
             "every round, uniform averaging, each participant's own model evaluated; "
             "FCCL, FCCL+ and FedDF also average the parameters (the _homogeneous variants)",
             "the two MOON rows are labelled τ = 5 and τ = 1; they set moon.temperature "
             "(Table VII lists τ = 0.5, μ = 1, the config default)",
             "MOON: the benchmark code (WenkeHuang/FCCL, fccl+/models/moon.py) divides by 0.5 "
             "and weights the contrastive term by 1 in every scenario (fccl+/utils/best_args.py "
             "names no temperature), so no per-scenario temperature comes from the code; "
             "the row labels are the only source of τ = 5 and τ = 1",
             "FedRS runs fedrs.form=count (class c's logit scaled by α + (1 - α) n_c / max n): "
             "the benchmark repository the paper links runs `--model fedrs` (fccl+/run.sh) but "
             "ships no FedRS module; the count form is the FedRS authors' code's "
             "(lxcnju/FedRepo, algorithms/fedrs.py) and the same group's later benchmark's "
             "(WenkeHuang/MarsFL, Local/FedRSLocal.py); in these "
             "domain-shift scenarios a participant holds every class (Digits) or nearly every "
             "class (Office31), so the present/missing form (fedrs.form=paper) is FedAvg or "
             "nearly so, while Table XV's FedRS row differs from its FedAvg row",
             "FCCL averages after the local phase (fccl.average_placement=after_local), as "
             "the benchmark code does (fccl+/models/fccl.py, loc_update: "
             "copy_nets2_prevnets then aggregate_nets)",
             "the paper's Δ beside ours is the printed one: Digits intra MOON (τ = 1) prints "
             "+1.35 where the printed AVGs give +0.35"),
      scales=SCALES)


def _fcclplus_ablation(table_id: str, source: str, title: str,
                       table: Mapping[str, Any], rows_of: Sequence[tuple[str, str, Sequence]],
                       scenarios: Sequence[str], *, kinds: tuple[str, ...], base: str | None,
                       notes: Sequence[str],
                       deltas: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
                       ) -> Table:
  settings = []
  for scenario in scenarios:
    rows = [_row(scenario, key, "solo" if key == "solo" else "fcclplus", label=label,
                 overrides=overrides) for key, label, overrides in rows_of]
    settings.append(_ds_setting(scenario, rows, _paper(table, scenario, [r.key for r in rows]),
                                deltas=deltas))
  return Table(id=table_id, title=title, paper=FCCLPLUS, source=source,
               protocol=FCCLPLUS_PROTOCOL, family="domain_shift", settings=tuple(settings),
               kinds=kinds, base=base, notes=tuple(notes), scales=SCALES)


#: The conference version's local objective (FCCL+ Eq. 19) for the rows without FNTD.
DUAL = (("fcclplus.local_distillation", "dual"),)
_DUAL_NOTE = ("rows without FNTD train locally with the conference version's objective (FCCL+ "
              "Eq. 19 = FCCL Eq. 4-7: CE + distillation from the previous-round and the "
              "privately pretrained model; fcclplus.local_distillation=dual), as FCCL+ Sec. "
              "4.3 states")

#: FCCM alone with the conference version's local objective (Table X's FCCM row).
FCCM_ALONE = (("fcclplus.use_fisl", False),) + DUAL

TABLE10_ROWS = (
    ("solo", "BASE (solo)", ()),
    ("fccm", "FCCM", FCCM_ALONE),
    ("fisl", "FISL", (("fcclplus.use_fccm", False),) + DUAL),
    ("fccm_fisl", "FCCM + FISL", DUAL),
    ("fcclplus", "FCCM + FISL + FNTD (FCCL+)", ()),
)
TABLE11_ROWS = tuple(
    (key, f"FCCM, λ = {lam}" + (" (default)" if lam == 0.0051 else ""),
     FCCM_ALONE + ((("fcclplus.off_diagonal_weight", lam),) if lam != 0.0051 else ()))
    for key, lam in (("lambda0002", 0.002), ("lambda0051", 0.0051), ("lambda001", 0.01),
                     ("lambda005", 0.05), ("lambda01", 0.1)))
FIGURE7_ROWS = tuple(
    (f"fccm_{public}", f"FCCM, {name} public", FCCM_ALONE
     + ((("scenario.public_name", public),) if public != "cifar100" else ()))
    for public, name in (("cifar100", "CIFAR-100"), ("tinyimagenet", "Tiny-ImageNet"),
                         ("fmnist", "Fashion-MNIST")))
FIGURE9_ROWS = (
    ("after_collaborative", "FNTD teacher θ^e (after this round's collaborative updating)",
     (("fcclplus.fntd_teacher", "after_collaborative"),)),
    ("fcclplus", "FNTD teacher θ^(e-1) (FCCL+)", ()),
)
TABLE13_ROWS = tuple(
    (f"{public}_{aug}", f"FISL, {name} public, {aug} augmentation",
     (("fcclplus.use_fccm", False),) + DUAL
     + (("scenario.public_name", public), ("collaborative.augmentation", aug)))
    for public, name in (("fmnist", "Fashion-MNIST"), ("cifar100", "CIFAR-100"),
                         ("tinyimagenet", "Tiny-ImageNet"))
    for aug in ("weak", "strong"))
TABLE14_ROWS = tuple((f"omega{w}", f"FCCM + FISL, ω = {w}",
                      DUAL + (("fcclplus.fisl_weight", float(w)),)) for w in (1, 2, 3, 4))
TABLE16_ROWS = (("fcclplus", "FNTD (FCCL+)", ()),) + tuple(
    (key, f"EWC, λ = {weight}", (("fcclplus.local_distillation", "ewc"),
                                 ("fcclplus.ewc_weight", weight)))
    for key, weight in (("ewc_001", 0.01), ("ewc_01", 0.1), ("ewc_07", 0.7), ("ewc_1", 1.0)))
TABLE17_ROWS = (
    ("kd30", "KD 30% then FNTD", (("fcclplus.local_distillation", "kd_then_fntd"),
                                  ("fcclplus.kd_fraction", 0.3))),
    ("kd10", "KD 10% then FNTD", (("fcclplus.local_distillation", "kd_then_fntd"),
                                  ("fcclplus.kd_fraction", 0.1))),
    ("fcclplus", "FNTD alone (FCCL+)", ()),
)


#: FCCL+ Table XII's rows: Tables VIII/IX's methods but FedDF (printed "/").
TABLE12_METHODS = ("solo", "fedmd", "fedmatch", "rhfl", "fccl", "fcclplus")
TINYIMAGENET_PUBLIC = (("scenario.public_name", "tinyimagenet"),)


def _fcclplus_table12() -> Table:
  rows = [_row("digits", m, m, overrides=() if m == "solo" else
               TINYIMAGENET_PUBLIC + (BENCHMARK_FCCL if m == "fccl" else ()))
          for m in TABLE12_METHODS]
  return Table(
      id="fcclplus_table12", title="FCCL+ Table XII: Digits with Tiny-ImageNet public data",
      paper=FCCLPLUS, source="Table XII", family="domain_shift", base="solo",
      protocol=FCCLPLUS_PROTOCOL.replace("5000 CIFAR-100 public images",
                                         "5000 Tiny-ImageNet public images"),
      settings=(_ds_setting("digits", rows, _paper(numbers.FCCLPLUS_TABLE12, "digits",
                                                   TABLE12_METHODS)),),
      notes=("the public set is Tiny-ImageNet (scenario.public_name=tinyimagenet); BASE uses "
             "no public data, so its cells are Tables VIII/IX's",
             "the paper prints FedDF as \"/\" (an optimisation dilemma with Tiny-ImageNet): "
             "no row",
             "the FCCL row runs the benchmark's FCCL (fccl.own_slot=current), as Tables "
             "VIII/IX do",
             "the paper prints no Δ column: the Δ vs BASE column is ours alone"))


#: FCCL+ Table XVIII's backbone sets (M, U, SV, SY) beside Table VI's default.
TABLE18_ARCHITECTURES = (
    ("simplecnn", "SimpleCNN for SYN", ("resnet10", "resnet12", "efficientnet_b0", "simple_cnn")),
    ("resnet18", "ResNet18 for MNIST", ("resnet18", "resnet12", "efficientnet_b0",
                                        "mobilenet_v2")))


def _fcclplus_table18() -> Table:
  rows = [_row("digits", f"{m}_{key}", m, label=f"{METHOD_LABELS[m]}, {what}",
               overrides=(("models.architectures", architectures),)
               + (BENCHMARK_FCCL if m == "fccl" else ()))
          for key, what, architectures in TABLE18_ARCHITECTURES
          for m in ("fedmd", "fccl", "fcclplus")]
  return Table(
      id="fcclplus_table18", title="FCCL+ Table XVIII: other backbones in Digits",
      paper=FCCLPLUS, source="Table XVIII", family="domain_shift", base=None,
      protocol=FCCLPLUS_PROTOCOL, kinds=("inter", "intra"),
      settings=(_ds_setting("digits", rows, _paper(numbers.FCCLPLUS_TABLE18, "digits",
                                                   [r.key for r in rows])),),
      notes=("two backbone sets (M, U, SV, SY) beside Table VI's (ResNet10, ResNet12, "
             "EfficientNet-B0, MobileNetV2): (ResNet10, ResNet12, EfficientNet-B0, SimpleCNN) "
             "and (ResNet18, ResNet12, EfficientNet-B0, MobileNetV2), set by "
             "models.architectures; quick scale keeps the quick configs' width",
             "the FCCL rows run the benchmark's FCCL (fccl.own_slot=current), as Tables "
             "VIII/IX do"))


#: FCCL+ Table XIX: local epochs (paper scale, quick scale) with and without FNTD; the
#: 20-epoch rows keep the configs' own epochs (20; quick 5).
TABLE19_EPOCHS = ((10, 3), (20, None), (30, 8))
TABLE19_ROWS = tuple(
    (f"{key}_epochs{epochs}", f"{label}, {epochs} local epochs",
     distillation + ((("local.epochs", epochs),) if quick else ()),
     (("local.epochs", quick),) if quick else ())
    for key, label, distillation in (
        ("ce", "w/o FNTD (cross-entropy alone)", (("fcclplus.local_distillation", "none"),)),
        ("fntd", "w/ FNTD (FCCL+)", ()))
    for epochs, quick in TABLE19_EPOCHS)


def _fcclplus_table19() -> Table:
  rows = [_row("digits", key, "fcclplus", label=label, overrides=overrides,
               quick_overrides=quick_overrides)
          for key, label, overrides, quick_overrides in TABLE19_ROWS]
  return Table(
      id="fcclplus_table19", title="FCCL+ Table XIX: local epochs with and without FNTD",
      paper=FCCLPLUS, source="Table XIX", family="domain_shift", base=None,
      protocol=FCCLPLUS_PROTOCOL.replace("40 rounds of 20 local epochs",
                                         "40 rounds of 10, 20 or 30 local epochs"),
      kinds=("inter",),
      settings=(_ds_setting("digits", rows, _paper(numbers.FCCLPLUS_TABLE19, "digits",
                                                   [r.key for r in rows])),),
      notes=("w/o FNTD: FCCL+ whose local phase is cross-entropy alone "
             "(fcclplus.local_distillation=none); the paper's caption says \"without FNTD "
             "module in Eq. 14\" and its text \"without inter-domain knowledge "
             "regularization\", and its 20-epoch row (33.96) is not Table X's FCCM + FISL row "
             "(40.45, the conference version's distillation)",
             "local.epochs = 10, 20, 30; at quick scale 3, 5, 8 (the paper's × 5/20, rounded "
             "up); the 20-epoch rows keep the configs' own epochs, so the w/ FNTD one is "
             "Tables VIII/IX's FCCL+ cell",
             "the paper prints inter-domain accuracy only"))


def _fccl_tables1_2() -> Table:
  methods = ("solo", "fedmd", "fml", "rcfl", "feddf", "fedmatch", "fccl")
  settings = tuple(_ds_setting(s, [_row(s, m, m) for m in methods],
                               _paper(numbers.FCCL_TABLE1_2, s, methods))
                   for s in ("digits", "office_home"))
  return Table(
      id="fccl_tables1_2", title="FCCL Tables 1/2: inter- and intra-domain accuracy",
      paper=FCCL, source="Tables 1 (inter →) and 2 (intra ↩)", protocol=FCCL_PROTOCOL,
      family="domain_shift", base="solo", settings=settings,
      kind_sources=dict({"inter": "FCCL Table 1", "intra": "FCCL Table 2"}),
      notes=("FCCL runs the conference code's target (fccl.own_slot=previous, the config "
             "default: the participant's previous-round model in its own slot)",
             "Table 2 prints no AVG: its AVG column has no paper number",
             "neither table prints a Δ column: the Δ vs BASE column is ours alone",
             "FML: private models plus a shared meme model (the scenario's first backbone), "
             "mutual learning, memes averaged (fedjax_het/algorithms/fml.py)",
             "RCFL: softmax scores on each public batch, aggregated per class (every "
             "participant holds every class: the α-weighted aggregation reduces to the mean), "
             "KL distillation, then private training (fedjax_het/algorithms/rcfl.py)",
             "the local and public settings are the configs' (FCCL+'s); FCCL's text gives "
             "batch 512 in both phases (the CVPR code's protocol: the fccl_cvpr configs)"))


def _fccl_table3() -> Table:
  resnet18 = (("models.architectures", ("resnet18",) * 4),)
  rows = [_row("office_home", "solo", "solo", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "fedavg", "fedavg", overrides=resnet18),
          _row("office_home", "fedmd", "fedmd", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "fml", "fml", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "rcfl", "rcfl", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "feddf", "feddf", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "fedmatch", "fedmatch", flags="_homogeneous", overrides=resnet18),
          _row("office_home", "fccl", "fccl", flags="_homogeneous",
               overrides=resnet18 + (("fccl.average_placement", "between_phases"),))]
  return Table(
      id="fccl_table3", title="FCCL Table 3: model homogeneity on Office-Home (ResNet-18)",
      paper=FCCL, source="Table 3", family="domain_shift", base="solo",
      protocol=FCCL_PROTOCOL + "; ResNet-18 for every participant, parameters averaged "
                               "between the collaborative and the local phase",
      settings=(_ds_setting("office_home", rows, _paper(numbers.FCCL_TABLE3, "office_home",
                                                        [r.key for r in rows])),),
      notes=("the paper prints no AVG: its AVG column has no paper number",
             "FCCL and FedDF average the parameters (the _homogeneous variants); FedAvg is "
             "the FedAvg family's config with models.architectures set to ResNet-18",
             "FML: ResNet-18 private models and a ResNet-18 meme model, memes averaged",
             "RCFL: ResNet-18 for every participant, scores only (no parameter averaging)",
             "FCCL averages between its collaborative and local phases "
             "(fccl.average_placement=between_phases, FCCL Sec. 4.1): each local phase starts "
             "from the average of the post-collaborative models; the FCCL+ benchmark code "
             "averages after the local phase instead (FCCL+ Table XV's FCCL row)"))


# --- partitioned: FedMMD / FedFusion --------------------------------------------------------

TWO_STREAM_PAPER = ("FedMMD/FedFusion (Yao et al., \"Federated Learning with Additional "
                    "Mechanisms on Clients to Reduce Communication Costs\", arXiv:1908.05891)")
#: The method tokens of a FedMMD / FedFusion setting, in the paper's row order.
TWO_STREAM_METHODS = ("fedavg", "fedmmd", "fedmmd_l2", "fedfusion_single", "fedfusion_multi",
                      "fedfusion_conv")
TWO_STREAM_LABELS = {"fedavg": "FedAvg", "fedmmd": "FedMMD (MMD)",
                     "fedmmd_l2": "FedMMD (L2, authors' code)",
                     "fedavg_nodropout": "FedAvg, no dropout",
                     "fedmmd_nodropout": "FedMMD (MMD), no dropout",
                     "fedmmd_trunk": "FedMMD (MMD on the conv trunk)",
                     "fedfusion_conv": "FedFusion+Conv", "fedfusion_multi": "FedFusion+Multi",
                     "fedfusion_single": "FedFusion+Single"}
#: The FedMMD / FedFusion settings with `_mid` configs.
TWO_STREAM_MID = tuple(_two_stream.MID)
FEDFUSION_METHODS = ("fedavg", "fedfusion_single", "fedfusion_multi", "fedfusion_conv")
FEDMMD_METHODS = ("fedavg", "fedmmd", "fedmmd_l2")
#: The FedMMD rounds tables' rows: FEDMMD_METHODS, FedAvg and FedMMD without dropout, and
#: FedMMD with its MMD on the conv trunk's feature map (with dropout).
FEDMMD_TABLE_METHODS = FEDMMD_METHODS + ("fedavg_nodropout", "fedmmd_nodropout", "fedmmd_trunk")
NO_DROPOUT_NOTE = ("the no-dropout rows are the `_nodropout` configs, the same CNNs without "
                   "dropout: with dropout, FedMMD's MMD on the features compares the local "
                   "stream's dropped-out features with the frozen global stream's full ones "
                   "(docs/methods.md)")
TRUNK_NOTE = ("the conv-trunk row is the `_trunk` config: FedMMD's MMD (lambda = 0.1) on the "
              "flattened feature map of the CNN's convolutional trunk, which the authors' "
              "FedFusion model returns beside its logits, before the fully connected layers "
              "and their dropout (fedmmd.outputs=trunk); dropout 0.2 as the other rows")
TWO_STREAM_PROTOCOL = ("the FedAvg CNNs with dropout 0.2, SGD with momentum 0.9 and an "
                       "exponentially decayed rate (0.003 x 0.985^r on CIFAR-10, 0.002 x "
                       "0.99^r on MNIST; plain SGD at 0.05 on MNIST shards, as McMahan et "
                       "al.); global test accuracy (permuted MNIST: mean over the clients' "
                       "permuted test splits; CIFAR-10 classes5 / classes2: mean over "
                       "the clients of their local models' accuracy on the test images of "
                       "their own classes); rounds to each target accuracy")


def two_stream_variant(method: str, setting: str, *, quick: bool = False) -> str:
  """"fedfusion_conv", "permuted" -> "fedfusion_permuted_conv[_quick]" (the config arg)."""
  base, _, variant = method.partition("_")
  return "_".join(x for x in (base, setting, variant, "quick" if quick else "") if x)


def permuted_diagnosis_row(method: str, key: str, label: str,
                           overrides: tuple[tuple[str, Any], ...], reference: str = "") -> Row:
  """A diagnosis row of FedFusion Table 2: `method`'s permuted-MNIST config with `overrides`,
  read against the row `reference` ("": FedAvg)."""
  return Row(key=key, label=label, variant=two_stream_variant(method, "permuted"),
             quick_variant=two_stream_variant(method, "permuted", quick=True),
             overrides=overrides, reference=reference)


#: FedFusion+Conv with its 1x1 convolution started as the plain model (this library's option,
#: `fedfusion.conv_init="identity"`): the diagnosis row of FedFusion Table 2.
FEDFUSION_CONV_IDENTITY_ROW = permuted_diagnosis_row(
    "fedfusion_conv", "fedfusion_conv_identity",
    "FedFusion+Conv, identity start (not the paper's)", (("fedfusion.conv_init", "identity"),))
#: FedAvg and FedFusion+Conv scored as the authors' FedFusion code logs its accuracy (the mean
#: over the round's clients of each one's model after its local training, on its own test
#: split; `fedavg.evaluate="local"`) instead of the global model's: the diagnosis rows of
#: whether Table 2's gap lives in the metric (the identity row asks the same of Conv's start).
FEDFUSION_LOCAL_ROWS = tuple(
    permuted_diagnosis_row(m, f"{m}_local", f"{TWO_STREAM_LABELS[m]}, local models (not the "
                           "paper's)", (("fedavg.evaluate", "local"),),
                           reference="" if m == "fedavg" else "fedavg_local")
    for m in ("fedavg", "fedfusion_conv"))
#: FedAvg and FedFusion+Conv on the data of the authors' permuted-MNIST script (the even
#: digits to one client, the odd to the other, each with its own pixel permutation;
#: `scenario.partition="permuted_classes"`), scored as the code logs (`fedavg.evaluate=
#: "local"`): the diagnosis rows of whether Table 2's gap lives in the code's data.
FEDFUSION_CODE_DATA_ROWS = tuple(
    permuted_diagnosis_row(m, f"{m}_code_data", f"{TWO_STREAM_LABELS[m]}, the code's even / odd "
                           "digits, local models (not the paper's)",
                           (("scenario.partition", "permuted_classes"),
                            ("fedavg.evaluate", "local")),
                           reference="" if m == "fedavg" else "fedavg_code_data")
    for m in ("fedavg", "fedfusion_conv"))
#: The code's-data rows with the script's training augmentation as well (RandomResizedCrop and a
#: horizontal flip before the permutation; `fedavg.augmentation="resized_crop_flip"`): the
#: diagnosis rows of whether Table 2's gap lives in the code's data and augmentation together.
FEDFUSION_CODE_SETUP_ROWS = tuple(
    permuted_diagnosis_row(m, f"{m}_code_data_aug", f"{TWO_STREAM_LABELS[m]}, the code's even / "
                           "odd digits and augmentation, local models (not the paper's)",
                           (("scenario.partition", "permuted_classes"),
                            ("fedavg.evaluate", "local"),
                            ("fedavg.augmentation", "resized_crop_flip")),
                           reference="" if m == "fedavg" else "fedavg_code_data_aug")
    for m in ("fedavg", "fedfusion_conv"))
FEDFUSION_EXTRA_ROWS = ((FEDFUSION_CONV_IDENTITY_ROW,) + FEDFUSION_LOCAL_ROWS
                        + FEDFUSION_CODE_DATA_ROWS + FEDFUSION_CODE_SETUP_ROWS)


def two_stream_setting(dataset: str, setting: str, methods: Sequence[str], *,
                       cells_of: str = "", notes: Sequence[str] = (),
                       extra_rows: Sequence[Row] = ()) -> Setting:
  """The Setting of one FedMMD / FedFusion (dataset, setting) with the given method tokens
  (`notes`: added after the paper's; `extra_rows` after the methods')."""
  rows = tuple(Row(key=m, label=TWO_STREAM_LABELS[m],
                   variant=two_stream_variant(m, setting),
                   quick_variant=two_stream_variant(m, setting, quick=True)) for m in methods)
  rows += tuple(extra_rows)
  paper = numbers.TWO_STREAM.get((dataset, setting), {})
  paper_notes = tuple(paper.get("notes", ())) if paper else ()
  if paper.get("train_images"):
    paper_notes = (f"the paper trains on {paper['train_images']} images",) + paper_notes
  return Setting(key=f"{dataset}_{setting}", label=f"{dataset} {setting}",
                 config=dataset, rows=rows,
                 scenario=f"{dataset}_{setting}", paper=paper, cells_of=cells_of,
                 notes=paper_notes + tuple(notes))


def two_stream_table(dataset: str, setting: str, methods: Sequence[str] = TWO_STREAM_METHODS,
                     *, table_id: str | None = None, notes: Sequence[str] = ()) -> Table:
  """A table of one FedMMD / FedFusion setting (experiments/rounds_benchmark.py's grid)."""
  paper = numbers.TWO_STREAM.get((dataset, setting), {})
  return Table(id=table_id or f"rounds_{dataset}_{setting}",
               title=f"Rounds to target: {dataset} {setting}", paper=TWO_STREAM_PAPER,
               source=paper.get("where", "no printed numbers for this setting"),
               protocol=TWO_STREAM_PROTOCOL, family="partitioned",
               settings=(two_stream_setting(dataset, setting, methods, notes=notes),),
               base="fedavg",
               scales=SCALES if (dataset, setting) in TWO_STREAM_MID else ("quick", "paper"))


# --- partitioned: HtFLlib's data-free heterogeneous-model methods ----------------------------

HTFL_PAPER = ("FedKTL (Zhang et al., CVPR 2024) Table 1 and FedTGP (Zhang et al., AAAI 2024), "
              "run by HtFLlib (TsingZ0/HtFLlib)")
#: The rows of the HtFL tables, in FedKTL Table 1's order (the methods this library has).
HTFL_METHODS = ("lg_fedavg", "fedgh", "fml", "fedkd", "fd", "fedproto", "fedtgp")
#: The public-data methods beside them (configs/htfl.py's PUBLIC_METHODS): no paper number.
HTFL_PUBLIC_METHODS = ("fedmd", "fccl", "fcclplus", "feddf", "rhfl")
HTFL_LABELS = {"lg_fedavg": "LG-FedAvg", "fedgh": "FedGH", "fml": "FML", "fedkd": "FedKD",
               "fd": "FD (FedDistill)", "fedproto": "FedProto", "fedtgp": "FedTGP",
               "fedmd": "FedMD (public)", "fccl": "FCCL (public)", "fcclplus": "FCCL+ (public)",
               "feddf": "FedDF (public)", "rhfl": "RHFL (public)"}
#: Diagnosis rows (not the papers'): FedProto and FedTGP trained as their rows, evaluated by
#: each client's own head instead of the nearest global prototype, and LG-FedAvg and FedGH
#: evaluated by each client's own trained head instead of the global head; after FedTGP.
HTFL_HEAD_DIAGNOSES = (
    Row(key="fedproto_head", label="FedProto, head classifier (not the paper's)",
        variant="fedproto", overrides=(("fedproto.classifier", "head"),)),
    Row(key="fedtgp_head", label="FedTGP, head classifier (not the paper's)",
        variant="fedtgp", overrides=(("fedtgp.classifier", "head"),)),
    Row(key="lg_fedavg_local", label="LG-FedAvg, local head (not the paper's)",
        variant="lg_fedavg", overrides=(("lg_fedavg.classifier", "local"),)),
    Row(key="fedgh_local", label="FedGH, local head (not the paper's)",
        variant="fedgh", overrides=(("fedgh.classifier", "local"),)))
HTFL_PROTOCOL = ("20 clients, all in every round, PFLlib's data (train and test pooled, "
                 "partitioned, every client split 75/25), backbones i mod k of the HtFE group "
                 "with features pooled to 512, local SGD lr 0.01 in batches of 10, 1 epoch per "
                 "round, 2000 rounds; each client's accuracy on its own test split")
HTFL_NOTES = (
    "final accuracy: the library's number, each client's accuracy on its own test split "
    "(eval/intra), mean over the clients, mean of the last 3 rounds; the papers print "
    "HtFLlib's number, the best round's accuracy over all clients' test splits pooled "
    "(`reports.partitioned.htfl_accuracy` computes it from a cell's metrics.jsonl and "
    "metadata.json; the block sets it beside the paper's)",
    "the rows marked (public) are the public-data methods (the FCCL+ benchmark's modules) on "
    "a public set of 5000 CIFAR-100 images, with HtFLlib's local training and their own "
    "public phase (fedjax_het/configs/htfl.py); FedKTL Table 1 and FedTGP print no number "
    "for them, so their paper column is empty; their backbones keep their own feature "
    "dimensions (no pooling to 512)",
    "FML is the library's FML module (the FCCL benchmark's form: KL with batch mean and a "
    "detached peer, no gradient clipping) with HtFLlib's local SGD and size-weighted "
    "averaging; HtFLlib's FML takes torch's element-mean KLDivLoss, keeps both KL targets "
    "attached and clips gradients at norm 10",
    "the rows FedProto, head classifier and FedTGP, head classifier are not the papers': "
    "FedProto and FedTGP trained as their own rows (on one machine the same per-round "
    "losses, bit for bit), each client evaluated by its own head (fedproto.classifier / fedtgp.classifier = head) "
    "instead of the nearest global prototype, the diagnosis of how much of their accuracy is "
    "their classifier's; the rows LG-FedAvg, local head and FedGH, local head likewise "
    "evaluate each client's own head after its local training instead of the global head "
    "(lg_fedavg.classifier / fedgh.classifier = local)",
    "the quick scale: width-1/8 backbones, features pooled to 64, a pool of 2000 + 1000 "
    "CIFAR-10 images, 5 rounds; the public-data methods: 1000 public images, 1-epoch "
    "warm-ups; FD distils toward the softmax of the global class logits (fd.target=softmax, "
    "the FD paper's form): HtFLlib's raw-logit target is unbounded below and diverged there "
    "(fedjax_het/configs/htfl.py)",
)


def htfl_setting(dataset: str, skew: str, group: str,
                 methods: Sequence[str] = HTFL_METHODS,
                 diagnoses: Sequence[Row] = HTFL_HEAD_DIAGNOSES) -> Setting:
  """One (dataset, skew, HtFE group) of the HtFL tables (fedjax_het/configs/htfl.py).

  `diagnoses` (rows whose variant names the method) follow the FedTGP row when `methods` has
  one.

  The paper column: FedTGP's CIFAR-100 practical number of the group where it prints one,
  else FedKTL Table 1's HtFE8 number of the (skew, dataset), named as such in "where".
  """
  exact = {m: numbers.HTFL_CIFAR100_PRACTICAL_GROUPS[m][group] for m in methods
           if (dataset, skew) == ("cifar100", "practical")
           and group in numbers.HTFL_CIFAR100_PRACTICAL_GROUPS.get(m, {})}
  if exact:
    where = f"FedTGP, CIFAR-100 practical, {group.upper()} (the same group)"
    final = exact
  else:
    where = (f"FedKTL Table 1, {dataset} {skew}, HtFE8: no printed {group.upper()} number, the "
             "paper column is the 8-backbone group's")
    final = {m: numbers.HTFL_FEDKTL_TABLE1[m][(skew, dataset)] for m in methods
             if (skew, dataset) in numbers.HTFL_FEDKTL_TABLE1.get(m, {})}
  rows = []
  for m in methods:
    rows.append(Row(key=m, label=HTFL_LABELS[m], variant=f"{dataset}_{skew}_{group}_{m}"))
    if m == "fedtgp":
      rows += [dataclasses.replace(d, variant=f"{dataset}_{skew}_{group}_{d.variant}")
               for d in diagnoses]
  return Setting(key=f"{dataset}_{skew}_{group}", label=f"{dataset} {skew}, {group.upper()}",
                 config="htfl", rows=tuple(rows), scenario=f"{dataset}_{skew}",
                 paper={"where": where, "final": final, "metric": "htfllib",
                        "notes": ("HtFLlib's metric (best round, pooled over the clients' test "
                                  "splits), mean over 3 runs",)})


# --- class incremental: GLFC --------------------------------------------------------------

GLFC = "GLFC (Dong et al., CVPR 2022)"
GLFC_PROTOCOL = ("CIFAR-100 in T incremental tasks of 100/T classes, 30 clients at the start "
                 "and 10 more per task, 10 sampled per round, 10 rounds per task, ResNet-18; "
                 "the global model's accuracy on all classes seen after each task, and their "
                 "mean (Avg.)")
GLFC_ROWS = (("fedavg_cil", "FedAvg (fine-tuning)", "fedavg_cil", ()),
             ("icarl_fl", "iCaRL + FL", "icarl_fl", ()),
             ("bic_fl", "BiC + FL", "bic_fl", ()),
             ("podnet_fl", "PODNet + FL", "podnet_fl", ()),
             ("dde_icarl_fl", "DDE + iCaRL + FL", "dde_icarl_fl", ()),
             ("geodl_icarl_fl", "GeoDL + iCaRL + FL", "geodl_icarl_fl", ()),
             ("ssil_fl", "SS-IL + FL", "ssil_fl", ()),
             ("glfc_no_cgc", "GLFC w/o CGC (Ours-w/oCGC)", "glfc_no_cgc", ()),
             ("glfc_no_crd", "GLFC w/o CRD (Ours-w/oCRD)", "glfc_no_crd", ()),
             ("glfc_no_proxy", "GLFC w/o proxy (Ours-w/oPRS)", "glfc",
              (("glfc.old_model", "previous_task_global"),)),
             ("glfc", "GLFC (Ours)", "glfc", ()))
#: GLFC Table 1's diagnosis row (T = 10 only): iCaRL + FL's trained model evaluated with its own
#: head, as GLFC and FedAvg are, instead of iCaRL's nearest mean of exemplars.
GLFC_HEAD_DIAGNOSIS = ("icarl_fl_head", "iCaRL + FL, head classifier (not the paper's)",
                       "icarl_fl", (("icarl.classifier", "head"),))
#: GLFC Table 1's diagnosis row of the proxy (T = 10 only): GLFC with the monitor set rebuilt only
#: from gradients of classes the proxy has never reconstructed (the paper's text, Sec. 4.2), so
#: that Theta_{t-1} moves only when a class the proxy has not seen arrives. GLFC's row follows the
#: code, which rebuilds on any received gradient: every client signalling in a later round of a
#: task turns Theta_{t-1} into a global model of the current task.
GLFC_PROXY_DIAGNOSIS = ("glfc_rebuild_new_classes",
                        "GLFC, proxy rebuilt on new classes only (the paper's text)", "glfc",
                        (("glfc.proxy.rebuild", "new_classes"),))


def _glfc_table(tasks: int) -> Table:
  suffix = "" if tasks == 10 else f"_tasks{tasks}"
  entries = GLFC_ROWS if tasks != 10 else (GLFC_ROWS[:2] + (GLFC_HEAD_DIAGNOSIS,)
                                           + GLFC_ROWS[2:] + (GLFC_PROXY_DIAGNOSIS,))
  rows = tuple(Row(key=key, label=label, variant=f"{method}{suffix}",
                   quick_variant=f"{method}_quick", overrides=tuple(overrides))
               for key, label, method, overrides in entries)
  paper = ({k: v for k, v in numbers.GLFC_TABLE1.items()} if tasks == 10 else {})
  notes = ["FedAvg (fine-tuning) is the lower bound; the paper prints no row for it",
           "the quick scale is every method's _quick config: 4 tasks of 5 classes of a 20-class "
           "stream, whatever T the table has",
           "Forgetting: average forgetting after the last task (Chaudhry et al. 2018); the "
           "paper prints none"]
  if tasks == 10:
    notes.append("the paper's Ours-w/oCGC Avg. reads 60.1; its ten accuracies give 64.7")
    notes.append("the row iCaRL + FL, head classifier is not the paper's: iCaRL + FL trained "
                 "as its row, evaluated with the global model's own head (top-1 among the "
                 "seen classes' logits, as GLFC and FedAvg are; icarl.classifier=head) "
                 "instead of the nearest mean of exemplars, the diagnosis of how much of "
                 "iCaRL + FL's lead is its classifier's")
    notes.append("the row GLFC, proxy rebuilt on new classes only is GLFC with "
                 "glfc.proxy.rebuild=new_classes: the proxy rebuilds its monitor set, and "
                 "hands its best model on as the old model Theta_{t-1}, only when gradients of "
                 "classes it has never reconstructed arrive (the paper's \"until receiving "
                 "gradients of new classes from the next task\"); GLFC's row rebuilds on any "
                 "gradient (the authors' code), so every client that signals in a later round "
                 "of a task, with classes the proxy holds already, makes a global model of the "
                 "current task the old model of the task's next rounds")
  if tasks != 10:
    notes.insert(0, f"GLFC prints no CIFAR-100 numbers for T = {tasks} (Figure 3 only): the "
                    "paper column is empty")
  return Table(
      id="glfc_table1" if tasks == 10 else f"glfc_tasks{tasks}",
      title=f"GLFC Table 1 layout: CIFAR-100, T = {tasks}", paper=GLFC,
      source="Table 1" if tasks == 10 else f"Figure 3 (T = {tasks}), no printed numbers",
      protocol=GLFC_PROTOCOL.replace("T incremental", f"T = {tasks} incremental"),
      family="class_incremental",
      settings=(Setting(key="", label="CIFAR-100",
                        config="cifar100", rows=rows, paper=paper),),
      kinds=(), notes=tuple(notes), scales=SCALES if tasks == 10 else ("quick", "paper"))


#: GLFC Tables 2 and 3: (table id, paper table, dataset label, config file, tasks T, paper
#: numbers, notes).
GLFC_DATASET_TABLES = (
    ("glfc_table2", "Table 2", "ImageNet-Subset", "imagenet_subset", 10,
     numbers.GLFC_TABLE2,
     ("the paper's GeoDL + iCaRL + FL Avg. reads 50.0; its ten accuracies give 49.9",
      "ImageNet-Subset: the image folders <data_dir>/imagenet_subset/{train,val} (100 classes) "
      "read at 224 px, shorter side scaled and centre-cropped; ResNet-18 with the ImageNet "
      "stem")),
    ("glfc_table3", "Table 3", "Tiny-ImageNet", "tinyimagenet", 20,
     numbers.GLFC_TABLE3,
     ("the paper prints the first 10 of the 20 tasks (10 ... 100 classes seen) and their mean: "
      "its rows stand under the runs' first 10 columns, and Avg. − paper compares the mean of "
      "the runs' first 10 tasks",
      "the paper's Ours-w/oPRS Avg. reads 50.3; its ten accuracies give 50.4",
      "Tiny-ImageNet: tinyimagenet.npz at 64x64 (500 training images per class, the 50 "
      "labelled validation images per class as the test set); ResNet-18 with the CIFAR stem")),
)


def _glfc_dataset_table(table_id: str, source: str, label: str, config: str, tasks: int,
                        paper: Mapping[str, Any], extra: Sequence[str]) -> Table:
  """GLFC Table 2 or 3: Table 1's rows on ImageNet-Subset or Tiny-ImageNet."""
  rows = tuple(Row(key=key, label=label_, variant=method, overrides=tuple(overrides))
               for key, label_, method, overrides in GLFC_ROWS)
  classes = 100 if tasks == 10 else 200
  notes = ("FedAvg (fine-tuning) is the lower bound; the paper prints no row for it",
           "the quick scale is every method's _quick config: 4 tasks of 5 classes of a "
           "20-class stream at 64x64 through ResNet-18 at 1/8 width (the synthetic stand-in "
           "without the data)",
           "Forgetting: average forgetting after the last task (Chaudhry et al. 2018); the "
           "paper prints none", *extra)
  return Table(
      id=table_id, title=f"GLFC {source}: {label}, T = {tasks}", paper=GLFC, source=source,
      protocol=(f"{label} ({classes} classes) in T = {tasks} incremental tasks of 10 classes, "
                "30 clients at the start and 10 more per task, 10 sampled per round, 10 rounds "
                "per task, ResNet-18; the global model's accuracy on all classes seen after "
                "each task, and their mean (Avg.)"),
      family="class_incremental",
      settings=(Setting(key="", label=label, config=config, rows=rows, paper=dict(paper)),),
      kinds=(), notes=notes)


# --- the registry -------------------------------------------------------------------------


def _build() -> dict[str, Table]:
  tables = [_fcclplus_table8_9(s) for s in ("digits", "office31", "office_caltech",
                                            "office_home")]
  tables += _diagnoses()
  tables.append(_fcclplus_ablation(
      "fcclplus_table10", "Table X", "FCCL+ Table X: ablation of FCCM, FISL and FNTD",
      numbers.FCCLPLUS_TABLE10, TABLE10_ROWS, ("digits", "office31"), kinds=("inter", "intra"),
      base="solo",
      notes=(_DUAL_NOTE, "the extracted table lost its check marks: the rows follow FCCL+ "
             "Sec. 4.3 and the numbers (the FISL row is Table XIII's CIFAR-100 weak row, the "
             "FCCM + FISL row Table XIV's ω = 3 row)",
             "the paper's Δ beside ours is the printed one: the Digits inter Δs follow the "
             "printed BASE AVG 26.68 (its domains give 25.685); Office31 intra FCCM + FISL + "
             "FNTD prints +0.51 where its printed AVGs give +0.55"),
      deltas=numbers.FCCLPLUS_TABLE10_DELTA))
  tables.append(_fcclplus_ablation(
      "fcclplus_table11", "Table XI", "FCCL+ Table XI: the FCCM weight λ",
      numbers.FCCLPLUS_TABLE11, TABLE11_ROWS, ("office31",), kinds=("inter", "intra"),
      base=None,
      notes=("FCCM alone (fcclplus.use_fisl=False) with its off-diagonal weight λ (Eq. 2, "
             "fcclplus.off_diagonal_weight); its λ = 0.0051 row is Table X's FCCM row, in the "
             "paper (33.52 / 77.35) and here (the same cells)", _DUAL_NOTE,
             "the paper prints the inter- and intra-domain AVG only: the domain columns have "
             "no paper number")))
  tables.append(_fcclplus_table12())
  tables.append(_fcclplus_ablation(
      "fcclplus_table13", "Table XIII",
      "FCCL+ Table XIII: FISL with three public sets and two augmentations",
      numbers.FCCLPLUS_TABLE13, TABLE13_ROWS, ("digits", "office31"), kinds=("inter",),
      base=None,
      notes=("FISL alone (fcclplus.use_fccm=False) with the public set "
             "(scenario.public_name) and its augmentation (collaborative.augmentation) varied",
             _DUAL_NOTE, "the paper prints inter-domain accuracy only")))
  tables.append(_fcclplus_ablation(
      "fcclplus_table14", "Table XIV", "FCCL+ Table XIV: the FISL weight ω",
      numbers.FCCLPLUS_TABLE14, TABLE14_ROWS, ("digits", "office31"), kinds=("inter",),
      base=None,
      notes=("FCCM + FISL with fcclplus.fisl_weight = ω (Eq. 6)", _DUAL_NOTE,
             "the paper prints inter-domain accuracy only")))
  tables.append(_fcclplus_table15())
  tables.append(_fcclplus_ablation(
      "fcclplus_table16", "Table XVI", "FCCL+ Table XVI: FNTD against EWC in local updating",
      numbers.FCCLPLUS_TABLE16, TABLE16_ROWS, ("digits", "office31"), kinds=("inter",),
      base=None,
      notes=("the EWC rows replace FNTD by the EWC penalty on the previous-round model "
             "(fcclplus.local_distillation=ewc, fcclplus.ewc_weight = λ)",
             "the paper prints the inter-domain AVG only: the domain columns have no paper "
             "number")))
  tables.append(_fcclplus_ablation(
      "fcclplus_table17", "Table XVII", "FCCL+ Table XVII: KD before FNTD in local updating",
      numbers.FCCLPLUS_TABLE17, TABLE17_ROWS, ("digits",), kinds=("inter", "intra"), base=None,
      notes=("KD (Eq. 10) in the first kd_fraction of every round's local epochs, FNTD in the "
             "rest (fcclplus.local_distillation=kd_then_fntd)",
             "the caption names Office31 too; the paper prints Digits only")))
  tables.append(_fcclplus_table18())
  tables.append(_fcclplus_table19())
  tables.append(_fcclplus_ablation(
      "fcclplus_figure7", "Fig. 7 (its table)", "FCCL+ Fig. 7: FCCM with three public sets",
      numbers.FCCLPLUS_FIGURE7, FIGURE7_ROWS, ("digits",), kinds=("inter",), base=None,
      notes=("FCCM alone (fcclplus.use_fisl=False) with the public set varied "
             "(scenario.public_name); its CIFAR-100 row is Table X's FCCM row, in the paper "
             "(33.51) and here (the same cells)", _DUAL_NOTE,
             "the figure's table prints the inter-domain AVG only")))
  tables.append(_fcclplus_ablation(
      "fcclplus_figure9", "Fig. 9 (its tables)", "FCCL+ Fig. 9: the FNTD teacher",
      numbers.FCCLPLUS_FIGURE9, FIGURE9_ROWS, ("digits",), kinds=("inter", "intra"),
      base=None,
      notes=("the teacher T of FNTD (Eq. 13): θ^(e-1), the participant's model at the end of "
             "the previous round's local updating (FCCL+'s default, its Tables VIII/IX cell), "
             "or θ^e, its model after this round's collaborative updating "
             "(fcclplus.fntd_teacher=after_collaborative)",)))
  tables.append(_fccl_tables1_2())
  tables.append(_fccl_table3())
  tables.append(Table(
      id="fedfusion_table1", title="FedFusion Table 1: convergence accuracy",
      paper=TWO_STREAM_PAPER, source="FedFusion Table 1, columns (a)-(d)",
      protocol=TWO_STREAM_PROTOCOL, family="partitioned", base="fedavg",
      settings=(two_stream_setting("mnist", "permuted", FEDFUSION_METHODS,
                                   cells_of="fedfusion_table2",
                                   extra_rows=FEDFUSION_EXTRA_ROWS),
                two_stream_setting("cifar10", "iid", FEDFUSION_METHODS),
                two_stream_setting("cifar10", "classes5", FEDFUSION_METHODS),
                two_stream_setting("cifar10", "classes2", FEDFUSION_METHODS)),
      notes=("(a) and (b): our reading of the \"artificial non-IID partitions of CIFAR10\" "
             "the paper does not specify: (a) = cifar10 classes5, 2 clients x 5 disjoint "
             "classes (0-4 / 5-9); (b) = cifar10 classes2, 5 clients x 2 disjoint classes "
             "({0,1}, {2,3}, ...); both scored as the authors' code logs it: each client's "
             "model after its local training on the test images of its own classes, mean "
             "over the clients (eval/intra/mean); the paper's FedAvg (a) 89.89% and (b) "
             "92.21% above its IID (d) 80.01% rule out a global-accuracy reading",
             "settings in the order (c), (d), (a), (b); (c) and (d) are the global model's "
             "accuracy",
             "the mnist permuted cells are fedfusion_table2's (the same runs), its rows "
             "FedFusion+Conv, identity start, the two local-model rows and the two rows of "
             "the code's even / odd digits too: not the paper's, fedfusion_table2's "
             "diagnosis rows")))
  tables.append(Table(
      id="fedfusion_table2", title="FedFusion Table 2: rounds to 94% and 95% on permuted MNIST",
      paper=TWO_STREAM_PAPER, source="FedFusion Table 2 (and Table 1 column (c))",
      protocol=TWO_STREAM_PROTOCOL, family="partitioned", base="fedavg",
      settings=(two_stream_setting("mnist", "permuted", FEDFUSION_METHODS,
                                   extra_rows=FEDFUSION_EXTRA_ROWS),),
      scales=SCALES,
      notes=("the row FedFusion+Conv, identity start is not the paper's: the Conv operator's "
             "1x1 convolution starts as [I; 0] (the plain model; fedfusion.conv_init=identity) "
             "instead of PyTorch's default initialisation (the authors' code), the diagnosis "
             "of whether Conv's start decides its rounds to the targets",
             "the rows FedAvg, local models and FedFusion+Conv, local models are not the "
             "paper's: trained as FedAvg and FedFusion+Conv but scored as the authors' "
             "FedFusion code logs its accuracy, each client's model after its local training "
             "on the client's own permuted test split, mean over the clients "
             "(fedavg.evaluate=local), instead of the global model; the diagnosis of whether "
             "the paper's numbers are that metric's. FedFusion+Conv, local models is read "
             "against FedAvg, local models (its reduce and seed-by-seed columns)",
             "the rows FedAvg and FedFusion+Conv, the code's even / odd digits, local models "
             "are not the paper's: the data of the authors' permuted-MNIST script "
             "(thu-media/FedFusion mnist_main.py), the even digits on one client and the odd "
             "on the other, each client's training and test images under its own pixel "
             "permutation and its test set the test images of its own digits "
             "(scenario.partition=permuted_classes), scored as that code logs (local models, "
             "fedavg.evaluate=local), without the code's training augmentation. The "
             "diagnosis of whether the paper's numbers are the code's data's; the Conv row is "
             "read against the FedAvg row of the same data",
             "the rows FedAvg and FedFusion+Conv, the code's even / odd digits and "
             "augmentation, local models are not the paper's: the rows of the code's even / "
             "odd digits trained on the script's augmentation as well, RandomResizedCrop "
             "(area 8-100%, aspect 3/4 to 4/3) and a horizontal flip of the unpermuted image "
             "at every local step, before its client's permutation "
             "(fedavg.augmentation=resized_crop_flip; the library's MNIST images are 32x32, "
             "the script's 28x28: the crop covers the same share of the digit). The diagnosis "
             "of whether the paper's numbers are the code's data and augmentation's; the Conv "
             "row is read against the FedAvg row of the same setting")))
  for dataset, setting in (("cifar10", "binary"), ("mnist", "shards")):
    tables.append(two_stream_table(dataset, setting, FEDMMD_TABLE_METHODS,
                                   table_id=f"fedmmd_{dataset}_{setting}",
                                   notes=(NO_DROPOUT_NOTE, TRUNK_NOTE)))
  tables.append(Table(
      id="htfl_cifar10_practical",
      title="Data-free heterogeneous-model FL beside the public-data methods: CIFAR-10 "
            "practical (Dirichlet 0.1), HtFE2 and HtFE4", paper=HTFL_PAPER,
      source="FedKTL Table 1 (HtFE8; the paper column of both groups; no number for the "
             "public-data methods FedMD, FCCL, FCCL+, FedDF, RHFL, which it does not run)",
      protocol=HTFL_PROTOCOL, family="partitioned",
      settings=(htfl_setting("cifar10", "practical", "htfe2",
                             HTFL_METHODS + HTFL_PUBLIC_METHODS),
                htfl_setting("cifar10", "practical", "htfe4",
                             HTFL_METHODS + HTFL_PUBLIC_METHODS)),
      notes=HTFL_NOTES))
  tables += [_glfc_table(10), _glfc_table(5), _glfc_table(20)]
  tables += [_glfc_dataset_table(*entry) for entry in GLFC_DATASET_TABLES]
  return {t.id: t for t in tables}


TABLES: dict[str, Table] = _build()

#: The prepared GPU queue (experiments/reproduce.py --queue=gpu): (table, rows or None for
#: all), in priority order.
QUEUES: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "gpu": (("fcclplus_office31", ("fcclplus", "solo")),
            ("fcclplus_digits", ("fcclplus", "solo")),
            ("fedfusion_table2", FEDFUSION_METHODS),
            ("glfc_table1", tuple(row[0] for row in GLFC_ROWS))),  # the paper's rows
    # FCCL+ Tables VIII/IX at mid scale: FCCL+ and BASE (the convergence study's cells) and
    # their diagnoses, then FCCL and the other baselines; Office31 (all data real) before
    # Digits.
    "mid": (("fcclplus_office31", ("fcclplus", "solo")),
            ("fcclplus_office31_width", ("fcclplus", "solo")),
            ("fcclplus_office31_base_width", None),
            ("fcclplus_digits", ("fcclplus", "solo")),
            ("fcclplus_digits_real", ("fcclplus", "solo", "fccl", "fccl_no_distill",
                                      "fccl_no_collaboration")),
            ("fcclplus_office31", ("fccl", "fedmd", "feddf", "rhfl", "fedmatch")),
            ("fcclplus_digits", ("fccl", "fedmd", "feddf", "rhfl", "fedmatch"))),
    # HtFLlib's scenario (paper scale: 2000 rounds of 20 full-width clients, a GPU's work):
    # every method in HtFE2 and HtFE4 (not the head-classifier diagnoses), the data-free
    # methods before the public-data ones.
    "htfl": (("htfl_cifar10_practical", HTFL_METHODS + HTFL_PUBLIC_METHODS),),
}


def config_file_name(config: str) -> str:
  """The file a setting's or row's config names: "digits" -> "digits.py"; a path -> its name."""
  return pathlib.PurePath(config).name if config.endswith(".py") else f"{config}.py"


def get_table(table_id: str) -> Table:
  """The registered table, or ConfigError naming the allowed ids."""
  if table_id not in TABLES:
    raise ConfigError(f"--table={table_id!r} is not allowed; allowed tables: "
                      f"{', '.join(TABLES)}.")
  return TABLES[table_id]


def select_rows(table: Table, methods: Sequence[str] | None) -> list[str]:
  """The table's row keys named by --methods (all without), ConfigError for an unknown one."""
  known = table.row_keys
  if not methods:
    return known
  unknown = [m for m in methods if m not in known]
  if unknown:
    raise ConfigError(f"--methods: unknown row(s) {', '.join(map(repr, unknown))} of table "
                      f"{table.id}; allowed: {', '.join(known)}.")
  return [m for m in known if m in methods]


# --- cells ----------------------------------------------------------------------------------


def cell_name(table: Table, setting: Setting, row: Row, seed: int) -> str:
  """"<row>__seed<s>", or "<setting>__<row>__seed<s>" in a table of several settings."""
  name = f"{row.key}__seed{int(seed)}"
  return f"{setting.key}__{name}" if len(table.settings) > 1 and setting.key else name


def cells_table_id(table: Table, setting: Setting) -> str:
  """The table id whose results directory holds this setting's cells."""
  return setting.cells_of or table.id


def cell_dir(results_dir: Any, table: Table, setting: Setting, row: Row, seed: int,
             scale: str) -> Any:
  """results/<table>/<scale>/<cell>/ (the sharing table's for a shared setting)."""
  owner = cells_table_id(table, setting)
  name = cell_name(TABLES[owner], TABLES[owner].setting(setting.key), row, seed) \
      if setting.cells_of else cell_name(table, setting, row, seed)
  return results_dir / owner / scale / name

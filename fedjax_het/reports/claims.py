"""The papers' headline claims beside what the library's committed cells show.

A `Claim` is one comparison a paper makes its case with: a method's row against a reference
row of one paper table, on one metric (FCCL+ against BASE on Office31's inter-domain AVG,
FedMMD against FedAvg in rounds to 98%, GLFC against iCaRL + FL in average incremental
accuracy). `evidence(claim, scale, results_dir)` reads the table's finished cells at one scale
and pairs the two rows seed by seed (each seed draws the same data for every method, so the
pairing is meaningful):

  * per seed: the row's value minus the reference's (`common.paired_differences`); for rounds
    to a target, a seed where only one of the two reaches it still has a sign (the one that
    reaches is ahead), one where neither does has none;
  * the mean ± sample std (ddof=1) of the differences where every paired seed has one, and
    their share of the paper's difference;
  * the verdict, from the signs alone: the paper's direction on every seed, the opposite
    direction on every seed, or the paper's direction on k of n seeds; and on how many seeds
    the difference is larger than the reference row's spread between seeds (its sample std).

`render(results_dir)` lays every claim out at every scale that has paired cells (the
docs/results.md block `<!-- claims -->`), `render_summary` one line a claim at its largest
such scale (the README block `<!-- claims:summary -->`); `rewrite` puts either into a
document. The paper's numbers come from the tables' `paper` and `paper_delta`
(`fedjax_het.reports.paper_numbers`), the library's from results/: nothing here is typed by
hand, so the blocks change only when cells land (tests/test_claims.py keeps them equal to a
fresh rendering).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Mapping, Sequence

from fedjax_het.reports import common, document, partitioned
from fedjax_het.reports import tables as tables_lib

#: The scales a claim is read at, smallest first.
SCALES = ("quick", "mid", "paper")


@dataclasses.dataclass(frozen=True)
class Claim:
  """One headline comparison of a paper.

  Attributes:
    text: the claim in words, e.g. "FCCL+ above BASE, Office31, inter-domain AVG".
    source: the paper and its table, e.g. "FCCL+ Tables VIII/IX".
    table: the id of the `tables.Table` whose cells hold the runs.
    setting: the setting key of that table.
    row: the method's row key.
    reference: the row it is read against.
    kind: "inter" / "intra" (domain shift: the AVG), "avg" (class incremental: average
      incremental accuracy, percent) or "reach:T" (partitioned: the first round at or above
      T%, fewer is better).
  """
  text: str
  source: str
  table: str
  setting: str
  row: str
  reference: str
  kind: str

  @property
  def rounds(self) -> bool:
    """Rounds to a target: a smaller number is the better one."""
    return self.kind.startswith("reach:")


def _against_base(method: str, label: str, scenario: str, kind: str) -> Claim:
  """A row of FCCL+ Tables VIII/IX above BASE on one scenario's inter / intra AVG."""
  return Claim(f"{label} above BASE, {tables_lib.SCENARIO_LABELS[scenario]}, {kind}-domain AVG",
               "FCCL+ Tables VIII/IX", f"fcclplus_{scenario}", scenario, method, "solo", kind)


def _fedfusion_conv(target: int) -> Claim:
  """FedFusion Table 2: FedFusion+Conv reaches `target`% before FedAvg."""
  return Claim(f"FedFusion+Conv reaches {target}% in fewer rounds than FedAvg, permuted MNIST",
               "FedFusion Table 2", "fedfusion_table2", "mnist_permuted", "fedfusion_conv",
               "fedavg", f"reach:{target}")


#: The headline claims, one or two a paper, in the order of the papers in the README.
CLAIMS: tuple[Claim, ...] = (
    *(_against_base("fcclplus", "FCCL+", scenario, kind)
      for scenario in ("digits", "office31") for kind in ("inter", "intra")),
    *(_against_base("fccl", "FCCL", scenario, "inter") for scenario in ("digits", "office31")),
    Claim("GLFC above iCaRL + FL, CIFAR-100, T = 10, average incremental accuracy",
          "GLFC Table 1", "glfc_table1", "", "glfc", "icarl_fl", "avg"),
    Claim("FedMMD (MMD) reaches 98% in fewer rounds than FedAvg, MNIST shards",
          "FedMMD Sec. 4.2.2", "fedmmd_mnist_shards", "mnist_shards", "fedmmd", "fedavg",
          "reach:98"),
    _fedfusion_conv(94),
    _fedfusion_conv(95),
)


# --- the paper's side -------------------------------------------------------------------------


def paper_values(claim: Claim) -> tuple[float, float, float]:
  """(the row's number, the reference's, the difference the paper states) as the paper
  prints them: a domain-shift difference is the Δ vs BASE the paper prints where it prints
  one (`Setting.paper_delta`), otherwise the difference of the two printed numbers."""
  table = tables_lib.get_table(claim.table)
  paper = table.setting(claim.setting).paper
  if table.family == "domain_shift":
    row, ref = paper[claim.kind][claim.row]["AVG"], paper[claim.kind][claim.reference]["AVG"]
    printed = table.setting(claim.setting).paper_delta.get(claim.kind, {}).get(claim.row)
    return row, ref, (row - ref) if printed is None else printed
  if table.family == "class_incremental":
    row, ref = paper[claim.row][claim.kind], paper[claim.reference][claim.kind]
    return row, ref, row - ref
  rounds = paper["rounds"][partitioned.target_key(float(claim.kind.split(":")[1]))]
  return rounds[claim.row], rounds[claim.reference], rounds[claim.row] - rounds[claim.reference]


# --- the library's side -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Seed:
  """One paired seed: the two rows' values (None: the run never reached the target), their
  difference (None where one is None) and its sign in the claim's terms (+1 the row ahead of
  the reference, -1 behind, 0 a tie, None where neither reached the target)."""
  seed: int
  value: float | None
  reference: float | None
  difference: float | None
  ahead: int | None
  rounds_run: int | None = None


def _ahead(claim: Claim, value: float | None, reference: float | None) -> int | None:
  if value is None and reference is None:
    return None
  if value is None or reference is None:  # rounds: only one of the two reached the target
    return 1 if value is not None else -1
  sign = (value > reference) - (value < reference)
  return -sign if claim.rounds else sign


@dataclasses.dataclass(frozen=True)
class Evidence:
  """What one scale's cells show of a claim (`evidence`)."""
  claim: Claim
  scale: str
  seeds: tuple[Seed, ...]
  reference_std: float | None
  synthetic: tuple[str, ...] = ()

  @property
  def differences(self) -> list[float] | None:
    """The per-seed differences, None unless every paired seed has one."""
    values = [s.difference for s in self.seeds]
    return None if any(v is None for v in values) else values

  @property
  def decided(self) -> list[Seed]:
    """The paired seeds with a sign."""
    return [s for s in self.seeds if s.ahead is not None]

  def agreeing(self, paper_difference: float) -> int:
    """Seeds whose sign is the paper's (a tie agrees with no paper difference but 0)."""
    paper_sign = (paper_difference > 0) - (paper_difference < 0)
    if self.claim.rounds:
      paper_sign = -paper_sign
    return sum(s.ahead == paper_sign for s in self.decided)

  def opposing(self, paper_difference: float) -> int:
    paper_sign = (paper_difference > 0) - (paper_difference < 0)
    if self.claim.rounds:
      paper_sign = -paper_sign
    return sum(s.ahead == -paper_sign for s in self.decided)

  @property
  def beyond_spread(self) -> int | None:
    """Seeds whose |difference| exceeds the reference row's sample std between seeds; None
    where that std or a difference is undefined."""
    differences = self.differences
    if differences is None or not self.reference_std:
      return None
    return sum(abs(d) > self.reference_std for d in differences)


def evidence(claim: Claim, scale: str, results_dir: pathlib.Path,
             rendered: tuple[dict, dict] | None = None) -> Evidence | None:
  """The claim's paired seeds at one scale, None without a seed both rows finished.

  Args:
    claim: the claim.
    scale: "quick", "mid" or "paper".
    results_dir: the directory of the cells (the repository's results/).
    rendered: (`document.render`'s numbers, `document.collect`'s cells) of the claim's table
      at that scale, when the caller has them.
  """
  table = tables_lib.get_table(claim.table)
  if scale not in table.scales:
    return None
  if rendered is None:
    rendered = (document.render(table, scale, results_dir)[1],
                document.collect(table, scale, results_dir))
  numbers, cells_of = rendered
  mine = document.seed_values(table, numbers, cells_of, claim.setting, claim.row, claim.kind)
  theirs = document.seed_values(table, numbers, cells_of, claim.setting, claim.reference,
                                claim.kind)
  paired = sorted(set(mine) & set(theirs))
  if not paired:
    return None
  cells = cells_of.get(claim.setting, {})
  seeds = []
  for seed in paired:
    value, reference = mine[seed], theirs[seed]
    difference = None if value is None or reference is None else value - reference
    rounds_run = (min(partitioned.num_rounds(cells[claim.row][seed]["records"]),
                      partitioned.num_rounds(cells[claim.reference][seed]["records"]))
                  if claim.rounds else None)
    seeds.append(Seed(seed, value, reference, difference, _ahead(claim, value, reference),
                      rounds_run))
  finite = [v for v in theirs.values() if v is not None]
  reference_std = common.mean_std(finite)[1] if len(finite) == len(theirs) else None
  synthetic = tuple(name for name, sources in numbers["data_sources"].items()
                    if {common.source_kind(v) for v in sources} & {"synthetic", "substituted"})
  return Evidence(claim, scale, tuple(seeds), reference_std, synthetic)


def scale_text(item: Evidence) -> str:
  """"mid", or "mid (svhn, syn synthetic)" where the cells stand synthetic data in for a
  domain."""
  if not item.synthetic:
    return item.scale
  return f"{item.scale} ({', '.join(item.synthetic)} synthetic)"


def every_evidence(results_dir: pathlib.Path, claims: Sequence[Claim] = CLAIMS
                   ) -> list[tuple[Claim, list[Evidence]]]:
  """Each claim with its evidence at every scale that has paired cells, smallest first (each
  table rendered once a scale)."""
  cache: dict[tuple[str, str], tuple[dict, dict]] = {}
  out = []
  for claim in claims:
    table = tables_lib.get_table(claim.table)
    found = []
    for scale in SCALES:
      if scale not in table.scales:
        continue
      key = (claim.table, scale)
      if key not in cache:
        cache[key] = (document.render(table, scale, results_dir)[1],
                      document.collect(table, scale, results_dir))
      item = evidence(claim, scale, results_dir, cache[key])
      if item is not None:
        found.append(item)
    out.append((claim, found))
  return out


# --- in words -------------------------------------------------------------------------------


def _number(claim: Claim, value: float, *, signed: bool = False) -> str:
  if claim.rounds:
    return f"{value:+.0f}" if signed else f"{value:.0f}"
  return f"{value:+.2f}" if signed else f"{value:.2f}"


def paper_reduction(claim: Claim) -> float:
  """Rounds to a target: the reduction the paper prints (percent fewer rounds than the
  reference), or 1 - row / reference of its printed rounds where it prints none."""
  table = tables_lib.get_table(claim.table)
  printed = table.setting(claim.setting).paper.get("reduction", {}).get(
      partitioned.target_key(float(claim.kind.split(":")[1])), {}).get(claim.row)
  row, ref, _ = paper_values(claim)
  return printed if printed is not None else 100.0 * (1.0 - row / ref)


def paper_text(claim: Claim) -> str:
  """"+9.49 (37.21 vs 27.72)"; rounds: "23.4% fewer rounds (72 vs 128)"."""
  row, ref, difference = paper_values(claim)
  pair = f"({_number(claim, row)} vs {_number(claim, ref)})"
  if claim.rounds:
    return f"{paper_reduction(claim):.1f}% fewer rounds {pair}"
  return f"{_number(claim, difference, signed=True)} {pair}"


def seed_text(claim: Claim, seed: Seed) -> str:
  """One paired seed: "+3.49"; rounds "-27 (67 vs 94)", "(60 vs never in 300)"."""
  if not claim.rounds:
    return _number(claim, seed.difference, signed=True)
  shown = [("never" if v is None else _number(claim, v)) for v in (seed.value, seed.reference)]
  pair = f"{shown[0]} vs {shown[1]}"
  if seed.difference is None:
    return f"{pair} in {seed.rounds_run} rounds"
  return f"{_number(claim, seed.difference, signed=True)} ({pair})"


def seeds_text(item: Evidence) -> str:
  """The per-seed texts in seed order; rounds to a target: one text with ", each seed" when
  they are all equal."""
  texts = [seed_text(item.claim, s) for s in item.seeds]
  if item.claim.rounds and len(texts) > 1 and len(set(texts)) == 1:
    return f"{texts[0]}, each seed"
  return ", ".join(texts)


def mean_text(item: Evidence) -> str:
  """"+4.11 ± 0.55, 43% of the paper's"; rounds "-28.3 ± 10.0 rounds, 30.9% fewer"; "–"
  where a seed has no difference."""
  differences = item.differences
  if differences is None:
    return "–"
  mean, std = common.mean_std(differences)
  if item.claim.rounds:
    fewer = 100.0 * (1.0 - sum(s.value for s in item.seeds) / sum(s.reference for s in item.seeds))
    spread = "" if std is None else f" ± {std:.1f}"
    return f"{mean:+.1f}{spread} rounds, {fewer:.1f}% fewer"
  text = _number(item.claim, mean, signed=True)
  if std is not None:
    text += f" ± {_number(item.claim, std)}"
  paper = paper_values(item.claim)[2]
  if paper:
    text += f", {100 * mean / paper:.0f}% of the paper's"
  return text


def verdict_text(item: Evidence) -> str:
  """The signs in words, with the seeds beyond the reference's spread."""
  paper = paper_values(item.claim)[2]
  n, decided = len(item.seeds), len(item.decided)
  agree, oppose = item.agreeing(paper), item.opposing(paper)
  seeds = "seed" if n == 1 else "seeds"
  if decided == 0:
    return f"neither row reaches the target on the {n} paired {seeds}"
  if agree == n:
    text = ("the paper's direction on the one paired seed" if n == 1
            else f"the paper's direction on every seed ({n} of {n})")
  elif oppose == n:
    text = ("the opposite direction on the one paired seed" if n == 1
            else f"the opposite direction on every seed ({n} of {n})")
  else:
    text = f"the paper's direction on {agree} of {n} {seeds}"
    if decided < n:
      text += f" ({n - decided} undecided: neither reaches the target)"
  beyond = item.beyond_spread
  if beyond is not None and n > 1:
    reference = item.claim.reference
    label = next(r.label for r in tables_lib.get_table(item.claim.table)
                 .setting(item.claim.setting).rows if r.key == reference)
    text += (f"; beyond {common.short_label(label)}'s spread between seeds on {beyond} of "
             f"{n}")
  return text


CLAIMS_INTRO = (
    "Each paper's headline comparisons, read from the cells under `results/` at every scale "
    "that has both rows (`python experiments/reproduce.py --claims` renders this block; "
    "`fedjax_het/reports/claims.py` names the claims). Per seed: the method minus its "
    "reference on that seed (rounds to a target: the method's rounds minus the reference's, "
    "fewer is better; \"never\": not reached in the run's rounds). The verdict counts the "
    "seeds whose sign is the paper's, and the seeds on which the difference is larger than "
    "the reference row's sample std between seeds. The quick scale is too small for the "
    "papers' gaps: it shows the pipeline trains.")


def render(results_dir: pathlib.Path, claims: Sequence[Claim] = CLAIMS) -> str:
  """The docs/results.md block: every claim at every scale with paired cells."""
  header = ["the paper's claim", "paper", "scale", "seeds", "per seed", "mean ± std",
            "verdict"]
  lines = [CLAIMS_INTRO, "", common.markdown_row(header), common.markdown_rule(len(header))]
  for claim, found in every_evidence(results_dir, claims):
    head = [f"{claim.text} ({claim.source})", paper_text(claim)]
    if not found:
      lines.append(common.markdown_row(head + ["–", "–", "no paired cells", "–", "–"]))
      continue
    for item in found:
      lines.append(common.markdown_row(head + [
          scale_text(item), ", ".join(str(s.seed) for s in item.seeds), seeds_text(item),
          mean_text(item),
          verdict_text(item)]))
  return "\n".join(lines) + "\n"


SUMMARY_INTRO = (
    "The papers' headline comparisons at the largest scale this repository has trained them, "
    "from the cells under `results/` (seeds paired: each draws the same data for both rows); "
    "every scale, with the per-seed numbers, is in "
    "[docs/results.md](docs/results.md#the-papers-claims).")


def render_summary(results_dir: pathlib.Path, claims: Sequence[Claim] = CLAIMS) -> str:
  """The README block: each claim at its largest scale with paired cells."""
  header = ["the paper's claim", "paper", "this library (scale, seeds)", "verdict"]
  lines = [SUMMARY_INTRO, "", common.markdown_row(header), common.markdown_rule(len(header))]
  for claim, found in every_evidence(results_dir, claims):
    head = [f"{claim.text} ({claim.source})", paper_text(claim)]
    if not found:
      lines.append(common.markdown_row(head + ["not trained", "–"]))
      continue
    item = found[-1]
    shown = mean_text(item) if item.differences is not None else seeds_text(item)
    seeds = ", ".join(str(s.seed) for s in item.seeds)
    synthetic = f"; {', '.join(item.synthetic)} synthetic" if item.synthetic else ""
    which = f"{item.scale}, {'seed' if len(item.seeds) == 1 else 'seeds'} {seeds}{synthetic}"
    lines.append(common.markdown_row(head + [f"{shown} ({which})", verdict_text(item)]))
  return "\n".join(lines) + "\n"


# --- the blocks -------------------------------------------------------------------------------

BLOCKS = {"claims": render, "claims:summary": render_summary}


def _pattern(name: str) -> re.Pattern:
  return re.compile(rf"<!-- {re.escape(name)} -->\n(.*?)<!-- /claims -->\n", re.S)


def block(text: str, name: str) -> str | None:
  """The content of a document's block `name` ("claims" or "claims:summary"), None without."""
  match = _pattern(name).search(text)
  return None if match is None else match.group(1)


def rewrite(text: str, name: str, content: str) -> str:
  """`text` with its block `name` replaced by `content` (a document without the block is
  returned as it is: where the block goes is the document's choice)."""
  match = _pattern(name).search(text)
  if match is None:
    return text
  new = f"<!-- {name} -->\n{content.rstrip()}\n<!-- /claims -->\n"
  return text[:match.start()] + new + text[match.end():]


def stale(text: str, results_dir: pathlib.Path) -> list[str]:
  """The names of a document's claims blocks that differ from a fresh rendering."""
  return [name for name, make in BLOCKS.items()
          if (content := block(text, name)) is not None
          and content.rstrip() != make(results_dir).rstrip()]


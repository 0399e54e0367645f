"""docs/results.md's readings: every per-seed claim is marked, and every marked claim holds in
the committed cells under results/.

A reading is the hand-written text beside the rendered blocks. Each per-seed claim it makes
("on every seed", "changes sign", "on two seeds of three", a list of per-seed differences) is
followed, in the same sentence, by a marker

  <!-- seeds: TABLE SETTING ROWS REF KIND CLAIM [VALUES] -->

  TABLE    a table id, its quick-scale cells ("id:scale" for another scale).
  SETTING  the setting key ("-" for a table's one unnamed setting).
  ROWS     a row key, rows joined by commas, or "*" (every row of the setting but REF).
  REF      the row the claim reads ROWS against: a row key of the setting, "table:row" (that
           row of another table's setting of the same key), rows joined by commas (paired
           with ROWS in order), "*" (each other row of the setting with a finished cell,
           one ROW only) or "-"
           (none: the row's own per-seed values).
  KIND     inter / intra (domain shift: the AVG; inter:P / intra:P participant P's column),
           final (partitioned: the final accuracy),
           avg / forgetting (class incremental, percent), and for partitioned settings
           reach:T (the first round at or above T%, "-" when never) and round:R (the accuracy
           at round R; REF "-").
  CLAIM    on the per-seed differences ROW - REF over the seeds both finished:
           above / below / changes (`common.seed_verdict`: every difference > 0, every one
           < 0, both signs), notabove / notbelow (every one <= 0 / >= 0), above:K / below:K
           (exactly K seeds), beyond / beyond:K (|difference| larger than REF's sample std
           on every seed / on exactly K), within:X (|difference| <= X on every seed, at X's
           printed digits), reached:K (REF "-", KIND reach:T: exactly K seeds reach T),
           values (the values alone); "!" before a claim negates it ("!above": not above
           on every seed).
  VALUES   the per-seed numbers as the sentence prints them, in seed order, comma-joined
           ("+2.12,+1.15,+1.92"; "-" for a seed without a value, "_" for a seed the
           sentence says nothing of), or "LO..HI" (the smallest and largest over every row
           and seed): each must equal the cells' number to the printed digits, and the
           sentence must print them, in that order, before the marker.

Every marker is checked against the cells, read by the renderer (`document.render`'s numbers,
`document.collect`'s records), and a reading sentence with one of PHRASES and no marker after
it fails.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re

import pytest

from fedjax_het.reports import common, document
from fedjax_het.reports import tables

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "results.md"
RESULTS = REPO / "results"

#: Phrases of a per-seed claim: a sentence with one needs a marker after each.
PHRASES = ("every seed", "all three seeds", "changes sign", "of three", "any seed", "no seed",
           "on seed ", "in seed ", "of the three seeds", "two seeds")

MARKER = re.compile(r"<!-- seeds: (.*?) -->")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
#: A rendered block (reproduce, readme_results, convergence, ...): generated, not a reading.
_BLOCKS = re.compile(r"<!-- ([a-z_]+):[^\n]*? -->.*?<!-- /\1 -->", re.S)
#: A sentence ends at ". " before a capital letter, or where a bullet ("  - ") starts.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])|\n\s*-\s+")


@dataclasses.dataclass(frozen=True)
class Marker:
  table: str
  scale: str
  setting: str
  rows: tuple[str, ...]
  ref: str
  kind: str
  claim: str
  values: tuple[str, ...]
  text: str


def parse_marker(body: str) -> Marker:
  """A marker's fields (ValueError for a malformed one)."""
  parts = body.split()
  if len(parts) not in (6, 7):
    raise ValueError(f"a seeds marker has 6 or 7 fields, not {len(parts)}: {body!r}")
  table, setting, rows, ref, kind, claim = parts[:6]
  values = tuple(parts[6].split(",")) if len(parts) == 7 else ()
  table, _, scale = table.partition(":")
  return Marker(table=table, scale=scale or "quick", setting="" if setting == "-" else setting,
                rows=tuple(rows.split(",")), ref=ref, kind=kind, claim=claim, values=values,
                text=body)


# --- the cells, as the renderer reads them --------------------------------------------------


@functools.lru_cache(maxsize=None)
def _rendered(table_id: str, scale: str, results: pathlib.Path) -> tuple[dict, dict]:
  table = tables.get_table(table_id)
  _, numbers = document.render(table, scale, results)
  return numbers, document.collect(table, scale, results)


def seed_values(table_id: str, scale: str, setting: str, row: str, kind: str,
                results: pathlib.Path = RESULTS) -> dict[int, float | None]:
  """{seed: value} of a row's finished cells: what the rendered table shows of KIND."""
  numbers, cells = _rendered(table_id, scale, results)
  return document.seed_values(tables.get_table(table_id), numbers, cells, setting, row, kind)


def _std(values: dict[int, float | None]) -> float:
  finite = [v for v in values.values() if v is not None]
  return (common.mean_std(finite)[1] or 0.0) if finite else 0.0


def _pairs(marker: Marker, results: pathlib.Path) -> list[tuple[str, str]]:
  """The (row, reference) pairs a marker claims about."""
  rows_of = [r.key for r in tables.get_table(marker.table).setting(marker.setting).rows]
  if marker.rows == ("*",):
    return [(row, marker.ref) for row in rows_of if row != marker.ref.split(":")[-1]]
  if marker.ref == "*":
    (row,) = marker.rows
    return [(row, other) for other in rows_of if other != row and any(
        v is not None for v in seed_values(marker.table, marker.scale, marker.setting, other,
                                           marker.kind, results).values())]
  refs = marker.ref.split(",")
  if len(refs) > 1:
    if len(refs) != len(marker.rows):
      raise ValueError(f"{len(marker.rows)} rows against {len(refs)} references")
    return list(zip(marker.rows, refs))
  return [(row, marker.ref) for row in marker.rows]


def _half_unit(printed: str) -> float:
  """Half a unit of a printed number's last digit (+ a float's rounding): "0.89" -> 0.005."""
  decimals = len(printed.split(".")[1]) if "." in printed else 0
  return 0.5 * 10 ** -decimals + 1e-9


def _close(printed: str, value: float | None) -> bool:
  if printed == "_":
    return True
  if printed == "-":
    return value is None
  if value is None:
    return False
  return abs(float(printed) - value) <= _half_unit(printed)


def _holds(claim: str, values: dict[int, float | None], ref_std: float) -> bool:
  if claim.startswith("!"):
    return not _holds(claim[1:], values, ref_std)
  present = [v for v in values.values() if v is not None]
  name, _, arg = claim.partition(":")
  if name == "values":
    return True
  if name == "reached":
    return sum(v is not None for v in values.values()) == int(arg)
  if len(present) < 2 or len(present) < len(values):
    return False
  if name in ("above", "below", "changes") and not arg:
    return common.seed_verdict(present) == name
  tests = {"above": lambda v: v > 0, "below": lambda v: v < 0,
           "notabove": lambda v: v <= 0, "notbelow": lambda v: v >= 0,
           "beyond": lambda v: abs(v) > ref_std}
  if name == "within":  # at the printed digits of X: "at most 0.89" holds for 0.892
    return all(abs(v) <= float(arg) + _half_unit(arg) for v in present)
  if name not in tests:
    raise ValueError(f"unknown claim {claim!r}")
  count = sum(map(tests[name], present))
  return count == (int(arg) if arg else len(present))


def check_marker(marker: Marker, sentence: str = "", results: pathlib.Path = RESULTS
                 ) -> list[str]:
  """What is wrong with a marker's claim, its values and their printing ([]: all holds)."""
  problems = []
  every: list[float] = []
  for row, ref in _pairs(marker, results):
    mine = seed_values(marker.table, marker.scale, marker.setting, row, marker.kind, results)
    if not mine:
      problems.append(f"{row}: no finished cell")
      continue
    if ref == "-":
      values, ref_std = mine, 0.0
    else:
      ref_table, _, ref_row = ref.rpartition(":")
      theirs = seed_values(ref_table or marker.table, marker.scale, marker.setting, ref_row,
                           marker.kind, results)
      values = {s: (None if mine[s] is None or theirs[s] is None else mine[s] - theirs[s])
                for s in sorted(set(mine) & set(theirs))}
      ref_std = _std(theirs)
    every += [v for v in values.values() if v is not None]
    shown = ", ".join("-" if v is None else f"{v:+.2f}" for v in values.values())
    if not _holds(marker.claim, values, ref_std):
      problems.append(f"{row} vs {ref}: {marker.claim!r} does not hold (per seed {shown})")
    if marker.values and ".." not in marker.values[0]:
      if len(marker.values) != len(values) or not all(
          _close(p, v) for p, v in zip(marker.values, values.values())):
        problems.append(f"{row} vs {ref}: printed {', '.join(marker.values)}, the cells give "
                        f"{shown}")
  if marker.values and ".." in marker.values[0]:
    low, high = marker.values[0].split("..")
    if not every or not (_close(low, min(every)) and _close(high, max(every))):
      problems.append(f"printed {low} to {high}, the cells give "
                      f"{min(every, default=math.nan):+.2f} to "
                      f"{max(every, default=math.nan):+.2f}")
  printed = [v for value in marker.values for v in value.split("..") if v not in "-_"]
  if sentence and printed and not _subsequence(printed, _NUMBER.findall(sentence)):
    problems.append(f"the sentence does not print {', '.join(printed)} before the marker")
  return problems


def _subsequence(wanted: list[str], found: list[str]) -> bool:
  it = iter(found)
  return all(any(w == f for f in it) for w in wanted)


# --- the readings -----------------------------------------------------------------------------


def reading_sentences(text: str) -> list[str]:
  """The sentences of a document's text outside its rendered blocks."""
  outside = _BLOCKS.sub("\n\n", text)
  sentences = []
  for paragraph in re.split(r"\n\s*\n", outside):
    sentences += [s for s in _SENTENCE_END.split(paragraph) if s.strip()]
  return sentences


def unmarked_phrases(sentence: str) -> list[str]:
  """The per-seed phrases of a sentence with no marker after them (before the next one)."""
  plain = " ".join(sentence.split())
  found = sorted((m.start(), m.end(), phrase) for phrase in PHRASES
                 for m in re.finditer(re.escape(phrase), plain))
  hits: list[tuple[int, str]] = []  # adjacent phrases ("two seeds" "of three") are one claim
  last_end = -2
  for start, end, phrase in found:
    if start > last_end + 1:
      hits.append((start, phrase))
    last_end = max(last_end, end)
  markers = [m.start() for m in MARKER.finditer(plain)]
  missing = []
  for index, (start, phrase) in enumerate(hits):
    end = hits[index + 1][0] if index + 1 < len(hits) else len(plain)
    if not any(start < m <= end for m in markers):
      missing.append(phrase)
  return missing


def check_text(text: str, results: pathlib.Path = RESULTS) -> list[str]:
  """Every problem of a document's readings: unmarked per-seed phrases, false claims."""
  problems = []
  for sentence in reading_sentences(text):
    plain = " ".join(sentence.split())
    problems += [f"{phrase!r} without a seeds marker in: {plain[:160]}"
                 for phrase in unmarked_phrases(sentence)]
    for match in MARKER.finditer(plain):
      before = MARKER.sub(" ", plain[:match.start()])
      try:
        marker = parse_marker(match.group(1))
        problems += [f"<!-- seeds: {marker.text} -->: {p}"
                     for p in check_marker(marker, before, results)]
      except (ValueError, KeyError) as error:
        problems.append(f"<!-- seeds: {match.group(1)} -->: {error!r}")
  return problems


# --- tests --------------------------------------------------------------------------------------


def test_every_per_seed_claim_of_the_readings_is_marked_and_holds():
  problems = check_text(DOC.read_text())
  assert not problems, "docs/results.md readings:\n" + "\n".join(problems)


def test_the_readings_have_markers():
  assert len(MARKER.findall(DOC.read_text())) >= 50


FALSE_OFFICE31 = ("FCCL has the highest inter mean (24.36 ± 0.51) but is below BASE on seed 1; "
                  "every other difference changes sign between seeds.")


def test_the_false_office31_sentence_fails_unmarked_and_marked():
  # Unmarked: the phrases have no marker.
  assert set(unmarked_phrases(FALSE_OFFICE31)) == {"on seed ", "changes sign"}
  assert check_text(FALSE_OFFICE31)
  # Marked, the claim about RHFL's intra difference is false: it is below BASE on all three.
  marked = FALSE_OFFICE31.replace(
      "changes sign between seeds",
      "changes sign between seeds<!-- seeds: fcclplus_office31 office31 rhfl solo intra "
      "changes -->")
  problems = check_text(marked)
  assert any("'changes' does not hold" in p and "-14.69, -11.10, -14.67" in p for p in problems)
  assert not check_text("RHFL is below BASE intra on every seed (-14.69, -11.10, -14.67)<!-- "
                        "seeds: fcclplus_office31 office31 rhfl solo intra below "
                        "-14.69,-11.10,-14.67 -->.")


def test_a_copy_of_the_document_with_the_false_claim_fails(tmp_path):
  text = DOC.read_text()
  true_claim = "fcclplus_office31 office31 rhfl solo intra below -14.69,-11.10,-14.67"
  assert true_claim in text
  copy = tmp_path / "results.md"
  copy.write_text(text.replace(true_claim, "fcclplus_office31 office31 rhfl solo intra changes "
                                           "-14.69,-11.10,-14.67"))
  assert any("'changes' does not hold" in p for p in check_text(copy.read_text()))
  # The sentence as an unmarked reading: its phrases have no marker.
  copy.write_text(text + "\n" + FALSE_OFFICE31 + "\n")
  assert any("without a seeds marker" in p for p in check_text(copy.read_text()))


def test_wrong_values_and_unprinted_values_are_caught():
  good = ("RHFL is below BASE intra on every seed (-14.69, -11.10, -14.67)<!-- seeds: "
          "fcclplus_office31 office31 rhfl solo intra below -14.69,-11.10,-14.67 -->.")
  assert not check_text(good)
  assert any("printed -14.69, -11.10, -14.76" in p
             for p in check_text(good.replace("-14.67", "-14.76")))
  assert any("does not print" in p
             for p in check_text(good.replace("(-14.69, -11.10, -14.67)", "(-14.69, -11.10)")))
  assert any("'above' does not hold" in p for p in check_text(good.replace(" below -", " above -")))


def test_a_participants_column_is_its_results_number_seed_by_seed():
  # intra:dslr reads each seed's results.json (the mean of the last rounds the table shows).
  dslr = seed_values("fcclplus_office31", "mid", "office31", "solo", "intra:dslr")
  by_hand = {seed: json.loads((RESULTS / "fcclplus_office31" / "mid" / f"solo__seed{seed}" /
                               "results.json").read_text())["intra"]["dslr"] for seed in (0, 1, 2)}
  assert dslr == pytest.approx(by_hand) and len(dslr) == 3
  assert seed_values("fcclplus_office31", "mid", "office31", "solo", "intra")[0] == (
      pytest.approx(sum(json.loads((RESULTS / "fcclplus_office31" / "mid" / "solo__seed0" /
                                    "results.json").read_text())["intra"][d]
                        for d in ("amazon", "dslr", "webcam")) / 3))
  good = ("BASE's DSLR intra reads 76.51 on seed 0<!-- seeds: fcclplus_office31:mid office31 "
          "solo - intra:dslr values 76.51,_,_ -->.")
  assert not check_text(good)
  assert any("76.52" in p for p in check_text(good.replace("76.51", "76.52")))
  with pytest.raises(ValueError, match="no 'intra:svhn'"):
    seed_values("fcclplus_office31", "mid", "office31", "solo", "intra:svhn")


def test_sentences_split_at_full_stops_and_bullets_not_at_decimals_or_abbreviations():
  text = ("A is 1.5 (Eq. 10) above B. C changes sign\n  - D is above on every seed.\n\n"
          "<!-- reproduce:x:quick -->\nB on every seed.\n<!-- /reproduce -->\nE.\n\n"
          "<!-- convergence:mid -->\nF on every seed.\n<!-- /convergence -->\n")
  assert reading_sentences(text) == ["A is 1.5 (Eq. 10) above B.", "C changes sign",
                                     "D is above on every seed.", "E."]


def test_a_marker_must_follow_each_phrase():
  assert unmarked_phrases("above on two seeds of three<!-- seeds: t s r f inter above:2 -->.") \
      == []
  assert unmarked_phrases("above on two seeds of three.") == ["two seeds"]
  assert unmarked_phrases("above on every seed<!-- seeds: t s r f inter above --> and "
                          "below on every seed.") == ["every seed"]
  assert unmarked_phrases("above on every seed (x)<!-- seeds: t s r f inter above --> and "
                          "below on every seed (y)<!-- seeds: t s r f intra below -->.") == []


@pytest.mark.parametrize("claim, values, holds", [
    ("above", {0: 1.0, 1: 2.0, 2: 0.5}, True),
    ("above", {0: 1.0, 1: 0.0, 2: 0.5}, False),   # a tie breaks "on every seed"
    ("notbelow", {0: 1.0, 1: 0.0, 2: 0.5}, True),
    ("changes", {0: 1.0, 1: 0.0, 2: 0.5}, False),  # a tie is no sign change
    ("changes", {0: 1.0, 1: 0.0, 2: -0.5}, True),
    ("below:2", {0: -1.0, 1: 0.3, 2: -0.5}, True),
    ("above:2", {0: -1.0, 1: 0.3, 2: -0.5}, False),
    ("within:1.0", {0: -1.0, 1: 0.3}, True),
    ("beyond:1", {0: -1.0, 1: 0.3}, True),         # against a std of 0.5
    ("above", {0: 1.0}, False),                    # one seed: no verdict
    ("reached:1", {0: 7, 1: None, 2: None}, True),
    ("!above", {0: 1.0, 1: -0.2}, True),
    ("within:0.89", {0: 0.892, 1: -0.3}, True),    # 0.892 prints as 0.89
    ("within:0.89", {0: 0.896, 1: -0.3}, False),
])
def test_claims_by_hand(claim, values, holds):
  assert _holds(claim, values, 0.5) is holds

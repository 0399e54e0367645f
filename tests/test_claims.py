"""The papers' claims beside the cells (fedjax_het.reports.claims), on hand-made cells whose
differences, means, spreads and verdicts are worked out by hand, and the shipped blocks."""

import json
import pathlib

import pytest

from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import claims
from tests import test_reproduce as helpers

REPO = pathlib.Path(__file__).resolve().parents[1]
OFFICE31 = ("amazon", "dslr", "webcam")
SOURCES = {d: "npz:/data/office31.npz" for d in OFFICE31} | {"public": "npz:/data/p.npz"}
CLAIM_INTER = next(c for c in claims.CLAIMS
                   if (c.table, c.row, c.kind) == ("fcclplus_office31", "fcclplus", "inter"))
CLAIM_FEDMMD = next(c for c in claims.CLAIMS if c.table == "fedmmd_mnist_shards")


def _office31(results, row, seed, inter, intra=70.0):
  """An Office31 quick cell whose every participant scores `inter` / `intra`."""
  numbers = {kind: {**{d: value for d in OFFICE31}, "AVG": value}
             for kind, value in (("inter", inter), ("intra", intra))}
  helpers.write_cell(results, helpers._cell("fcclplus_office31", row, seed), numbers,
                     sources=SOURCES)


def _shards(results, row, seed, reach, rounds=10):
  """A FedMMD MNIST-shards mid cell: accuracy 50% until round `reach` (None: never), 98.5%
  from it on."""
  path = helpers.write_cell(results, helpers._cell("fedmmd_mnist_shards", row, seed, "mid"),
                            {}, rounds=rounds, sources={"mnist": "npz:/d/digits.npz",
                                                        "public": "none"})
  records = [{"round": r, "eval/accuracy/mean": 98.5 if reach and r >= reach else 50.0}
             for r in range(1, rounds + 1)]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  final = sum(r["eval/accuracy/mean"] for r in records[-3:]) / 3
  (path / "results.json").write_text(json.dumps({"accuracy": {"mnist": final, "AVG": final}}))


def test_per_seed_differences_mean_spread_and_verdict_by_hand(tmp_path):
  # BASE 20, 22, 24 (sample std 2.0); FCCL+ 25, 21, 30: +5, -1, +6 on seeds 0, 1, 2.
  for seed, (base, ours) in enumerate(((20.0, 25.0), (22.0, 21.0), (24.0, 30.0))):
    _office31(tmp_path, "solo", seed, base)
    _office31(tmp_path, "fcclplus", seed, ours)
  item = claims.evidence(CLAIM_INTER, "quick", tmp_path)
  assert [s.seed for s in item.seeds] == [0, 1, 2]
  assert [s.difference for s in item.seeds] == pytest.approx([5.0, -1.0, 6.0])
  assert [s.ahead for s in item.seeds] == [1, -1, 1]
  assert item.reference_std == pytest.approx(2.0)
  assert item.beyond_spread == 2  # |+5| and |+6| exceed 2.0, |-1| does not
  assert claims.seeds_text(item) == "+5.00, -1.00, +6.00"
  # mean 10/3, sample std sqrt(((5 - 10/3)^2 + (-1 - 10/3)^2 + (6 - 10/3)^2) / 2) = 3.786;
  # the paper's Δ +9.49: 3.333 / 9.49 = 35%.
  assert claims.mean_text(item) == "+3.33 ± 3.79, 35% of the paper's"
  assert claims.verdict_text(item) == ("the paper's direction on 2 of 3 seeds; beyond BASE's "
                                       "spread between seeds on 2 of 3")
  assert claims.scale_text(item) == "quick"


def test_every_seed_one_way_or_the_other(tmp_path):
  for seed in range(3):
    _office31(tmp_path, "solo", seed, 20.0 + seed)
    _office31(tmp_path, "fcclplus", seed, 20.5 + seed)  # +0.5 each seed, BASE std 1.0
    _office31(tmp_path, "fccl", seed, 18.0 + seed)  # -2.0 each seed
  item = claims.evidence(CLAIM_INTER, "quick", tmp_path)
  assert claims.verdict_text(item) == ("the paper's direction on every seed (3 of 3); beyond "
                                       "BASE's spread between seeds on 0 of 3")
  fccl = next(c for c in claims.CLAIMS
              if (c.table, c.row, c.kind) == ("fcclplus_office31", "fccl", "inter"))
  item = claims.evidence(fccl, "quick", tmp_path)
  assert claims.mean_text(item) == "-2.00 ± 0.00, -34% of the paper's"  # -2.00 / 5.80
  assert claims.verdict_text(item).startswith("the opposite direction on every seed (3 of 3)")
  # One seed paired: no spread, no "every seed".
  only = tmp_path / "one"
  _office31(only, "solo", 0, 20.0)
  _office31(only, "fcclplus", 0, 23.0)
  _office31(only, "fcclplus", 1, 23.0)  # BASE seed 1 missing: seed 1 is not paired
  item = claims.evidence(CLAIM_INTER, "quick", only)
  assert [s.seed for s in item.seeds] == [0]
  assert claims.mean_text(item) == "+3.00, 32% of the paper's"
  assert claims.verdict_text(item) == "the paper's direction on the one paired seed"
  assert claims.evidence(CLAIM_INTER, "mid", only) is None  # no mid cells


def test_rounds_to_a_target_with_censored_seeds(tmp_path):
  # Seed 0: FedMMD at 5, FedAvg at 8 (-3); seed 1: FedMMD at 6, FedAvg never in 10 rounds
  # (FedMMD ahead, no difference); seed 2: neither reaches 98% (no sign).
  for seed, (ours, theirs) in enumerate(((5, 8), (6, None), (None, None))):
    _shards(tmp_path, "fedmmd", seed, ours)
    _shards(tmp_path, "fedavg", seed, theirs)
  item = claims.evidence(CLAIM_FEDMMD, "mid", tmp_path)
  assert [(s.value, s.reference, s.difference, s.ahead) for s in item.seeds] == [
      (5, 8, -3, 1), (6, None, None, 1), (None, None, None, None)]
  assert claims.seeds_text(item) == ("-3 (5 vs 8), 6 vs never in 10 rounds, "
                                     "never vs never in 10 rounds")
  assert claims.mean_text(item) == "–"
  assert claims.verdict_text(item) == ("the paper's direction on 2 of 3 seeds (1 undecided: "
                                       "neither reaches the target)")
  # Every seed reached: seeds 0 and 1 at 5 vs 8 and 4 vs 9: -3 and -5, mean -4.0, sample std
  # 1.414; 1 - (5 + 4) / (8 + 9) = 47.1% fewer rounds.
  both = tmp_path / "both"
  for seed, (ours, theirs) in enumerate(((5, 8), (4, 9))):
    _shards(both, "fedmmd", seed, ours)
    _shards(both, "fedavg", seed, theirs)
  item = claims.evidence(CLAIM_FEDMMD, "mid", both)
  assert claims.mean_text(item) == "-4.0 ± 1.4 rounds, 47.1% fewer"
  assert claims.verdict_text(item).startswith("the paper's direction on every seed (2 of 2)")
  # The paper prints 72 vs 128 rounds and "a reduction of 23.4%": its printed reduction.
  assert claims.paper_text(CLAIM_FEDMMD) == "23.4% fewer rounds (72 vs 128)"
  none = tmp_path / "none"
  for seed in range(2):
    _shards(none, "fedmmd", seed, None)
    _shards(none, "fedavg", seed, None)
  item = claims.evidence(CLAIM_FEDMMD, "mid", none)
  assert claims.seeds_text(item) == "never vs never in 10 rounds, each seed"
  assert claims.verdict_text(item) == "neither row reaches the target on the 2 paired seeds"


def test_the_papers_difference_is_the_delta_it_prints():
  assert claims.paper_text(CLAIM_INTER) == "+9.49 (37.21 vs 27.72)"
  # FCCL+ Table VIII prints FCCL's Office-Caltech inter Δ as -3.07, its AVGs give -2.06.
  caltech = claims.Claim("FCCL above BASE", "FCCL+ Table VIII", "fcclplus_office_caltech",
                         "office_caltech", "fccl", "solo", "inter")
  assert claims.paper_values(caltech)[2] == pytest.approx(-3.07)
  glfc = next(c for c in claims.CLAIMS if c.table == "glfc_table1")
  assert claims.paper_text(glfc) == "+15.10 (66.90 vs 51.80)"


def test_claims_prints_a_users_directory_and_rewrites_the_shipped_blocks(tmp_path, capsys,
                                                                         monkeypatch):
  for seed in range(2):
    _office31(tmp_path / "results", "solo", seed, 20.0 + seed)
    _office31(tmp_path / "results", "fcclplus", seed, 24.0 + seed)
  assert helpers.reproduce.main(["--claims", f"--results-dir={tmp_path / 'results'}"]) == 0
  out = capsys.readouterr().out
  assert "| FCCL+ above BASE, Office31, inter-domain AVG (FCCL+ Tables VIII/IX) | +9.49 " \
         "(37.21 vs 27.72) | quick | 0, 1 | +4.00, +4.00 |" in out
  monkeypatch.setattr(cells_lib, "DEFAULT_RESULTS", tmp_path / "results")
  doc, readme = tmp_path / "docs" / "results.md", tmp_path / "README.md"
  doc.parent.mkdir()
  doc.write_text("# Results\n\n<!-- claims -->\nold\n<!-- /claims -->\n\nkept\n")
  readme.write_text("# r\n\n<!-- claims:summary -->\n<!-- /claims -->\n")
  assert helpers.reproduce.main(["--claims", f"--results-dir={tmp_path / 'results'}",
                                 f"--doc={doc}"]) == 0
  assert claims.stale(doc.read_text(), tmp_path / "results") == []
  assert claims.stale(readme.read_text(), tmp_path / "results") == []
  assert doc.read_text().endswith("<!-- /claims -->\n\nkept\n")
  assert "+4.00 ± 0.00, 42% of the paper's (quick, seeds 0, 1)" in readme.read_text()
  # A cell that lands makes both blocks stale.
  _office31(tmp_path / "results", "solo", 2, 30.0)
  _office31(tmp_path / "results", "fcclplus", 2, 29.0)
  assert claims.stale(doc.read_text(), tmp_path / "results") == ["claims"]
  assert claims.stale(readme.read_text(), tmp_path / "results") == ["claims:summary"]


def test_the_shipped_blocks_equal_what_results_holds():
  """README.md's and docs/results.md's claims blocks are `--claims`' rendering of results/
  (rerun python experiments/reproduce.py --claims --results-dir=results)."""
  for path, name in ((REPO / "README.md", "claims:summary"),
                     (REPO / "docs" / "results.md", "claims")):
    text = path.read_text()
    assert claims.block(text, name) is not None, f"{path} has no {name} block"
    assert claims.stale(text, REPO / "results") == [], (
        f"{path}: rerun python experiments/reproduce.py --claims --results-dir=results")

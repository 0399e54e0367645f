"""The domain-shift report (fedjax_het.reports.domain_shift) and the shared pieces of
fedjax_het.reports.common, on small hand-made inputs."""

import math

import numpy as np
import pytest

from fedjax_het.reports import common
from fedjax_het.reports import domain_shift as ds
from fedjax_het.reports import tables


def _cell(kind_values):
  """{"inter": {...}, "intra": {...}} from {kind: (a, b)}, AVG the mean as results.json has it."""
  return {kind: {"a": a, "b": b, "AVG": (a + b) / 2} for kind, (a, b) in kind_values.items()}


# Two rows, two domains (a, b), two seeds.
CELLS = {
    "solo": {0: _cell({"inter": (10.0, 20.0), "intra": (50.0, 60.0)}),
             1: _cell({"inter": (12.0, 24.0), "intra": (52.0, 62.0)})},
    "fcclplus": {0: _cell({"inter": (20.0, 30.0), "intra": (70.0, 80.0)}),
                 1: _cell({"inter": (24.0, 30.0), "intra": (74.0, 80.0)})},
}
ROWS = [("solo", "BASE (solo)"), ("fcclplus", "FCCL+")]


def test_mean_sample_std_and_delta_are_the_hand_computed_numbers():
  summary = ds.summarize(CELLS)
  assert summary["columns"] == ["a", "b", "AVG"]
  assert summary["rows_done"] == ["solo", "fcclplus"]
  solo, plus = summary["rows"]["solo"]["inter"], summary["rows"]["fcclplus"]["inter"]
  # solo inter a: seeds 10, 12 -> mean 11, sample std sqrt(((10-11)^2 + (12-11)^2) / 1) = sqrt 2.
  assert solo["a"]["mean"] == pytest.approx(11.0)
  assert solo["a"]["std"] == pytest.approx(math.sqrt(2.0))
  assert solo["a"]["per_seed"] == {0: 10.0, 1: 12.0} and solo["a"]["n"] == 2
  # solo inter AVG: 15, 18 -> 16.5 +- sqrt(2 * 1.5^2) = 2.1213 (ddof=0 would give 1.5).
  assert solo["AVG"]["mean"] == pytest.approx(16.5)
  assert solo["AVG"]["std"] == pytest.approx(2.1213203)
  assert plus["b"]["std"] == pytest.approx(0.0)  # 30, 30
  # Δ vs BASE: FCCL+ AVG (25 + 27) / 2 = 26 minus solo's 16.5; intra 76 - 56.
  assert summary["delta"]["fcclplus"]["inter"] == pytest.approx(9.5)
  assert summary["delta"]["fcclplus"]["intra"] == pytest.approx(20.0)
  assert summary["delta"]["solo"]["inter"] == pytest.approx(0.0)
  assert common.format_cell(11.0, math.sqrt(2.0)) == "11.00 ± 1.41"
  assert common.format_cell(26.0, 1.41421, 50.49) == "26.00 ± 1.41 (paper 50.49)"
  assert common.format_delta(9.5) == "+9.50"
  assert common.format_delta(-2.0, 0.7) == "-2.00 (paper +0.70)"
  assert common.mean_std([3.0]) == (3.0, None)
  assert common.mean_std([1.0, 2.0, 6.0]) == (3.0, pytest.approx(math.sqrt(7.0)))


def test_markdown_layout_rows_run_and_not_run_with_the_papers_numbers():
  summary = ds.summarize(CELLS, domains=("b", "a"))
  assert summary["columns"] == ["b", "a", "AVG"]  # the paper's order first
  summary = ds.summarize(CELLS)
  paper = {"solo": {"a": 15.0, "b": 25.0, "AVG": 20.0}, "fedmd": {"a": 1.0, "AVG": 30.0},
           "fcclplus": {"a": 40.0, "b": 50.0, "AVG": 45.0}}
  printed_delta = {"fedmd": 10.0, "fcclplus": 25.0}   # the paper's Δ column, as printed
  text = ds.markdown_table(summary, "inter", rows=[ROWS[0], ("fedmd", "FedMD"), ROWS[1]],
                           paper=paper, base="solo", domains=("a", "b"), show_diff=False,
                           row_sources={"fedmd": "elsewhere"}, paper_delta=printed_delta)
  assert text.splitlines() == [
      "| method | n | a | b | AVG | Δ vs BASE | paper's row |",
      "|---|---|---|---|---|---|---|",
      "| BASE (solo) | 2 | 11.00 ± 1.41 (paper 15.00) | 22.00 ± 2.83 (paper 25.00) | "
      "16.50 ± 2.12 (paper 20.00) | - |  |",
      "| FedMD | 0 | – (paper 1.00) | – | – (paper 30.00) | – (paper +10.00) | elsewhere |",
      "| FCCL+ | 2 | 22.00 ± 2.83 (paper 40.00) | 30.00 ± 0.00 (paper 50.00) | "
      "26.00 ± 1.41 (paper 45.00) | +9.50 (paper +25.00) |  |"]
  # In the paper's setting: AVG − paper; a subset of the paper's domains: no paper AVG.
  shown = ds.markdown_table(summary, "inter", rows=ROWS, paper=paper, base="solo",
                            domains=("a", "b"), show_diff=True, paper_delta=printed_delta)
  assert shown.splitlines()[0] == "| method | n | a | b | AVG | Δ vs BASE | AVG − paper |"
  assert shown.splitlines()[3].endswith("| +9.50 (paper +25.00) | -19.00 |")  # 26 - 45
  subset = ds.markdown_table(summary, "inter", rows=ROWS, paper=paper, base="solo",
                             domains=("a", "b", "c"), show_diff=True, paper_delta=printed_delta)
  assert "(paper 20.00)" not in subset and "(paper 15.00)" in subset
  assert "(paper +" not in subset
  # No printed Δ: ours alone, never one computed from the paper's AVGs.
  alone = ds.markdown_table(summary, "inter", rows=ROWS, paper=paper, base="solo",
                            domains=("a", "b"), show_diff=False)
  assert alone.splitlines()[3].endswith("| 26.00 ± 1.41 (paper 45.00) | +9.50 |")


def test_one_seed_shows_the_mean_and_no_base_no_delta():
  one = {m: {0: seeds[0]} for m, seeds in CELLS.items()}
  summary = ds.summarize(one)
  assert summary["rows"]["solo"]["inter"]["a"]["std"] is None
  text = ds.markdown_table(summary, "inter", rows=ROWS, paper={}, base="solo",
                           domains=("a", "b"), show_diff=False)
  assert "±" not in text
  assert "| BASE (solo) | 1 | 10.00 | 20.00 | 15.00 | - |" in text
  assert "| FCCL+ | 1 | 20.00 | 30.00 | 25.00 | +10.00 |" in text
  assert common.std_line(1).startswith("one seed: the mean alone")
  summary = ds.summarize({"fcclplus": CELLS["fcclplus"]}, base=None)
  assert summary["delta"] == {}
  text = ds.markdown_table(summary, "intra", rows=[ROWS[1]], paper={}, base=None,
                           domains=("a", "b"), show_diff=False)
  assert text.splitlines()[0] == "| method | n | a | b | AVG |"
  assert "| FCCL+ | 2 | 72.00 ± 2.83 | 80.00 ± 0.00 | 76.00 ± 1.41 |" in text


def test_render_setting_of_a_registered_table_shows_table_viii_and_ix():
  table = tables.get_table("fcclplus_digits")
  setting = table.settings[0]
  cells = {}
  for row, base in (("solo", 20.0), ("fcclplus", 40.0)):
    cells[row] = {}
    for seed in (0, 1):
      numbers = {}
      for kind, shift in (("inter", 0.0), ("intra", 40.0)):
        values = {d: base + shift + i + seed for i, d in enumerate(setting.paper["inter"]["solo"])
                  if d != "AVG"}
        numbers[kind] = {**values, "AVG": float(np.mean(list(values.values())))}
      cells[row][seed] = {"results": numbers}
  text, numbers = ds.render_setting(table, setting, cells, show_diff=True)
  assert "inter → (paper: FCCL+ Table VIII)" in text
  assert "intra ↩ (paper: FCCL+ Table IX)" in text
  plus = next(line for line in text.splitlines() if line.startswith("| FCCL+"))
  assert "(paper 40.13)" in plus and "(paper 50.49)" in plus and "(paper +24.81)" in plus
  # FCCL+ inter AVG: domains 40..43 (+ seed), mean over seeds 42.0; minus the paper's 50.49.
  assert "| -8.49 |" in plus
  base = next(line for line in text.splitlines() if line.startswith("| BASE"))
  assert base.endswith("| = FCCL (CVPR 2022) Tables 1/2: the conference protocol |")
  assert numbers["summary"]["delta"]["fcclplus"]["inter"] == pytest.approx(20.0)
  # Seed by seed: FCCL+ is 20 above BASE on both seeds, inter and intra; the rows without a
  # finished cell pair no seed.
  assert ("| FCCL+ | 0, 1 | +20.00, +20.00 | above BASE on every seed | +20.00, +20.00 | "
          "above BASE on every seed |") in text
  assert "| FedMD | – | – | 0 seeds | – | 0 seeds |" in text
  assert numbers["seed_by_seed"]["rows"]["fcclplus"]["intra"]["verdict"] == "above"
  assert "solo" not in numbers["seed_by_seed"]["rows"]


def test_provenance_line_names_real_and_synthetic_domains_once_over_seeds():
  sources = common.provenance([
      {"sources": {"mnist": "npz:/d/digits.npz", "syn": "synthetic(seed=0)",
                   "public": "synthetic(seed=0; substituted for 'cifar100')"}},
      {"sources": {"mnist": "npz:/d/digits.npz", "syn": "synthetic(seed=1)"}}])
  assert sources["syn"] == ["synthetic(seed=<cell seed>)"]
  assert common.provenance_line(sources) == (
      "mnist real (npz:digits.npz), syn SYNTHETIC (synthetic(seed=<cell seed>)), "
      "public SYNTHETIC (synthetic(seed=<cell seed>; substituted for 'cifar100'))")
  assert not common.all_real(sources)
  assert common.short_source("npz:/d/office31.npz[amazon]") == "npz:office31.npz[amazon]"
  assert common.short_source("folder:/d/OfficeHome/Real World") == "folder:Real World"
  assert common.short_source("tfds:svhn_cropped") == "tfds:svhn_cropped"
  assert common.short_source("npz:/d/cifar10.npz; pooled, split 0.75 / 0.25 into train / test"
                             ) == "npz:cifar10.npz; pooled, split 0.75 / 0.25 into train / test"
  assert common.all_real({"mnist": ["npz:/d"], "public": ["none"]})
  # Rows with a public set beside rows without one (the HtFL table): real where used.
  mixed = common.provenance([{"sources": {"public": "none"}},
                             {"sources": {"public": "npz:/d/public_cifar100_5000.npz"}}])
  assert common.provenance_line(mixed) == (
      "public real (npz:public_cifar100_5000.npz) where a row has one, none elsewhere")
  assert not common.all_real({"public": ["none"]})
  meta = {"train_sizes": {"a": 150, "b": 80}, "test_sizes": {"a": 30, "b": 30},
          "public_size": 5000}
  assert common.sizes_line([meta, meta]) == "train a 150, b 80; test a 30, b 30; public 5000"
  many = {"train_sizes": {f"client_{i}": 10 for i in range(100)}, "test_sizes": {"mnist": 100}}
  assert common.sizes_line([many]) == "train 1000 images over 100 clients; test mnist 100"
  assert common.sizes_line([]) == "unknown"


def test_one_runs_table_averages_the_last_evaluated_rounds():
  records = [{"round": r, "eval/inter/a": 10.0 * r, "eval/inter/b": 20.0 * r,
              "eval/intra/a": 1.0 * r, "eval/intra/b": 3.0 * r} for r in (1, 2, 3)]
  text, numbers = ds.run_table(records, ["a", "b"], last_rounds=2, method="fcclplus")
  # Rounds 2 and 3: inter a (20 + 30) / 2 = 25, b 50, AVG 37.5; intra a 2.5, b 7.5, AVG 5.
  assert numbers["rounds"] == [2, 3]
  assert numbers["inter"] == {"a": 25.0, "b": 50.0, "AVG": 37.5}
  assert numbers["intra"] == {"a": 2.5, "b": 7.5, "AVG": 5.0}
  assert text.splitlines() == ["| fcclplus | a | b | AVG |", "|---|---|---|---|",
                               "| inter → | 25.00 | 50.00 | 37.50 |",
                               "| intra ↩ | 2.50 | 7.50 | 5.00 |"]


def test_mean_curves_average_seeds_at_common_rounds():
  seed0 = [{"round": 1, "eval/inter/mean": 10.0}, {"round": 2},
           {"round": 3, "eval/inter/mean": 30.0}]
  seed1 = [{"round": 1, "eval/inter/mean": 20.0}, {"round": 3, "eval/inter/mean": 50.0}]
  assert common.mean_curves([seed0, seed1], "inter") == ([1, 3], [15.0, 40.0], [10.0, 30.0],
                                                         [20.0, 50.0])


def test_figure_has_both_panels_a_line_per_row_and_chance():
  from fedjax_het import plots
  plt = plots._pyplot()  # pylint: disable=protected-access
  curves = {m: {k: ([1, 2], [10.0, 20.0], [9.0, 18.0], [11.0, 22.0]) for k in ds.KINDS}
            for m in ("solo", "fcclplus")}
  fig = common.curves_figure(plt, curves, title="digits", num_classes=10,
                             labels={"solo": "BASE (solo)", "fcclplus": "FCCL+"})
  axes = fig.axes
  assert len(axes) == 2 and "inter" in axes[0].get_title() and "intra" in axes[1].get_title()
  assert axes[0].get_xlabel() == "communication round" and "accuracy" in axes[0].get_ylabel()
  legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
  assert legend == ["BASE (solo)", "FCCL+", "chance (1/C = 10%)"]
  plt.close(fig)


@pytest.mark.parametrize("differences, verdict", [
    ([1.5, 0.2, 3.0], "above"),
    ([-1.5, -0.2, -3.0], "below"),
    ([1.5, -0.2, 3.0], "changes"),
    # A tie (exactly 0.0) has no sign: no sign change, and no "on every seed" either.
    ([1.5, 0.0, 3.0], "above_or_equal"),
    ([-1.5, 0.0], "below_or_equal"),
    ([1.5, 0.0, -3.0], "changes"),
    ([0.0, 0.0], "equal"),
    ([-1e-7, 2.0], "changes"),  # any non-zero difference counts, however small
    ([4.0], "too_few"),
    ([], "too_few"),
])
def test_seed_verdict_by_hand(differences, verdict):
  assert common.seed_verdict(differences) == verdict
  assert common.seed_verdict(dict(enumerate(differences))) == verdict


def test_verdict_words_and_differences_in_seed_order():
  assert common.verdict_text("above", "BASE", 3) == "above BASE on every seed"
  assert common.verdict_text("below", "FedAvg", 3) == "below FedAvg on every seed"
  assert common.verdict_text("changes", "BASE", 3) == "changes sign"
  assert common.verdict_text("above_or_equal", "BASE", 3) == \
      "above or equal to BASE on every seed"
  assert common.verdict_text("too_few", "BASE", 1) == "1 seed"
  assert common.verdict_text("too_few", "BASE", 0) == "0 seeds"
  # Only the seeds both rows finished pair up, in seed order.
  assert common.paired_differences({2: 5.0, 0: 1.0, 1: 4.0}, {0: 2.0, 2: 1.0}) == \
      {0: -1.0, 2: 4.0}
  assert common.format_differences({0: -1.0, 1: 0.0, 2: 4.256}) == "-1.00, 0.00, +4.26"
  assert common.format_differences({}) == "–"


def test_seed_by_seed_pairs_each_row_with_base_on_the_seeds_both_finished():
  cells = {
      "solo": {0: _cell({"inter": (10.0, 20.0), "intra": (50.0, 60.0)}),
               1: _cell({"inter": (12.0, 24.0), "intra": (52.0, 62.0)}),
               2: _cell({"inter": (11.0, 21.0), "intra": (51.0, 61.0)})},
      # inter AVG 15, 18, 16 vs solo's 15, 18, 16 -> ties; intra +5 then -1.
      "fedmd": {0: _cell({"inter": (10.0, 20.0), "intra": (55.0, 65.0)}),
                1: _cell({"inter": (12.0, 24.0), "intra": (51.0, 61.0)})},
      "fcclplus": {2: _cell({"inter": (13.0, 23.0), "intra": (53.0, 63.0)})},
  }
  summary = ds.summarize(cells)
  comparison = ds.seed_by_seed(summary, ["solo", "fedmd", "fcclplus"], "solo")
  assert list(comparison["rows"]) == ["fedmd", "fcclplus"]
  fedmd = comparison["rows"]["fedmd"]
  assert fedmd["inter"] == {"seeds": [0, 1], "per_seed": {0: 0.0, 1: 0.0}, "verdict": "equal"}
  assert fedmd["intra"]["per_seed"] == {0: pytest.approx(5.0), 1: pytest.approx(-1.0)}
  assert fedmd["intra"]["verdict"] == "changes"
  assert comparison["rows"]["fcclplus"]["inter"] == {
      "seeds": [2], "per_seed": {2: pytest.approx(2.0)}, "verdict": "too_few"}
  assert ds.seed_by_seed(summary, ["solo", "fedmd"], None) is None
  assert ds.seed_by_seed(ds.summarize({"fedmd": cells["fedmd"]}), ["solo", "fedmd"],
                         "solo") is None
  lines = common.seed_table(comparison, {"fedmd": "FedMD", "fcclplus": "FCCL+"},
                            kind_labels=ds.KIND_LABELS, reference_label="BASE").splitlines()
  assert lines == [
      "| method | seeds | inter → Δ per seed | verdict | intra ↩ Δ per seed | verdict |",
      "|---|---|---|---|---|---|",
      "| FedMD | 0, 1 | 0.00, 0.00 | equal to BASE on every seed | +5.00, -1.00 | changes sign |",
      "| FCCL+ | 2 | +2.00 | 1 seed | +2.00 | 1 seed |"]

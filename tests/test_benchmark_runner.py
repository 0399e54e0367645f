"""The benchmark runner (experiments/benchmark.py) and its table (fedjax_het.benchmark_table)."""

import importlib.util
import json
import math
import pathlib

import numpy as np
import pytest

from fedjax_het import benchmark_table as table
from fedjax_het.errors import ConfigError, WorkdirError

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


runner = _load(REPO / "experiments" / "benchmark.py", "benchmark_cli")


def _cell(kind_values):
  """{"inter": {...}, "intra": {...}} from {kind: (a, b)}, AVG the mean as results.json has it."""
  return {kind: {"a": a, "b": b, "AVG": (a + b) / 2} for kind, (a, b) in kind_values.items()}


# Two methods, two domains (a, b), two seeds.
CELLS = {
    "solo": {0: _cell({"inter": (10.0, 20.0), "intra": (50.0, 60.0)}),
             1: _cell({"inter": (12.0, 24.0), "intra": (52.0, 62.0)})},
    "fcclplus": {0: _cell({"inter": (20.0, 30.0), "intra": (70.0, 80.0)}),
                 1: _cell({"inter": (24.0, 30.0), "intra": (74.0, 80.0)})},
}
REAL = {"a": ["npz:/data/a.npz"], "b": ["npz:/data/b.npz"], "public": ["npz:/data/p.npz"]}


def test_mean_sample_std_and_delta_are_the_hand_computed_numbers():
  summary = table.summarize(CELLS)
  assert summary["columns"] == ["a", "b", "AVG"]
  assert summary["methods"] == ["solo", "fcclplus"]
  solo, plus = summary["rows"]["solo"]["inter"], summary["rows"]["fcclplus"]["inter"]
  # solo inter a: seeds 10, 12 -> mean 11, sample std sqrt(((10-11)^2 + (12-11)^2) / 1) = sqrt 2.
  assert solo["a"]["mean"] == pytest.approx(11.0)
  assert solo["a"]["std"] == pytest.approx(math.sqrt(2.0))
  assert solo["a"]["per_seed"] == {0: 10.0, 1: 12.0} and solo["a"]["n"] == 2
  # solo inter AVG: 15, 18 -> 16.5 +- sqrt(2 * 1.5^2) = 2.1213.
  assert solo["AVG"]["mean"] == pytest.approx(16.5)
  assert solo["AVG"]["std"] == pytest.approx(2.1213203)
  assert plus["b"]["std"] == pytest.approx(0.0)  # 30, 30
  # Δ vs BASE: FCCL+ AVG (25 + 27) / 2 = 26 minus solo's 16.5; intra 76 - 56.
  assert summary["delta"]["fcclplus"]["inter"] == pytest.approx(9.5)
  assert summary["delta"]["fcclplus"]["intra"] == pytest.approx(20.0)
  assert summary["delta"]["solo"]["inter"] == pytest.approx(0.0)
  assert table.format_cell(11.0, math.sqrt(2.0)) == "11.00 ± 1.41"
  assert table.format_cell(26.0, 1.41421, 50.49) == "26.00 ± 1.41 (paper 50.49)"
  assert table.format_delta(9.5) == "+9.50"
  assert table.format_delta(-2.0, 0.7) == "-2.00 (paper +0.70)"


def test_one_seed_shows_the_mean_without_plus_minus():
  one = {m: {0: seeds[0]} for m, seeds in CELLS.items()}
  summary = table.summarize(one)
  assert summary["rows"]["solo"]["inter"]["a"]["std"] is None
  text = table.markdown_table(summary, "inter", scenario="toy", show_paper=False)
  assert "±" not in text
  assert "| BASE (solo) | 10.00 | 20.00 | 15.00 | - |" in text
  assert "| FCCL+ | 20.00 | 30.00 | 25.00 | +10.00 |" in text
  assert "one seed: the mean alone" in table.render_markdown(
      summary, scenario="toy", quick=True, seeds=[0], provenance_text="x", setting_text="y",
      show_paper=False)


def test_without_solo_there_is_no_delta_column():
  summary = table.summarize({"fcclplus": CELLS["fcclplus"]})
  assert summary["delta"] == {}
  text = table.markdown_table(summary, "intra", scenario="toy", show_paper=False)
  assert "Δ" not in text
  assert text.splitlines()[0] == "| method | a | b | AVG |"
  assert "| FCCL+ | 72.00 ± 2.83 | 80.00 ± 0.00 | 76.00 ± 1.41 |" in text


def test_markdown_layout_of_two_methods_two_domains_two_seeds():
  summary = table.summarize(CELLS)
  show, setting = table.paper_setting(scenario="toy", quick=True, sources=REAL)
  assert not show
  text = table.render_markdown(
      summary, scenario="toy", quick=True, seeds=[0, 1],
      provenance_text=table.provenance_line({"a": ["npz:/a"], "b": ["synthetic(seed=0)"]}),
      setting_text=setting, show_paper=show, last_rounds=3)
  assert text == """\
# Benchmark: toy (quick configs), seeds 0, 1

- configs: experiments/configs/toy.py:<method>_quick
- seeds: 0, 1 (one run per seed, run one after another)
- cell: accuracy (%) of each run is the mean of its last 3 evaluated rounds; \
mean ± sample standard deviation (ddof=1) over 2 seeds
- Δ vs BASE: the method's AVG minus BASE (solo)'s AVG, both means over seeds
- data: a real (npz:/a), b SYNTHETIC (synthetic(seed=0))
- paper setting: no (the paper has no 'toy' scenario; quick configs): paper numbers not shown

## inter →

| method | a | b | AVG | Δ vs BASE |
|---|---|---|---|---|
| BASE (solo) | 11.00 ± 1.41 | 22.00 ± 2.83 | 16.50 ± 2.12 | - |
| FCCL+ | 22.00 ± 2.83 | 30.00 ± 0.00 | 26.00 ± 1.41 | +9.50 |

## intra ↩

| method | a | b | AVG | Δ vs BASE |
|---|---|---|---|---|
| BASE (solo) | 51.00 ± 1.41 | 61.00 ± 1.41 | 56.00 ± 1.41 | - |
| FCCL+ | 72.00 ± 2.83 | 80.00 ± 0.00 | 76.00 ± 1.41 | +20.00 |
"""


def _digits_cells(seeds=(0, 1), domains=("mnist", "usps", "svhn", "syn")):
  cells = {}
  for method, base in (("solo", 20.0), ("fcclplus", 40.0)):
    cells[method] = {}
    for seed in seeds:
      numbers = {}
      for kind, shift in (("inter", 0.0), ("intra", 40.0)):
        values = {d: base + shift + i + seed for i, d in enumerate(domains)}
        numbers[kind] = {**values, "AVG": float(np.mean(list(values.values())))}
      cells[method][seed] = numbers
  return cells


def test_paper_numbers_appear_only_in_the_paper_setting():
  summary = table.summarize(_digits_cells())
  real = {d: ["npz:/data/digits.npz"] for d in ("mnist", "usps", "svhn", "syn", "public")}
  show, _ = table.paper_setting(scenario="digits", quick=False, sources=real)
  assert show
  text = table.markdown_table(summary, "inter", scenario="digits", show_paper=show)
  plus = next(line for line in text.splitlines() if line.startswith("| FCCL+"))
  assert "(paper 40.13)" in plus and "(paper 50.49)" in plus  # M-> and AVG of Table VIII
  assert "(paper +24.81)" in plus  # Δ of Table VIII: 50.49 - 25.68
  intra = table.markdown_table(summary, "intra", scenario="digits", show_paper=show)
  assert "(paper 90.57)" in intra and "(paper 73.14)" in intra  # Table IX AVGs
  # Not the paper's setting: quick configs, a synthetic or substituted domain, an override.
  substituted = {**real, "svhn": ["synthetic(seed=0; substituted for 'tfds')"]}
  for kwargs in (dict(quick=True, sources=real), dict(quick=False, sources=substituted),
                 dict(quick=False, sources={**real, "syn": ["synthetic(seed=0)"]}),
                 dict(quick=False, sources=real, overrides=["num_rounds=1"])):
    show, why = table.paper_setting(scenario="digits", **kwargs)
    assert not show and why.startswith("no (")
    assert "paper" not in table.markdown_table(summary, "inter", scenario="digits",
                                               show_paper=show)
  assert "synthetic data for svhn" in table.paper_setting(
      scenario="digits", quick=False, sources=substituted)[1]
  # A subset of the paper's participants is not the paper's setting; the table alone shows
  # per-domain paper numbers but no paper AVG (it averages all four).
  assert table.paper_setting(scenario="digits", quick=False, sources=real,
                             domains=["svhn", "mnist", "usps", "syn"])[0]
  show, why = table.paper_setting(scenario="digits", quick=False, sources=real,
                                  domains=["mnist", "usps"])
  assert not show
  assert "participants mnist, usps instead of the paper's mnist, usps, svhn, syn" in why
  partial = table.summarize(_digits_cells(domains=("mnist", "usps")))
  text = table.markdown_table(partial, "inter", scenario="digits", show_paper=True)
  assert "(paper 40.13)" in text and "(paper 50.49)" not in text and "(paper +" not in text


def test_transcribed_paper_numbers_agree_with_their_averages_and_deltas():
  """Each printed AVG is its row's mean (except the paper's own listed slips); the Δ the
  paper prints (Tables VIII/IX) equals AVG - BASE AVG except the two noted."""
  printed_avg_slips = {("intra", "digits", "feddf"), ("intra", "digits", "fedmatch"),
                       ("intra", "digits", "fccl"), ("inter", "office31", "feddf")}
  printed_delta = {  # the paper's Δ column, fedmd, feddf, fedmatch, rhfl, fccl, fcclplus
      ("inter", "digits"): (0.70, 4.75, 0.90, 8.38, 7.83, 24.81),
      ("inter", "office_caltech"): (0.03, -4.29, -5.12, -5.36, -3.07, 3.33),
      ("inter", "office31"): (5.35, 1.24, 3.73, -1.91, 5.80, 9.49),
      ("inter", "office_home"): (3.13, 1.51, 4.03, 0.80, 7.49, 7.62),
      ("intra", "digits"): (7.56, 10.24, 9.55, 15.21, 12.55, 17.43),
      ("intra", "office_caltech"): (-4.82, -8.10, -3.29, -2.82, -1.22, -0.63),
      ("intra", "office31"): (-1.12, -1.35, -1.03, -2.46, 0.31, 0.55),
      ("intra", "office_home"): (1.25, 0.87, 9.26, 3.91, 9.30, 9.17),
  }
  delta_slips = {("inter", "office_caltech", "fccl"), ("inter", "office_home", "fccl")}
  for kind in table.KINDS:
    for scenario, domains in table.PAPER_DOMAINS.items():
      rows = table.PAPER_ACCURACY[kind][scenario]
      assert tuple(rows) == table.TABLE_METHODS
      for method, row in rows.items():
        assert len(row) == len(domains) + 1
        gap = abs(np.mean(row[:-1]) - row[-1])
        assert (gap > 0.011) == ((kind, scenario, method) in printed_avg_slips), (
            kind, scenario, method, gap)
      for method, delta in zip(table.TABLE_METHODS[1:], printed_delta[(kind, scenario)]):
        ours = rows[method][-1] - rows["solo"][-1]
        assert (abs(ours - delta) > 0.006) == ((kind, scenario, method) in delta_slips)
  assert table.paper_numbers("digits", "fcclplus", "inter") == {
      "mnist": 40.13, "usps": 50.53, "svhn": 48.31, "syn": 63.00, "AVG": 50.49}
  assert table.paper_numbers("digits", "fedavg", "inter") == {}


def test_provenance_line_names_real_and_synthetic_domains():
  sources = table.provenance([
      {"sources": {"mnist": "npz:/d/digits.npz", "syn": "synthetic(seed=0)",
                   "public": "synthetic(seed=0; substituted for 'cifar100')"}},
      {"sources": {"mnist": "npz:/d/digits.npz", "syn": "synthetic(seed=1)"}}])
  assert sources["syn"] == ["synthetic(seed=0)", "synthetic(seed=1)"]
  assert table.provenance_line(sources) == (
      "mnist real (npz:/d/digits.npz), syn SYNTHETIC (synthetic(seed=0); synthetic(seed=1)), "
      "public SYNTHETIC (synthetic(seed=0; substituted for 'cifar100'))")
  assert not table.all_real(sources)


def test_mean_curves_average_seeds_at_common_rounds():
  seed0 = [{"round": 1, "eval/inter/mean": 10.0}, {"round": 2}, {"round": 3,
                                                                 "eval/inter/mean": 30.0}]
  seed1 = [{"round": 1, "eval/inter/mean": 20.0}, {"round": 3, "eval/inter/mean": 50.0}]
  assert table.mean_curves([seed0, seed1], "inter") == ([1, 3], [15.0, 40.0], [10.0, 30.0],
                                                        [20.0, 50.0])


def test_figure_has_both_panels_a_line_per_method_and_chance():
  from fedjax_het import plots
  plt = plots._pyplot()  # pylint: disable=protected-access
  curves = {m: {k: ([1, 2], [10.0, 20.0], [9.0, 18.0], [11.0, 22.0]) for k in table.KINDS}
            for m in ("solo", "fcclplus")}
  fig = table.benchmark_figure(plt, curves, title="digits", num_classes=10,
                               labels={"solo": "BASE (solo)", "fcclplus": "FCCL+"})
  axes = fig.axes
  assert len(axes) == 2 and "inter" in axes[0].get_title() and "intra" in axes[1].get_title()
  assert axes[0].get_xlabel() == "communication round" and "accuracy" in axes[0].get_ylabel()
  legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
  assert legend == ["BASE (solo)", "FCCL+", "chance (1/C = 10%)"]
  assert fig._suptitle.get_text() == "digits"  # pylint: disable=protected-access
  plt.close(fig)


def test_cli_rejects_an_unknown_method_naming_the_allowed_ones(capsys, tmp_path):
  code = runner.main(["--scenario=digits", "--methods=solo,fedavgg", f"--workdir={tmp_path}"])
  assert code == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert err == ("error: --methods: unknown method(s) 'fedavgg'; allowed methods for digits: "
                 "solo, fedmd, feddf, fedmatch, rhfl, fccl, fcclplus.")
  assert runner.main(["--scenario=office", "--methods=solo"]) == 1
  assert "allowed scenarios: digits" in capsys.readouterr().err
  assert runner.main(["--scenario=digits", "--seeds=0,x"]) == 1
  assert "--seeds must be comma-separated integers" in capsys.readouterr().err
  assert not any(tmp_path.iterdir())  # nothing written


def test_set_overrides_are_parsed_against_the_field_types():
  module, prefix = runner.load_config_module("digits")
  assert prefix == ""
  config = runner.cell_config(module, "fcclplus", 3, quick=True, overrides=[
      "num_rounds=1", "models.width=1", "logging.diagnostic_rounds=(1,)",
      "scenario.sources.syn=folder:/x", "logging.plots=false"])
  assert config.seed == 3 and config.num_rounds == 1 and config.models.width == 1.0
  assert tuple(config.logging.diagnostic_rounds) == (1,)
  assert config.scenario.sources.syn == "folder:/x" and config.logging.plots is False
  assert config.name == "digits_fcclplus_quick_seed3"
  with pytest.raises(ConfigError, match="config has no field 'num_round'; did you mean "
                     "'num_rounds'"):
    runner.apply_overrides(config, ["num_round=2"])
  with pytest.raises(ConfigError, match="local has no field 'epoch'; did you mean 'local.epochs'"):
    runner.apply_overrides(config, ["local.epoch=2"])
  with pytest.raises(ConfigError, match="cannot set config.logging.plots"):
    runner.apply_overrides(config, ["logging.plots=maybe"])
  with pytest.raises(ConfigError, match="expects <dotted config field>=<value>"):
    runner.apply_overrides(config, ["num_rounds"])
  # Output-only overrides keep the paper setting; those changing results do not.
  assert runner._significant(["logging.plots=false", "num_rounds=1"], config) == ["num_rounds=1"]


def test_the_fccl_row_is_the_benchmarks_fccl_with_every_current_model_in_the_target():
  module, _ = runner.load_config_module("digits")
  assert module.get_config("fccl_quick").fccl.own_slot == "previous"  # the conference code
  assert runner.cell_config(module, "fccl", 0, quick=True).fccl.own_slot == "current"
  overridden = runner.cell_config(module, "fccl", 0, quick=True,
                                  overrides=["fccl.own_slot=previous"])
  assert overridden.fccl.own_slot == "previous"  # --set still wins


def test_a_config_file_with_several_scenarios_gives_prefixed_variants(tmp_path, monkeypatch):
  """office.py-style files: SCENARIOS {variant prefix: scenario} -> <prefix>_<method>[_quick]."""
  (tmp_path / "multi.py").write_text(
      "import ml_collections\n"
      "SCENARIOS = {'o31': 'office31', 'x': 'not_in_the_paper'}\n"
      "METHODS = ('solo', 'fcclplus', 'fedavg')\n"
      "def get_config(arg):\n"
      "  return ml_collections.ConfigDict({'name': 'multi_' + arg, 'seed': 0})\n")
  (tmp_path / "broken.py").write_text("raise ImportError('half edited')\n")
  monkeypatch.setattr(runner, "CONFIGS", tmp_path)
  assert runner.allowed_scenarios() == ["office31"]
  module, prefix = runner.load_config_module("office31")
  assert prefix == "o31_" and runner.allowed_methods(module) == ["solo", "fcclplus"]
  config = runner.cell_config(module, "fcclplus", 2, quick=True, prefix=prefix)
  assert config.name == "multi_o31_fcclplus_quick_seed2" and config.seed == 2
  with pytest.raises(ConfigError, match="allowed scenarios: office31 "):
    runner.load_config_module("digits")


def _tiny(config, method):
  """The quick Digits config shrunk as tests/test_train.py's tiny_config does."""
  config.models.architectures = ("simple_cnn", "fedavg_cifar_cnn", "simple_cnn",
                                 "fedavg_cifar_cnn")
  config.num_rounds = 2
  config.local.epochs = 1
  config.local.batch_size = 16
  if "collaborative" in config:
    config.collaborative.batch_size = 32
  config.scenario.public_size = 64
  config.scenario.private_sizes.update({"mnist": 30, "usps": 20, "svhn": 40, "syn": 24})
  config.scenario.test_size = 30
  config.eval.batch_size = 30
  config.logging.progress = False
  config.logging.diagnostic_rounds = ()
  config.compilation_cache_dir = ""
  del method


@pytest.mark.slow
def test_end_to_end_grid_writes_the_outputs_and_skips_finished_cells(tmp_path, monkeypatch,
                                                                       tmp_path_factory):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  lines = []
  out = runner.run_benchmark("digits", ["solo", "fcclplus"], [0], quick=True, workdir=tmp_path,
                             configure=_tiny, echo=lines.append)
  assert out["trained"] == [("solo", 0), ("fcclplus", 0)] and out["skipped"] == []
  for name in ("benchmark.md", "benchmark.json", "benchmark_accuracy.png"):
    assert (tmp_path / name).exists(), name
  assert (tmp_path / "fcclplus" / "seed0" / "results.json").exists()
  markdown = (tmp_path / "benchmark.md").read_text()
  assert "## inter →" in markdown and "## intra ↩" in markdown and "| FCCL+ |" in markdown
  assert "SYNTHETIC" in markdown and "paper numbers not shown" in markdown
  assert "(paper" not in markdown and "±" not in markdown
  numbers = json.loads((tmp_path / "benchmark.json").read_text())
  assert numbers["complete"] and numbers["wall_seconds"] > 0
  assert numbers["cells"]["solo"]["0"]["status"] == "trained"
  assert numbers["cells"]["solo"]["0"]["seconds"] > 0
  avg = numbers["summary"]["rows"]["fcclplus"]["inter"]["AVG"]
  results = json.loads((tmp_path / "fcclplus" / "seed0" / "results.json").read_text())
  assert avg["per_seed"] == {"0": results["inter"]["AVG"]}
  assert numbers["summary"]["delta"]["fcclplus"]["intra"] == pytest.approx(
      results["intra"]["AVG"] - json.loads(
          (tmp_path / "solo" / "seed0" / "results.json").read_text())["intra"]["AVG"])
  assert any("[2/2] fcclplus seed 0: trained" in line for line in lines)
  assert lines[-1].startswith(f"benchmark: {tmp_path / 'benchmark.md'}")

  # Second invocation: both cells finished, nothing retrained, same table.
  lines.clear()
  again = runner.run_benchmark("digits", ["solo", "fcclplus"], [0], quick=True,
                               workdir=tmp_path, configure=_tiny, echo=lines.append)
  assert again["trained"] == [] and again["skipped"] == [("solo", 0), ("fcclplus", 0)]
  assert any("[1/2] solo seed 0: skipped" in line for line in lines)
  assert again["summary"] == out["summary"]
  assert (tmp_path / "benchmark.md").read_text() == markdown
  rerun = json.loads((tmp_path / "benchmark.json").read_text())
  assert rerun["cells"]["solo"]["0"]["status"] == "skipped"
  assert rerun["cells"]["solo"]["0"]["seconds"] == numbers["cells"]["solo"]["0"]["seconds"]

  # A finished cell with a different config is not silently reused.
  def changed(config, method):
    _tiny(config, method)
    config.local.epochs = 2

  with pytest.raises(WorkdirError, match="config.local.epochs: 1 -> 2"):
    runner.run_benchmark("digits", ["solo"], [0], quick=True, workdir=tmp_path,
                         configure=changed, echo=lines.append)

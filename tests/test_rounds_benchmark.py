"""The rounds-to-target runner (experiments/rounds_benchmark.py) and its tables
(fedjax_het.rounds_table)."""

import importlib.util
import json
import math
import pathlib

import ml_collections
import pytest

from fedjax_het import benchmark_table as table
from fedjax_het import rounds_table as rt
from fedjax_het.errors import ConfigError, WorkdirError

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


runner = _load(REPO / "experiments" / "rounds_benchmark.py", "rounds_benchmark_cli")

UP, DOWN = 100.0, 50.0  # bytes per round of the hand-made runs


def _run(reach_round, num_rounds=20, *, final=None, kind="accuracy", up=UP, down=DOWN):
  """A hand-made cell: accuracy 50% until `reach_round` (None: never), then 94.5%."""
  records = []
  for r in range(1, num_rounds + 1):
    acc = 94.5 if reach_round is not None and r >= reach_round else 50.0
    records.append({"round": r, f"eval/{kind}/mean": acc, "train/server/bytes_up": up,
                    "train/server/bytes_down": down})
  last = [rec[f"eval/{kind}/mean"] for rec in records[-3:]]
  avg = final if final is not None else sum(last) / len(last)
  return {"results": {kind: {"c0": avg, "AVG": avg}}, "records": records}


def test_rounds_to_target_and_reduction_are_the_hand_computed_numbers():
  cells = {"fedavg": {0: _run(10)}, "fedfusion_conv": {0: _run(4)}}
  summary = rt.summarize(cells, targets=(94.0,))
  assert summary["kind"] == "accuracy" and summary["targets"] == ["94"]
  assert summary["reference"] == "fedavg"
  assert summary["rounds"]["fedavg"]["94"]["mean"] == 10.0
  assert summary["rounds"]["fedfusion_conv"]["94"]["mean"] == 4.0
  cut = summary["rounds_reduction"]["fedfusion_conv"]["94"]
  assert cut == {"percent": pytest.approx(60.0), "bound": "exact"}
  assert summary["rounds_reduction"]["fedavg"]["94"]["percent"] == pytest.approx(0.0)
  # Bytes: 150 per round, 1500 vs 600 up to the target, 3000 over the whole run.
  assert summary["bytes_per_round"]["fedavg"] == {"up": UP, "down": DOWN, "total": 150.0,
                                                  "constant": True}
  assert summary["bytes"]["fedavg"]["94"]["mean"] == 1500.0
  assert summary["bytes"]["fedfusion_conv"]["94"]["mean"] == 600.0
  assert summary["bytes"]["fedfusion_conv"]["all"]["mean"] == 3000.0
  assert summary["bytes_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(60.0)
  assert rt.format_reduction(cut) == "60.0%"
  assert rt.format_reduction(cut, 66.0) == "60.0% (paper 66.0%)"


def test_bytes_to_target_follow_the_per_round_bytes_of_each_method():
  cells = {"fedavg": {0: _run(10)}, "fedfusion_conv": {0: _run(5, up=200.0, down=200.0)}}
  summary = rt.summarize(cells, targets=(94.0,))
  # Half the rounds, but 400 instead of 150 bytes per round: 2000 vs 1500 bytes.
  assert summary["rounds_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(50.0)
  assert summary["bytes"]["fedfusion_conv"]["94"]["mean"] == 2000.0
  assert summary["bytes_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(
      100.0 * (1 - 2000.0 / 1500.0))


def test_mean_and_sample_std_over_seeds():
  cells = {"fedavg": {0: _run(10, final=95.0), 1: _run(12, final=97.0)},
           "fedfusion_conv": {0: _run(4, final=96.0), 1: _run(6, final=96.0)}}
  summary = rt.summarize(cells, targets=(94.0,))
  final = summary["final"]["fedavg"]
  assert final["mean"] == pytest.approx(96.0)
  assert final["std"] == pytest.approx(math.sqrt(2.0))  # ddof=1 (ddof=0 would give 1.0)
  assert final["per_seed"] == {0: 95.0, 1: 97.0}
  rounds = summary["rounds"]["fedavg"]["94"]
  assert rounds["mean"] == pytest.approx(11.0) and rounds["std"] == pytest.approx(math.sqrt(2))
  assert rounds["per_seed"] == {0: 10.0, 1: 12.0} and rounds["bound"] == "exact"
  # Reduction from the means over seeds: 1 - 5 / 11.
  assert summary["rounds_reduction"]["fedfusion_conv"]["94"]["percent"] == pytest.approx(
      100.0 * (1 - 5.0 / 11.0))
  assert rt.format_censored(rounds) == "11.0 ± 1.4"
  assert rt.format_censored(summary["rounds"]["fedfusion_conv"]["94"], 34) == \
      "5.0 ± 1.4 (paper 34.0)"


def test_a_seed_that_never_reaches_the_target_is_censored():
  cells = {"fedavg": {0: _run(10), 1: _run(None)},             # 10, > 20
           "fedmmd": {0: _run(4), 1: _run(6)},                 # 4, 6
           "fedfusion_conv": {0: _run(None), 1: _run(8)},      # > 20, 8
           "fedfusion_multi": {0: _run(None), 1: _run(None)}}  # never
  summary = rt.summarize(cells, targets=(94.0,))
  fedavg = summary["rounds"]["fedavg"]["94"]
  assert fedavg == {"mean": 15.0, "std": None, "n": 2, "reached": 1, "bound": "lower",
                    "per_seed": {0: 10.0, 1: None}}
  assert rt.format_censored(fedavg) == "> 15.0 (1/2 reached)"
  assert rt.format_censored(summary["rounds"]["fedfusion_multi"]["94"]) == "> 20.0 (0/2 reached)"
  cuts = summary["rounds_reduction"]
  # FedAvg censored: FedMMD's true reduction is larger than 1 - 5/15.
  assert cuts["fedmmd"]["94"] == {"percent": pytest.approx(100 * (1 - 5 / 15)),
                                  "bound": "at_least"}
  assert rt.format_reduction(cuts["fedmmd"]["94"]) == "> 66.7%"
  # Both censored: undetermined.
  assert cuts["fedfusion_conv"]["94"] == {"percent": None, "bound": "undetermined"}
  assert rt.format_reduction(cuts["fedfusion_conv"]["94"]) == "n/a (neither reached)"
  # Bytes of a censored seed: its whole run; same bound.
  assert summary["bytes"]["fedavg"]["94"]["mean"] == pytest.approx((1500.0 + 3000.0) / 2)
  assert summary["bytes"]["fedavg"]["94"]["bound"] == "lower"
  # A censored method against an exact reference: an upper bound.
  against = rt.summarize({"fedavg": {0: _run(10)}, "fedmmd": {0: _run(None)}}, targets=(94.0,))
  assert against["rounds_reduction"]["fedmmd"]["94"] == {"percent": pytest.approx(-100.0),
                                                         "bound": "at_most"}
  assert rt.format_reduction(against["rounds_reduction"]["fedmmd"]["94"]) == "< -100.0%"


def test_first_round_reaching_agrees_with_the_trainers_rule():
  from fedjax_het import train  # pylint: disable=g-import-not-at-top
  records = _run(7, kind="intra")["records"]
  records[2].pop("eval/intra/mean")  # an unevaluated round
  for target in (50.0, 94.0, 94.5, 99.0):
    assert rt.first_round_reaching(records, "intra", target) == train.rounds_to_target(
        records, ("inter", "intra"), target)
  assert rt.headline_kind({"inter": {}, "intra": {}}) == train.headline_kind(("inter", "intra"))
  assert rt.headline_kind({"accuracy": {}}) == train.headline_kind(("accuracy",))


def test_without_fedavg_there_are_no_reductions():
  summary = rt.summarize({"fedmmd": {0: _run(4)}}, targets=(94.0, 95.0))
  assert summary["reference"] is None and summary["rounds_reduction"] == {}
  assert summary["rounds"]["fedmmd"]["95"]["reached"] == 0
  text = rt.rounds_table(summary)
  assert "reduce" not in text and "| FedMMD (MMD) | 4.0 | > 20.0 (0/1 reached) |" in text


def _markdown(cells, show_paper, **kwargs):
  summary = rt.summarize(cells, targets=(94.0, 95.0))
  return rt.render_markdown(
      summary, dataset="mnist", setting="permuted", quick=False, seeds=[0],
      provenance_text="mnist real (npz:digits.npz)", setting_text="SETTING", show_paper=show_paper,
      last_rounds=3, configs_text="CONFIGS", **kwargs)


def test_markdown_layout_with_and_without_the_papers_numbers():
  cells = {"fedavg": {0: _run(10, final=95.0)}, "fedfusion_conv": {0: _run(4, final=96.5)}}
  plain = _markdown(cells, False)
  assert plain.startswith("# Rounds to target: mnist permuted (full configs), seed 0\n")
  assert "one seed: the mean alone" in plain and "Partial" not in plain
  assert "## Final accuracy (Table 1 layout): the mean of its last 3 evaluated rounds" in plain
  assert "| FedAvg | 95.00 |" in plain and "| FedFusion+Conv | 96.50 |" in plain
  assert ("| method | rounds to 94% | reduce (94%) | rounds to 95% | reduce (95%) |" in plain)
  assert "| FedAvg | 10.0 | (ref) | > 20.0 (0/1 reached) | (ref) |" in plain
  assert "| FedFusion+Conv | 4.0 | 60.0% | > 20.0 (0/1 reached) | n/a (neither reached) |" in plain
  assert ("| FedFusion+Conv | 0.00 / 0.00 | 0.0 | 60.0% | > 0.0 (0/1 reached) | "
          "n/a (neither reached) | 0.0 |") in plain  # bytes in MB: tiny here
  assert "(paper" not in plain and "differs from the paper" not in plain
  shown = _markdown(cells, True, caveats=["fewer images"], done=1, total=2)
  assert "**Partial: 1 of 2 cells finished.**" in shown
  assert "| FedAvg | 95.00 (paper 95.20) |" in shown
  assert "| FedFusion+Conv | 96.50 (paper 95.79) |" in shown
  assert "| FedFusion+Conv | 4.0 (paper 34.0) | 60.0% (paper 66.0%) |" in shown
  assert "| FedAvg | 10.0 (paper 100.0) | (ref) |" in shown
  assert "arXiv:1908.05891" in shown and "- differs from the paper: fewer images" in shown


def test_paper_numbers_are_shown_only_in_the_papers_setting():
  real = {"mnist": ["npz:/data/digits.npz"], "public": ["none"]}  # these settings: no public set
  ok, text = rt.paper_setting(dataset="mnist", setting="permuted", quick=False, sources=real)
  assert ok and "FedFusion Table 1 column (c) and Table 2" in text
  assert rt.all_real(real) and not rt.all_real({"public": ["none"]})
  assert not rt.all_real({**real, "mnist": ["synthetic(seed=0; substituted for 'real')"]})
  for kwargs, reason in [
      (dict(quick=True, sources=real), "quick configs"),
      (dict(quick=False, sources={"mnist": ["synthetic (substituted for 'real')"]}),
       "synthetic data for mnist"),
      (dict(quick=False, sources={}), "data provenance unknown"),
      (dict(quick=False, sources=real, overrides=["num_rounds=3"]), "overrides num_rounds=3")]:
    ok, text = rt.paper_setting(dataset="mnist", setting="permuted", **kwargs)
    assert not ok and reason in text and "paper numbers not shown" in text
  ok, text = rt.paper_setting(dataset="mnist", setting="binary", quick=False, sources=real)
  assert not ok and "no numbers for mnist binary" in text
  assert rt.paper_caveats("mnist", "permuted", 10000)[0] == (
      "the runs train on 10000 images in all (the offline bundle), the paper on 60000")
  assert not any("images" in c for c in rt.paper_caveats("mnist", "permuted", 60000))


def test_transcribed_paper_numbers_agree_with_their_reductions():
  for (dataset, setting), paper in rt.PAPER.items():
    assert (dataset, setting) in {("mnist", "permuted"), ("cifar10", "iid"),
                                  ("cifar10", "binary"), ("mnist", "shards")}
    assert set(paper.get("final", {})) <= set(rt.METHODS)
    for key, printed in paper.get("reduction", {}).items():
      rounds = paper["rounds"][key]
      for method, percent in printed.items():
        computed = 100 * (1 - rounds[method] / rounds["fedavg"])
        if (dataset, setting, method) == ("mnist", "shards", "fedmmd"):
          assert computed == pytest.approx(43.75)  # printed 23.4%: documented in the notes
          assert any("43.8%" in note for note in paper["notes"])
        else:
          assert computed == pytest.approx(percent, abs=0.05), (dataset, setting, key, method)
  assert rt.PAPER[("mnist", "permuted")]["final"]["fedfusion_conv"] == 95.79
  assert rt.PAPER[("cifar10", "iid")]["final"]["fedavg"] == 80.01


def test_method_tokens_map_to_the_papers_configs():
  module = runner.load_dataset_module("mnist", "permuted")
  expected = {"fedavg": ("fedavg", "mnist_fedavg_permuted_quick_seed1"),
              "fedmmd": ("fedmmd", "mnist_fedmmd_permuted_quick_seed1"),
              "fedmmd_l2": ("fedmmd", "mnist_fedmmd_permuted_l2_quick_seed1"),
              "fedfusion_conv": ("fedfusion", "mnist_fedfusion_permuted_conv_quick_seed1"),
              "fedfusion_multi": ("fedfusion", "mnist_fedfusion_permuted_multi_quick_seed1"),
              "fedfusion_single": ("fedfusion", "mnist_fedfusion_permuted_single_quick_seed1")}
  assert set(expected) == set(rt.METHODS)
  for method, (algorithm, name) in expected.items():
    config = runner.cell_config(module, method, "permuted", 1, quick=True,
                                overrides=["num_rounds=3"])
    assert (config.algorithm, config.name, config.seed, config.num_rounds) == (
        algorithm, name, 1, 3)
  assert runner.cell_config(module, "fedmmd_l2", "permuted", 0, quick=False).fedmmd.constraint \
      == "l2"
  assert runner.cell_config(module, "fedfusion_single", "permuted", 0,
                            quick=False).fedfusion.fusion == "single"
  assert rt.config_variant("fedavg", "shards", quick=True) == "fedavg_shards_quick"


def test_cli_rejects_unknown_arguments_with_one_line(capsys, tmp_path):
  base = ["--dataset=mnist", "--setting=permuted", f"--workdir={tmp_path}"]
  assert runner.main(base + ["--methods=fedavg,fedprox"]) == 1
  err = capsys.readouterr().err.strip()
  assert err == ("error: --methods: unknown method(s) 'fedprox'; allowed methods: fedavg, "
                 "fedmmd, fedmmd_l2, fedfusion_conv, fedfusion_multi, fedfusion_single.")
  assert runner.main(["--dataset=mnist", "--setting=iid", f"--workdir={tmp_path}"]) == 1
  assert "allowed settings: binary, shards, permuted" in capsys.readouterr().err
  assert runner.main(["--dataset=svhn", "--setting=iid", f"--workdir={tmp_path}"]) == 1
  assert "allowed datasets: cifar10, mnist" in capsys.readouterr().err
  assert runner.main(base + ["--set", "num_round=2"]) == 1
  assert "did you mean 'num_rounds'" in capsys.readouterr().err
  assert not any(tmp_path.iterdir())  # nothing written


def test_a_finished_cell_is_skipped_and_keeps_its_time(tmp_path):
  """benchmark.run_cell, which the rounds runner shares: train once, then skip."""
  from fedjax_het import reporting  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"num_rounds": 2, "name": "stub"})
  calls = []

  def train(cfg, workdir):
    calls.append(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.jsonl").unlink(missing_ok=True)
    writer = reporting.MetricsWriter(workdir, tensorboard=False)
    for record in _run(2, num_rounds=cfg.num_rounds)["records"]:
      writer.write(record)
    writer.close()
    (workdir / "results.json").write_text(json.dumps({"accuracy": {"AVG": 94.5}}))

  cell_dir = tmp_path / "fedavg" / "seed0"
  quiet = dict(label="[1/1]", train=train, echo=lambda _: None)
  first = runner.bench.run_cell(config, cell_dir, **quiet)
  assert first["status"] == "trained" and calls == [cell_dir]
  assert first["results"] == {"accuracy": {"AVG": 94.5}} and len(first["records"]) == 2
  again = runner.bench.run_cell(config, cell_dir, previous={"seconds": 12.5,
                                                            "workdir": str(cell_dir)}, **quiet)
  assert again["status"] == "skipped" and calls == [cell_dir]
  assert again["seconds"] == 12.5 and again["records"] == first["records"]
  # Another directory's time is not taken over.
  other = runner.bench.run_cell(config, cell_dir, previous={"seconds": 12.5, "workdir": "x"},
                                **quiet)
  assert other["status"] == "skipped" and other["seconds"] is None
  # Records short of num_rounds: not finished, trained again (resumed: it has checkpoints).
  config.num_rounds = 3
  (cell_dir / "checkpoints").mkdir()
  resumed = runner.bench.run_cell(config, cell_dir, **quiet)
  assert resumed["status"] == "resumed" and calls == [cell_dir, cell_dir]
  assert len(resumed["records"]) == 3


def test_figure_has_a_line_per_method_and_the_targets():
  from fedjax_het import plots  # pylint: disable=g-import-not-at-top
  plt = plots._pyplot()  # pylint: disable=protected-access
  cells = {"fedavg": {0: _run(10), 1: _run(12)}, "fedfusion_conv": {0: _run(4)}}
  curves = {m: {"accuracy": table.mean_curves([c["records"] for c in s.values()], "accuracy")}
            for m, s in cells.items()}
  fig = table.benchmark_figure(plt, curves, title="t", kinds=("accuracy",),
                               labels={m: rt.METHOD_LABELS[m] for m in curves},
                               titles={"accuracy": "acc"}, targets=(94.0, 95.0))
  (ax,) = fig.axes
  assert ax.get_title() == "acc"
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert legend == ["FedAvg", "FedFusion+Conv", "target 94%", "target 95%"]
  assert ax.get_ylim()[1] == pytest.approx(100.0)
  plt.close(fig)


def test_cells_with_different_targets_are_refused_before_training(tmp_path):
  def configure(config, method):
    config.eval.targets = (90.0,) if method == "fedmmd" else (94.0,)

  with pytest.raises(ConfigError, match="eval.targets differ"):
    runner.run_rounds_benchmark("mnist", "permuted", ["fedavg", "fedmmd"], [0], quick=True,
                                workdir=tmp_path / "w", configure=configure)
  assert not (tmp_path / "w").exists()


#: The e2e's shrunk quick config (as a command line would pass it; "" disables the cache).
TINY = ("num_rounds=2", "scenario.train_size=200", "scenario.test_size=100", "local.epochs=1",
        "logging.progress=False", "logging.plots=False", "compilation_cache_dir=")


def test_end_to_end_through_main_then_skips_the_finished_cells(tmp_path, monkeypatch, capsys,
                                                               tmp_path_factory):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  argv = ["--dataset=mnist", "--setting=permuted", "--quick", "--methods=fedavg,fedfusion_conv",
          "--seeds=0", f"--workdir={tmp_path}"]
  for override in TINY:
    argv += ["--set", override]
  assert runner.main(argv) == 0
  out = capsys.readouterr().out
  assert "[2/2] fedfusion_conv seed 0: trained" in out
  for name in ("rounds.md", "rounds.json", "rounds_accuracy.png"):
    assert (tmp_path / name).exists(), name
  numbers = json.loads((tmp_path / "rounds.json").read_text())
  summary = numbers["summary"]
  assert numbers["complete"] and numbers["targets"] == [70.0, 80.0]
  assert summary["kind"] == "intra" and summary["methods"] == ["fedavg", "fedfusion_conv"]
  for method in ("fedavg", "fedfusion_conv"):
    results = json.loads((tmp_path / method / "seed0" / "results.json").read_text())
    assert summary["final"][method]["per_seed"] == {"0": results["intra"]["AVG"]}
    for key, reached in results["rounds_to_target"].items():
      assert summary["rounds"][method][key]["per_seed"] == {
          "0": None if reached is None else float(reached)}
    assert numbers["cells"][method]["0"]["status"] == "trained"
    assert numbers["cells"][method]["0"]["seconds"] > 0
  per_round = summary["bytes_per_round"]
  # FedFusion sends the trunk, the 1x1 fusion conv and the classifier: more than FedAvg.
  assert per_round["fedfusion_conv"]["up"] > per_round["fedavg"]["up"] > 0
  assert per_round["fedavg"]["constant"]
  whole_run = summary["bytes"]["fedavg"]["all"]["mean"]
  assert whole_run == pytest.approx(2 * per_round["fedavg"]["total"])  # 2 rounds
  markdown = (tmp_path / "rounds.md").read_text()
  assert "# Rounds to target: mnist permuted (quick configs), seed 0" in markdown
  assert "(Table 1 layout): the mean of its last 2 evaluated rounds" in markdown  # of 2 rounds
  assert not numbers["all_real_data"]
  assert "SYNTHETIC" in markdown and "paper numbers not shown" in markdown
  assert "(paper" not in markdown and "| FedFusion+Conv |" in markdown

  # Again: both cells finished, nothing retrained, the same tables.
  assert runner.main(argv) == 0
  out = capsys.readouterr().out
  assert "[1/2] fedavg seed 0: skipped (finished earlier)" in out
  assert "0 cell(s) trained, 2 skipped" in out
  assert (tmp_path / "rounds.md").read_text() == markdown
  rerun = json.loads((tmp_path / "rounds.json").read_text())
  assert rerun["summary"] == summary
  assert rerun["cells"]["fedavg"]["0"]["status"] == "skipped"
  assert rerun["cells"]["fedavg"]["0"]["seconds"] == numbers["cells"]["fedavg"]["0"]["seconds"]

  # A finished cell with a different config is not silently reused.
  with pytest.raises(WorkdirError, match="config.local.epochs: 1 -> 2"):
    runner.run_rounds_benchmark("mnist", "permuted", ["fedavg"], [0], quick=True,
                                workdir=tmp_path, overrides=TINY,
                                configure=lambda c, m: setattr(c.local, "epochs", 2))

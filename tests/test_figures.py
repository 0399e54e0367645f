"""The FCCL / FCCL+ figures (`fedjax_het.studies.figures`, `experiments/figures.py`).

Each figure's data is checked against an independent computation: the
cross-correlation matrices against FCCL Eq. 1 written in NumPy, the t-SNE
embedding by the clusters it keeps, the local-loss series against the records.
The default tests use arrays made here; the `slow` ones train a tiny SOLO and a
tiny FCCL+ run and check the three figures of their workdirs: the public
heatmap against the cross_correlation.npz the training wrote, the private one
against Eq. 1 of the same logits, the t-SNE features through the accuracy of
the logits computed beside them against the run's recorded intra-domain
accuracy, the inter-domain panels against each model's outputs on the next
domain's sampled test images, the local-loss series against metrics.jsonl, and
the command. The default t-SNE tests of the inter-domain panels check which
model and which domain's images every panel uses with stand-in models.
"""

import importlib.util
import json
import pathlib
import sys
import types

import numpy as np
import pytest

from fedjax_het.studies import figures
from fedjax_het.losses.fccl import FCCM_EPS

REPO = pathlib.Path(__file__).resolve().parents[1]
PARTICIPANTS = ["mnist", "usps", "svhn", "syn"]
ROUNDS = 2


def _load_cli():
  spec = importlib.util.spec_from_file_location("figures_cli", REPO / "experiments" / "figures.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


cli = _load_cli()


def _titles(fig):
  return [ax.get_title() for ax in fig.axes if ax.get_title()]


def eq1(logits, target, eps=FCCM_EPS):
  """FCCL Eq. 1 in NumPy as the library (and the authors' code) computes it: every column
  standardised over the batch with the unbiased variance (+ eps), then Z^T Zbar / B."""
  def standardise(x):
    x = np.asarray(x, np.float64)
    centred = x - x.mean(axis=0)
    return centred / np.sqrt(centred.var(axis=0, ddof=1) + eps)
  return standardise(logits).T @ standardise(target) / len(logits)


# --- L_Loc per round (default) ---------------------------------------------------------------------


def _records():
  """Three rounds of FCCL-style records; round 2 lacks usps's dual term."""
  records = []
  for r in (1, 2, 3):
    record = {"round": r, "train/collaborative/col/mnist": 9.0, "train/server/bytes_up": 1.0,
              "eval/intra/mnist": 50.0}
    for k, name in enumerate(PARTICIPANTS):
      record[f"train/local/loss/{name}"] = 2.0 / r + k
      record[f"train/local/ce/{name}"] = 1.0 / r + k
      if not (r == 2 and name == "usps"):
        record[f"train/local/dual/{name}"] = 0.5 / r + k
    records.append(record)
  return records


def test_local_loss_series_are_the_records_local_terms():
  rounds, series = figures.local_loss_series(_records())
  assert rounds.tolist() == [1, 2, 3]
  assert list(series) == ["loss", "ce", "dual"]  # L_Loc first; no collaborative or server term
  for term in series:
    assert list(series[term]) == PARTICIPANTS
  np.testing.assert_array_equal(series["loss"]["svhn"], [2.0 + 2, 1.0 + 2, 2.0 / 3 + 2])
  np.testing.assert_array_equal(series["dual"]["usps"], [1.5, np.nan, 0.5 / 3 + 1])


def test_local_loss_figure_has_a_panel_per_run_and_term_and_a_line_per_participant():
  solo = [{k: v for k, v in r.items() if "/dual/" not in k} for r in _records()]
  data = [("SOLO (CE only) [solo]", *figures.local_loss_series(solo)),
          ("FCCL [fccl]", *figures.local_loss_series(_records()))]
  fig = figures.local_loss_figure(data)
  axes = fig.axes
  assert len(axes) == 2 * 3  # rows: the runs; columns: loss, ce, dual
  titles = [ax.get_title() for ax in axes]
  assert titles[0] == "SOLO (CE only) [solo]\nL_Loc (local objective)"
  assert titles[5] == "FCCL [fccl]\nL_Dual (FCCL Eq. 6, unweighted)"
  assert [len(ax.get_lines()) for ax in axes] == [4, 4, 0, 4, 4, 4]  # SOLO has no dual term
  assert [t.get_text() for t in axes[3].get_legend().get_texts()] == PARTICIPANTS
  np.testing.assert_array_equal(axes[3].get_lines()[2].get_ydata(),
                                [r["train/local/loss/svhn"] for r in _records()])
  assert axes[3].get_xlabel() == "communication round"


def test_local_loss_without_local_metrics_names_the_flag():
  with pytest.raises(figures.FigureError, match=r"^--workdirs: 'x/metrics.jsonl' holds no "
                                                r"train/local"):
    figures.local_loss_series([{"round": 1, "eval/intra/mnist": 10.0}],
                              source="x/metrics.jsonl")


# --- Cross-correlation heatmaps (default) ------------------------------------------------------


def test_cross_correlation_matrices_are_eq1_against_the_mean_logits():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 40, 5)) * rng.uniform(0.5, 3.0, size=(3, 1, 5))
  matrices = figures.cross_correlation_matrices(logits)
  target = logits.mean(axis=0)
  assert matrices.shape == (3, 5, 5)
  for i in range(3):
    np.testing.assert_allclose(matrices[i], eq1(logits[i], target), atol=1e-5)
    # Without eps it is (B-1)/B times the Pearson correlation (np.corrcoef).
    pearson = np.corrcoef(logits[i].T, target.T)[:5, 5:]
    np.testing.assert_allclose(matrices[i], 39 / 40 * pearson, atol=1e-4)


def _heatmap_data(label, split="train", k=4, c=10, seed=0):
  rng = np.random.default_rng(seed)
  return figures.HeatmapData(run=label, participants=PARTICIPANTS[:k], public_name="cifar100",
                             public=rng.uniform(-1, 1, (k, c, c)),
                             private=rng.uniform(-1, 1, (k, c, c)), private_logits=[],
                             round=2, split=split, rows=32)


def test_heatmap_figure_puts_public_beside_private_for_every_participant():
  data = [_heatmap_data("SOLO (CE only) [solo]"), _heatmap_data("FCCL [fccl]", "test", seed=1)]
  fig = figures.heatmap_figure(data)
  titles = _titles(fig)
  assert len(titles) == 4 * 2 * 2  # participants x runs x (public, private)
  assert titles[:4] == ["SOLO (CE only) [solo]\nmnist, public (cifar100)",
                        "SOLO (CE only) [solo]\nmnist, private data",
                        "FCCL [fccl]\nmnist, public (cifar100)",
                        "FCCL [fccl]\nmnist, own test set"]
  assert [t.split("\n")[1].split(",")[0] for t in titles[::4]] == PARTICIPANTS
  images = [ax.get_images()[0] for ax in fig.axes if ax.get_images()]
  np.testing.assert_array_equal(images[3].get_array(), data[1].private[0])
  np.testing.assert_array_equal(images[4].get_array(), data[0].public[1])
  assert images[0].get_clim() == (-1, 1)


def test_heatmaps_refuse_a_run_without_cross_correlation_diagnostics():
  run = types.SimpleNamespace(workdir=pathlib.Path("runs/fedavg"),
                              config=types.SimpleNamespace(algorithm="fedavg"),
                              experiment=types.SimpleNamespace(
                                  algorithm=types.SimpleNamespace(diagnostics=None),
                                  has_public=True))
  with pytest.raises(figures.FigureError, match=r"^--workdirs: 'runs/fedavg' is a 'fedavg' "
                                                r"run without the cross-correlation"):
    figures.check_heatmap_run(run)


# --- t-SNE (default) -------------------------------------------------------------------------


def _clusters(per_class=12, classes=3, dim=16, seed=0):
  rng = np.random.default_rng(seed)
  centres = rng.normal(scale=6.0, size=(classes, dim))
  labels = np.repeat(np.arange(classes), per_class)
  return centres[labels] + rng.normal(size=(len(labels), dim)), labels


def test_tsne_embedding_keeps_the_classes_apart():
  pytest.importorskip("sklearn")
  features, labels = _clusters()
  # 500 iterations: sklearn spends the first 250 in early exaggeration, which alone does not
  # separate the classes with every sklearn release (1.9 leaves 3 of 36 points astray).
  embedding = figures.tsne_embedding(features, seed=0, iterations=500)
  assert embedding.shape == (36, 2) and np.isfinite(embedding).all()
  # Every point's nearest neighbour in the embedding is of its own class.
  distance = np.linalg.norm(embedding[:, None] - embedding[None], axis=-1)
  np.fill_diagonal(distance, np.inf)
  assert (labels[distance.argmin(axis=1)] == labels).all()
  np.testing.assert_array_equal(embedding, figures.tsne_embedding(features, seed=0,
                                                                  iterations=500))


def test_tsne_figure_has_a_panel_per_participant_and_run():
  features, labels = _clusters(per_class=4)
  panels = [[figures.TsnePanel(run=run, participant=name, architecture="simple_cnn",
                               features=features, logits=np.zeros((12, 3)), labels=labels,
                               embedding=features[:, :2] + k)
             for run in ("SOLO (CE only) [solo]", "FCCL [fccl]")]
            for k, name in enumerate(PARTICIPANTS)]
  fig = figures.tsne_figure(panels, num_classes=3)
  titles = _titles(fig)
  assert len(titles) == 4 * 2
  assert titles[0] == "SOLO (CE only) [solo]\nmnist (simple_cnn), 12 test images"
  assert titles[7] == "FCCL [fccl]\nsyn (simple_cnn), 12 test images"
  assert [ax.get_ylabel() for ax in fig.axes[::2]] == [f"participant {n}" for n in PARTICIPANTS]
  np.testing.assert_allclose(fig.axes[2].collections[0].get_offsets(), panels[1][0].embedding)
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["0", "1", "2"]


def _fake_run(label, sizes=(20, 15, 25, 18)):
  """A restored run's shape without a model: test image i of domain j is the row (j, i)."""
  test = {d: types.SimpleNamespace(images=np.stack([np.full(n, j), np.arange(n)], axis=1),
                                   labels=np.arange(n) % 3)
          for j, (d, n) in enumerate(zip(PARTICIPANTS, sizes))}
  experiment = types.SimpleNamespace(
      scenario=types.SimpleNamespace(domains=tuple(PARTICIPANTS), test=test),
      setup=types.SimpleNamespace(private_mean=(0.0,) * 3, private_std=(1.0,) * 3),
      architectures=["simple_cnn", "fedavg_cifar_cnn"] * 2)
  return types.SimpleNamespace(label=label, client_names=list(PARTICIPANTS),
                               workdir=pathlib.Path(label), experiment=experiment)


@pytest.fixture
def fake_models(monkeypatch):
  """Participant k's "model" returns the images as features and k as its only logit."""
  monkeypatch.setattr(figures, "participant_variables", lambda run, k: (k, run.label))
  monkeypatch.setattr(figures, "model_outputs", lambda model, variables, images, mean, std: (
      np.asarray(images, np.float32), np.full((len(images), 1), model, np.float32)))


def test_tsne_inter_domain_panels_are_each_model_on_the_next_domains_sample(fake_models):
  runs = [_fake_run("SOLO (CE only) [solo]"), _fake_run("FCCL [fccl]")]
  sizes = {d: len(runs[0].experiment.scenario.test[d].labels) for d in PARTICIPANTS}
  own = figures.tsne_panels(runs, max_points=16, seed=5)
  both = figures.tsne_panels(runs, max_points=16, seed=5, domains="both")
  inter = figures.tsne_panels(runs, max_points=16, seed=5, domains="inter")
  assert len(own) == len(inter) == 4 and len(both) == 8 and all(len(r) == 2 for r in both)
  for k, name in enumerate(PARTICIPANTS):
    after = PARTICIPANTS[(k + 1) % 4]  # mnist -> usps (FCCL Fig. 4's M -> U), ..., syn -> mnist
    assert figures.inter_domain(runs[0].experiment.scenario, k) == after
    for c, run in enumerate(runs):
      mine, other = both[2 * k][c], both[2 * k + 1][c]
      assert (mine.participant, mine.domain, other.participant, other.domain) == (
          name, None, name, after)
      assert other.run == run.label and other.architecture == mine.architecture
      assert (other.logits == k).all()  # participant k's model on the other domain
      # The other domain's images, the sample of that domain's own panel (seed + its index).
      assert (other.features[:, 0] == (k + 1) % 4).all()
      np.testing.assert_array_equal(
          other.features[:, 1], figures.sample_indices(sizes[after], 16, seed=5 + (k + 1) % 4))
      np.testing.assert_array_equal(other.features, own[(k + 1) % 4][c].features)
      np.testing.assert_array_equal(other.labels, own[(k + 1) % 4][c].labels)
      np.testing.assert_array_equal(inter[k][c].features, other.features)
      # The own rows are the default figure's panels.
      assert (own[k][c].domain is None and (own[k][c].features[:, 0] == k).all())
      np.testing.assert_array_equal(mine.features, own[k][c].features)
  assert [len(row[0].labels) for row in both] == [16, 15, 15, 16, 16, 16, 16, 16]


def test_tsne_inter_domain_panels_need_several_domains(fake_models):
  run = _fake_run("SOLO (CE only) [solo]")
  with pytest.raises(figures.FigureError, match=r"^--domains must be one of"):
    figures.tsne_panels([run], domains="other")
  scenario = run.experiment.scenario
  scenario.domains, scenario.test = ("mnist",) * 4, {"mnist": scenario.test["mnist"]}
  assert len(figures.tsne_panels([run], max_points=8)) == 4
  with pytest.raises(figures.FigureError, match=r"^--domains: the run has the single test "
                                                r"domain \['mnist'\]"):
    figures.tsne_panels([run], domains="inter")


def test_tsne_figure_titles_inter_domain_panels_with_their_domain():
  features, labels = _clusters(per_class=4)
  panels = [[figures.TsnePanel(run=run, participant=name, architecture="simple_cnn",
                               features=features, logits=np.zeros((12, 3)), labels=labels,
                               embedding=features[:, :2] + r, domain=domain)
             for run in ("SOLO (CE only) [solo]", "FCCL [fccl]")]
            for r, (name, domain) in enumerate((("mnist", None), ("mnist", "usps")))]
  fig = figures.tsne_figure(panels, num_classes=3)
  assert _titles(fig) == ["SOLO (CE only) [solo]\nmnist (simple_cnn), 12 test images",
                          "FCCL [fccl]\nmnist (simple_cnn), 12 test images",
                          "SOLO (CE only) [solo]\nmnist (simple_cnn) -> usps, 12 test images",
                          "FCCL [fccl]\nmnist (simple_cnn) -> usps, 12 test images"]
  assert [ax.get_ylabel() for ax in fig.axes[:4:2]] == ["participant mnist",
                                                         "participant mnist -> usps"]
  np.testing.assert_allclose(fig.axes[3].collections[0].get_offsets(), panels[1][1].embedding)
  assert "intra- and inter-domain rows" in fig.get_suptitle()
  fig = figures.tsne_figure(panels[1:], num_classes=3)
  assert "next domain's test set" in fig.get_suptitle()


def test_tsne_without_scikit_learn_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "sklearn.manifold", None)
  with pytest.raises(figures.FigureError, match=r'pip install -e "\.\[figures\]"'):
    figures.tsne_embedding(np.zeros((10, 3)))


def test_sample_indices_are_sorted_distinct_and_repeatable():
  index = figures.sample_indices(100, 10, seed=3)
  assert len(set(index)) == 10 and (np.diff(index) > 0).all()
  np.testing.assert_array_equal(index, figures.sample_indices(100, 10, seed=3))
  np.testing.assert_array_equal(figures.sample_indices(8, 10, seed=3), np.arange(8))
  np.testing.assert_array_equal(figures.sample_indices(8, 0, seed=3), np.arange(8))


# --- The command (default) ---------------------------------------------------------------------


def test_command_names_the_flag_for_bad_workdirs_and_outputs(tmp_path, capsys):
  (tmp_path / "run.json").write_text("{}")
  assert cli.main(["heatmaps", f"--workdirs={tmp_path}"]) == 1
  error = capsys.readouterr().err.strip()
  assert error == (f"error: --workdirs: {str(tmp_path)!r} holds no checkpoints; the features "
                   "and heatmaps need a run trained with checkpoints (local_loss needs only "
                   "metrics.jsonl).")
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  assert cli.main(["heatmaps", f"--workdirs={tmp_path}"]) == 1
  assert capsys.readouterr().err.startswith(
      f"error: --workdirs: the run.json of {str(tmp_path)!r} cannot be read as a run record")
  assert cli.main(["tsne", f"--workdirs={tmp_path / 'none'}"]) == 1
  assert capsys.readouterr().err.startswith("error: --workdirs: ")
  assert cli.main(["local_loss", f"--workdirs={tmp_path / 'none'}"]) == 1
  assert capsys.readouterr().err.startswith("error: --workdirs: ")
  assert cli.main(["all", f"--workdirs={tmp_path}", "--out=x.png"]) == 1
  assert capsys.readouterr().err.startswith("error: --out=x.png: ")
  assert cli.output_path("figs", "tsne", [tmp_path]) == pathlib.Path("figs/tsne.png")
  assert cli.output_path(None, "heatmaps", [tmp_path / "a", tmp_path / "b"]) == (
      tmp_path / "figures" / "heatmaps.png")
  assert cli.parse_args(["tsne", "--workdirs=x"]).domains == "own"
  assert cli.parse_args(["tsne", "--workdirs=x", "--domains=both"]).domains == "both"
  assert cli.main(["tsne", f"--workdirs={tmp_path}", "--domains=inter"]) == 1
  assert capsys.readouterr().err.startswith("error: --workdirs: the run.json of ")
  with pytest.raises(figures.FigureError, match=r"^--domains must be one of"):
    cli.draw("tsne", [tmp_path], domains="next")


# --- Trained workdirs (slow) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  """A tiny SOLO and a tiny FCCL+ run of ROUNDS rounds on synthetic data (no data directory)."""
  from fedjax_het.train import train_and_evaluate  # pylint: disable=import-outside-toplevel
  from tests.test_train import tiny_config  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("figure_runs")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    out = {}
    for method in ("solo", "fcclplus"):
      config = tiny_config(method, **{"num_rounds": ROUNDS,
                                      "logging.diagnostic_rounds": (ROUNDS,)})
      train_and_evaluate(config, root / method)
      out[method] = root / method
    yield out


@pytest.fixture(scope="module")
def runs(workdirs):
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FEDJAX_HET_CACHE_DIR", str(workdirs["solo"].parents[1] / "data_cache"))
    patch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
    yield {method: figures.load_run(path) for method, path in workdirs.items()}


def _jsonl(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # trains two tiny runs (about 90 s of CPU time on a 2-core machine)
def test_local_loss_of_a_workdir_is_its_metrics_jsonl(workdirs):
  for method, terms in (("solo", ["loss", "ce"]), ("fcclplus", ["loss", "ce", "distill"])):
    label, records = figures.read_records(workdirs[method])
    rounds, series = figures.local_loss_series(records)
    lines = _jsonl(workdirs[method])
    assert rounds.tolist() == [r["round"] for r in lines] == list(range(1, ROUNDS + 1))
    assert list(series) == terms
    for term in terms:
      assert list(series[term]) == PARTICIPANTS
      for participant in PARTICIPANTS:
        np.testing.assert_array_equal(
            series[term][participant], [r[f"train/local/{term}/{participant}"] for r in lines])
    assert label == f"{figures.METHOD_NAMES[method]} [{method}]"


@pytest.mark.slow
def test_heatmaps_of_a_workdir_are_its_diagnostics_and_eq1_on_private_data(runs, workdirs):
  run = runs["fcclplus"]
  data = figures.heatmap_data(run)
  k, c = len(PARTICIPANTS), run.experiment.setup.num_classes
  assert data.public.shape == data.private.shape == (k, c, c)
  # The public panel is what training saved for the final round.
  with np.load(workdirs["fcclplus"] / "cross_correlation.npz") as saved:
    np.testing.assert_allclose(data.public, saved[f"round_{ROUNDS}"], atol=1e-5)
  # Private panel: participant i's logits against the mean of all K models' logits on i's
  # own private rows.
  for i, logits in enumerate(data.private_logits):
    n = min(data.rows, len(run.experiment.scenario.train[i].labels))
    assert logits.shape == (k, n, c)
    np.testing.assert_allclose(data.private[i], eq1(logits[i], logits.mean(axis=0)), atol=1e-4)
  # The figure's forward pass on the public batch gives the library's jitted diagnostics:
  # participant order, variables and normalisation agree with the training-time code.
  setup = run.experiment.setup
  images = np.asarray(run.experiment.scenario.public)[:figures.diagnostic_rows(run.config)]
  public_logits = np.stack([figures.model_outputs(*figures.participant_variables(run, j), images,
                                                  mean=setup.public_mean,
                                                  std=setup.public_std)[1] for j in range(k)])
  np.testing.assert_allclose(figures.cross_correlation_matrices(public_logits), data.public,
                             atol=1e-4)
  fig = figures.heatmap_figure([figures.heatmap_data(runs["solo"], rows=16), data])
  titles = _titles(fig)
  assert len(titles) == 4 * 2 * 2
  assert titles[:4] == ["SOLO (CE only) [solo]\nmnist, public (cifar100)",
                        "SOLO (CE only) [solo]\nmnist, private data",
                        "FCCL+ [fcclplus]\nmnist, public (cifar100)",
                        "FCCL+ [fcclplus]\nmnist, private data"]


@pytest.mark.slow
def test_tsne_features_of_a_workdir_are_the_evaluated_models_on_their_test_sets(runs, workdirs):
  pytest.importorskip("sklearn")
  panels = figures.tsne_panels([runs["solo"], runs["fcclplus"]], max_points=0)
  assert [[p.participant for p in row] for row in panels] == [[n, n] for n in PARTICIPANTS]
  for column, method in enumerate(("solo", "fcclplus")):
    last = _jsonl(workdirs[method])[-1]
    for k, name in enumerate(PARTICIPANTS):
      panel = panels[k][column]
      np.testing.assert_array_equal(panel.labels,
                                    runs[method].experiment.scenario.test[name].labels)
      # The logits beside the features reproduce the run's own intra-domain evaluation.
      accuracy = 100.0 * np.mean(panel.logits.argmax(axis=1) == panel.labels)
      assert accuracy == pytest.approx(last[f"eval/intra/{name}"], abs=1e-4)
  figures.embed(panels, seed=0, iterations=250)
  fig = figures.tsne_figure(panels, num_classes=10)
  titles = _titles(fig)
  assert len(titles) == 4 * 2
  assert titles[0].startswith("SOLO (CE only) [solo]\nmnist (simple_cnn), ")
  assert titles[7].startswith("FCCL+ [fcclplus]\nsyn (fedavg_cifar_cnn), ")


@pytest.mark.slow
def test_tsne_inter_domain_features_of_a_workdir_are_each_model_on_the_next_test_set(runs):
  run = runs["fcclplus"]
  scenario, setup = run.experiment.scenario, run.experiment.setup
  panels = figures.tsne_panels([runs["solo"], run], max_points=12, seed=1, domains="both")
  own = figures.tsne_panels([runs["solo"], run], max_points=12, seed=1)
  assert len(panels) == 2 * len(PARTICIPANTS)
  for k, name in enumerate(PARTICIPANTS):
    after = PARTICIPANTS[(k + 1) % 4]
    panel = panels[2 * k + 1][1]
    assert (panel.participant, panel.domain) == (name, after)
    np.testing.assert_array_equal(panels[2 * k][1].features, own[k][1].features)
    # Participant k's model on the next domain's images: its own panel's sample.
    index = figures.sample_indices(len(scenario.test[after].labels), 12, seed=1 + (k + 1) % 4)
    features, logits = figures.model_outputs(
        *figures.participant_variables(run, k), scenario.test[after].images[index],
        mean=setup.private_mean, std=setup.private_std)
    np.testing.assert_allclose(panel.features, features, atol=1e-5)
    np.testing.assert_allclose(panel.logits, logits, atol=1e-5)
    np.testing.assert_array_equal(panel.labels, scenario.test[after].labels[index])
    np.testing.assert_array_equal(panel.labels, own[(k + 1) % 4][1].labels)
  for row in panels:
    for each in row:
      each.embedding = each.features[:, :2]
  titles = _titles(figures.tsne_figure(panels, num_classes=10))
  assert len(titles) == 8 * 2
  assert titles[2].startswith("SOLO (CE only) [solo]\nmnist (simple_cnn) -> usps, 12 test")
  assert titles[15].startswith("FCCL+ [fcclplus]\nsyn (fedavg_cifar_cnn) -> mnist, 12 test")


@pytest.mark.slow
def test_command_draws_every_figure_into_a_folder(runs, workdirs, tmp_path, monkeypatch):
  pytest.importorskip("sklearn")
  del runs  # restored once already: the command's restores reuse the compiled programs
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(workdirs["solo"].parents[1] / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  written = cli.draw("all", [workdirs["solo"], workdirs["fcclplus"]], out=str(tmp_path / "figs"),
                     max_points=12, tsne_iterations=250, rows=16, echo=lambda line: None)
  assert sorted(written) == ["heatmaps", "local_loss", "tsne"]
  for name, path in written.items():
    assert path == tmp_path / "figs" / f"{name}.png" and path.stat().st_size > 10_000

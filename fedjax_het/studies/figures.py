"""The FCCL / FCCL+ figures of trained runs, computed from their workdirs.

Each figure has a function that computes its data (NumPy arrays, testable on
their own) and one that draws it with matplotlib; `experiments/figures.py` is
the command that restores the runs and saves the PNGs (docs/figures.md).

  * t-SNE of each participant's features on its own domain's test set
    (FCCL Fig. 4: cross-entropy alone vs dual-domain distillation; FCCL+
    Fig. 9: the FNTD teacher theta^{e-1} vs theta^e) and, with
    `domains="inter"` or `"both"`, on the next domain's test set (FCCL Fig. 4's
    bottom row): `tsne_panels` -> `tsne_figure`, one panel per participant and
    test set (row) and run (column), points coloured by class.
  * Cross-correlation heatmaps on the public and the private data (FCCL Fig. 5,
    FCCL+ Fig. 8): `heatmap_data` -> `heatmap_figure`, for every participant
    i the C x C matrix M_i of Eq. 1 (FCCL and FCCL+) on the public batch beside
    M_i on i's own private data.
  * The local objective per round (FCCL Fig. 6b): `local_loss_series` ->
    `local_loss_figure`, the local phase's loss terms from metrics.jsonl, one
    line per participant.

Interpretations and deviations (the papers give the pictures, not the recipe):
  * Features are the models' penultimate representation (`models.apply_model`'s
    `features`, the input of the classifier), in eval mode (BatchNorm running
    statistics, no dropout), on the participant's own domain's test set (FCCL+
    Fig. 9 draws "the testing data"; FCCL Fig. 4's top row, the intra-domain
    case M -> M). FCCL Fig. 4's bottom row, the inter-domain case M -> U, is
    the MNIST participant's model on the USPS test set; the paper shows that
    one pair only and does not say which other domain the other participants
    would use. `domains="inter"` draws every participant's model on the next
    domain of the scenario's test domains, cyclically (Digits: mnist -> usps,
    usps -> svhn, svhn -> syn, syn -> mnist; the first is the paper's pair),
    one panel per participant like the intra-domain row; `domains="both"`
    puts each participant's inter-domain row under its own. Every panel has
    its own t-SNE (the participants' feature spaces differ in architecture and
    width), run by `sklearn.manifold.TSNE` on at most `max_points` test images
    per panel, the same images for every run of a domain (a seeded sample),
    PCA initialisation, perplexity min(30, (n - 1) / 3), one OpenMP thread by
    default (`tsne_embedding`).
  * M_i is Eq. 1 as the library computes it for training and for its
    diagnostics (`losses.cross_correlation_matrix`, the authors' unbiased
    standard deviation: (B-1)/B times the Pearson correlation, with the variance
    floor `losses.fccl.FCCM_EPS` = 1e-6, visible only for logits that barely
    vary): participant i's eval-mode logits against the mean logits of all K
    participants' current models on the same images. The public panel is the library's own
    `cross_correlation` diagnostic (`Experiment.diagnostics`: the first
    `collaborative.batch_size` public images, 512 for methods without a public
    phase), which equals `<workdir>/cross_correlation.npz` where the run saved
    that round. FCCL's training target replaces i's own slot by its
    previous-round model (`fccl.own_slot`); the figure uses the current models,
    as the diagnostics do.
  * "Private data" (FCCL Fig. 5 / FCCL+ Fig. 8, right column) is participant
    i's private training set: M_i "with others on respective private data" is
    every participant's model on i's private images, the data only i holds. The
    first `rows` private images are used (by default as many as the public
    panel's batch), normalised with the private statistics as the local phase
    does. `split="test"` uses i's domain's test set instead (the same domain,
    images no model trained on).
  * L_Loc per round is `train/local/loss/<participant>` of metrics.jsonl, the
    mean of the local objective over every local step of the round (all local
    epochs); FCCL Fig. 6b does not say whether it plots the mean or the last
    value of a round. Its terms are drawn beside it: `ce` (L_CE), FCCL's `dual`
    (L_Dual, Eq. 6, unweighted: L_Loc = L_CE + lambda_Loc L_Dual) and FCCL+'s
    `distill` (FNTD, or lambda_Loc L_Dual for `local_distillation="dual"`).

References:
  [FCCL] W. Huang, M. Ye, B. Du. Learn from Others and Be Yourself in
    Heterogeneous Federated Learning. CVPR 2022. Figs. 4, 5, 6b.
  [FCCL+] W. Huang, M. Ye, Z. Shi, B. Du. Generalizable Heterogeneous
    Federated Cross-Correlation and Instance Similarity Learning. TPAMI.
    Figs. 8, 9.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedjax_het.errors import ConfigError, UserError, WorkdirError

#: What a missing optional dependency of the figures asks the user to install.
INSTALL_HINT = 'pip install -e ".[figures]"'
#: The paper's names of the methods in the figures (others keep their registry name).
METHOD_NAMES = {"solo": "SOLO (CE only)", "fccl": "FCCL", "fcclplus": "FCCL+"}
#: The local phase's metric names (train/local/<term>/<participant>) and their meaning.
LOCAL_TERMS = {
    "loss": "L_Loc (local objective)",
    "ce": "L_CE (cross-entropy)",
    "dual": "L_Dual (FCCL Eq. 6, unweighted)",
    "distill": "L_distill (FCCL+: FNTD, Eq. 13)",
}
#: Rows of the public panel when a method has no `collaborative.batch_size` (the batch of
#: `algorithms.common.cross_correlation_diagnostics` for SOLO and FML).
DEFAULT_DIAGNOSTIC_ROWS = 512
#: Images per forward pass when features or logits are extracted.
FORWARD_BATCH = 256
HEATMAP_CAPTION = (
    "M_i[u, v]: correlation over the images of participant i's logit u with the mean logit v "
    "of all participants (FCCL Eq. 1).\nFCCM's loss (FCCL+ Eq. 2) pulls the diagonal to 1 "
    "(red) and, with weight λ = 0.0051, the off-diagonal entries toward -1 (blue).")


class FigureError(UserError, ValueError):
  """A workdir or option the figures cannot use (the message names the flag)."""


# --- Runs ------------------------------------------------------------------------------------


@dataclasses.dataclass
class RestoredRun:
  """A finished run, restored for the figures.

  Attributes:
    workdir: its directory.
    label: the method's name in the figures, with the workdir's name.
    config: its config (from run.json).
    experiment: `experiment.Experiment(config)`: data, groups, diagnostics.
    state: the training state of the final checkpoint, on the host.
    round: that checkpoint's round.
    records: metrics.jsonl.
  """
  workdir: pathlib.Path
  label: str
  config: Any
  experiment: Any
  state: Any
  round: int
  records: list[dict[str, Any]]

  @property
  def client_names(self) -> list[str]:
    return list(self.experiment.client_names)


def method_name(config: Any) -> str:
  """The paper's name of the run's method ("FCCL", "FCCL+", "SOLO (CE only)", else its own)."""
  from fedjax_het.studies.new_client import method_label  # pylint: disable=g-import-not-at-top
  method = str(config.algorithm)
  if method == "fcclplus" and config.fcclplus.get("local_distillation", "fntd") != "fntd":
    return f"FCCL+ (local {config.fcclplus.local_distillation})"
  return METHOD_NAMES.get(method, method_label(config))


def run_label(config: Any, workdir: pathlib.Path) -> str:
  return f"{method_name(config)} [{workdir.name}]"


def _check_workdir(workdir: pathlib.Path, flag: str) -> None:
  """One line naming the flag when `workdir` is not a finished run's directory."""
  if not workdir.is_dir():
    raise FigureError(f"{flag}: {str(workdir)!r} is not a directory; pass the --workdir of "
                      "a finished experiments/train.py run.")
  if not (workdir / "run.json").is_file():
    raise FigureError(f"{flag}: {str(workdir)!r} holds no run.json; pass the --workdir of a "
                      "finished experiments/train.py run (with seeds: its seed_<s> folder).")
  checkpoints = workdir / "checkpoints"
  if not checkpoints.is_dir() or not any(p.name.isdigit() for p in checkpoints.iterdir()):
    raise FigureError(f"{flag}: {str(workdir)!r} holds no checkpoints; the features and "
                      "heatmaps need a run trained with checkpoints (local_loss needs only "
                      "metrics.jsonl).")


def _run_config(workdir: pathlib.Path, flag: str) -> Any:
  """The run's config from its run.json (one line naming the flag when it cannot be read)."""
  from fedjax_het.studies.new_client import config_from_run_record  # pylint: disable=g-import-not-at-top
  try:
    return config_from_run_record(json.loads((workdir / "run.json").read_text()))
  except (OSError, KeyError, TypeError, ValueError, WorkdirError) as error:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise FigureError(f"{flag}: the run.json of {str(workdir)!r} cannot be read as a run "
                      f"record ({reason}); pass the --workdir of an experiments/train.py "
                      "run.") from None


def load_run(workdir: str | pathlib.Path, *, flag: str = "--workdirs") -> RestoredRun:
  """Restores the final checkpoint of the finished run in `workdir` with its own config.

  `new_client.restore_finished_run`: the config comes from run.json, the data
  are rebuilt and must have the recorded fingerprint (FEDJAX_HET_DATA_DIR as
  the run had it), the state is the checkpoint of round `config.num_rounds`.
  A run of the class-incremental task stream is refused.
  """
  from fedjax_het.studies import new_client  # pylint: disable=g-import-not-at-top
  from fedjax_het.algorithms import get_method  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  workdir = pathlib.Path(workdir)
  _check_workdir(workdir, flag)
  config = _run_config(workdir, flag)
  try:
    if get_method(config.algorithm).class_incremental:
      raise FigureError(f"{flag}: {str(workdir)!r} is a class-incremental run "
                        f"({config.algorithm}); the figures need a domain or partitioned run "
                        "(FCCL, FCCL+, SOLO, ...).")
    run = new_client.restore_finished_run(workdir)
  except FigureError:
    raise
  except (WorkdirError, ConfigError) as error:
    raise FigureError(f"{flag}: {error}") from error
  return RestoredRun(workdir=workdir, label=run_label(run.config, workdir), config=run.config,
                     experiment=run.experiment, state=jax.device_get(run.state),
                     round=int(run.round), records=run.records)


def read_records(workdir: str | pathlib.Path, *, flag: str = "--workdirs"
                 ) -> tuple[str, list[dict[str, Any]]]:
  """(the run's label, its metrics.jsonl records); needs no checkpoint and no data."""
  from fedjax_het import reporting  # pylint: disable=g-import-not-at-top
  workdir = pathlib.Path(workdir)
  if not (workdir / "metrics.jsonl").is_file() or not (workdir / "run.json").is_file():
    raise FigureError(f"{flag}: {str(workdir)!r} holds no metrics.jsonl and run.json; pass the "
                      "--workdir of an experiments/train.py run.")
  config = _run_config(workdir, flag)
  records = reporting.MetricsWriter(workdir, enabled=False).read()
  return run_label(config, workdir), records


# --- Model outputs ----------------------------------------------------------------------------


def participant_variables(run: RestoredRun, participant: int) -> tuple[Any, Any]:
  """(participant's model module, its {"params", "batch_stats"}) from the stacked state."""
  import jax  # pylint: disable=g-import-not-at-top
  for group in run.experiment.groups:
    if participant in group.clients:
      slot = list(group.clients).index(participant)
      stacked = run.state["groups"][group.name]["variables"]
      return group.model, jax.tree_util.tree_map(lambda x: np.asarray(x)[slot], stacked)
  raise ValueError(f"participant {participant} is in no group of {run.workdir}")


def model_outputs(model: Any, variables: Any, images: np.ndarray, *, mean: Sequence[float],
                  std: Sequence[float], batch_size: int = FORWARD_BATCH
                  ) -> tuple[np.ndarray, np.ndarray]:
  """(features (N, D), logits (N, C)) of one model in eval mode on uint8 images (N, 32, 32, 3),
  normalised with (mean, std); fixed-size batches (the last one padded), so one compilation."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_het import models  # pylint: disable=g-import-not-at-top
  from fedjax_het.data.augment import normalizer  # pylint: disable=g-import-not-at-top
  normalize = normalizer(mean, std)
  n = len(images)
  batch = max(1, min(batch_size, n))
  features, logits = [], []
  for start in range(0, n, batch):
    chunk = np.asarray(images[start:start + batch])
    rows = len(chunk)
    if rows < batch:
      chunk = np.concatenate([chunk, np.zeros((batch - rows, *chunk.shape[1:]), chunk.dtype)])
    f, z, _ = models.apply_model(model, variables, normalize(jnp.asarray(chunk)), train=False)
    features.append(np.asarray(f, np.float32)[:rows])
    logits.append(np.asarray(z, np.float32)[:rows])
  return np.concatenate(features), np.concatenate(logits)


def sample_indices(size: int, max_points: int, seed: int) -> np.ndarray:
  """Sorted indices of at most `max_points` of `size` rows, the same for the same arguments."""
  if max_points <= 0 or size <= max_points:
    return np.arange(size)
  return np.sort(np.random.default_rng(seed).choice(size, max_points, replace=False))


# --- Figure 1: t-SNE of features ---------------------------------------------------------------


#: `tsne_panels`' choices of test sets: the participant's own domain's, the next domain's, both.
TSNE_DOMAINS = ("own", "inter", "both")


@dataclasses.dataclass
class TsnePanel:
  """One t-SNE panel: a participant's features on a domain's test images."""
  run: str              # the run's label
  participant: str
  architecture: str
  features: np.ndarray  # (n, D)
  logits: np.ndarray    # (n, C)
  labels: np.ndarray    # (n,)
  embedding: np.ndarray | None = None  # (n, 2) after `embed`
  domain: str | None = None  # the test set's domain when it is not the participant's own


def check_tsne_available() -> None:
  """Raises FigureError (one line naming the install command) without scikit-learn."""
  _tsne_class()


def _tsne_class():
  try:
    from sklearn.manifold import TSNE  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise FigureError(f"the t-SNE figure needs scikit-learn: {INSTALL_HINT}") from None
  return TSNE


def tsne_embedding(features: np.ndarray, *, seed: int = 0, iterations: int = 1000,
                   perplexity: float = 30.0, threads: int | None = 1) -> np.ndarray:
  """(n, 2) t-SNE of (n, D) features (`sklearn.manifold.TSNE`, PCA init; the perplexity is
  capped at (n - 1) / 3, the most the points allow; at least 250 iterations, sklearn's
  minimum).

  `threads`: the OpenMP threads of sklearn's Barnes-Hut gradient (threadpoolctl; None:
  sklearn's default, every core). One by default: a panel has at most a few thousand
  points, and on a busy CPU the threads' barriers cost more than they gain (36 points, 250
  iterations on a loaded 2-core AMD EPYC, 2026-11-26: 13.1 s with the default threads, 0.4 s
  with one).
  """
  tsne = _tsne_class()
  features = np.asarray(features, np.float32)
  n = len(features)
  if n < 5:
    raise FigureError(f"t-SNE needs at least 5 points per panel, got {n} (--max_points).")
  steps = "max_iter" if "max_iter" in inspect.signature(tsne).parameters else "n_iter"
  model = tsne(n_components=2, perplexity=min(float(perplexity), (n - 1) / 3.0), init="pca",
               random_state=int(seed), **{steps: max(250, int(iterations))})
  if threads is None:
    return np.asarray(model.fit_transform(features), np.float32)
  from threadpoolctl import threadpool_limits  # pylint: disable=g-import-not-at-top (sklearn's)
  with threadpool_limits(limits=int(threads), user_api="openmp"):
    return np.asarray(model.fit_transform(features), np.float32)


def inter_domain(scenario: Any, participant: int) -> str:
  """The domain of `participant`'s inter-domain panel: the next of the scenario's test domains
  after its own, cyclically (Digits: mnist -> usps -> svhn -> syn -> mnist)."""
  domains = list(scenario.test)
  if len(domains) < 2:
    raise FigureError(f"--domains: the run has the single test domain {domains}; the "
                      "inter-domain panels need a scenario with several domains (--domains=own).")
  return domains[(domains.index(scenario.domains[participant]) + 1) % len(domains)]


def tsne_panels(runs: Sequence[RestoredRun], *, max_points: int = 1000, seed: int = 0,
                domains: str = "own") -> list[list[TsnePanel]]:
  """[row][run] panels (features, logits, labels; no embedding yet).

  `domains="own"`: row k is participant k's model on its own domain's test set
  (at most `max_points` images, `sample_indices` seeded by `seed` + k, so runs
  of the same data draw the same images). `"inter"`: row k is the same model
  on the test set of `inter_domain(scenario, k)` (FCCL Fig. 4's bottom row),
  its sample seeded by `seed` + that domain's index among the test domains:
  where the participants are the domains in order (Digits, Office), the images
  of that domain's own panel. `"both"`: each participant's own row, then its
  inter-domain row. Images are normalised with the private statistics as the
  evaluation does. The runs must have the same participants.
  """
  if domains not in TSNE_DOMAINS:
    raise FigureError(f"--domains must be one of {TSNE_DOMAINS}, got {domains!r}.")
  names = runs[0].client_names
  for run in runs[1:]:
    if run.client_names != names:
      raise FigureError(f"--workdirs: {run.workdir} has participants {run.client_names}, "
                        f"{runs[0].workdir} {names}; the runs side by side must have the "
                        "same participants.")
  kinds = {"own": (False,), "inter": (True,), "both": (False, True)}[domains]
  rows = []
  for k, name in enumerate(names):
    for inter in kinds:
      row = []
      for run in runs:
        scenario, setup = run.experiment.scenario, run.experiment.setup
        if inter:
          domain = inter_domain(scenario, k)
          sample_seed = seed + list(scenario.test).index(domain)
        else:
          domain, sample_seed = scenario.domains[k], seed + k
        test = scenario.test[domain]
        index = sample_indices(len(test.labels), max_points, sample_seed)
        model, variables = participant_variables(run, k)
        features, logits = model_outputs(model, variables, test.images[index],
                                         mean=setup.private_mean, std=setup.private_std)
        row.append(TsnePanel(run=run.label, participant=name,
                             architecture=run.experiment.architectures[k], features=features,
                             logits=logits, labels=np.asarray(test.labels)[index],
                             domain=domain if inter else None))
      rows.append(row)
  return rows


def embed(panels: Sequence[Sequence[TsnePanel]], **tsne_options: Any) -> None:
  """Sets every panel's `embedding` (`tsne_embedding(panel.features, **tsne_options)`)."""
  for row in panels:
    for panel in row:
      panel.embedding = tsne_embedding(panel.features, **tsne_options)


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise FigureError(f"the figures need matplotlib: {INSTALL_HINT}") from None
  return plt


def _class_colours(num_classes: int):
  from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
  cmap = colormaps["tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "turbo"]
  if num_classes > 20:
    return [cmap(i / max(num_classes - 1, 1)) for i in range(num_classes)]
  return [cmap(i) for i in range(num_classes)]


def tsne_figure(panels: Sequence[Sequence[TsnePanel]], *, num_classes: int):
  """The Figure: rows = participants (and their inter-domain test sets), columns = runs (FCCL
  Fig. 4's left/right comparison); an inter-domain panel is titled "<participant> (<its
  architecture>) -> <domain>", as the paper's M -> U."""
  plt = _pyplot()
  rows, cols = len(panels), len(panels[0])
  fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                           figsize=(3.6 * cols + 1.4, 3.3 * rows + 0.8))
  colours = _class_colours(num_classes)
  for r, row in enumerate(panels):
    for c, panel in enumerate(row):
      ax = axes[r][c]
      points = panel.embedding
      ax.scatter(points[:, 0], points[:, 1], s=5, alpha=0.8, linewidths=0,
                 c=[colours[int(y) % len(colours)] for y in panel.labels])
      ax.set_xticks([])
      ax.set_yticks([])
      arrow = f" -> {panel.domain}" if panel.domain is not None else ""
      ax.set_title(f"{panel.run}\n{panel.participant} ({panel.architecture}){arrow}, "
                   f"{len(panel.labels)} test images", fontsize=9)
      if c == 0:
        ax.set_ylabel(f"participant {panel.participant}{arrow}", fontsize=10)
  handles = [plt.Line2D([], [], marker="o", ls="", color=colours[i % len(colours)],
                        label=str(i)) for i in range(min(num_classes, 20))]
  fig.legend(handles=handles, title="class", loc="outside right center", fontsize=8)
  inter = {panel.domain is not None for row in panels for panel in row}
  if inter == {False}:
    what = "on its own domain's test set (FCCL Fig. 4, FCCL+ Fig. 9)"
  elif inter == {True}:
    what = "on the next domain's test set (FCCL Fig. 4's inter-domain row)"
  else:
    what = ("on its own domain's test set and, in the row below,\non the next domain's "
            "(FCCL Fig. 4's intra- and inter-domain rows)")
  fig.suptitle(f"t-SNE of each participant's features {what}; colour = class", fontsize=11)
  return fig


# --- Figure 2: cross-correlation heatmaps ------------------------------------------------------


def cross_correlation_matrices(logits: np.ndarray) -> np.ndarray:
  """FCCL Eq. 1 for every participant: (K, B, C) logits of all K models on the same B images
  -> (K, C, C) matrices M_i, participant i's logits against the mean over all K
  (`losses.cross_correlation_matrix`, as in training and in the library's diagnostics)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_het import losses  # pylint: disable=g-import-not-at-top
  logits = jnp.asarray(logits, jnp.float32)
  target = jnp.mean(logits, axis=0)
  return np.asarray(jax.vmap(lambda z: losses.cross_correlation_matrix(
      logits=z, target_logits=target))(logits))


def diagnostic_rows(config: Any) -> int:
  """The public panel's batch: `collaborative.batch_size`, else 512
  (`algorithms.common.cross_correlation_diagnostics`)."""
  if "collaborative" in config:
    return int(config.collaborative.batch_size)
  return DEFAULT_DIAGNOSTIC_ROWS


def private_logits(run: RestoredRun, participant: int, *, rows: int, split: str = "train"
                   ) -> np.ndarray:
  """(K, n, C) logits of every participant's model on participant `participant`'s first `rows`
  private images (`split="train"`) or its domain's test images (`split="test"`)."""
  scenario, setup = run.experiment.scenario, run.experiment.setup
  if split == "train":
    images = scenario.train[participant].images[:rows]
  elif split == "test":
    images = scenario.test[scenario.domains[participant]].images[:rows]
  else:
    raise FigureError(f"--private_split must be 'train' or 'test', got {split!r}.")
  out = []
  for k in range(len(run.client_names)):
    model, variables = participant_variables(run, k)
    out.append(model_outputs(model, variables, images, mean=setup.private_mean,
                             std=setup.private_std)[1])
  return np.stack(out)


@dataclasses.dataclass
class HeatmapData:
  """One run's matrices: `public` (K, C, C) from the library's diagnostics, `private`
  (K, C, C) on each participant's own data, with the private logits they came from."""
  run: str
  participants: list[str]
  public_name: str
  public: np.ndarray
  private: np.ndarray
  private_logits: list[np.ndarray]  # participant i: (K, n_i, C)
  round: int
  split: str
  rows: int


def check_heatmap_run(run: RestoredRun, *, flag: str = "--workdirs") -> None:
  """The heatmaps need the library's cross-correlation diagnostics on a public set."""
  diagnostics = run.experiment.algorithm.diagnostics
  if (diagnostics is None or diagnostics.name != "cross_correlation"
      or not run.experiment.has_public):
    raise FigureError(
        f"{flag}: {str(run.workdir)!r} is a {run.config.algorithm!r} run without the "
        "cross-correlation diagnostics on public data; the heatmaps need a run of FCCL, FCCL+ "
        "or another public-data method that has them (fccl, fcclplus, fedmd, feddf, rhfl, "
        "fedmatch, fml, rcfl, solo) with a public set.")


def heatmap_data(run: RestoredRun, *, rows: int | None = None, split: str = "train",
                 flag: str = "--workdirs") -> HeatmapData:
  """M_i on the public batch (`Experiment.diagnostics`) and on each participant's own data."""
  check_heatmap_run(run, flag=flag)
  rows = int(rows) if rows else diagnostic_rows(run.config)
  if rows < 2:
    raise FigureError(f"--rows must be at least 2 (Eq. 1 standardises over the images), "
                      f"got {rows}.")
  public = np.asarray(run.experiment.diagnostics(run.state))
  logits = [private_logits(run, i, rows=rows, split=split) for i in range(len(run.client_names))]
  private = np.stack([cross_correlation_matrices(z)[i] for i, z in enumerate(logits)])
  return HeatmapData(run=run.label, participants=run.client_names,
                     public_name=str(run.config.scenario.public_name), public=public,
                     private=private, private_logits=logits, round=run.round, split=split,
                     rows=rows)


def heatmap_figure(data: Sequence[HeatmapData]):
  """The Figure: rows = participants; for every run a public and a private column
  (FCCL+ Fig. 8's left and right columns)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  participants = data[0].participants
  num_classes = data[0].public.shape[-1]
  ticks = (range(num_classes) if num_classes <= 10 else
           [int(t) for t in MaxNLocator(nbins=5, integer=True).tick_values(0, num_classes - 1)
            if 0 <= t < num_classes])
  cols = 2 * len(data)
  height = 2.5 * len(participants) + 1.6
  fig, axes = plt.subplots(len(participants), cols, squeeze=False, layout="constrained",
                           figsize=(2.5 * cols + 1.8, height))
  fig.get_layout_engine().set(rect=(0, 0.45 / height, 1, 1 - 0.45 / height))
  image = None
  for d, run in enumerate(data):
    where = {"train": "private data", "test": "own test set"}[run.split]
    for i, name in enumerate(participants):
      for j, (matrix, what) in enumerate(((run.public[i], f"public ({run.public_name})"),
                                          (run.private[i], where))):
        ax = axes[i][2 * d + j]
        image = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.tick_params(labelsize=7)
        ax.set_title(f"{run.run}\n{name}, {what}", fontsize=8)
        if 2 * d + j == 0:
          ax.set_ylabel(f"{name}: its logit u", fontsize=8)
        if i == len(participants) - 1:
          ax.set_xlabel("mean logit v", fontsize=8)
  bar = fig.colorbar(image, ax=axes, shrink=0.9)
  bar.set_label("cross-correlation M_i[u, v]", fontsize=9)
  rounds = sorted({run.round for run in data})
  fig.suptitle("Cross-correlation of each participant's logits with the participants' mean "
               "logits, on the public data and on the participant's own data\n(FCCL Fig. 5, "
               f"FCCL+ Fig. 8; round {', '.join(map(str, rounds))})", fontsize=10)
  fig.text(0.5, 0.05 / height, HEATMAP_CAPTION, ha="center", va="bottom", fontsize=8)
  return fig


# --- Figure 3: the local objective per round ---------------------------------------------------


def local_loss_series(records: Sequence[Mapping[str, Any]], *,
                      source: str | pathlib.Path = "metrics.jsonl"
                      ) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
  """(rounds (R,), {term: {participant: values (R,)}}) of train/local/<term>/<participant>.

  Terms in the order `LOCAL_TERMS` lists them (then any other, alphabetically),
  participants in the order metrics.jsonl writes them; a round without a value
  is NaN. Raises FigureError (naming `source`) when the records hold no
  local-phase metric.
  """
  series: dict[str, dict[str, list[tuple[int, float]]]] = {}
  for record in records:
    for key, value in record.items():
      parts = key.split("/")
      if len(parts) == 4 and parts[:2] == ["train", "local"]:
        series.setdefault(parts[2], {}).setdefault(parts[3], []).append(
            (int(record["round"]), float(value)))
  if not series:
    raise FigureError(f"--workdirs: {str(source)!r} holds no train/local/<term>/<participant> "
                      "metric; the local-loss figure needs a run of a method with a local "
                      "phase (FCCL, FCCL+, SOLO, ...).")
  rounds = np.array(sorted({r for t in series.values() for p in t.values() for r, _ in p}))
  position = {r: i for i, r in enumerate(rounds)}
  order = [t for t in LOCAL_TERMS if t in series] + sorted(set(series) - set(LOCAL_TERMS))
  out = {}
  for term in order:
    out[term] = {}
    for participant, pairs in series[term].items():
      values = np.full(len(rounds), np.nan)
      for r, v in pairs:
        values[position[r]] = v
      out[term][participant] = values
  return rounds, out


def local_loss_figure(runs: Sequence[tuple[str, np.ndarray, Mapping[str, Mapping[str, np.ndarray]]]]):
  """The Figure: rows = runs, columns = terms (L_Loc first), one line per participant."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  terms = []
  for _, _, series in runs:
    terms += [t for t in series if t not in terms]
  fig, axes = plt.subplots(len(runs), len(terms), squeeze=False, layout="constrained",
                           figsize=(4.2 * len(terms) + 0.6, 3.3 * len(runs) + 0.8))
  for r, (label, rounds, series) in enumerate(runs):
    for c, term in enumerate(terms):
      ax = axes[r][c]
      title = f"{label}\n{LOCAL_TERMS.get(term, term)}"
      if term not in series:
        ax.set_title(title, fontsize=9)
        ax.text(0.5, 0.5, f"no train/local/{term}\nfor this method", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="grey")
        ax.set_xticks([])
        ax.set_yticks([])
        continue
      for participant, values in series[term].items():
        ax.plot(rounds, values, marker=".", lw=1.2, label=participant)
      ax.set_title(title, fontsize=9)
      ax.set_xlabel("communication round")
      ax.set_ylabel(f"train/local/{term}", fontsize=8)
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7, title="participant", title_fontsize=7)
  fig.suptitle("Local objective per round and its terms (FCCL Fig. 6b), one line per "
               "participant;\neach value is the mean over the round's local steps", fontsize=11)
  return fig


def save(fig: Any, path: str | pathlib.Path) -> pathlib.Path:
  """Saves `fig` as a PNG (dpi 120) and closes it."""
  plt = _pyplot()
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path

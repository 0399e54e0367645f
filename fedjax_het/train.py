"""`train_and_evaluate(config, workdir)`: one federated run, end to end.

The data flows one way: config -> scenario data (numpy) -> architecture groups
and stacked client arrays -> algorithm (pure functions) -> engine (jit, vmap,
scan, optional sharding) -> metrics, checkpoints, plots.

Artefacts in `workdir`:
  config.json       the resolved config
  metadata.json     data provenance (real / TFDS / synthetic, substitutions),
                    participants, groups, devices, versions
  metrics.jsonl     one record per round: train/<phase>/<loss>/<client>,
                    eval/intra|inter/<client>, eval/intra|inter/mean,
                    time/round_secs
  results.md/.json  the FCCL+ Table VIII/IX layout (mean of the last rounds)
  checkpoints/      orbax checkpoints; a restarted run resumes from the latest
  accuracy.png, cross_correlation.png, cross_correlation.npz   figures
  tensorboard/      when tensorboardX is installed
"""

from __future__ import annotations

import json
import logging
import pathlib
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import checkpointing, data as data_lib, losses, models, plots, reporting
from fedjax_het.algorithms import ALGORITHMS
from fedjax_het.algorithms.base import FederatedArrays, Setup, normalizer
from fedjax_het.config import validate_config
from fedjax_het.engine import rounds, sharding
from fedjax_het.engine.clients import group_clients, scatter_to_participants, stack_group_data
from fedjax_het.evaluation import intra_inter, stack_test_sets


def resolve_conv_impl(conv_impl: str) -> str:
  """'auto' -> 'im2col' on CPU (avoids the conv-gradient-in-scan slowdown), else 'xla'."""
  if conv_impl != "auto":
    return conv_impl
  return "im2col" if jax.default_backend() == "cpu" else "xla"


def available_memory_bytes(device: Any) -> int | None:
  """Memory a jitted round may use on `device`: the accelerator's limit, else Linux MemAvailable."""
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  if device.platform == "cpu":
    try:
      for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
    except OSError:
      return None
  return None


def check_round_memory(compiled: Any, config: ml_collections.ConfigDict,
                       available: int | None) -> int:
  """Raises before training when XLA's memory analysis says a round cannot fit.

  Returns the estimated bytes (temporaries + outputs of one `run_rounds` call).
  A round that needs more than the available memory would otherwise fail with
  RESOURCE_EXHAUSTED only after minutes of compilation (e.g. the full-width
  paper config on a 32 GB CPU machine).
  """
  analysis = compiled.memory_analysis()
  if analysis is None:
    return 0
  need = int(analysis.temp_size_in_bytes) + int(analysis.output_size_in_bytes)
  if config.memory_check and available is not None and need > available:
    gib = 2.0 ** 30
    raise MemoryError(
        f"config {config.name!r} needs about {need / gib:.1f} GiB for one round (XLA memory "
        f"analysis) but {available / gib:.1f} GiB is available on {jax.default_backend()}. "
        f"Lower config.collaborative.batch_size ({config.collaborative.batch_size}), "
        f"config.local.batch_size ({config.local.batch_size}) or config.models.width "
        f"({config.models.width}), use config.models.conv_impl='xla' (less memory, slower "
        f"on CPU), or run on an accelerator with more memory; config.memory_check=False skips "
        f"this check.")
  return need


def _client_names(domains: list[str]) -> list[str]:
  """Participant labels: the domain name, suffixed with the index when repeated."""
  repeated = {d for d in domains if domains.count(d) > 1}
  return [f"{d}{i}" if d in repeated else d for i, d in enumerate(domains)]


def build_scenario(config: ml_collections.ConfigDict) -> data_lib.Scenario:
  sc = config.scenario
  return data_lib.build_scenario(
      sc.name, data_dir=sc.data_dir or None, sources=dict(sc.sources) or None,
      synthetic_fallback=bool(sc.synthetic_fallback),
      private_sizes=dict(sc.private_sizes) or None, test_size=int(sc.test_size) or None,
      public_name=sc.public_name, public_size=int(sc.public_size), seed=int(config.seed),
      domains=tuple(sc.domains) or None)


class Experiment:
  """A configured run: data, groups, algorithm and jitted functions (no state)."""

  def __init__(self, config: ml_collections.ConfigDict, *, mesh: Any = None):
    validate_config(config)
    self.config = config
    self.scenario = build_scenario(config)
    scenario = self.scenario
    archs = list(config.models.architectures)
    k = len(scenario.train)
    if len(archs) != k:
      raise ValueError(f"config.models.architectures has {len(archs)} entries but scenario "
                       f"{scenario.name!r} has {k} participants ({scenario.domains}).")
    self.conv_impl = resolve_conv_impl(config.models.conv_impl)
    width = float(config.models.width)
    self.mesh = mesh
    slot_multiple = mesh.devices.size if mesh is not None else 1
    modules = [models.get_model(a, scenario.num_classes, width=width, conv_impl=self.conv_impl)
               for a in archs]
    self.groups = group_clients(archs, modules, slot_multiple=slot_multiple)
    self.client_names = _client_names(list(scenario.domains))
    self.test_domains = list(dict.fromkeys(scenario.test))
    self.client_domain_index = [self.test_domains.index(d) for d in scenario.domains]
    images = [s.images for s in scenario.train]
    labels = [s.labels for s in scenario.train]
    group_data = {g.name: stack_group_data(g, images, labels, num_participants=k)
                  for g in self.groups}
    test = stack_test_sets(self.test_domains, {d: scenario.test[d].images for d in scenario.test},
                           {d: scenario.test[d].labels for d in scenario.test})
    self.setup = Setup(
        groups=self.groups, num_participants=k, num_classes=scenario.num_classes,
        num_rounds=int(config.num_rounds),
        max_sizes={name: d.images.shape[1] for name, d in group_data.items()},
        private_mean=tuple(scenario.private_mean), private_std=tuple(scenario.private_std),
        public_mean=tuple(scenario.public_mean), public_std=tuple(scenario.public_std),
        max_test_size=int(test.images.shape[1]))
    self.algorithm = ALGORITHMS[config.algorithm](config, self.setup)
    arrays = FederatedArrays(groups=group_data, public=scenario.public, test=test)
    if mesh is not None:
      self.data = sharding.put(arrays, sharding.data_shardings(arrays, mesh))
    else:
      self.data = jax.device_put(arrays)
    col = config.collaborative
    round_fn = rounds.make_round_fn(
        self.algorithm, public_batch_size=min(int(col.batch_size), max(len(scenario.public), 2)),
        public_epochs=int(col.epochs), num_public=len(scenario.public),
        public_prepare=rounds.public_pipeline(col.augmentation, scenario.public_mean,
                                              scenario.public_std, crop=col.crop),
        name=f"round:{config.name}")
    self.round_fn = round_fn
    calls = rounds.make_run_rounds(round_fn, int(config.rounds_per_call))
    init = lambda key, d: rounds.initial_state(self.algorithm, key, d)  # noqa: E731
    self._state_shardings = None
    if mesh is None:
      self._init, self.run_rounds = jax.jit(init), jax.jit(calls)
    else:
      abstract = jax.eval_shape(init, jax.random.key(0), self.data)
      self._state_shardings = sharding.state_shardings(abstract, mesh)
      self._init = jax.jit(init, out_shardings=self._state_shardings)
      self.run_rounds = jax.jit(calls, out_shardings=(self._state_shardings, None))
    self.evaluate = jax.jit(self.algorithm.evaluate)
    self._heatmap = jax.jit(self._cross_correlation)

  def compile_rounds(self, state: Any) -> Any:
    """The compiled `run_rounds` for this state's shapes (traces once; uses the cache)."""
    return self.run_rounds.lower(state, self.data).compile()

  def init_state(self) -> Any:
    return self._init(jax.random.key(int(self.config.seed)), self.data)

  def abstract_state(self) -> Any:
    """Shapes, dtypes and (with a mesh) shardings of the state: the checkpoint restore target."""
    like = jax.eval_shape(self.init_state)
    if self._state_shardings is None:
      return like
    return jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), like,
        self._state_shardings)

  def _cross_correlation(self, state):
    """M_i of every participant vs the participants' mean logits on a fixed public batch."""
    n = min(int(self.config.collaborative.batch_size), self.data.public.shape[0])
    images = normalizer(self.setup.public_mean, self.setup.public_std)(self.data.public[:n])
    logits = {}
    for group in self.groups:
      variables = state["groups"][group.name]["variables"]
      logits[group.name] = jax.vmap(
          lambda v: models.apply_model(group.model, v, images, train=False)[1])(variables)
    target = sum(jnp.sum(z[:g.num_clients], axis=0) for g, z in
                 zip(self.groups, logits.values())) / self.setup.num_participants
    return {name: jax.vmap(lambda z: losses.cross_correlation_matrix(
        logits=z, target_logits=target))(z) for name, z in logits.items()}

  def cross_correlation(self, state) -> np.ndarray:
    """(K, C, C) cross-correlation matrices in participant order."""
    per_group = jax.device_get(self._heatmap(state))
    return scatter_to_participants(self.groups, per_group, self.setup.num_participants)

  def evaluation_record(self, state) -> dict[str, float]:
    """eval/intra|inter/<client> and their means, from one evaluation."""
    accuracy = scatter_to_participants(self.groups, jax.device_get(self.evaluate(state, self.data.test)),
                                       self.setup.num_participants)
    intra, inter = intra_inter(accuracy, self.client_domain_index)
    record = {}
    for name, a, e in zip(self.client_names, intra, inter):
      record[f"eval/intra/{name}"] = float(a)
      record[f"eval/inter/{name}"] = float(e)
    record["eval/intra/mean"] = float(np.mean(intra))
    record["eval/inter/mean"] = float(np.nanmean(inter)) if np.any(np.isfinite(inter)) else 0.0
    return record

  def train_records(self, metrics: Any, num_rounds: int) -> list[dict[str, float]]:
    """Per-round train/<phase>/<metric>/<client> records from stacked round metrics."""
    metrics = jax.device_get(metrics)
    records = [{} for _ in range(num_rounds)]
    for phase, per_group in metrics.items():
      names = next(iter(per_group.values())).keys()
      for metric in names:
        stacked = {g: np.asarray(v[metric]) for g, v in per_group.items()}  # (rounds, slots)
        for r in range(num_rounds):
          values = scatter_to_participants(self.groups, {g: s[r] for g, s in stacked.items()},
                                           self.setup.num_participants)
          for name, value in zip(self.client_names, values):
            records[r][f"train/{phase}/{metric}/{name}"] = float(value)
    return records

  def metadata(self) -> dict[str, Any]:
    sc = self.scenario
    return {
        "scenario": sc.name, "domains": list(sc.domains), "sources": dict(sc.sources),
        "substituted_by_synthetic": list(sc.substituted),
        "train_sizes": {n: int(len(s.labels)) for n, s in zip(self.client_names, sc.train)},
        "test_sizes": {d: int(len(sc.test[d].labels)) for d in sc.test},
        "public_size": int(len(sc.public)),
        "participants": [{"name": n, "domain": d, "architecture": a} for n, d, a in
                         zip(self.client_names, sc.domains, self.config.models.architectures)],
        "groups": {g.name: {"clients": list(g.clients), "slots": g.num_slots} for g in self.groups},
        "conv_impl": self.conv_impl, "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
        "python": platform.python_version(),
    }


def _log_data_provenance(scenario: data_lib.Scenario) -> None:
  for domain, source in scenario.sources.items():
    logging.info("data %-10s <- %s", domain, source)
  if scenario.substituted:
    banner = "!" * 78
    logging.warning("%s\nSYNTHETIC DATA SUBSTITUTED for %s (real source unavailable; see "
                    "metadata.json). Results are NOT comparable with the paper.\n%s",
                    banner, ", ".join(scenario.substituted), banner)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, mesh: Any = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming from its latest checkpoint) and evaluates.

  Args:
    config: an experiment config (see `fedjax_het.config.base_config`).
    workdir: output directory.
    mesh: optional device mesh (`engine.sharding.client_mesh`); by default one
      is built when `config.sharding.num_devices != 1`.

  Returns:
    {"results": the final table numbers, "last_record": the last metrics
    record, "records": all records}.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if config.compilation_cache_dir:
    # XLA compilation of a heterogeneous round takes minutes on a CPU; cache it across runs.
    jax.config.update("jax_compilation_cache_dir",
                      str(pathlib.Path(config.compilation_cache_dir).expanduser()))
  if mesh is None and config.sharding.num_devices != 1:
    mesh = sharding.client_mesh(config.sharding.num_devices or None)
  experiment = Experiment(config, mesh=mesh)
  _log_data_provenance(experiment.scenario)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
  (workdir / "metadata.json").write_text(json.dumps(experiment.metadata(), indent=2) + "\n")

  writer = reporting.MetricsWriter(workdir, tensorboard=bool(config.logging.tensorboard))
  checkpointer = checkpointing.Checkpointer(workdir / "checkpoints", keep=int(config.checkpoint.keep))
  start = checkpointer.latest_round()
  if start is None:
    start, state = 0, experiment.init_state()
    checkpointer.save(0, state)
  else:
    state = checkpointer.restore(start, experiment.abstract_state())
    logging.info("resumed from the checkpoint of round %d in %s", start, workdir)
  records = writer.truncate_after(start)

  num_rounds, per_call = int(config.num_rounds), int(config.rounds_per_call)
  heatmap_rounds = {int(r) for r in config.logging.heatmap_rounds if 0 < int(r) <= num_rounds}
  heatmap_file = workdir / "cross_correlation.npz"
  heatmaps = dict(np.load(heatmap_file)) if heatmap_file.exists() and start else {}
  heatmaps = {int(k.split("_")[1]): v for k, v in heatmaps.items()} if heatmaps else {}
  progress = reporting.Progress(num_rounds, enabled=bool(config.logging.progress), start=start)
  done = start
  if done < num_rounds:
    tick = time.perf_counter()
    run_rounds = experiment.compile_rounds(state)
    need = check_round_memory(run_rounds, config, available_memory_bytes(jax.devices()[0]))
    logging.info("compiled the round in %.1f s; it needs about %.2f GiB (XLA memory analysis)",
                 time.perf_counter() - tick, need / 2.0 ** 30)
  while done < num_rounds:
    tick = time.perf_counter()
    state, metrics = run_rounds(state, experiment.data)
    jax.block_until_ready(state)
    seconds = (time.perf_counter() - tick) / per_call
    new_records = experiment.train_records(metrics, per_call)
    done += per_call
    for offset, record in enumerate(new_records):
      record["round"] = done - per_call + offset + 1
      record["time/round_secs"] = seconds
    last = new_records[-1]
    if done % int(config.eval.every) == 0 or done == num_rounds:
      last.update(experiment.evaluation_record(state))
    if heatmap_rounds & set(range(done - per_call + 1, done + 1)):
      heatmaps[done] = experiment.cross_correlation(state)
      np.savez(heatmap_file, **{f"round_{r}": m for r, m in heatmaps.items()})
    for record in new_records:
      writer.write(record)
      records.append(record)
    if done % int(config.checkpoint.every) == 0 or done == num_rounds:
      checkpointer.save(done, state)
    shown = (f"intra {last['eval/intra/mean']:.1f} inter {last['eval/inter/mean']:.1f}"
             if "eval/intra/mean" in last else "")
    progress.update(done, shown)
  checkpointer.close()
  writer.close()

  table, numbers = reporting.results_table(records, experiment.client_names,
                                           last_rounds=int(config.eval.last_rounds),
                                           method=config.algorithm)
  substituted = experiment.scenario.substituted
  note = (f"\n\nSynthetic data substituted for: {', '.join(substituted)} "
          "(see metadata.json).\n" if substituted else "\n")
  (workdir / "results.md").write_text(
      f"# {config.name}: mean of the last {config.eval.last_rounds} evaluated rounds\n\n"
      f"{table}{note}")
  (workdir / "results.json").write_text(json.dumps(numbers, indent=2) + "\n")
  logging.info("results (mean of the last %d evaluated rounds):\n%s", config.eval.last_rounds,
               table)
  if config.logging.plots:
    plots.plot_accuracy_curves(records, experiment.client_names, workdir / "accuracy.png",
                               title=config.name)
    plots.plot_cross_correlation(heatmaps, experiment.client_names,
                                 workdir / "cross_correlation.png")
  return {"results": numbers, "last_record": records[-1] if records else {}, "records": records}

"""`Experiment`: a domain or partitioned run built from its config (data, groups, method, programs).

What `fedjax_het.train.train_and_evaluate` runs for every scenario but the
class-incremental task stream (`fedjax_het.stream_experiment`): config ->
scenario data (numpy, `build_scenario`) -> architecture groups and stacked
client arrays -> the algorithm (pure functions, looked up by
`config.algorithm`) -> the jitted round, evaluation and diagnostics (engine:
jit, vmap, scan, optional sharding). No state lives here: the trainer's loop
holds it.

What the loop asks of a run (`Experiment` and `StreamExperiment` alike):
`run_record`, `metadata`, `num_rounds`, `init_state`, `restore_state`,
`compile_all`, `with_convs`, `train_records`, `is_eval_round`,
`evaluation_record`, `is_checkpoint_round`, `progress_text`, `results`, `plot`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from fedjax_het import checkpointing, data as data_lib, models, plots, reporting
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import get_method
from fedjax_het.config import validate_config
from fedjax_het.engine import rounds, sharding
from fedjax_het.engine.api import FederatedArrays, Setup
from fedjax_het.engine.clients import group_clients, scatter_to_participants, stack_group_data
from fedjax_het.errors import ConfigError
from fedjax_het.evaluation import intra_inter, stack_test_sets
from fedjax_het.runtime import compiler as compiler_lib
from fedjax_het.runtime import resources
from fedjax_het.runtime.resources import resolve_conv_impl, resolve_public_conv_impl


def _client_names(domains: list[str]) -> list[str]:
  """Participant labels: the domain name, suffixed with the index when repeated."""
  repeated = {d for d in domains if domains.count(d) > 1}
  return [f"{d}{i}" if d in repeated else d for i, d in enumerate(domains)]


def build_scenario(config: ml_collections.ConfigDict) -> data_lib.Scenario:
  """The scenario of `config.scenario`: a domain-shift scenario or a partitioned dataset."""
  sc = config.scenario
  if sc.name == "partitioned":
    from fedjax_het.data import partitioned  # pylint: disable=g-import-not-at-top
    return partitioned.build_partitioned_scenario(
        sc.dataset, num_clients=int(sc.num_clients), partition=sc.partition,
        dirichlet_alpha=float(sc.dirichlet_alpha), shards_per_client=int(sc.shards_per_client),
        source=sc.dataset_source, data_dir=sc.data_dir or None,
        synthetic_fallback=bool(sc.synthetic_fallback), train_size=int(sc.train_size) or None,
        test_size=int(sc.test_size) or None, seed=int(config.seed),
        public_name=sc.public_name, public_size=int(sc.public_size),
        public_normalization=sc.public_normalization)
  return data_lib.build_scenario(
      sc.name, data_dir=sc.data_dir or None, sources=dict(sc.sources) or None,
      synthetic_fallback=bool(sc.synthetic_fallback),
      private_sizes=dict(sc.private_sizes) or None, test_size=int(sc.test_size) or None,
      public_name=sc.public_name, public_size=int(sc.public_size), seed=int(config.seed),
      domains=tuple(sc.domains) or None, office_test=sc.get("office_test", "held_out"),
      public_normalization=sc.public_normalization)


def _size_field(config: ml_collections.ConfigDict, domain: str) -> str:
  """The config field that sets a participant's private data size."""
  if config.scenario.name == "partitioned":
    return "scenario.train_size / scenario.num_clients"
  return f"scenario.private_sizes.{domain}"


def check_data_sizes(config: ml_collections.ConfigDict, scenario: data_lib.Scenario,
                     client_names: list[str]) -> None:
  """Checks the batch sizes against the data before anything compiles.

  Raises `ConfigError` for a local batch larger than every participant's data
  (which would only fail, or exhaust memory, minutes into compilation); warns,
  naming the field, for participants with fewer rows than a batch or than
  classes, and for a public batch larger than the public set (it is clamped).
  """
  sizes = [int(len(split.labels)) for split in scenario.train]
  if "local" in config and sizes:
    batch = int(config.local.batch_size)
    if batch > max(sizes):
      raise ConfigError(
          f"config.local.batch_size must be at most the largest participant's data "
          f"({max(sizes)} rows), got {batch}.")
    small = [(n, d, s) for n, d, s in zip(client_names, scenario.domains, sizes) if s < batch]
    if small:
      shown = ", ".join(f"{n} ({s})" for n, _, s in small[:5]) + (" ..." if len(small) > 5 else "")
      logging.warning("%d participant(s) hold fewer rows than config.local.batch_size=%d, so "
                      "each of their epochs is one partial batch: %s (set by config.%s).",
                      len(small), batch, shown, _size_field(config, small[0][1]))
  tiny = [(n, d, s) for n, d, s in zip(client_names, scenario.domains, sizes)
          if s < scenario.num_classes]
  if tiny:
    shown = ", ".join(f"{n} ({s})" for n, _, s in tiny[:5]) + (" ..." if len(tiny) > 5 else "")
    logging.warning("%d participant(s) hold fewer rows than the %d classes, so they cannot see "
                    "every class: %s (set by config.%s).", len(tiny), scenario.num_classes,
                    shown, _size_field(config, tiny[0][1]))
  public = int(len(scenario.public))
  if "collaborative" in config and public and int(config.collaborative.batch_size) > public:
    logging.warning("config.collaborative.batch_size=%d is larger than the public set (%d "
                    "images, config.scenario.public_size): batches of %d are used.",
                    int(config.collaborative.batch_size), public, max(public, 2))


def averaged_rounds_text(rounds: Sequence[int]) -> str:
  """What results.md's numbers are: "round 1", "the mean of rounds 3, 4 and 5"."""
  rounds = [int(r) for r in rounds]
  if not rounds:
    return "no evaluated round"
  if len(rounds) == 1:
    return f"round {rounds[0]}"
  return f"the mean of rounds {', '.join(map(str, rounds[:-1]))} and {rounds[-1]}"


class Experiment:
  """A configured run: data, groups, algorithm and jitted functions (no state)."""

  def __init__(self, config: ml_collections.ConfigDict, *, mesh: Any = None,
               conv_impl: str | None = None, public_conv_impl: str | None = None,
               scenario: data_lib.Scenario | None = None):
    """`conv_impl` and `public_conv_impl` (im2col / xla / custom_vjp) override
    `config.models.conv_impl` and `config.models.public_conv_impl`; `scenario`
    reuses data already built for `config` (else `build_scenario(config)`)."""
    validate_config(config)
    self.config = config
    self.scenario = scenario if scenario is not None else build_scenario(config)
    scenario = self.scenario
    self.client_names = _client_names(list(scenario.domains))
    check_data_sizes(config, scenario, self.client_names)
    archs = list(config.models.architectures)
    k = len(scenario.train)
    if len(archs) == 1:  # one architecture for every participant
      archs = archs * k
    if len(archs) != k:
      raise ConfigError(f"config.models.architectures has {len(archs)} entries but scenario "
                        f"{scenario.name!r} has {k} participants ({scenario.domains}).")
    self.conv_impl = conv_impl or resolve_conv_impl(config.models.conv_impl)
    self.public_conv_impl = public_conv_impl or resolve_public_conv_impl(
        config.models.public_conv_impl, self.conv_impl)
    width = float(config.models.width)
    self.mesh = mesh
    slot_multiple = mesh.devices.size if mesh is not None else 1

    def build(impl):
      return [models.get_model(a, scenario.num_classes, width=width, conv_impl=impl,
                               compute_dtype=config.models.compute_dtype) for a in archs]

    modules = build(self.conv_impl)
    public_modules = (build(self.public_conv_impl) if self.public_conv_impl != self.conv_impl
                      else None)
    self.architectures = archs
    self.groups = group_clients(archs, modules, slot_multiple=slot_multiple,
                                public_models=public_modules)
    self.test_domains = list(dict.fromkeys(scenario.test))
    self.client_domain_index = [self.test_domains.index(d) for d in scenario.domains]
    images = [s.images for s in scenario.train]
    labels = [s.labels for s in scenario.train]
    group_data = {g.name: stack_group_data(g, images, labels, num_participants=k,
                                           pixel_permutations=scenario.pixel_permutations)
                  for g in self.groups}
    test = stack_test_sets(self.test_domains, {d: scenario.test[d].images for d in scenario.test},
                           {d: scenario.test[d].labels for d in scenario.test})
    self.setup = Setup(
        groups=self.groups, num_participants=k, num_classes=scenario.num_classes,
        num_rounds=int(config.num_rounds),
        max_sizes={name: d.images.shape[1] for name, d in group_data.items()},
        private_mean=tuple(scenario.private_mean), private_std=tuple(scenario.private_std),
        public_mean=tuple(scenario.public_mean), public_std=tuple(scenario.public_std),
        max_test_size=int(test.images.shape[1]),
        test_sizes=tuple(int(n) for n in test.sizes))
    self.algorithm = get_method(config.algorithm).make(config, self.setup)
    # E as an argument of the round's programs, not a constant in them (`optim.run_length`).
    arrays = FederatedArrays(groups=group_data, public=scenario.public, test=test,
                             num_rounds=np.int32(config.num_rounds))
    if mesh is not None:
      # Across processes each process builds the same `arrays` (same config and seed) and keeps
      # only the shards of its own devices (device_put to a sharding spanning processes).
      self.data = jax.device_put(arrays, sharding.data_shardings(arrays, mesh))
    else:
      self.data = jax.device_put(arrays)
    init = lambda key, d: rounds.initial_state(self.algorithm, key, d)  # noqa: E731
    self._state_shardings = None
    if mesh is None:
      self._init = jax.jit(init)
    else:
      abstract = jax.eval_shape(init, jax.random.key(0), self.data)
      self._state_shardings = sharding.state_shardings(abstract, mesh)
      self._init = jax.jit(init, out_shardings=self._state_shardings)
    # The round's programs and their compile (trace cache, stage programs, memory policy).
    # What the method's make() read besides the config: data sizes, normalisation statistics,
    # the modules (E is an argument of the round, not in the key), and the convolutions this
    # Experiment chose. The code outside the package that the round runs (its method, its
    # models) is in the trace cache's key under config.trace_cache="on"; "auto" then does not
    # use the cache.
    self.compiler = compiler_lib.RoundCompiler(
        config, self.algorithm, self.data,
        statics={"setup": compiler_lib.statics_text(dataclasses.replace(self.setup,
                                                                        num_rounds=0)),
                 "conv_impl": self.conv_impl, "public_conv_impl": self.public_conv_impl},
        defined_by=[get_method(config.algorithm).make]
        + [m for g in self.groups for m in (g.model, g.public_model) if m is not None],
        group_names=[g.name for g in self.groups], mesh=mesh,
        state_shardings=self._state_shardings)
    # "one": `run_rounds` is the round; "stages": `stage_programs` run it, one per stage;
    # "groups": as "stages", with a stage whose groups are independent split by group
    # (`split_stages`: {stage name: group names}).
    self.round_fn, self.run_rounds = self.compiler.round_fn, self.compiler.run_rounds
    self.round_programs = self.compiler.round_programs
    self.stage_programs, self.split_stages = (self.compiler.stage_programs,
                                              self.compiler.split_stages)
    self.evaluate = jax.jit(self.algorithm.evaluate)
    diagnostics = self.algorithm.diagnostics
    self._diagnostics = jax.jit(diagnostics.compute) if diagnostics is not None else None
    self._evaluate_compiled = self._diagnostics_compiled = None  # set by `compile_all`
    # One test domain: plain accuracy; several: intra/inter-domain accuracy (FCCL+ tables).
    self.accuracy_kinds = ("inter", "intra") if len(self.test_domains) > 1 else ("accuracy",)

  def compile_rounds(self, state: Any) -> Any:
    """The compiled round for this state's shapes (`RoundCompiler.compile_rounds`)."""
    return self.compiler.compile_rounds(state)

  def compile_all(self, state: Any, *, with_diagnostics: bool = True) -> Any:
    """Compiles the round, the evaluation and the diagnostics; returns the round.

    The evaluation and diagnostics executables are kept and used by
    `evaluation_record` / `diagnostics` from then on; they compile in a worker
    thread while the round is traced and lowered (`RoundCompiler.compile_all`:
    the trace cache, the stage programs, then the compiler's freed memory
    handed back to the system).
    """
    return self.compiler.compile_all(
        state, lambda: self._compile_evaluation(state, with_diagnostics))

  def trace_cache_directory(self) -> pathlib.Path | None:
    """Where the round's exported programs are kept (`RoundCompiler.trace_cache_directory`)."""
    return self.compiler.trace_cache_directory()

  def lower_rounds(self, state: Any) -> Any:
    """The round lowered for `state`'s shapes (`RoundCompiler.lower_rounds`)."""
    return self.compiler.lower_rounds(state)

  def _compile_evaluation(self, state: Any, with_diagnostics: bool) -> None:
    self._evaluate_compiled = self.evaluate.lower(state, self.data.test).compile()
    if with_diagnostics and self._diagnostics is not None:
      self._diagnostics_compiled = self._diagnostics.lower(state, self.data).compile()

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

  def restore_state(self, checkpointer: checkpointing.Checkpointer, round_index: int) -> Any:
    """The state saved at `round_index`, placed as a fresh state is.

    Restored arrays come back committed to a device while a fresh run's are
    not; without a mesh that changes the lowered program, hence its
    persistent-cache key, and a resumed run would recompile from scratch.
    """
    state = checkpointer.restore(round_index, self.abstract_state())
    if self.mesh is None:
      state = jax.device_put(jax.device_get(state))
    return state

  def diagnostics(self, state) -> np.ndarray | None:
    """The method's diagnostic arrays (K, ...) in participant order, or None if it has none."""
    if self._diagnostics is None:
      return None
    compute = self._diagnostics_compiled or self._diagnostics
    return self.diagnostics_from(compute(state, self.data))

  def diagnostics_from(self, per_group: Any) -> np.ndarray:
    """{group: (slots, ...)} diagnostic arrays -> (K, ...) in participant order."""
    return scatter_to_participants(self.groups, sharding.fetch(per_group),
                                   self.setup.num_participants)

  # -- what the loop asks of a run (see the module docstring) -----------------------------------

  @property
  def num_rounds(self) -> int:
    return int(self.config.num_rounds)

  @property
  def has_public(self) -> bool:
    return len(self.scenario.public) > 0

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "Experiment":
    """The same run (the same data) with other convolutions (the trainer's memory policy)."""
    return Experiment(self.config, mesh=self.mesh, conv_impl=conv_impl,
                      public_conv_impl=public_conv_impl, scenario=self.scenario)

  def run_record(self) -> dict[str, Any]:
    """run.json: every config field and a fingerprint of the data (the resume guard)."""
    return workdir_lib.run_record(self.config, self.scenario)

  def is_eval_round(self, done: int) -> bool:
    """Whether the trainer evaluates after round `done`: every `eval.every` rounds and each of
    the last `eval.last_rounds` rounds, the ones the results table averages (the papers report
    the mean of the last three rounds), so a sparse `eval.every` keeps the reported metric."""
    last = self.num_rounds - int(self.config.eval.last_rounds)
    every = int(self.config.eval.every)  # 0: the last rounds only
    return (every > 0 and done % every == 0) or done > last

  def is_checkpoint_round(self, done: int) -> bool:
    every = int(self.config.checkpoint.every)  # 0: the last round's only (the trainer's own)
    return every > 0 and done % every == 0

  def progress_text(self, last: dict[str, Any]) -> str:
    """The progress line's accuracies: each kind's mean, those without a number left out (the
    inter-domain mean of a one-domain scenario, e.g. HtFL's, is NaN: no other domain)."""
    values = ((kind, last.get(f"eval/{kind}/mean")) for kind in self.accuracy_kinds)
    return " ".join(f"{kind} {float(value):.1f}" for kind, value in values
                    if value is not None and math.isfinite(float(value)))

  def results(self, records: list[dict[str, Any]], done: int) -> tuple[str, dict[str, Any]]:
    """(results.md, results.json's numbers): the mean of the last evaluated rounds, in the
    FCCL+ Table VIII/IX layout (inter/intra) or as plain test accuracy, and the rounds to
    reach `config.eval.targets`."""
    del done
    config, kinds = self.config, self.accuracy_kinds
    table, numbers = reporting.results_table(records, self.client_names,
                                             last_rounds=int(config.eval.last_rounds),
                                             method=config.algorithm, kinds=kinds)
    targets = [float(t) for t in config.eval.targets]
    if targets and numbers:
      numbers["rounds_to_target"] = {f"{t:g}": rounds_to_target(records, kinds, t)
                                     for t in targets}
      what = "test" if headline_kind(kinds) == "accuracy" else "intra-domain"
      table += "\n\n" + "\n".join(
          f"Rounds to reach {t:g}% mean {what} accuracy: "
          f"{reached if reached is not None else 'not reached in ' + str(self.num_rounds)}."
          for t, reached in zip(targets, numbers["rounds_to_target"].values()))
    substituted = self.scenario.substituted
    note = (f"\n\nSynthetic data substituted for: {', '.join(substituted)} "
            "(see metadata.json).\n" if substituted else "\n")
    protocol = _office_test_line(self.scenario.office_test, int(config.eval.top_k))
    markdown = (f"# {config.name}: {averaged_rounds_text(numbers.get('rounds', []))}"
                f"\n\n{protocol}{table}{note}")
    return markdown, numbers

  def plot(self, records: list[dict[str, Any]], numbers: dict[str, Any],
           workdir: pathlib.Path, diagnostics: Mapping[int, np.ndarray] | None = None) -> None:
    """accuracy.png (accuracy curves) and the method's diagnostics figure, if it has one."""
    del numbers
    plots.plot_accuracy_curves(records, self.client_names, workdir / "accuracy.png",
                               title=self.config.name, kinds=self.accuracy_kinds,
                               num_classes=self.scenario.num_classes)
    if self.algorithm.diagnostics is not None and diagnostics:
      self.algorithm.diagnostics.plot(diagnostics, self.client_names,
                                      workdir / f"{self.algorithm.diagnostics.name}.png")

  def evaluation_record(self, state, done: int | None = None) -> dict[str, float]:
    """eval/<kind>/<client> and eval/<kind>/mean from one evaluation (after round `done`).

    kind is intra/inter (own domain / mean of the other domains) when the
    scenario has several test domains, else accuracy.
    """
    evaluate = self._evaluate_compiled or self.evaluate
    return self.evaluation_from(evaluate(state, self.data.test), done)

  def evaluation_from(self, evaluation: Any, done: int | None = None) -> dict[str, float]:
    """The record of `evaluation_record` from the method's {group: (slots, domains)} accuracy."""
    del done  # the same evaluation after every round
    accuracy = scatter_to_participants(self.groups, sharding.fetch(evaluation),
                                       self.setup.num_participants)
    if self.accuracy_kinds == ("accuracy",):
      per_kind = {"accuracy": np.asarray(accuracy, np.float64)[:, 0]}
    else:
      intra, inter = intra_inter(accuracy, self.client_domain_index)
      per_kind = {"intra": intra, "inter": inter}
    record = {}
    for name_index, name in enumerate(self.client_names):
      for kind in self.accuracy_kinds:
        record[f"eval/{kind}/{name}"] = float(per_kind[kind][name_index])
    for kind in self.accuracy_kinds:
      record[f"eval/{kind}/mean"] = float(np.mean(per_kind[kind]))
    return record

  def train_records(self, metrics: Any, num_rounds: int) -> list[dict[str, float]]:
    """Per-round records from stacked round metrics.

    {phase: {group: {metric: (rounds, slots)}}} gives train/<phase>/<metric>/<client>;
    {phase: {metric: (rounds,)}} (server-side scalars) gives train/<phase>/<metric>. A phase
    whose metrics hold "participated" (1 for the clients a round sampled, 0 for the others: the
    FedAvg family's cohorts) records the other metrics of the round's participants only, so no
    writer sees the zeros of clients that did not train.
    """
    metrics = sharding.fetch(metrics)
    records = [{} for _ in range(num_rounds)]
    group_names = {g.name for g in self.groups}

    def per_client(values, metric, r):
      stacked = {g: np.asarray(v[metric])[r] for g, v in values.items()}  # (slots,)
      return scatter_to_participants(self.groups, stacked, self.setup.num_participants)

    for phase, values in metrics.items():
      if set(values) <= group_names and all(isinstance(v, Mapping) for v in values.values()):
        names = next(iter(values.values())).keys()
        for r in range(num_rounds):
          trained = (per_client(values, "participated", r) if "participated" in names
                     else [1.0] * len(self.client_names))
          for metric in names:
            for name, value, took_part in zip(self.client_names, per_client(values, metric, r),
                                              trained):
              if took_part or metric == "participated":
                records[r][f"train/{phase}/{metric}/{name}"] = float(value)
      else:
        for metric, value in values.items():
          for r in range(num_rounds):
            records[r][f"train/{phase}/{metric}"] = float(np.asarray(value)[r])
    return records

  def metadata(self) -> dict[str, Any]:
    sc = self.scenario
    return {
        "scenario": sc.name, "domains": list(sc.domains), "sources": dict(sc.sources),
        "substituted_by_synthetic": list(sc.substituted),
        "train_sizes": {n: int(len(s.labels)) for n, s in zip(self.client_names, sc.train)},
        "test_sizes": {d: int(len(sc.test[d].labels)) for d in sc.test},
        "public_size": int(len(sc.public)),
        **({"office_test": sc.office_test} if sc.office_test else {}),
        "participants": [{"name": n, "domain": d, "architecture": a} for n, d, a in
                         zip(self.client_names, sc.domains, self.architectures)],
        "groups": {g.name: {"clients": list(g.clients), "slots": g.num_slots} for g in self.groups},
        "conv_impl": self.conv_impl, "public_conv_impl": self.public_conv_impl,
        **resources.runtime_metadata(),
    }


def _office_test_line(office_test: str, top_k: int) -> str:
  """The results.md line saying which Office test protocol (and top-k) the numbers use."""
  if not office_test:
    return ""
  what = {"held_out": "held-out images (i % 10 >= 8 of each domain, never in private data)",
          "whole_domain": "the whole domain, training images included (as the FCCL+ code "
                          "evaluates)"}[office_test]
  return f"Test sets (scenario.office_test={office_test!r}): {what}; top-{top_k} accuracy.\n\n"


def headline_kind(kinds: tuple[str, ...]) -> str:
  """The accuracy a target refers to: plain accuracy, else intra-domain accuracy."""
  return "accuracy" if "accuracy" in kinds else "intra"


def rounds_to_target(records: list[dict[str, Any]], kinds: tuple[str, ...],
                     target: float) -> int | None:
  """The first round whose mean (headline) accuracy is >= target percent, or None."""
  name = f"eval/{headline_kind(kinds)}/mean"
  for record in records:
    if name in record and record[name] >= target:
      return int(record["round"])
  return None

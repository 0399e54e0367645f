"""`train_and_evaluate(config, workdir)`: the one training loop, for every registered method.

The loop is the same for every run; what the run is comes from its config:
`experiment.Experiment` for the domain and partitioned scenarios (FCCL, FCCL+,
the FedAvg family, FedMD, FedDF, RHFL, FedMatch, SOLO),
`stream_experiment.StreamExperiment` for GLFC's class-incremental task stream
(glfc, icarl_fl, fedavg_cil). The loop: the resume guard, init or restore,
compile (with the memory policy of `fedjax_het.runtime.resources`), then rounds in
calls of `config.rounds_per_call` (one jitted `lax.scan`), records, evaluation,
diagnostics and checkpoints when the run asks for them, and the results.

Artefacts in `workdir`:
  run.json          every config field and a fingerprint of the data the run
                    started with: a resume with a different config or data is
                    refused before anything is written (`fedjax_het.workdir`)
  config.json       the resolved config
  metadata.json     data provenance (real / TFDS / synthetic, substitutions),
                    participants, groups, devices, versions
  metrics.jsonl     one record per round: train/<phase>/<metric>/<client> (or
                    train/<phase>/<metric> for server-side scalars),
                    eval/intra|inter/<client> and eval/intra|inter/mean for
                    multi-domain scenarios (eval/accuracy/... for one domain);
                    on the task stream train/loss, task, clients and at evaluated
                    rounds eval/accuracy/seen, eval/accuracy/task_<j>;
                    time/round_secs
  results.md/.json  the FCCL+ Table VIII/IX layout (inter/intra, mean of the last
                    evaluated rounds), plain test accuracy for a single domain,
                    or GLFC's Table 1 layout for the task stream
  checkpoints/      orbax checkpoints of the state, the run's identity and its
                    records up to that round (`fedjax_het.checkpointing`); a
                    restarted run resumes from the latest (bit-identical to an
                    uninterrupted run), checks its identity against it and
                    rebuilds a missing or damaged metrics.jsonl from its records
  accuracy.png      accuracy curves
  <diagnostic>.npz/.png  the method's diagnostics (e.g. FCCL/FCCL+'s
                    cross_correlation) at config.logging.diagnostic_rounds
  tensorboard/, wandb/, mlflow.db  with config.logging.writers naming tensorboard,
                    wandb (offline unless logging.wandb_mode="online") or mlflow (a local
                    SQLite store unless logging.mlflow_tracking_uri names one)

Across processes (`engine.sharding.initialize_distributed`, every process
running `train_and_evaluate` with the same config and workdir): the clients
mesh spans every process's devices, each process builds the same host data
and keeps its own shards of the participants, metrics and evaluations are
gathered to every process (so every process returns the same records), and
only process 0 writes the files above: the loop hands every write to one run writer
(`reporting.create_run_writer`), a no-op writer in the other processes; orbax writes the
checkpoints from every process into the one `checkpoints/` directory (on several hosts it
must be on a filesystem they share).
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import errors, reporting, seed_stack
from fedjax_het.runtime import resources
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import get_method
from fedjax_het.engine import sharding
from fedjax_het.errors import (ConfigError, DivergedError, RoundTooLargeError, RunStopped,
                               StopForced, StorageError, WorkdirError, held_stop,
                               storage_advice, storage_error)
from fedjax_het.experiment import Experiment
from fedjax_het.run_contract import Run, RunBuilder


def build_experiment(config: ml_collections.ConfigDict, *, mesh: Any = None,
                     **overrides: Any) -> RunBuilder:
  """The run `config` describes: a `StreamExperiment` for a class-incremental method, else an
  `Experiment` (`overrides`: conv_impl, public_conv_impl, scenario)."""
  if get_method(config.algorithm).class_incremental:
    from fedjax_het.stream_experiment import StreamExperiment  # pylint: disable=g-import-not-at-top
    return StreamExperiment(config, mesh=mesh, **overrides)
  return Experiment(config, mesh=mesh, **overrides)


def _log_data_provenance(scenario: Any) -> None:
  for domain, source in scenario.sources.items():
    logging.info("data %-10s <- %s", domain, source)
  if scenario.substituted:
    banner = "!" * 78
    logging.warning("%s\nSYNTHETIC DATA SUBSTITUTED for %s (real source unavailable; see "
                    "metadata.json). Results are NOT comparable with the paper.\n%s",
                    banner, ", ".join(scenario.substituted), banner)


def compile_within_memory(run: Run, state: Any, config: ml_collections.ConfigDict,
                          writer: reporting.RunWriter, *, with_diagnostics: bool,
                          leaner_convs_for_seeds: bool = True) -> tuple[Any, Any]:
  """(the run, its compiled round), switching an "auto" CPU run to leaner convolutions while
  the round does not fit (`resources.needs_low_memory_convs`; `writer` writes each lane's
  metadata.json again with them); raises before training when even then it does not
  (`resources.check_round_memory`). `run`: a `seed_stack.SingleRun` or `SeedStack`; with
  `leaner_convs_for_seeds=False` a stack that would need leaner convolutions raises
  `RoundTooLargeError` instead (the runner then trains its seeds one by one, each with the
  faster convolutions)."""
  what = f"the round of {len(run.lanes)} seeds as one program" if len(run.lanes) > 1 else (
      "the round")
  stages = getattr(run.experiment.algorithm, "stages", None)
  if stages:  # what compiles: the method's stage programs beside the evaluation
    what += f" ({', '.join(stage.name for stage in stages)} stages and the evaluation)"
  logging.info("compiling %s: the first run on a machine takes minutes (about 2 on a 2-core CPU "
               "for a quick config), later runs reuse the compilation cache%s. XLA may print "
               "'Very slow compile? If you want to file a bug...' meanwhile: its own note for a "
               "compile past a few minutes, expected on a first run, nothing to report",
               what, f" in {config.compilation_cache_dir}" if config.compilation_cache_dir else "")
  tick = time.perf_counter()
  # The evaluation (and diagnostics) compile now too, beside the round: the first round's
  # time, and so the progress bar's ETA, then count training rounds only.
  run_rounds = run.compile_all(state, with_diagnostics=with_diagnostics)
  available = sharding.primary_bytes(resources.available_memory_bytes(jax.devices()[0]))
  need = resources.estimated_bytes(run_rounds)
  experiment = run.experiment
  while resources.needs_low_memory_convs(config, experiment.conv_impl, need, available):
    if len(run.lanes) > 1 and not leaner_convs_for_seeds:
      raise RoundTooLargeError(
          f"config.seeds: the {len(run.lanes)} seeds as one program need about "
          f"{need / 2.0 ** 30:.1f} GiB of the {available / 2.0 ** 30:.1f} GiB available with "
          f"{experiment.conv_impl} convolutions; train them one by one")
    conv_impl, public_conv_impl = resources.low_memory_conv_impls(
        config, experiment.conv_impl, experiment.public_conv_impl,
        has_public=experiment.has_public)
    logging.warning("the round with %s convolutions (%s on the public batch) needs about %.1f "
                    "GiB of the %.1f GiB available: compiling it again with %s convolutions "
                    "(%s on the public batch; less memory, same parameters; "
                    "config.models.conv_impl='auto')", experiment.conv_impl,
                    experiment.public_conv_impl, need / 2.0 ** 30, available / 2.0 ** 30,
                    conv_impl, public_conv_impl)
    del run_rounds
    run = run.with_convs(conv_impl, public_conv_impl)
    experiment = run.experiment
    run_rounds = run.compile_all(state, with_diagnostics=with_diagnostics)
    need = resources.estimated_bytes(run_rounds)
    writer.metadata(run.lanes)
  need = resources.check_round_memory(run_rounds, config, available)
  logging.info("compiled %s and its evaluation in %.1f s; a round needs about %.2f GiB "
               "(XLA memory analysis)", what, time.perf_counter() - tick, need / 2.0 ** 30)
  return run, run_rounds


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, mesh: Any = None, max_rounds: int | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming from its latest checkpoint) and evaluates.

  Args:
    config: an experiment config (`fedjax_het.config.base_config(algorithm)` or
      a scenario file's `get_config`). With `config.seeds` (e.g. (0, 1, 2)),
      every seed is a run of its own in `<workdir>/seed_<s>/`, all trained as
      one vmapped program (`fedjax_het.seed_stack`).
    workdir: output directory.
    mesh: optional device mesh (`engine.sharding.client_mesh`); by default one
      is built when `config.sharding.num_devices != 1` or when the run spans
      several processes (then over every process's devices).
    max_rounds: stop after this many rounds in total, with a checkpoint there
      (rerunning resumes); None: all of the run's rounds. A multiple of
      `config.rounds_per_call`.

  Returns:
    {"results": the final table numbers, "last_record": the last metrics
    record, "records": all records, "rounds_done": rounds trained, "state":
    the final training state}; with `config.seeds`, {"seeds": {seed: that
    dict}}.
  """
  workdir = pathlib.Path(workdir)
  seeds = tuple(int(s) for s in config.seeds)
  if not seeds:
    return train_lanes([config], [workdir], mesh=mesh, max_rounds=max_rounds)[0]
  workdir_lib.check_workdir(workdir)
  configs = seed_stack.seed_configs(config)
  outs = train_lanes(configs, [workdir / f"seed_{s}" for s in seeds], mesh=mesh,
                     max_rounds=max_rounds)
  return {"seeds": dict(zip(seeds, outs))}


def _common_rounds(checkpointers: list[Any], starts: list[int | None],
                   workdirs: list[pathlib.Path]) -> list[int]:
  """The checkpoint rounds every lane keeps, newest first ([] for a fresh run). A kill between
  two lanes' saves leaves some a round ahead: they resume from a round they all still keep."""
  if all(s is None for s in starts):
    return []
  common = set.intersection(*[set(c.rounds()) for c in checkpointers])
  if any(s is None for s in starts) or not common:
    raise WorkdirError("config.seeds: the seeds' workdirs hold no common checkpoint ("
                       + ", ".join(f"{w}: {s if s is not None else 'none'}"
                                   for w, s in zip(workdirs, starts))
                       + "); train these seeds as separate runs.")
  return sorted(common, reverse=True)


def train_lanes(configs: list[ml_collections.ConfigDict], workdirs: list[pathlib.Path], *,
                mesh: Any = None, max_rounds: int | None = None,
                leaner_convs_for_seeds: bool = True) -> list[dict[str, Any]]:
  """The one loop: trains one config per workdir (several: seeds of one config, one vmapped
  program, `seed_stack.SeedStack`) and returns each one's `train_and_evaluate` dict."""
  workdirs = [pathlib.Path(w) for w in workdirs]
  config = configs[0]
  for workdir in workdirs:
    workdir_lib.check_workdir(workdir)
  if config.compilation_cache_dir:
    # XLA compilation of a heterogeneous round takes minutes on a CPU; cache it across runs.
    jax.config.update("jax_compilation_cache_dir",
                      str(pathlib.Path(config.compilation_cache_dir).expanduser()))
  stacked = len(configs) > 1
  sharded = config.sharding.num_devices != 1
  if stacked and (mesh is not None or sharded or jax.process_count() > 1):
    raise ConfigError("config.seeds: seeds on one axis run in one process without a device "
                      "mesh (config.sharding.num_devices must be 1).")
  if mesh is None and (sharded or jax.process_count() > 1):
    mesh = sharding.client_mesh(config.sharding.num_devices or None)
  # In a multi-process run every process trains; process 0 alone writes the workdir files:
  # its run writer writes them, the others' writes nothing.
  writer = reporting.create_run_writer(configs, workdirs, primary=sharding.is_primary(),
                                       sync=sharding.barrier)
  # A resumed "auto" run keeps the convolutions its memory fallback chose (the same rounding as
  # before the interruption, and no compile of a round already known not to fit).
  experiments = [build_experiment(c, mesh=mesh, **resources.recorded_conv_impls(w, c))
                 for c, w in zip(configs, workdirs)]
  for experiment in experiments:
    _log_data_provenance(experiment.scenario)
  run = seed_stack.SeedStack(experiments) if stacked else seed_stack.SingleRun(experiments[0])
  num_rounds, per_call = run.experiment.num_rounds, int(config.rounds_per_call)
  stop = num_rounds if max_rounds is None else min(int(max_rounds), num_rounds)
  if stop % per_call:
    raise ValueError(f"train_and_evaluate: `max_rounds`={max_rounds} must be a multiple of "
                     f"config.rounds_per_call={per_call}.")
  # One process per workdir: process 0 takes each workdir's lock once its resume guard has
  # passed and holds it until this function returns (or the process dies); the others learn
  # whether it got the lock, so a held workdir stops every process at once.
  with contextlib.ExitStack() as locks:
    return _train_locked(run, configs, workdirs, writer=writer, stop=stop, locks=locks,
                         leaner_convs_for_seeds=leaner_convs_for_seeds)


def _train_locked(run: Run, configs: list[ml_collections.ConfigDict],
                  workdirs: list[pathlib.Path], *, writer: reporting.RunWriter, stop: int,
                  locks: contextlib.ExitStack,
                  leaner_convs_for_seeds: bool = True) -> list[dict[str, Any]]:
  """The loop of `train_lanes` up to round `stop`; the workdirs' locks enter `locks`."""
  config, experiment, stacked = configs[0], run.experiment, len(configs) > 1
  experiments = run.lanes
  num_rounds, per_call = experiment.num_rounds, int(config.rounds_per_call)
  # Nothing is written to a workdir before the resume guard has passed. Each checkpoint
  # carries its run's identity and records (`fedjax_het.checkpointing`).
  identities = [e.run_record() for e in experiments]
  opened = [workdir_lib.open_run(
      w, c, identity, e.metadata(), primary=writer.primary, sync=sharding.barrier,
      before_write=lambda w=w: locks.enter_context(workdir_lib.WorkdirLock(w)),
      share=sharding.primary_text, num_rounds=num_rounds)
            for c, w, e, identity in zip(configs, workdirs, experiments, identities)]
  checkpointers = [c for c, _ in opened]
  writer.remove_unfinished(checkpointers)  # the lock is held: no other process writes them
  kept_rounds = _common_rounds(checkpointers, [s for _, s in opened], workdirs)
  writer.open_metrics()  # one metrics writer per lane (the others read what process 0 keeps)
  if not kept_rounds:  # round 0's checkpoint is written in the loop's `try` below
    start, state, saved = 0, run.init_state(), [None] * len(workdirs)
  else:
    start, state = _restore(run, checkpointers, kept_rounds, workdirs, writer)
    saved = [_saved_records(checkpointer, start, metrics)
             for checkpointer, metrics in zip(checkpointers, writer.metrics)]
    logging.info("resumed from the checkpoint of round %d in %s", start,
                 ", ".join(map(str, workdirs)))
  # The records up to `start`: the checkpoint's (metrics.jsonl is rebuilt from them when it
  # is missing or damaged), or metrics.jsonl's for a checkpoint without records; the other
  # processes read them once process 0 has rewritten them.
  records = writer.resume(start, saved)
  # What metrics.jsonl holds (strict JSON), saved with every checkpoint.
  logged = [[reporting.json_record(r) for r in lane] for lane in records]

  diagnostics = experiment.algorithm.diagnostics
  if diagnostics is not None and not experiment.has_public:
    diagnostics = None  # drawn on the public batch (engine.api.Diagnostics): none to draw on
  diagnostic_rounds = {int(r) for r in config.logging.diagnostic_rounds
                       if 0 < int(r) <= num_rounds} if diagnostics is not None else set()
  saved = [_load_diagnostics(w / f"{diagnostics.name}.npz") if diagnostics and start else {}
           for w in workdirs]
  done, progress, ended, in_flight = start, None, None, False
  try:
    if not kept_rounds:
      with held_stop():  # a stop signal waits until the write is started
        for lane, checkpointer in enumerate(checkpointers):
          checkpointer.save(0, run.lane_state(state, lane),
                            {"identity": identities[lane], "records": []})
    if done < stop:
      run, run_rounds = compile_within_memory(run, state, config, writer,
                                               with_diagnostics=bool(diagnostic_rounds),
                                               leaner_convs_for_seeds=leaner_convs_for_seeds)
      experiment, experiments = run.experiment, run.lanes
    # Made after compiling: its rate and ETA count training rounds only.
    progress = writer.progress(num_rounds, start=start, enabled=bool(config.logging.progress))
    while done < stop:
      errors.raise_dropped_stop()  # a stop a finalizer dropped (compiling, the last round)
      tick = time.perf_counter()
      in_flight = True
      state, metrics = run_rounds(state, run.data)
      wait_interruptibly(state)
      in_flight = False
      # A checkpoint write that failed in the background stops the run here, before the
      # records of another round are written.
      for checkpointer in checkpointers:
        checkpointer.check()
      seconds = (time.perf_counter() - tick) / per_call
      new_records = [[{"round": done + offset + 1, **record, "time/round_secs": seconds}
                      for offset, record in enumerate(lane)]
                     for lane in run.train_records(metrics, per_call)]
      done += per_call
      diverged = _nonfinite(new_records, state, experiments)
      if experiment.is_eval_round(done):
        for lane, record in zip(new_records, run.evaluation_records(state, done)):
          lane[-1].update(record)
      if diagnostic_rounds & set(range(done - per_call + 1, done + 1)):
        for lane, values in enumerate(run.diagnostics(state)):
          saved[lane][done] = values
          writer.diagnostics(lane, diagnostics.name, saved[lane])
      for lane, lane_records in enumerate(new_records):
        for record in lane_records:
          logged[lane].append(writer.write(lane, record))
          records[lane].append(record)
      if diverged is not None:
        message = f"{diverged} (config.on_nonfinite={config.on_nonfinite!r})"
        if config.on_nonfinite == "stop":
          raise DivergedError(f"{message}: training stopped; the last finite checkpoint is round "
                              f"{checkpointers[0].latest_round()}. Lower the learning rate (or "
                              "set config.on_nonfinite='warn' to train on).")
        logging.warning("%s: training goes on", message)
      if experiment.is_checkpoint_round(done) or done == stop:
        with held_stop():  # a stop signal waits until the write is started
          for lane, checkpointer in enumerate(checkpointers):
            checkpointer.save(done, run.lane_state(state, lane),
                              {"identity": identities[lane], "records": logged[lane]})
      progress.update(done, experiment.progress_text(new_records[0][-1]))
  except (KeyboardInterrupt, StorageError, OSError) as error:  # a stop signal, the storage
    ended = error
    if isinstance(error, KeyboardInterrupt):
      errors.stop_handled()
  except BaseException:
    if progress is not None:
      progress.close()
    _close_all(checkpointers, writer, wait=True)  # its own error is the one to report
    raise
  if progress is not None:
    progress.close()
  # However the loop ends: the checkpoint write under way finishes (a stop signal meanwhile
  # is held; a second one discards it), the records are flushed.
  closed = _close_all(checkpointers, writer, wait=not isinstance(ended, StopForced),
                      stopping=isinstance(ended, KeyboardInterrupt))
  if isinstance(closed, OSError):  # an operating-system error that names no errno
    raise closed
  if isinstance(ended, OSError):
    if storage_error(ended) is None:
      raise ended
    ended = storage_error(ended)
  failure = next((e for e in (ended, closed) if isinstance(e, StorageError)), None)
  if failure is not None:
    raise _storage_stop(failure, checkpointers, writer, done=done) from failure
  stopped = next((e for e in (ended, closed) if isinstance(e, KeyboardInterrupt)), None)
  if stopped is not None:
    checkpoint = _latest_committed(checkpointers)
    forced = any(isinstance(e, StopForced) for e in (ended, closed))
    finished = done == stop and checkpoint == done
    logging.info("stopped after round %d; the latest checkpoint is round %s", done, checkpoint)
    raise RunStopped(done, checkpoint, phase="results" if finished else "training",
                     started=start, discarded=done if forced and checkpoint != done else None,
                     in_flight=in_flight)
  try:
    errors.raise_dropped_stop()
    return _write_results(run, records, writer, saved, done, plots=bool(config.logging.plots),
                          stacked=stacked, state=state)
  except KeyboardInterrupt:
    raise RunStopped(done, _latest_committed(checkpointers), phase="results",
                     started=start) from None


def wait_interruptibly(tree: Any) -> None:
  """`jax.block_until_ready(tree)` that a stop signal cuts short: the wait runs in a daemon
  thread while this (the main) thread waits on an event, which Python interrupts to run a
  signal handler (a round of a mid or paper-scale config takes minutes on a CPU; whether
  `block_until_ready` itself returns to Python for a signal depends on the jaxlib release,
  this wait does on every one). An error of the computation is raised here."""
  finished, failure = threading.Event(), []

  def wait() -> None:
    try:
      jax.block_until_ready(tree)
    except BaseException as error:  # pylint: disable=broad-except (raised in the main thread)
      failure.append(error)
    finished.set()

  threading.Thread(target=wait, name="fedjax_het_round_wait", daemon=True).start()
  while not finished.wait(1.0):
    pass
  if failure:
    raise failure[0]


def _write_results(run: Run, records: list[list[dict[str, Any]]], writer: reporting.RunWriter,
                   diagnostics: list[dict[int, np.ndarray]], done: int, *, plots: bool,
                   stacked: bool, state: Any) -> list[dict[str, Any]]:
  """Each lane's `train_and_evaluate` dict; `writer` writes results.md / results.json (and the
  plots)."""
  results = []
  for lane, lane_experiment in enumerate(run.lanes):
    markdown, numbers = lane_experiment.results(records[lane], done)
    results.append({"results": numbers, "last_record": records[lane][-1] if records[lane] else {},
                    "records": records[lane], "rounds_done": done,
                    "state": run.lane_state(state, lane)})
    writer.results(lane, markdown, numbers,
                   seed=lane_experiment.config.seed if stacked else None)
    if plots:
      writer.plots(lane, lane_experiment, records[lane], numbers, diagnostics[lane])
  return results


def _close_all(checkpointers: list[Any], writer: reporting.RunWriter, *, wait: bool,
               stopping: bool = False) -> BaseException | None:
  """Closes every checkpointer (with `wait`, after the write under way: a stop signal
  meanwhile is held until it ends, a second one cuts it short; with `stopping`, a stop is
  under way and any signal cuts it short) and the run writer. Returns the first
  `StorageError` (a write that failed) or the stop signal held meanwhile, else None."""
  first = None
  try:
    with held_stop(stopping=stopping):
      for checkpointer in checkpointers:
        if not wait:
          continue
        try:
          checkpointer.close()
        except (StorageError, OSError) as error:
          first = first or storage_error(error) or error
      error = writer.close()
      if error is not None:
        first = first or storage_error(error) or error
  except KeyboardInterrupt as error:
    first = first or error
  return first


def _latest_committed(checkpointers: list[Any]) -> int | None:
  """The newest round every lane holds a finished checkpoint of on disk (None: a lane has
  none)."""
  rounds = [set(c.committed_rounds()) for c in checkpointers]
  common = set.intersection(*rounds) if rounds else set()
  return max(common) if common else None


def _storage_stop(error: StorageError, checkpointers: list[Any], writer: reporting.RunWriter,
                  *, done: int) -> StorageError:
  """The error that ends a run whose storage failed, in one line: what failed, where the run
  stands (metrics.jsonl is cut back to the latest checkpoint: no record is left past it) and
  what to do."""
  checkpoint = _latest_committed(checkpointers)
  cut = writer.cut_records(checkpoint)
  advice = storage_advice(error.error_number)
  if checkpoint is None:
    where = f"no checkpoint was written: {advice} and rerun the same command to start the run."
  else:
    retrained = (f" (rounds {checkpoint + 1}-{done} are trained again)" if done > checkpoint + 1
                 else f" (round {done} is trained again)" if done == checkpoint + 1 else "")
    state = (f"metrics.jsonl is cut back to round {checkpoint}, the latest checkpoint" if cut
             else f"the latest checkpoint is round {checkpoint}")
    where = f"{state}: {advice} and rerun the same command to resume from it{retrained}."
  return StorageError(f"{error.reason}; training stopped at round {done}; {where}",
                      path=error.path, error_number=error.error_number)


def _nonfinite(new_records: list[list[dict[str, Any]]], state: Any,
               experiments: list[Any]) -> str | None:
  """What went non-finite in this call (a train metric, else a parameter), or None."""
  for lane, records in enumerate(new_records):
    seed = f"seed {experiments[lane].config.seed}: " if len(new_records) > 1 else ""
    for record in records:
      for name in reporting.nonfinite_names(record):
        return f"{seed}{name} is {record[name]} in round {record['round']}"
  stacked = len(new_records) > 1
  finite = np.atleast_1d(jax.device_get((_finite_per_lane if stacked else _finite)(state)))
  for lane, ok in enumerate(finite):
    if not ok:
      seed = f"seed {experiments[lane].config.seed}: " if stacked else ""
      last = new_records[lane][-1]["round"]
      return f"{seed}a parameter or state entry is not finite after round {last}"
  return None


def _all_finite(state: Any) -> jax.Array:
  """Whether every float of `state` is finite (one bool)."""
  leaves = [x for x in jax.tree_util.tree_leaves(state)
            if jnp.issubdtype(x.dtype, jnp.floating)]
  if not leaves:
    return jnp.asarray(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


_finite = jax.jit(_all_finite)
_finite_per_lane = jax.jit(jax.vmap(_all_finite))   # a state with a leading lane axis


def _saved_records(checkpointer: Any, round_index: int,
                   writer: Any) -> list[dict[str, Any]] | None:
  """The records the checkpoint of `round_index` holds; None if it holds none (or they cannot
  be read: metrics.jsonl is then the record). Records written without the run item's digest
  (an older checkpoint: unverified) never replace a metrics.jsonl that reads cleanly and
  holds the same rounds."""
  try:
    document = checkpointer.run_record(round_index)
  except Exception as error:  # pylint: disable=broad-except
    logging.warning("the records of the checkpoint of round %d cannot be read (%s); "
                    "metrics.jsonl is taken as the record", round_index, type(error).__name__)
    return None
  if document is None or "records" not in document:
    return None
  records = list(document["records"])
  if not checkpointer.verified(document):
    try:
      kept = [r for r in writer.read() if r["round"] <= round_index]
    except (OSError, ValueError, KeyError, TypeError):
      kept = None
    if kept is not None and [r["round"] for r in kept] == [r.get("round") for r in records]:
      if kept != records:
        logging.warning("the records of the checkpoint of round %d carry no digest and differ "
                        "from %s, which reads cleanly: metrics.jsonl is kept", round_index,
                        writer.path)
      return None
  return records


def _restore(run: Run, checkpointers: list[Any], kept_rounds: list[int],
             workdirs: list[pathlib.Path], writer: reporting.RunWriter) -> tuple[int, Any]:
  """(round, state) of the newest of `kept_rounds` (newest first) every lane can restore. The
  newer checkpoints that cannot be restored are then moved to `checkpoints/unreadable/` by
  `writer` (process 0; one warning each, naming where); when none can be restored, none is
  moved and `WorkdirError` lists them."""
  where = ", ".join(map(str, workdirs))
  failed = []
  for round_index in kept_rounds:
    try:
      state = run.join(checkpointers, round_index)
    except Exception as error:  # pylint: disable=broad-except
      text = str(error).strip()
      failed.append((round_index, f"{type(error).__name__}: "
                                  f"{text.splitlines()[0][:200] if text else ''}"))
      continue
    for bad, reason in failed:
      moved = writer.move_aside(checkpointers, bad)
      logging.warning("the checkpoint of round %d in %s cannot be restored (%s); it is moved to "
                      "%s and the run resumes from the checkpoint of round %d", bad, where,
                      reason, ", ".join(moved) or "checkpoints/unreadable/ (by process 0)",
                      round_index)
    if failed:
      sharding.barrier("fedjax_het:moved_aside")
      for checkpointer in checkpointers:
        checkpointer.reload()
    return round_index, state
  listing = "; ".join(f"round {r}: {reason}" for r, reason in failed)
  raise WorkdirError(f"no checkpoint in {where} can be restored ({listing}); none was moved or "
                     "deleted: move the workdir aside to start the run afresh.")


def _load_diagnostics(path: pathlib.Path) -> dict[int, np.ndarray]:
  """{round: array} from a diagnostics file written by an interrupted run."""
  if not path.exists():
    return {}
  with np.load(path) as stored:
    return {int(k.split("_")[1]): stored[k] for k in stored.files}

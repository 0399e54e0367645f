"""Run artefacts: metrics.jsonl and its writers (TensorBoard, W&B, MLflow), a progress bar, and
the run writer that owns process 0's writes to a run's workdirs (`create_run_writer`); the
results table is `fedjax_het.reports.common.results_table` (re-exported here for the
trainers)."""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tqdm

from fedjax_het import workdir as workdir_lib
from fedjax_het.errors import ConfigError, WorkdirError
from fedjax_het.reports import common


def _finite(value: Any) -> Any:
  """`value` with every non-finite float (NaN, +-inf) as None, recursively."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, Mapping):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value


def nonfinite_names(record: Mapping[str, Any]) -> list[str]:
  """The names of a record's values that are non-finite floats."""
  return sorted(k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v))


def strict_json(value: Any, **kwargs: Any) -> str:
  """JSON without the bare NaN / Infinity tokens JSON does not allow (written as null)."""
  return json.dumps(_finite(value), allow_nan=False, **kwargs)


def json_record(record: Mapping[str, Any]) -> dict[str, Any]:
  """`record` as metrics.jsonl holds it (parsed back): non-finite numbers as null, their
  names under "nonfinite"."""
  bad = nonfinite_names(record)
  return json.loads(strict_json({**record, **({"nonfinite": bad} if bad else {})}))


#: `config.logging.writers`: where the per-round records go (metrics.jsonl always).
WRITERS = ("jsonl", "tensorboard", "wandb", "mlflow")
#: `config.logging.wandb_mode`: W&B's own `mode` ("offline" writes under the workdir only).
WANDB_MODES = ("offline", "online")


def writer_names(logging_config: Any) -> tuple[str, ...]:
  """The writers a run's `config.logging` asks for: "jsonl" first, then those named in
  `logging.writers` (comma-separated), plus "tensorboard" when `logging.tensorboard` is True."""
  named = [n.strip() for n in str(logging_config.get("writers", "jsonl")).split(",") if n.strip()]
  if logging_config.get("tensorboard", False):
    named.append("tensorboard")
  return tuple(dict.fromkeys(["jsonl", *named]))


def _missing(name: str, package: str, extra: str) -> ConfigError:
  return ConfigError(f"config.logging.writers names {name!r}, which needs {package} "
                     f"(pip install 'fedjax_het[{extra}]'); allowed: {WRITERS}.")


class _TensorBoard:
  """TensorBoard event files under <workdir>/tensorboard (tensorboardX)."""

  def __init__(self, workdir: pathlib.Path, **_):
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    except ImportError as error:
      raise _missing("tensorboard", "tensorboardX", "tensorboard") from error
    self._writer = SummaryWriter(str(workdir / "tensorboard"))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    for name, value in values.items():
      self._writer.add_scalar(name, value, step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class _WandB:
  """A Weights & Biases run (files under <workdir>/wandb; `logging.wandb_mode`)."""

  def __init__(self, workdir: pathlib.Path, *, run_name: str, config: Mapping[str, Any],
               wandb_mode: str = "offline", **_):
    try:
      import wandb  # pylint: disable=g-import-not-at-top
    except ImportError as error:
      raise _missing("wandb", "wandb", "wandb") from error
    self._run = wandb.init(project="fedjax_het", name=run_name, dir=str(workdir),
                           mode=wandb_mode, config=dict(config), reinit="create_new")

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    self._run.log(dict(values), step=step)

  def close(self) -> None:
    self._run.finish()


class _MLflow:
  """An MLflow run in experiment "fedjax_het" (`logging.mlflow_tracking_uri`; "" -> a local
  SQLite store, <workdir>/mlflow.db, no server)."""

  def __init__(self, workdir: pathlib.Path, *, run_name: str, config: Mapping[str, Any],
               mlflow_tracking_uri: str = "", **_):
    try:
      from mlflow.tracking import MlflowClient  # pylint: disable=g-import-not-at-top
    except ImportError as error:
      raise _missing("mlflow", "mlflow", "mlflow") from error
    uri = mlflow_tracking_uri or f"sqlite:///{pathlib.Path(workdir).absolute() / 'mlflow.db'}"
    self._client = MlflowClient(tracking_uri=uri)
    experiment = self._client.get_experiment_by_name("fedjax_het")
    experiment_id = (experiment.experiment_id if experiment is not None
                     else self._client.create_experiment("fedjax_het"))
    self._run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
    for name, value in config.items():
      self._client.log_param(self._run_id, name, str(value)[:500])

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    from mlflow.entities import Metric  # pylint: disable=g-import-not-at-top
    stamp = int(time.time() * 1000)
    metrics = [Metric(name.replace("@", "_"), value, stamp, step) for name, value in values.items()]
    self._client.log_batch(self._run_id, metrics=metrics)

  def close(self) -> None:
    self._client.set_terminated(self._run_id)


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class MetricsWriter:
  """The run's one metrics writer: metrics.jsonl, and the backends the config names.

  One JSON record per round goes to `metrics.jsonl` (always); the finite numbers of each
  record also go to TensorBoard (tensorboardX), Weights & Biases and MLflow when
  `writers` names them (`config.logging.writers`, `writer_names`). Records carry a "round"
  key (1-based: the number of rounds completed), the step of every backend. On resume,
  `resume(r, saved)` keeps the records of rounds <= r: those the checkpoint of round r
  holds (`saved`; metrics.jsonl is rewritten from them when it is missing, damaged or
  differs, with one warning line), or, for a checkpoint without records, metrics.jsonl's
  own, truncated after round r (`truncate_after`).

  `enabled=False` (a process other than process 0 of a multi-process run, as flax's
  `create_default_writer(just_logging=...)`): nothing is written and no backend starts;
  `read` and `truncate_after` still return the records process 0 keeps.
  """

  def __init__(self, workdir: pathlib.Path, *, writers: tuple[str, ...] = ("jsonl",),
               enabled: bool = True, run_name: str = "run",
               config: Mapping[str, Any] | None = None, **options: Any):
    """`options`: wandb_mode, mlflow_tracking_uri (`config.logging`)."""
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.enabled = enabled
    unknown = [w for w in writers if w not in WRITERS]
    if unknown:
      raise ConfigError(f"config.logging.writers must name writers from {WRITERS}, got "
                        f"{unknown[0]!r}.")
    self._backends = []
    if enabled:
      for name in writers:
        if name in _BACKENDS:
          self._backends.append(_BACKENDS[name](pathlib.Path(workdir), run_name=run_name,
                                                config=dict(config or {}), **options))

  def read(self) -> list[dict[str, Any]]:
    """The records; a last line cut short by a kill mid-append is dropped."""
    return common.read_records(self.path)

  def truncate_after(self, round_number: int) -> list[dict[str, Any]]:
    """Keeps the records of rounds <= round_number (rewritten atomically where enabled)."""
    kept = [r for r in self.read() if r["round"] <= round_number]
    if self.enabled:
      workdir_lib.write_atomic(self.path, "".join(strict_json(r) + "\n" for r in kept))
    return kept

  def resume(self, round_number: int,
             saved: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The records of rounds <= round_number: `saved` (the checkpoint's) when given, with
    metrics.jsonl rewritten from them where enabled; else `truncate_after(round_number)`."""
    if saved is None:
      try:
        return self.truncate_after(round_number)
      except ValueError as error:
        raise WorkdirError(f"{self.path} is damaged ({error}) and the checkpoint of round "
                           f"{round_number} holds no records to rebuild it from; move the "
                           "workdir aside to start the run afresh.") from None
    try:
      kept = [r for r in self.read() if r["round"] <= round_number]
    except (ValueError, KeyError, TypeError):
      kept = None
    if kept != saved:
      logging.warning("%s is %s: rebuilt from the %d records of the checkpoint of round %d",
                      self.path, "missing" if not self.path.exists() else
                      "damaged" if kept is None else "not the checkpoint's record",
                      len(saved), round_number)
    if self.enabled:
      workdir_lib.write_atomic(self.path, "".join(strict_json(r) + "\n" for r in saved))
    return list(saved)

  def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
    """Appends `record` and returns it as written (`json_record`): a non-finite number is
    written as null and named under "nonfinite" (metrics.jsonl stays strict JSON)."""
    written = json_record(record)
    if not self.enabled:
      return written
    line = strict_json(written)
    with self.path.open("a") as f:
      f.write(line + "\n")
    if self._backends:
      values = {name: float(value) for name, value in record.items()
                if name != "round" and isinstance(value, (int, float))
                and not isinstance(value, bool) and math.isfinite(value)}
      for backend in self._backends:
        backend.scalars(int(record["round"]), values)
    return written

  def close(self) -> None:
    for backend in self._backends:
      backend.close()
    self._backends = []


class Progress:
  """The run's progress: a `tqdm` bar on a terminal, one log line per round otherwise.

  The bar shows the accuracy in its postfix; its rate and ETA count rounds only
  (the trainer compiles the round before the first update, so the first
  round's time is not inflated by compilation). When stderr is not a TTY (CI
  logs, `nohup`) the bar is off and each update is a plain `logging.info` line.
  """

  def __init__(self, total: int, *, enabled: bool, start: int = 0):
    self.total, self.enabled = total, enabled
    self._bar = None
    self._done = start
    self._tick = time.perf_counter()
    if enabled and sys.stderr.isatty():
      self._bar = tqdm.tqdm(total=total, initial=start, unit="round", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0.3)

  def update(self, done: int, text: str) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.set_postfix_str(text, refresh=False)
      self._bar.update(done - self._bar.n)
    else:
      now = time.perf_counter()
      rate = (now - self._tick) / max(done - self._done, 1)
      self._tick, self._done = now, done
      logging.info("round %d/%d %s (%.1f s/round, ETA %.1f min)", done, self.total, text, rate,
                   rate * (self.total - done) / 60)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def create_run_writer(configs: Sequence[Any], workdirs: Sequence[pathlib.Path], *,
                      primary: bool, sync: Callable[[str], None] | None = None
                      ) -> RunWriter:
  """The one writer of a run's workdirs (one per seed lane, `configs[i]` trained into
  `workdirs[i]`): a `RunWriter` in process 0 (`primary`), a `NullRunWriter` in every other
  process of a multi-process run, which writes nothing (flax's
  `metric_writers.create_default_writer(just_logging=jax.process_index() > 0)`).

  `sync` is a barrier across the processes, called with a name
  (`engine.sharding.barrier`): the other processes read the records process 0 keeps
  once it has rewritten them.
  """
  return (RunWriter if primary else NullRunWriter)(configs, workdirs, sync=sync)


class RunWriter:
  """Process 0's writes to a run's workdirs: the metric records (`MetricsWriter`: metrics.jsonl
  and the backends `config.logging.writers` names), metadata.json again after the memory
  policy changed the convolutions, the diagnostics (`<name>.npz`), results.md /
  results.json, the plots and the progress bar; and the checkpoint housekeeping only
  process 0 does (unfinished writes removed, unreadable checkpoints moved aside, records cut
  back after a storage failure). The trainer calls it unconditionally; `NullRunWriter`, in
  the other processes, makes each write a no-op.
  """

  #: Whether this process writes the workdirs (process 0).
  primary = True

  def __init__(self, configs: Sequence[Any], workdirs: Sequence[pathlib.Path], *,
               sync: Callable[[str], None] | None = None):
    self.configs = list(configs)
    self.workdirs = [pathlib.Path(w) for w in workdirs]
    self._sync = sync or (lambda name: None)
    #: One `MetricsWriter` per lane, from `open_metrics`.
    self.metrics: list[MetricsWriter] = []

  def open_metrics(self) -> None:
    """Starts each lane's metrics writer (its backends open); called once the resume guard
    has passed and the lanes' checkpoints agree."""
    self.metrics = [MetricsWriter(
        w, writers=writer_names(c.logging), enabled=self.primary, run_name=str(c.name),
        config=workdir_lib.flatten_config(c), wandb_mode=c.logging.get("wandb_mode", "offline"),
        mlflow_tracking_uri=c.logging.get("mlflow_tracking_uri", ""))
                    for c, w in zip(self.configs, self.workdirs)]

  def remove_unfinished(self, checkpointers: Sequence[Any]) -> None:
    """Removes the checkpoint writes a kill left unfinished (the workdirs' locks are held: no
    other process writes these checkpoints)."""
    for checkpointer in checkpointers:
      removed = checkpointer.remove_unfinished()
      if removed:
        logging.info("removed the unfinished checkpoint write(s) %s in %s", ", ".join(removed),
                     checkpointer.directory)

  def move_aside(self, checkpointers: Sequence[Any], round_index: int) -> list[str]:
    """Moves each lane's checkpoint of `round_index` (one that cannot be restored) to
    checkpoints/unreadable/; the paths it went to."""
    return [str(c.move_aside(round_index)) for c in checkpointers
            if round_index in c.committed_rounds()]

  def resume(self, round_index: int, saved: Sequence[list[dict[str, Any]] | None]
             ) -> list[list[dict[str, Any]]]:
    """Each lane's records up to `round_index` (`MetricsWriter.resume`: metrics.jsonl rebuilt
    from the checkpoint's records when it differs), then the barrier the other processes
    wait at before they read them."""
    records = [writer.resume(round_index, lane) for writer, lane in zip(self.metrics, saved)]
    self._sync("fedjax_het:metrics")
    return records

  def write(self, lane: int, record: Mapping[str, Any]) -> dict[str, Any]:
    """Appends `record` to lane `lane`'s metrics (`MetricsWriter.write`) and returns it as
    written; an operating-system error (a full disk) names that metrics.jsonl."""
    writer = self.metrics[lane]
    try:
      return writer.write(record)
    except OSError as error:
      if error.filename is None:
        error.filename = str(writer.path)
      raise

  def metadata(self, lanes: Sequence[Any]) -> None:
    """Writes each lane's metadata.json again (`lane.metadata()`)."""
    for lane, workdir in zip(lanes, self.workdirs):
      workdir_lib.write_metadata(workdir, lane.metadata())

  def diagnostics(self, lane: int, name: str, values: Mapping[int, Any]) -> None:
    """Writes lane `lane`'s diagnostics `{round: array}` as `<name>.npz` (`round_<r>` keys)."""
    workdir_lib.savez_atomic(self.workdirs[lane] / f"{name}.npz",
                             **{f"round_{r}": m for r, m in values.items()})

  def progress(self, total: int, *, start: int, enabled: bool) -> Progress:
    """The run's progress bar (`Progress`), shown when `enabled` (`config.logging.progress`)."""
    return Progress(total, enabled=enabled, start=start)

  def results(self, lane: int, markdown: str, numbers: Mapping[str, Any], *,
              seed: int | None = None) -> None:
    """Writes lane `lane`'s results.md and results.json and logs the table (naming the seed of
    a lane of several)."""
    workdir = self.workdirs[lane]
    workdir_lib.write_atomic(workdir / "results.md", markdown)
    workdir_lib.write_atomic(workdir / "results.json", strict_json(numbers, indent=2) + "\n")
    logging.info("results%s:\n%s", f" of seed {seed}" if seed is not None else "", markdown)

  def plots(self, lane: int, experiment: Any, records: Sequence[Mapping[str, Any]],
            numbers: Mapping[str, Any], diagnostics: Mapping[int, Any]) -> None:
    """Draws lane `lane`'s plots into its workdir (`experiment.plot`: accuracy curves, the
    diagnostics' figures)."""
    experiment.plot(records, numbers, self.workdirs[lane], diagnostics)

  def cut_records(self, round_index: int | None) -> bool:
    """Cuts every lane's metrics.jsonl back to the records of rounds <= `round_index` (all of
    them for None: no checkpoint) in place, needing no free space (`cut_records_after`); an
    operating-system error leaves that file as it is. Whether anything was cut."""
    cut = False
    for writer in self.metrics:
      try:
        cut |= cut_records_after(writer.path, round_index)
      except OSError:
        pass
    return cut

  def close(self) -> OSError | None:
    """Closes every lane's metrics writer; the first operating-system error, if any (each
    writer is closed regardless)."""
    first = None
    for writer in self.metrics:
      try:
        writer.close()
      except OSError as error:
        first = first or error
    return first


class NullRunWriter(RunWriter):
  """The run writer of a process other than process 0: it writes nothing, removes and moves
  nothing and shows no progress; `resume` waits for process 0's records and reads them, and
  `write` returns a record as process 0 writes it."""

  primary = False

  def remove_unfinished(self, checkpointers: Sequence[Any]) -> None:
    del checkpointers

  def move_aside(self, checkpointers: Sequence[Any], round_index: int) -> list[str]:
    del checkpointers, round_index
    return []

  def resume(self, round_index: int, saved: Sequence[list[dict[str, Any]] | None]
             ) -> list[list[dict[str, Any]]]:
    self._sync("fedjax_het:metrics")  # the records process 0 keeps
    return [writer.resume(round_index, lane) for writer, lane in zip(self.metrics, saved)]

  def metadata(self, lanes: Sequence[Any]) -> None:
    del lanes

  def diagnostics(self, lane: int, name: str, values: Mapping[int, Any]) -> None:
    del lane, name, values

  def progress(self, total: int, *, start: int, enabled: bool) -> Progress:
    del enabled
    return Progress(total, enabled=False, start=start)

  def results(self, lane: int, markdown: str, numbers: Mapping[str, Any], *,
              seed: int | None = None) -> None:
    del lane, markdown, numbers, seed

  def plots(self, lane: int, experiment: Any, records: Sequence[Mapping[str, Any]],
            numbers: Mapping[str, Any], diagnostics: Mapping[int, Any]) -> None:
    del lane, experiment, records, numbers, diagnostics

  def cut_records(self, round_index: int | None) -> bool:
    del round_index
    return False


def cut_records_after(path: pathlib.Path, round_index: int | None) -> bool:
  """Truncates `path` (metrics.jsonl) in place after the last record of a round <=
  `round_index` (all of it for None); needs no free space. Whether anything was cut."""
  try:
    data = path.read_bytes()
  except FileNotFoundError:
    return False
  offset = 0
  if round_index is not None:
    for line in data.splitlines(keepends=True):
      try:
        if int(json.loads(line)["round"]) > round_index:
          break
      except (ValueError, KeyError, TypeError):
        break
      offset += len(line)
  if offset >= len(data):
    return False
  os.truncate(path, offset)
  return True


# One run's per-participant table (results.md): the reports' (fedjax_het.reports).
results_table = common.results_table

"""Run artefacts: metrics.jsonl and its writers (TensorBoard, W&B, MLflow), a progress bar; the results table is
`fedjax_het.reports.common.results_table` (re-exported here for the trainers)."""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
import time
from collections.abc import Mapping
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


# One run's per-participant table (results.md): the reports' (fedjax_het.reports).
results_table = common.results_table

"""The one metrics writer: metrics.jsonl always, TensorBoard / W&B / MLflow when named, nothing
on a process that does not write. The backends run offline (W&B mode="offline", MLflow's
local SQLite store), never on the network; a backend whose library is missing is skipped."""

from __future__ import annotations

import json
import struct
import time

import ml_collections
import pytest

from fedjax_het import reporting
from fedjax_het.config import base_config, validate_config
from fedjax_het.errors import ConfigError

RECORDS = [{"round": 1, "train/loss": 2.5, "eval/accuracy/mean": 10.0, "clients": [0, 2]},
           {"round": 2, "train/loss": 1.25, "eval/accuracy/mean": float("nan"), "task": 0},
           {"round": 3, "train/loss": 0.5, "eval/accuracy/mean": 30.0}]


def _write(workdir, **kwargs):
  writer = reporting.MetricsWriter(workdir, run_name="tiny", config={"seed": 0}, **kwargs)
  for record in RECORDS:
    writer.write(record)
  return writer


def test_writer_names_put_jsonl_first_and_honour_logging_tensorboard():
  logging = ml_collections.ConfigDict({"writers": "mlflow, wandb", "tensorboard": True})
  assert reporting.writer_names(logging) == ("jsonl", "mlflow", "wandb", "tensorboard")
  assert reporting.writer_names(ml_collections.ConfigDict({"tensorboard": False})) == ("jsonl",)


def test_a_disabled_writer_writes_nothing_and_still_reads(tmp_path):
  reporting.MetricsWriter(tmp_path).write({"round": 1, "a": 1.0})
  writer = _write(tmp_path, writers=("jsonl", "tensorboard", "wandb", "mlflow"), enabled=False)
  writer.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
  assert writer.read() == [{"round": 1, "a": 1.0}]
  assert writer.truncate_after(0) == [] and writer.read() == [{"round": 1, "a": 1.0}]


def test_unknown_writers_are_refused_naming_the_field(tmp_path):
  with pytest.raises(ConfigError, match=r"config.logging.writers .*'csv'"):
    reporting.MetricsWriter(tmp_path, writers=("jsonl", "csv"))
  for algorithm in ("fedavg", "glfc"):
    config = base_config(algorithm)
    config.logging.writers = "jsonl,neptune"
    with pytest.raises(ConfigError, match=r"config.logging.writers.*'mlflow'"):
      validate_config(config)
    config.logging.writers = "jsonl"
    config.logging.wandb_mode = "cloud"
    with pytest.raises(ConfigError, match=r"config.logging.wandb_mode.*'offline'"):
      validate_config(config)


def test_jsonl_holds_every_record(tmp_path):
  _write(tmp_path).close()
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["round"] for line in lines] == [1, 2, 3]
  assert json.loads(lines[0])["clients"] == [0, 2]


def _tensorboard_scalars(directory):
  """{tag: [(step, value)]} from tensorboardX event files (TFRecord framing read by hand)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  scalars = {}
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


def test_tensorboard_gets_the_finite_numbers(tmp_path):
  pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
  _write(tmp_path, writers=("jsonl", "tensorboard")).close()
  scalars = _tensorboard_scalars(tmp_path / "tensorboard")
  assert scalars["train/loss"] == [(1, 2.5), (2, 1.25), (3, 0.5)]
  assert scalars["eval/accuracy/mean"] == [(1, 10.0), (3, 30.0)]   # NaN left out
  assert scalars["task"] == [(2, 0.0)] and "clients" not in scalars


def _wandb_history(path):
  """The history rows of an offline W&B run file: LevelDB-style log blocks of protobuf
  `Record`s after a 7-byte header, read by hand."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  data, position, block, rows, pending = path.read_bytes(), 7, 32768, [], b""
  while position + 7 <= len(data):
    if block - position % block < 7:  # a block's tail too short for a header is padding
      position += block - position % block
      continue
    _, length, kind = struct.unpack("<IHB", data[position:position + 7])
    chunk = data[position + 7:position + 7 + length]
    position += 7 + length
    if kind == 0:
      continue
    pending = chunk if kind in (1, 2) else pending + chunk   # full / first, or middle / last
    if kind in (1, 4):
      record = wandb_internal_pb2.Record.FromString(pending)
      if record.WhichOneof("record_type") == "history":
        rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in record.history.item})
  return rows


def test_wandb_offline_run_gets_the_records(tmp_path, monkeypatch):
  pytest.importorskip("wandb", reason="the wandb extra is not installed")
  monkeypatch.setenv("WANDB_SILENT", "true")
  _write(tmp_path, writers=("jsonl", "wandb"), wandb_mode="offline").close()
  (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
  # W&B's service process writes the run file; on a loaded machine its last blocks can land
  # after `finish()` returns, so the file is read until its three rows are there (or 60 s).
  deadline = time.monotonic() + 60.0
  rows = _wandb_history(path)
  while len(rows) < 3 and time.monotonic() < deadline:
    time.sleep(0.5)
    rows = _wandb_history(path)
  assert [row["_step"] for row in rows] == [1, 2, 3]
  assert [row["train/loss"] for row in rows] == [2.5, 1.25, 0.5]
  assert [row.get("eval/accuracy/mean") for row in rows] == [10.0, None, 30.0]


def test_mlflow_local_store_holds_each_metric_by_round(tmp_path):
  pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
  from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel
  writer = _write(tmp_path, writers=("jsonl", "mlflow"))
  run_id = writer._backends[0]._run_id  # pylint: disable=protected-access
  writer.close()
  client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
  history = client.get_metric_history(run_id, "train/loss")
  assert sorted((m.step, m.value) for m in history) == [(1, 2.5), (2, 1.25), (3, 0.5)]
  assert sorted(m.step for m in client.get_metric_history(run_id, "eval/accuracy/mean")) == [1, 3]
  run = client.get_run(run_id)
  assert run.data.params["seed"] == "0" and run.info.status == "FINISHED"


def test_the_trainer_writes_through_the_configured_writers(tmp_path):
  pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
  from fedjax_het.train import train_and_evaluate  # pylint: disable=import-outside-toplevel
  from tests.test_cil_train import tiny_cil_config  # pylint: disable=import-outside-toplevel
  config = tiny_cil_config()
  config.logging.writers = "jsonl,tensorboard"
  out = train_and_evaluate(config, tmp_path)
  scalars = _tensorboard_scalars(tmp_path / "tensorboard")
  seen = [(r["round"], r["eval/accuracy/seen"]) for r in out["records"]
          if "eval/accuracy/seen" in r]
  assert [step for step, _ in scalars["eval/accuracy/seen"]] == [r for r, _ in seen] == [2, 4]
  assert [v for _, v in scalars["eval/accuracy/seen"]] == pytest.approx([v for _, v in seen])
  assert [step for step, _ in scalars["train/loss"]] == [1, 2, 3, 4]

"""The run writer that owns process 0's writes (`reporting.create_run_writer`): process 0's
writes the files the training loop leaves beside run.json and config.json, every other
process's writes nothing and reads what process 0 keeps."""

from __future__ import annotations

import json

import ml_collections
import numpy as np
import pytest

from fedjax_het import reporting

#: What the loop writes through the run writer in a run with diagnostics and plots (beside the
#: resume guard's run.json, config.json and the first metadata.json, and the checkpoints).
WRITER_FILES = ["accuracy.png", "cross_correlation.npz", "cross_correlation.png",
                "metadata.json", "metrics.jsonl", "results.json", "results.md"]


class _Checkpointer:
  """Records the housekeeping asked of it."""

  def __init__(self, directory):
    self.directory, self.calls = directory, []

  def remove_unfinished(self):
    self.calls.append("remove_unfinished")
    return ["3.orbax-checkpoint-tmp-1"]

  def committed_rounds(self):
    return [1, 2]

  def move_aside(self, round_index):
    self.calls.append(f"move_aside {round_index}")
    return self.directory / "unreadable" / str(round_index)


class _Lane:
  """A lane's metadata and plots, as `Experiment` gives them."""

  def metadata(self):
    return {"conv_impl": "lax"}

  def plot(self, records, numbers, workdir, diagnostics):
    (workdir / "accuracy.png").write_text(f"{len(records)} rounds, AVG {numbers['AVG']}")
    if diagnostics:
      (workdir / "cross_correlation.png").write_bytes(b"figure")


def _config():
  return ml_collections.ConfigDict({"name": "tiny", "seed": 0, "logging": {
      "writers": "jsonl", "tensorboard": False}})


def _every_write(writer, checkpointer):
  """The loop's calls, in its order: housekeeping, resume, records, diagnostics, results."""
  synced = []
  writer._sync = synced.append  # pylint: disable=protected-access
  writer.remove_unfinished([checkpointer])
  writer.open_metrics()
  moved = writer.move_aside([checkpointer], 2)
  resumed = writer.resume(1, [None])
  writer.metadata([_Lane()])
  progress = writer.progress(3, start=1, enabled=True)
  written = [writer.write(0, {"round": r, "train/loss": loss})
             for r, loss in ((2, 0.5), (3, float("nan")))]
  writer.diagnostics(0, "cross_correlation", {2: np.eye(2)})
  writer.results(0, "| AVG | 1.0 |\n", {"AVG": 1.0})
  writer.plots(0, _Lane(), resumed[0] + written, {"AVG": 1.0}, {2: np.eye(2)})
  progress.close()
  error = writer.close()
  return {"synced": synced, "moved": moved, "resumed": resumed, "written": written,
          "progress": progress.enabled, "close": error}


def _contents(directory):
  return {p.relative_to(directory).as_posix(): p.read_bytes()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_non_primary_writer_writes_nothing_and_reads_what_process_0_keeps(tmp_path):
  kept = [{"round": 1, "train/loss": 1.0}, {"round": 2, "train/loss": 0.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
  before = _contents(tmp_path)
  checkpointer = _Checkpointer(tmp_path / "checkpoints")
  writer = reporting.create_run_writer([_config()], [tmp_path], primary=False)
  assert isinstance(writer, reporting.NullRunWriter) and not writer.primary
  out = _every_write(writer, checkpointer)
  assert _contents(tmp_path) == before and checkpointer.calls == []
  assert writer.cut_records(None) is False and _contents(tmp_path) == before
  assert out["synced"] == ["fedjax_het:metrics"] and out["moved"] == []
  assert out["resumed"] == [kept[:1]]
  # A record as process 0 writes it: the NaN as null, named under "nonfinite".
  assert out["written"][1] == {"round": 3, "train/loss": None, "nonfinite": ["train/loss"]}
  assert out["progress"] is False and out["close"] is None


def test_the_primary_writer_writes_the_files_the_loop_writes(tmp_path):
  checkpointer = _Checkpointer(tmp_path / "checkpoints")
  writer = reporting.create_run_writer([_config()], [tmp_path], primary=True)
  assert type(writer) is reporting.RunWriter and writer.primary
  out = _every_write(writer, checkpointer)
  files = _contents(tmp_path)
  assert sorted(files) == WRITER_FILES
  assert checkpointer.calls == ["remove_unfinished", "move_aside 2"]
  assert out["synced"] == ["fedjax_het:metrics"] and out["resumed"] == [[]]
  assert out["progress"] is True and out["close"] is None
  assert [json.loads(line) for line in files["metrics.jsonl"].splitlines()] == out["written"]
  assert json.loads(files["metadata.json"]) == {"conv_impl": "lax"}
  assert json.loads(files["results.json"]) == {"AVG": 1.0}
  assert files["results.md"] == b"| AVG | 1.0 |\n"
  with np.load(tmp_path / "cross_correlation.npz") as saved:
    assert saved.files == ["round_2"] and np.array_equal(saved["round_2"], np.eye(2))
  # After a storage failure, metrics.jsonl is cut back to the latest checkpoint's round.
  assert writer.cut_records(2) is True
  assert [json.loads(line)["round"] for line in
          (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2]


@pytest.mark.slow  # a tiny run, about a minute on a loaded 2-core CPU
def test_a_process_other_than_process_0_leaves_only_the_checkpoints(tmp_path, monkeypatch):
  from fedjax_het import train  # pylint: disable=import-outside-toplevel
  from tests.test_train import tiny_config  # pylint: disable=import-outside-toplevel
  config = tiny_config("solo")
  config.num_rounds = 2
  config.logging.plots = True
  monkeypatch.setattr(train.sharding, "is_primary", lambda: False)
  out = train.train_and_evaluate(config, tmp_path)
  # orbax writes the checkpoints from every process; nothing else is this process's to write.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
  assert [r["round"] for r in out["records"]] == [1, 2] and out["results"]

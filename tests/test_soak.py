"""Resume soak (benchmarks/soak_resume.py): SIGKILL the CLI, resume, compare bit for bit.

  pytest -m slow tests/test_soak.py        # the 3-trial soak (about 2 minutes on 2 CPU cores)
  pytest tests/test_soak.py                # only the checks that the comparison can fail
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import pathlib
import random
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import checkpointing

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


soak = _load(REPO / "benchmarks" / "soak_resume.py", "soak_resume")


def _records():
  return [{"round": r, "train/local/loss/mnist": 2.0 / r, "eval/intra/mnist": 10.0 * r,
           "eval/intra/mean": 10.5 * r, "time/round_secs": 0.3} for r in (1, 2, 3)]


def _state(scale=1.0):
  return {"params": {"w": jnp.arange(6.0).reshape(2, 3) * scale, "b": jnp.zeros((3,))},
          "round": jnp.asarray(3, jnp.int32)}


def _write_run(workdir, records, results, state, diagnostics=None):
  workdir.mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (workdir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
  if diagnostics is not None:
    np.savez(workdir / "cross_correlation.npz", **diagnostics)
  checkpointer = checkpointing.Checkpointer(workdir / "checkpoints", keep=2)
  checkpointer.save(2, state)
  checkpointer.save(3, state)
  checkpointer.close()
  return workdir


@pytest.fixture(name="reference")
def _reference(tmp_path):
  return _write_run(tmp_path / "reference", _records(),
                    {"method": "fcclplus", "intra": {"AVG": 1.5}}, _state(),
                    {"round_3": np.eye(3, dtype=np.float32)})


def _copy(reference, tmp_path):
  return pathlib.Path(shutil.copytree(reference, tmp_path / "candidate"))


def test_compare_runs_identical_ignores_time(reference, tmp_path):
  candidate = _copy(reference, tmp_path)
  records = _records()
  for r in records:
    r["time/round_secs"] = 9.9
  (candidate / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert soak.compare_runs(reference, candidate) == []


def test_compare_runs_finds_one_metric_number(reference, tmp_path):
  candidate = _copy(reference, tmp_path)
  records = _records()
  records[1]["eval/intra/mnist"] = np.nextafter(records[1]["eval/intra/mnist"], 100.0)
  (candidate / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  differences = soak.compare_runs(reference, candidate)
  assert len(differences) == 1 and "round 2 eval/intra/mnist" in differences[0], differences


def test_compare_runs_finds_a_missing_round_and_results(reference, tmp_path):
  candidate = _copy(reference, tmp_path)
  (candidate / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in _records()[1:]))
  (candidate / "results.json").write_text(json.dumps({"method": "fcclplus",
                                                      "intra": {"AVG": 1.5000001}}))
  differences = soak.compare_runs(reference, candidate)
  assert any("rounds" in d for d in differences) and any("results.json" in d
                                                        for d in differences), differences


def test_compare_runs_finds_one_checkpoint_element(reference, tmp_path):
  state = _state()
  w = np.asarray(state["params"]["w"]).copy()
  w[1, 2] = np.nextafter(w[1, 2], np.float32(0))
  state["params"]["w"] = jnp.asarray(w)
  candidate = _write_run(tmp_path / "candidate", _records(),
                         {"method": "fcclplus", "intra": {"AVG": 1.5}}, state,
                         {"round_3": np.eye(3, dtype=np.float32)})
  differences = soak.compare_runs(reference, candidate)
  assert len(differences) == 1, differences
  assert "checkpoint 3" in differences[0] and "['w']" in differences[0]
  assert "1 of 6 elements differ (first at (1, 2)" in differences[0]


def test_compare_runs_finds_diagnostics_and_signed_zero(reference, tmp_path):
  candidate = _copy(reference, tmp_path)
  diagonal = np.eye(3, dtype=np.float32)
  diagonal[0, 1] = -0.0  # equal as a number, different bits
  np.savez(candidate / "cross_correlation.npz", round_3=diagonal)
  differences = soak.compare_runs(reference, candidate)
  assert len(differences) == 1 and "cross_correlation.npz round_3" in differences[0], differences


def test_classify_reads_the_phase(tmp_path):
  log = ("I train.py] compiling the round (...)\nI train.py] compiled the round in 4.2 s\n"
         "I reporting.py] round 1/6 inter 10.0 intra 10.8 (4.7 s/round)\n")
  assert soak.classify(log, tmp_path, 6)["detail"] == "round 2"
  assert soak.classify("I train.py] compiling the round\n", tmp_path, 6)["phase"] == "compiling"
  assert soak.classify("I train.py] workdir: x\n", tmp_path, 6)["phase"] == "start-up"
  (tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-123").mkdir(parents=True)
  assert soak.classify(log, tmp_path, 6)["phase"] == "checkpoint"
  assert soak.classify(log, tmp_path, 6, ["2.orbax-checkpoint-tmp-123"])["phase"] == "round"


def test_timeline_reads_absl_timestamps():
  started = datetime.datetime(2024, 1, 2, 23, 59, 58).timestamp()
  log = ("I0102 23:59:59.500000 1 train.py:414] compiling the round (...)\n"
         "I0103 00:00:03.000000 1 train.py:425] compiled the round in 3.5 s\n"
         "I0103 00:00:03.250000 1 reporting.py:89] round 1/2 inter 1.0 intra 2.0\n"
         "I0103 00:00:03.750000 1 reporting.py:89] round 2/2 inter 1.0 intra 2.0\n")
  assert soak.timeline(log, started) == {"compiling": 1.5, "compiled": 5.0, "first_round": 5.25,
                                         "last_round": 5.75}


def test_kill_times_use_median_windows_of_full_runs():
  kill_times = soak.KillTimes(random.Random(0), round_focus=1.0)
  full = {"killed": False, "rc": 0, "resumed_from": None}
  kill_times.add({**full, "wall_s": 9.0, "timeline_s": {"compiled": 6.0, "last_round": 8.0}})
  kill_times.add({**full, "wall_s": 7.0, "timeline_s": {"compiled": 4.0, "last_round": 6.0}})
  kill_times.add({**full, "wall_s": 8.0, "timeline_s": {"compiled": 5.0, "last_round": 7.0}})
  kill_times.add({**full, "resumed_from": 3, "wall_s": 1.0,  # resumed: not a full run
                  "timeline_s": {"compiled": 0.5, "last_round": 0.9}})
  kill_times.add({"killed": True, "rc": -9, "wall_s": 1.0, "timeline_s": {}})
  assert kill_times.windows() == {"whole run": (0.0, 8.0), "rounds": (5.0, 7.0)}
  for _ in range(20):
    delay, window = kill_times.draw()
    assert window == "rounds" and 5.0 <= delay <= 7.0


def test_kill_times_follow_the_latest_full_runs():
  kill_times = soak.KillTimes(random.Random(0), round_focus=1.0)
  full = {"killed": False, "rc": 0, "resumed_from": None}
  for wall in [20.0] * 5 + [6.0] * soak.KillTimes.RECENT:  # the machine's load fell
    kill_times.add({**full, "wall_s": wall, "timeline_s": {"compiled": wall / 2,
                                                           "last_round": wall - 1}})
  assert kill_times.windows() == {"whole run": (0.0, 6.0), "rounds": (3.0, 5.0)}


def _folder(tmp_path):
  folder = tmp_path / "checkpoints" / "3"
  (folder / "state" / "d").mkdir(parents=True)
  for name, size in (("_CHECKPOINT_METADATA", 40), ("state/_METADATA", 300),
                     ("state/d/chunk", 1000), ("run/metadata", 200)):
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
  return folder


def _contents(folder):
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


def test_corrupt_files_changes_exactly_the_bytes_it_names(tmp_path):
  folder = _folder(tmp_path)
  before = _contents(folder)
  done = soak.corrupt_files(folder, random.Random(3))
  after = _contents(folder)
  assert 1 <= len(done) <= 3 and before.keys() == after.keys()
  named = {d["file"] for d in done}
  for name in before:
    changed = [i for i, (a, b) in enumerate(zip(before[name], after[name])) if a != b]
    assert len(before[name]) == len(after[name])
    assert changed == (next(d["offsets"] for d in done if d["file"] == name)
                       if name in named else []), name


def test_truncate_or_delete_shortens_or_removes_one_file(tmp_path):
  actions = set()
  for seed in range(12):
    folder = _folder(tmp_path / str(seed))
    before = _contents(folder)
    [done] = soak.truncate_or_delete(folder, random.Random(seed))
    after = _contents(folder)
    actions.add(done["action"])
    if done["action"] == "deleted":
      assert set(before) - set(after) == {done["file"]}
    else:
      assert after[done["file"]] == before[done["file"]][:done["length"]]
      assert done["length"] < len(before[done["file"]])
    assert all(after[k] == before[k] for k in after if k != done["file"])
  assert actions == {"deleted", "truncated"}


def test_damage_metrics_file_cuts_deletes_a_line_or_the_file(tmp_path):
  text = "".join(json.dumps(r) + "\n" for r in _records())
  actions = set()
  for seed in range(12):
    path = tmp_path / str(seed) / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(text)
    [done] = soak.damage_metrics_file(path, random.Random(seed))
    actions.add(done["action"])
    lines = text.splitlines()
    if done["action"] == "deleted the file":
      assert not path.exists()
      continue
    got, k = path.read_text().splitlines(), done["line"] - 1
    if done["action"] == "deleted a line":
      assert got == lines[:k] + lines[k + 1:]
    else:
      assert got == lines[:k] + [lines[k][:len(lines[k]) // 2]] + lines[k + 1:]
      with pytest.raises(json.JSONDecodeError):
        json.loads(got[k])
  assert actions == {"cut a line", "deleted a line", "deleted the file"}
  assert soak.damage_metrics_file(tmp_path / "absent.jsonl", random.Random(0)) == []


def test_damage_needs_two_checkpoints_and_names_the_newest(tmp_path):
  workdir = tmp_path / "run"
  _folder(workdir)
  assert soak.damage("corrupt_checkpoint", workdir, random.Random(0)) == []
  (workdir / "checkpoints" / "2").mkdir()
  (workdir / "checkpoints" / "4.orbax-checkpoint-tmp-9").mkdir()
  done = soak.damage("truncate_checkpoint", workdir, random.Random(0))
  assert len(done) == 1 and done[0]["file"].startswith("checkpoints/3/")


def test_warning_lines_leave_out_the_synthetic_data_notices():
  log = ("W1126 09:54:44.431060 1 scenarios.py:603] SYNTHETIC SUBSTITUTION in scenario\n"
         "W1126 09:54:44.937775 1 train.py:88] !!!!!!!!!!\n"
         "I1126 09:54:45.402205 1 train.py:105] compiling the round\n"
         "W1126 09:54:46.000000 1 train.py:411] the checkpoint of round 3 in /w cannot be "
         "restored (ValueError: x); it is removed\n")
  assert soak.warning_lines(log) == [
      "the checkpoint of round 3 in /w cannot be restored (ValueError: x); it is removed"]


@pytest.mark.slow
def test_soak_resume_three_kills_end_identical(tmp_path):
  summary = soak.main(["--kinds", "kill", "--trials-per-kind", "3", "--seed", "1",
                       "--tmp-dir", str(tmp_path),
                       "--out", str(tmp_path / "soak.json")])
  assert summary["control"]["identical"], summary["control"]["differences"]
  assert summary["kills"] >= 3
  failed = [(t["trial"], t["details"], t["differences"][:3]) for t in summary["results"]
            if not t["identical"]]
  assert summary["identical"] == 3, failed


def _run_item(folder):
  item = folder / "run" / "metadata"
  item.parent.mkdir(parents=True)
  item.write_text(json.dumps({
      "identity": {"config": {"seed": 0, "local.lr": 0.001, "num_rounds": 10,
                              "name": "x"}, "data": {"fingerprint": "ab12"}},
      "records": [{"round": 1, "train/local/ce/mnist": 2.3136296272277832,
                   "eval/intra/mnist": 10.0}], "state_sha256": "0f"}))
  return item


@pytest.mark.parametrize("what", ["record", "identity"])
def test_flip_run_item_changes_one_digit_of_one_number_and_keeps_the_json_valid(tmp_path, what):
  for seed in range(20):
    folder = tmp_path / f"{what}{seed}"
    item = _run_item(folder)
    before = item.read_text()
    done = soak.flip_run_item(folder, what, random.Random(seed))
    after = item.read_text()
    assert len(done) == 1 and done[0]["action"] == f"flipped a digit of the {what}"
    assert len(before) == len(after)
    differ = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(differ) == 1 and before[differ[0]].isdigit() and after[differ[0]].isdigit()
    assert float(done[0]["from"]) != float(done[0]["to"])
    old, new = json.loads(before), json.loads(after)
    part = "records" if what == "record" else "identity"
    assert old[part] != new[part]
    assert {k: v for k, v in old.items() if k != part} == {
        k: v for k, v in new.items() if k != part}


def test_checkpoint_state_leaves_out_the_unreadable_folder(tmp_path):
  for name in ("1", "2", "unreadable", "3.orbax-checkpoint-tmp"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert soak.checkpoint_state(tmp_path) == {"committed": [1, 2],
                                             "temporary": ["3.orbax-checkpoint-tmp"]}


def test_stop_lines_split_error_and_stop_lines():
  log = ("I1128 round 1/4\nerror: no space left on the device writing '/w/x'\n"
         "stopped at round 2; rerun the same command\n")
  assert soak.stop_lines(log) == (["error: no space left on the device writing '/w/x'"],
                                  ["stopped at round 2; rerun the same command"])

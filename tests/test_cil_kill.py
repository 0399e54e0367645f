"""A class-incremental run killed with SIGKILL at a task boundary resumes bit-identical.

A child process trains a tiny two-task stream (`tests.test_cil_train.tiny_cil_config`,
2 rounds per task) and kills itself with SIGKILL right after the trainer saves the
checkpoint of round 2, the end of task 0: once the write has finished ("written": the
resume starts from the boundary, the exemplar memories and the old model of task 0
restored), or while it may still be under way ("writing": the resume starts from the
boundary or from round 1, whichever is complete). Rerunning in the same workdir must end
exactly where an uninterrupted run ends: the final state bit for bit, every metrics record
(time fields aside) and results.json.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys

import chex
import pytest

from fedjax_het import checkpointing
from fedjax_het.train import train_and_evaluate
from tests.test_cil_train import tiny_cil_config

REPO = pathlib.Path(__file__).resolve().parents[1]
TASK_BOUNDARY = 2  # the last round of task 0

# The child runs as the tests do (conftest: 4 simulated CPU devices, which changes XLA:CPU's
# rounding), so that its numbers are those of the in-process reference.
_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import jax
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_numpy_rank_promotion", "raise")
from fedjax_het import checkpointing
from fedjax_het.train import train_and_evaluate
from tests.test_cil_train import tiny_cil_config

save = checkpointing.Checkpointer.save

def save_then_die(self, round_index, state, run=None):
  save(self, round_index, state, run)
  if round_index == {kill_at}:
    if {written}:
      self._manager.wait_until_finished()
    os.kill(os.getpid(), signal.SIGKILL)

checkpointing.Checkpointer.save = save_then_die
train_and_evaluate(tiny_cil_config({method!r}), {workdir!r})
"""


def _records(workdir):
  return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
          for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _kill_and_resume(method, written, tmp_path):
  reference = train_and_evaluate(tiny_cil_config(method), tmp_path / "reference")
  workdir = tmp_path / "killed"
  child = subprocess.run(
      [sys.executable, "-c", _CHILD.format(repo=str(REPO), method=method, workdir=str(workdir),
                                           kill_at=TASK_BOUNDARY, written=written)],
      capture_output=True, text=True, timeout=600, cwd=REPO)
  assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
  latest = checkpointing.Checkpointer(workdir / "checkpoints").latest_round()
  if written:
    assert latest == TASK_BOUNDARY
  assert not (workdir / "results.json").exists()

  resumed = train_and_evaluate(tiny_cil_config(method), workdir)
  assert resumed["rounds_done"] == reference["rounds_done"] == 4
  chex.assert_trees_all_equal(resumed["state"], reference["state"])
  assert _records(workdir) == _records(tmp_path / "reference")
  assert (json.loads((workdir / "results.json").read_text())
          == json.loads((tmp_path / "reference" / "results.json").read_text()))


@pytest.mark.slow  # about 40 s on 2 CPU cores; test_cil_train and test_stops cover resumes in CI
def test_icarl_fl_killed_after_the_task_boundary_checkpoint_resumes_bit_identical(tmp_path):
  _kill_and_resume("icarl_fl", True, tmp_path)


@pytest.mark.slow  # about 70 s on 2 CPU cores
@pytest.mark.parametrize("method,written", [("glfc", True), ("glfc", False),
                                            ("icarl_fl", False), ("fedavg_cil", True)])
def test_killed_at_the_task_boundary_resumes_bit_identical(method, written, tmp_path):
  _kill_and_resume(method, written, tmp_path)

"""cell.json after a kill mid-cell: the killed invocation is "killed", with the seconds of its
last heartbeat, and the cell's seconds count them."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from fedjax_het.grid import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]

#: A cell "trains" (sleeps) through training.train_recorded with a heartbeat every 0.2 s.
_KILLED_CELL = """
import pathlib, sys, time
from fedjax_het.grid import provenance, training
provenance.HEARTBEAT_SECS = 0.2
provenance.code_state = lambda cell_dirs: {}   # no git in this test

def train(config, cell_dir):
  print("training", flush=True)
  time.sleep(120)

training.train_recorded(None, pathlib.Path(sys.argv[1]), {"label": "t/cell"}, train)
"""


def test_a_killed_invocation_is_recorded_killed_with_the_seconds_of_its_last_heartbeat(
    tmp_path):
  cell = tmp_path / "cell"
  child = subprocess.Popen([sys.executable, "-c", _KILLED_CELL, str(cell)], cwd=REPO,
                           stdout=subprocess.PIPE, text=True)
  assert child.stdout.readline().strip() == "training"
  time.sleep(1.5)
  child.send_signal(signal.SIGKILL)  # reproduce.py killed mid-cell
  child.wait()
  killed = json.loads((cell / provenance.CELL_FILE).read_text())
  assert killed["invocations"][-1]["status"] == "running"  # nothing recorded its end
  beat = killed["invocations"][-1]["seconds"]
  assert beat >= 0.5
  record = provenance.update_cell_record(cell, {"label": "t/cell"}, status="running",
                                   new_invocation=True, extra={"pid": os.getpid()})
  first, second = record["invocations"]
  assert first["status"] == "killed" and first["seconds"] == beat
  assert second["status"] == "running" and second["pid"] == os.getpid()
  record = provenance.update_cell_record(cell, {"label": "t/cell"}, status="finished", seconds=2.0)
  assert record["seconds"] == round(beat + 2.0, 3)  # the killed part's time counts


def test_a_running_invocation_of_a_live_process_is_left_running(tmp_path):
  cell = tmp_path / "cell"
  provenance.update_cell_record(cell, {"label": "t/cell"}, status="running", new_invocation=True,
                          extra={"pid": os.getpid(), "host": __import__("socket").gethostname()})
  record = provenance.update_cell_record(cell, {"label": "t/cell"}, status="running",
                                   new_invocation=True)
  assert [i["status"] for i in record["invocations"]] == ["running", "running"]

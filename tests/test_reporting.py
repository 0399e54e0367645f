"""Progress bar rate/ETA arithmetic (no training)."""

import io

from fedjax_het import reporting


def test_progress_eta_leaves_out_the_compiling_first_round(monkeypatch):
  clock = iter([0.0, 100.0, 110.0, 120.0])  # init, round 1 (compile), rounds 2, 3
  monkeypatch.setattr(reporting.time, "perf_counter", lambda: next(clock))
  err = io.StringIO()
  monkeypatch.setattr(reporting.sys, "stderr", err)
  progress = reporting.Progress(5, enabled=True)
  progress.update(1, "")
  progress.update(2, "")
  progress.update(3, "acc 1.0")
  lines = err.getvalue().splitlines()
  assert "100.0 s/round, ETA 6.7 min" in lines[0]    # only the first round known: 4 x 100 s
  assert "10.0 s/round, ETA 0.5 min" in lines[1]     # (110 - 100) / 1 round, 3 left
  assert "acc 1.0 | 10.0 s/round, ETA 0.3 min" in lines[2]


def test_progress_disabled_writes_nothing(monkeypatch):
  err = io.StringIO()
  monkeypatch.setattr(reporting.sys, "stderr", err)
  reporting.Progress(3, enabled=False).update(1, "x")
  assert err.getvalue() == ""

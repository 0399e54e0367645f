"""A download command that fails leaves no empty data directory behind (and keeps a partial
download to resume)."""

from __future__ import annotations

import urllib.error

from fedjax_het.data import download as dl


def test_a_missing_from_path_creates_no_data_directory(tmp_path, capsys):
  data_dir = tmp_path / "new" / "data"
  assert dl.main(["mnist", "--data_dir", str(data_dir), "--from", str(tmp_path / "missing")]) == 1
  assert "no such file or folder" in capsys.readouterr().err
  assert not (tmp_path / "new").exists()


def test_a_failed_download_removes_the_folders_it_made_unless_they_hold_a_partial_file(
    tmp_path, monkeypatch, capsys):
  def offline(url, part, timeout, progress):
    raise urllib.error.URLError("Name or service not known")

  monkeypatch.setattr(dl, "_transfer", offline)
  data_dir = tmp_path / "new" / "data"
  assert dl.main(["mnist", "--data_dir", str(data_dir), "--timeout", "1"]) == 1
  assert "cannot download" in capsys.readouterr().err
  assert not (tmp_path / "new").exists()

  def cut_short(url, part, timeout, progress):
    part.write_bytes(b"partial")
    raise urllib.error.URLError("connection reset")

  monkeypatch.setattr(dl, "_transfer", cut_short)
  assert dl.main(["mnist", "--data_dir", str(data_dir), "--timeout", "1"]) == 1
  parts = list((data_dir / dl.DOWNLOADS / "mnist").glob("*.part"))
  assert parts and parts[0].read_bytes() == b"partial"  # kept: the next run resumes it

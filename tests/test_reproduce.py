"""experiments/reproduce.py, the resumable grid (fedjax_het.grid) and the table documents
(fedjax_het.reports.document), with hand-made cells where no training is needed."""

import hashlib
import json
import math
import pathlib
import subprocess

import numpy as np
import pytest

from fedjax_het import configs as configs_lib
from fedjax_het import workdir as workdir_lib
from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError, WorkdirError
from fedjax_het.grid import arguments
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.grid import provenance
from fedjax_het.grid import runner
from fedjax_het.reports import document, tables

REPO = pathlib.Path(__file__).resolve().parents[1]
reproduce = load_module(REPO / "experiments" / "reproduce.py")

DIGITS = ("mnist", "usps", "svhn", "syn")
REAL = {d: "npz:/data/digits.npz" for d in ("mnist", "usps")} | {
    "svhn": "tfds:svhn_cropped", "syn": "folder:/data/syn", "public": "npz:/data/p.npz"}


def _cell(table_id, row, seed, scale="quick", setting=None):
  table = tables.get_table(table_id)
  return next(c for c in cells_lib.plan(table, scale, [seed], [row],
                                   [setting] if setting else None))


def write_cell(results_dir, cell, numbers, *, rounds=None, status="finished", sources=REAL,
               seconds=10.0, device="cpu (test)", commit="abc1234def", overrides=()):
  """A finished (or partial) cell as the grid leaves it, without training."""
  config = cell_configs.cell_config(cell)
  path = cell.directory(results_dir)
  path.mkdir(parents=True, exist_ok=True)
  rounds = cell_configs.expected_rounds(config) if rounds is None else rounds
  (path / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n"
                                              for r in range(1, rounds + 1)))
  if status == "finished":
    (path / "results.json").write_text(json.dumps(numbers))
  (path / workdir_lib.RUN_FILE).write_text(json.dumps(
      {"config": workdir_lib.flatten_config(config)}))
  (path / "metadata.json").write_text(json.dumps(
      {"sources": sources, "train_sizes": {d: 100 for d in DIGITS},
       "test_sizes": {d: 30 for d in DIGITS}, "public_size": 1024}))
  (path / document.CELL_FILE).write_text(json.dumps(
      {"status": status, "seconds": seconds, "device_kind": device, "commit": commit,
       "overrides": list(overrides)}))
  return path


def _numbers(base):
  """results.json of a Digits run: inter = base + i, intra = base + 40 + i per domain i."""
  out = {}
  for kind, shift in (("inter", 0.0), ("intra", 40.0)):
    values = {d: base + shift + i for i, d in enumerate(DIGITS)}
    out[kind] = {**values, "AVG": sum(values.values()) / 4}
  return out


def _digits_results(results_dir, **kwargs):
  write_cell(results_dir, _cell("fcclplus_digits", "solo", 0), _numbers(10.0), **kwargs)
  write_cell(results_dir, _cell("fcclplus_digits", "solo", 1), _numbers(12.0), **kwargs)
  write_cell(results_dir, _cell("fcclplus_digits", "fcclplus", 0), _numbers(30.0), **kwargs)


def test_the_document_shows_mean_std_n_paper_delta_and_provenance(tmp_path):
  _digits_results(tmp_path)
  table = tables.get_table("fcclplus_digits")
  text, numbers = document.render(table, "quick", tmp_path)
  lines = text.splitlines()
  assert lines[0] == "## fcclplus_digits (quick scale): FCCL+ Tables VIII/IX: Digits"
  assert "- cells: 3 finished (seeds 0, 1); mean ± sample standard deviation (ddof=1) over the " \
         "seeds that finished (n shown)" in lines
  assert ("- data: mnist real (npz:digits.npz), usps real (npz:digits.npz), svhn real "
          "(tfds:svhn_cropped), syn real (folder:syn), public real (npz:p.npz)") in lines
  assert "- data sizes: train mnist 100, usps 100, svhn 100, syn 100; test mnist 30, usps 30, " \
         "svhn 30, syn 30; public 1024" in lines
  assert ("- the paper's setting: no (quick scale): the paper's numbers are shown for "
          "reference, not compared") in lines
  assert ("- runs: device cpu (test) (3 cells); code revision abc1234def (3 cells); trained its "
          "seed alone (3 cells); wall time 30.0 s in all (3 cells)") in lines
  # BASE: seeds 10 and 12 on mnist -> 11 ± sqrt(2); AVG 11.5, 13.5 -> 12.5 ± 1.41.
  base = next(line for line in lines if line.startswith("| BASE (solo) | 2 | 11.00 ± 1.41"))
  assert "| 12.50 ± 1.41 (paper 25.68) | - |" in base
  # FCCL+ (one seed): inter AVG 31.5, Δ 31.5 - 12.5 = +19.00; the paper's 50.49 - 25.68.
  plus = next(line for line in lines if line.startswith("| FCCL+ | 1 | 30.00 (paper 40.13)"))
  assert "| 31.50 (paper 50.49) | +19.00 (paper +24.81) |" in plus
  assert "| FedMD | 0 | – (paper 8.97) |" in text
  assert "FCCL = `digits.py:fccl_quick` with fccl.own_slot='current'" in text
  summary = numbers["settings"]["digits"]["summary"]
  assert summary["rows"]["solo"]["inter"]["mnist"]["std"] == pytest.approx(math.sqrt(2))
  assert numbers["wall_seconds"] == 30.0 and not numbers["in_paper_setting"]
  assert numbers["settings"]["digits"]["cells"]["solo"]["1"]["commit"] == "abc1234def"


def test_the_papers_setting_needs_paper_scale_real_data_and_no_overrides(tmp_path):
  write_cell(tmp_path, _cell("fcclplus_digits", "fcclplus", 0, "paper"), _numbers(45.0))
  table = tables.get_table("fcclplus_digits")
  text, numbers = document.render(table, "paper", tmp_path)
  assert numbers["in_paper_setting"]
  assert "- the paper's setting: yes (paper scale, real data, no overrides): ours − paper is " \
         "shown" in text
  plus = next(line for line in text.splitlines() if line.startswith("| FCCL+ |"))
  assert plus.endswith("| 46.50 (paper 50.49) | – (paper +24.81) | -3.99 |  |")  # no BASE run
  synthetic = tmp_path / "synthetic"
  write_cell(synthetic, _cell("fcclplus_digits", "fcclplus", 0, "paper"), _numbers(45.0),
             sources={**REAL, "svhn": "synthetic(seed=0; substituted for 'tfds')"},
             overrides=["num_rounds=3"])
  text, numbers = document.render(table, "paper", synthetic)
  assert not numbers["in_paper_setting"]
  assert "no (synthetic data for svhn; overrides num_rounds=3)" in text
  assert "svhn SYNTHETIC (synthetic(seed=<cell seed>; substituted for 'tfds'))" in text


def test_unfinished_cells_are_not_in_the_table(tmp_path):
  _digits_results(tmp_path)
  write_cell(tmp_path, _cell("fcclplus_digits", "fedmd", 0), _numbers(50.0), rounds=2,
             status="interrupted")
  _, numbers = document.render(tables.get_table("fcclplus_digits"), "quick", tmp_path)
  assert numbers["settings"]["digits"]["summary"]["rows_done"] == ["solo", "fcclplus"]


def test_report_rewrites_the_block_idempotently_and_the_check_sees_edits(tmp_path, capsys,
                                                                        monkeypatch):
  monkeypatch.setattr(cells_lib, "DEFAULT_RESULTS", tmp_path / "results")  # the shipped results
  _digits_results(tmp_path / "results")
  doc = tmp_path / "docs" / "results.md"
  other = ("# Results\n\nOther text.\n\n<!-- readme_results:x -->\nkept\n"
           "<!-- /readme_results -->\n")
  doc.parent.mkdir()
  doc.write_text(other)
  argv = ["--table=fcclplus_digits", "--report", f"--results-dir={tmp_path / 'results'}",
          f"--doc={doc}"]
  assert reproduce.main(argv) == 0
  first = doc.read_text()
  assert first.startswith(other + "\n" + document.DOC_SECTION + "\n<!-- reproduce:")
  [(table_id, scale, content)] = document.blocks(first)
  assert (table_id, scale) == ("fcclplus_digits", "quick")
  rendered, _ = document.render(tables.get_table("fcclplus_digits"), "quick",
                                tmp_path / "results")
  assert content == rendered
  assert (tmp_path / "results" / "fcclplus_digits" / "quick" / "table.md").read_text() == rendered
  assert document.stale_blocks(first, tmp_path / "results") == []
  assert document.rewrite("", "t", "quick", "x").startswith(
      document.DOC_TITLE + "\n" + document.DOC_SECTION)
  assert reproduce.main(argv) == 0
  assert doc.read_text() == first  # idempotent
  # A second table's block is added; the first stays where it is.
  write_cell(tmp_path / "results", _cell("glfc_table1", "glfc", 0),
             {"method": "GLFC", "classes_per_task": 5, "seen_accuracy": [0.5, 0.25, 0.2, 0.1],
              "average_incremental_accuracy": 0.2625, "forgetting": 0.3})
  assert reproduce.main(argv[:1] + ["--table=glfc_table1"] + argv[1:]) == 0
  both = doc.read_text()
  assert [b[0] for b in document.blocks(both)] == ["fcclplus_digits", "glfc_table1"]
  assert both.startswith(first.rstrip("\n"))
  assert "| GLFC (Ours) | 1 | 50.0 | 25.0 | 20.0 | 10.0 | 26.2 | 30.0 |" in both
  # A hand edit of a block, or results that changed since, make the block stale.
  edited = both.replace("12.50 ± 1.41", "12.60 ± 1.41", 1)
  assert document.stale_blocks(edited, tmp_path / "results") == ["fcclplus_digits:quick"]
  write_cell(tmp_path / "results", _cell("fcclplus_digits", "fcclplus", 1), _numbers(32.0))
  assert document.stale_blocks(both, tmp_path / "results") == ["fcclplus_digits:quick"]
  assert "report: " in capsys.readouterr().out


def test_docs_results_md_equals_what_results_holds():
  """docs/results.md's blocks are `--report`'s rendering of results/ (rerun --report)."""
  doc = REPO / "docs" / "results.md"
  text = doc.read_text()
  stale = document.stale_blocks(text, REPO / "results")
  assert not stale, ("stale blocks of docs/results.md: rerun python experiments/reproduce.py "
                     f"--table=<id> --scale=<scale> --report for {stale}")


def test_list_prints_one_line_per_table_with_its_finished_cells_per_scale(tmp_path, capsys):
  _digits_results(tmp_path)  # solo seeds 0 and 1, fcclplus seed 0 finished
  write_cell(tmp_path, _cell("fcclplus_digits", "fedmd", 0), _numbers(50.0), rounds=2,
             status="interrupted")
  assert reproduce.main(["--list", f"--results-dir={tmp_path}"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].split()[:8] == ["table", "finished", "cells", "in", str(tmp_path), "(of",
                                  "seeds", "0,"]
  # A directory other than the repository's results/: the last line says how to list those.
  assert len(lines) == len(tables.TABLES) + 3 and lines[-1].endswith("--results-dir=results")
  digits = next(line for line in lines if line.startswith("fcclplus_digits "))
  assert digits.split()[1:7] == ["quick", "3/21", "mid", "0/21", "paper", "0/21"]
  binary = next(line for line in lines if line.startswith("fedmmd_cifar10_binary "))
  assert binary.split()[3:5] == ["mid", "-"]  # a table without mid-scale configs
  shards = next(line for line in lines if line.startswith("fedmmd_mnist_shards "))
  assert shards.split()[3:5] == ["mid", "0/18"]
  assert reproduce.main(["--list", "--seeds=0", "--table=fcclplus_digits",
                         f"--results-dir={tmp_path}"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[1].split()[1:3] == ["quick", "2/7"]


def test_unpinned_cells_are_counted_never_copied_and_retrained_on_request(tmp_path, capsys,
                                                                         monkeypatch):
  """A cell trained from uncommitted changes without their patch is "unpinned": --list counts
  it, no twin is copied from it, --retrain-unpinned deletes it and trains it again."""
  assert not provenance.unpinned({"dirty": False, "invocations": [{"dirty": False}]})
  assert not provenance.unpinned({"dirty": True, "patch_sha256": "ab",
                                  "invocations": [{"dirty": True, "patch_sha256": "ab"}]})
  assert not provenance.unpinned({"status": "finished"})  # a record without the field
  # The last invocation clean, an earlier one dirty without a patch: still unpinned.
  assert provenance.unpinned({"dirty": False, "invocations": [{"dirty": True}, {"dirty": False}]})
  solo0, solo1 = _cell("fcclplus_digits", "solo", 0), _cell("fcclplus_digits", "solo", 1)
  write_cell(tmp_path, solo0, _numbers(10.0))
  loose = write_cell(tmp_path, solo1, _numbers(12.0))
  record = json.loads((loose / "cell.json").read_text())
  (loose / "cell.json").write_text(json.dumps({**record, "dirty": True,
                                               "invocations": [{"dirty": True}]}))
  assert reproduce.main(["--list", f"--results-dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert "no commit pins" in out and "fcclplus_digits quick 1" in out
  # FCCL Tables 1/2's BASE on Digits is the same run as FCCL+'s: seed 0 has a pinned twin.
  twin0 = _cell("fccl_tables1_2", "solo", 0, setting="digits")
  twin1 = _cell("fccl_tables1_2", "solo", 1, setting="digits")
  config0, config1 = cell_configs.cell_config(twin0), cell_configs.cell_config(twin1)
  from fedjax_het.grid import twins
  assert twins.find_twin(twin0, config0, tmp_path) == solo0.directory(tmp_path)
  assert twins.find_twin(twin1, config1, tmp_path) is None
  # --retrain-unpinned deletes the unpinned cell (a dry run only says so) and trains it.
  args = ["--table=fcclplus_digits", "--methods=solo", "--seeds=0,1",
          f"--results-dir={tmp_path}", "--retrain-unpinned"]
  assert reproduce.main([*args, "--dry-run"]) == 0
  assert "would delete" in capsys.readouterr().out and loose.exists()
  calls = []
  monkeypatch.setattr(provenance, "git_commit", lambda: ("0" * 40, False))
  monkeypatch.setattr(runner, "run", lambda cells, **kw: calls.append(
      [c.label for c in cells if not (c.directory(tmp_path) / "results.json").exists()]))
  assert reproduce.main(args) == 0
  assert not loose.exists() and solo0.directory(tmp_path).exists()
  assert calls == [["fcclplus_digits/quick/solo__seed1"]]


def test_list_prints_every_table_and_each_cells_status(tmp_path, capsys):
  _digits_results(tmp_path)
  write_cell(tmp_path, _cell("fcclplus_digits", "fedmd", 0), _numbers(50.0), rounds=2,
             status="interrupted")
  assert reproduce.main(["--list", "--cells", f"--results-dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  for table_id in tables.TABLES:
    assert f"\n{table_id}: " in "\n" + out
  lines = out.splitlines()
  start = lines.index("fcclplus_digits: FCCL+ Tables VIII/IX: Digits [domain_shift]")
  block = lines[start:start + 12]
  assert block[1] == "  paper: FCCL+ (Huang et al., TPAMI 2023), Tables VIII (inter →) and IX " \
                     "(intra ↩)"
  assert block[2].split() == ["cell", "quick", "mid", "paper", "config", "(paper", "scale)"]
  assert block[3].split() == ["solo__seed0", "finished", "-", "-", "digits.py:solo"]
  assert block[4].split() == ["solo__seed1", "finished", "-", "-", "digits.py:solo"]
  assert block[5].split()[:6] == ["fedmd__seed0", "partial", "(round", "2", "of", "5)"]
  assert "fccl__seed0" in block[9] and "+fccl.own_slot='current'" in block[9]
  assert reproduce.main(["--list", "--cells", "--table=fedfusion_table1",
                         f"--results-dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[3].split() == ["mnist_permuted__fedavg__seed0", "-", "n/a", "-",
                                         "mnist.py:fedavg_permuted"]
  # FCCL Tables 1/2's BASE on Digits is the finished FCCL+ BASE cell: a copy is ready.
  assert reproduce.main(["--list", "--cells", "--table=fccl_tables1_2",
                         f"--results-dir={tmp_path}"]) == 0
  rows = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
  assert rows[0][:6] == ["digits__solo__seed0", "-", "(a", "copy", "is", "ready)"]
  assert rows[1][:4] == ["digits__fedmd__seed0", "-", "n/a", "-"]


def test_bad_arguments_print_one_line_and_write_nothing(tmp_path, capsys):
  results = f"--results-dir={tmp_path / 'r'}"
  for argv, message in [
      (["--table=nope"], "error: --table='nope' is not allowed; allowed tables: "),
      (["--table=fcclplus_digits", "--scale=full"], "error: --scale='full' is not allowed; "
                                                    "allowed scales: quick, mid, paper."),
      (["--table=fedmmd_cifar10_binary", "--scale=mid"],
       "error: --scale='mid' is not allowed for table fedmmd_cifar10_binary; allowed scales: "
       "quick, paper."),
      (["--table=fcclplus_digits", "--seeds=0,x"], "error: --seeds must be comma-separated "
                                                   "integers (e.g. 0,1,2), got '0,x'."),
      (["--table=fcclplus_digits", "--methods=solo,fedavg"],
       "error: --methods: unknown row(s) 'fedavg' of table fcclplus_digits; allowed: solo, "),
      (["--table=fcclplus_digits", "--set", "num_round=2"],
       "error: --set num_round=2: the config has no field 'num_round'; did you mean "
       "'num_rounds'?"),
      (["--queue=gpu", "--table=fcclplus_digits"], "error: --queue and --table exclude each "
                                                   "other: pass one."),
      (["--queue=cpu"], "error: --queue='cpu' is not allowed; allowed queues: gpu, mid, htfl."),
      (["--report"], "error: --report needs --table=<id>[,<id>...]."),
      ([], "error: pass --table=<id> (or --queue=<name>, --list); table ids: fcclplus_digits, "),
  ]:
    assert reproduce.main(argv + [results]) == 1, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), (argv, err)
  assert not (tmp_path / "r").exists()


def test_dry_run_prints_the_gpu_queue_in_priority_order(tmp_path, capsys):
  write_cell(tmp_path, _cell("fcclplus_office31", "fcclplus", 0, "paper", "office31"), {})
  assert reproduce.main(["--queue=gpu", "--scale=paper", "--dry-run",
                         f"--results-dir={tmp_path}"]) == 0
  lines = capsys.readouterr().out.splitlines()
  labels = [line.split(": ")[0].split("] ")[1] for line in lines]
  assert labels == [
      "fcclplus_office31/paper/fcclplus__seed0", "fcclplus_office31/paper/solo__seed0",
      "fcclplus_digits/paper/fcclplus__seed0", "fcclplus_digits/paper/solo__seed0",
      "fedfusion_table2/paper/fedavg__seed0", "fedfusion_table2/paper/fedfusion_single__seed0",
      "fedfusion_table2/paper/fedfusion_multi__seed0",
      "fedfusion_table2/paper/fedfusion_conv__seed0", "glfc_table1/paper/fedavg_cil__seed0",
      "glfc_table1/paper/icarl_fl__seed0", "glfc_table1/paper/bic_fl__seed0",
      "glfc_table1/paper/podnet_fl__seed0", "glfc_table1/paper/dde_icarl_fl__seed0",
      "glfc_table1/paper/geodl_icarl_fl__seed0", "glfc_table1/paper/ssil_fl__seed0",
      "glfc_table1/paper/glfc_no_cgc__seed0",
      "glfc_table1/paper/glfc_no_crd__seed0", "glfc_table1/paper/glfc_no_proxy__seed0",
      "glfc_table1/paper/glfc__seed0"]
  assert lines[0].startswith("[1/19] fcclplus_office31/paper/fcclplus__seed0: skip (finished); "
                             "office.py:office31_fcclplus -> ")
  assert ": train; digits.py:solo -> " in lines[3]
  assert not (tmp_path / "invocations.jsonl").exists()


def _stand_in(calls):
  """A trainer that writes what a finished run leaves, without JAX training."""
  def train(config, workdir):
    calls.append(pathlib.Path(workdir).name)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.jsonl").write_text("".join(
        json.dumps({"round": r}) + "\n"
        for r in range(1, cell_configs.expected_rounds(config) + 1)))
    (workdir / workdir_lib.RUN_FILE).write_text(json.dumps(
        {"config": workdir_lib.flatten_config(config)}))
    (workdir / "metadata.json").write_text(json.dumps({"sources": REAL}))
    (workdir / "results.json").write_text(json.dumps(_numbers(10.0 + config.seed)))
  return train


def test_the_grid_trains_skips_finished_cells_and_refuses_changed_ones(tmp_path):
  calls, lines = [], []
  cells = cells_lib.plan(tables.get_table("fcclplus_digits"), "quick", [0, 1], ["solo", "fcclplus"])
  assert [c.name for c in cells] == ["solo__seed0", "fcclplus__seed0", "solo__seed1",
                                     "fcclplus__seed1"]
  # An interrupted cell: records of 2 of its 5 rounds and a checkpoint directory.
  partial = cells[1].directory(tmp_path)
  partial.mkdir(parents=True)
  (partial / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
  (partial / "checkpoints").mkdir()
  out = runner.run(cells, results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
                 figures=False)
  assert calls == ["solo__seed0", "fcclplus__seed0", "solo__seed1", "fcclplus__seed1"]
  assert list(out["statuses"].values()) == ["trained", "resumed", "trained", "trained"]
  assert "[2/4] fcclplus_digits/quick/fcclplus__seed0: resuming 5 rounds in " in lines[2]
  record = json.loads((cells[0].directory(tmp_path) / "cell.json").read_text())
  assert record["status"] == "finished" and record["seconds"] >= 0
  assert record["device_kind"].startswith("cpu") and record["variant"] == "solo_quick"
  assert len(record["invocations"]) == 1 and record["overrides"] == []
  table_md = (tmp_path / "fcclplus_digits" / "quick" / "table.md").read_text()
  assert table_md == document.render(tables.get_table("fcclplus_digits"), "quick", tmp_path)[0]
  assert "- cells: 4 finished (seeds 0, 1)" in table_md
  # Again: nothing trains, the table is the same.
  lines.clear()
  again = runner.run(cells, results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
                   figures=False)
  assert len(calls) == 4 and set(again["statuses"].values()) == {"skipped"}
  assert lines[0].startswith("[1/4] fcclplus_digits/quick/solo__seed0: skipped (finished "
                             "earlier), AVG inter 11.50 intra 51.50")
  assert (tmp_path / "fcclplus_digits" / "quick" / "table.md").read_text() == table_md
  invocations = [json.loads(line) for line in
                 (tmp_path / "invocations.jsonl").read_text().splitlines()]
  assert [[c["status"] for c in i["cells"]] for i in invocations] == [
      ["trained", "resumed", "trained", "trained"], ["skipped"] * 4]
  # A finished cell with another config is not silently reused.
  with pytest.raises(WorkdirError, match="config.local.epochs: 5 -> 2"):
    runner.run(cells[:1], results_dir=tmp_path, overrides=["local.epochs=2"],
             train=_stand_in(calls), echo=lines.append)


def test_a_cell_another_table_holds_finished_is_copied_with_its_source(tmp_path, monkeypatch):
  monkeypatch.setattr(provenance, "git_commit", lambda: ("0" * 40, False))  # a clean tree: no patch
  calls, lines = [], []
  base = [_cell("fcclplus_digits", "solo", 0), _cell("fcclplus_digits", "solo", 1)]
  runner.run(base, results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
           overrides=[], figures=False)
  (base[0].directory(tmp_path) / "checkpoints").mkdir()  # kept by a finished run here
  original = json.loads((base[0].directory(tmp_path) / "cell.json").read_text())
  # FCCL Tables 1/2 on Digits: BASE is FCCL+ Table VIII/IX's BASE (same config file, variant,
  # row fields and seed); its FCCL row is not (FCCL+'s table sets fccl.own_slot).
  cells = [_cell("fccl_tables1_2", "solo", 0, setting="digits"),
           _cell("fccl_tables1_2", "fccl", 0, setting="digits")]
  # A fresh cell's directory of a failed start and a half copy a kill left are replaced.
  copy = cells[0].directory(tmp_path)
  copy.mkdir(parents=True)
  (copy / "cell.json").write_text('{"status": "failed"}')
  (copy.parent / f".{copy.name}.copying").mkdir()
  (copy.parent / f".{copy.name}.copying" / "results.json").write_text("{")
  lines.clear()
  out = runner.run(cells, results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
                 figures=False)
  assert calls == ["solo__seed0", "solo__seed1", "digits__fccl__seed0"]
  assert not (copy.parent / f".{copy.name}.copying").exists()
  assert list(out["statuses"].values()) == ["copied", "trained"]
  assert lines[0].startswith("[1/2] fccl_tables1_2/quick/digits__solo__seed0: copied from "
                             "fcclplus_digits/quick/solo__seed0 (the same run, finished there)")
  assert sorted(p.name for p in copy.iterdir()) == [
      "cell.json", "metadata.json", "metrics.jsonl", "results.json", "run.json"]
  for name in ("metadata.json", "metrics.jsonl", "results.json", "run.json"):
    assert (copy / name).read_bytes() == (base[0].directory(tmp_path) / name).read_bytes()
  record = json.loads((copy / "cell.json").read_text())
  assert record["copy_of"] == "fcclplus_digits/quick/solo__seed0"
  assert record["table"] == "fccl_tables1_2" and record["cell"] == "digits__solo__seed0"
  assert record["seconds"] == original["seconds"]  # the wall time of the run that made it
  assert record["device_kind"] == original["device_kind"]
  assert record["invocations"][:-1] == original["invocations"]
  assert record["invocations"][-1]["seconds"] == 0.0 and record["status"] == "finished"
  table_md = (tmp_path / "fccl_tables1_2" / "quick" / "table.md").read_text()
  assert ("- shared runs: 1 of the cells are the same run (config and seed) as a finished cell "
          "of another table, copied from it: fcclplus_digits (1 cell); each cell's cell.json "
          "names its source (`copy_of`)") in table_md
  # A copy of a copy names the run that produced the numbers; a rerun skips the copy.
  table10 = _cell("fcclplus_table10", "solo", 0, setting="digits")
  (tmp_path / "fcclplus_digits" / "quick" / "solo__seed0" / "results.json").rename(
      tmp_path / "hidden.json")  # only the copy in fccl_tables1_2 is finished now
  runner.run([table10], results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
           figures=False)
  assert json.loads((table10.directory(tmp_path) / "cell.json").read_text())["copy_of"] == \
      "fcclplus_digits/quick/solo__seed0"
  again = runner.run(cells[:1], results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
                   figures=False)
  assert list(again["statuses"].values()) == ["skipped"] and len(calls) == 3
  # Another --set, or copy_twins=False, trains.
  other = _cell("fccl_tables1_2", "solo", 1, setting="digits")
  runner.run([other], results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
           overrides=["local.epochs=2"], figures=False)
  assert calls[-1] == "digits__solo__seed1"
  fresh = _cell("fcclplus_table16", "fcclplus", 0, setting="digits")
  runner.run([_cell("fcclplus_digits", "fcclplus", 0)], results_dir=tmp_path,
           train=_stand_in(calls), echo=lines.append, figures=False)
  runner.run([fresh], results_dir=tmp_path, train=_stand_in(calls), echo=lines.append,
           figures=False, copy_twins=False)
  assert calls[-2:] == ["fcclplus__seed0", "digits__fcclplus__seed0"]
  assert "copy_of" not in json.loads((fresh.directory(tmp_path) / "cell.json").read_text())


def test_a_deadline_too_close_starts_no_cell_and_says_so(tmp_path):
  lines = []
  cells = cells_lib.queue_plan("gpu", "quick", [0])
  out = runner.run(cells, results_dir=tmp_path, deadline_secs=5, min_cell_secs=10,
                 echo=lines.append, copy_to=tmp_path / "out")
  assert out["deadline_reached"] and set(out["statuses"].values()) == {"not started"}
  assert lines[0].startswith("[1/19] fcclplus_office31/quick/fcclplus__seed0: not started (")
  assert "deadline, a cell needs 10 s); rerun to continue" in lines[0]
  [record] = [json.loads(line) for line in
              (tmp_path / "invocations.jsonl").read_text().splitlines()]
  assert record["deadline_secs"] == 5 and record["deadline_reached"]
  assert len(record["cells"]) == 19
  assert (tmp_path / "out" / tmp_path.name / "invocations.jsonl").exists()


def test_cells_of_one_partitioned_setting_need_the_same_targets(tmp_path):
  cells = cells_lib.plan(tables.get_table("fedfusion_table2"), "quick", [0], ["fedavg",
                                                                         "fedfusion_conv"])

  def configure(config, cell):
    config.eval.targets = (90.0,) if cell.row.key == "fedavg" else (94.0,)

  with pytest.raises(ConfigError, match="eval.targets differ"):
    runner.run(cells, results_dir=tmp_path / "r", configure=configure)
  assert not (tmp_path / "r").exists()


def test_overrides_are_parsed_against_the_field_types():
  config = cell_configs.cell_config(_cell("fcclplus_digits", "fcclplus", 3), [
      "num_rounds=1", "models.width=1", "logging.diagnostic_rounds=(1,)",
      "scenario.sources.syn=folder:/x", "logging.plots=false"])
  assert config.seed == 3 and config.num_rounds == 1 and config.models.width == 1.0
  assert tuple(config.logging.diagnostic_rounds) == (1,)
  assert config.scenario.sources.syn == "folder:/x" and config.logging.plots is False
  assert config.name == "digits_fcclplus_quick_seed3"
  with pytest.raises(ConfigError, match="local has no field 'epoch'; did you mean "
                     "'local.epochs'"):
    arguments.apply_overrides(config, ["local.epoch=2"])
  with pytest.raises(ConfigError, match="cannot set config.logging.plots"):
    arguments.apply_overrides(config, ["logging.plots=maybe"])
  with pytest.raises(ConfigError, match="expects <dotted config field>=<value>"):
    arguments.apply_overrides(config, ["num_rounds"])
  # Output-only overrides keep the paper setting; those changing results do not.
  assert arguments.significant_overrides(["logging.plots=false", "num_rounds=1"], config) == [
      "num_rounds=1"]
  assert configs_lib.resolve_name("cifar100_glfc_quick") == (
      REPO / "fedjax_het" / "configs" / "cifar100.py", "glfc_quick")
  with pytest.raises(ConfigError, match="the families: cifar10, cifar100, digits"):
    configs_lib.resolve_name("nosuchscenario_x")


# --- the aliases ------------------------------------------------------------------------------


def test_the_old_commands_are_aliases_with_one_line_errors(capsys, tmp_path):
  benchmark = load_module(REPO / "experiments" / "benchmark.py")
  rounds = load_module(REPO / "experiments" / "rounds_benchmark.py")
  cil = load_module(REPO / "experiments" / "cil_benchmark.py")
  work = f"--workdir={tmp_path / 'w'}"
  for main, argv, message in [
      (benchmark.main, ["--scenario=digits", "--methods=solo,fedavgg", work],
       "error: --methods: unknown row(s) 'fedavgg' of table fcclplus_digits; allowed: solo, "
       "fedmd, feddf, fedmatch, rhfl, fccl, fcclplus."),
      (benchmark.main, ["--scenario=office", work], "error: --scenario='office' is not "
       "allowed; allowed scenarios: digits, office31, office_caltech, office_home."),
      (rounds.main, ["--dataset=mnist", "--setting=permuted", "--methods=fedavg,fedprox", work],
       "error: --methods: unknown method(s) 'fedprox'; allowed methods: fedavg, fedmmd, "
       "fedmmd_l2, fedfusion_single, fedfusion_multi, fedfusion_conv."),
      (rounds.main, ["--dataset=mnist", "--setting=iid", work],
       "error: --setting='iid' is not allowed for mnist; allowed settings: binary, shards, "
       "permuted."),
      (rounds.main, ["--dataset=svhn", "--setting=iid", work],
       "error: --dataset='svhn' is not allowed; allowed datasets: cifar10, mnist."),
      (cil.main, ["--configs=cifar100_fedavg_cil_quick,digits_fedavg_quick", work],
       "error: --configs: not class-incremental (scenario.name must be 'class_incremental'): "
       "digits_fedavg_quick (scenario.name='digits')"),
      (cil.main, ["--configs=cifar100_nosuchvariant", work],
       "error: 'cifar100_nosuchvariant': cifar100 config: expected one of"),
      (cil.main, ["--configs=cifar100_glfc_quick", "--set", "cil.round_per_task=1", work],
       "error: --set cil.round_per_task=1: cil has no field 'round_per_task'; did you mean "
       "'cil.rounds_per_task'?"),
  ]:
    assert main(argv) == 1, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), (argv, err)
  assert not (tmp_path / "w").exists()
  # The FCCL+ alias is the registry's table at the scale --quick picks.
  args = benchmark.build_parser().parse_args(["--scenario=office31", "--quick"])
  assert (args.scenario, args.quick, args.workdir) == ("office31", True,
                                                       str(cells_lib.DEFAULT_RESULTS))


def test_class_incremental_layouts_must_match(tmp_path):
  from tests.test_cil_train import tiny_cil_config  # pylint: disable=import-outside-toplevel
  cil = load_module(REPO / "experiments" / "cil_benchmark.py")
  four_tasks = tiny_cil_config()
  four_tasks.scenario.num_tasks = 4
  with pytest.raises(ConfigError, match=r"task layouts differ.*two: 2 tasks of 2 classes, "
                     r"four: 4 tasks of 1 classes"):
    cil.run_cil_benchmark({"two": tiny_cil_config(), "four": four_tasks}, [0],
                          workdir=tmp_path / "w", echo=lambda _: None)
  assert not (tmp_path / "w").exists()


# --- training: tiny configs ------------------------------------------------------------------

#: A quick FedFusion cell shrunk (as a command line would pass it; "" disables the cache).
TINY = ("num_rounds=2", "scenario.train_size=200", "scenario.test_size=100", "local.epochs=1",
        "logging.progress=False", "logging.plots=False", "compilation_cache_dir=")


def test_end_to_end_the_command_trains_skips_and_reports(tmp_path, monkeypatch, capsys,
                                                         tmp_path_factory):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  results = tmp_path / "results"
  argv = ["--table=fedfusion_table2", "--methods=fedavg,fedfusion_conv", "--seeds=0",
          f"--results-dir={results}"] + [a for o in TINY for a in ("--set", o)]
  assert reproduce.main(argv) == 0
  out = capsys.readouterr().out
  assert "[2/2] fedfusion_table2/quick/fedfusion_conv__seed0: trained" in out
  table_dir = results / "fedfusion_table2" / "quick"
  for name in ("table.md", "table.json", "accuracy.png"):
    assert (table_dir / name).exists(), name
  numbers = json.loads((table_dir / "table.json").read_text())
  summary = numbers["settings"]["mnist_permuted"]["summary"]
  assert summary["kind"] == "intra" and summary["rows_done"] == ["fedavg", "fedfusion_conv"]
  for row in ("fedavg", "fedfusion_conv"):
    cell = table_dir / f"{row}__seed0"
    own = json.loads((cell / "results.json").read_text())
    assert summary["final"][row]["per_seed"] == {"0": own["intra"]["AVG"]}
    for key, reached in own["rounds_to_target"].items():
      assert summary["rounds"][row][key]["per_seed"] == {
          "0": None if reached is None else float(reached)}
    record = json.loads((cell / "cell.json").read_text())
    assert record["status"] == "finished" and record["overrides"] == [
        "num_rounds=2", "scenario.train_size=200", "scenario.test_size=100", "local.epochs=1"]
  # FedFusion sends the trunk, the 1x1 fusion conv and the classifier: more than FedAvg.
  per_round = summary["bytes_per_round"]
  assert per_round["fedfusion_conv"]["up"] > per_round["fedavg"]["up"] > 0
  markdown = (table_dir / "table.md").read_text()
  assert "SYNTHETIC" in markdown and "overrides num_rounds=2" in markdown
  assert "| FedFusion+Conv | 1 |" in markdown and "(paper 95.79)" in markdown

  # Again: both cells finished, nothing retrained, the same table; then the docs block.
  assert reproduce.main(argv) == 0
  out = capsys.readouterr().out
  assert "[1/2] fedfusion_table2/quick/fedavg__seed0: skipped (finished earlier)" in out
  assert "reproduce: 2 skipped" in out
  assert (table_dir / "table.md").read_text() == markdown
  doc = tmp_path / "results.md"
  monkeypatch.setattr(cells_lib, "DEFAULT_RESULTS", results)  # the shipped results: a docs block
  assert reproduce.main(["--table=fedfusion_table2", "--report", f"--results-dir={results}",
                         f"--doc={doc}"]) == 0
  assert document.blocks(doc.read_text())[0][2] == markdown
  assert document.stale_blocks(doc.read_text(), results) == []


@pytest.mark.slow  # about 17 s; tests/test_seed_stack.py checks seed-by-seed equality
def test_a_rows_fresh_seeds_train_as_one_program_and_equal_separate_runs(tmp_path, monkeypatch,
                                                                        capsys, tmp_path_factory):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  argv = ["--table=fedfusion_table2", "--methods=fedavg", "--seeds=0,1"] + [
      a for o in TINY for a in ("--set", o)]
  assert reproduce.main(argv + [f"--results-dir={tmp_path / 'stacked'}"]) == 0
  out = capsys.readouterr().out
  assert "fedavg__seed0: training seeds 0, 1 of fedavg as one program" in out
  assert reproduce.main(argv + [f"--results-dir={tmp_path / 'separate'}",
                                "--separate-seeds"]) == 0
  assert "as one program" not in capsys.readouterr().out
  for seed in (0, 1):
    cells = [tmp_path / kind / "fedfusion_table2" / "quick" / f"fedavg__seed{seed}"
             for kind in ("stacked", "separate")]
    stacked, separate = [json.loads((c / "results.json").read_text()) for c in cells]
    np.testing.assert_allclose(stacked["intra"]["AVG"], separate["intra"]["AVG"], atol=1e-6)
    record = json.loads((cells[0] / "cell.json").read_text())
    assert record["status"] == "finished" and record["invocations"][-1]["stacked_seeds"] == [0, 1]
    assert "stacked_seeds" not in json.loads((cells[1] / "cell.json").read_text())[
        "invocations"][-1]


def _tiny(config, cell):
  """Shrinks a quick digits or FedFusion cell to seconds of training."""
  config.logging.progress = False
  config.logging.plots = False
  config.compilation_cache_dir = ""
  config.local.epochs = 1
  config.num_rounds = 2
  if cell.table.family == "partitioned":
    config.scenario.train_size = 200
    config.scenario.test_size = 100
    return
  config.models.architectures = ("simple_cnn",) * 4
  config.local.batch_size = 16
  config.scenario.public_size = 64
  config.scenario.private_sizes.update({"mnist": 30, "usps": 20, "svhn": 40, "syn": 24})
  config.scenario.test_size = 30
  config.eval.batch_size = 30
  config.logging.diagnostic_rounds = ()


@pytest.mark.slow
def test_the_gpu_commands_deadline_stops_records_and_resumes(tmp_path, monkeypatch,
                                                             tmp_path_factory):
  """The GPU command's mode on the CPU: cells in child processes under a deadline."""
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  monkeypatch.setitem(tables.QUEUES, "tiny", (("fcclplus_digits", ("fcclplus",)),
                                              ("fedfusion_table2", ("fedavg",))))

  def configure(config, cell):  # 8 rounds of FCCL+: well past the first deadline
    _tiny(config, cell)
    if cell.table.family == "domain_shift":
      config.num_rounds = 8

  cells = cells_lib.queue_plan("tiny", "quick", [0])
  results, copies, lines = tmp_path / "results", tmp_path / "out", []
  common = dict(results_dir=results, configure=configure, copy_to=copies, echo=lines.append)
  # 1. A deadline shorter than a cell: the first is stopped, the second never starts.
  first = runner.run(cells, deadline_secs=8, min_cell_secs=1, **common)
  assert list(first["statuses"].values()) == ["interrupted", "not started"]
  assert first["deadline_reached"]
  plus = cells[0].directory(results)
  assert json.loads((plus / "cell.json").read_text())["status"] == "interrupted"
  assert (copies / "results" / "invocations.jsonl").exists()
  # 2. Time enough: the interrupted cell is trained on, the other trained; their files come
  #    back to the copy as they finish.
  second = runner.run(cells, deadline_secs=900, min_cell_secs=1, **common)
  assert second["statuses"][cells[0].label] in ("resumed", "trained")
  assert second["statuses"][cells[1].label] == "trained" and not second["deadline_reached"]
  record = json.loads((plus / "cell.json").read_text())
  assert [i["status"] for i in record["invocations"]] == ["interrupted", "finished"]
  assert record["seconds"] == pytest.approx(sum(i["seconds"] for i in record["invocations"]),
                                            abs=0.01)
  assert record["device_kind"].startswith("cpu")
  for cell in cells:
    mirrored = copies / "results" / cell.directory(results).relative_to(results)
    assert (mirrored / "results.json").exists() and not (mirrored / "checkpoints").exists()
  assert (copies / "results" / "fedfusion_table2" / "quick" / "table.md").exists()
  # 3. Finished cells are skipped even past a deadline.
  third = runner.run(cells, deadline_secs=1, min_cell_secs=10, **common)
  assert set(third["statuses"].values()) == {"skipped"}
  invocations = [json.loads(line) for line in
                 (results / "invocations.jsonl").read_text().splitlines()]
  assert [[c["status"] for c in i["cells"]] for i in invocations] == [
      ["interrupted", "not started"], [second["statuses"][cells[0].label], "trained"],
      ["skipped", "skipped"]]


def _git(repo, *args):
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                 check=True, capture_output=True)


def test_a_cell_trained_from_uncommitted_changes_keeps_their_patch(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  (repo / "fedjax_het").mkdir(parents=True)
  (repo / "results").mkdir()
  (repo / "fedjax_het" / "m.py").write_text("x = 1\n")
  (repo / "results" / "r.json").write_text("{}\n")
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "c")
  monkeypatch.setattr(cells_lib, "REPO", repo)
  cells = [tmp_path / "cells" / "a", tmp_path / "cells" / "b"]
  clean = provenance.code_state(cells)
  assert clean["dirty"] is False and "patch_sha256" not in clean
  # Results the runner writes (a cell retrained in place) are not code: still clean.
  (repo / "results" / "r.json").unlink()
  assert provenance.code_state(cells)["dirty"] is False
  _git(repo, "checkout", "-q", "--", "results")
  assert not any((c / provenance.PATCH_FILE).exists() for c in cells)
  # A change to the code and one to results/: the patch holds the code's alone.
  (repo / "fedjax_het" / "m.py").write_text("x = 2\n")
  (repo / "results" / "r.json").write_text("{\"changed\": 1}\n")
  state = provenance.code_state(cells)
  assert state["dirty"] is True and state["commit"] == clean["commit"]
  for cell in cells:
    patch = (cell / provenance.PATCH_FILE).read_bytes()
    assert b"-x = 1" in patch and b"+x = 2" in patch and b"r.json" not in patch
    assert hashlib.sha256(patch).hexdigest() == state["patch_sha256"]
  # The patch applied to the commit gives the code that trained.
  _git(repo, "stash", "-q")
  _git(repo, "apply", str(cells[0] / provenance.PATCH_FILE))
  assert (repo / "fedjax_het" / "m.py").read_text() == "x = 2\n"
  # cell.json records it, and a later clean invocation is the last word.
  record = provenance.update_cell_record(cells[0], {"cell": "a"}, status="running",
                                   new_invocation=True, extra=state)
  assert record["patch_sha256"] == state["patch_sha256"] and record["dirty"] is True
  record = provenance.update_cell_record(cells[0], {"cell": "a"}, status="running",
                                   new_invocation=True, extra=clean)
  assert "patch_sha256" not in record and record["dirty"] is False
  assert record["invocations"][0]["patch_sha256"] == state["patch_sha256"]


def test_the_runs_line_says_whether_each_seed_trained_alone_or_stacked():
  cells = [{"cell": {"commit": "a" * 40, "device_kind": "cpu", "seconds": 1.0}},
           {"cell": {"commit": "a" * 40, "device_kind": "cpu", "seconds": 1.0,
                     "invocations": [{"stacked_seeds": [0, 1]}]}},
           {"cell": {"commit": "b" * 40, "dirty": True, "patch_sha256": "f" * 64,
                     "device_kind": "cpu", "seconds": 1.0, "stacked_seeds": [0, 1]}}]
  assert document.runs_line(cells) == (
      "device cpu (3 cells); code revision aaaaaaaaaa (2 cells), bbbbbbbbbb with local changes "
      "(their patch beside the cell) (1 cell); trained its seed alone (1 cell), its seed in a "
      "program of several stacked seeds (2 cells); wall time 3.0 s in all (3 cells)")


def test_a_users_cells_go_to_their_own_directory_beside_the_shipped_ones(tmp_path, monkeypatch,
                                                                        capsys):
  # The default --results-dir is runs/reproduce/, not the shipped results/: a shipped cell
  # never makes a user's run skip. The report sets the user's cells beside the shipped ones.
  assert reproduce.build_parser().parse_args([]).results_dir == str(reproduce.USER_RESULTS)
  assert reproduce.USER_RESULTS != cells_lib.DEFAULT_RESULTS
  shipped, yours = tmp_path / "shipped", tmp_path / "yours"
  _digits_results(shipped)  # solo seeds 0, 1 (AVG inter 11.5, 13.5), fcclplus seed 0
  write_cell(yours, _cell("fcclplus_digits", "solo", 0), _numbers(20.0))
  monkeypatch.setattr(cells_lib, "DEFAULT_RESULTS", shipped)
  assert not reproduce.shipped(yours) and reproduce.shipped(shipped)
  doc = tmp_path / "results.md"
  doc.write_text("# Results\n")
  assert reproduce.main(["--table=fcclplus_digits", "--report", f"--results-dir={yours}",
                         f"--doc={doc}"]) == 0
  assert doc.read_text() == "# Results\n"  # the shipped document is not the user's
  beside = (yours / "fcclplus_digits" / "quick" / reproduce.BESIDE_FILE).read_text()
  assert (yours / "fcclplus_digits" / "quick" / "table.md").exists()
  lines = beside.splitlines()
  assert lines[0] == "## fcclplus_digits (quick scale): your cells beside the shipped ones"
  header = next(line for line in lines if line.startswith("| method |"))
  assert header == ("| method | inter AVG: yours | inter AVG: shipped | intra AVG: yours | "
                    "intra AVG: shipped | inter AVG: paper | intra AVG: paper |")
  base = next(line for line in lines if line.startswith("| BASE (solo) |"))
  # Yours: seed 0 at base 20 -> inter AVG 21.5; shipped: 11.5 and 13.5 -> 12.50 ± 1.41 (2).
  assert base == ("| BASE (solo) | 21.50 (1) | 12.50 ± 1.41 (2) | 61.50 (1) | 52.50 ± 1.41 (2) | "
                  "25.68 | 73.14 |")
  assert "| FedMD | – | – | – | – | 26.38 | 80.70 |" in lines


@pytest.mark.slow  # two child processes compiling tiny FedAvg rounds: about a minute on 2 cores
def test_under_a_deadline_a_rows_seeds_train_as_one_program_in_a_child(tmp_path, monkeypatch,
                                                                        tmp_path_factory):
  """The GPU command's mode: a row's fresh seeds as one program in one child process; stopped
  at the deadline, the seeds resume one by one from their own checkpoints."""
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  table = tables.get_table("fedfusion_table2")
  cells = cells_lib.plan(table, "quick", [0, 1], ["fedavg"])
  lines = []

  def configure(config, cell):
    _tiny(config, cell)
    config.num_rounds = 6

  common = dict(configure=configure, echo=lines.append)
  done = runner.run(cells, results_dir=tmp_path / "a", deadline_secs=900, min_cell_secs=1,
                  **common)
  assert set(done["statuses"].values()) == {"trained"}
  for cell in cells:
    record = json.loads((cell.directory(tmp_path / "a") / "cell.json").read_text())
    assert record["status"] == "finished" and record["stacked_seeds"] == [0, 1]
  # A deadline inside the program: both seeds interrupted, then each resumes alone.
  first = runner.run(cells, results_dir=tmp_path / "b", deadline_secs=6, min_cell_secs=1,
                   **common)
  assert list(first["statuses"].values()) == ["interrupted", "interrupted"]
  second = runner.run(cells, results_dir=tmp_path / "b", deadline_secs=900, min_cell_secs=1,
                    **common)
  assert set(second["statuses"].values()) <= {"resumed", "trained"}
  for cell in cells:
    record = json.loads((cell.directory(tmp_path / "b") / "cell.json").read_text())
    assert record["status"] == "finished"

"""benchmarks/gpu_session.py: the prepared GPU command keeps its record under a deadline."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests import benchmark_scripts

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_session.py"


gpu_session = benchmark_scripts.load("gpu_session")


def _run(tmp_path, *args):
  return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *args],
                        capture_output=True, text=True, timeout=300, check=False)


def test_env_step_records_the_device_and_the_xla_flags(tmp_path):
  done = _run(tmp_path, "--plan", "env")
  assert done.returncode == 0, done.stderr
  report = json.loads((tmp_path / "session.json").read_text())
  assert report["plan"] == ["env"]
  assert report["steps"]["env_jax"]["status"] == 0
  # No nvidia-smi on a CPU machine: the step records why instead of failing the session.
  assert report["steps"]["env_nvidia_smi"]["status"] in (0, "FileNotFoundError: [Errno 2] No "
                                                         "such file or directory: 'nvidia-smi'")
  assert "--xla_gpu_autotune_level" in (tmp_path / "xla_flags.txt").read_text()
  names = (tmp_path / "xla_flag_names.txt").read_text().split()
  # Past the help text's cut: the list holds flags the logger drops.
  assert {"--xla_gpu_autotune_level", "--xla_gpu_enable_while_loop_unrolling"} <= set(names)
  assert "--xla_gpu_enable_while_loop_unrolling" not in (tmp_path / "xla_flags.txt").read_text()
  assert "env_jax" in (tmp_path / "session.log").read_text()


def test_a_step_past_the_deadline_is_skipped_and_recorded(tmp_path):
  done = _run(tmp_path, "--plan", "steps,full", "--deadline-secs", "0")
  assert done.returncode == 0, done.stderr
  report = json.loads((tmp_path / "session.json").read_text())
  assert report["steps"]["steps"]["status"] == "skipped: no time left"
  assert report["steps"]["full"]["status"] == "skipped: no time left"
  assert not (tmp_path / "full.json").exists()


def test_the_one_call_speed_plan_passes_its_options_to_the_steps(tmp_path):
  done = _run(tmp_path, "--plan", "full,pytorch", "--deadline-secs", "0", "--rounds", "2",
              "--full-skip-warm", "--torch-rounds", "1")
  assert done.returncode == 0, done.stderr
  steps = json.loads((tmp_path / "session.json").read_text())["steps"]
  full, torch = steps["full"]["command"], steps["pytorch"]["command"]
  assert "--skip-warm" in full and full[full.index("--rounds") + 1] == "2"
  assert torch[torch.index("--rounds") + 1] == "1"
  assert "--flavours" not in torch  # pytorch_reference.py's own order unless asked
  done = _run(tmp_path, "--plan", "pytorch", "--deadline-secs", "0",
              "--torch-flavours", "tuned,authors")
  assert done.returncode == 0, done.stderr
  command = json.loads((tmp_path / "session.json").read_text())["steps"]["pytorch"]["command"]
  assert command[command.index("--flavours") + 1] == "tuned,authors"
  done = _run(tmp_path, "--plan", "full,pytorch", "--deadline-secs", "0", "--rounds", "3")
  assert done.returncode == 0, done.stderr
  steps = json.loads((tmp_path / "session.json").read_text())["steps"]
  assert "--skip-warm" not in steps["full"]["command"]
  assert steps["pytorch"]["command"][steps["pytorch"]["command"].index("--rounds") + 1] == "3"


def test_the_htfl_step_runs_the_loop_comparison_on_the_full_width_configs(tmp_path):
  done = _run(tmp_path, "--plan", "htfl", "--deadline-secs", "0", "--rounds", "3")
  assert done.returncode == 0, done.stderr
  step = json.loads((tmp_path / "session.json").read_text())["steps"]["htfl"]
  command = step["command"]
  assert command[1].endswith("benchmarks/htfl_loop.py")
  assert [command[i + 1] for i, x in enumerate(command) if x == "--config"] == [
      "htfl_cifar10_practical_htfe4_fedproto", "htfl_cifar10_practical_htfe4_fd"]
  assert command[command.index("--rounds") + 1] == "3"
  assert command[command.index("--out-dir") + 1] == str(tmp_path / "htfl")
  assert step["status"] == "skipped: no time left"


def test_an_unknown_step_is_named_with_the_choices(tmp_path):
  done = _run(tmp_path, "--plan", "env,warmup")
  assert done.returncode != 0
  assert "unknown steps ['warmup']" in done.stderr and "'quick'" in done.stderr


@pytest.mark.slow  # four processes compiling an EfficientNet-B0 step: about 2 min on 2 cores
def test_flag_sets_are_gathered_in_one_file(tmp_path):
  done = _run(tmp_path, "--plan", "flags", "--width", "0.0625", "--batch", "2",
              "--deadline-secs", "400")
  assert done.returncode == 0, done.stderr
  report = json.loads((tmp_path / "session.json").read_text())
  flags = json.loads((tmp_path / "flags.json").read_text())
  assert next(iter(flags)) == "header" and flags["header"]["commit"]
  assert sorted(set(flags) - {"header"}) == sorted(gpu_session.FLAG_SETS)
  for name, flag_set in gpu_session.FLAG_SETS.items():
    step = report["steps"][f"flags_{name}"]
    assert step["status"] == 0
    assert step["XLA_FLAGS"] == f"{gpu_session.TRITON_GEMM_OFF} {flag_set}".strip()
    assert flags[name]["XLA_FLAGS"] == step["XLA_FLAGS"]
    assert flags[name]["rows"][0]["step_ms"] > 0
  assert not list(tmp_path.glob("flags_*.json"))


def test_the_cells_steps_run_the_prepared_queues_under_the_time_left(tmp_path):
  done = _run(tmp_path, "--plan", "cells,mid_cells", "--deadline-secs", "0",
              "--cells-seeds", "0")
  assert done.returncode == 0, done.stderr
  steps = json.loads((tmp_path / "session.json").read_text())["steps"]
  cells, mid = steps["cells"]["command"], steps["mid_cells"]["command"]
  assert cells[1].endswith("experiments/reproduce.py")
  assert cells[2:6] == ["--queue=gpu", "--scale=paper", "--seeds=0", "--deadline-secs=0"]
  assert mid[2:4] == ["--queue=mid", "--scale=mid"]
  assert f"--copy-to={tmp_path}" in cells and f"--results-dir={REPO / 'results'}" in cells
  assert steps["cells"]["status"] == steps["mid_cells"]["status"] == "skipped: no time left"

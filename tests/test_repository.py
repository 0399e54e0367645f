"""The README's set-up commands and CI stay in sync; the docs' generated parts stay current."""

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
  text = (ROOT / "README.md").read_text()
  blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
  return [line for block in blocks for line in block.splitlines()
          if line.strip() and not line.startswith("#")]


def test_readme_has_exactly_two_setup_commands_main_job_and_tests():
  setup = [c for c in _readme_commands() if c.startswith("python3 -m venv")]
  assert len(setup) == 2, setup
  assert "pytest" not in setup[0] and "pytest" in setup[1]
  # The main job is the quick heterogeneous Digits FCCL+ run, through a config that exists.
  assert setup[0].rstrip().endswith("python experiments/train.py --config=digits_fcclplus_quick")
  assert (ROOT / "fedjax_het" / "configs" / "digits.py").is_file()


def test_ci_runs_the_readme_install_and_test_command():
  test_command = [c for c in _readme_commands() if "pytest" in c][0]
  install = re.search(r'pip install -e "\.\[test\]"', test_command)
  assert install, test_command
  ci = (ROOT / ".ci" / "run").read_text()
  assert 'pip install -e ".[test]"' in ci
  pytest_command = "python -m pytest -n 2 --dist worksteal"
  assert re.search(rf"^{re.escape(pytest_command)}(\s|$)", ci, flags=re.M)
  assert test_command.rstrip().endswith(pytest_command)
  assert "-eq 5" in ci  # "no tests collected" is a failure


def test_model_table_matches_model_summary():
  from fedjax_het import models  # pylint: disable=import-outside-toplevel
  text = (ROOT / "docs" / "methods.md").read_text()
  rows = re.findall(r"^\| `(\w+)`[^|]*\| (\d+) \| ([\d,]+) \| ([\d,.]+) \|$", text, flags=re.M)
  assert {name for name, *_ in rows} == set(models.MODEL_NAMES)
  for name, feature_dim, params, mflops in rows:
    kwargs = {"base": "resnet10", "fusion": "conv"} if name == "fedfusion" else {}
    num_classes = 100 if name in ("glfc_resnet18", "lenet_encoder") else 10
    summary = models.model_summary(name, num_classes, **kwargs)
    assert summary["feature_dim"] == int(feature_dim), name
    assert summary["params"] == int(params.replace(",", "")), name
    assert abs(summary["flops"] / 1e6 - float(mflops.replace(",", ""))) < 0.06, name


def _readme_results_script():
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("readme_results",
                                                ROOT / "experiments" / "readme_results.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_generated_result_blocks_are_the_recorded_runs():
  """Every generated block of README.md and docs/results.md is rendered from the record."""
  script = _readme_results_script()
  runs = script.load_runs()
  assert set(runs) >= {name for names in script.BLOCKS.values() for name in names}
  for relative in sorted(set(script.FILES.values())):
    text = (ROOT / relative).read_text()
    blocks = re.findall(r"<!-- readme_results:(\w+) -->", text)
    assert sorted(blocks) == sorted(b for b, f in script.FILES.items() if f == relative), (
        relative, blocks)
    assert script.rewrite(text, runs) == text, (
        f"{relative} is stale: run python experiments/readme_results.py")


def test_result_record_has_a_header():
  script = _readme_results_script()
  record = json.loads(script.RECORD.read_text())
  assert set(record["header"]) == {"commit", "date", "device", "jax"}
  latest = max(record["runs"].values(), key=lambda run: run["date"])
  header = record["header"]
  assert (header["date"], header["device"], header["jax"]) == (
      latest["date"], latest["machine"], latest["jax"])


def test_readme_results_rewrite_replaces_a_stale_block():
  script = _readme_results_script()
  runs = script.load_runs()
  stale = "a\n<!-- readme_results:digits_quick -->\nold numbers\n<!-- /readme_results -->\nb\n"
  new = script.rewrite(stale, runs)
  assert "old numbers" not in new and new.startswith("a\n") and new.endswith("b\n")
  for name in script.BLOCKS["digits_quick"]:
    assert f"--config={name}`" in new and runs[name]["table"] in new


def test_a_config_builds_from_outside_the_repository(tmp_path):
  # The configs are modules of the installed package: no path into the repository needed.
  code = ("from fedjax_het.configs import get_config, families; "
          "c = get_config('digits_fcclplus_quick'); print(c.name, c.num_rounds, len(families()))")
  done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300, check=False,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["digits_fcclplus_quick", "5", "8"]
  for path in (ROOT / "fedjax_het" / "configs").glob("*.py"):
    text = path.read_text()
    assert "sys.path" not in text and "load_module(" not in text, path.name

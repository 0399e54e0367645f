"""The clients mesh across processes: jax.distributed with CPU processes on this machine.

Each test starts its processes with `subprocess` (JAX's process group and device
count are fixed when it starts, so they cannot run inside pytest's process):
two processes with two simulated CPU devices each, a coordinator on a free
localhost port, gloo collectives. The single-process reference has the same
four devices (one process, `--num_cpu_devices=4`).

What is compared, and how exactly:
  * the plumbing (data placed from the same host arrays in every process, a
    cross-client reduction, client-sharded outputs gathered by
    `sharding.fetch`): bit-identical, on integer-valued floats whose sums are
    exact in any order;
  * tiny FCCL+ (slow) and FedAvg runs, 2 rounds: the evaluation accuracies
    and results.json must be identical, the training losses (and FCCL+'s
    cross-correlation diagnostics) agree to 1e-4. FCCL+ is not bit-identical:
    gloo's all-reduce sums in another order than the in-process CPU
    collectives (checked on a plain psum), and even SOLO, whose round has no
    collective, differs in the last bits of one group's parameters after a
    round (same HLO, same inputs: XLA:CPU's runtime, not this code); FedAvg
    came out bit-identical, which is not asserted. Adam's sign-like first
    steps turn such rounding into lr-sized steps, so the runs use SGD. The
    tiny runs stay near chance accuracy, so the losses are the sharp check.
  * a two-process run resumed from its checkpoint (slow): bit-identical to an
    uninterrupted two-process run.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from fedjax_het.engine import sharding
from fedjax_het.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("multiprocess_demo",
                                               REPO / "experiments" / "multiprocess_demo.py")
multiprocess_demo = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(multiprocess_demo)

# The tiny FCCL+ config of tests/test_train.py (tiny_config), as train.py flags; SGD in both
# phases (see the module docstring), 2 rounds, no plots.
TINY_FLAGS = [
    "--config=digits_fcclplus_quick",
    "--config.models.architectures=('simple_cnn','fedavg_cifar_cnn','simple_cnn',"
    "'fedavg_cifar_cnn')",
    "--config.num_rounds=2", "--config.local.epochs=1", "--config.local.batch_size=16",
    "--config.collaborative.batch_size=32", "--config.scenario.public_size=64",
    "--config.scenario.private_sizes.mnist=30", "--config.scenario.private_sizes.usps=20",
    "--config.scenario.private_sizes.svhn=40", "--config.scenario.private_sizes.syn=24",
    "--config.scenario.test_size=30", "--config.eval.batch_size=30",
    "--config.logging.progress=False", "--config.logging.plots=False",
    "--config.logging.diagnostic_rounds=(1,2)", "--config.compilation_cache_dir=",
    "--config.collaborative.optimizer=sgd", "--config.collaborative.lr=0.01",
    "--config.local.optimizer=sgd", "--config.local.lr=0.01",
    "--config.sharding.num_devices=0",
]

# The same for FedAvg (homogeneous: one simple_cnn for all four, parameter averaging across
# processes); FedAvg has no collaborative phase and no diagnostics.
FEDAVG_FLAGS = ["--config=digits_fedavg_quick", "--config.models.architectures=('simple_cnn',)"] + [
    f for f in TINY_FLAGS if not f.startswith(("--config=", "--config.models.architectures",
                                               "--config.collaborative", "--config.logging.diag"))]


@pytest.fixture(name="env")
def _env(tmp_path_factory):
  """Synthetic data cached once per session, no real data directory, CPU only."""
  env = {k: v for k, v in os.environ.items() if k not in ("FEDJAX_HET_DATA_DIR", "XLA_FLAGS")}
  env.update(FEDJAX_HET_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "data_cache"),
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  return env


def _log(path: pathlib.Path) -> str:
  return path.read_text(errors="replace") if path.exists() else "<no log>"


def _two_processes(args, log_dir, env, timeout=300):
  codes = multiprocess_demo.launch(args, num_processes=2, num_cpu_devices=2, log_dir=log_dir,
                                   timeout=timeout, env=env)
  return codes, [_log(log_dir / f"process_{i}.log") for i in range(2)]


@pytest.mark.parametrize("kwargs,message", [
    ({"num_processes": 0}, "--num_processes must be an integer >= 1, got 0"),
    ({"num_processes": 2, "process_id": 2, "coordinator_address": "localhost:1234"},
     "--process_id must be an integer in [0, 1] (--num_processes=2), got 2"),
    ({"num_processes": 2, "process_id": -1, "coordinator_address": "localhost:1234"},
     "--process_id must be an integer in [0, 1]"),
    ({"num_processes": 2, "process_id": 1},
     "--coordinator_address must be host:port of process 0"),
    ({"num_processes": 2, "process_id": 1, "coordinator_address": "localhost"},
     "--coordinator_address must be host:port of process 0"),
    ({"num_processes": 1, "process_id": 1}, "--process_id must be 0 when --num_processes=1"),
    ({"num_cpu_devices": -1}, "--num_cpu_devices must be an integer >= 0"),
])
def test_initialize_distributed_rejects_bad_input(kwargs, message):
  # Raised before anything reaches JAX (which is already started in this process).
  with pytest.raises(ConfigError) as error:
    sharding.initialize_distributed(**kwargs)
  assert message in str(error.value)


def test_one_process_is_unchanged():
  sharding.initialize_distributed()  # num_processes=1: nothing to initialise
  assert jax.process_count() == 1 and sharding.is_primary()
  sharding.barrier("no-op")
  x = jax.device_put(np.arange(8.0), jax.sharding.NamedSharding(
      sharding.client_mesh(4), jax.sharding.PartitionSpec(sharding.CLIENT_AXIS)))
  np.testing.assert_array_equal(sharding.fetch({"x": x})["x"], np.arange(8.0))


def test_cli_bad_process_flags_fail_in_one_line(env):
  run = subprocess.run(
      [sys.executable, str(REPO / "experiments" / "train.py"), "--config=digits_fcclplus_quick",
       "--num_processes=2", "--process_id=3", "--coordinator_address=localhost:1"],
      capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
  assert run.returncode == 1, run.stderr[-2000:]
  assert ("error: --process_id must be an integer in [0, 1] (--num_processes=2), got 3."
          in run.stderr)


# Run by every process of `test_sharded_arrays_span_two_processes`: the engine's placement,
# a cross-client reduction and `fetch` of client-sharded and replicated outputs.
_PLUMBING = textwrap.dedent("""
    import sys
    import numpy as np
    from fedjax_het.engine import sharding
    process_id, address, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    sharding.initialize_distributed(address, 2, process_id, num_cpu_devices=2)
    import jax
    mesh = sharding.client_mesh(0)
    clients = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients"))
    data = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) - 7.0  # the same in every process
    x = jax.device_put(data, clients)
    assert not x.is_fully_addressable
    assert len(x.addressable_shards) == 2 and sharding.is_primary() == (process_id == 0)
    step = jax.jit(lambda x: (x * 2.0 - x.sum(0, keepdims=True), x.sum()),
                   out_shardings=(clients, None))
    fetched = sharding.fetch(step(x))
    sharding.barrier("plumbing")
    if sharding.is_primary():
      np.savez(out, sharded=fetched[0], total=fetched[1], devices=len(mesh.devices))
""")


def test_sharded_arrays_span_two_processes(tmp_path, env):
  port = multiprocess_demo.free_port()
  # pylint: disable-next=consider-using-with
  logs = [open(tmp_path / f"process_{i}.log", "wb") for i in range(2)]
  processes = [subprocess.Popen([sys.executable, "-c", _PLUMBING, str(i), f"localhost:{port}",
                                 str(tmp_path / "out.npz")], stdout=logs[i],
                                stderr=subprocess.STDOUT, env=env, cwd=REPO) for i in range(2)]
  try:
    codes = [p.wait(timeout=120) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
    for log in logs:
      log.close()
  assert codes == [0, 0], [_log(tmp_path / f"process_{i}.log") for i in range(2)]
  got = np.load(tmp_path / "out.npz")
  data = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) - 7.0
  assert int(got["devices"]) == 4
  # The same program in this (single, 4-device) process: bit-identical.
  mesh = sharding.client_mesh(4)
  clients = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients"))
  step = jax.jit(lambda x: (x * 2.0 - x.sum(0, keepdims=True), x.sum()),
                 out_shardings=(clients, None))
  want = jax.device_get(step(jax.device_put(data, clients)))
  np.testing.assert_array_equal(got["sharded"], want[0])
  np.testing.assert_array_equal(got["total"], want[1])


def test_mesh_must_span_every_process(tmp_path, env):
  codes, logs = _two_processes(TINY_FLAGS + ["--config.sharding.num_devices=2",
                                             f"--workdir={tmp_path / 'run'}"],
                               tmp_path / "logs", env, timeout=120)
  assert codes == [1, 1], logs
  for log in logs:
    assert ("error: config.sharding.num_devices must be 0 or 4 (every device of the 2 "
            "processes) in a multi-process run, got 2.") in log
  assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_held_workdir_stops_every_process_at_once(tmp_path, env):
  """Process 0 finds the workdir's lock held (by this test's process): both processes exit 1
  with the line naming the holder, and nothing is written to the workdir."""
  from fedjax_het import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  run = tmp_path / "run"
  with workdir_lib.WorkdirLock(run):
    codes, logs = _two_processes(FEDAVG_FLAGS + [f"--workdir={run}"], tmp_path / "logs", env,
                                 timeout=120)
  assert codes == [1, 1], logs
  for log in logs:
    assert f"is in use by PID {os.getpid()} on " in log, log
  assert sorted(p.name for p in run.iterdir()) == [".lock"]


def _metrics(workdir: pathlib.Path) -> list[dict]:
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  for record in records:
    record.pop("time/round_secs")
  return records


# The round compiles in both processes and in the reference: FedAvg (one small model) took 20-34 s
# on the 2-core CPU, FCCL+ (two architectures, collaborative phase) 1.5-4 minutes.
@pytest.mark.parametrize("flags", [pytest.param(TINY_FLAGS, marks=pytest.mark.slow), FEDAVG_FLAGS],
                         ids=["fcclplus", "fedavg"])
@pytest.mark.slow  # 13-30 s of the default suite on 2 cores; the slow suite runs it
def test_two_processes_match_one_process(tmp_path, env, flags):
  one = subprocess.run(
      [sys.executable, str(REPO / "experiments" / "train.py"), *flags,
       "--num_cpu_devices=4", f"--workdir={tmp_path / 'one'}"],
      capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)
  assert one.returncode == 0, one.stderr[-3000:]
  codes, logs = _two_processes(flags + [f"--workdir={tmp_path / 'two'}"], tmp_path / "logs", env,
                               timeout=600)
  assert codes == [0, 0], logs

  reference, spanned = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
  assert [r["round"] for r in spanned] == [1, 2]  # one writer: no record twice
  for want, got in zip(reference, spanned):
    assert set(want) == set(got)
    for name in want:
      if name.startswith("eval/") or name == "round":
        assert got[name] == want[name], name
      else:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)
  assert ((tmp_path / "two" / "results.json").read_text()
          == (tmp_path / "one" / "results.json").read_text())
  metadata = json.loads((tmp_path / "two" / "metadata.json").read_text())
  assert metadata["processes"] == 2 and len(metadata["devices"]) == 4
  for name in ("run.json", "config.json", "results.md"):
    assert (tmp_path / "two" / name).exists(), name
  if flags is TINY_FLAGS:  # FCCL+'s diagnostics, gathered from both processes
    for name in ("cross_correlation.npz",):
      want, got = np.load(tmp_path / "one" / name), np.load(tmp_path / "two" / name)
      assert want.files == got.files == ["round_1", "round_2"]
      for key in want.files:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_two_process_resume_equals_uninterrupted(tmp_path, env):
  workdir = tmp_path / "run"
  codes, logs = _two_processes(TINY_FLAGS + ["--config.num_rounds=1", f"--workdir={workdir}"],
                               tmp_path / "logs1", env)
  assert codes == [0, 0], logs
  codes, logs = _two_processes(TINY_FLAGS + ["--config.resume_allow_changes=num_rounds",
                                             f"--workdir={workdir}"], tmp_path / "logs2", env)
  assert codes == [0, 0], logs
  assert all("resumed from the checkpoint of round 1" in log for log in logs)
  codes, logs = _two_processes(TINY_FLAGS + [f"--workdir={tmp_path / 'whole'}"],
                               tmp_path / "logs3", env)
  assert codes == [0, 0], logs
  assert _metrics(workdir) == _metrics(tmp_path / "whole")  # bit-identical

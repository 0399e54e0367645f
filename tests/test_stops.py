"""Every way the command ends, ends it: Ctrl-C and SIGTERM at any moment, a checkpoint folder
that cannot be written, a full disk. One line, no traceback, the right exit status, and a
workdir the same command resumes.

The command runs in a process of its own (`experiments/train.py`, a tiny SOLO config of one
small CNN for every participant, with a checkpoint after every round). Where a test needs a
moment to land in (a checkpoint write, the results), a wrapper slows that step down in the child
process and says when it starts.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fedjax_het import errors
from tests.test_train import TINY_DATA_FLAGS

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "train.py"

TINY = ("--config=digits_solo_quick", "--config.local.epochs=1", "--config.local.batch_size=16",
        *TINY_DATA_FLAGS, "--config.logging.progress=True",
        "--config.logging.plots=False", "--config.logging.tensorboard=False",
        "--config.checkpoint.every=1")

#: Runs experiments/train.py as `python experiments/train.py` does, after `{patch}`.
_WRAPPER = """
import pathlib, runpy, sys, time
{patch}
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path({script!r}, run_name="__main__")
"""

#: The `k`-th write of the state's arrays (round k: round 0's is the first) announces itself
#: and then takes `seconds` more in the calling thread (the part of a save that is not in
#: the background).
SLOW_SAVE = """
import orbax.checkpoint as ocp
_real, _calls = ocp.StandardCheckpointHandler.async_save, [0]
async def _slow(self, *args, **kwargs):
  out = await _real(self, *args, **kwargs)
  _calls[0] += 1
  if _calls[0] - 1 == {round}:
    print("SAVING round {round}", file=sys.stderr, flush=True)
    time.sleep({seconds})
  return out
ocp.StandardCheckpointHandler.async_save = _slow
"""

#: The background part of the write of round `round` announces itself and waits `seconds`.
SLOW_COMMIT = """
from orbax.checkpoint._src.checkpointers import async_checkpointer as _ac
_real = _ac._background_wait_for_commit_futures
def _slow(directory, *args, **kwargs):
  if pathlib.Path(str(directory)).name.split(".")[0] == "{round}":
    print("COMMITTING round {round}", file=sys.stderr, flush=True)
    time.sleep({seconds})
  return _real(directory, *args, **kwargs)
_ac._background_wait_for_commit_futures = _slow
"""

#: Writing the results (after the last round) announces itself and takes `seconds` more.
SLOW_RESULTS = """
from fedjax_het import experiment as _experiment
_real = _experiment.Experiment.results
def _slow(self, *args, **kwargs):
  print("RESULTS", file=sys.stderr, flush=True)
  time.sleep({seconds})
  return _real(self, *args, **kwargs)
_experiment.Experiment.results = _slow
"""


@pytest.fixture(name="env", scope="module")
def _env(tmp_path_factory):
  """No real data directory (synthetic data, generated once), CPU, one compilation cache."""
  root = tmp_path_factory.mktemp("stops")
  env = {k: v for k, v in os.environ.items()
         if k not in ("FEDJAX_HET_TRACEBACK", "FEDJAX_HET_DATA_DIR")}
  env.update(FEDJAX_HET_CACHE_DIR=str(root / "data_cache"), JAX_PLATFORMS="cpu",
             PYTHONUNBUFFERED="1", FEDJAX_HET_TEST_JAX_CACHE=str(root / "jax_cache"))
  return env


def command(workdir, env, *extra, num_rounds=3, patch=None, tmp=None,
            architectures=("simple_cnn",)):
  """The training command (through a wrapper applying `patch` when given), with one small CNN
  for every participant unless `architectures` names others."""
  args = [*TINY, f"--config.models.architectures={architectures!r}", f"--workdir={workdir}",
          f"--config.num_rounds={num_rounds}",
          f"--config.compilation_cache_dir={env['FEDJAX_HET_TEST_JAX_CACHE']}", *extra]
  if patch is None:
    return [sys.executable, str(SCRIPT), *args]
  wrapper = pathlib.Path(tmp) / "wrapper.py"
  wrapper.write_text(_WRAPPER.format(patch=patch, script=str(SCRIPT)))
  return [sys.executable, str(wrapper), *args]


def start(cmd, env, **kwargs):
  return subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, **kwargs)


def read_until(child, marker, lines):
  """Reads the child's stderr into `lines` until a line holds `marker` (True) or it ends."""
  for line in child.stderr:
    lines.append(line)
    if marker in line:
      return True
  return False


def finish(child, lines, timeout=180):
  """(exit status, the whole stderr)."""
  rest = child.communicate(timeout=timeout)[1]
  return child.returncode, "".join(lines) + rest


def one_line(stderr, pattern):
  """The one line of `stderr` that matches `pattern` (asserted: exactly one, and it is the
  last line, with no traceback anywhere)."""
  assert "Traceback" not in stderr, stderr[-6000:]
  lines = stderr.strip().splitlines()
  found = [l for l in lines if re.search(pattern, l)]
  assert len(found) == 1 and found[0] == lines[-1], "\n".join(lines[-20:])
  return found[0]


def committed(workdir):
  folder = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def unfinished(workdir):
  return [p.name for p in (pathlib.Path(workdir) / "checkpoints").iterdir()
          if "orbax-checkpoint-tmp" in p.name]


def rounds(workdir):
  return [json.loads(l)["round"] for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines() if l.strip()]


# -- signals ------------------------------------------------------------------------------------


def _catches_sigterm(pid):
  """Whether process `pid` has a handler for SIGTERM (its SigCgt mask, Linux)."""
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
  except OSError:
    return False
  mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
  return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_the_imports_is_one_line(tmp_path, env, stop):
  """The handlers are in place before the slow imports (jax, flax, orbax take seconds): the
  signal is sent as soon as the process catches SIGTERM."""
  child = start(command(tmp_path / "run", env), env)
  deadline = time.time() + 60
  while not _catches_sigterm(child.pid) and child.poll() is None and time.time() < deadline:
    time.sleep(0.002)
  child.send_signal(stop)
  code, stderr = finish(child, [])
  assert code == 130, stderr[-3000:]
  one_line(stderr, r"^stopped while starting, before anything was written; rerun the same "
                   r"command to start the run$")
  assert not (tmp_path / "run").exists()


def test_a_stop_while_compiling_is_one_line(tmp_path, env):
  workdir = tmp_path / "run"
  child, lines = start(command(workdir, env), env), []
  assert read_until(child, "compiling the round", lines)
  child.send_signal(signal.SIGTERM)
  code, stderr = finish(child, lines)
  assert code == 130, stderr[-3000:]
  one_line(stderr, rf"^stopped at round 0; rerun the same command to resume from the checkpoint "
                   rf"of round 0 in {re.escape(str(workdir))}$")
  assert committed(workdir) == [0] and not unfinished(workdir)


#: Right after the round compiles, SIGTERM arrives while Python runs a finalizer (`__del__`),
#: where CPython prints and drops the handler's KeyboardInterrupt.
STOP_IN_FINALIZER = """
import os, signal
from fedjax_het.runtime import compiler as _compiler
_real = _compiler.RoundCompiler.compile_all
class _Finalized:
  def __del__(self):
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10 ** 6):  # Python runs the handler here, inside __del__
      pass
def _compile_all(self, *args, **kwargs):
  out = _real(self, *args, **kwargs)
  _Finalized()
  print("FINALIZED", file=sys.stderr, flush=True)
  return out
_compiler.RoundCompiler.compile_all = _compile_all
"""


#: Round 2 does not end for about 15 minutes: one of its state's arrays waits for a loop of
#: 2^31 small matmuls (an XLA program, dispatched asynchronously as a round is; a host
#: callback would not do: XLA:CPU runs a program with one on the calling thread when its
#: inputs are ready). It announces itself once dispatched.
ENDLESS_ROUND = """
import jax, jax.numpy as jnp
from fedjax_het.runtime import compiler as _compiler
_real, _calls = _compiler.RoundCompiler.compile_all, [0]
@jax.jit
def _hold(x):
  def spin(carry):
    square, count = carry
    return jnp.tanh(square @ square), count + 1
  square, _ = jax.lax.while_loop(lambda carry: carry[1] < 2 ** 31 - 1, spin,
                                 (jnp.full((16, 16), x.ravel()[0]), 0))
  return x + square[0, 0] * 0
class _Rounds:  # the compiled round (its memory analysis too), round 2 held
  def __init__(self, compiled):
    self._compiled = compiled
  def __getattr__(self, name):
    return getattr(self._compiled, name)
  def __call__(self, state, data):
    state, metrics = self._compiled(state, data)
    _calls[0] += 1
    if _calls[0] == 2:
      jax.block_until_ready(state)  # the hold's inputs ready: it is dispatched all the same
      leaves, treedef = jax.tree_util.tree_flatten(state)
      i = next(i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.floating))
      leaves[i] = _hold(leaves[i])
      state = jax.tree_util.tree_unflatten(treedef, leaves)
      print("ROUND 2 DISPATCHED", file=sys.stderr, flush=True)
    return state, metrics
def _compile_all(self, *args, **kwargs):
  return _Rounds(_real(self, *args, **kwargs))
_compiler.RoundCompiler.compile_all = _compile_all
"""


def test_a_stop_during_a_round_ends_the_process_without_waiting_for_the_round(tmp_path, env):
  """A round of a mid or paper-scale config takes minutes on a CPU: a stop neither waits for it
  nor for the runtime's shutdown (which would wait for the computation)."""
  workdir = tmp_path / "run"
  child = start(command(workdir, env, patch=ENDLESS_ROUND, tmp=tmp_path), env)
  lines = []
  assert read_until(child, "ROUND 2 DISPATCHED", lines), "".join(lines)[-3000:]
  time.sleep(1)
  child.send_signal(signal.SIGTERM)
  try:
    code, stderr = finish(child, lines, timeout=120)  # the round alone takes minutes
  finally:
    child.kill()
  assert code == 130, stderr[-3000:]
  one_line(stderr, rf"^stopped at round 1; rerun the same command to resume from the checkpoint "
                   rf"of round 1 in {re.escape(str(workdir))}$")
  assert committed(workdir)[-1] == 1 and not unfinished(workdir)
  assert rounds(workdir) == [1]


def test_a_stop_a_finalizer_drops_is_raised_again_in_process():
  class Finalized:
    def __del__(self):
      errors.on_stop_signal(signal.SIGTERM, None)

  hook, sys.unraisablehook = sys.unraisablehook, errors.unraisable_hook
  try:
    Finalized()  # the KeyboardInterrupt is raised inside __del__ and dropped
    with pytest.raises(KeyboardInterrupt):
      errors.raise_dropped_stop()
  finally:
    sys.unraisablehook = hook
    errors.stop_handled()
  errors.raise_dropped_stop()  # handled: nothing is raised


def test_a_stop_a_finalizer_drops_still_stops_the_run_with_one_line(tmp_path, env):
  workdir = tmp_path / "run"
  child = start(command(workdir, env, patch=STOP_IN_FINALIZER, tmp=tmp_path), env)
  lines = []
  assert read_until(child, "FINALIZED", lines), "".join(lines)[-3000:]
  code, stderr = finish(child, lines)
  assert code == 130, stderr[-3000:]
  one_line(stderr, rf"^stopped at round 0; rerun the same command to resume from the checkpoint "
                   rf"of round 0 in {re.escape(str(workdir))}$")
  assert committed(workdir) == [0] and not unfinished(workdir)


# One handler serves both signals (the imports test sends each): SIGINT here in the slow suite.
@pytest.mark.parametrize("stop", [pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                  signal.SIGTERM])
def test_a_stop_during_a_checkpoint_write_lets_it_finish_and_is_one_line(tmp_path, env, stop):
  workdir = tmp_path / "run"
  child = start(command(workdir, env, patch=SLOW_SAVE.format(round=2, seconds=3), tmp=tmp_path),
                env)
  lines = []
  assert read_until(child, "SAVING round 2", lines), "".join(lines)[-3000:]
  child.send_signal(stop)
  code, stderr = finish(child, lines)
  assert code == 130, stderr[-3000:]
  one_line(stderr, rf"^stopped at round 2; rerun the same command to resume from the checkpoint "
                   rf"of round 2 in {re.escape(str(workdir))}$")
  assert committed(workdir)[-1] == 2 and not unfinished(workdir)
  assert rounds(workdir) == [1, 2]


def test_a_second_stop_discards_the_write_under_way_and_the_rerun_resumes(tmp_path, env):
  workdir = tmp_path / "run"
  child = start(command(workdir, env, patch=SLOW_COMMIT.format(round=2, seconds=60),
                        tmp=tmp_path), env)
  lines = []
  assert read_until(child, "COMMITTING round 2", lines), "".join(lines)[-3000:]
  child.send_signal(signal.SIGINT)   # the run stops and waits for the write...
  time.sleep(2)
  tick = time.time()
  child.send_signal(signal.SIGINT)   # ...which a second signal cuts short
  code, stderr = finish(child, lines, timeout=30)
  assert code == 130 and time.time() - tick < 20, stderr[-3000:]
  one_line(stderr, rf"^stopped at round 2; the checkpoint write of round 2 under way is "
                   rf"discarded; rerun the same command to resume from the checkpoint of round "
                   rf"1 in {re.escape(str(workdir))}$")
  assert committed(workdir)[-1] == 1
  rerun = subprocess.run(command(workdir, env), cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed from the checkpoint of round 1" in rerun.stderr
  assert rounds(workdir) == [1, 2, 3] and not unfinished(workdir)


def test_a_stop_after_the_last_round_says_so_and_the_rerun_writes_the_results(tmp_path, env):
  workdir = tmp_path / "run"
  child = start(command(workdir, env, patch=SLOW_RESULTS.format(seconds=5), tmp=tmp_path), env)
  lines = []
  assert read_until(child, "RESULTS", lines), "".join(lines)[-3000:]
  child.send_signal(signal.SIGTERM)
  code, stderr = finish(child, lines)
  assert code == 130, stderr[-3000:]
  one_line(stderr, rf"^stopped after the last round \(3\), while writing the results; rerun the "
                   rf"same command to write them \(it resumes from the checkpoint of round 3 and "
                   rf"trains nothing\) in {re.escape(str(workdir))}$")
  assert not (workdir / "results.json").exists()
  rerun = subprocess.run(command(workdir, env), cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed from the checkpoint of round 3" in rerun.stderr
  assert not re.search(r"\bround \d+/3\b", rerun.stderr)  # trained nothing
  assert (workdir / "results.json").exists() and rounds(workdir) == [1, 2, 3]


# -- storage --------------------------------------------------------------------------------------


def _without_file_permission_override():
  """A command prefix that runs a child subject to file permissions, or None where the test
  cannot drop that privilege. As root (here), `setpriv` runs it with uid 0 but without
  CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from its bounding set before exec, so it
  never has them): a folder without write permission is then unwritable to it, as to any
  user. (Switching to `nobody` instead would lock it out of an interpreter under /root.)"""
  if os.geteuid() != 0:
    return []  # already an unprivileged user
  setpriv = shutil.which("setpriv")
  if setpriv is None:
    return None
  prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
  probe = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"fedjax_het_probe_{os.getpid()}"
  probe.mkdir(exist_ok=True)
  probe.chmod(0o555)
  try:
    out = subprocess.run([*prefix, sys.executable, "-c", f"open({str(probe / 'x')!r}, 'w')"],
                         capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError):
    return None
  finally:
    probe.chmod(0o755)
    shutil.rmtree(probe, ignore_errors=True)
  return prefix if "PermissionError" in out.stderr else None


def test_an_unwritable_checkpoint_folder_is_one_error_and_the_process_exits(tmp_path, env):
  unprivileged = _without_file_permission_override()
  if unprivileged is None:
    pytest.skip("cannot run the command without the privilege to write any folder (root "
                "without setpriv)")
  workdir = tmp_path / "run"
  first = subprocess.run(command(workdir, env, num_rounds=2), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  (workdir / "checkpoints").chmod(0o555)
  try:
    longer = command(workdir, env, "--config.resume_allow_changes=num_rounds", num_rounds=4)
    out = subprocess.run([*unprivileged, *longer], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=240)  # the process ends: no hang
  finally:
    (workdir / "checkpoints").chmod(0o755)
  assert out.returncode == 1, out.stderr[-3000:]
  folder = re.escape(str(workdir / "checkpoints" / "3"))
  one_line(out.stderr, rf"^error: cannot write '{folder}\.orbax-checkpoint-tmp[^']*': Permission "
                       r"denied \(the checkpoint of round 3\); training stopped at round 3; "
                       r"metrics\.jsonl is cut back to round 2, the latest checkpoint: make the "
                       r"folder writable and rerun the same command to resume from it \(round 3 "
                       r"is trained again\)\.$")
  assert not re.search(r"^E\d{4} ", out.stderr, re.M)  # no orbax error lines
  assert rounds(workdir) == [1, 2] and committed(workdir) == [1, 2]
  rerun = subprocess.run(longer, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert rounds(workdir) == [1, 2, 3, 4] and not unfinished(workdir)


_REAL_DISK = """
import json, os, pathlib, subprocess, sys
disk, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
commands = json.loads(pathlib.Path(sys.argv[3]).read_text())
disk.mkdir(parents=True, exist_ok=True)
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2048k", "tmpfs", str(disk)],
                         capture_output=True, text=True)
if mounted.returncode:
  out.joinpath("skip").write_text(mounted.stderr)
  sys.exit(0)

def fill(leave):
  filler = disk / "filler"
  handle = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  for size in (1 << 16, 1 << 12, 1 << 9, 1):
    try:
      while True:
        os.write(handle, b"\\0" * size)
    except OSError:
      pass
  os.close(handle)
  os.truncate(filler, max(0, filler.stat().st_size - leave))

results = {}
for name, command, leave in commands:
  if leave is not None:
    fill(leave)
  done = subprocess.run(command, capture_output=True, text=True)
  (disk / "filler").unlink(missing_ok=True)
  work = disk / "w"
  results[name] = {"rc": done.returncode, "stderr": done.stderr,
                   "tmp": sorted(p.name for p in work.glob(".*.tmp")),
                   "unfinished": sorted(p.name for p in (work / "checkpoints").glob("*tmp*")),
                   "rounds": [json.loads(l)["round"] for l in
                              (work / "metrics.jsonl").read_text().splitlines() if l.strip()]}
out.joinpath("results.json").write_text(json.dumps(results))
"""


@pytest.mark.slow  # four runs of the command, about 2 minutes on 2 cores
def test_a_real_full_disk_is_one_error_naming_the_path_and_the_run_resumes(tmp_path, env):
  """On a 2 MiB tmpfs mounted in a private mount namespace (root with `unshare`; skipped
  elsewhere): a checkpoint write that finds the disk full, then the record files of a start
  on a disk with no space left."""
  unshare = shutil.which("unshare")
  if os.geteuid() != 0 or unshare is None:
    pytest.skip("needs root and unshare to mount a private tmpfs")
  workdir = tmp_path / "disk" / "w"
  longer = ("--config.resume_allow_changes=num_rounds",)
  # Two model groups: a checkpoint (a few hundred KiB) does not fit in the 96 KiB left.
  two = {"architectures": ("simple_cnn", "fedavg_cifar_cnn", "simple_cnn", "fedavg_cifar_cnn")}
  steps = [("first", command(workdir, env, num_rounds=2, **two), None),
           ("checkpoint", command(workdir, env, *longer, num_rounds=4, **two), 96 * 1024),
           ("records", command(workdir, env, *longer, num_rounds=4, **two), 0),
           ("resumed", command(workdir, env, *longer, num_rounds=4, **two), None)]
  (tmp_path / "steps.json").write_text(json.dumps(steps))
  done = subprocess.run([unshare, "-m", "--propagation", "private", sys.executable, "-c",
                         _REAL_DISK, str(tmp_path / "disk"), str(tmp_path),
                         str(tmp_path / "steps.json")], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=1200)
  if done.returncode or (tmp_path / "skip").exists():
    pytest.skip(f"cannot mount a private tmpfs: {done.stderr[-300:]}"
                f"{(tmp_path / 'skip').read_text() if (tmp_path / 'skip').exists() else ''}")
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["first"]["rc"] == 0, results["first"]["stderr"][-3000:]
  checkpoint = results["checkpoint"]
  assert checkpoint["rc"] == 1, checkpoint["stderr"][-3000:]
  one_line(checkpoint["stderr"],
           rf"^error: no space left on the device writing '{re.escape(str(workdir))}/checkpoints"
           r"/3[^']*' \(the checkpoint of round 3\); training stopped at round 3; metrics\.jsonl "
           r"is cut back to round 2, the latest checkpoint: free some space and rerun the same "
           r"command to resume from it \(round 3 is trained again\)\.$")
  assert checkpoint["rounds"] == [1, 2] and not checkpoint["unfinished"]
  records = results["records"]
  assert records["rc"] == 1, records["stderr"][-3000:]
  one_line(records["stderr"], rf"^error: no space left on the device writing "
                              rf"'{re.escape(str(workdir))}/[^']+'; free some space")
  assert not records["tmp"]  # no 0-byte .config.json.tmp (or any other)
  resumed = results["resumed"]
  assert resumed["rc"] == 0, resumed["stderr"][-3000:]
  assert resumed["rounds"] == [1, 2, 3, 4] and not resumed["unfinished"]

"""Runs experiments/train.py as N CPU processes on this machine, one `clients` mesh over all.

  python experiments/multiprocess_demo.py --num_processes=2 --num_cpu_devices=2 -- \
      --config=digits_fcclplus_quick --config.sharding.num_devices=0 --workdir=/tmp/mp

Every argument after `--` goes to each experiments/train.py process unchanged;
this script adds --num_processes, --process_id, --coordinator_address
(localhost and a free port) and --num_cpu_devices. The processes start
together (process 0 runs the coordinator); process 0 writes the workdir, and
every process's output is kept in `<log_dir>/process_<i>.log` (the log of
process 0 is also copied to stdout at the end). When one process fails, the
others are stopped (they would otherwise wait for it at the next collective).
Exits with the first non-zero status, else 0.

This is the one-machine rehearsal of a run across hosts: on N hosts, start
experiments/train.py on each with the same config, --num_processes=N, its own
--process_id and --coordinator_address=<host of process 0>:<port>.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN = REPO / "experiments" / "train.py"


def free_port() -> int:
  """A TCP port on localhost that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return int(s.getsockname()[1])


def launch(train_args: list[str], *, num_processes: int, num_cpu_devices: int,
           log_dir: pathlib.Path, timeout: float | None = None,
           env: dict[str, str] | None = None, grace: float = 30.0) -> list[int]:
  """Starts `num_processes` train.py processes and waits for them; returns their exit codes.

  If one exits non-zero, the others get `grace` seconds to exit on their own
  (a refused config stops every process, each at its own pace); then, or when
  `timeout` seconds pass, the processes still running are terminated (status
  -15, or -9 if they ignore it).
  """
  if num_processes < 1:
    raise ValueError(f"--num_processes must be an integer >= 1, got {num_processes}.")
  if num_cpu_devices < 1:
    raise ValueError(f"--num_cpu_devices must be an integer >= 1, got {num_cpu_devices}.")
  log_dir.mkdir(parents=True, exist_ok=True)
  address = f"localhost:{free_port()}"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
  processes, logs = [], []
  for index in range(num_processes):
    log = open(log_dir / f"process_{index}.log", "wb")  # pylint: disable=consider-using-with
    logs.append(log)
    command = [sys.executable, str(TRAIN), *train_args, f"--num_processes={num_processes}",
               f"--process_id={index}", f"--coordinator_address={address}",
               f"--num_cpu_devices={num_cpu_devices}"]
    processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=REPO))
  deadline = None if timeout is None else time.monotonic() + timeout
  failed_at = None
  try:
    while any(p.poll() is None for p in processes):
      if any(p.returncode not in (None, 0) for p in processes):
        failed_at = failed_at or time.monotonic()
        if time.monotonic() > failed_at + grace:
          break
      if deadline is not None and time.monotonic() > deadline:
        break
      time.sleep(0.2)
  finally:
    for p in processes:
      if p.poll() is None:
        p.terminate()
    for p in processes:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for log in logs:
      log.close()
  return [p.returncode for p in processes]


def main(argv: list[str]) -> int:
  if "--" in argv:
    ours, train_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  else:
    ours, train_args = argv, []
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--num_cpu_devices", type=int, default=1,
                      help="simulated CPU devices per process")
  parser.add_argument("--log_dir", default="", help="default: a new temporary directory")
  parser.add_argument("--timeout", type=float, default=None, help="seconds; default: none")
  args = parser.parse_args(ours)
  log_dir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="fedjax_het_mp_"))
  codes = launch(train_args, num_processes=args.num_processes,
                 num_cpu_devices=args.num_cpu_devices, log_dir=log_dir, timeout=args.timeout)
  sys.stdout.write((log_dir / "process_0.log").read_text(errors="replace"))
  print(f"exit codes {codes}; logs of every process in {log_dir}")
  return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

"""One prepared command for a lent GPU: the time-to-result measurements, under a deadline.

    python benchmarks/gpu_session.py --data-dir DATA --out OUT --deadline-secs 530

Runs its steps one after another, each in its own process with its own time
limit (never past the deadline), and rewrites `OUT/session.json` after every
step, so a call cut short keeps what it measured. Every step's output goes to
`OUT/session.log`. The steps:

  1. `env`: the device (`nvidia-smi`), the JAX version and devices, and the
     installed XLA's flags (`XLA_FLAGS=--help`, in `OUT/xla_flags.txt`).
  2. `steps_default`: `gpu_compile.py` on the full-width EfficientNet-B0 local
     step (batch 256; SVHN's participant, the longest chain of the Digits
     round) with convolutions "gemm_taps" and "xla", XLA's default flags, the
     compile profiled: compile, first run, steady step and the program's
     cuDNN / GEMM counts of each.
  3. `steps_no_triton_gemm`: EfficientNet-B0 "gemm_taps" again with
     `--xla_gpu_enable_triton_gemm=false` (its matmuls on cuBLAS, whose
     autotuning tries a few algorithms instead of compiling Triton tilings).
  4. `full`: `first_round.py --config=digits_fcclplus --rounds 2` (cold, then
     warm from the cache the cold process filled) with the convolutions and
     flags that steps 2-3 found fastest to a result (`choose`), against the
     remaining time.

`--plan` picks steps by name (comma-separated) for a shorter call; `--set`
passes config overrides to the full-config step; the data come from
`--data-dir` (`FEDJAX_HET_DATA_DIR`: digits.npz and public_cifar100_5000.npz;
what is missing falls back to synthetic data, as in every run).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
STEPS = ("env", "steps_default", "steps_no_triton_gemm", "full")
NO_TRITON_GEMM = "--xla_gpu_enable_triton_gemm=false"


def choose(rows: list[dict], *, local_steps_per_round: int = 400, rounds: int = 40,
           slack: float = 1.1) -> dict:
  """The (impl, XLA flags) of the fastest EfficientNet-B0 row to a 40-round result.

  Each row (from `gpu_compile.py`, with its process's "XLA_FLAGS") is scored
  compile + first run + rounds * local_steps_per_round * step time: the full
  Digits round runs EfficientNet-B0's 400 local steps one after another, the
  longest chain of the round. A row whose step is more than `slack` times the
  fastest step is left out: the round's other phases scale with the step too.
  """
  candidates = [r for r in rows if r["backbone"] == "efficientnet_b0" and "step_ms" in r]
  if not candidates:
    return {"impl": "xla", "XLA_FLAGS": "", "why": "no EfficientNet-B0 row measured"}
  fastest = min(r["step_ms"] for r in candidates)
  kept = [r for r in candidates if r["step_ms"] <= slack * fastest]

  def score(row):
    return (row["compile_secs"] + row["first_run_secs"]
            + rounds * local_steps_per_round * row["step_ms"] / 1e3)

  best = min(kept, key=score)
  return {"impl": best["impl"], "XLA_FLAGS": best.get("XLA_FLAGS", ""),
          "score_secs": score(best),
          "scores": {f"{r['impl']} [{r.get('XLA_FLAGS', '')}]": score(r) for r in candidates}}


class Session:
  """Runs steps as subprocesses under one deadline; keeps the JSON and the log current."""

  def __init__(self, out: pathlib.Path, deadline_secs: float):
    self.out, self.start = out, time.monotonic()
    self.deadline = self.start + deadline_secs
    self.report: dict = {"steps": {}}
    self.log = (out / "session.log").open("a")

  def remaining(self) -> float:
    return self.deadline - time.monotonic()

  def save(self) -> None:
    (self.out / "session.json").write_text(json.dumps(self.report, indent=1) + "\n")

  def run(self, name: str, command: list[str], *, limit: float, env: dict | None = None) -> int:
    """Runs `command` for at most min(limit, the time left); records its status and time."""
    budget = min(limit, self.remaining())
    record = {"command": command, "XLA_FLAGS": (env or {}).get("XLA_FLAGS", ""),
              "limit_secs": budget}
    self.report["steps"][name] = record
    if budget < 5:
      record["status"] = "skipped: no time left"
      self.save()
      return -1
    self.log.write(f"\n===== {name} ({budget:.0f} s): {' '.join(command)}\n")
    self.log.flush()
    tick = time.monotonic()
    try:
      status = subprocess.run(command, stdout=self.log, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})}, timeout=budget,
                              check=False).returncode
      record["status"] = status
    except subprocess.TimeoutExpired:
      status, record["status"] = -2, "timed out"
    except OSError as error:  # e.g. no nvidia-smi on this machine
      status, record["status"] = -3, f"{type(error).__name__}: {error}"
    record["wall_secs"] = time.monotonic() - tick
    self.log.write(f"===== {name}: {record['status']} after {record['wall_secs']:.1f} s\n")
    self.log.flush()
    self.save()
    return status


def _read(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return {}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--data-dir", default="")
  parser.add_argument("--deadline-secs", type=float, default=530.0)
  parser.add_argument("--plan", default=",".join(STEPS))
  parser.add_argument("--config", default="digits_fcclplus")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--set", action="append", default=[], help="field=value (full step)")
  parser.add_argument("--width", type=float, default=1.0, help="backbone width of the step rows")
  parser.add_argument("--batch", type=int, default=256, help="batch of the step rows")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  session = Session(out, args.deadline_secs)
  plan = [s for s in args.plan.split(",") if s]
  unknown = sorted(set(plan) - set(STEPS))
  if unknown:
    raise SystemExit(f"--plan: unknown steps {unknown}; the steps are {STEPS}")
  env = {"PYTHONUNBUFFERED": "1"}
  if args.data_dir:
    env["FEDJAX_HET_DATA_DIR"] = str(pathlib.Path(args.data_dir).resolve())
  python = sys.executable
  session.report.update({"config": args.config, "plan": plan, "data_dir": args.data_dir})
  rows: list[dict] = []

  if "env" in plan:
    session.run("env_nvidia_smi", ["nvidia-smi"], limit=20, env=env)
    with (out / "xla_flags.txt").open("w") as handle:
      try:
        subprocess.run([python, "-c", "import jax; print(jax.__version__, jax.devices())"],
                       stdout=handle, stderr=subprocess.STDOUT, timeout=min(60, session.remaining()),
                       env={**os.environ, **env, "XLA_FLAGS": "--help"}, check=False)
      except subprocess.TimeoutExpired:
        handle.write("timed out\n")
    session.run("env_jax", [python, "-c", "import jax, jaxlib; print(jax.__version__, "
                            "jaxlib.__version__, jax.devices(), jax.devices()[0].device_kind)"],
                limit=60, env=env)

  def steps(name: str, rows_arg: str, flags: str, limit: float, profile: bool) -> None:
    path = out / f"{name}.json"
    command = [python, str(HERE / "gpu_compile.py"), "--rows", rows_arg, "--label", name,
               "--width", str(args.width), "--batch", str(args.batch), "--out", str(path)]
    if profile:
      command.append("--compile-profile")
    session.run(name, command, limit=limit, env={**env, "XLA_FLAGS": flags})
    for row in _read(path).get("rows", []):
      rows.append({**row, "XLA_FLAGS": flags})

  if "steps_default" in plan:
    steps("steps_default", "efficientnet_b0:gemm_taps,efficientnet_b0:xla", "", 150, True)
  if "steps_no_triton_gemm" in plan:
    steps("steps_no_triton_gemm", "efficientnet_b0:gemm_taps", NO_TRITON_GEMM, 60, False)
  choice = choose(rows)
  session.report["choice"] = choice
  session.save()

  if "full" in plan:
    command = [python, str(HERE / "first_round.py"), "--config", args.config,
               "--rounds", str(args.rounds), "--out", str(out / "first_round_full.json"),
               "--set", f"models.conv_impl={choice['impl']}"]
    for item in args.set:
      command += ["--set", item]
    session.run("full", command, limit=session.remaining(),
                env={**env, "XLA_FLAGS": choice["XLA_FLAGS"]})
  session.report["total_secs"] = time.monotonic() - session.start
  session.save()
  print(json.dumps(session.report, indent=1))


if __name__ == "__main__":
  main()

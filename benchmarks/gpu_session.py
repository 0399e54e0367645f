"""One prepared command for a lent GPU: the time-to-result measurements, under a deadline.

    python benchmarks/gpu_session.py --data-dir DATA --out OUT --deadline-secs 525 \
        [--plan env,steps,flags,quick,full,pytorch,table]

Runs its steps one after another, each in its own process with its own time
limit (never past the deadline), and rewrites `OUT/session.json` after every
step, so a call cut short keeps what it measured; every step's output goes to
`OUT/session.log`, each measurement's JSON to `OUT/<step>.json`. The steps:

  * `env`: the device (`nvidia-smi`), the JAX version and devices, and the
    installed XLA's flags (`XLA_FLAGS=--help`, in `OUT/xla_flags.txt`, cut by the
    logger after about 15,000 characters; every flag's name in
    `OUT/xla_flag_names.txt`, read from the libraries).
  * `steps`: `gpu_compile.py` on the full-width EfficientNet-B0 and
    MobileNetV2 local steps (batch 256) with the convolutions "gemm_taps" (the
    GPU default) and "xla" (stock): compile, first run, steady step, cuDNN /
    GEMM counts, under the library's XLA flags (Triton GEMM off).
  * `flags`: EfficientNet-B0's "gemm_taps" step under each of `FLAG_SETS`
    (autotuning level, command buffers), one process each, gathered in
    `OUT/flags.json`.
  * `quick`: `first_round.py --config=digits_fcclplus_quick` cold, its
    compile profiled (`--compile-profile`: XLA's passes and autotuners).
  * `full`: `first_round.py --config=digits_fcclplus`, cold then warm (the
    persistent and trace caches the cold process filled).
  * `pytorch`: `pytorch_reference.py --skip-engine` on the same config: the
    authors' and the tuned torch loops.
  * `table`: `speed_table.py --first-round OUT/full.json --pytorch
    OUT/pytorch.json`, the engine/torch table from the two.
  * `htfl`: `htfl_loop.py` on the full-width HtFE4 CIFAR-10 FedProto and FD configs
    (`--htfl-configs`; the data need cifar10.npz): the library's round beside HtFLlib's
    client-by-client torch loop, in memory and with its per-client disk round trip, each
    config's record in `OUT/htfl/`.
  * `cells`: `experiments/reproduce.py --queue=gpu --scale=paper` with the time
    left (less `CELLS_MARGIN_SECS`) as its deadline: the next unfinished
    paper-scale cells (FCCL+ and BASE on Office31 first), each finished or
    interrupted cell and the tables mirrored into `OUT/results/` as they land
    (`--copy-to`), the shipped `results/` of the checkout as the results directory;
    a later call resumes an interrupted cell from the checkpoints copied back.
  * `mid_cells`: the same for `--queue=mid --scale=mid` (FCCL+ Tables VIII/IX at mid
    scale), after the paper-scale cells.
`--cells-seeds` (default 0,1,2) and `--cells-scale` (e.g. quick, to try the step on a
CPU) set the cells steps' seeds and the `cells` step's scale.

`--plan` picks steps by name (comma-separated; the default is every step, more
than one 9-minute call holds: pick what fits). On one H200 the full config's
cold and warm processes take about 375 s and the two torch loops about 110 s
and 160 s (`--rounds 2`), over a 9-minute call: `--plan env,full,pytorch,table
--full-skip-warm --torch-rounds 1` fits the engine's cold process and one
steady round of each torch loop in one call; `--torch-flavours tuned,authors`
times the tuned loop first, so a call cut short keeps the ratio the goal names.
`--set` passes config overrides to the first-round and torch steps; the data
come from `--data-dir`
(`FEDJAX_HET_DATA_DIR`: digits.npz and public_cifar100_5000.npz; what is
missing falls back to synthetic data, as in every run). The library's GPU
defaults apply (convolutions "gemm_taps", `config.xla_gpu_triton_gemm` off);
`gpu_compile.py` rows get the same XLA flag explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import timing  # benchmarks/, beside this script

HERE = pathlib.Path(__file__).resolve().parent
STEPS = ("env", "steps", "flags", "quick", "full", "pytorch", "table", "htfl", "cells",
         "mid_cells")
#: Seconds a cells step leaves before the deadline for the runner to stop its cell and copy.
CELLS_MARGIN_SECS = 30.0
#: Limits of each step, seconds (each is also cut at the deadline; "flags": each flag set).
LIMITS = {"steps": 240, "flags": 60, "quick": 240, "full": 480, "pytorch": 240, "table": 60,
          "htfl": 480}
HTFL_CONFIGS = "htfl_cifar10_practical_htfe4_fedproto,htfl_cifar10_practical_htfe4_fd"
TRITON_GEMM_OFF = "--xla_gpu_enable_triton_gemm=false"  # the library's default on a GPU
#: XLA flag sets the `flags` step compares on EfficientNet-B0's "gemm_taps" step (each added to
#: the library's default): no autotuning (each GEMM and convolution takes its library's first
#: algorithm), the autotuner without its buffer initialisation and correctness checks, the
#: whole scan captured as one CUDA graph (a while loop in a command buffer), and no command
#: buffers at all (every kernel launched on its own).
FLAG_SETS = {
    "default": "",
    "autotune_level_0": "--xla_gpu_autotune_level=0",
    "autotune_level_1": "--xla_gpu_autotune_level=1",
    "command_buffer_while": ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,"
                             "CUSTOM_CALL,WHILE,CONDITIONAL"),
    "no_command_buffer": "--xla_gpu_enable_command_buffer=",
}


def xla_flag_names() -> list[str]:
  """Every `xla_*` name in the installed jaxlib's and JAX plugins' shared libraries: the XLA
  flags this build knows (with some other identifiers of that form), sorted.

  `XLA_FLAGS=--help` prints the flags with their help, but the logger cuts the text after
  about 15,000 characters, a fifth of the list; this reads the names from the binaries.
  """
  import importlib.util  # noqa: PLC0415
  roots = []
  for package in ("jaxlib", "jax_plugins"):
    spec = importlib.util.find_spec(package)
    if spec is not None:
      roots += [pathlib.Path(p) for p in (spec.submodule_search_locations or [])]
  pattern = re.compile(rb"\bxla_(?:gpu|cpu|dump|backend|llvm|enable|disable|hlo)_[a-z0-9_]+")
  names = set()
  for root in roots:
    for library in root.rglob("*.so*"):
      names.update(m.decode() for m in pattern.findall(library.read_bytes()))
  return sorted(names)


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
    timing.write_result(self.out / "session.json", self.report)

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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--data-dir", default="")
  parser.add_argument("--deadline-secs", type=float, default=525.0)
  parser.add_argument("--plan", default=",".join(STEPS))
  parser.add_argument("--config", default="digits_fcclplus")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--full-skip-warm", action="store_true",
                      help="the full step runs the cold process only (no warm second one)")
  parser.add_argument("--torch-rounds", type=int, default=None,
                      help="steady rounds the pytorch step times per loop (default: --rounds)")
  parser.add_argument("--torch-flavours", default="",
                      help="comma-separated torch loops the pytorch step times, in this order "
                           "(default: pytorch_reference.py's, authors then tuned)")
  parser.add_argument("--htfl-configs", default=HTFL_CONFIGS,
                      help="comma-separated configs of the `htfl` step")
  parser.add_argument("--width", type=float, default=1.0, help="backbone width of the step rows")
  parser.add_argument("--batch", type=int, default=256, help="batch of the step rows")
  parser.add_argument("--step-rows", default="efficientnet_b0:gemm_taps,efficientnet_b0:xla,"
                      "mobilenet_v2:gemm_taps,mobilenet_v2:xla")
  parser.add_argument("--cells-seeds", default="0,1,2", help="seeds of the cells steps")
  parser.add_argument("--cells-scale", default="paper", help="scale of the `cells` step")
  args = parser.parse_args()
  plan = [s for s in args.plan.split(",") if s]
  unknown = sorted(set(plan) - set(STEPS))
  if unknown:
    raise SystemExit(f"--plan: unknown steps {unknown}; the steps are {STEPS}")
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  session = Session(out, args.deadline_secs)
  env = {"PYTHONUNBUFFERED": "1"}
  if args.data_dir:
    env["FEDJAX_HET_DATA_DIR"] = str(pathlib.Path(args.data_dir).resolve())
  python = sys.executable
  session.report.update({"config": args.config, "plan": plan, "data_dir": args.data_dir,
                         "overrides": args.set})
  overrides = [item for pair in (("--set", item) for item in args.set) for item in pair]

  if "env" in plan:
    session.run("env_nvidia_smi", ["nvidia-smi"], limit=20, env=env)
    with (out / "xla_flags.txt").open("w") as handle:
      try:
        subprocess.run([python, "-c", "import jax; print(jax.__version__, jax.devices())"],
                       stdout=handle, stderr=subprocess.STDOUT,
                       timeout=max(1.0, min(60, session.remaining())),
                       env={**os.environ, **env, "XLA_FLAGS": "--help"}, check=False)
      except subprocess.TimeoutExpired:
        handle.write("timed out\n")
    names = xla_flag_names()  # XLA's --help text is cut at the logger's limit; the names are not
    (out / "xla_flag_names.txt").write_text("".join(f"--{name}\n" for name in names))
    session.run("env_jax", [python, "-c", "import jax, jaxlib; print(jax.__version__, "
                            "jaxlib.__version__, jax.devices(), jax.devices()[0].device_kind)"],
                limit=60, env=env)
  if "steps" in plan:
    session.run("steps", [python, str(HERE / "gpu_compile.py"), "--rows", args.step_rows,
                          "--width", str(args.width), "--batch", str(args.batch),
                          "--out", str(out / "steps.json")],
                limit=LIMITS["steps"], env={**env, "XLA_FLAGS": TRITON_GEMM_OFF})
  if "flags" in plan:
    for name, flags in FLAG_SETS.items():
      session.run(f"flags_{name}", [python, str(HERE / "gpu_compile.py"), "--rows",
                                    "efficientnet_b0:gemm_taps", "--width", str(args.width),
                                    "--batch", str(args.batch), "--label", name,
                                    "--out", str(out / f"flags_{name}.json")],
                  limit=LIMITS["flags"],
                  env={**env, "XLA_FLAGS": f"{TRITON_GEMM_OFF} {flags}".strip()})
    merged = {}  # one file for the flag sets: OUT/flags.json, {flag set: gpu_compile's result}
    for name in FLAG_SETS:
      path = out / f"flags_{name}.json"
      if path.is_file():
        merged[name] = json.loads(path.read_text())
        path.unlink()
    # The header of the flag sets' runs (the same machine and commit), then {flag set: result}.
    header = next((result["header"] for result in merged.values() if "header" in result), None)
    (out / "flags.json").write_text(json.dumps(
        {**({"header": header} if header else {}), **merged}, indent=1) + "\n")
  if "quick" in plan:
    session.run("quick", [python, str(HERE / "first_round.py"), "--config",
                          f"{args.config}_quick", "--rounds", str(args.rounds), "--skip-warm",
                          "--compile-profile", "--out", str(out / "quick.json"), *overrides],
                limit=LIMITS["quick"], env=env)
  if "full" in plan:
    session.run("full", [python, str(HERE / "first_round.py"), "--config", args.config,
                         "--rounds", str(args.rounds), "--out", str(out / "full.json"),
                         *(["--skip-warm"] if args.full_skip_warm else []), *overrides],
                limit=LIMITS["full"], env=env)
  if "pytorch" in plan:
    torch_rounds = args.rounds if args.torch_rounds is None else args.torch_rounds
    session.run("pytorch", [python, str(HERE / "pytorch_reference.py"), "--config", args.config,
                            "--rounds", str(torch_rounds), "--skip-engine",
                            *(["--flavours", args.torch_flavours] if args.torch_flavours else []),
                            "--out", str(out / "pytorch.json"), *overrides],
                limit=LIMITS["pytorch"], env=env)
  if "table" in plan:
    session.run("table", [python, str(HERE / "speed_table.py"), "--config", args.config,
                          "--first-round", str(out / "full.json"),
                          "--pytorch", str(out / "pytorch.json"),
                          "--out", str(out / "table.json"), *overrides],
                limit=LIMITS["table"], env=env)
  if "htfl" in plan:
    configs = [x for name in args.htfl_configs.split(",") if name for x in ("--config", name)]
    session.run("htfl", [python, str(HERE / "htfl_loop.py"), *configs, "--rounds",
                         str(args.rounds), "--out-dir", str(out / "htfl")],
                limit=LIMITS["htfl"], env=env)
  for step, queue, scale in (("cells", "gpu", args.cells_scale), ("mid_cells", "mid", "mid")):
    if step in plan:
      deadline = max(0.0, session.remaining() - CELLS_MARGIN_SECS)
      session.run(step, [python, str(HERE.parent / "experiments" / "reproduce.py"),
                         f"--queue={queue}", f"--scale={scale}", f"--seeds={args.cells_seeds}",
                         f"--deadline-secs={deadline:.0f}", f"--copy-to={out}",
                         f"--results-dir={HERE.parent / 'results'}"],
                  limit=deadline + CELLS_MARGIN_SECS / 2, env=env)
  session.report["total_secs"] = time.monotonic() - session.start
  session.save()
  print(json.dumps(session.report, indent=1))


if __name__ == "__main__":
  main()

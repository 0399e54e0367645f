"""XLA:CPU compile options against the cold start: each option set's compile, first round and
steady round, and whether it changes the round's bits.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/xla_cpu_options.py \
        --config=digits_fcclplus_quick \
        --out benchmarks/results/xla_cpu_options__digits_fcclplus_quick__<device>.json

Runs `first_round.py --skip-warm` (a cold process: an empty persistent cache)
once per option set of `OPTION_SETS` (or `--options`), one after the other,
with the set's flags added to `XLA_FLAGS`, and writes after each run one row:
the wall and CPU seconds of trace + lower, of the XLA compile and of the
first round, the steady round (median of `--rounds`), the start of the
process to the end of round 1, and `same_bits_as_default`: whether the state
after round 1 equals the default set's bit for bit (`round1_state_sha256`).
An option that changes the bits changes every number a run reports, so the
library takes one as a default only when it keeps them. Never compare rows
measured on different machines.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import timing  # benchmarks/, beside this script

HERE = pathlib.Path(__file__).resolve().parent
#: XLA:CPU flag sets, each added to `XLA_FLAGS` (names and values from `XLA_FLAGS=--help` of
#: jaxlib 0.10): XLA's compile-time preset; LLVM at optimisation level 1 (XLA's default is 3);
#: copy insertion with region analysis (copy-insertion is the largest HLO pass of the quick
#: FCCL+ round's compile).
OPTION_SETS = {
    "default": "",
    "opt_preset_fast_compile": "--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE",
    "backend_optimization_level_1": "--xla_backend_optimization_level=1",
    "copy_insertion_region_analysis": "--xla_cpu_copy_insertion_use_region_analysis=true",
}
#: The figures of `first_round.py`'s cold row each option set's row keeps.
KEPT = ("trace_lower_secs", "compile_secs", "compile_secs_by_stage", "first_round_secs",
        "steady_round_secs", "start_to_round1_end_secs", "cpu_secs",
        "cpu_floor_to_round1_secs", "memory_gib", "round1_state_sha256")


def run_option_set(config: str, flags: str, rounds: int, overrides: list[str]) -> dict:
  """`first_round.py --skip-warm` under `flags` (added to XLA_FLAGS): its kept figures."""
  with tempfile.TemporaryDirectory(prefix="fedjax_het_xla_cpu_options_") as temporary:
    out = pathlib.Path(temporary) / "first_round.json"
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    command = [sys.executable, str(HERE / "first_round.py"), "--config", config, "--skip-warm",
               "--rounds", str(rounds), "--cache-dir", str(pathlib.Path(temporary) / "cache"),
               "--out", str(out)]
    for item in overrides:
      command += ["--set", item]
    subprocess.run(command, check=True, env=env)
    cold = json.loads(out.read_text())["cold"]
  return {"flags": flags, **{key: cold[key] for key in KEPT if key in cold}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--rounds", type=int, default=1, help="steady rounds timed per set")
  parser.add_argument("--options", default=",".join(OPTION_SETS),
                      help="comma-separated names of OPTION_SETS (default: every set)")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  names = [name for name in args.options.split(",") if name]
  unknown = sorted(set(names) - set(OPTION_SETS))
  if unknown:
    parser.error(f"--options: unknown option sets {unknown}; allowed: {sorted(OPTION_SETS)}")
  report = {"config": args.config, "overrides": args.set, "rounds": args.rounds,
            "base_XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""), "rows": {}}
  for name in names:
    row = run_option_set(args.config, OPTION_SETS[name], args.rounds, args.set)
    reference = report["rows"].get("default", {}).get("round1_state_sha256")
    if reference is not None:
      row["same_bits_as_default"] = row["round1_state_sha256"] == reference
    report["rows"][name] = row
    print(f"[xla_cpu_options] {name}: " + ", ".join(
        f"{k} {v:.1f}" for k, v in row.items() if k.endswith("_secs") and isinstance(v, float))
          + (f", same bits as default: {row['same_bits_as_default']}"
             if "same_bits_as_default" in row else ""), flush=True)
    if args.out:  # after every set: a run cut short keeps what it measured
      timing.write_result(args.out, report, indent=2)
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()

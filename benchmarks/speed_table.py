"""The speed table of a config: first round cold and warm, steady state, end to end, memory,
with the engine's speedup over the authors' PyTorch loop, measured in one run.

    pip install -e '.[bench]'   # torch
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/speed_table.py \
        --config=digits_fcclplus_quick --rounds 2 \
        --out benchmarks/results/speed_table__digits_fcclplus_quick__<device>.json

One command runs, one after the other on the same machine:

1. `first_round.py` (the engine, as `experiments/train.py` runs it: two fresh
   processes, one with an empty persistent compilation cache, "cold", then one
   with the cache the first filled, "warm"): data, init, trace + lower, XLA
   compile (warm: the load from the cache), the first round, the evaluation's
   first call, the median of `--rounds` steady rounds, XLA's memory estimate;
2. `pytorch_reference.py --skip-engine`: the authors' FCCL+ round in PyTorch
   ("authors": their loop, sequential participants, a new Adam per public batch,
   `.item()` at every step) and the same math without host syncs ("tuned"), on
   the same models and sizes, on the same device (cuda if torch sees one).

and prints one Markdown table of the engine's speed:

  * the XLA compile of the round, cold and warm (a warm one loads it);
  * the start of the process to the end of round 1, cold and warm;
  * the first execution of the round, and torch's first round (cuDNN and
    allocator warm-up on a GPU);
  * the steady-state round of the engine and of both torch loops (the table's
    speedups use the cold process's median);
  * end to end over the config's `num_rounds`: the engine's init, trace,
    lower, compile, first round and (num_rounds - 1) steady rounds (data
    building and the evaluation are left out, as the torch side has neither),
    torch's model build, first round and (num_rounds - 1) steady rounds;
  * memory: XLA's estimate of the round, torch's peak allocation (cuda only);
  * `engine_vs_pytorch_speedup` = torch seconds / engine seconds, steady state
    and end to end (the engine's cold and warm figures), per torch flavour;
  * the speed goals, which are set for `digits_fcclplus` on one GPU: the first
    round <= 60 s cold and <= 20 s warm, a steady round <= 4 s, the engine
    >= 5x the tuned loop, 40 rounds <= 240 s; `goals_met` is reported only for
    that config on a GPU.

Where one command may run only minutes (a lent GPU), run the two halves apart
(`first_round.py --out A`, `pytorch_reference.py --skip-engine --out B`) and
build the table from their files: `speed_table.py --first-round A --pytorch B`.
Both halves must have timed the same config with the same overrides.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent

# The speed goals (digits_fcclplus, one GPU).
GOAL_CONFIG = "digits_fcclplus"
GOALS = {"start_to_round1_end_cold_secs": 60.0, "start_to_round1_end_warm_secs": 20.0,
         "steady_round_secs": 4.0, "tuned_steady_state_speedup": 5.0,
         "end_to_end_40_rounds_secs": 240.0}


def engine_end_to_end(row: dict, num_rounds: int, rounds_per_call: int) -> float:
  """init + trace/lower + compile + first round + (calls - 1) steady rounds, seconds (the
  figure pytorch_reference.py reports for the engine)."""
  calls = num_rounds // rounds_per_call
  return (row["init_secs"] + row["trace_lower_secs"] + row["compile_secs"]
          + row["first_round_secs"] + (calls - 1) * row["steady_round_secs"])


def build_table(first_round: dict, pytorch: dict, num_rounds: int,
                rounds_per_call: int = 1) -> dict:
  """The table's figures from a first_round.py report ({"cold": row, "warm": row}) and a
  pytorch_reference.py report ({"torch": {flavour: row}, ...}); see the module docstring."""
  cold, warm = first_round["cold"], first_round.get("warm")
  for name, row in (("cold", cold), ("warm", warm)):
    if row is not None and (row["config"], row["overrides"]) != (pytorch["config"],
                                                                 pytorch["overrides"]):
      raise ValueError(
          f"first_round's {name} run timed config {row['config']!r} with overrides "
          f"{row['overrides']}, pytorch_reference timed {pytorch['config']!r} with "
          f"{pytorch['overrides']}: both halves must time the same config")
  torch_device = pytorch.get("machine", {}).get("torch_device")
  if torch_device is not None:
    torch_backend = "gpu" if torch_device.startswith("cuda") else torch_device.split(":")[0]
    if torch_backend != cold["backend"]:
      raise ValueError(f"torch ran on {torch_device!r} and the engine on {cold['backend']!r}: "
                       "both halves must run on the same kind of device")
  if pytorch.get("num_rounds") not in (None, num_rounds):
    raise ValueError(f"num_rounds: the table is for {num_rounds}, pytorch_reference's "
                     f"end to end for {pytorch['num_rounds']}")
  per_round = cold["steady_round_secs"] / rounds_per_call
  engine = {"compile_cold_secs": cold["compile_secs"],
            "start_to_round1_end_cold_secs": cold["start_to_round1_end_secs"],
            "first_round_cold_secs": cold["first_round_secs"],
            "steady_round_secs": per_round,
            "end_to_end_cold_secs": engine_end_to_end(cold, num_rounds, rounds_per_call),
            "memory_gib": cold.get("memory_gib")}
  if warm is not None:
    engine.update(compile_warm_secs=warm["compile_secs"],
                  start_to_round1_end_warm_secs=warm["start_to_round1_end_secs"],
                  first_round_warm_secs=warm["first_round_secs"],
                  steady_round_warm_secs=warm["steady_round_secs"] / rounds_per_call,
                  end_to_end_warm_secs=engine_end_to_end(warm, num_rounds, rounds_per_call))
  torch_rows = {}
  for flavour, row in pytorch["torch"].items():
    speedup = {"steady_state": row["steady_round_secs"] / per_round,
               "end_to_end_cold": row["end_to_end_secs"] / engine["end_to_end_cold_secs"]}
    if warm is not None:
      speedup["end_to_end_warm"] = row["end_to_end_secs"] / engine["end_to_end_warm_secs"]
    torch_rows[flavour] = {"first_round_secs": row["first_round_secs"],
                           "steady_round_secs": row["steady_round_secs"],
                           "end_to_end_secs": row["end_to_end_secs"],
                           "peak_memory_gib": row.get("peak_memory_gib"),
                           "engine_vs_pytorch_speedup": speedup}
  table = {"config": pytorch["config"], "overrides": pytorch["overrides"],
           "num_rounds": num_rounds, "rounds_per_call": rounds_per_call,
           "backend": cold["backend"], "engine": engine, "torch": torch_rows,
           "goals": dict(GOALS)}
  if pytorch["config"] == GOAL_CONFIG and not pytorch["overrides"] and cold["backend"] == "gpu":
    met = {"start_to_round1_end_cold_secs": engine["start_to_round1_end_cold_secs"],
           "steady_round_secs": per_round}
    if warm is not None:
      met["start_to_round1_end_warm_secs"] = engine["start_to_round1_end_warm_secs"]
    if num_rounds == 40:
      met["end_to_end_40_rounds_secs"] = engine["end_to_end_cold_secs"]
    table["goals_met"] = {name: value <= GOALS[name] for name, value in met.items()}
    if "tuned" in torch_rows:
      table["goals_met"]["tuned_steady_state_speedup"] = (
          torch_rows["tuned"]["engine_vs_pytorch_speedup"]["steady_state"]
          >= GOALS["tuned_steady_state_speedup"])
  return table


def _cell(value, unit: str = "s", digits: int = 1) -> str:
  """`value` with `digits` decimals and its unit ("x" for a ratio, written 2.50x); "" for None."""
  if value is None:
    return ""
  return f"{value:.{digits}f}x" if unit == "x" else f"{value:.{digits}f} {unit}"


def markdown(table: dict) -> str:
  """The table as Markdown: one row per figure, engine (cold / warm cache) and torch columns."""
  engine, torch_rows = table["engine"], table["torch"]
  flavours = list(torch_rows)
  goal_note = ("" if table["config"] == GOAL_CONFIG and table["backend"] == "gpu" else
               f" (set for {GOAL_CONFIG} on one GPU)")
  head = ["figure", "engine, cold cache", "engine, warm cache",
          *[f"torch `{f}`" for f in flavours], f"goal{goal_note}"]
  rows = [
      ["XLA compile of the round (warm: load from the cache)",
       _cell(engine["compile_cold_secs"]), _cell(engine.get("compile_warm_secs")),
       *["" for _ in flavours], ""],
      ["start of the process to the end of round 1",
       _cell(engine["start_to_round1_end_cold_secs"]),
       _cell(engine.get("start_to_round1_end_warm_secs")), *["" for _ in flavours],
       f"<= {GOALS['start_to_round1_end_cold_secs']:.0f} s cold, "
       f"<= {GOALS['start_to_round1_end_warm_secs']:.0f} s warm"],
      ["first execution of the round (torch: its first round)",
       _cell(engine["first_round_cold_secs"]), _cell(engine.get("first_round_warm_secs")),
       *[_cell(torch_rows[f]["first_round_secs"]) for f in flavours], ""],
      ["steady-state round", _cell(engine["steady_round_secs"], digits=2),
       _cell(engine.get("steady_round_warm_secs"), digits=2),
       *[_cell(torch_rows[f]["steady_round_secs"], digits=2) for f in flavours],
       f"<= {GOALS['steady_round_secs']:.0f} s"],
      ["engine speedup, steady state (torch / engine)", "", "",
       *[_cell(torch_rows[f]["engine_vs_pytorch_speedup"]["steady_state"], "x", 2)
         for f in flavours], f">= {GOALS['tuned_steady_state_speedup']:.0f}x `tuned`"],
      [f"end to end, {table['num_rounds']} rounds", _cell(engine["end_to_end_cold_secs"]),
       _cell(engine.get("end_to_end_warm_secs")),
       *[_cell(torch_rows[f]["end_to_end_secs"]) for f in flavours],
       f"<= {GOALS['end_to_end_40_rounds_secs']:.0f} s for 40 rounds"],
      ["engine speedup, end to end (cold / warm)", "", "",
       *[" / ".join(_cell(torch_rows[f]["engine_vs_pytorch_speedup"].get(k), "x", 2)
                    for k in ("end_to_end_cold", "end_to_end_warm")
                    if k in torch_rows[f]["engine_vs_pytorch_speedup"]) for f in flavours], ""],
      ["memory (engine: XLA estimate; torch: peak allocated)",
       _cell(engine["memory_gib"], "GiB", 2), "",
       *[_cell(torch_rows[f]["peak_memory_gib"], "GiB", 2) for f in flavours],
       "below the torch loop"],
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  if "goals_met" in table:
    lines.append("")
    lines.append("goals met: " + ", ".join(f"{k} {'yes' if v else 'no'}"
                                           for k, v in table["goals_met"].items()))
  return "\n".join(lines)


def _run(script: str, args: list[str], out: pathlib.Path) -> dict:
  subprocess.run([sys.executable, str(HERE / script), *args, "--out", str(out)], check=True)
  return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--rounds", type=int, default=3, help="steady-state rounds timed")
  parser.add_argument("--flavours", default="authors,tuned", help="torch flavours, comma-separated")
  parser.add_argument("--first-round", default="",
                      help="a first_round.py JSON to use instead of running it")
  parser.add_argument("--pytorch", default="",
                      help="a pytorch_reference.py JSON to use instead of running it")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  overrides = [item for s in args.set for item in ("--set", s)]
  with tempfile.TemporaryDirectory(prefix="fedjax_het_speed_table_") as scratch:
    if args.first_round:
      first_round = json.loads(pathlib.Path(args.first_round).read_text())
    else:
      first_round = _run("first_round.py", ["--config", args.config, "--rounds",
                                            str(args.rounds), *overrides],
                         pathlib.Path(scratch) / "first_round.json")
    if args.pytorch:
      pytorch = json.loads(pathlib.Path(args.pytorch).read_text())
    else:
      pytorch = _run("pytorch_reference.py", [f"--config={args.config}", "--rounds",
                                              str(args.rounds), "--skip-engine",
                                              f"--flavours={args.flavours}", *overrides],
                     pathlib.Path(scratch) / "pytorch_reference.json")
  sys.path.insert(0, str(HERE))
  import first_round as first_round_script  # noqa: PLC0415 (benchmarks/, beside this script)
  import timing  # noqa: PLC0415
  config = first_round_script.load_config(pytorch["config"], pytorch["overrides"])
  table = build_table(first_round, pytorch, int(config.num_rounds), int(config.rounds_per_call))
  report = {"table": table, "markdown": markdown(table), "machine": pytorch.get("machine"),
            "first_round": first_round, "pytorch_reference": pytorch}
  print(report["markdown"])
  if args.out:
    report = timing.write_result(args.out, report,
                                 device=(pytorch.get("header") or {}).get("device"), indent=2)
  return report


if __name__ == "__main__":
  main()

"""What a round of a config costs through the trainer: the figure a scale is sized by.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 FEDJAX_HET_DATA_DIR=<bundle> \
        python benchmarks/round_cost.py --rounds=3 --name=two_stream_mid \
        --configs=mnist_fedavg_permuted_mid,mnist_fedfusion_permuted_conv_mid \
        --out benchmarks/results/round_cost__two_stream_mid__<device>.json

Each config trains its first `--rounds` rounds in a fresh process of
`experiments/train.py --config=<config>` (a temporary workdir; the compilation cache as a user
has it), stopped with SIGTERM once the trainer has logged that many rounds (any config,
the class-incremental stream's too), one config after another; the JSON records, per
config, the wall seconds of each round from its progress line (training, evaluation and
records: what a cell pays), the seconds of the round's training program alone
(`time/round_secs` of metrics.jsonl), the steady round (the median of the rounds after the
first, wall), the round count of the full config and what that many steady rounds cost, and
the run's per-round evaluation. It is written after each config.

A config may carry overrides of its fields, `name:field=value[:field=value...]` (each passed
to the trainer as `--config.field=value`; the record's key is the whole spec), so that one run
times a config beside its variants, e.g. a cost broken into parts:

    python benchmarks/round_cost.py --rounds=2 --name=glfc_mid_parts \
        --configs=cifar100_glfc_mid,cifar100_glfc_mid:glfc.proxy.reconstruction_steps=20,\
cifar100_glfc_mid:glfc.old_model=previous_task_global \
        --metrics=proxy/gradients,glfc/signals --out ...

`--metrics` names metrics.jsonl keys recorded for every round beside the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import timing  # noqa: E402  pylint: disable=wrong-import-position


def read_rounds(workdir: pathlib.Path, metrics: tuple[str, ...] = ()) -> dict:
  """{"round_secs": {round: s}, "eval": {round: {metric: value}}} from a run's metrics.jsonl
  (the evaluation: its `eval/...` means), and with `metrics` "metrics": {round: {key: value}}
  for those keys."""
  round_secs, evals, picked = {}, {}, {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    r = str(record["round"])
    if "time/round_secs" in record:
      round_secs[r] = round(record["time/round_secs"], 2)
    means = {k: round(v, 2) for k, v in record.items()
             if k.startswith("eval/") and k.endswith("/mean")}
    if means:
      evals[r] = means
    chosen = {k: record[k] for k in metrics if k in record}
    if chosen:
      picked[r] = chosen
  result = {"round_secs": round_secs, "eval": evals}
  if metrics:
    result["metrics"] = picked
  return result


def parse_spec(spec: str) -> tuple[str, list[str]]:
  """"name:field=value:..." -> (name, ["--config.field=value", ...])."""
  name, *overrides = spec.split(":")
  flags = []
  for override in overrides:
    field, sep, value = override.partition("=")
    if not sep or not field or not value:
      raise ValueError(f"--configs: {spec!r}: an override is field=value, got {override!r}")
    flags.append(f"--config.{field}={value}")
  return name, flags


#: The trainer's progress line without a terminal (`reporting.Progress`): its round and the
#: wall seconds since the previous line.
PROGRESS_LINE = re.compile(r"round (\d+)/\d+ .*\((\d+(?:\.\d+)?) s/round, ETA")


def read_wall_seconds(log: str) -> dict:
  """{round: wall seconds} from the trainer's progress lines in `log`."""
  return {m.group(1): float(m.group(2)) for m in PROGRESS_LINE.finditer(log)}


def steady_round(round_secs: dict) -> float | None:
  """The median of the rounds after the first (None with one round)."""
  later = [s for r, s in round_secs.items() if int(r) > 1]
  return round(statistics.median(later), 2) if later else None


def measure(spec: str, rounds: int, metrics: tuple[str, ...] = ()) -> dict:
  """One config's (`parse_spec`) first `rounds` rounds in a fresh trainer process."""
  config, overrides = parse_spec(spec)
  from fedjax_het import configs  # pylint: disable=import-outside-toplevel
  from fedjax_het.grid import cell_configs  # pylint: disable=import-outside-toplevel
  full_rounds = cell_configs.expected_rounds(configs.get_config(config))
  with tempfile.TemporaryDirectory() as tmp:
    workdir = pathlib.Path(tmp) / "run"
    command = [sys.executable, str(REPO / "experiments" / "train.py"), f"--config={config}",
               f"--workdir={workdir}", *overrides]
    log = []
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
      for line in process.stdout:
        log.append(line)
        progress = PROGRESS_LINE.search(line)
        if progress and int(progress.group(1)) >= rounds:
          process.send_signal(signal.SIGTERM)  # the trainer stops with one line, status 130
      process.wait()
    wall = read_wall_seconds("".join(log))
    if len(wall) < min(rounds, full_rounds):
      raise RuntimeError(f"{spec}: {len(wall)} rounds logged, exit status "
                         f"{process.returncode}:\n{''.join(log[-20:])}")
    result = {"wall_secs": wall, **read_rounds(workdir, metrics)}
  steady = steady_round(result["wall_secs"])
  return {"command": f"python experiments/train.py --config={config} "
                     + "".join(f"{flag} " for flag in overrides) + "--workdir=<tmp>, "
                     f"stopped after round {rounds}",
          "steady_wall_secs": steady, "full_config_rounds": full_rounds,
          "full_config_minutes_at_steady_round": (round(steady * full_rounds / 60, 1)
                                                  if steady else None),
          **result}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", required=True,
                      help="comma-separated config names, each name[:field=value...]")
  parser.add_argument("--metrics", default="",
                      help="comma-separated metrics.jsonl keys to record for every round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--name", required=True, help="the record's name (in --out)")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  report = {"rounds": args.rounds, "data_dir_set": bool(os.environ.get("FEDJAX_HET_DATA_DIR")),
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""), "configs": {}}
  for config in args.configs.split(","):
    report["configs"][config] = measure(config, args.rounds,
                                        tuple(m for m in args.metrics.split(",") if m))
    timing.write_result(args.out, report)
    print(f"{config}: steady round {report['configs'][config]['steady_wall_secs']} s",
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""How many convolutions and matrix products each round program holds, and how many distinct.

    python benchmarks/program_shapes.py --config=digits_fcclplus --impls gemm_taps,xla \
        --out benchmarks/results/program_shapes__digits_fcclplus__cpu2.json

On a GPU, XLA autotunes every distinct cuDNN convolution (and, with Triton
GEMM on, every distinct matrix-product fusion) while it compiles, and builds a
cuDNN execution plan for each at its first run: the number of distinct
convolution signatures bounds that work. This script traces and lowers a
config's round programs (one per stage, as `train.py` compiles them) and the
evaluation on this machine, without compiling them, and counts in each
program's StableHLO:

  * `convolutions`: `stablehlo.convolution` ops, and `distinct_convolutions`:
    distinct (input type, kernel type, attributes) signatures: forward,
    input-gradient and kernel-gradient convolutions of each layer and batch
    size are distinct signatures;
  * `dot_generals` and `distinct_dot_generals` likewise;
  * `distinct_convolutions_by_batch`: distinct convolutions per leading
    dimension of their input (the batch of a forward or input-gradient
    convolution; a kernel gradient's input leads with its channels).

The StableHLO does not depend on the backend the script runs on, except
through the convolution implementation (`--set models.conv_impl=...`; the
`--impls` lists the implementations to count, "gemm_taps" being the GPU's
default).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

import jax

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # first_round.py's config loader, beside this script

_OP = re.compile(r"stablehlo\.(convolution|dot_general)\b(.*)$")
_TYPES = re.compile(r":\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)\s*->\s*(tensor<[^>]*>)")


def count_ops(text: str) -> dict:
  """Counts of convolutions and dot_generals in StableHLO `text`, total and distinct."""
  ops: dict[str, collections.Counter] = {"convolution": collections.Counter(),
                                         "dot_general": collections.Counter()}
  for line in text.splitlines():
    match = _OP.search(line)
    if not match:
      continue
    kind, rest = match.groups()
    signature = re.sub(r"%[\w#.]+", "", rest).strip()  # attributes and types, no operand names
    ops[kind][signature] += 1
  distinct_batches: collections.Counter = collections.Counter()
  for signature in ops["convolution"]:
    types = _TYPES.search(signature)
    if types and (dims := re.findall(r"\d+", types.group(1))):
      distinct_batches[int(dims[0])] += 1
  return {"convolutions": sum(ops["convolution"].values()),
          "distinct_convolutions": len(ops["convolution"]),
          "dot_generals": sum(ops["dot_general"].values()),
          "distinct_dot_generals": len(ops["dot_general"]),
          "distinct_convolutions_by_batch": {str(k): v for k, v in
                                             sorted(distinct_batches.items())}}


def count_programs(config) -> dict:
  """`count_ops` of each round program of `config` (one per stage) and of its evaluation."""
  from fedjax_het.experiment import Experiment  # noqa: PLC0415
  experiment = Experiment(config)
  state = experiment.init_state()
  lowered = experiment.lower_rounds(state)
  programs = {}
  for name, program in zip(getattr(lowered, "names", ("round",)),
                           getattr(lowered, "lowered", (lowered,))):
    programs[name] = count_ops(program.as_text())
  evaluation = jax.jit(experiment.evaluate).lower(state, experiment.data.test)
  programs["evaluation"] = count_ops(evaluation.as_text())
  return {"conv_impl": experiment.conv_impl, "public_conv_impl": experiment.public_conv_impl,
          "architectures": list(experiment.architectures), "programs": programs}


def main() -> None:
  from first_round import load_config  # noqa: PLC0415 (the same config loader)
  import timing  # noqa: PLC0415 (benchmarks/, beside this script)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--impls", default="gemm_taps,xla",
                      help="models.conv_impl values to count, comma-separated")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  report = {"config": args.config, "overrides": args.set, "by_conv_impl": {}}
  for impl in filter(None, args.impls.split(",")):
    config = load_config(args.config, [*args.set, f"models.conv_impl={impl}"])
    config.trace_cache = "off"
    report["by_conv_impl"][impl] = count_programs(config)
    print(json.dumps({impl: report["by_conv_impl"][impl]["programs"]}), flush=True)
  if args.out:
    timing.write_result(args.out, report)


if __name__ == "__main__":
  main()

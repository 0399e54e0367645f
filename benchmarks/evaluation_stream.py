"""The evaluation as one stream of the domains' real test rows, against every domain padded.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 FEDJAX_HET_DATA_DIR=<data> \
        python benchmarks/evaluation_stream.py --config=digits_fcclplus \
        --out benchmarks/results/evaluation_stream__digits_fcclplus__<device>.json

For one config (any name `experiments/train.py` takes, with `--set field=value`
overrides) the script builds the Experiment, its initial state, and two
evaluators of every participant on every test domain
(`fedjax_het.evaluation.make_evaluator`): "padded", every domain's test set
padded to the largest one's rows and vmapped over domains (the library's
evaluator before `Setup.test_sizes`), and "stream", the real rows of all domains
as one stream of batches (what `Experiment` uses now). It compiles both, then
times them alternately (`--repeats` each) in this process and checks that their
accuracies are equal, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import timing  # noqa: E402
from first_round import load_config  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
  from fedjax_het.runtime import xla_cpu  # noqa: PLC0415 (starts no JAX backend)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  scheduler = xla_cpu.set_xla_cpu_scheduler("auto")  # as train.py, before JAX computes
  import jax  # noqa: PLC0415

  from fedjax_het import evaluation  # noqa: PLC0415
  from fedjax_het.algorithms.common import normalizer  # noqa: PLC0415
  from fedjax_het.experiment import Experiment  # noqa: PLC0415

  config = load_config(args.config, args.set)
  experiment = Experiment(config)
  state = jax.block_until_ready(experiment.init_state())
  setup, test = experiment.setup, experiment.data.test
  report = {"config": args.config, "overrides": args.set, "backend": jax.default_backend(),
            "conv_impl": experiment.conv_impl, "test_sizes": list(setup.test_sizes),
            "padded_rows_per_model": len(setup.test_sizes) * setup.max_test_size,
            "real_rows_per_model": sum(setup.test_sizes), "xla_cpu_scheduler": scheduler}
  compiled = {}
  for name, sizes in (("padded", None), ("stream", setup.test_sizes)):
    evaluate = evaluation.make_evaluator(
        setup.groups, batch_size=int(config.eval.batch_size), max_size=setup.max_test_size,
        top_k=int(config.eval.top_k), preprocess=normalizer(setup.private_mean,
                                                            setup.private_std), sizes=sizes)
    tick = time.perf_counter()
    compiled[name] = jax.jit(evaluate).lower(state, test).compile()
    report[f"{name}_compile_secs"] = time.perf_counter() - tick
  times, accuracies = {name: [] for name in compiled}, {}
  for _ in range(args.repeats):
    for name, program in compiled.items():
      tick = time.perf_counter()
      accuracies[name] = jax.block_until_ready(program(state, test))
      times[name].append(time.perf_counter() - tick)
      print(f"{name}: {times[name][-1]:.2f} s", flush=True)
  for name, values in times.items():
    report[f"{name}_secs"], report[f"{name}_all"] = statistics.median(values), values
  report["stream_speedup"] = report["padded_secs"] / report["stream_secs"]
  report["equal_accuracies"] = all(
      (jax.numpy.asarray(accuracies["padded"][g]) == accuracies["stream"][g]).all().item()
      for g in accuracies["padded"])
  print(json.dumps(report, indent=1))
  if args.out:
    timing.write_result(args.out, report)
  return report


if __name__ == "__main__":
  main()

"""How far the config travels: every function that reads a field of the run's ConfigDict during
one tiny training run from the training entry, and the modules they live in.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/config_walk.py \
        --variant=fcclplus \
        --out benchmarks/results/config_walk__digits_fcclplus_quick-tiny__<device>.json

The run is what `experiments/train.py --config=digits_<variant>_quick` does after parsing its
flags (`validate_config(config)`, `xla_cpu.set_xla_cpu_scheduler`,
`xla_gpu.set_xla_gpu_triton_gemm`, `train_and_evaluate(config, workdir)`), on the quick Digits
config shrunk as `tests/test_train.py`'s `tiny_config` shrinks it (small CNNs, a few dozen
synthetic images per participant, `--num-rounds` rounds; no real data directory, a temporary
workdir). While it runs, `ml_collections.ConfigDict.__getattr__`, `__getitem__` and `get` are
wrapped: each read records the first stack frame outside `ml_collections` (the function that
asked), as its module and qualified name (`frame.f_code.co_qualname`; a comprehension counts
as the function it is written in, a lambda or nested function as a function of its own). Reads of the config
building and shrinking before the run are not recorded.

A "stay" is a distinct function of the package (module `fedjax_het.*`) that reads the config, a
"room" a distinct module of the package holding one; the entry's own reads (`experiments/
train.py`'s `main`, here this script's `run_entry`) and frames of other libraries (absl's flag
code, the standard library) are listed apart. The record gives both counts, each function with
its read count and the fields it read, and the modules with their functions.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import tempfile
import threading
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import ml_collections  # noqa: E402

import timing  # noqa: E402  pylint: disable=g-bad-import-order

_WRAPPED = ("__getattr__", "__getitem__", "get")
# Python 3.11 runs a comprehension as a frame of its own (3.12 inlines it): its reads count as
# the enclosing function's.
_COMPREHENSIONS = (".<listcomp>", ".<genexpr>", ".<dictcomp>", ".<setcomp>")


def tiny_config(variant: str, num_rounds: int) -> ml_collections.ConfigDict:
  """`digits.get_config(f"{variant}_quick")` shrunk as tests/test_train.py's `tiny_config`."""
  from fedjax_het.configs import digits  # pylint: disable=g-import-not-at-top
  c = digits.get_config(f"{variant}_quick")
  c.models.architectures = ("simple_cnn", "fedavg_cifar_cnn", "simple_cnn", "fedavg_cifar_cnn")
  c.num_rounds = num_rounds
  c.local.epochs = 1
  c.local.batch_size = 16
  if "collaborative" in c:
    c.collaborative.batch_size = 32
  c.scenario.public_size = 64
  c.scenario.private_sizes.update({"mnist": 30, "usps": 20, "svhn": 40, "syn": 24})
  c.scenario.test_size = 30
  c.eval.batch_size = 30
  if variant == "fccl":
    c.fccl.pretrain_epochs = 1
  c.logging.progress = False
  c.logging.tensorboard = False
  c.logging.plots = False
  c.compilation_cache_dir = ""
  return c


class Recorder:
  """Wraps ConfigDict's readers; `reads[(module, qualname)]` counts reads, `fields[...]` the
  field names read (the key or attribute asked for). A reader that ConfigDict calls inside
  another (`get` -> `__getitem__`) is part of the outer read, not a second one."""

  def __init__(self):
    self.reads: collections.Counter = collections.Counter()
    self.fields: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    self._originals: dict[str, Any] = {}
    self._inside = threading.local()

  def _caller(self) -> tuple[str, str]:
    frame = sys._getframe(2)  # pylint: disable=protected-access (above the wrapper)
    while frame is not None:
      module = frame.f_globals.get("__name__", "")
      if not (module == "ml_collections" or module.startswith("ml_collections.")):
        qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        while qualname.endswith(_COMPREHENSIONS):  # part of the function it is written in
          qualname = qualname.rpartition(".")[0].removesuffix(".<locals>")
        return module, qualname
      frame = frame.f_back
    return "<none>", "<none>"

  def _wrap(self, name: str):
    original = getattr(ml_collections.ConfigDict, name)
    recorder = self

    def wrapper(config, key, *args, **kwargs):
      inside = recorder._inside  # pylint: disable=protected-access
      if getattr(inside, "active", False):
        return original(config, key, *args, **kwargs)
      caller = recorder._caller()  # pylint: disable=protected-access
      recorder.reads[caller] += 1
      if isinstance(key, str) and not key.startswith("_"):
        recorder.fields[caller].add(key)
      inside.active = True
      try:
        return original(config, key, *args, **kwargs)
      finally:
        inside.active = False

    wrapper.__name__ = name
    return original, wrapper

  def __enter__(self):
    for name in _WRAPPED:
      original, wrapper = self._wrap(name)
      self._originals[name] = original
      setattr(ml_collections.ConfigDict, name, wrapper)
    return self

  def __exit__(self, *exc):
    for name, original in self._originals.items():
      setattr(ml_collections.ConfigDict, name, original)
    return False


def run_entry(config: ml_collections.ConfigDict, workdir: str) -> None:
  """What experiments/train.py's `main` does with a parsed config (one process, no
  jax.distributed)."""
  from fedjax_het.config import validate_config  # pylint: disable=g-import-not-at-top
  from fedjax_het.runtime import xla_cpu, xla_gpu  # pylint: disable=g-import-not-at-top
  from fedjax_het.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  validate_config(config)
  xla_cpu.set_xla_cpu_scheduler(config.xla_cpu_scheduler)
  xla_gpu.set_xla_gpu_triton_gemm(config.xla_gpu_triton_gemm)
  train_and_evaluate(config, workdir)


def summarise(recorder: Recorder) -> dict[str, Any]:
  """The package's stays and rooms, the entry's and other libraries' readers apart."""
  package, others = {}, {}
  for (module, qualname), count in sorted(recorder.reads.items()):
    row = {"reads": count, "fields": sorted(recorder.fields[(module, qualname)])}
    key = f"{module}:{qualname}"
    if module == "fedjax_het" or module.startswith("fedjax_het."):
      package[key] = row
    else:
      others[key] = row
  rooms = collections.defaultdict(list)
  for key in package:
    module, _, qualname = key.partition(":")
    rooms[module].append(qualname)
  return {"functions": len(package), "modules": len(rooms),
          "reads": sum(row["reads"] for row in package.values()),
          "by_module": {module: sorted(names) for module, names in sorted(rooms.items())},
          "by_function": package, "outside_package": others}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variant", default="fcclplus",
                      help="the Digits quick variant: digits_<variant>_quick (default fcclplus)")
  parser.add_argument("--num-rounds", type=int, default=1)
  parser.add_argument("--out", default=None, help="the result JSON (default: print only)")
  args = parser.parse_args()
  os.environ.pop("FEDJAX_HET_DATA_DIR", None)  # synthetic data, as the tests' tiny runs
  config = tiny_config(args.variant, args.num_rounds)
  with tempfile.TemporaryDirectory(prefix="config_walk_") as tmp:
    os.environ["FEDJAX_HET_CACHE_DIR"] = str(pathlib.Path(tmp) / "data_cache")
    with Recorder() as recorder:
      run_entry(config, str(pathlib.Path(tmp) / "workdir"))
  walk = summarise(recorder)
  print(f"digits_{args.variant}_quick (tiny, {args.num_rounds} round(s)): "
        f"{walk['functions']} functions in {walk['modules']} modules of the package read the "
        f"config ({walk['reads']} reads); {len(walk['outside_package'])} readers outside it")
  for module, names in walk["by_module"].items():
    print(f"  {module}: {', '.join(names)}")
  if args.out:
    timing.write_result(args.out, {
        "benchmark": "config_walk", "command": ["benchmarks/config_walk.py", *sys.argv[1:]],
        "config": f"digits_{args.variant}_quick", "shrunk": "tests/test_train.py tiny_config",
        "num_rounds": args.num_rounds, "readers": list(_WRAPPED), **walk})


if __name__ == "__main__":
  main()

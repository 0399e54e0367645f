"""Imports a script of benchmarks/ for a test, as the script runs: with benchmarks/ on the
path while it executes, since the scripts import their neighbours (timing, first_round, ...),
and in `sys.modules` under its name, since dataclasses look their module up while it executes."""

import importlib.util
import pathlib
import sys
import types

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> types.ModuleType:
  """benchmarks/<name>.py as a module."""
  sys.path.insert(0, str(BENCHMARKS))
  try:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
  finally:
    sys.path.remove(str(BENCHMARKS))

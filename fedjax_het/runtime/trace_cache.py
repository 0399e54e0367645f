"""A run's traced and lowered round, kept on disk beside the compilation cache.

JAX's persistent compilation cache skips XLA's compile on a later run of the
same program, but its key is the lowered program, so every run still traces
and lowers the round first: about 22 s of Python for the quick heterogeneous
FCCL+ round on a 2-core CPU, and for the full one on an H200, every time.
This module keeps that work too. The first run exports the round
(`jax.export`: the same trace + lower) and writes the serialized program to
`<compilation_cache_dir>/fedjax_het_traces/<key>.jax_exported`; the next run
with the same key deserializes it (well under a second) and compiles it, which
the persistent cache then answers. Cold and warm runs compile the same
exported program, so they hit the same compilation-cache entry and compute
the same bits as `jax.jit` of the round itself.

The key is a SHA-256 over everything that decides the traced program:
  * the source of every module of the `fedjax_het` package, and of the modules
    that define the run's method and models when they live outside it;
  * the config, less the fields that never change the numbers
    (`workdir.NEUTRAL_FIELDS`: logging, names, cache and checkpoint settings)
    and those a round's program does not read (`NOT_IN_ROUND`: the number of
    rounds, an argument of the program, and the evaluation cadence); what the
    method's `make` reads besides it (the `Setup` but its `num_rounds`: data
    sizes, normalisation statistics, modules); the convolution implementations the
    `Experiment` chose; and the shapes, dtypes and tree structure of the
    round's arguments (state and data);
  * the versions of jax, jaxlib, flax, optax and numpy, the backend, the
    devices, and every `jax.config` value.
Code that the round runs but that is none of these (a helper module of your
own that your method or model imports) is not in the key: after editing such
code, run with `config.trace_cache="off"` or delete the folder. That is why
`"auto"` uses the cache only when the method and every model are the
library's own; `"on"` also uses it for methods and models defined elsewhere
(their defining modules are hashed).

Not used for runs sharded over a mesh (their programs carry shardings) or
without a compilation cache directory. When the round cannot be exported or
its metrics tree is not plain dicts, lists and tuples, the run traces as
usual and logs why.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import logging
import pathlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from fedjax_het import workdir as workdir_lib

#: Values of `config.trace_cache` (checked by `fedjax_het.config.validate_config`).
MODES = ("auto", "on", "off")

#: The folder, inside the compilation cache directory, that holds the exported rounds.
FOLDER = "fedjax_het_traces"
SUFFIX = ".jax_exported"
#: The fedjax_het package's folder (this module is in its `runtime` subpackage).
PACKAGE = pathlib.Path(__file__).resolve().parents[1]

#: Config fields a round's program does not depend on, left out of the key: `num_rounds` is an
#: argument of the program (`FederatedArrays.num_rounds`, read by the schedules through
#: `engine.optim.run_length`), `eval.every` decides when the trainer evaluates between calls.
NOT_IN_ROUND = ("num_rounds", "eval.every")

#: Bumped when what this module writes changes meaning.
FORMAT = "fedjax_het trace cache 1"

_VERSIONED = ("jax", "jaxlib", "flax", "optax", "numpy")


def outside_package(objects: Iterable[Any]) -> list[pathlib.Path]:
  """Source files of `objects` (functions, classes, instances) not in the fedjax_het package."""
  files = set()
  for obj in objects:
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) else type(obj)
    try:
      path = pathlib.Path(inspect.getfile(target)).resolve()
    except TypeError:  # built-in: nothing of the user's to hash
      continue
    if PACKAGE not in path.parents:
      files.add(path)
  return sorted(files)


def source_digest(extra_files: Sequence[pathlib.Path] = ()) -> str:
  """SHA-256 over the path and content of every .py file of the package and `extra_files`."""
  digest = hashlib.sha256()
  for path in sorted(PACKAGE.rglob("*.py")):
    digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
  for path in extra_files:
    digest.update(str(path).encode() + b"\0" + pathlib.Path(path).read_bytes() + b"\0")
  return digest.hexdigest()


def _versions() -> dict[str, str]:
  out = {}
  for name in _VERSIONED:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = ""
  return out


def round_key(*, config_json: str, choices: dict[str, str], args: Any,
              extra_files: Sequence[pathlib.Path] = ()) -> str:
  """The cache key of a round traced for `args` (see the module docstring)."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  avals = [(tuple(leaf.shape), str(leaf.dtype), bool(getattr(leaf, "weak_type", False)))
           for leaf in map(jax.typeof, leaves)]
  devices = [(d.platform, d.device_kind) for d in jax.devices()]
  settings = sorted((name, repr(value)) for name, value in jax.config.values.items())
  parts = {"format": FORMAT, "source": source_digest(extra_files), "config": config_json,
           "choices": choices, "tree": str(tree), "avals": avals,
           "backend": jax.default_backend(), "devices": devices,
           "process_count": jax.process_count(), "versions": _versions(),
           "jax_config": settings}
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def stage_key(key: str, stage: str) -> str:
  """The key of stage `stage` of the round whose key is `key` (one entry per stage program)."""
  return hashlib.sha256(f"{key}\0{stage}".encode()).hexdigest()


def tree_spec(tree: Any) -> Any:
  """A JSON description of a pytree made of dicts (string keys), lists, tuples and leaves.

  Raises TypeError for any other node (a NamedTuple, a dataclass, ...).
  """
  if isinstance(tree, dict):
    if not all(isinstance(k, str) for k in tree):
      raise TypeError(f"dict keys must be strings, got {list(tree)}")
    return {"dict": {k: tree_spec(v) for k, v in tree.items()}}
  if type(tree) in (list, tuple):
    return {type(tree).__name__: [tree_spec(v) for v in tree]}
  if tree is None:
    return {"none": None}
  if hasattr(tree, "shape") or isinstance(tree, (int, float, complex)):  # arrays, tracers, numbers
    return "leaf"
  raise TypeError(f"a {type(tree).__name__} node")


def tree_from_spec(spec: Any) -> Any:
  """The pytree `tree_spec` described, with None for every leaf (for `tree_structure`)."""
  if spec == "leaf":
    return 0
  (kind, value), = spec.items()
  if kind == "dict":
    return {k: tree_from_spec(v) for k, v in value.items()}
  if kind in ("list", "tuple"):
    items = [tree_from_spec(v) for v in value]
    return items if kind == "list" else tuple(items)
  return None


class CompiledRound:
  """A compiled exported round, called like the jitted one: `(state, data) -> (state, metrics)`.

  Other attributes (`memory_analysis`, `as_text`, ...) are those of the
  compiled executable.
  """

  def __init__(self, compiled: Any, in_tree: Any, out_tree: Any):
    self._compiled, self._in_tree, self._out_tree = compiled, in_tree, out_tree

  def __call__(self, *args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    if tree != self._in_tree:
      raise ValueError(f"the cached round was compiled for arguments of structure "
                       f"{self._in_tree}, got {tree}.")
    return jax.tree_util.tree_unflatten(self._out_tree, self._compiled(*leaves))

  def __getattr__(self, name):
    return getattr(self._compiled, name)


class LoweredRound:
  """The lowered exported round; `compile()` gives a `CompiledRound`. `hit`: read from disk.

  Other attributes (`as_text`, `cost_analysis`, ...) are those of the lowered program.
  """

  def __init__(self, lowered: Any, in_tree: Any, out_tree: Any, hit: bool):
    self._lowered, self._in_tree, self._out_tree, self.hit = lowered, in_tree, out_tree, hit

  def compile(self) -> CompiledRound:
    return CompiledRound(self._lowered.compile(), self._in_tree, self._out_tree)

  def __getattr__(self, name):
    return getattr(self._lowered, name)


def lower_round(fn: Callable[..., Any], args: tuple[Any, ...], *, directory: pathlib.Path,
                key: str, state_part: Callable[[Any], Any] | None = None) -> LoweredRound:
  """`fn(*args)`, a round `(state, data) -> (state, metrics)`, lowered through the cache.

  `state_part(state)`: for a program that returns part of the state (a group program of
  `programs.split_by_group`), that part of the input state, whose structure the returned one
  has; None: the whole state.

  A hit deserializes the program saved under `key`; a miss (or an unreadable
  entry) exports `fn` (tracing and lowering it), saves the program and its
  metrics tree, and lowers the same deserialized program, so both compile
  identical modules.
  Raises what `jax.export` raises for a round it cannot export, and TypeError
  for a metrics tree `tree_spec` cannot describe.
  """
  from jax import export  # pylint: disable=g-import-not-at-top
  leaves, in_tree = jax.tree_util.tree_flatten(args)
  state_tree = jax.tree_util.tree_structure(args[0] if state_part is None
                                            else state_part(args[0]))
  directory = pathlib.Path(directory)
  program, meta = directory / f"{key}{SUFFIX}", directory / f"{key}.json"
  exported = None
  if program.is_file() and meta.is_file():
    try:
      exported = export.deserialize(bytearray(program.read_bytes()))
      metrics_spec = json.loads(meta.read_text())["metrics"]
    except Exception as error:  # pylint: disable=broad-except
      logging.warning("trace cache: %s is unreadable (%s: %s); tracing the round again",
                      program, type(error).__name__, error)
      exported = None
  hit = exported is not None
  if not hit:
    captured = {}

    def flat(*flat_args):
      state, metrics = fn(*jax.tree_util.tree_unflatten(in_tree, flat_args))
      if jax.tree_util.tree_structure(state) != state_tree:
        raise TypeError("the round returns a state of another structure than it takes")
      captured["metrics"] = tree_spec(metrics)
      return jax.tree_util.tree_leaves((state, metrics))

    exported = export.export(jax.jit(flat))(*leaves)
    metrics_spec = captured["metrics"]
    directory.mkdir(parents=True, exist_ok=True)
    serialized = bytes(exported.serialize())
    # The program first: a kill between the two writes leaves no metadata, hence no hit.
    workdir_lib.write_atomic(program, serialized)
    workdir_lib.write_atomic(meta, json.dumps({"metrics": metrics_spec}) + "\n")
    exported = export.deserialize(bytearray(serialized))  # what a later hit reads
  metrics_tree = jax.tree_util.tree_structure(tree_from_spec(metrics_spec))
  out_tree = _pair_structure(state_tree, metrics_tree)
  lowered = jax.jit(exported.call).lower(*leaves)
  return LoweredRound(lowered, in_tree, out_tree, hit)


def _pair_structure(first: Any, second: Any) -> Any:
  """The tree structure of the tuple (a tree of structure `first`, one of structure `second`)."""
  pair = (jax.tree_util.tree_unflatten(first, [0] * first.num_leaves),
          jax.tree_util.tree_unflatten(second, [0] * second.num_leaves))
  return jax.tree_util.tree_structure(pair)

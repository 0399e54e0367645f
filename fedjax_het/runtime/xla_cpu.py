"""XLA:CPU's instruction scheduler: the setting that lets the paper-size rounds fit in memory.

XLA:CPU orders the instructions of a program with one of two schedulers. Its
default, the concurrency-optimised scheduler, keeps independent work in flight
so that the thunk runtime can run it on several threads; the other minimises
the peak of live buffers. For the full-width FCCL+ Digits round the choice
decides whether a run fits on a 24 GiB machine at all (XLA memory analysis,
whole round with im2col convolutions: about 42 GiB with the concurrency
scheduler, 19.9 GiB with the memory scheduler; with custom-VJP convolutions
9.55 GiB). The two orders compute the same values: one FCCL+ round with all
four backbones gave bitwise-identical parameters under both.

XLA reads the flag once, when the CPU backend starts; passing it per compile
(`compiler_options`) is accepted but has no effect. So the scheduler of a run
is fixed by `set_xla_cpu_scheduler` before JAX computes anything
(`experiments/train.py` calls it with `config.xla_cpu_scheduler`), or by
`XLA_FLAGS` in the environment.
"""

from __future__ import annotations

import os
import shlex

from fedjax_het.errors import ConfigError

#: The XLA flag; "false" selects the memory-minimising scheduler.
FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"

#: Values of `config.xla_cpu_scheduler`. "auto" is "memory" (see `resolve`).
SCHEDULERS = ("auto", "concurrency", "memory")


def resolve(choice: str) -> str:
  """"auto" -> "memory"; the others are themselves.

  "memory" is the default because it makes the paper-size configs fit on a
  24 GiB CPU machine and does not slow the quick configs down on a 2-core CPU
  (their round and compile times under both schedulers are in
  docs/performance.md).
  """
  if choice not in SCHEDULERS:
    raise ConfigError(f"config.xla_cpu_scheduler must be one of {SCHEDULERS}, got {choice!r}.")
  return "memory" if choice == "auto" else choice


def environment_flag(flag: str) -> str | None:
  """The value `XLA_FLAGS` gives `flag` ("" for a bare flag; the last setting wins, as in
  XLA), or None when `XLA_FLAGS` does not name it."""
  value = None
  for token in shlex.split(os.environ.get("XLA_FLAGS", "")):
    name, _, setting = token.partition("=")
    if name == flag:
      value = setting
  return value


def flag_in_environment() -> str | None:
  """The scheduler that `XLA_FLAGS` selects ("memory" / "concurrency"), or None if it is unset."""
  setting = environment_flag(FLAG)
  if setting is None:
    return None
  return "concurrency" if setting.lower() in ("", "true", "1") else "memory"


def backend_started() -> bool:
  """Whether JAX has started a backend (after which XLA no longer reads XLA_FLAGS)."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  started = getattr(xla_bridge, "backends_are_initialized", None)
  return bool(started()) if started is not None else False


def set_xla_cpu_scheduler(choice: str) -> str:
  """Selects XLA:CPU's scheduler for this process; returns the one in force.

  Must run before JAX computes anything. A scheduler already set in
  `XLA_FLAGS` by the user wins over `choice` (and is returned). If a backend
  has already started, nothing can change any more and the scheduler in force
  is returned: the one in `XLA_FLAGS`, else XLA's default ("concurrency").
  Raises `ConfigError` for a `choice` outside `SCHEDULERS`.
  """
  wanted = resolve(choice)
  in_environment = flag_in_environment()
  if in_environment is not None:
    return in_environment
  if backend_started():
    return "concurrency"
  setting = "false" if wanted == "memory" else "true"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FLAG}={setting}".strip()
  return wanted


def scheduler_in_force() -> str:
  """The scheduler this process's XLA:CPU uses (valid once its backend has started)."""
  return flag_in_environment() or "concurrency"

"""Trains a federated method from an ml_collections config (see fedjax_het/configs/).

  python experiments/train.py --config=digits_fcclplus_quick
  python experiments/train.py --config=fedjax_het/configs/digits.py:fccl --config.num_rounds=5

A mistake in the config, the data or the workdir prints one line saying what is
wrong and exits with status 1; `--verbose` (or FEDJAX_HET_TRACEBACK=1) shows the
traceback too.

Across processes (one per host, or several on one machine): start the same
command in every process with --num_processes=N, --process_id=0..N-1 and
--coordinator_address=<host of process 0>:<free port>; the clients mesh then
spans every process's devices (config.sharding.num_devices must be 0 or their
total) and only process 0 writes the workdir. On a CPU, --num_cpu_devices=D
gives each process D simulated devices. experiments/multiprocess_demo.py
starts N such processes on this machine:

  python experiments/train.py --config=digits_fcclplus_quick --config.sharding.num_devices=0 \
      --num_processes=2 --process_id=0 --coordinator_address=localhost:12355 --workdir=/tmp/mp &
  python experiments/train.py --config=digits_fcclplus_quick --config.sharding.num_devices=0 \
      --num_processes=2 --process_id=1 --coordinator_address=localhost:12355 --workdir=/tmp/mp

Ctrl-C or SIGTERM stops the command at any moment with one line and no traceback (status
130; docs/training.md, "The workdir", says what happens to a checkpoint write under way).
"""

import os
import signal
import sys

from fedjax_het import errors as errors_lib  # no JAX: in place before the slow imports

STOPPED_WHILE_STARTING = ("stopped while starting, before anything was written; rerun the "
                          "same command to start the run")


def _stopped_while_starting(kind, value, traceback) -> None:
  """`sys.excepthook` of the command: a stop signal outside `main`'s own handling (during the
  module's imports) ends the command with one line and status 130."""
  if issubclass(kind, KeyboardInterrupt) and not (errors_lib.wants_traceback()
                                                  or "--verbose" in sys.argv):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(STOPPED_WHILE_STARTING, file=sys.stderr, flush=True)
    os._exit(130)  # pylint: disable=protected-access (nothing to clean up yet)
  sys.__excepthook__(kind, value, traceback)


if __name__ == "__main__":
  # From here on a stop signal ends the command with one line, even during the imports.
  sys.excepthook = _stopped_while_starting
  sys.unraisablehook = errors_lib.unraisable_hook  # a stop a finalizer drops: no traceback
  signal.signal(signal.SIGINT, errors_lib.on_stop_signal)
  signal.signal(signal.SIGTERM, errors_lib.on_stop_signal)

import logging as std_logging  # noqa: E402 (after the signal handlers)
import pathlib  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def expand_config_name(argv: list[str]) -> list[str]:
  """--config=<scenario>_<variant> -> --config=fedjax_het/configs/<scenario>.py:<variant>
  (`fedjax_het.configs.resolve_name`); a config file path is left as it is."""
  from fedjax_het import configs as configs_lib  # pylint: disable=g-import-not-at-top (no JAX)
  from fedjax_het.errors import ConfigError  # pylint: disable=g-import-not-at-top
  out = []
  for arg in argv:
    name = arg.removeprefix("--config=")
    if name != arg and re.fullmatch(r"[A-Za-z0-9]+(?:_[A-Za-z0-9_]+)?", name):
      try:
        path, variant = configs_lib.resolve_name(name)
      except ConfigError as error:
        raise SystemExit(f"--config={name}: {error}") from None
      arg = f"--config={path}" + (f":{variant}" if variant else "")
    out.append(arg)
  return out


_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default: runs/<config name>).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0 in a multi-process run (every process "
    "passes the same one).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", 1, "Number of processes the run spans (1: no jax.distributed).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", 0, "This process's index in [0, num_processes); process 0 writes the workdir.")
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", 0, "Simulated CPU devices in this process (0: JAX's default); set before "
    "JAX starts.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of configuration, data and "
                             "workdir errors (also FEDJAX_HET_TRACEBACK=1).")

# Messages a normal run does not need: JAX probing for backends this machine lacks.
for _name in ("jax._src.xla_bridge", "jax._src.xla_bridge.backends"):
  std_logging.getLogger(_name).setLevel(std_logging.WARNING)


def main(argv):
  del argv
  workdir, config = None, None
  try:
    import jax  # pylint: disable=g-import-not-at-top
    from fedjax_het.engine import sharding  # pylint: disable=g-import-not-at-top
    from fedjax_het.runtime import xla_cpu, xla_gpu  # pylint: disable=g-import-not-at-top
    from fedjax_het.config import validate_config  # pylint: disable=g-import-not-at-top
    from fedjax_het.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
    try:
      config = _CONFIG.value
      config.name  # pylint: disable=pointless-statement (a config file that failed to load raises here)
    except (AttributeError, KeyError, TypeError, ValueError, OSError) as error:
      _flag_error(error)
    if _VERBOSE.value:  # the library's own filters (orbax's error lines) look at it too
      os.environ[errors_lib.TRACEBACK_ENV] = "1"
    workdir = _WORKDIR.value or str(REPO / "runs" / config.name)
    validate_config(config)  # a mistake in the config: one line before anything else is said
    logging.info("workdir: %s", workdir)
    # Before any JAX computation: the scheduler, the device count and the process group are
    # fixed when the backend starts.
    choice = config.xla_cpu_scheduler
    scheduler = xla_cpu.set_xla_cpu_scheduler(choice)
    triton_gemm = xla_gpu.set_xla_gpu_triton_gemm(config.xla_gpu_triton_gemm)
    sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                    num_cpu_devices=_NUM_CPU_DEVICES.value)
    if jax.default_backend() == "cpu":
      logging.info("XLA:CPU scheduler: %s (config.xla_cpu_scheduler=%r; XLA_FLAGS=%r)", scheduler,
                   choice, os.environ.get("XLA_FLAGS", ""))
    if jax.default_backend() == "gpu":
      logging.info("XLA:GPU Triton GEMM: %s (config.xla_gpu_triton_gemm=%r; XLA_FLAGS=%r)",
                   triton_gemm, config.xla_gpu_triton_gemm,
                   os.environ.get("XLA_FLAGS", ""))
    if config.scenario.name == "class_incremental" and _NUM_PROCESSES.value > 1:
      raise errors_lib.ConfigError("--num_processes must be 1 for config.scenario.name="
                                   "'class_incremental' (the task stream runs in one process).")
    # SIGTERM (a scheduler, `kill`) stops the run as Ctrl-C does; SIGINT stops it also where
    # the shell started the process with SIGINT ignored (a background job).
    signal.signal(signal.SIGTERM, errors_lib.on_stop_signal)
    signal.signal(signal.SIGINT, errors_lib.on_stop_signal)
    train_and_evaluate(config, workdir)
  except errors_lib.UserError as error:
    _ignore_stop_signals()
    if _verbose():
      raise
    print(f"error: {error}", file=sys.stderr)
    _finish(1)
  except KeyboardInterrupt as stop:
    _ignore_stop_signals()
    if _verbose():
      raise
    print(_stop_line(stop, workdir, config), file=sys.stderr)
    _finish(130, at_once=getattr(stop, "in_flight", False))
  except OSError as error:  # a full disk, a folder that cannot be written
    _ignore_stop_signals()
    if _verbose():
      raise
    print(f"error: {errors_lib.os_error_line(error)}", file=sys.stderr)
    _finish(1)
  # The run is finished and its results are written: a stop signal now changes nothing.
  _ignore_stop_signals()


def _ignore_stop_signals() -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _finish(code: int, *, at_once: bool = False) -> None:
  """Exits with `code` once the output is flushed; at once (`os._exit`) with `at_once` (a
  round still computing on the device: the runtime's shutdown would wait for it) or when a
  thread that would keep the process alive is left (a checkpoint write a second signal cut
  short, a compilation under way)."""
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  for handler in std_logging.getLogger().handlers + std_logging.getLogger("absl").handlers:
    handler.flush()
  if at_once or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                    if t is not threading.main_thread()):
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _checkpoint_round(workdir: str, config) -> int | None:
  """The newest round every run of the command holds a finished checkpoint of in `workdir`
  (each seed's `seed_<s>/` with config.seeds), or None."""
  seeds = tuple(config.seeds) if config is not None else ()
  common = None
  for folder in [pathlib.Path(workdir) / f"seed_{s}" for s in seeds] or [pathlib.Path(workdir)]:
    checkpoints = folder / "checkpoints"
    rounds = ({int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()}
              if checkpoints.is_dir() else set())
    common = rounds if common is None else common & rounds
  return max(common) if common else None


def _stop_line(stop: KeyboardInterrupt, workdir: str | None, config) -> str:
  """The one line a stop signal ends the command with: where the run stands, how to go on."""
  if workdir is None:
    return STOPPED_WHILE_STARTING
  if isinstance(stop, errors_lib.RunStopped):
    checkpoint = stop.checkpoint
    if stop.phase == "results":
      return (f"stopped after the last round ({stop.round}), while writing the results; rerun "
              "the same command to write them (it resumes from the checkpoint of round "
              f"{checkpoint} and trains nothing) in {workdir}")
    where = f"stopped at round {stop.round}" + (
        "" if stop.discarded is None else
        f"; the checkpoint write of round {stop.discarded} under way is discarded")
  else:
    checkpoint, where = _checkpoint_round(workdir, config), "stopped before training"
  goes_on = (f"resume from the checkpoint of round {checkpoint}" if checkpoint is not None else
             "start the run (no checkpoint was written)")
  return f"{where}; rerun the same command to {goes_on} in {workdir}"


def _verbose() -> bool:
  """--verbose (read from the command line while the flags are being parsed) or
  FEDJAX_HET_TRACEBACK=1."""
  from fedjax_het.errors import wants_traceback  # pylint: disable=g-import-not-at-top
  if wants_traceback():
    return True
  if flags.FLAGS.is_parsed():
    return _VERBOSE.value
  return "--verbose" in sys.argv or "--verbose=true" in sys.argv


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a mistake in a flag or a config override (a misspelt field, a
  value of the wrong type, a config file or variant that does not exist) as one line."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as error:
    _flag_error(error)


def _is_config_field(name: str) -> bool:
  """Whether `name` is a field of the base config (e.g. num_rounds, local.lr)."""
  from fedjax_het import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_het import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  return name in workdir_lib.flatten_config(config_lib.base_config("fedavg"))


def _flag_error(error: BaseException) -> None:
  """Prints a flag or config-file mistake as one line and exits 1 (re-raises when verbose)."""
  if _verbose():
    raise error
  # ml_collections raises AttributeError(KeyError(message)): a KeyError's text is its
  # argument's repr, the argument itself is the message.
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
  if "Traceback (most recent call last)" in text:  # keep the original error's own message
    text = re.split(r"\n\w*(?:Error|Exception): ", text)[-1]
  text = re.sub(r"\\n|\s+", " ", text).strip().replace("\\'", "'")
  # Quotes that enclose all of the text go (only those: "invalid literal for int() with base
  # 10: 'abc'" keeps its closing quote).
  while (len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
         and text[0] not in text[1:-1]):
    text = text[1:-1].strip()
  missing = re.search(r"No such file or directory: '([^']+)", text)
  if missing:
    text = f"--config: no config file {missing.group(1)!r}"
  unknown = re.search(r"Unknown command line flag '([\w.]+)'", text)
  if unknown and _is_config_field(unknown.group(1)):
    text = (f"unknown flag --{unknown.group(1)}; config fields take the --config. prefix: "
            f"--config.{unknown.group(1)}=...")
  print(f"error: {text} (run with --verbose for the traceback)", file=sys.stderr)
  sys.exit(1)


#: The flags that print the usage (absl exits with status 1 after printing it; asked for, the
#: usage is a success).
HELP_FLAGS = ("--help", "--helpshort", "--helpfull", "--helpxml")


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  try:
    app.run(main, argv=expand_config_name(sys.argv), flags_parser=parse_flags)
  except SystemExit as exited:
    if exited.code == 1 and any(a in HELP_FLAGS for a in sys.argv[1:]):
      sys.exit(0)
    raise
  except KeyboardInterrupt as stopped:  # before main: the flags, the config file
    _ignore_stop_signals()
    if _verbose():
      raise
    print(_stop_line(stopped, None, None), file=sys.stderr)
    _finish(130)

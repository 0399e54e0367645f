"""What a workdir records about its run, and the guard that keeps a resume from mixing runs.

A run's workdir holds `run.json`: every config field and a fingerprint of the
data (a SHA-256 over every array the run trains and evaluates on, with the
provenance of each domain). `train_and_evaluate` resumes from the workdir's
latest checkpoint only when the config and the data it would resume with are
those the run was started with, except for

  * `NEUTRAL_FIELDS`: fields that never change the numbers (output, logging,
    caching, how many checkpoints are kept, which rounds the results table
    averages, ...), which may change freely, and
  * the fields the user names in `config.resume_allow_changes` (comma-separated
    field names or section prefixes, e.g. "num_rounds" to extend a finished
    run). Such a change is the user's call: extending `num_rounds` also
    stretches the learning-rate decay of the rounds still to run, so the
    extended run is not the run a fresh start with the new `num_rounds` gives.

Otherwise `check_resume` raises `WorkdirError` before anything in the workdir
is written, listing every differing field (recorded -> now).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np

from fedjax_het.errors import WorkdirError

RUN_FILE = "run.json"
METADATA_FILE = "metadata.json"

#: Config fields (or section prefixes) that never change a run's numbers.
NEUTRAL_FIELDS = ("name", "logging", "overwrite", "compilation_cache_dir", "memory_check",
                  "on_nonfinite",
                  "checkpoint.keep",
                  "checkpoint.every", "eval.last_rounds", "eval.targets",
                  "eval.target_accuracy",  # the single target that eval.targets replaced
                  "scenario.data_dir", "resume_allow_changes",
                  "xla_cpu_scheduler",  # the two schedulers give bitwise-identical rounds
                  "trace_cache",  # a cached round is the same program, bit for bit
                  "round_programs",  # the same computations, one program or one per stage
                  "round_compile")  # the same programs, compiled in threads or in turn


#: Config fields added after runs were recorded without them, with the values under which such
#: a run is unchanged (None: any value, for fields read only by an option that did not exist
#: then). A record lacking one of these fields is not a difference when the current value is
#: one of them, so older workdirs still resume (and `experiments/new_client.py` restores them).
ADDED_FIELDS: dict[str, tuple[Any, ...] | None] = {
    "local.momentum": (0.0,),
    "seeds": ([],),                  # a seed's own workdir records seeds=()
    "models.compute_dtype": ("float32",),
    "local.lr_schedule": ("linear", "constant"),  # linear: FedAvg family; constant: cil
    "local.lr_decay_rate": None,     # read only by lr_schedule="exponential"
    "local.min_lr": None,            # read only by lr_schedule="exponential"
    "fedfusion.conv_init": ("torch",),
    "fedavg.augmentation": ("none",),
    "models.public_conv_impl": ("auto",),
    "fcclplus.dual_weight": None,    # the fcclplus.* fields below: read only by "dual"
    "fcclplus.dual_temperature": None,
    "fcclplus.pretrain_epochs": None,
    "fcclplus.pretrain_lr": None,
    "fcclplus.pretrain_min_lr": None,
    "fcclplus.fntd_teacher": ("previous_local",),
    # The fcclplus.ewc_* fields: read only by fcclplus.local_distillation="ewc".
    "fcclplus.ewc_weight": None,
    "fcclplus.ewc_labels": None,
    "fcclplus.ewc_batch_size": None,
    "models.dropout_rate": (0.0,),
    "fccl.pretrain_batch_size": (0,),  # 0: local.batch_size, the batch of the recorded runs
    "fccl.average_placement": ("after_local",),  # the placement of the recorded runs
    "fccl.init_keys": ("split",),  # the initial and pretraining keys of the recorded runs
    "scenario.class_order": ("seeded",),
    # GLFC's ablation switches and loss weights, at the values of the full method.
    "glfc.use_gradient_compensation": (True,),
    "glfc.use_relation_distillation": (True,),
    "glfc.gc_weight": (0.5,),
    "glfc.rd_weight": (0.5,),
    "glfc.first_task_gc_weight": (1.0,),
    # GLFC's proxy server: read only by glfc.old_model="proxy" (itself a recorded field).
    **{f"glfc.proxy.{name}": None for name in (
        "reconstruction_steps", "linesearch", "reconstruction_lr", "monitor_images",
        "perturbation_steps", "perturbation_lr", "noise_gamma", "perturbation_loss",
        "rebuild")},
    # GLFC's protocol switches (the paper's text), at the code's behaviour of the recorded runs.
    "scenario.client_roles": ("per_task",),
    "glfc.update_all_clients": (False,),
    "glfc.proxy.shuffle_gradients": (False,),
    # How the proxy computes its reconstructions, at the recorded runs' (the whole pool, stock
    # convolutions in the encoder).
    "glfc.proxy.reconstruction_chunk": (0,),
    "glfc.proxy.encoder_conv_impl": ("xla",),
    "icarl.classifier": ("nme",),    # iCaRL's classifier, that of the recorded runs
    "fedproto.classifier": ("prototype",),  # FedProto's / FedTGP's inference, the recorded one
    "fedtgp.classifier": ("prototype",),
    "lg_fedavg.classifier": ("global",),  # LG-FedAvg's / FedGH's inference, the recorded one
    "fedgh.classifier": ("global",),
    "fedkd.compression": ("none",),   # FedKD's SVD truncation: the recorded runs sent it whole
    "fedkd.energy_start": None,       # read only by fedkd.compression="svd"
    "fedkd.energy_end": None,
    # The class-incremental image side (0: the dataset's, CIFAR-100's 32) and ResNet stem ("auto":
    # the CIFAR stem at 32 px), the values of the recorded CIFAR-100 runs.
    "scenario.image_size": (0, 32),
    "models.stem": ("auto", "cifar"),
    # The FCCL+ code protocol's switches, at the library's behaviour of the recorded runs.
    "scenario.public_normalization": ("library",),
    "fcclplus.fccm_eps": (1e-6,),
    "fcclplus.feature_pass": ("shared",),
    "fccl.fccm_eps": (1e-6,),
    # Run-wide fields of the one config schema that the class-incremental records predate, at
    # the values those runs had: one device, top-1 accuracy, XLA:GPU's Triton GEMM switch left
    # at "auto" (experiments/train.py's default for a config without the field).
    "sharding.num_devices": (1,),
    "eval.top_k": (1,),
    "xla_gpu_triton_gemm": ("auto",),
    # Fields that never change the numbers (NEUTRAL_FIELDS) and that records written before
    # they existed lack: any value.
    **{name: None for name in (
        "overwrite", "on_nonfinite", "trace_cache", "round_programs", "round_compile",
        "eval.last_rounds", "eval.targets", "logging.writers", "logging.wandb_mode",
        "logging.mlflow_tracking_uri", "logging.diagnostic_rounds")},
}


def _added_unchanged(field: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
  """A field the record predates, at a value that leaves the recorded run unchanged."""
  if field in old or field not in new or field not in ADDED_FIELDS:
    return False
  values = ADDED_FIELDS[field]
  return values is None or new[field] in values


def flatten_config(config: ml_collections.ConfigDict | Mapping[str, Any],
                   prefix: str = "") -> dict[str, Any]:
  """{"local.batch_size": 256, ...}: every leaf field, JSON values (tuples as lists)."""
  flat = {}
  for key in sorted(config.keys()):
    value, name = config[key], f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, Mapping)):
      flat.update(flatten_config(value, f"{name}."))
    else:
      flat[name] = json.loads(json.dumps(value, default=str))
  return flat


def data_fingerprint(scenario: Any) -> str:
  """SHA-256 over the scenario's domains, labels, images (train, test, public) and class count."""
  digest = hashlib.sha256()

  def add(tag: str, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    digest.update(f"{tag}:{array.dtype}:{array.shape};".encode())
    digest.update(array.data)

  digest.update(f"{scenario.name}:{scenario.num_classes}:{list(scenario.domains)};".encode())
  for index, split in enumerate(scenario.train):
    add(f"train{index}/images", split.images)
    add(f"train{index}/labels", split.labels)
  for domain in sorted(scenario.test):
    add(f"test/{domain}/images", scenario.test[domain].images)
    add(f"test/{domain}/labels", scenario.test[domain].labels)
  add("public", scenario.public)
  return digest.hexdigest()


def run_record(config: ml_collections.ConfigDict, scenario: Any) -> dict[str, Any]:
  """The contents of `run.json` for `config` on `scenario`."""
  return {"config": flatten_config(config),
          "data": {"fingerprint": data_fingerprint(scenario),
                   "sources": dict(scenario.sources),
                   "substituted": list(scenario.substituted)}}


def allowed_changes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """NEUTRAL_FIELDS plus the names in `config.resume_allow_changes`."""
  named = [f.strip() for f in str(config.resume_allow_changes).split(",") if f.strip()]
  return NEUTRAL_FIELDS + tuple(named)


def covered(field: str, prefixes: tuple[str, ...]) -> bool:
  """Whether `field` is one of `prefixes` or inside a section named there."""
  return any(field == p or field.startswith(p + ".") for p in prefixes)


def _same_stand_in(field: str, old_data: Mapping[str, Any], new_data: Mapping[str, Any]) -> bool:
  """True for a changed `scenario.sources.<domain>` that gives the same synthetic stand-in on
  both sides (e.g. `tfds` and `real` on a machine with neither): the recorded data sources name
  the stand-in (`synthetic(seed=...`, same seed) for that domain in both runs. The stand-in
  depends on the domain and the seed only; the data fingerprints are compared as well."""
  prefix = "scenario.sources."
  if not field.startswith(prefix):
    return False
  domain = field[len(prefix):]
  stand_ins = [re.match(r"synthetic\(seed=\d+", str(data.get("sources", {}).get(domain, "")))
               for data in (old_data, new_data)]
  return all(stand_ins) and stand_ins[0].group(0) == stand_ins[1].group(0)


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any],
                allowed: tuple[str, ...]) -> list[str]:
  """Human-readable lines for every difference that changes results."""
  lines = []
  old, new = recorded.get("config", {}), current["config"]
  for field in sorted(set(old) | set(new)):
    if (covered(field, allowed) or _added_unchanged(field, old, new)
        or _same_stand_in(field, recorded.get("data", {}), current["data"])):
      continue
    missing = "<absent>"
    if old.get(field, missing) != new.get(field, missing):
      lines.append(f"config.{field}: {old.get(field, missing)!r} -> {new.get(field, missing)!r}")
  old_data, new_data = recorded.get("data", {}), current["data"]
  if old_data.get("fingerprint") != new_data["fingerprint"]:
    changed = sorted(d for d in set(old_data.get("sources", {})) | set(new_data["sources"])
                     if old_data.get("sources", {}).get(d) != new_data["sources"].get(d))
    detail = "; ".join(f"{d}: {old_data.get('sources', {}).get(d, '<absent>')} -> "
                       f"{new_data['sources'].get(d, '<absent>')}" for d in changed)
    lines.append("the data differ (fingerprint "
                 f"{str(old_data.get('fingerprint'))[:12]} -> {new_data['fingerprint'][:12]}"
                 + (f"; {detail}" if detail else "; same sources, different contents") + ")")
  return lines


LOCK_FILE = ".lock"


class WorkdirLock:
  """An exclusive OS lock on `<workdir>/.lock`, held while a run trains in the workdir.

  `fcntl.flock` on an open file: the kernel releases it when the holder exits or dies
  (kill -9 included), so no lock is ever stale. The file says who holds it (PID, host, start
  time); a second process that finds it held raises `WorkdirError` naming the holder before
  it touches anything else. Where `fcntl` is missing (Windows) the lock is a no-op.
  """

  def __init__(self, workdir: pathlib.Path):
    self.path = pathlib.Path(workdir) / LOCK_FILE
    self._file = None

  def __enter__(self) -> "WorkdirLock":
    try:
      import fcntl  # pylint: disable=g-import-not-at-top (POSIX only)
    except ImportError:
      return self
    self.path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(self.path, "a+")  # pylint: disable=consider-using-with
    try:
      fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      handle.seek(0)
      holder = handle.read().strip() or "another process"
      handle.close()
      raise WorkdirError(f"workdir {str(self.path.parent)!r} is in use by {holder}; wait for it "
                         "to finish (or stop it), or pass another --workdir.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"PID {os.getpid()} on {socket.gethostname()} since "
                 f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}\n")
    handle.flush()
    self._file = handle
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._file is not None:
      self._file.close()  # closing the file releases the lock
      self._file = None


def check_workdir(workdir: pathlib.Path) -> None:
  """Raises `WorkdirError` when `workdir` exists but is not a directory."""
  if workdir.exists() and not workdir.is_dir():
    raise WorkdirError(f"workdir {str(workdir)!r} exists and is not a directory; pass "
                       "--workdir=<a new or existing directory>.")


def checkpoint_identity(checkpointer: Any) -> tuple[dict[str, Any] | None, int | None]:
  """(the run identity the newest readable checkpoint holds, its round); (None, None) when the
  checkpoints hold none (written without a run record, or none can be read)."""
  for round_index in reversed(checkpointer.rounds()):
    try:
      document = checkpointer.run_record(round_index)
    except Exception:  # pylint: disable=broad-except (an unreadable checkpoint: try older)
      continue
    if document is None or "identity" not in document:
      return None, None
    return document["identity"], round_index
  return None, None


def check_resume(workdir: pathlib.Path, current: Mapping[str, Any],
                 allowed: tuple[str, ...], *, resume_round: int,
                 recorded: Mapping[str, Any] | None = None) -> None:
  """Raises `WorkdirError` if resuming `workdir` at `resume_round` would mix two runs.

  `recorded`: the run identity the checkpoint holds; None: the one `run.json` holds (the
  record of checkpoints written without one)."""
  if recorded is None:
    path = workdir / RUN_FILE
    if not path.exists():
      logging.warning("%s has checkpoints but no %s: cannot check "
                      "that the config and the data are those it was started with.", workdir,
                      RUN_FILE)
      return
    try:
      recorded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
      raise WorkdirError(f"{path} cannot be read ({type(error).__name__}: {error}) and the "
                         "checkpoints hold no run record to check the resume against; move "
                         "the workdir aside to start the run afresh.") from None
  lines = differences(recorded, current, allowed)
  if lines:
    listing = "\n  ".join(lines)
    raise WorkdirError(
        f"workdir {str(workdir)!r} holds a run (checkpoint of round {resume_round}) started "
        f"with a different config or data; resuming it would mix two runs:\n  {listing}\n"
        "Nothing was changed in the workdir. Start a new run with --workdir=<another "
        "directory>, or, for fields that are safe to change (e.g. num_rounds to extend a "
        "run), resume with --config.resume_allow_changes=<field>[,<field>...].")


def check_fresh(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
  """Raises `WorkdirError` when a fresh start would overwrite the results of a run whose
  checkpoints are gone (unless `config.overwrite`)."""
  if config.overwrite:
    return
  metrics = workdir / "metrics.jsonl"
  found = [name for name, present in (
      ("results.json", (workdir / "results.json").exists()),
      ("metrics.jsonl", metrics.exists() and metrics.stat().st_size > 0)) if present]
  if found:
    raise WorkdirError(f"workdir {str(workdir)!r} holds {' and '.join(found)} of a run but no "
                       "checkpoint to resume it from; pass --workdir=<a new directory>, or "
                       "--config.overwrite=True to train afresh and replace them.")


def open_run(workdir: pathlib.Path, config: ml_collections.ConfigDict, record: Mapping[str, Any],
             metadata: Mapping[str, Any], *, primary: bool = True,
             sync: Callable[[str], None] | None = None,
             before_write: Callable[[], None] | None = None,
             share: Callable[[str | None], str | None] | None = None,
             num_rounds: int | None = None) -> tuple[Any, int | None]:
  """Guards a resume, then writes the run's record files: (checkpointer, latest round or None).

  Nothing is written to `workdir` before the guards have passed: `config.overwrite` on a
  workdir with checkpoints is refused (it never replaces checkpoints), `check_resume`
  against the identity the newest readable checkpoint holds (or `run.json` for
  checkpoints without one), a latest checkpoint beyond `num_rounds` (the run's
  rounds now), and, for a fresh start, `check_fresh`; a refusal raises
  `WorkdirError` with the workdir untouched. Then
  run.json (`record`), config.json and metadata.json (`metadata`) are
  written. The checkpointer manages `workdir`/checkpoints with
  `config.checkpoint.keep`; the round is None for a fresh run.

  In a multi-process run every process calls this with the same arguments
  except `primary` (True in process 0 only, the one that writes the record
  files) and `sync` (a barrier across processes, called with a name): every
  process looks at the workdir and passes the resume guard before any of them
  writes, so all of them resume from the same round. `before_write` (process 0 only) is
  called once the guard has passed and before anything is written: the trainer takes the
  workdir's lock there, so a refused resume leaves the workdir untouched. `share` (a
  broadcast of process 0's refusal line, or None, to every process) makes every process
  of a multi-process run check process 0's lock: when another run holds the workdir,
  all of them raise the same `WorkdirError` at once.
  """
  from fedjax_het import checkpointing  # pylint: disable=g-import-not-at-top
  checkpoints = workdir / "checkpoints"
  keep = int(config.checkpoint.keep)
  resuming = checkpoints.is_dir()
  if sync is not None:
    sync("fedjax_het:open_run:looked")
  checkpointer = checkpointing.Checkpointer(checkpoints, keep=keep) if resuming else None
  start = checkpointer.latest_round() if checkpointer is not None else None
  if start is not None:
    if config.overwrite:
      raise WorkdirError(f"workdir {str(workdir)!r} holds the checkpoints of a run (the latest "
                         f"is round {start}); --config.overwrite=True replaces only the "
                         "results of a run whose checkpoints are gone, never checkpoints: "
                         "rerun without it to resume the run, or pass --workdir=<a new "
                         "directory> to train afresh.")
    recorded, _ = checkpoint_identity(checkpointer)
    check_resume(workdir, record, allowed_changes(config), resume_round=start,
                 recorded=recorded)
    if num_rounds is not None and start > num_rounds:
      raise WorkdirError(f"workdir {str(workdir)!r} holds a checkpoint of round {start}, beyond "
                         f"the {num_rounds} rounds of this config; a run cannot be shortened "
                         "(its records hold those rounds): pass the recorded num_rounds, or "
                         "--workdir=<a new directory>.")
  else:
    check_fresh(workdir, config)
  if sync is not None:
    sync("fedjax_het:open_run:checked")
  refusal = None
  if primary and before_write is not None:
    try:
      before_write()
    except WorkdirError as error:
      refusal = str(error)
  if share is not None:
    refusal = share(refusal)
  if refusal is not None:
    raise WorkdirError(refusal)
  if primary:
    workdir.mkdir(parents=True, exist_ok=True)
    write_run_record(workdir, record)
    write_atomic(workdir / "config.json", config.to_json_best_effort(indent=2) + "\n")
    write_metadata(workdir, metadata)
  if checkpointer is None:
    checkpointer = checkpointing.Checkpointer(checkpoints, keep=keep)
  return checkpointer, start


def write_metadata(workdir: pathlib.Path, metadata: Mapping[str, Any]) -> None:
  """Writes the run's metadata.json (data provenance, groups, convolutions, devices)."""
  write_atomic(pathlib.Path(workdir) / METADATA_FILE, json.dumps(metadata, indent=2) + "\n")


def read_metadata(workdir: pathlib.Path) -> dict[str, Any]:
  """The workdir's metadata.json, or {} when it is absent or unreadable."""
  try:
    return json.loads((pathlib.Path(workdir) / METADATA_FILE).read_text())
  except (OSError, ValueError):
    return {}


def write_atomic(path: pathlib.Path, content: str | bytes) -> None:
  """Writes `content` to `path` so that a kill at any instant leaves the old or the new file.

  (A temporary file in the same folder, then `os.replace`.) A write that fails (a full
  disk) or is interrupted removes its temporary file, and its `OSError` names `path`.
  """
  path = pathlib.Path(path)
  temporary = path.with_name(f".{path.name}.tmp")
  data = content.encode() if isinstance(content, str) else content
  try:
    with open(temporary, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException as error:
    try:
      os.unlink(temporary)
    except OSError:
      pass
    if isinstance(error, OSError) and error.filename is None:
      error.filename = str(path)
    raise


def savez_atomic(path: pathlib.Path, **arrays: np.ndarray) -> None:
  """`np.savez(path, **arrays)`, written atomically (see `write_atomic`)."""
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  write_atomic(path, buffer.getvalue())


def write_run_record(workdir: pathlib.Path, record: Mapping[str, Any]) -> None:
  write_atomic(workdir / RUN_FILE, json.dumps(record, indent=2) + "\n")

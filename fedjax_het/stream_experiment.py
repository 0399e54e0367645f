"""`StreamExperiment`: a class-incremental run built from its config, for the one trainer.

The run of GLFC's protocol [GLFC Sec. 5] on a fixed-shape task stream
(`fedjax_het.data.incremental`, `cil.stream`): the methods registered with
`class_incremental=True` (glfc, icarl_fl, fedavg_cil) are trained by
`fedjax_het.train.train_and_evaluate` like every other method; this class
gives that loop what differs from a domain scenario's `experiment.Experiment`:

  * the data: the stream's arrays on the device (`cil.stream.StreamArrays`),
    the test set, and the run record's fingerprint of both;
  * the rounds: num_tasks * rounds_per_task; round r trains task
    r // rounds_per_task, picked inside the jitted round (one compilation for
    the whole stream: the classifier has all C classes from the start, unseen
    classes are masked);
  * the records: train/loss (and the method's metrics), the round's task and
    sampled clients; evaluation after the last round of every task (and every
    `eval.every` rounds): eval/accuracy/seen, eval/accuracy/task_<j> and
    eval/predicted_unseen from the global model's (iCaRL: the NME
    classifier's) per-class counts on the whole test set, predictions
    restricted to the classes seen so far; at task ends the counts themselves
    (eval/class_correct, eval/class_total);
  * checkpoints at every task end (and every `checkpoint.every` rounds), so a
    run killed at a task boundary resumes from it;
  * results.md / results.json: GLFC Table 1's layout (accuracy on all seen
    classes after each task), its average and forgetting; accuracy.png:
    accuracy against the classes seen.

The run has no public set and one architecture; it runs in one process on one
device (no `sharding`).

References:
  [GLFC] J. Dong, L. Wang, Z. Fang, G. Sun, S. Xu, X. Wang, Q. Zhu. Federated
    Class-Incremental Learning. CVPR 2022.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_het import checkpointing, models
from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import get_method
from fedjax_het.cil import stream as cil_stream
from fedjax_het.config import validate_config
from fedjax_het.engine import rounds
from fedjax_het.runtime import compiler as compiler_lib
from fedjax_het.runtime import resources
from fedjax_het.errors import ConfigError
from fedjax_het.reports import class_incremental as cil_report


#: The stream datasets by name, as the synthetic-substitution note of results.md names them.
_DATASET_LABELS = {"cifar100": "CIFAR-100", "tiny_imagenet": "Tiny-ImageNet",
                   "imagenet_subset": "ImageNet-Subset"}


class StreamExperiment:
  """A class-incremental run: the stream, the method and what the trainer's loop asks of a run."""

  has_public = False
  accuracy_kinds = ("seen",)

  def __init__(self, config: ml_collections.ConfigDict, *, mesh: Any = None,
               conv_impl: str | None = None, public_conv_impl: str | None = None,
               scenario: Any = None):
    """`conv_impl` overrides `config.models.conv_impl`; `scenario` reuses a stream already
    built for `config` (else `cil.stream.build_stream(config)`)."""
    validate_config(config)
    if mesh is not None or jax.process_count() > 1:
      raise ConfigError("config.sharding / --num_processes: a class-incremental run "
                        f"(scenario.name={cil_stream.SCENARIO!r}) runs in one process on one "
                        "device.")
    self.config = config
    self.scenario = scenario if scenario is not None else cil_stream.build_stream(config)
    stream = self.scenario
    self.settings = cil_stream.StreamSettings.from_config(config, stream.num_classes)
    self.conv_impl = conv_impl or resources.resolve_conv_impl(config.models.conv_impl)
    self.public_conv_impl = public_conv_impl or self.conv_impl  # no public set
    self.mesh = None
    self.model = models.get_model(config.models.architectures[0], stream.num_classes,
                                  width=float(config.models.width), conv_impl=self.conv_impl,
                                  **cil_stream.model_kwargs(config))
    self.setup = cil_stream.StreamSetup(
        settings=self.settings, model=self.model, mean=stream.mean, std=stream.std,
        max_client_size=stream.max_client_size, client_classes=stream.client_classes,
        eval_batch_size=int(config.eval.batch_size),
        image_size=int(stream.images.shape[1]))
    self.algorithm = get_method(config.algorithm).make(config, self.setup)
    self.num_rounds = self.settings.num_tasks * self.settings.rounds_per_task
    self.client_names = [f"client_{i}" for i in range(stream.client_indices.shape[1])]
    self.data = jax.device_put(cil_stream.stream_arrays(stream))
    self.test = jax.device_put((stream.test_images, stream.test_labels))
    self._init = jax.jit(lambda key, d: rounds.initial_state(self.algorithm, key, d))
    # The round's program and its compile, as for every run (`runtime.compiler`): the trace
    # cache keyed on the config, the stream's setup (settings, model, sizes, class lists) and
    # the convolutions; the evaluation compiled beside it; the compiler's freed memory returned.
    self.compiler = compiler_lib.RoundCompiler(
        config, self.algorithm, self.data,
        statics={"setup": compiler_lib.statics_text(self.setup), "conv_impl": self.conv_impl},
        defined_by=[get_method(config.algorithm).make, self.model])
    self.run_rounds = self.compiler.run_rounds
    self.evaluate = jax.jit(self.algorithm.evaluate)
    self._evaluate_compiled = None

  # -- what the loop asks of a run -------------------------------------------------------------

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "StreamExperiment":
    """The same run (the same stream) with other convolutions (the trainer's memory policy)."""
    return StreamExperiment(self.config, conv_impl=conv_impl, public_conv_impl=public_conv_impl,
                            scenario=self.scenario)

  def run_record(self) -> dict[str, Any]:
    """run.json: every config field and a fingerprint of the stream (the resume guard)."""
    stream = self.scenario
    return {"config": workdir_lib.flatten_config(self.config),
            "data": {"fingerprint": cil_stream.stream_fingerprint(stream),
                     "sources": dict(stream.sources), "substituted": list(stream.substituted)}}

  def metadata(self) -> dict[str, Any]:
    stream = self.scenario
    return {"scenario": cil_stream.SCENARIO, "algorithm": self.config.algorithm,
            "sources": dict(stream.sources),
            "substituted_by_synthetic": list(stream.substituted),
            "num_tasks": stream.num_tasks, "classes_per_task": stream.classes_per_task,
            "class_names": list(stream.class_names),
            "clients_per_task": [int(n) for n in stream.num_clients],
            "max_client_size": stream.max_client_size, "pool_size": int(len(stream.labels)),
            "test_size": int(len(stream.test_labels)),
            "sequential_clients": self.settings.sequential,
            "conv_impl": self.conv_impl, "public_conv_impl": self.public_conv_impl,
            **resources.runtime_metadata()}

  def init_state(self) -> Any:
    return self._init(jax.random.key(int(self.config.seed)), self.data)

  def restore_state(self, checkpointer: checkpointing.Checkpointer, round_index: int) -> Any:
    """The state saved at `round_index`, placed as a fresh state is (same lowered program)."""
    like = jax.eval_shape(self.init_state)
    return jax.device_put(jax.device_get(checkpointer.restore(round_index, like)))

  def compile_all(self, state: Any, *, with_diagnostics: bool = True) -> Any:
    """Compiles the round and, beside it, the evaluation (`RoundCompiler.compile_all`: through
    the trace cache, then the compiler's freed memory handed back); returns the round."""
    del with_diagnostics  # no diagnostics
    return self.compiler.compile_all(state, lambda: self._compile_evaluation(state))

  def _compile_evaluation(self, state: Any) -> None:
    num_seen = jnp.int32(self.settings.classes_per_task)
    self._evaluate_compiled = self.evaluate.lower(state, (*self.test, num_seen)).compile()

  def compile_rounds(self, state: Any) -> Any:
    """The compiled round for this state's shapes (`RoundCompiler.compile_rounds`)."""
    return self.compiler.compile_rounds(state)

  def lower_rounds(self, state: Any) -> Any:
    """The round lowered for `state`'s shapes (`RoundCompiler.lower_rounds`)."""
    return self.compiler.lower_rounds(state)

  def train_records(self, metrics: Any, num_rounds: int) -> list[dict[str, Any]]:
    """Per-round records: task, train/loss, the sampled clients and the method's metrics."""
    metrics = jax.device_get(metrics)
    return [{"task": int(metrics["task"][r]),
             "train/loss": float(metrics["train/loss"][r]),
             "clients": [int(c) for c in metrics["clients"][r]],
             **{name: float(values[r]) for name, values in metrics.items()
                if name not in ("task", "train/loss", "clients")}}
            for r in range(num_rounds)]

  def task_end(self, done: int) -> bool:
    return done % self.settings.rounds_per_task == 0

  def is_eval_round(self, done: int) -> bool:
    every = int(self.config.eval.every)
    return self.task_end(done) or bool(every and done % every == 0)

  def is_checkpoint_round(self, done: int) -> bool:
    every = int(self.config.checkpoint.every)
    return self.task_end(done) or bool(every and done % every == 0)

  def evaluation_record(self, state: Any, done: int) -> dict[str, Any]:
    """eval/accuracy/seen, .../task_<j>, eval/predicted_unseen after round `done`; at a task
    end also the per-class counts eval/class_correct and eval/class_total."""
    evaluate = self._evaluate_compiled or self.evaluate
    return self.evaluation_from(evaluate(state, self.evaluation_input(done)), done)

  def evaluation_input(self, done: int) -> tuple[Any, Any, Any]:
    """(test images, test labels, classes seen after round `done`): `evaluate`'s input."""
    return (*self.test, jnp.int32((self._task(done) + 1) * self.settings.classes_per_task))

  def _task(self, done: int) -> int:
    return min((done - 1) // self.settings.rounds_per_task, self.settings.num_tasks - 1)

  def evaluation_from(self, counts: Any, done: int) -> dict[str, Any]:
    """The record of `evaluation_record` from the method's per-class counts."""
    k, task = self.settings.classes_per_task, self._task(done)
    correct, total, predicted = jax.device_get(counts)
    record = cil_stream.eval_record(correct, total, predicted, task, k)
    if self.task_end(done):
      record["eval/class_correct"] = [int(x) for x in correct]
      record["eval/class_total"] = [int(x) for x in total]
    return record

  def diagnostics(self, state: Any) -> None:
    """The task stream's methods draw no diagnostics (`algorithm.diagnostics` is None)."""
    del state

  def progress_text(self, last: dict[str, Any]) -> str:
    return (f"task {last['task']} acc(seen) {last['eval/accuracy/seen']:.1f}"
            if "eval/accuracy/seen" in last else f"task {last['task']}")

  def results(self, records: list[dict[str, Any]], done: int) -> tuple[str, dict[str, Any]]:
    """(results.md, results.json's numbers): GLFC Table 1's layout of this run."""
    config, stream, k = self.config, self.scenario, self.settings.classes_per_task
    table, numbers = cil_report.run_table(records, self.settings.num_tasks, k,
                                          cil_report.method_label(config))
    numbers["rounds_done"] = done
    transitions = {name.rpartition("/")[2]: int(sum(r.get(name, 0) for r in records))
                   for name in sorted({n for r in records for n in r
                                       if n.startswith("glfc/transitions/")})}
    if transitions:  # GLFC's entropy rule against the stream's true transitions
      numbers["transitions"] = transitions
    note = (f"\n\nSynthetic data substituted for: {', '.join(stream.substituted)} (see "
            f"metadata.json); the numbers say nothing about "
            f"{_DATASET_LABELS.get(stream.dataset, stream.dataset)}.\n"
            if stream.substituted else "\n")
    heading = (f"# {config.name}: accuracy (%) on all classes seen after each task "
               f"(GLFC Table 1 layout)\n\n")
    if done < self.num_rounds:
      heading += f"Stopped after round {done} of {self.num_rounds}; rerun to resume.\n\n"
    return heading + table + note, numbers

  def plot(self, records: list[dict[str, Any]], numbers: dict[str, Any],
           workdir: pathlib.Path, diagnostics: Any = None) -> None:
    """accuracy.png: accuracy on the seen classes against the classes seen."""
    del records, diagnostics
    if "seen_accuracy" not in numbers:
      return
    k = numbers["classes_per_task"]
    seen = [100 * a for a in numbers["seen_accuracy"]]
    x = [(i + 1) * k for i in range(len(seen))]
    cil_report.plot_seen_accuracy([(numbers["method"], x, [seen])], workdir / "accuracy.png",
                                  self.config.name)


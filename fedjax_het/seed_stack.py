"""Seeds as a vmapped axis: several seeds of one config trained as one program.

`config.seeds = (0, 1, 2)` asks `fedjax_het.train.train_and_evaluate` to train
the config once per seed, each seed a run of its own (its workdir
`<workdir>/seed_<s>/` holds what a run of `config.seed = s` alone holds:
run.json, metrics.jsonl, results, checkpoints), but through ONE compiled
program: every seed builds its data (`config.seed` picks the subsamples and
the synthetic images), the per-seed arrays are stacked along a new leading
axis, the state is initialised with `jax.vmap` over the seeds' keys and data,
and the round, the evaluation and the diagnostics are the method's own
functions under `jax.vmap`. One trace and one compile serve all seeds, and on
an accelerator the seeds share each kernel launch. The vmapped round compiles as
every run's does (`runtime.RoundCompiler`): through the trace cache, with the
evaluation and diagnostics compiled beside it.

A lane is one seed. `SingleRun` presents one experiment with the same
interface (its own programs, with stage programs, the trace cache, sharding
and the low-memory fallback); `SeedStack` presents several. The trainer's loop
reads either through: `lanes`, `data`, `init_state`, `lane_state`, `join`,
`compile_all`, `with_convs`, `train_records`, `evaluation_records`, `diagnostics`. The
memory policy of a single run applies to the stack too: a round that does not fit is
compiled again with leaner convolutions, then refused before training.

Deviations from a separate run of each seed:
  * the values agree to float32 rounding, not bit for bit: XLA:CPU compiles a
    batched convolution and a batched matrix product with other loop orders
    than their unbatched forms (`tests/test_seed_stack.py` gives the
    tolerance);
  * the round is one program (`config.round_programs` does not apply), and the
    seeds run in one process without a device mesh (`config.sharding.num_devices`
    must be 1);
  * the seeds must give the same shapes (same sizes and groups: the same
    config but for the seed); a config whose data sizes depend on the seed is
    refused, naming `config.seeds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het.engine import rounds
from fedjax_het.errors import ConfigError
from fedjax_het.runtime import compiler as compiler_lib


def seed_configs(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """One config per entry of `config.seeds`: `seed` set, `seeds` emptied (a single run's config,
  so a seed's workdir resumes as a run of that seed alone would)."""
  configs = []
  for seed in config.seeds:
    one = ml_collections.ConfigDict(config.to_dict())
    one.seed, one.seeds = int(seed), ()
    configs.append(one)
  return configs


class SingleRun:
  """One experiment as one lane, run by its own programs."""

  def __init__(self, experiment: Any):
    self.experiment = experiment

  @property
  def lanes(self) -> list[Any]:
    return [self.experiment]

  @property
  def data(self) -> Any:
    return self.experiment.data

  def init_state(self) -> Any:
    return self.experiment.init_state()

  def lane_state(self, state: Any, lane: int) -> Any:
    del lane
    return state

  def join(self, checkpointers: Sequence[Any], round_index: int) -> Any:
    return self.experiment.restore_state(checkpointers[0], round_index)

  def train_records(self, metrics: Any, num_rounds: int) -> list[list[dict[str, Any]]]:
    return [self.experiment.train_records(metrics, num_rounds)]

  def evaluation_records(self, state: Any, done: int) -> list[dict[str, Any]]:
    return [self.experiment.evaluation_record(state, done)]

  def diagnostics(self, state: Any) -> list[Any]:
    return [self.experiment.diagnostics(state)]

  def compile_all(self, state: Any, *, with_diagnostics: bool) -> Any:
    return self.experiment.compile_all(state, with_diagnostics=with_diagnostics)

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "SingleRun":
    return SingleRun(self.experiment.with_convs(conv_impl, public_conv_impl))


class SeedStack:
  """Several seeds' experiments (one per lane) trained as one vmapped program."""

  def __init__(self, experiments: Sequence[Any]):
    self.lanes = list(experiments)
    first = self.lanes[0]
    shapes = [jax.tree_util.tree_map(lambda x: (np.shape(x), x.dtype), e.data)
              for e in self.lanes]
    for experiment, shape in zip(self.lanes[1:], shapes[1:]):
      if shape != shapes[0] or repr(experiment.setup) != repr(first.setup):
        raise ConfigError(
            f"config.seeds: seed {experiment.config.seed} gives data of other shapes or sizes "
            f"than seed {first.config.seed}; seeds on one axis need the same shapes (train "
            "these seeds as separate runs).")
    self.algorithm = first.algorithm
    self.data = jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]),
                                       *[e.data for e in self.lanes])
    self._keys = jnp.stack([jax.random.key_data(jax.random.key(int(e.config.seed)))
                            for e in self.lanes])
    algorithm = self.algorithm
    init = lambda key_data, d: rounds.initial_state(  # noqa: E731
        algorithm, jax.random.wrap_key_data(key_data), d)
    self._init = jax.jit(jax.vmap(init))
    # The first lane's round under vmap, keyed in the trace cache on what its make() read (the
    # lanes' setups are equal) and the stacked shapes.
    self.compiler = compiler_lib.RoundCompiler(
        first.config, algorithm, self.data, statics=first.compiler.statics,
        defined_by=first.compiler.defined_by, lanes=len(self.lanes))
    self.run_rounds = self.compiler.run_rounds
    self._evaluate = jax.jit(jax.vmap(algorithm.evaluate))
    diagnostics = algorithm.diagnostics
    self._diagnostics = (jax.jit(jax.vmap(diagnostics.compute)) if diagnostics is not None
                         else None)
    self._evaluate_compiled = self._diagnostics_compiled = None  # set by `compile_all`

  @property
  def experiment(self) -> Any:
    """The first lane (what the loop reads that every lane shares: names, conv choices)."""
    return self.lanes[0]

  def init_state(self) -> Any:
    return self._init(self._keys, self.data)

  def lane_state(self, state: Any, lane: int) -> Any:
    return jax.tree_util.tree_map(lambda x: x[lane], state)

  def join(self, checkpointers: Sequence[Any], round_index: int) -> Any:
    """The lanes' checkpoints of `round_index`, stacked (placed as a fresh state is)."""
    like = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype),
                                  jax.eval_shape(self.init_state))
    states = [jax.device_get(c.restore(round_index, like)) for c in checkpointers]
    return jax.device_put(jax.tree_util.tree_map(lambda *xs: np.stack(xs), *states))

  def compile_all(self, state: Any, *, with_diagnostics: bool = False) -> Any:
    """The vmapped round, compiled (`RoundCompiler.compile_all`: through the trace cache, the
    evaluation and, `with_diagnostics`, the diagnostics compiled beside it and kept)."""
    return self.compiler.compile_all(
        state, lambda: self._compile_evaluation(state, with_diagnostics))

  def _compile_evaluation(self, state: Any, with_diagnostics: bool) -> None:
    # Any round's evaluation input: the stream's classes seen differ in value, not in shape.
    self._evaluate_compiled = self._evaluate.lower(state, self._evaluation_input(1)).compile()
    if with_diagnostics and self._diagnostics is not None:
      self._diagnostics_compiled = self._diagnostics.lower(state, self.data).compile()

  def with_convs(self, conv_impl: str, public_conv_impl: str) -> "SeedStack":
    """The same seeds (the same data) with other convolutions (the trainer's memory policy)."""
    return SeedStack([e.with_convs(conv_impl, public_conv_impl) for e in self.lanes])

  def train_records(self, metrics: Any, num_rounds: int) -> list[list[dict[str, Any]]]:
    metrics = jax.device_get(metrics)
    return [e.train_records(jax.tree_util.tree_map(lambda x, i=i: x[i], metrics), num_rounds)
            for i, e in enumerate(self.lanes)]

  def _evaluation_input(self, done: int) -> Any:
    if hasattr(self.lanes[0], "evaluation_input"):  # the task stream: classes seen so far
      return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]),
                                    *[e.evaluation_input(done) for e in self.lanes])
    return self.data.test

  def evaluation_records(self, state: Any, done: int) -> list[dict[str, Any]]:
    evaluate = self._evaluate_compiled or self._evaluate
    evaluations = jax.device_get(evaluate(state, self._evaluation_input(done)))
    return [e.evaluation_from(jax.tree_util.tree_map(lambda x, i=i: x[i], evaluations), done)
            for i, e in enumerate(self.lanes)]

  def diagnostics(self, state: Any) -> list[Any]:
    if self._diagnostics is None:
      return [None] * len(self.lanes)
    compute = self._diagnostics_compiled or self._diagnostics
    values = jax.device_get(compute(state, self.data))
    return [e.diagnostics_from(jax.tree_util.tree_map(lambda x, i=i: x[i], values))
            for i, e in enumerate(self.lanes)]

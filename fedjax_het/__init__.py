"""fedjax_het: heterogeneous federated learning research in JAX/Flax.

The layers, each importing only the ones above it:
  losses, models, data   pure losses; the model zoo; data sources, scenarios, partitions
  engine                 the blocks a round is built from (client groups, local scans, the
                         public phase, aggregation, optimisers, the round wrapper)
  algorithms, cil        one module per method (`make(config, setup) -> Algorithm`), the
                         shared modules they build on; class-incremental building blocks
  runtime                how a round compiles for every run: the round's programs, the trace
                         cache, the memory policy, XLA's options
  config, validation     the run-wide config and its checks, the methods' sections
  experiment, stream_experiment, seed_stack
                         a run built from its config (domain / partitioned, task stream,
                         several seeds as one program), each compiled by the runtime
  train                  train_and_evaluate: the one loop over a run (workdir, checkpointing,
                         evaluation, reporting, plots)
  grid, reports, studies the papers' tables as resumable cells (grid: which cells, their
                         configs, progress and cell.json provenance, training them alone,
                         as stacked seeds or in a child process under a deadline) and
                         their documents; what the papers measure from finished runs
docs/engine.md maps every module.
"""

__version__ = "0.1.0"

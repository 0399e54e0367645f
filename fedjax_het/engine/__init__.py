"""The engine: the blocks a method's round is built from, and the round wrapper.

  api          Setup, FederatedArrays, Algorithm, Stage, Diagnostics (the shared types)
  clients      ClientGroup, group_clients, GroupData, slot ids/activity, init, client_keys
  batching     static-shape masked batches of padded client data, public batches
  local        make_local_trainer / train_clients: epochs of training as one lax.scan
  public       public_phase: a scan of a step over augmented public batches
  cohort       sample_cohort, gather, scatter: partial participation with static shapes
  aggregation  weighted_mean, broadcast, server_update (an optax server optimiser)
  optim        torch-style optimisers (optax.inject_hyperparams), round schedules
  rounds       make_round_fn / make_run_rounds: one jitted program per call;
               staged_round / make_stage_fns: a round given as stages
  sharding     the `clients` mesh axis

How a run compiles those rounds (trace cache, programs per stage, memory policy, XLA's
options) is `fedjax_het.runtime`'s. The engine imports no algorithm: algorithms -> engine ->
models / losses / data.
"""

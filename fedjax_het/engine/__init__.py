"""The engine: architecture groups, batching, local-training scans, rounds, sharding.

  clients   ClientGroup, group_clients, GroupData, stack_group_data, client_keys
  batching  static-shape masked batches of padded client data, public batches
  local     make_local_trainer: epochs of minibatch training as one lax.scan
  optim     torch-style optimisers with a per-call learning rate, linear decay
  rounds    make_round_fn / make_run_rounds: one jitted function per round
  sharding  the `clients` mesh axis
"""

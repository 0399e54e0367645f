"""Reports: run records (results.json, metrics.jsonl, metadata.json) into tables and figures.

One module per scenario family, each used for a single run's results.md and for
the table over seeds:

  domain_shift       FCCL / FCCL+: inter- and intra-domain accuracy per participant, AVG,
                     Δ vs BASE
  partitioned        FedMMD / FedFusion: final accuracy, rounds and bytes to each target
  class_incremental  GLFC: accuracy after each task, Avg., forgetting

`common` holds what they share (mean ± sample std over seeds, formats, data
provenance, the per-round figure); `paper_numbers` the papers' published
numbers; `tables` the registry of table ids (paper, table, protocol, settings,
rows, configs); `document` a table's whole document from its results directory
and the docs/results.md blocks. Submodules are imported explicitly.
"""

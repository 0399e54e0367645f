"""The resumable grid of cells behind `experiments/reproduce.py` (and its three aliases).

A cell is one ordinary training run: a row (method or variant) of a table
(`fedjax_het.reports.tables`) in one of its settings, with one seed, at one
scale ("quick": the `_quick` configs; "paper": the paper-scale configs). Its
workdir is `results/<table>/<scale>/<cell>/`, cell = `<row>__seed<s>` (with
`<setting>__` in front when the table has several settings).

`runner.run(cells, ...)` builds every cell's config first (so a bad override fails
before anything trains), then for each cell in order:
  * skips it when it is finished: results.json exists, metrics.jsonl reaches
    the config's last round and run.json records the same config (a finished
    cell with another config stops the grid, naming the differing fields);
  * otherwise trains it with `training.train_cell`, which resumes an interrupted cell
    from its latest checkpoint (the trainers' own resume);
  * then rewrites the table's table.md / table.json / figures
    (`reports.document`) from what the results directory holds.
Beside each cell's own files it keeps `cell.json` (`provenance`): its status ("running",
"finished", "interrupted"; "killed" for an invocation whose process died without
recording its end, its seconds then those up to its last heartbeat), the wall time
spent on it over all invocations,
and the device kind, commit and --set overrides of the runs that trained it.
Each invocation appends what it did to `<results>/invocations.jsonl`.

With a deadline (`deadline_secs`), each cell trains in a child process
(`python -m fedjax_het.grid.child`); no cell starts with less than `min_cell_secs`
left, and the running one is stopped at the deadline (SIGTERM, then SIGKILL):
its checkpoints stay, it is recorded "interrupted", and the next invocation
resumes it. This is the GPU command's mode: the run never outlives its budget
and every finished cell's files are written as soon as it finishes
(`copy_to` mirrors them, and an interrupted cell's checkpoints, into another
directory).

The modules, each importing only the ones above it:
  cells         Cell, a table's or a queue's cells in training order (plan, queue_plan),
                where each lives
  arguments     --seeds / lists / --set overrides, the aliases' arguments, a runner's main
  cell_configs  a cell's config (cell_config), config files by name, expected_rounds
  progress      rounds done, finished (is_finished, cell_status), fresh, the summary line
  provenance    cell.json: code state (commit, patch), device, invocations and heartbeats
  training      one cell with its cell.json kept; a row's fresh seeds as one program
  twins         a finished cell another table holds, copied instead of retrained
  child         training in a child process stopped at a deadline
  runner        run (the grid), run_configs (given configs as an unregistered table),
                the tables' outputs
"""

"""The grid's cells: which cells a table (or a prepared queue) has, in which order, and
where each one lives.

A cell is one ordinary training run: a row (method or variant) of a table
(`fedjax_het.reports.tables`) in one of its settings, with one seed, at one
scale ("quick": the `_quick` configs; "paper": the paper-scale configs). Its
workdir is `results/<table>/<scale>/<cell>/`, cell = `<row>__seed<s>` (with
`<setting>__` in front when the table has several settings).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

from fedjax_het.errors import ConfigError
from fedjax_het.reports import tables as tables_lib

#: The repository (the checkout whose code trains the cells).
REPO = pathlib.Path(__file__).resolve().parents[2]
#: The results directory the repository ships.
DEFAULT_RESULTS = REPO / "results"


@dataclasses.dataclass(frozen=True)
class Cell:
  """One (table, setting, row, seed, scale) of the grid."""
  table: tables_lib.Table
  setting: tables_lib.Setting
  row: tables_lib.Row
  seed: int
  scale: str

  @property
  def name(self) -> str:
    return tables_lib.cell_name(self.table, self.setting, self.row, self.seed)

  @property
  def owner(self) -> str:
    """The table id whose directory holds the cell."""
    return tables_lib.cells_table_id(self.table, self.setting)

  @property
  def label(self) -> str:
    return f"{self.table.id}/{self.scale}/{self.name}"

  def directory(self, results_dir: pathlib.Path) -> pathlib.Path:
    return tables_lib.cell_dir(pathlib.Path(results_dir), self.table, self.setting, self.row,
                               self.seed, self.scale)


def plan(table: tables_lib.Table, scale: str, seeds: Sequence[int],
         rows: Sequence[str] | None = None, settings: Sequence[str] | None = None
         ) -> list[Cell]:
  """The table's cells in training order: seeds, then settings, then rows (a complete
  table for the first seed before the next seed's cells)."""
  if scale not in table.scales:
    raise ConfigError(f"--scale={scale!r} is not allowed for table {table.id}; allowed scales: "
                      f"{', '.join(table.scales)}.")
  known = [s.key for s in table.settings]
  unknown = [s for s in settings or () if s not in known]
  if unknown:
    raise ConfigError(f"--settings: unknown setting(s) {', '.join(map(repr, unknown))} of "
                      f"table {table.id}; allowed: {', '.join(known)}.")
  wanted = tables_lib.select_rows(table, rows)
  return [Cell(table, setting, row, int(seed), scale) for seed in seeds
          for setting in table.settings if not settings or setting.key in settings
          for row in setting.rows if row.key in wanted]


def queue_plan(name: str, scale: str, seeds: Sequence[int]) -> list[Cell]:
  """The cells of a prepared queue (`tables.QUEUES`): per seed, its tables in order."""
  if name not in tables_lib.QUEUES:
    raise ConfigError(f"--queue={name!r} is not allowed; allowed queues: "
                      f"{', '.join(tables_lib.QUEUES)}.")
  cells = []
  for seed in seeds:
    for table_id, rows in tables_lib.QUEUES[name]:
      table = tables_lib.get_table(table_id)
      for row in rows or table.row_keys:  # the queue's order of rows
        cells += plan(table, scale, [seed], [row])
  return cells

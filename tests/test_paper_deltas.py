"""The Δ vs BASE column's paper number: the Δ the paper prints (fedjax_het.reports.paper_numbers),
never one computed from its AVGs, and none where the paper prints none."""

import pytest

from fedjax_het.reports import domain_shift as ds
from fedjax_het.reports import paper_numbers as P
from fedjax_het.reports import tables


def _cells(setting, rows, shift=0.0):
  """Finished cells of `rows`: row i of the setting scores 10 i + domain j (+ 40 intra)."""
  domains = P.DOMAINS[setting.scenario]
  cells = {}
  for i, row in enumerate(r.key for r in setting.rows):
    if row not in rows:
      continue
    results = {}
    for kind, offset in (("inter", 0.0), ("intra", 40.0)):
      values = {d: 10.0 * i + offset + shift + j for j, d in enumerate(domains)}
      results[kind] = {**values, "AVG": sum(values.values()) / len(values)}
    cells[row] = {0: {"results": results}}
  return cells


def _delta_cells(text, kind):
  """{row label: its Δ vs BASE cell} of one kind's section of a rendered setting."""
  section = text.split(f"{ds.KIND_LABELS[kind]} (paper:")[1].split("\n\n", 2)[1]
  lines = [line for line in section.splitlines() if line.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  column = header.index("Δ vs BASE")
  out = {}
  for line in lines[2:]:
    cells = [c.strip() for c in line.strip("|").split("|")]
    out[cells[0]] = cells[column]
  return out


#: The four cells whose printed Δ is not the printed AVG minus BASE's: (table, setting, kind,
#: row, the printed Δ as rendered, the Δ the printed AVGs give).
SLIPS = (
    ("fcclplus_table15", "digits", "intra", "moon_tau1", "+1.35", "+0.35"),       # Table XV
    ("fcclplus_table10", "office31", "intra", "fcclplus", "+0.51", "+0.55"),      # Table X
    ("fcclplus_office_caltech", "office_caltech", "inter", "fccl", "-3.07", "-2.06"),  # VIII
    ("fcclplus_office_home", "office_home", "inter", "fccl", "+7.49", "+7.57"),   # VIII
)


@pytest.mark.parametrize("table_id, setting_key, kind, row, printed, from_avgs", SLIPS)
def test_the_delta_column_prints_the_papers_own_delta(table_id, setting_key, kind, row, printed,
                                                      from_avgs):
  table = tables.get_table(table_id)
  setting = table.setting(setting_key)
  label = next(r.label for r in setting.rows if r.key == row)
  index = [r.key for r in setting.rows].index(row)
  # Our Δ: row i's AVG minus BASE's (row 0) is 10 i, beside the paper's printed Δ.
  text, numbers = ds.render_setting(table, setting, _cells(setting, {"solo", row}),
                                    show_diff=False)
  cell = _delta_cells(text, kind)[label]
  assert cell == f"{10.0 * index:+.2f} (paper {printed})"
  assert from_avgs not in cell
  assert numbers["paper_delta"][kind][row] == float(printed)
  # A row with no finished cell shows the printed Δ alone; BASE shows "-".
  text, _ = ds.render_setting(table, setting, {}, show_diff=False)
  assert _delta_cells(text, kind)[label] == f"– (paper {printed})"
  assert _delta_cells(text, kind)[setting.rows[0].label] == "-"


def test_every_printed_delta_is_rendered_beside_ours():
  for table_id, deltas in (("fcclplus_digits", P.FCCLPLUS_TABLE8_9_DELTA),
                           ("fcclplus_office31", P.FCCLPLUS_TABLE8_9_DELTA),
                           ("fcclplus_office_caltech", P.FCCLPLUS_TABLE8_9_DELTA),
                           ("fcclplus_office_home", P.FCCLPLUS_TABLE8_9_DELTA),
                           ("fcclplus_table10", P.FCCLPLUS_TABLE10_DELTA),
                           ("fcclplus_table15", P.FCCLPLUS_TABLE15_DELTA)):
    table = tables.get_table(table_id)
    for setting in table.settings:
      text, numbers = ds.render_setting(
          table, setting, _cells(setting, {r.key for r in setting.rows}), show_diff=False)
      for kind in table.kinds:
        printed = deltas[kind][setting.scenario]
        assert setting.paper_delta[kind] == printed
        assert set(printed) == {r.key for r in setting.rows} - {table.base}
        shown = _delta_cells(text, kind)
        for index, row in enumerate(setting.rows):
          expected = ("-" if row.key == table.base else
                      f"{10.0 * index:+.2f} (paper {printed[row.key]:+.2f})")
          assert shown[row.label] == expected, (table_id, setting.key, kind, row.key)
      assert numbers["paper_delta"] == {k: dict(v) for k, v in setting.paper_delta.items()}


def test_a_table_without_printed_deltas_shows_ours_alone():
  # FCCL (CVPR 2022) Tables 1/2 and FCCL+ Table XII print no Δ; FCCL Table 3 prints no AVG.
  for table_id in ("fccl_tables1_2", "fcclplus_table12", "fccl_table3"):
    table = tables.get_table(table_id)
    assert table.base == "solo"
    for setting in table.settings:
      assert setting.paper_delta == {}
      for cells in (_cells(setting, {r.key for r in setting.rows}), {}):
        text, numbers = ds.render_setting(table, setting, cells, show_diff=False)
        assert "paper_delta" not in numbers
        for kind in table.kinds:
          shown = _delta_cells(text, kind)
          assert len(shown) == len(setting.rows)
          assert not any("(paper" in cell for cell in shown.values()), (table_id, shown)
          if cells:
            assert shown[setting.rows[1].label] == "+10.00"


def test_printed_deltas_belong_to_tables_with_a_delta_column():
  for table in tables.TABLES.values():
    for setting in table.settings:
      if not setting.paper_delta:
        continue
      assert table.family == "domain_shift" and table.base is not None, table.id
      assert set(setting.paper_delta) <= set(table.kinds), table.id
      for rows in setting.paper_delta.values():
        assert set(rows) <= {r.key for r in setting.rows} - {table.base}, table.id

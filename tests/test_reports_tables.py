"""The table registry (fedjax_het.reports.tables) and the transcribed paper numbers
(fedjax_het.reports.paper_numbers)."""

import numpy as np
import pytest

from fedjax_het import workdir as workdir_lib
from fedjax_het.algorithms import common
from fedjax_het.config import validate_config
from fedjax_het.errors import ConfigError
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import document
from fedjax_het.reports import paper_numbers as P
from fedjax_het.reports import tables


def test_the_issues_table_ids_are_registered():
  for table_id in ("fcclplus_digits", "fcclplus_office31", "fcclplus_office_caltech",
                   "fcclplus_office_home", "fcclplus_table15", "fcclplus_table10",
                   "fcclplus_table13", "fcclplus_table14", "fcclplus_table16",
                   "fcclplus_table17", "fcclplus_table11", "fcclplus_table12",
                   "fcclplus_table18", "fcclplus_table19", "fcclplus_figure7",
                   "fcclplus_figure9",
                   "fccl_tables1_2", "fccl_table3", "glfc_table1", "glfc_tasks5",
                   "glfc_tasks20", "fedfusion_table1", "fedfusion_table2"):
    table = tables.get_table(table_id)
    assert table.family in tables.FAMILIES and table.settings
  with pytest.raises(ConfigError, match=r"^--table='nope' is not allowed; allowed tables: "
                     r"fcclplus_digits, "):
    tables.get_table("nope")


def test_every_cell_builds_a_valid_config_at_each_of_its_tables_scales():
  for table in tables.TABLES.values():
    assert set(table.scales) <= set(tables.SCALES)
    # A paper table has its quick and paper scales; a diagnosis (not the paper's) one scale.
    assert {"quick", "paper"} <= set(table.scales) or (
        table.scales == ("mid",) and table.id in ("fcclplus_office31_width",
                                              "fcclplus_office31_base_width",
                                              "fcclplus_digits_real")) or (
        table.scales == ("quick",) and table.id in ("fcclplus_digits_fccl_teachers",
                                                    "fcclplus_digits_fccl_keys")), table.id
    for scale in table.scales:
      names = set()
      for cell in cells_lib.plan(table, scale, [0, 1]):
        config = cell_configs.cell_config(cell)
        validate_config(config)
        assert config.seed == cell.seed and config.name.endswith(f"_seed{cell.seed}")
        assert config.name.endswith(f"quick_seed{cell.seed}") == (scale == "quick")
        assert config.name.endswith(f"mid_seed{cell.seed}") == (scale == "mid")
        for field, value in dict(cell.row.fields(scale)).items():   # the last value wins
          node = config
          for part in field.split("."):
            node = node[part]
          assert node == value, (cell.label, field)
        names.add(cell.directory(cells_lib.DEFAULT_RESULTS))
      assert len(names) == len(cells_lib.plan(table, scale, [0, 1])), table.id


def test_the_fccl_rows_follow_their_papers_protocols():
  plus = cells_lib.plan(tables.get_table("fcclplus_digits"), "paper", [0], ["fccl"])[0]
  assert cell_configs.cell_config(plus).fccl.own_slot == "current"  # FCCL+'s benchmark FCCL
  conference = cells_lib.plan(tables.get_table("fccl_tables1_2"), "paper", [0], ["fccl"])[0]
  assert cell_configs.cell_config(conference).fccl.own_slot == "previous"  # the conference code
  homogeneous = cells_lib.plan(tables.get_table("fccl_table3"), "quick", [0])
  assert {tuple(cell_configs.cell_config(c).models.architectures) for c in homogeneous} == {
      ("resnet18",) * 4}
  ablation = {c.row.key: cell_configs.cell_config(c) for c in
              cells_lib.plan(tables.get_table("fcclplus_table10"), "quick", [0],
                             settings=["digits"])}
  assert ablation["fccm"].fcclplus.use_fisl is False
  assert ablation["fisl"].fcclplus.use_fccm is False
  assert {k: c.fcclplus.local_distillation for k, c in ablation.items() if k != "solo"} == {
      "fccm": "dual", "fisl": "dual", "fccm_fisl": "dual", "fcclplus": "fntd"}
  glfc = {c.row.key: cell_configs.cell_config(c) for c in
          cells_lib.plan(tables.get_table("glfc_tasks20"), "paper", [0])}
  assert {c.scenario.num_tasks for c in glfc.values()} == {20}
  assert glfc["glfc_no_proxy"].glfc.old_model == "previous_task_global"
  assert glfc["glfc"].glfc.old_model == "proxy"
  assert glfc["glfc_no_cgc"].glfc.use_gradient_compensation is False
  assert glfc["glfc_no_crd"].glfc.use_relation_distillation is False
  assert (glfc["ssil_fl"].algorithm, glfc["bic_fl"].algorithm) == ("ssil_fl", "bic_fl")


def _configs(table_id, scale, settings=None):
  return {c.row.key: cell_configs.cell_config(c)
          for c in cells_lib.plan(tables.get_table(table_id), scale, [0], settings=settings)}


def _differing_fields(a, b):
  """The dotted fields whose values differ between two flattened configs."""
  return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def _same_run(a, b):
  """Whether two configs train the same run (their flattened fields but the name agree)."""
  return _differing_fields(workdir_lib.flatten_config(a),
                           workdir_lib.flatten_config(b)) <= {"name"}


def test_fcclplus_tables_11_and_12_fccm_weight_and_tiny_imagenet_public_data():
  lambdas = {k: (c.fcclplus.use_fccm, c.fcclplus.use_fisl, c.fcclplus.local_distillation,
                 c.fcclplus.off_diagonal_weight)
             for k, c in _configs("fcclplus_table11", "quick").items()}
  assert lambdas == {key: (True, False, "dual", lam) for key, lam in (
      ("lambda0002", 0.002), ("lambda0051", 0.0051), ("lambda001", 0.01),
      ("lambda005", 0.05), ("lambda01", 0.1))}
  table11 = tables.get_table("fcclplus_table11")
  assert [s.key for s in table11.settings] == ["office31"]
  for scale in tables.SCALES:   # the default-lambda row is Table X's FCCM cell
    assert _same_run(_configs("fcclplus_table11", scale)["lambda0051"],
                     _configs("fcclplus_table10", scale, ["office31"])["fccm"])
  paper = table11.settings[0].paper
  assert [paper["inter"][k]["AVG"] for k in lambdas] == [33.09, 33.52, 32.89, 32.41, 32.51]
  assert [paper["intra"][k]["AVG"] for k in lambdas] == [77.54, 77.35, 77.60, 77.00, 77.53]
  table10 = P.FCCLPLUS_TABLE10
  assert (table10["inter"]["office31"]["fccm"][-1], table10["intra"]["office31"]["fccm"][-1]) \
      == (33.52, 77.35)
  table12 = _configs("fcclplus_table12", "paper")
  assert list(table12) == ["solo", "fedmd", "fedmatch", "rhfl", "fccl", "fcclplus"]  # no FedDF
  assert {k: c.scenario.public_name for k, c in table12.items() if k != "solo"} == dict.fromkeys(
      ["fedmd", "fedmatch", "rhfl", "fccl", "fcclplus"], "tinyimagenet")
  assert table12["fccl"].fccl.own_slot == "current"
  assert _same_run(table12["solo"], _configs("fcclplus_digits", "paper")["solo"])
  assert P.FCCLPLUS_TABLE12["inter"]["digits"]["solo"] == \
      P.FCCLPLUS_TABLE8_9["inter"]["digits"]["solo"]
  assert tables.get_table("fcclplus_table12").settings[0].paper["intra"]["fcclplus"] == {
      "mnist": 91.32, "usps": 84.70, "svhn": 87.41, "syn": 98.08, "AVG": 90.37}


def test_fcclplus_tables_18_and_19_backbones_and_local_epochs():
  table18 = _configs("fcclplus_table18", "quick")
  simple = ("resnet10", "resnet12", "efficientnet_b0", "simple_cnn")
  resnet18 = ("resnet18", "resnet12", "efficientnet_b0", "mobilenet_v2")
  assert {k: (c.algorithm, tuple(c.models.architectures)) for k, c in table18.items()} == {
      "fedmd_simplecnn": ("fedmd", simple), "fccl_simplecnn": ("fccl", simple),
      "fcclplus_simplecnn": ("fcclplus", simple), "fedmd_resnet18": ("fedmd", resnet18),
      "fccl_resnet18": ("fccl", resnet18), "fcclplus_resnet18": ("fcclplus", resnet18)}
  assert table18["fccl_resnet18"].fccl.own_slot == "current"
  assert {c.models.width for c in table18.values()} == {0.125}   # the quick configs' width
  assert tables.get_table("fcclplus_table18").settings[0].paper["inter"][
      "fcclplus_resnet18"]["AVG"] == 53.96
  for scale, epochs in (("paper", (10, 20, 30)), ("quick", (3, 5, 8))):
    table19 = _configs("fcclplus_table19", scale)
    assert {k: (c.fcclplus.local_distillation, c.local.epochs) for k, c in table19.items()} == {
        **{f"ce_epochs{e}": ("none", n) for e, n in zip((10, 20, 30), epochs)},
        **{f"fntd_epochs{e}": ("fntd", n) for e, n in zip((10, 20, 30), epochs)}}
    # The 20-epoch FNTD row is Tables VIII/IX's FCCL+ cell at both scales.
    assert _same_run(table19["fntd_epochs20"], _configs("fcclplus_digits", scale)["fcclplus"])
  assert P.FCCLPLUS_TABLE19["inter"]["digits"]["fntd_epochs20"] == \
      P.FCCLPLUS_TABLE8_9["inter"]["digits"]["fcclplus"]
  assert tables.get_table("fcclplus_table19").kinds == ("inter",)
  # A row's quick-only fields apply at quick scale only, after its other fields.
  row = tables.Row(key="r", label="r", variant="v", overrides=(("a", 1), ("b", 2)),
                   quick_overrides=(("b", 3),))
  assert (row.fields("paper"), row.fields("quick")) == ((("a", 1), ("b", 2)),
                                                         (("a", 1), ("b", 2), ("b", 3)))
  # The rendered table names each field once, with the value the scale's config has.
  setting = tables.get_table("fcclplus_table19").settings[0]
  assert document._variant_text(setting, setting.rows[0], "quick") == (
      "`digits.py:fcclplus_quick` with fcclplus.local_distillation='none', local.epochs=3")


def test_fcclplus_figures_7_and_9_public_sets_for_fccm_and_the_fntd_teacher():
  figure7 = _configs("fcclplus_figure7", "quick")
  assert {k: (c.fcclplus.use_fccm, c.fcclplus.use_fisl, c.fcclplus.local_distillation,
              c.scenario.public_name) for k, c in figure7.items()} == {
      "fccm_cifar100": (True, False, "dual", "cifar100"),
      "fccm_tinyimagenet": (True, False, "dual", "tinyimagenet"),
      "fccm_fmnist": (True, False, "dual", "fmnist")}
  figure9 = _configs("fcclplus_figure9", "quick")
  assert {k: c.fcclplus.fntd_teacher for k, c in figure9.items()} == {
      "after_collaborative": "after_collaborative", "fcclplus": "previous_local"}
  for scale in tables.SCALES:   # the rows shared with Tables X and VIII/IX are their cells
    assert _same_run(_configs("fcclplus_figure7", scale)["fccm_cifar100"],
                     _configs("fcclplus_table10", scale, ["digits"])["fccm"])
    assert _same_run(_configs("fcclplus_figure9", scale)["fcclplus"],
                     _configs("fcclplus_digits", scale)["fcclplus"])
  printed = tables.get_table("fcclplus_figure7").settings[0].paper["inter"]
  assert {k: v["AVG"] for k, v in printed.items()} == {
      "fccm_cifar100": 33.51, "fccm_tinyimagenet": 35.70, "fccm_fmnist": 36.82}
  assert P.FCCLPLUS_TABLE10["inter"]["digits"]["fccm"][-1] == 33.51
  assert P.FCCLPLUS_FIGURE9["intra"]["digits"]["fcclplus"] == \
      P.FCCLPLUS_TABLE8_9["intra"]["digits"]["fcclplus"]


def test_table16_ewc_rows_and_the_fml_and_rcfl_rows_of_fccl_tables_1_to_3():
  table16 = tables.get_table("fcclplus_table16")
  assert [s.key for s in table16.settings] == ["digits", "office31"]
  cells = {c.row.key: cell_configs.cell_config(c) for c in
           cells_lib.plan(table16, "quick", [0], settings=["office31"])}
  assert {k: (c.fcclplus.local_distillation, c.fcclplus.ewc_weight) for k, c in cells.items()
          if k != "fcclplus"} == {"ewc_001": ("ewc", 0.01), "ewc_01": ("ewc", 0.1),
                                  "ewc_07": ("ewc", 0.7), "ewc_1": ("ewc", 1.0)}
  assert cells["fcclplus"].fcclplus.local_distillation == "fntd"
  printed = {s.key: [s.paper["inter"][r.key]["AVG"] for r in s.rows] for s in table16.settings}
  assert printed == {"digits": [50.49, 28.50, 28.38, 29.08, 28.70],
                     "office31": [37.21, 29.58, 28.59, 29.04, 29.18]}  # FCCL+ Table XVI
  assert P.domain_row(P.FCCLPLUS_TABLE16, "inter", "digits", "ewc_1") == {"AVG": 28.70}
  # FML and RCFL sit after FedMD as in the paper, with their printed numbers (FCCL Tables 1-3).
  conference = tables.get_table("fccl_tables1_2")
  assert [r.key for r in conference.settings[0].rows] == [
      "solo", "fedmd", "fml", "rcfl", "feddf", "fedmatch", "fccl"]
  assert conference.setting("digits").paper["inter"]["fml"]["AVG"] == 31.14
  assert conference.setting("office_home").paper["intra"]["fml"]["real_world"] == 65.07
  assert conference.setting("digits").paper["inter"]["rcfl"]["AVG"] == 28.28
  assert conference.setting("digits").paper["intra"]["rcfl"]["syn"] == 91.40
  assert conference.setting("office_home").paper["inter"]["rcfl"]["art"] == 15.16
  homogeneous = tables.get_table("fccl_table3")
  assert homogeneous.settings[0].paper["inter"]["fml"]["art"] == 39.56
  assert homogeneous.settings[0].paper["intra"]["rcfl"]["real_world"] == 58.58
  for method in ("fml", "rcfl"):
    [cell] = cells_lib.plan(homogeneous, "quick", [0], [method])
    assert cell_configs.cell_config(cell).algorithm == method
    assert tuple(cell_configs.cell_config(cell).models.architectures) == ("resnet18",) * 4


def test_a_shared_setting_has_the_same_rows_and_cells():
  one = tables.get_table("fedfusion_table1").setting("mnist_permuted")
  two = tables.get_table("fedfusion_table2").setting("mnist_permuted")
  assert one.cells_of == "fedfusion_table2"
  assert [(r.key, r.variant, r.quick_variant, r.overrides) for r in one.rows] == [
      (r.key, r.variant, r.quick_variant, r.overrides) for r in two.rows]
  for a, b in zip(cells_lib.plan(tables.get_table("fedfusion_table1"), "quick", [0],
                            settings=["mnist_permuted"]),
                  cells_lib.plan(tables.get_table("fedfusion_table2"), "quick", [0])):
    assert a.directory(cells_lib.DEFAULT_RESULTS) == b.directory(cells_lib.DEFAULT_RESULTS)
    assert a.directory(cells_lib.DEFAULT_RESULTS).parts[-3:] == (
        "fedfusion_table2", "quick", f"{b.row.key}__seed0")


def test_paper_rows_are_rows_of_their_setting():
  for table in tables.TABLES.values():
    for setting in table.settings:
      keys = {r.key for r in setting.rows}
      if table.family == "domain_shift":
        for kind, rows in setting.paper.items():
          assert kind in table.kinds and set(rows) <= keys, (table.id, setting.key)
          for values in rows.values():
            assert set(values) <= set(P.DOMAINS[setting.scenario]) | {"AVG"}
      elif table.family == "class_incremental":
        assert set(setting.paper) <= keys
  assert tables.get_table("glfc_tasks5").settings[0].paper == {}
  assert set(tables.get_table("glfc_table1").settings[0].paper) == {
      "icarl_fl", "bic_fl", "podnet_fl", "dde_icarl_fl", "geodl_icarl_fl", "ssil_fl",
      "glfc_no_cgc", "glfc_no_crd", "glfc_no_proxy", "glfc"}


def test_fcclplus_conference_rows_equal_fccl_tables_1_and_2_digit_for_digit():
  for scenario in tables.CONFERENCE_SCENARIOS:
    for row in tables.CONFERENCE_ROWS:
      assert P.FCCLPLUS_TABLE8_9["inter"][scenario][row] == P.FCCL_TABLE1_2["inter"][scenario][row]
      assert P.FCCLPLUS_TABLE8_9["intra"][scenario][row][:-1] == (
          P.FCCL_TABLE1_2["intra"][scenario][row])  # Table 2 prints no AVG
  # RHFL and FCCL+ are FCCL+'s own rows; the Office31 / Office-Caltech rows are not FCCL's.
  assert "rhfl" not in P.FCCL_TABLE1_2["inter"]["digits"]
  digits = tables.get_table("fcclplus_digits").settings[0]
  assert {r.key for r in digits.rows if r.source} == set(tables.CONFERENCE_ROWS)
  assert not any(r.source for r in tables.get_table("fcclplus_office31").settings[0].rows)


#: Printed AVGs more than 0.01 from their row's mean (the paper's slips, kept as printed).
AVG_SLIPS = {
    ("FCCLPLUS_TABLE8_9", "intra", "digits", "feddf"),
    ("FCCLPLUS_TABLE8_9", "intra", "digits", "fedmatch"),
    ("FCCLPLUS_TABLE8_9", "intra", "digits", "fccl"),
    ("FCCLPLUS_TABLE8_9", "inter", "office31", "feddf"),
    ("FCCLPLUS_TABLE10", "inter", "digits", "solo"),
    ("FCCLPLUS_TABLE10", "intra", "digits", "fccm"),
    ("FCCLPLUS_TABLE15", "inter", "office31", "fcclplus"),
}


def test_transcribed_domain_tables_agree_with_their_averages():
  for name in ("FCCLPLUS_TABLE8_9", "FCCLPLUS_TABLE10", "FCCLPLUS_TABLE12", "FCCLPLUS_TABLE13",
               "FCCLPLUS_TABLE14", "FCCLPLUS_TABLE15", "FCCLPLUS_TABLE17", "FCCLPLUS_TABLE18",
               "FCCLPLUS_TABLE19", "FCCLPLUS_FIGURE9", "FCCL_TABLE1_2", "FCCL_TABLE3"):
    for kind, scenarios in getattr(P, name).items():
      for scenario, rows in scenarios.items():
        n = len(P.DOMAINS[scenario])
        for row, values in rows.items():
          assert len(values) in (n, n + 1), (name, kind, scenario, row)
          if len(values) == n + 1:
            gap = abs(np.mean(values[:n]) - values[n])
            assert (gap > 0.011) == ((name, kind, scenario, row) in AVG_SLIPS), (
                name, kind, scenario, row, gap)
  assert P.domain_row(P.FCCLPLUS_TABLE8_9, "inter", "digits", "fcclplus") == {
      "mnist": 40.13, "usps": 50.53, "svhn": 48.31, "syn": 63.00, "AVG": 50.49}
  assert P.domain_row(P.FCCL_TABLE1_2, "intra", "digits", "solo") == {
      "mnist": 70.20, "usps": 74.19, "svhn": 74.57, "syn": 73.60}
  assert P.domain_row(P.FCCLPLUS_TABLE8_9, "inter", "digits", "fedavg") == {}


#: Printed Δs that are not their table's printed AVG minus its BASE AVG (the paper's slips, kept
#: as printed; paper_numbers' comments and the tables' notes name each): (delta table, kind,
#: scenario, row).
DELTA_SLIPS = {
    ("FCCLPLUS_TABLE8_9_DELTA", "inter", "office_caltech", "fccl"),   # -3.07, AVGs give -2.06
    ("FCCLPLUS_TABLE8_9_DELTA", "inter", "office_home", "fccl"),      # +7.49, AVGs give +7.57
    ("FCCLPLUS_TABLE10_DELTA", "intra", "office31", "fcclplus"),      # +0.51, AVGs give +0.55
    ("FCCLPLUS_TABLE15_DELTA", "intra", "digits", "moon_tau1"),       # +1.35, AVGs give +0.35
}
#: Every transcribed Δ column and the table of AVGs it belongs to.
DELTA_TABLES = (("FCCLPLUS_TABLE8_9_DELTA", "FCCLPLUS_TABLE8_9"),
                ("FCCLPLUS_TABLE10_DELTA", "FCCLPLUS_TABLE10"),
                ("FCCLPLUS_TABLE15_DELTA", "FCCLPLUS_TABLE15"))


def test_printed_deltas_are_avg_minus_base_except_the_noted_slips():
  """Every stored printed Δ is within 0.006 of its printed AVG minus BASE's, but the slips: a
  transcription typo in a Δ (or in an AVG) fails here."""
  checked = set()
  for delta_name, table_name in DELTA_TABLES:
    deltas, table = getattr(P, delta_name), getattr(P, table_name)
    assert set(deltas) == set(table)
    for kind, scenarios in deltas.items():
      assert set(scenarios) == set(table[kind])
      for scenario, rows in scenarios.items():
        avgs = {row: values[-1] for row, values in table[kind][scenario].items()}
        assert set(rows) == set(avgs) - {"solo"}, (delta_name, kind, scenario)
        for row, printed in rows.items():
          computed = avgs[row] - avgs["solo"]
          slip = (delta_name, kind, scenario, row) in DELTA_SLIPS
          assert (abs(printed - computed) > 0.006) == slip, (
              delta_name, kind, scenario, row, printed, computed)
          checked.add((delta_name, kind, scenario, row))
  assert DELTA_SLIPS <= checked
  assert len(checked) == 8 * 6 + 4 * 4 + 4 * 10
  # The four slips as printed (FCCL+ Tables VIII, X and XV).
  assert P.FCCLPLUS_TABLE8_9_DELTA["inter"]["office_caltech"]["fccl"] == -3.07
  assert P.FCCLPLUS_TABLE8_9_DELTA["inter"]["office_home"]["fccl"] == 7.49
  assert P.FCCLPLUS_TABLE10_DELTA["intra"]["office31"]["fcclplus"] == 0.51
  assert P.FCCLPLUS_TABLE15_DELTA["intra"]["digits"]["moon_tau1"] == 1.35


def test_glfc_and_two_stream_numbers_agree_with_their_own_summaries():
  for row, printed in P.GLFC_TABLE1.items():
    assert len(printed["seen"]) == 10
    agrees = round(float(np.mean(printed["seen"])), 1) == printed["avg"]
    assert agrees != (row in P.GLFC_AVG_SLIPS), row
  for (dataset, setting), paper in P.TWO_STREAM.items():
    assert set(paper.get("final", {})) <= set(tables.TWO_STREAM_METHODS)
    for key, printed in paper.get("reduction", {}).items():
      rounds = paper["rounds"][key]
      for method, percent in printed.items():
        computed = 100 * (1 - rounds[method] / rounds["fedavg"])
        if (dataset, setting, method) == ("mnist", "shards", "fedmmd"):
          assert computed == pytest.approx(43.75)  # printed 23.4%: documented in the notes
          assert any("43.8%" in note for note in paper["notes"])
        else:
          assert computed == pytest.approx(percent, abs=0.05), (dataset, setting, key, method)
  assert P.TWO_STREAM[("mnist", "permuted")]["final"]["fedfusion_conv"] == 95.79
  assert P.TWO_STREAM[("cifar10", "iid")]["final"]["fedavg"] == 80.01


def test_rows_and_settings_are_selected_by_name():
  table = tables.get_table("fcclplus_table15")
  assert tables.select_rows(table, ["fcclplus", "solo"]) == ["solo", "fcclplus"]
  with pytest.raises(ConfigError, match=r"--methods: unknown row\(s\) 'moon' of table "
                     r"fcclplus_table15; allowed: solo, fedavg, "):
    tables.select_rows(table, ["moon"])
  cells = cells_lib.plan(table, "quick", [1, 0], ["fedavg"], ["office31"])
  assert [c.label for c in cells] == ["fcclplus_table15/quick/office31__fedavg__seed1",
                                      "fcclplus_table15/quick/office31__fedavg__seed0"]
  with pytest.raises(ConfigError, match="--settings: unknown setting"):
    cells_lib.plan(table, "quick", [0], settings=["home"])
  with pytest.raises(ConfigError, match="--scale='full' is not allowed for table "
                     "fcclplus_table15; allowed scales: quick, mid, paper"):
    cells_lib.plan(table, "full", [0])
  with pytest.raises(ConfigError, match="--scale='mid' is not allowed for table "
                     "fedmmd_cifar10_binary; allowed scales: quick, paper"):
    cells_lib.plan(tables.get_table("fedmmd_cifar10_binary"), "mid", [0])
  assert tables.two_stream_variant("fedfusion_conv", "permuted", quick=True) == \
      "fedfusion_permuted_conv_quick"
  assert tables.two_stream_variant("fedavg", "shards") == "fedavg_shards"


def test_the_fedmmd_tables_no_dropout_and_trunk_rows_differ_from_their_pairs_alone():
  for table_id in ("fedmmd_cifar10_binary", "fedmmd_mnist_shards"):
    table = tables.get_table(table_id)
    assert [r.key for r in table.settings[0].rows] == [
        "fedavg", "fedmmd", "fedmmd_l2", "fedavg_nodropout", "fedmmd_nodropout",
        "fedmmd_trunk"]
    assert any("no-dropout rows" in note for note in table.settings[0].notes)
    assert any("conv-trunk row" in note for note in table.settings[0].notes)
    for scale in table.scales:
      configs = {cell.row.key: workdir_lib.flatten_config(cell_configs.cell_config(cell))
                 for cell in cells_lib.plan(table, scale, [0])}
      for method in ("fedavg", "fedmmd"):
        with_dropout, without = configs[method], configs[f"{method}_nodropout"]
        assert with_dropout["models.dropout_rate"] == 0.2, (table_id, scale, method)
        assert without["models.dropout_rate"] == 0.0, (table_id, scale, method)
        differ = _differing_fields(with_dropout, without)
        assert differ == {"models.dropout_rate", "name"}, (table_id, scale, method, differ)
      mmd, trunk = configs["fedmmd"], configs["fedmmd_trunk"]
      differ = _differing_fields(mmd, trunk)
      assert differ == {"fedmmd.outputs", "name"}, (table_id, scale, differ)
      assert (mmd["fedmmd.outputs"], trunk["fedmmd.outputs"]) == ("features", "trunk")


def test_the_mid_queue_holds_fcclplus_tables_eight_and_nine_seed_by_seed():
  cells = cells_lib.queue_plan("mid", "mid", [0, 1])
  # Each seed: FCCL+ and BASE of Office31, its width diagnoses, of Digits, its real-domain
  # diagnosis (with its FCCL rows), then the five other rows of Office31 and of Digits.
  per_seed = [f"{t}/mid/{r}__seed0" for t in ("fcclplus_office31", "fcclplus_office31_width")
              for r in ("fcclplus", "solo")]
  per_seed += [f"fcclplus_office31_base_width/mid/solo_{w}__seed0"
               for w in ("w8", "w4", "w2", "w1")]
  per_seed += [f"{t}/mid/{r}__seed0" for t in ("fcclplus_digits", "fcclplus_digits_real")
               for r in ("fcclplus", "solo")]
  per_seed += [f"fcclplus_digits_real/mid/{r}__seed0"
               for r in ("fccl", "fccl_no_distill", "fccl_no_collaboration")]
  per_seed += [f"{t}/mid/{r}__seed0" for t in ("fcclplus_office31", "fcclplus_digits")
               for r in ("fccl", "fedmd", "feddf", "rhfl", "fedmatch")]
  assert [c.label for c in cells[:25]] == per_seed
  assert len(cells) == 2 * 25 and cells[25].label == "fcclplus_office31/mid/fcclplus__seed1"
  for cell in cells[:25]:
    config = cell_configs.cell_config(cell)
    validate_config(config)
    if cell.table.id == "fcclplus_office31_base_width":
      continue  # its own test below
    width = 0.25 if cell.table.id.endswith("_width") else 0.125
    assert (config.num_rounds, config.models.width) == (40, width)
    if cell.table.id == "fcclplus_digits_real":
      assert (tuple(config.scenario.domains), tuple(config.models.architectures)) == (
          ("mnist", "usps"), ("resnet10", "resnet12"))


def test_the_width_diagnosis_is_base_and_fcclplus_of_office31_mid_on_width_one_quarter():
  diagnosis, office31 = (tables.get_table("fcclplus_office31_width"),
                         tables.get_table("fcclplus_office31"))
  assert diagnosis.scales == ("mid",)
  [setting], [full] = diagnosis.settings, office31.settings
  assert [r.key for r in setting.rows] == ["solo", "fcclplus"]
  for row in setting.rows:
    plain = next(r for r in full.rows if r.key == row.key)
    assert row.overrides == plain.overrides + (("models.width", 0.25),)
    [cell] = cells_lib.plan(diagnosis, "mid", [1], [row.key])
    config = cell_configs.cell_config(cell)
    [twin] = cells_lib.plan(office31, "mid", [1], [row.key])
    plain_config = cell_configs.cell_config(twin)
    assert config.models.width == 0.25 and plain_config.models.width == 0.125
    plain_config.models.width = 0.25
    assert config.to_dict() == plain_config.to_dict()  # nothing else differs
  # The paper's numbers beside them are Tables VIII/IX's, Δ included.
  assert setting.paper["inter"]["fcclplus"]["AVG"] == 37.21
  assert setting.paper_delta == {"inter": {"fcclplus": 9.49}, "intra": {"fcclplus": 0.55}}
  with pytest.raises(ConfigError, match="allowed scales: mid"):
    cells_lib.plan(diagnosis, "quick", [0], None)
  # The real-domain diagnosis changes the federation (two participants): the paper's
  # per-domain intra numbers stay beside; its four-domain AVGs and Δ and its inter numbers
  # (each model on the other three domains) do not.
  [real] = tables.get_table("fcclplus_digits_real").settings
  assert real.paper == {"intra": {
      "solo": {"mnist": 70.2, "usps": 74.19, "svhn": 74.57, "syn": 73.6},
      "fccl": {"mnist": 88.84, "usps": 84.42, "svhn": 78.55, "syn": 91.23},
      "fcclplus": {"mnist": 90.54, "usps": 86.92, "svhn": 87.11, "syn": 97.72}}}
  assert real.paper_delta == {}
  # Its FCCL row is the Digits table's (the benchmark's FCCL) on the two real domains.
  assert [r.key for r in real.rows] == ["solo", "fccl", "fcclplus", "fccl_no_distill",
                                        "fccl_no_collaboration"]
  [fccl] = cells_lib.plan(tables.get_table("fcclplus_digits_real"), "mid", [0], ["fccl"])
  config = cell_configs.cell_config(fccl)
  assert (config.algorithm, config.fccl.own_slot, tuple(config.scenario.domains)) == (
      "fccl", "current", ("mnist", "usps"))
  # Its fourth row is that FCCL with no dual-domain distillation (λ_Loc = 0), nothing else
  # changed, and no paper numbers beside it.
  [ce_only] = cells_lib.plan(tables.get_table("fcclplus_digits_real"), "mid", [0],
                             ["fccl_no_distill"])
  ce_config = cell_configs.cell_config(ce_only)
  assert (config.fccl.local_distill_weight, ce_config.fccl.local_distill_weight) == (1.0, 0.0)
  assert _differing_fields(workdir_lib.flatten_config(config),
                          workdir_lib.flatten_config(ce_config)) == {
      "fccl.local_distill_weight"}
  assert "fccl_no_distill" not in real.paper["intra"]
  # Its fifth row also has no collaborative phase (no public batches at all): the two
  # variant rows differ in that one field, so together they isolate the collaborative phase.
  [alone] = cells_lib.plan(tables.get_table("fcclplus_digits_real"), "mid", [0],
                           ["fccl_no_collaboration"])
  alone_config = cell_configs.cell_config(alone)
  assert (ce_config.collaborative.epochs, alone_config.collaborative.epochs) == (1, 0)
  assert _differing_fields(workdir_lib.flatten_config(ce_config),
                          workdir_lib.flatten_config(alone_config)) == {"collaborative.epochs"}
  assert common.public_batches(int(alone_config.collaborative.batch_size),
                               int(alone_config.collaborative.epochs), 5000) == (0, 0)
  assert "fccl_no_collaboration" not in real.paper["intra"]


def test_the_base_width_diagnosis_is_the_mid_base_for_the_papers_fifty_epochs_at_four_widths():
  diagnosis, office31 = (tables.get_table("fcclplus_office31_base_width"),
                         tables.get_table("fcclplus_office31"))
  assert diagnosis.scales == ("mid",) and diagnosis.base == "solo_w8"
  [setting], [full] = diagnosis.settings, office31.settings
  assert [(r.key, r.label) for r in setting.rows] == [
      ("solo_w8", "BASE, width 1/8"), ("solo_w4", "BASE, width 1/4"),
      ("solo_w2", "BASE, width 1/2"), ("solo_w1", "BASE, full width")]
  [twin] = cells_lib.plan(office31, "mid", [2], ["solo"])
  plain = cell_configs.cell_config(twin).to_dict()
  for row, width in zip(setting.rows, (0.125, 0.25, 0.5, 1.0)):
    [cell] = cells_lib.plan(diagnosis, "mid", [2], [row.key])
    config = cell_configs.cell_config(cell)
    validate_config(config)
    # 5 evaluated rounds of 10 epochs at a constant rate: the paper's 50 private epochs; the
    # final number is the one after the last round.
    assert (config.models.width, config.num_rounds, config.local.epochs) == (width, 5, 10)
    assert (config.local.lr_decay, config.eval.last_rounds) == (0.0, 1)
    mine = config.to_dict()
    changed = {(section, field) for section in mine for field in (
        mine[section] if isinstance(mine[section], dict) else [None])
        if (mine[section][field] if field else mine[section]) != (
            plain[section][field] if field else plain[section])}
    assert changed == {("models", "width"), ("num_rounds", None), ("local", "epochs"),
                       ("local", "lr_decay"), ("eval", "last_rounds")} - (
                           {("models", "width")} if width == 0.125 else set())
  # Every row sets the paper's BASE (full width) beside it; the paper prints no Δ here.
  for row in setting.rows:
    assert setting.paper["inter"][row.key] == full.paper["inter"]["solo"]
    assert setting.paper["intra"][row.key]["AVG"] == 77.04
  assert setting.paper["inter"]["solo_w1"]["AVG"] == 27.72 and setting.paper_delta == {}
  with pytest.raises(ConfigError, match="allowed scales: mid"):
    cells_lib.plan(diagnosis, "quick", [0], None)


def test_the_fccl_teacher_diagnosis_is_digits_fccl_with_its_teachers_in_either_mode():
  diagnosis, digits = (tables.get_table("fcclplus_digits_fccl_teachers"),
                       tables.get_table("fcclplus_digits"))
  assert diagnosis.scales == ("quick",) and diagnosis.base == "fccl"
  [setting], [full] = diagnosis.settings, digits.settings
  assert [r.key for r in setting.rows] == ["fccl", "fccl_train_teachers"]
  [fccl] = [r for r in full.rows if r.key == "fccl"]
  assert setting.rows[0] == fccl  # the table's own FCCL cells are twins of fcclplus_digits'
  assert setting.rows[1].source == ""  # no paper prints this row
  [twin] = cells_lib.plan(digits, "quick", [1], ["fccl"])
  plain = cell_configs.cell_config(twin)
  assert plain.fccl.teacher_train_mode is False  # the FCCL code's eval-mode teachers
  [cell] = cells_lib.plan(diagnosis, "quick", [1], ["fccl_train_teachers"])
  config = cell_configs.cell_config(cell)
  validate_config(config)
  assert config.fccl.teacher_train_mode is True
  plain.fccl.teacher_train_mode = True
  assert config.to_dict() == plain.to_dict()  # nothing else differs
  assert setting.paper["inter"] == {"fccl": full.paper["inter"]["fccl"]}
  assert setting.paper_delta == {}
  with pytest.raises(ConfigError, match="allowed scales: quick"):
    cells_lib.plan(diagnosis, "mid", [0], None)

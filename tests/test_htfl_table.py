"""The htfl_cifar10_practical table: its cells, paper column and HtFLlib's metric."""

import pytest

from fedjax_het.config import validate_config
from fedjax_het.grid import cell_configs
from fedjax_het.grid import cells as cells_lib
from fedjax_het.reports import paper_numbers as P
from fedjax_het.reports import partitioned, tables


def test_the_table_lists_every_method_for_htfe2_and_htfe4():
  table = tables.get_table("htfl_cifar10_practical")
  assert table.family == "partitioned"
  assert [s.key for s in table.settings] == ["cifar10_practical_htfe2", "cifar10_practical_htfe4"]
  cells = cells_lib.plan(table, "quick", [0, 1, 2])
  methods = (tables.HTFL_METHODS + ("fedproto_head", "fedtgp_head", "lg_fedavg_local",
                                     "fedgh_local") + tables.HTFL_PUBLIC_METHODS)
  assert len(cells) == 3 * 2 * len(methods)
  config = cell_configs.cell_config(cells[0])
  validate_config(config)
  assert config.name.endswith("_quick_seed0") and config.scenario.dataset == "cifar10_pfllib"
  assert config.scenario.public_size == 0
  for setting in table.settings:
    assert [row.key for row in setting.rows] == list(methods)
    # FedKTL Table 1 prints the data-free methods only: no paper number for a public row.
    assert setting.paper["final"] == {m: P.HTFL_FEDKTL_TABLE1[m][("practical", "cifar10")]
                                      for m in tables.HTFL_METHODS}
    assert "HtFE8" in setting.paper["where"]
  assert "no number for the public-data methods" in table.source


def test_the_public_rows_load_a_public_set_and_train_locally_as_htfllib():
  table = tables.get_table("htfl_cifar10_practical")
  public = [c for c in cells_lib.plan(table, "quick", [0])
            if c.row.key in tables.HTFL_PUBLIC_METHODS]
  assert sorted({c.row.key for c in public}) == sorted(tables.HTFL_PUBLIC_METHODS)
  for cell in public:
    config = cell_configs.cell_config(cell)
    validate_config(config)
    assert config.algorithm == cell.row.key
    assert (config.scenario.public_name, config.scenario.public_size) == ("cifar100", 1000)
    assert (config.local.optimizer, config.local.lr, config.local.batch_size,
            config.local.epochs) == ("sgd", 0.01, 10, 1)
    # The quick public batch that keeps a round's public stage within a CPU's memory.
    assert config.collaborative.batch_size == 64
  assert P.HTFL_FEDKTL_TABLE1["fedtgp"][("practical", "cifar10")] == 88.15
  paper = [c for c in cells_lib.plan(table, "paper", [0]) if c.row.key == "fedmd"]
  assert cell_configs.cell_config(paper[0]).collaborative.batch_size == 512


def test_the_htfl_queue_holds_every_paper_cell_of_the_table():
  cells = cells_lib.queue_plan("htfl", "paper", [0, 1, 2])
  table = tables.get_table("htfl_cifar10_practical")
  assert len(cells) == 3 * 2 * len(tables.HTFL_METHODS + tables.HTFL_PUBLIC_METHODS)
  # Every cell of the table but the diagnosis rows (not the papers' rows).
  diagnoses = {d.key for d in tables.HTFL_HEAD_DIAGNOSES}
  assert {c.label for c in cells} == {c.label for c in cells_lib.plan(table, "paper", [0, 1, 2])
                                      if c.row.key not in diagnoses}
  assert cells[0].label == "htfl_cifar10_practical/paper/cifar10_practical_htfe2__lg_fedavg__seed0"
  # Seed by seed; in each seed the data-free rows come before the public-data rows.
  per_seed = 2 * len(tables.HTFL_METHODS + tables.HTFL_PUBLIC_METHODS)
  assert cells[per_seed].label.endswith("__lg_fedavg__seed1")
  public = [i for i, c in enumerate(cells[:per_seed])
            if c.row.key in tables.HTFL_PUBLIC_METHODS]
  assert min(public) == 2 * len(tables.HTFL_METHODS)
  config = cell_configs.cell_config(cells[0])
  validate_config(config)
  assert (config.num_rounds, config.models.width, config.htfl.feature_dim) == (2000, 1.0, 512)


@pytest.mark.parametrize("method,row,values", [
    ("fedproto", "fedproto_head", ("prototype", "head")),
    ("fedtgp", "fedtgp_head", ("prototype", "head")),
    ("lg_fedavg", "lg_fedavg_local", ("global", "local")),
    ("fedgh", "fedgh_local", ("global", "local"))])
def test_the_diagnosis_rows_differ_from_their_methods_in_the_classifier_alone(method, row,
                                                                              values):
  table = tables.get_table("htfl_cifar10_practical")
  for scale in ("quick", "paper"):
    cells = {(c.setting.key, c.row.key): c for c in cells_lib.plan(table, scale, [0])}
    for setting in table.settings:
      plain = cell_configs.cell_config(cells[(setting.key, method)])
      diagnosis = cell_configs.cell_config(cells[(setting.key, row)])
      validate_config(diagnosis)
      assert (plain[method].classifier, diagnosis[method].classifier) == values
      diagnosis[method].classifier = values[0]
      diagnosis.name = plain.name
      assert diagnosis.to_dict() == plain.to_dict()
  # No paper prints a number for the diagnoses: the paper column stays empty for the rows.
  assert all(row not in s.paper["final"] for s in table.settings)


def test_the_cifar100_groups_take_fedtgps_own_numbers():
  setting = tables.htfl_setting("cifar100", "practical", "htfe3")
  assert setting.paper["final"] == {"fd": 43.53, "fedproto": 38.14, "fedtgp": 49.65}
  assert "HTFE3 (the same group)" in setting.paper["where"]


def test_htfl_accuracy_is_the_best_pooled_round_beside_the_last_three_mean():
  sizes = {"c0": 10, "c1": 30}
  records = [{"round": 1, "eval/intra/c0": 50.0, "eval/intra/c1": 10.0, "eval/intra/mean": 30.0},
             {"round": 2, "eval/intra/c0": 0.0, "eval/intra/c1": 60.0, "eval/intra/mean": 30.0},
             {"round": 3, "eval/intra/c0": 100.0, "eval/intra/c1": 20.0,
              "eval/intra/mean": 60.0},
             {"round": 4, "train/local/loss/c0": 1.0}]
  got = partitioned.htfl_accuracy(records, sizes)
  # pooled: (500 + 300) / 40 = 20, (0 + 1800) / 40 = 45, (1000 + 600) / 40 = 40
  assert got["htfllib"] == pytest.approx(45.0) and got["best_round"] == 2
  assert got["library"] == pytest.approx(40.0)
  assert partitioned.htfl_accuracy([], sizes) == {"htfllib": None, "best_round": None,
                                            "library": None}


def test_the_htfl_block_sets_htfllibs_metric_beside_the_papers(tmp_path):
  # Two seeds of FedProto on HtFE2: per seed the best round pooled over the clients' test
  # splits (sizes 30 and 10); the paper's number goes beside that metric, not the last-3 mean.
  table = tables.get_table("htfl_cifar10_practical")
  setting = table.settings[0]
  sizes = {"c0": 30, "c1": 10}
  cells = {"fedproto": {}}
  for seed, accs in ((0, [(40.0, 60.0), (50.0, 10.0)]), (1, [(20.0, 20.0), (30.0, 70.0)])):
    records = [{"round": r + 1, "eval/intra/c0": a, "eval/intra/c1": b,
                "eval/intra/mean": (a + b) / 2} for r, (a, b) in enumerate(accs)]
    cells["fedproto"][seed] = {"records": records, "metadata": {"test_sizes": sizes},
                               "results": {"intra": {"AVG": (accs[-1][0] + accs[-1][1]) / 2}}}
  text, numbers = partitioned.render_setting(table, setting, cells, show_diff=False)
  # Seed 0: pooled 45.0 then 40.0 -> 45.0; seed 1: 20.0 then 40.0 -> 40.0.
  stat = numbers["htfllib"]["fedproto"]
  assert stat["per_seed"] == {0: 45.0, 1: 40.0} and stat["n"] == 2
  printed = setting.paper["final"]["fedproto"]
  assert f"| FedProto | 2 | 42.50 ± 3.54 (paper {printed:.2f}) |" in text
  final = text.split("Final accuracy (each run")[1].split("\n\n")[2]
  assert "(paper" not in final  # the last-3 mean has no paper number beside it

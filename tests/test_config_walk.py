"""benchmarks/config_walk.py: which function a config read is recorded against."""

import ml_collections

from tests import benchmark_scripts

config_walk = benchmark_scripts.load("config_walk")


def _reads_in_a_comprehension(config):
  return [config[name] for name in ("a", "b")]


def _reads_with_get(config):
  return config.get("a"), config.section.c


def test_each_read_is_recorded_against_the_function_that_asked():
  config = ml_collections.ConfigDict({"a": 1, "b": 2, "section": {"c": 3}})
  originals = {name: getattr(ml_collections.ConfigDict, name) for name in config_walk._WRAPPED}
  with config_walk.Recorder() as recorder:
    assert _reads_in_a_comprehension(config) == [1, 2]
    assert _reads_with_get(config) == (1, 3)
  here = __name__
  # The comprehension's reads are its function's; `get` (which ConfigDict answers through
  # `__getitem__`) is one read; `config.section.c` two (the section, then its field).
  assert dict(recorder.reads) == {(here, "_reads_in_a_comprehension"): 2,
                                  (here, "_reads_with_get"): 3}
  assert recorder.fields[(here, "_reads_with_get")] == {"a", "section", "c"}
  assert {name: getattr(ml_collections.ConfigDict, name) for name in originals} == originals
  config.a  # pylint: disable=pointless-statement (after the walk: not recorded)
  assert sum(recorder.reads.values()) == 5


def test_summary_counts_the_package_apart_from_the_entry():
  recorder = config_walk.Recorder()
  recorder.reads.update({("fedjax_het.train", "train_and_evaluate"): 2,
                         ("fedjax_het.train", "train_lanes"): 1,
                         ("fedjax_het.workdir", "open_run"): 4, ("__main__", "run_entry"): 2})
  walk = config_walk.summarise(recorder)
  assert (walk["functions"], walk["modules"], walk["reads"]) == (3, 2, 7)
  assert walk["by_module"] == {"fedjax_het.train": ["train_and_evaluate", "train_lanes"],
                               "fedjax_het.workdir": ["open_run"]}
  assert list(walk["outside_package"]) == ["__main__:run_entry"]

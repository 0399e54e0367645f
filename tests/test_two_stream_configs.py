"""The FedMMD / FedFusion paper-setting configs: every name validates; they train end to end."""

import json
import pathlib

import chex
import pytest

from fedjax_het.config import load_module, validate_config
from fedjax_het.engine import rounds
from fedjax_het.train import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = {name: load_module(REPO / "fedjax_het" / "configs" / f"{name}.py")
           for name in ("mnist", "cifar10")}
TWO_STREAM = CONFIGS["mnist"].two_stream


def _names(dataset):
  for setting in TWO_STREAM.SETTINGS[dataset]:
    for method in ("fedavg", "fedprox", "fedmmd", "fedfusion"):
      variants = TWO_STREAM.VARIANTS.get(method, ("",))
      for variant in variants:
        for quick in ("", "_quick"):
          yield f"{method}_{setting}" + (f"_{variant}" if variant else "") + quick


ALL = [(dataset, name) for dataset in CONFIGS for name in _names(dataset)]


def test_every_paper_setting_config_validates_and_says_what_it_is():
  assert len(ALL) == 4 * 2 * 8 + 3 * 2 * 8   # 8 = fedavg, fedprox, 3 fedmmd, 3 fedfusion
  for dataset, name in ALL:
    c = CONFIGS[dataset].get_config(name)
    validate_config(c)
    assert c.name == f"{dataset}_{name}"
    assert c.scenario.name == "partitioned" and c.scenario.dataset == dataset
    assert len(c.eval.targets) >= 1 and c.models.dropout_rate == 0.2
  binary = CONFIGS["cifar10"].get_config("fedmmd_binary_l2")
  assert (binary.scenario.partition, binary.scenario.num_clients) == ("class_split", 2)
  assert (binary.fedmmd.constraint, binary.fedmmd.outputs, binary.fedmmd.weight) == ("l2",
                                                                                    "logits", 0.01)
  trunk = CONFIGS["cifar10"].get_config("fedmmd_binary_trunk_quick")
  assert (trunk.fedmmd.constraint, trunk.fedmmd.outputs, trunk.fedmmd.weight) == ("mmd",
                                                                                  "trunk", 0.1)
  shards = CONFIGS["mnist"].get_config("fedavg_shards")
  assert (shards.scenario.num_clients, shards.fedavg.clients_per_round, shards.local.batch_size,
          shards.local.epochs) == (100, 10, 10, 2)
  permuted = CONFIGS["mnist"].get_config("fedfusion_permuted_multi")
  assert permuted.eval.targets == (94.0, 95.0) and permuted.fedfusion.fusion == "multi"
  assert (permuted.local.lr, permuted.local.lr_decay_rate) == (0.002, 0.99)
  # The file's own setting is unchanged, and bad names say what is allowed.
  assert CONFIGS["mnist"].get_config("fedavg").local.epochs == 5
  with pytest.raises(ValueError, match=r"expected one of \('conv', 'multi', 'single'\)"):
    CONFIGS["mnist"].get_config("fedfusion_permuted_attention")
  with pytest.raises(ValueError, match="expected nothing"):
    CONFIGS["cifar10"].get_config("fedavg_iid_conv")


def _tiny(config, tmp_path, *, own_batch_sizes=False):
  """Two rounds of `config` on 200 training images (2000 in shards) and 100 test images; with
  `own_batch_sizes` the config's local and evaluation batch sizes stay."""
  config.num_rounds = 2
  shards = config.scenario.partition == "shards"  # 100 clients: 20 rows each, batches of 10
  config.scenario.train_size = 2000 if shards else 200
  config.scenario.test_size = 100
  config.local.epochs = 1
  if not own_batch_sizes:
    config.local.batch_size = 10 if shards else 32
    config.eval.batch_size = 100
  config.eval.targets = (5.0, 99.9)
  config.logging.progress = False
  config.logging.plots = False
  config.compilation_cache_dir = ""
  return train_and_evaluate(config, tmp_path)


def _guard_one_trace(monkeypatch):
  make_round_fn, guarded = rounds.make_round_fn, []

  def make_guarded_round_fn(algorithm):
    guarded.append(algorithm.name)
    return chex.assert_max_traces(make_round_fn(algorithm), n=1)

  chex.clear_trace_counter()
  monkeypatch.setattr(rounds, "make_round_fn", make_guarded_round_fn)
  return guarded


def test_fedfusion_permuted_trains_from_its_config_with_one_trace(tmp_path, tmp_path_factory,
                                                                  monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)  # synthetic digits
  guarded = _guard_one_trace(monkeypatch)
  # The config's own batch sizes: the programs of tests/test_new_client.py's FedFusion run (the
  # same config for one round), compiled once in a session.
  out = _tiny(CONFIGS["mnist"].get_config("fedfusion_permuted_conv_quick"), tmp_path,
              own_batch_sizes=True)
  assert guarded == ["fedfusion"]
  assert [r["round"] for r in out["records"]] == [1, 2]
  results = json.loads((tmp_path / "results.json").read_text())
  # The first evaluated round reaches 5% (chance is 10%); 99.9% is not reached in 2 rounds.
  assert results["rounds_to_target"] == {"5": 1, "99.9": None}
  text = (tmp_path / "results.md").read_text()
  assert "Rounds to reach 5% mean intra-domain accuracy: 1." in text
  assert "Rounds to reach 99.9% mean intra-domain accuracy: not reached in 2." in text
  last = out["records"][-1]
  assert last["train/server/bytes_up"] == last["train/server/bytes_down"] > 0
  # The paper's CNN with its dropout (the default of the paper settings).
  recorded = json.loads((tmp_path / "config.json").read_text())
  assert recorded["models"]["dropout_rate"] == 0.2


@pytest.mark.slow
@pytest.mark.parametrize("dataset,name", [(d, n) for d, n in ALL if n.endswith("_quick")])
def test_every_quick_paper_setting_trains_two_rounds(dataset, name, tmp_path, tmp_path_factory,
                                                     monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  guarded = _guard_one_trace(monkeypatch)
  config = CONFIGS[dataset].get_config(name)
  out = _tiny(config, tmp_path)
  assert guarded == [config.algorithm]
  assert [r["round"] for r in out["records"]] == [1, 2]

"""The class-incremental runs through the one trainer reproduce their pinned numbers.

GLFC, iCaRL + FL and FedAvg on the task stream are registered methods trained by
`fedjax_het.train.train_and_evaluate`. These pins are the numbers of their tiny runs
(`tests.test_cil_train.tiny_cil_config`: default suite) and of their quick configs
(`fedjax_het/configs/cifar100.py` `<method>_quick` on the synthetic stream: slow suite),
seed 0, recorded under this suite's conftest (4 simulated CPU devices: XLA:CPU then rounds
differently than with one) with jax/jaxlib `RECORDED_WITH_JAX` on x86-64: the Table 1 numbers of
results.json (accuracy on the seen classes after each task, their average, forgetting),
every number of the last round's record, and the sum of |parameter| over the final global
model. Plain SGD and no sign-based updates: float32 rounding moves the losses within rtol
1e-4; the accuracies are counts of test images and are compared exactly.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from fedjax_het.config import load_module
from fedjax_het.train import train_and_evaluate
from tests.test_cil_train import tiny_cil_config

REPO = pathlib.Path(__file__).resolve().parents[1]
RECORDED_WITH_JAX = "0.10.2"
METHODS = ("fedavg_cil", "icarl_fl", "glfc")


def _config(scale, method):
  if scale == "tiny":
    return tiny_cil_config(method)
  config = load_module(REPO / "fedjax_het/configs/cifar100.py").get_config(f"{method}_quick")
  config.scenario.source = "synthetic"
  config.compilation_cache_dir = ""
  config.logging.progress = False
  config.logging.plots = False
  return config


def _check(scale, method, tmp_path):
  out = train_and_evaluate(_config(scale, method), tmp_path)
  pinned = PINNED[f"{scale}/{method}"]
  results = out["results"]
  assert results["seen_accuracy"] == pinned["seen_accuracy"]
  assert results["average_incremental_accuracy"] == pytest.approx(
      pinned["average_incremental_accuracy"], abs=1e-12)
  assert results["forgetting"] == pytest.approx(pinned["forgetting"], abs=1e-12)
  last = {k: v for k, v in out["records"][-1].items()
          if isinstance(v, float) and not k.startswith("time/")}
  assert last.keys() == pinned["last_record"].keys()
  for name, value in pinned["last_record"].items():
    if name.startswith("eval/"):
      assert last[name] == pytest.approx(value, abs=1e-9), name
    else:
      np.testing.assert_allclose(last[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
  leaves = jax.tree_util.tree_leaves(out["state"]["server"])
  total = sum(float(np.abs(np.asarray(x, np.float64)).sum()) for x in leaves)
  np.testing.assert_allclose(total, pinned["server_abs_sum"], rtol=1e-5)


@pytest.mark.parametrize("method", [m if m != "glfc" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHODS])  # glfc: 25 s on 2 cores, slow suite
def test_tiny_runs_reproduce_the_pinned_numbers(method, tmp_path):
  _check("tiny", method, tmp_path)


@pytest.mark.slow  # 30 s, 47 s and 200 s on 2 CPU cores
@pytest.mark.parametrize("method", METHODS)
def test_quick_runs_reproduce_the_pinned_numbers(method, tmp_path):
  _check("quick", method, tmp_path)


PINNED = {'quick/fedavg_cil': {'average_incremental_accuracy': 0.42850000000000005,
                          'forgetting': 0.584,
                          'last_record': {'eval/accuracy/seen': 28.6,
                                          'eval/accuracy/task_0': 0.0,
                                          'eval/accuracy/task_1': 0.0,
                                          'eval/accuracy/task_2': 55.2,
                                          'eval/accuracy/task_3': 59.2,
                                          'train/server/bytes_down': 1142352.0,
                                          'train/server/bytes_up': 1142352.0,
                                          'train/loss': 0.06763645261526108},
                          'seen_accuracy': [0.776, 0.396, 0.256, 0.286],
                          'server_abs_sum': 3784.9578299829154},
     'quick/glfc': {'average_incremental_accuracy': 0.5267499999999999,
                    'forgetting': 0.284,
                    'last_record': {'eval/accuracy/seen': 51.7,
                                    'eval/accuracy/task_0': 19.2,
                                    'eval/accuracy/task_1': 18.4,
                                    'eval/accuracy/task_2': 98.4,
                                    'eval/accuracy/task_3': 70.8,
                                    'glfc/distilling': 3.0,
                                    'glfc/entropy': 0.3443000018596649,
                                    'glfc/exemplars': 90.0,
                                    'glfc/signals': 0.0,
                                    'glfc/transitions/detected': 0.0,
                                    'glfc/transitions/false': 0.0,
                                    'glfc/transitions/hit': 0.0,
                                    'glfc/transitions/true': 0.0,
                                    'proxy/gradients': 0.0,
                                    'proxy/labels_correct': 0.0,
                                    'proxy/monitor_accuracy': 1.0,
                                    'proxy/rebuilt_from': 0.0,
                                    'proxy/reconstruction_loss': 0.0,
                                    'proxy/selected': 1.0,
                                    'train/gc': 0.044621892273426056,
                                    'train/server/bytes_down': 2284704.0,
                                    'train/server/bytes_up': 1142352.0,
                                    'train/loss': 0.05939695984125137,
                                    'train/rd': 0.0741720199584961},
                    'seen_accuracy': [0.696, 0.406, 0.488, 0.517],
                    'server_abs_sum': 3809.330244140853},
     'quick/icarl_fl': {'average_incremental_accuracy': 0.7569166666666667,
                        'forgetting': 0.18399999999999997,
                        'last_record': {'eval/accuracy/seen': 66.5,
                                        'eval/accuracy/task_0': 55.6,
                                        'eval/accuracy/task_1': 53.2,
                                        'eval/accuracy/task_2': 83.2,
                                        'eval/accuracy/task_3': 74.0,
                                        'icarl/classes_with_mean': 20.0,
                                        'icarl/exemplars': 90.0,
                                        'icarl/transitions': 0.0,
                                        'train/server/bytes_down': 3427056.0,
                                        'train/server/bytes_up': 1204032.0,
                                        'train/loss': 0.16293875873088837},
                        'seen_accuracy': [0.864, 0.76, 0.7386666666666667, 0.665],
                        'server_abs_sum': 3768.3658684317998},
     'tiny/fedavg_cil': {'average_incremental_accuracy': 0.375,
                         'forgetting': 0.5,
                         'last_record': {'eval/accuracy/seen': 25.0,
                                         'eval/accuracy/task_0': 0.0,
                                         'eval/accuracy/task_1': 50.0,
                                         'train/server/bytes_down': 186272.0,
                                         'train/server/bytes_up': 186272.0,
                                         'train/loss': 1.280397891998291},
                         'seen_accuracy': [0.5, 0.25],
                         'server_abs_sum': 1226.4682140649838},
     'tiny/glfc': {'average_incremental_accuracy': 0.375,
                   'forgetting': 0.5,
                   'last_record': {'eval/accuracy/seen': 25.0,
                                   'eval/accuracy/task_0': 0.0,
                                   'eval/accuracy/task_1': 50.0,
                                   'glfc/distilling': 0.0,
                                   'glfc/entropy': 1.384486436843872,
                                   'glfc/exemplars': 0.0,
                                   'glfc/signals': 0.0,
                                   'glfc/transitions/detected': 0.0,
                                   'glfc/transitions/false': 0.0,
                                   'glfc/transitions/hit': 0.0,
                                   'glfc/transitions/true': 1.0,
                                   'proxy/gradients': 0.0,
                                   'proxy/labels_correct': 0.0,
                                   'proxy/monitor_accuracy': 0.0,
                                   'proxy/rebuilt_from': 0.0,
                                   'proxy/reconstruction_loss': 0.0,
                                   'proxy/selected': 1.0,
                                   'train/gc': 0.6637841463088989,
                                   'train/server/bytes_down': 186272.0,
                                   'train/server/bytes_up': 186272.0,
                                   'train/loss': 0.6637841463088989,
                                   'train/rd': 0.6928223371505737},
                   'seen_accuracy': [0.5, 0.25],
                   'server_abs_sum': 1226.324755531},
     'tiny/icarl_fl': {'average_incremental_accuracy': 0.55,
                       'forgetting': 0.0,
                       'last_record': {'eval/accuracy/seen': 60.0,
                                       'eval/accuracy/task_0': 50.0,
                                       'eval/accuracy/task_1': 70.0,
                                       'icarl/classes_with_mean': 3.0,
                                       'icarl/exemplars': 12.0,
                                       'icarl/transitions': 1.0,
                                       'train/server/bytes_down': 558816.0,
                                       'train/server/bytes_up': 190400.0,
                                       'train/loss': 0.6888402104377747},
                       'seen_accuracy': [0.5, 0.6],
                       'server_abs_sum': 1226.234240107249}}

"""fedjax_het.evaluation.make_evaluator: the domains' real rows as one stream (static sizes)
against the padded per-domain evaluator and against NumPy by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import evaluation, models
from fedjax_het.engine.clients import ClientGroup, init_group_variables

SIZES = [7, 0, 13, 5]  # an empty domain, and a largest one that is not first
NUM_CLASSES = 10


def _test_data(seed=0):
  rng = np.random.default_rng(seed)
  images = {d: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            for d, n in zip("abcd", SIZES)}
  labels = {d: rng.integers(0, NUM_CLASSES, (n,), dtype=np.int32) for d, n in zip("abcd", SIZES)}
  return evaluation.stack_test_sets(list("abcd"), images, labels), images, labels


def _groups():
  cnn = ClientGroup("cnn", models.get_model("simple_cnn", NUM_CLASSES), clients=(0, 1),
                    num_slots=2)
  resnet = ClientGroup("resnet", models.get_model("resnet10", NUM_CLASSES, width=0.0625,
                                                  conv_impl="xla"), clients=(2,), num_slots=1)
  return cnn, resnet


def _state(groups):
  key = jax.random.key(3)
  return {"groups": {g.name: {"variables": init_group_variables(
      g, jax.random.fold_in(key, i), shared=False, num_participants=3)}
      for i, g in enumerate(groups)}}


def _preprocess(images):
  return images.astype(jnp.float32) / 255.0 - 0.5


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("batch_size", [4, 64])
def test_stream_equals_padded_and_numpy(top_k, batch_size):
  test, images, labels = _test_data()
  groups = _groups()
  state = _state(groups)
  kwargs = dict(batch_size=batch_size, max_size=max(SIZES), top_k=top_k, preprocess=_preprocess)
  padded = jax.jit(evaluation.make_evaluator(groups, **kwargs))(state, test)
  stream = jax.jit(evaluation.make_evaluator(groups, sizes=SIZES, **kwargs))(state, test)
  for group in groups:
    np.testing.assert_array_equal(np.asarray(stream[group.name]), np.asarray(padded[group.name]))
    assert stream[group.name].shape == (group.num_slots, len(SIZES))
    for slot in range(group.num_slots):  # by hand: every real row once, top-k in NumPy
      variables = jax.tree_util.tree_map(lambda v: v[slot],  # noqa: B023
                                         state["groups"][group.name]["variables"])
      for d, (domain, n) in enumerate(zip("abcd", SIZES)):
        if n == 0:
          assert float(stream[group.name][slot, d]) == 0.0
          continue
        _, logits, _ = models.apply_model(group.model, variables,
                                          _preprocess(jnp.asarray(images[domain])), train=False)
        top = np.argsort(-np.asarray(logits), axis=1, kind="stable")[:, :top_k]
        hits = int(np.sum(np.any(top == labels[domain][:, None], axis=1)))
        assert float(stream[group.name][slot, d]) == pytest.approx(100.0 * hits / n, abs=1e-4)


def test_stream_runs_only_the_real_rows():
  test, _, _ = _test_data()
  (cnn, _) = _groups()
  state = _state((cnn,))
  evaluate = evaluation.make_evaluator((cnn,), batch_size=4, max_size=max(SIZES), top_k=1,
                                       preprocess=_preprocess, sizes=SIZES)
  text = jax.jit(evaluate).lower(state, test).as_text()
  # 25 real rows in batches of 4: a scan of 7 steps (the padded evaluator runs 4 x 4 steps).
  assert "7xi32" in text or "tensor<7xi32>" in text


def test_bad_sizes_are_refused():
  (cnn, _) = _groups()
  with pytest.raises(ValueError, match="sizes must lie in"):
    evaluation.make_evaluator((cnn,), batch_size=4, max_size=5, top_k=1,
                              preprocess=_preprocess, sizes=[3, 6])


def test_other_test_data_take_the_padded_path_or_give_nan():
  (cnn, _) = _groups()
  state = _state((cnn,))
  test, _, _ = _test_data()
  kwargs = dict(batch_size=4, max_size=max(SIZES), top_k=1, preprocess=_preprocess)
  padded = jax.jit(evaluation.make_evaluator((cnn,), **kwargs))(state, test)["cnn"]
  # Built for 3 domains, given 4: the padded path, right numbers.
  other = jax.jit(evaluation.make_evaluator((cnn,), sizes=SIZES[:3], **kwargs))(state, test)
  other = other["cnn"]
  np.testing.assert_array_equal(np.asarray(other), np.asarray(padded))
  # The shape it was built for, other sizes: NaN, not wrong numbers.
  shrunk = test._replace(sizes=np.asarray([6, 0, 13, 5], np.int32))
  nan = jax.jit(evaluation.make_evaluator((cnn,), sizes=SIZES, **kwargs))(state, shrunk)["cnn"]
  assert np.all(np.isnan(np.asarray(nan)))


def test_experiment_streams_its_real_test_rows():
  from fedjax_het.train import Experiment  # noqa: PLC0415
  from tests.test_train import tiny_config  # noqa: PLC0415
  experiment = Experiment(tiny_config())
  sizes = tuple(int(n) for n in np.asarray(experiment.data.test.sizes))
  assert experiment.setup.test_sizes == sizes and len(sizes) > 1


@pytest.mark.slow  # about 15 s: two evaluators of the quick FCCL+ config compiled
def test_benchmark_compares_both_evaluators(tmp_path):
  import pathlib  # noqa: PLC0415

  from fedjax_het.config import load_module  # noqa: PLC0415
  script = load_module(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
                       / "evaluation_stream.py")
  report = script.main(["--config=digits_fcclplus_quick", "--set=scenario.test_size=24",
                        "--out", str(tmp_path / "out.json")])
  assert report["equal_accuracies"] is True
  assert report["real_rows_per_model"] == sum(report["test_sizes"])
  assert report["padded_rows_per_model"] == len(report["test_sizes"]) * max(report["test_sizes"])
  assert report["stream_speedup"] == pytest.approx(report["padded_secs"] / report["stream_secs"])

"""FCCL+'s FNTD teacher (Eq. 13-14, Fig. 9): `fcclplus.fntd_teacher`.

"previous_local": theta^{e-1}, the model at the end of the previous round's local updating
(the paper's, the default); "after_collaborative": theta^e, the model after this round's
collaborative updating (where local updating starts).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.algorithms import fcclplus
from fedjax_het.config import validate_config
from fedjax_het.engine import api
from fedjax_het.train import train_and_evaluate
from tests.test_fcclplus_dual import LR, _config, _setup, _slot
from tests.test_train import digits, tiny_config
from tests.tiny_federation import grouped_data, round_data_with_public


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data_cache"))
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)


def _state_with_an_old_teacher(phases, data):
  state = phases.init(jax.random.key(0), api.FederatedArrays(data, None, None))
  g = state["groups"]["a"]
  g["teacher"] = jax.tree_util.tree_map(lambda v: v + 0.1 * jnp.cos(
      jnp.arange(v.size, dtype=v.dtype).reshape(v.shape)), g["variables"])
  return state


def _ce_step_by_hand(params, x, y):
  """One SGD step of plain CE for z = x W + b (float64)."""
  w, b = (np.asarray(a, np.float64) for a in (params["head"]["kernel"], params["head"]["bias"]))
  x = np.asarray(x, np.float64)
  z = x @ w + b
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  dz = (p - np.eye(3)[y]) / len(y)
  return w - LR * x.T @ dz, b - LR * dz.sum(0)


def test_after_collaborative_distils_from_the_model_local_updating_starts_from():
  # With KD, a teacher equal to the starting model gives no gradient in the first step: the
  # step is plain CE (checked by hand). The previous-round teacher gives another step.
  setup = _setup(["a", "a"])
  data, images, labels = grouped_data(setup)
  results = {}
  for teacher in fcclplus.FNTD_TEACHERS:
    phases = fcclplus.make_phases(_config("kd", fntd_teacher=teacher), setup)
    state = _state_with_an_old_teacher(phases, data)
    new_state, metrics = phases.local_update(state, data, jax.random.key(1), jnp.int32(0))
    results[teacher] = (state, new_state, metrics)
  state, new_state, metrics = results["after_collaborative"]
  for slot in range(2):
    x = jnp.asarray(images[slot], jnp.float32).reshape(len(images[slot]), -1) / 255.0
    want_w, want_b = _ce_step_by_hand(_slot(state["groups"]["a"]["variables"]["params"], slot),
                                      x, np.asarray(labels[slot]))
    got = _slot(new_state["groups"]["a"]["variables"]["params"], slot)["head"]
    np.testing.assert_allclose(got["kernel"], want_w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["bias"], want_b, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["a"]["distill"], 0.0, atol=1e-6)
  assert np.all(np.asarray(results["previous_local"][2]["a"]["distill"]) > 1e-4)
  # Either way the state keeps the end-of-local model as theta^{e-1}.
  for _, new_state, _ in results.values():
    g = new_state["groups"]["a"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, g["teacher"], g["variables"])


@pytest.mark.parametrize("average", [False, True])
def test_the_teacher_is_the_model_after_the_collaborative_phase(average):
  # A whole round (collaborative step, homogeneous averaging, local FNTD): "after_collaborative"
  # equals "previous_local" with theta^{e-1} replaced by the model local updating starts from.
  setup = _setup(["a", "a"])
  data = round_data_with_public(setup)
  fields = dict(average_parameters=average)
  after = fcclplus.make_phases(_config("fntd", fntd_teacher="after_collaborative", **fields),
                               setup)
  previous = fcclplus.make_phases(_config("fntd", **fields), setup)
  state = _state_with_an_old_teacher(after, data.groups)
  images = jnp.asarray(data.public, jnp.float32) / 255.0
  collaborated, _ = after.collaborative_step(state, images, jax.random.key(2), jnp.int32(0))
  start = collaborated["groups"]["a"]["variables"]
  if average:
    start = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(jnp.mean(v, 0), v.shape), start)
  key = jax.random.key(3)
  got, got_metrics = after.local_update(collaborated, data.groups, key, jnp.int32(0))
  swapped = {**collaborated, "groups": {"a": {**collaborated["groups"]["a"], "teacher": start}}}
  want, want_metrics = previous.local_update(swapped, data.groups, key, jnp.int32(0))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                         got["groups"]["a"]["variables"], want["groups"]["a"]["variables"])
  np.testing.assert_allclose(got_metrics["a"]["distill"], want_metrics["a"]["distill"],
                             rtol=1e-5, atol=1e-7)
  # and differs from distilling from the old teacher.
  old, _ = previous.local_update(collaborated, data.groups, key, jnp.int32(0))
  assert not np.allclose(old["groups"]["a"]["variables"]["params"]["head"]["kernel"],
                         got["groups"]["a"]["variables"]["params"]["head"]["kernel"])


def test_the_teacher_field_is_validated_and_defaults_to_the_papers():
  config = _config("fntd")
  assert config.fcclplus.fntd_teacher == "previous_local"
  validate_config(config)
  bad = _config("fntd", fntd_teacher="collaborative")
  allowed = r"\('previous_local', 'after_collaborative'\)"
  with pytest.raises(ValueError, match=rf"config.fcclplus.fntd_teacher must be one of {allowed}"
                     r", got 'collaborative'"):
    validate_config(bad)
  with pytest.raises(ValueError, match=rf"config.fcclplus.fntd_teacher must be one of {allowed}"):
    fcclplus.make_phases(bad, _setup(["a", "a"]))
  quick = digits.get_config("fcclplus_quick")
  quick.fcclplus.fntd_teacher = "after_collaborative"  # --config.fcclplus.fntd_teacher=...
  validate_config(quick)


def test_a_config_recorded_before_the_field_existed_keeps_the_papers_teacher():
  setup = _setup(["a", "a"])
  data, _, _ = grouped_data(setup)
  old = _config("fntd")
  del old.fcclplus["fntd_teacher"]
  validate_config(old)
  runs = []
  for config in (old, _config("fntd")):
    phases = fcclplus.make_phases(config, setup)
    state = _state_with_an_old_teacher(phases, data)
    runs.append(phases.local_update(state, data, jax.random.key(1), jnp.int32(0))[0])
  jax.tree_util.tree_map(np.testing.assert_array_equal, runs[0], runs[1])


@pytest.mark.slow  # about 30 s on a 2-core CPU
def test_fcclplus_with_the_after_collaborative_teacher_trains_end_to_end(tmp_path):
  config = tiny_config("fcclplus", **{"num_rounds": 2,
                                      "fcclplus.fntd_teacher": "after_collaborative",
                                      "models.architectures": ("simple_cnn",) * 4,
                                      "logging.diagnostic_rounds": ()})
  train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2]
  for client in ("mnist", "usps", "svhn", "syn"):
    assert np.isfinite(records[-1][f"train/local/distill/{client}"])
    assert 0.0 <= records[-1][f"eval/intra/{client}"] <= 100.0
  # 64 public images in batches of 32, 4 participants, 10 classes: logits and similarities.
  assert records[-1]["train/server/bytes_up"] == 4 * 2 * (32 * 10 + 32 * 31) * 4

"""The PyTorch reference of FCCL+ (benchmarks/pytorch_reference.py): same models, same losses,
and a round that runs. Skipped where torch is not installed (CI has no torch; `.[bench]`)."""

import functools
import json
import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[bench]')")

from fedjax_het import losses, models  # noqa: E402
from fedjax_het.models.functional import count_parameters, init_variables  # noqa: E402
from tests import benchmark_scripts  # noqa: E402

ARCHS = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")
TINY = ["scenario.private_sizes.mnist=12", "scenario.private_sizes.usps=9",
        "scenario.private_sizes.svhn=20", "scenario.private_sizes.syn=16",
        "scenario.public_size=24", "collaborative.batch_size=16", "local.batch_size=8",
        "local.epochs=1", "num_rounds=2"]


ref = benchmark_scripts.load("pytorch_reference")


@functools.lru_cache(maxsize=None)
def _flax_params(arch, width):
  """Parameter count and feature dim of the library's model, built as `Experiment` builds it."""
  model = models.get_model(arch, 10, width=width, conv_impl="xla")
  shapes = jax.eval_shape(lambda key: init_variables(model, key), jax.random.key(0))
  return count_parameters(shapes["params"]), int(model.feature_dim)


@pytest.mark.parametrize("width", [1.0, 0.125])
@pytest.mark.parametrize("arch", ARCHS)
def test_models_match_the_library(arch, width):
  net = ref.get_model(arch, 10, width=width).eval()
  flax_count, feature_dim = _flax_params(arch, width)
  assert ref.count_parameters(net) == flax_count
  with torch.no_grad():
    features, logits = net.forward_both(torch.zeros(2, 3, 32, 32))
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
  assert features.shape == (2, feature_dim)
  assert logits.shape == (2, 10)


def _t(x):
  return torch.from_numpy(np.asarray(x, np.float32))


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_fccm_matches_the_library(scale):
  rng = np.random.default_rng(0)
  z, zbar = (scale * rng.standard_normal((64, 10)).astype(np.float32) for _ in range(2))
  for eps in (losses.fccl.FCCM_EPS, 0.0):
    want = float(losses.cross_correlation_loss(logits=z, target_logits=zbar, eps=eps))
    got = float(ref.fccm_loss(_t(z), _t(zbar), eps=eps))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_fisl_matches_the_library(scale):
  rng = np.random.default_rng(1)
  h, hbar = (scale * rng.standard_normal((32, 16)).astype(np.float32) for _ in range(2))
  sim = np.asarray(losses.instance_similarity_matrix(features=h))
  np.testing.assert_allclose(ref.similarity_logits(_t(h)).numpy(), sim, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(ref._similarity_logits_authors(_t(h), losses.FISL_TEMPERATURE)
                             .numpy(), sim, rtol=1e-5, atol=1e-4)
  s, sbar = (scale * rng.standard_normal((32, 31)).astype(np.float32) for _ in range(2))
  want = float(losses.instance_similarity_loss(similarity=s, target_similarity=sbar))
  assert float(ref.fisl_loss(_t(s), _t(sbar))) == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_fntd_matches_the_library(scale):
  rng = np.random.default_rng(2)
  z, zt = (scale * rng.standard_normal((48, 10)).astype(np.float32) for _ in range(2))
  labels = rng.integers(0, 10, 48)
  want = float(losses.non_target_distillation_loss(student_logits=z, teacher_logits=zt,
                                                   labels=labels, temperature=3.0))
  got = float(ref.fntd_loss(_t(z), _t(zt), torch.from_numpy(labels), temperature=3.0))
  assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_sizes_follow_the_config():
  sizes = ref.sizes_from_config(ref.load_config("digits_fcclplus_quick", []))
  assert sizes.architectures == ARCHS
  assert sizes.private_sizes == (150, 80, 2000, 1500)
  assert (sizes.public_size, sizes.public_batch, sizes.local_batch, sizes.local_epochs) == (
      1024, 512, 64, 5)
  assert sizes.width == 0.125 and sizes.num_classes == 10 and sizes.fntd_temperature == 3.0


@pytest.mark.parametrize("flavour", ref.FLAVOURS)
def test_tiny_round_runs(flavour):
  sizes = ref.sizes_from_config(ref.load_config("digits_fcclplus_quick", TINY))
  runner = ref.TorchFCCLPlus(sizes, torch.device("cpu"), flavour)
  before = [p.detach().clone() for p in runner.nets[2].parameters()]
  out = runner.run_round()
  assert set(out) == {"fccm", "fisl", "ce", "fntd"}
  assert all(math.isfinite(v) for v in out.values()), out
  assert runner.round_index == 1
  assert any(not torch.equal(a, b) for a, b in zip(before, runner.nets[2].parameters()))
  for net, prev in zip(runner.nets, runner.prev_nets):  # teacher = end of the last local phase
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), prev.parameters()))


def test_each_flavour_sets_cudnn_search_for_itself():
  sizes = ref.sizes_from_config(ref.load_config("digits_fcclplus_quick", TINY))
  ref.TorchFCCLPlus(sizes, torch.device("cpu"), "tuned")
  assert torch.backends.cudnn.benchmark
  ref.TorchFCCLPlus(sizes, torch.device("cpu"), "authors")  # timed after tuned in one process
  assert not torch.backends.cudnn.benchmark


def test_runner_writes_json(tmp_path):
  out = tmp_path / "ref.json"
  report = ref.main(["--config=digits_fcclplus_quick", *[f"--set={s}" for s in TINY],
                     "--rounds", "1", "--flavours=tuned", "--skip-engine", "--out", str(out)])
  saved = json.loads(out.read_text())
  assert saved["torch"].keys() == {"tuned"}
  row = report["torch"]["tuned"]
  assert row["steady_round_secs"] > 0 and row["end_to_end_secs"] >= row["first_round_secs"]
  assert saved["sizes"]["private_sizes"] == [12, 9, 20, 16]
  assert "engine_vs_pytorch_speedup" not in saved

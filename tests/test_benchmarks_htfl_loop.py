"""benchmarks/htfl_loop.py: HtFLlib's loop in torch has the library's models, its disk round
trip changes the time and not the result, and the script writes its side-by-side record.
Skipped where torch is not installed (the library does not depend on it)."""

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from fedjax_het import configs  # noqa: E402
from tests import benchmark_scripts, real_data  # noqa: E402

htfl_loop = benchmark_scripts.load("htfl_loop")

TINY = ["scenario.num_clients=2", "models.architectures=('htfl_cnn',)", "models.width=0.0625",
        "htfl.feature_dim=0", "scenario.train_size=80", "scenario.test_size=40",
        "num_rounds=2"]


def test_torch_models_have_the_library_parameter_counts_and_feature_dim():
  config = configs.get_config("htfl_cifar10_practical_htfe4_fedproto_quick")
  library = htfl_loop.library_parameters(config, 10)
  assert set(library) == {"htfl_cnn", "googlenet", "mobilenet_v2", "resnet18"}
  for arch, count in library.items():
    model = htfl_loop.build_model(arch, 10, width=0.125, feature_dim=64).eval()
    assert htfl_loop.count_parameters(model) == count, arch
    with torch.no_grad():
      assert model.base(torch.zeros(2, 3, 32, 32)).shape == (2, 64)
      assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("method", htfl_loop.METHODS)
def test_the_disk_round_trip_gives_the_in_memory_loops_models(method, tmp_path):
  generator = torch.Generator().manual_seed(0)
  clients = [(torch.randn(n, 3, 32, 32, generator=generator),
              torch.randint(0, 4, (n,), generator=generator)) for n in (23, 7)]
  loops = {variant: htfl_loop.HtFLlibLoop(
      method, clients, ["htfl_cnn", "htfl_cnn"], num_classes=4, width=0.0625, feature_dim=0,
      lr=0.01, batch_size=10, epochs=1, lamda=1.0, device=torch.device("cpu"),
      variant=variant, folder=tmp_path / "disk", seed=3) for variant in htfl_loop.VARIANTS}
  for loop in loops.values():
    for _ in range(2):  # the second round uses the first round's global statistics
      loop.run_round()
  server = "global_protos" if method == "fedproto" else "global_logits"
  memory, disk = (loops[v]._load("Server", server) for v in htfl_loop.VARIANTS)
  assert sorted(memory) == sorted(disk) and memory
  for label in memory:
    torch.testing.assert_close(memory[label], disk[label], rtol=0, atol=0)
  for a, b in zip(loops["memory"].models(), loops["disk"].models()):
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
      torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
  saved = {p.name for p in (tmp_path / "disk").iterdir()}
  local = "protos" if method == "fedproto" else "logits"
  assert {"Client_0_model.pt", f"Client_1_{local}.pt", f"Server_{server}.pt"} <= saved


def test_a_config_of_another_method_is_named():
  with pytest.raises(SystemExit, match="FedProto or FD config"):
    htfl_loop.measure("htfl_cifar10_practical_htfe4_fml_quick", [], 1, None,
                      skip_torch=True)


@pytest.mark.skipif(real_data.real_data_dir() is None
                    or not (real_data.real_data_dir() / "cifar10.npz").is_file(),
                    reason=real_data.missing("cifar10.npz"))
def test_the_script_writes_the_side_by_side_record(tmp_path):
  config = "htfl_cifar10_practical_htfe4_fd_quick"
  threads = torch.get_num_threads()
  try:
    htfl_loop.main(["--config", config, *(x for item in TINY for x in ("--set", item)),
                    "--rounds", "1", "--torch-threads", "1", "--disk-dir", str(tmp_path),
                    "--out-dir", str(tmp_path)])
  finally:
    torch.set_num_threads(threads)
  name = f"htfl_loop__{config}-custom__cpu{os.cpu_count()}.json"
  report = json.loads((tmp_path / name).read_text())
  assert report["header"]["commit"] and report["header"]["device"]
  assert report["method"] == "fd" and report["num_clients"] == 2
  assert report["parameters"]["library"] == report["parameters"]["torch"]
  steps = report["sgd_steps_per_round"]
  assert steps == sum(-(-n // 10) for n in report["client_train_sizes"])
  assert report["library_slot_steps_per_round"] >= steps
  steady = report["steady_round_secs"]
  assert set(steady) == {"library", "torch_memory", "torch_disk"}
  for variant in htfl_loop.VARIANTS:
    ratio = report["library_vs_htflib_loop"][variant]["steady_round"]
    assert ratio == pytest.approx(steady[f"torch_{variant}"] / steady["library"])
    assert report["torch"][variant]["steady_round_all"]
  assert report["torch"]["disk"]["disk_bytes"] > 0
  assert report["engine"]["compile_secs"] > 0 and report["machine"]["torch_threads"] == 1
  assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # the disk folder is removed

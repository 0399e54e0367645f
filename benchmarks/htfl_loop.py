"""FedProto and FD: the library's round beside a PyTorch loop run the way HtFLlib runs it.

    pip install torch   # not a dependency of the library; without it the script says so
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 FEDJAX_HET_DATA_DIR=DATA python benchmarks/htfl_loop.py \
        --rounds 3 --out-dir benchmarks/results

`--config` (repeatable; default: `htfl_cifar10_practical_htfe4_fedproto` and `..._fd`, their
`_quick` variants where torch sees no GPU) with `--set field=value` overrides as every script
here. For each config, in ONE process and on the same device (cuda where torch sees one,
else the CPU):

1. library: the round built and timed as `benchmarks/first_round.py` does (its `_measure`:
   `Experiment(config)`, the jitted init, trace / lower / compile of `run_rounds`, the first
   round, then the median of `--rounds` steady rounds). The round is the local phase of all
   20 clients (each architecture group vmapped, the groups in one program) and the server's
   aggregation; no evaluation.
2. torch, HtFLlib's loop (`HtFLlibLoop`) on the same clients' training images and labels
   (the scenario the library builds, normalised with its statistics, on the device): the
   server's round (serverproto.py `FedProto.train`, serverfd.py `FD.train`) trains the
   clients one after another in a Python loop, then aggregates (`receive_protos` /
   `receive_logits`, `proto_aggregation`: per class the plain mean over the clients holding
   it, summed tensor by tensor). A client's `train` (clientproto.py, clientfd.py):
   a new `torch.optim.SGD(lr)` every round, one local epoch of batches of 10; per batch
   * FedProto: `rep = model.base(x)`, `output = model.head(rep)`, CE, and where global
     prototypes exist lambda * MSE(rep, target), the target a detached deep copy of `rep`
     whose rows of classes with a global prototype are overwritten row by row (each row's
     label read to the host with `.item()`);
   * FD: `output = model(x)`, CE, and where global logits exist lambda * CE(output, t) with
     t the detached deep copy of `output`, rows overwritten by the class's global logits
     (raw logits as a soft target, as `nn.CrossEntropyLoss` with a float target);
   then every row's detached feature (FedProto) or logit (FD) appended to its class's list
   (one `.item()` per row again), the step; after the epoch each class's list summed
   tensor by tensor into its mean (`agg_func`).
   Two variants:
   * "memory": the client models, local and global statistics stay in Python objects;
   * "disk": HtFLlib's per-client round trip: each client's `train` starts with
     `load_item` of its model and of the server's global statistics and ends with
     `save_item` of its model and its local statistics; the server loads every client's
     statistics and saves the global ones (clientbase.py `save_item` = `torch.save` of the
     whole object, `load_item` = `torch.load`, here with `weights_only=False`, what it
     meant before torch 2.6 made `weights_only=True` the default), into a temporary folder
     (`--disk-dir`, default one under the system's temp directory).
   Each variant: build (models, and for "disk" their first save, as HtFLlib's `Client`
   constructor does), the first round timed alone (allocator and cuDNN warm-up), then the
   median of `--rounds` rounds.
3. `library_vs_htflib_loop`: torch's steady round over the library's, per variant; the
   library's first round with its trace, lower and compile, and the rounds after which it
   is ahead in total (`rounds_to_break_even`).

`--torch-threads N` sets torch's CPU threads (default: torch's own, one per core). On a CPU
that other processes share, one thread is the faster choice (a GoogLeNet step at width 1/8
and batch 10 took 0.17 s with 1 thread and 1.3-2.2 s with 2 on a 2-core CPU running other
jobs: OpenMP's threads wait for each other); the library's XLA:CPU thread pool is left as it is.

Models: BaseHeadSplit (HtFLlib models.py) on the library's backbones at the config's width,
built layer for layer as `fedjax_het.models` builds them: HtFLlib's 4-layer CNN (FedAvgCNN,
features after fc1 + ReLU), the CIFAR GoogLeNet (kuangliu/pytorch-cifar layout,
`models.googlenet.GOOGLENET_LAYOUT`), MobileNetV2 and ResNet-18 (`pytorch_reference.py`'s
twins of the library's); `base` = the backbone to its globally pooled features then
`nn.AdaptiveAvgPool1d(htfl.feature_dim)`, `head` = `Linear(feature_dim, C)`. The parameter
counts of both sides are printed and reported (`parameters`; equal, tests/
test_benchmarks_htfl_loop.py); the initial values differ (torch's own initialisers).

Same work per round on both sides: every client trains ceil(n_k / 10) SGD steps of its
n_k rows per epoch (the library's batching, a smaller last batch; `sgd_steps_per_round`).
Deviations from HtFLlib's loop, all in its favour or neutral for time:
  * no DataLoader: the client's images live on the device as one tensor and a batch is an
    index gather of a fresh permutation (HtFLlib re-reads each client's `.npz` every round,
    `read_client_data`, and copies each batch to the device; its loader has `shuffle=False,
    drop_last=True`: floor(n_k / 10) steps, at most one fewer per client);
  * no evaluation, no `train_metrics`, no printing and no `Budget` bookkeeping (HtFLlib
    evaluates every client before every round, `-eg 1`);
  * the backbones are the library's CIFAR variants (HtFLlib runs torchvision's ImageNet
    GoogLeNet and ResNet-18 and its ImageNet MobileNetV2 on 32x32 images).

References: TsingZ0/HtFLlib system/flcore/servers/serverproto.py, serverfd.py,
clients/clientproto.py, clientfd.py, clientbase.py (`save_item`, `load_item`,
`load_train_data`), trainmodel/models.py (`BaseHeadSplit`, `FedAvgCNN`), system/main.py
(HtFE-img-4); Y. Tan et al., FedProto, AAAI 2022 (Eq. 5, 6, 8); E. Jeong et al., FD,
arXiv:1811.11479.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import timing  # noqa: E402 (benchmarks/timing.py, beside this script; starts no JAX backend)

try:  # optional: only the reference loop needs it (not a dependency of the library)
  import torch
  from torch import nn
except ImportError as _error:
  torch = nn = None
  _TORCH_MISSING = str(_error)

METHODS = ("fedproto", "fd")
VARIANTS = ("memory", "disk")
DEFAULT_CONFIG = "htfl_cifar10_practical_htfe4_{method}"


def _script(name: str):
  """benchmarks/<name>.py as a module (registered in sys.modules: pickles name its classes)."""
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def import_torch():
  """torch, or SystemExit with one line saying how to get it (the library does not need it)."""
  if torch is None:
    raise SystemExit(f"htfl_loop.py: the reference loop needs PyTorch, which is not installed "
                     f"({_TORCH_MISSING}); `pip install torch`, or pass --skip-torch to time "
                     f"the library alone.")
  return torch


# ----------------------------------------------------------------------------
# BaseHeadSplit on the library's backbones (module-level classes: `torch.save` of a whole
# model pickles them by name).
# ----------------------------------------------------------------------------

_Module = nn.Module if nn is not None else object


class GlobalMean(_Module):
  """Global average pooling, (B, C, H, W) -> (B, C)."""

  def forward(self, x):
    return x.mean(dim=(2, 3))


def _conv_bn_relu(cin: int, cout: int, kernel: int):
  """`models.googlenet.ConvBNReLU`: conv (with bias, padding (k - 1) // 2) + BN + ReLU."""
  return nn.Sequential(nn.Conv2d(cin, cout, kernel, 1, (kernel - 1) // 2),
                       nn.BatchNorm2d(cout), nn.ReLU())


class Inception(_Module):
  """`models.googlenet.Inception`: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 -> 3x3; max-pool -> 1x1."""

  def __init__(self, cin, n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes):
    super().__init__()
    self.b1 = _conv_bn_relu(cin, n1x1, 1)
    self.b2 = nn.Sequential(_conv_bn_relu(cin, n3x3red, 1), _conv_bn_relu(n3x3red, n3x3, 3))
    self.b3 = nn.Sequential(_conv_bn_relu(cin, n5x5red, 1), _conv_bn_relu(n5x5red, n5x5, 3),
                            _conv_bn_relu(n5x5, n5x5, 3))
    self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn_relu(cin, pool_planes, 1))
    self.out_channels = n1x1 + n3x3 + n5x5 + pool_planes

  def forward(self, x):
    return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)


class SplitModel(_Module):
  """HtFLlib's `BaseHeadSplit`: `base` (backbone to pooled features), `head`; forward =
  head(base(x))."""

  def __init__(self, base, head):
    super().__init__()
    self.base, self.head = base, head

  def forward(self, x):
    return self.head(self.base(x))


def build_model(arch: str, num_classes: int, *, width: float, feature_dim: int) -> SplitModel:
  """HtFLlib's `BaseHeadSplit` (`base` to `feature_dim` features, `head` Linear) on the torch
  twin of the library's `arch` (module docstring); `feature_dim` 0 keeps the backbone's own."""
  import_torch()
  from fedjax_het.models.googlenet import GOOGLENET_LAYOUT  # noqa: PLC0415
  from fedjax_het.models.layers import scale_width  # noqa: PLC0415
  from fedjax_het.models.resnet import RESNET_STAGE_SIZES  # noqa: PLC0415
  if arch == "htfl_cnn":  # FedAvgCNN(dim=1600): features = fc1 + ReLU
    c1, c2, hidden = (scale_width(c, width) for c in (32, 64, 512))
    layers = [nn.Conv2d(3, c1, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(c1, c2, 5), nn.ReLU(),
              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(25 * c2, hidden), nn.ReLU()]
    own_dim = hidden
  elif arch == "googlenet":
    cin = scale_width(192, width)
    layers = [_conv_bn_relu(3, cin, 3)]
    for spec in GOOGLENET_LAYOUT:
      if spec[0] == "pool":
        layers.append(nn.MaxPool2d(3, 2, 1))
        continue
      layers.append(Inception(cin, *(scale_width(p, width) for p in spec[1:])))
      cin = layers[-1].out_channels
    layers.append(GlobalMean())
    own_dim = cin
  elif arch in RESNET_STAGE_SIZES or arch == "mobilenet_v2":
    ref = _script("pytorch_reference")
    twin = (ref.mobilenet_v2(num_classes, width) if arch == "mobilenet_v2"
            else ref.resnet(RESNET_STAGE_SIZES[arch], num_classes, width))
    layers, own_dim = [twin.trunk, GlobalMean()], twin.feature_dim
  else:
    raise ValueError(f"htfl_loop: no torch twin of architecture {arch!r}; valid names are "
                     f"('htfl_cnn', 'googlenet', 'mobilenet_v2', "
                     f"{', '.join(map(repr, RESNET_STAGE_SIZES))}).")
  dim = int(feature_dim) or own_dim
  if dim != own_dim:  # BaseHeadSplit's pooling (the library leaves out the identity)
    layers.append(nn.AdaptiveAvgPool1d(dim))
  return SplitModel(nn.Sequential(*layers), nn.Linear(dim, num_classes))


def count_parameters(model) -> int:
  return sum(p.numel() for p in model.parameters())


def library_parameters(config, num_classes: int) -> dict[str, int]:
  """{architecture: parameters} of the library's models as the config's method builds them
  (pooled to `htfl.feature_dim` by `models.with_feature_dim`)."""
  import jax  # noqa: PLC0415

  from fedjax_het import models  # noqa: PLC0415
  from fedjax_het.models.functional import count_parameters as count, init_variables  # noqa
  dim = int(config.htfl.feature_dim)
  out = {}
  for arch in dict.fromkeys(config.models.architectures):
    model = models.get_model(arch, num_classes, width=float(config.models.width))
    if dim:
      model = models.with_feature_dim(model, dim)
    shapes = jax.eval_shape(lambda key, m=model: init_variables(m, key), jax.random.key(0))
    out[arch] = count(shapes["params"])
  return out


# ----------------------------------------------------------------------------
# HtFLlib's round.
# ----------------------------------------------------------------------------


class HtFLlibLoop:
  """FedProto or FD run as HtFLlib runs a round (module docstring).

  Args:
    method: "fedproto" or "fd".
    clients: per client (images (n, 3, 32, 32) float32, labels (n,) int64) on `device`.
    architectures: per client.
    num_classes, width, feature_dim: as the config.
    lr, batch_size, epochs, lamda: the local SGD and the regulariser's weight.
    device: torch device.
    variant: "memory" or "disk".
    folder: the disk variant's folder (HtFLlib's `save_folder_name_full`).
    seed: seeds the models and the batch orders.
  """

  def __init__(self, method, clients, architectures, *, num_classes, width, feature_dim, lr,
               batch_size, epochs, lamda, device, variant="memory", folder=None, seed=0):
    if method not in METHODS:
      raise ValueError(f"HtFLlibLoop: method must be one of {METHODS}, got {method!r}.")
    if variant not in VARIANTS:
      raise ValueError(f"HtFLlibLoop: variant must be one of {VARIANTS}, got {variant!r}.")
    if variant == "disk" and not folder:
      raise ValueError("HtFLlibLoop: the disk variant needs a folder.")
    import_torch()
    self.method, self.clients, self.device = method, clients, device
    self.lr, self.batch_size, self.epochs, self.lamda = lr, batch_size, epochs, lamda
    self.variant, self.folder = variant, pathlib.Path(folder) if folder else None
    torch.manual_seed(seed)
    self.generator = torch.Generator(device=device).manual_seed(seed + 1)
    self.memory = {}
    for k, arch in enumerate(architectures):
      model = build_model(arch, num_classes, width=width, feature_dim=feature_dim).to(device)
      self._save(model, f"Client_{k}", "model")  # HtFLlib's Client constructor saves it
    self.ce = torch.nn.CrossEntropyLoss()
    self.mse = torch.nn.MSELoss()

  # HtFLlib's save_item / load_item, or the same objects kept in memory.
  def _save(self, item, role: str, name: str) -> None:
    if self.variant == "disk":
      self.folder.mkdir(parents=True, exist_ok=True)
      torch.save(item, self.folder / f"{role}_{name}.pt")
    else:
      self.memory[(role, name)] = item

  def _load(self, role: str, name: str):
    if self.variant == "disk":
      path = self.folder / f"{role}_{name}.pt"
      return torch.load(path, weights_only=False) if path.exists() else None
    return self.memory.get((role, name))

  def _class_means(self, lists: dict) -> dict:
    """`agg_func`: each class's list of tensors summed one by one, over its length."""
    means = {}
    for label, tensors in lists.items():
      total = 0 * tensors[0]
      for tensor in tensors:
        total = total + tensor
      means[label] = total / len(tensors)
    return means

  def _train_client(self, k: int) -> None:
    role = f"Client_{k}"
    model = self._load(role, "model")
    server_name = "global_protos" if self.method == "fedproto" else "global_logits"
    global_stats = self._load("Server", server_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=self.lr)
    model.train()
    images, labels = self.clients[k]
    collected = {}
    for _ in range(self.epochs):
      order = torch.randperm(labels.shape[0], device=self.device, generator=self.generator)
      for rows in order.split(self.batch_size):
        x, y = images[rows], labels[rows]
        if self.method == "fedproto":
          shared = model.base(x)  # the prototype space
          output = model.head(shared)
        else:
          output = model(x)
          shared = output  # FD collects and regularises the logits
        loss = self.ce(output, y)
        if global_stats is not None:
          target = shared.detach().clone()  # HtFLlib: copy.deepcopy(rep.detach())
          for row in range(y.shape[0]):
            label = y[row].item()
            if label in global_stats:
              target[row, :] = global_stats[label]
          extra = self.mse(target, shared) if self.method == "fedproto" else self.ce(output,
                                                                                    target)
          loss = loss + self.lamda * extra
        for row in range(y.shape[0]):
          collected.setdefault(y[row].item(), []).append(shared[row, :].detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    self._save(model, role, "model")
    self._save(self._class_means(collected), role,
               "protos" if self.method == "fedproto" else "logits")

  def _server(self) -> None:
    """`receive_protos` / `receive_logits`: every client's class means, per class the mean
    over the clients holding it (`proto_aggregation`), saved as the server's."""
    local_name = "protos" if self.method == "fedproto" else "logits"
    per_class = {}
    for k in range(len(self.clients)):
      for label, mean in self._load(f"Client_{k}", local_name).items():
        per_class.setdefault(label, []).append(mean)
    self._save(self._class_means(per_class), "Server",
               "global_protos" if self.method == "fedproto" else "global_logits")

  def run_round(self) -> None:
    """One round: every client trains in turn, then the server aggregates."""
    for k in range(len(self.clients)):
      self._train_client(k)
    self._server()
    if self.device.type == "cuda":
      torch.cuda.synchronize(self.device)

  def models(self) -> list:
    return [self._load(f"Client_{k}", "model") for k in range(len(self.clients))]


def client_tensors(scenario, device) -> list:
  """Each client's training split as (images NCHW float32 normalised with the scenario's
  private statistics, labels int64), on `device`."""
  import_torch()
  mean = torch.tensor(scenario.private_mean, dtype=torch.float32).view(1, 3, 1, 1)
  std = torch.tensor(scenario.private_std, dtype=torch.float32).view(1, 3, 1, 1)
  out = []
  for split in scenario.train:
    images = torch.from_numpy(split.images).permute(0, 3, 1, 2).float() / 255.0
    out.append((((images - mean) / std).contiguous().to(device),
                torch.from_numpy(split.labels.astype("int64")).to(device)))
  return out


def time_torch(make, rounds: int, device) -> dict:
  """Build, first round and the median of `rounds` rounds of the loop `make()` returns."""
  if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats(device)
  tick = time.perf_counter()
  loop = make()
  if device.type == "cuda":
    torch.cuda.synchronize(device)
  row = {"build_secs": time.perf_counter() - tick}
  tick = time.perf_counter()
  loop.run_round()
  row["first_round_secs"] = time.perf_counter() - tick
  print(f"[torch {loop.variant}] round 1: {row['first_round_secs']:.2f} s", flush=True)
  times = []
  for r in range(rounds):
    tick = time.perf_counter()
    loop.run_round()
    times.append(time.perf_counter() - tick)
    print(f"[torch {loop.variant}] round {r + 2}: {times[-1]:.2f} s", flush=True)
  row["steady_round_secs"] = statistics.median(times) if times else row["first_round_secs"]
  row["steady_round_all"] = times
  if device.type == "cuda":
    row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2.0 ** 30
  if loop.variant == "disk":
    row["disk_bytes"] = sum(p.stat().st_size for p in loop.folder.iterdir())
  return row


# ----------------------------------------------------------------------------
# The side-by-side runner.
# ----------------------------------------------------------------------------


def device_tag(device) -> str:
  """The result file's device part: "cpu<cores>", or the GPU's model ("h200", "a100")."""
  if device.type != "cuda":
    return f"cpu{os.cpu_count()}"
  name = torch.cuda.get_device_name(device)
  found = re.findall(r"\b([A-Z]+\d+[A-Za-z]*)\b", name)
  return found[0].lower() if found else "gpu"


def file_stem(config_name: str, overrides: list[str]) -> str:
  """`<config>` for the result's name, "-custom" added when fields are overridden."""
  return config_name + ("-custom" if overrides else "")


def measure(config_name: str, overrides: list[str], rounds: int, device, *,
            variants=VARIANTS, skip_torch: bool = False, disk_dir: str = "",
            seed: int = 0, write=lambda report: None) -> dict:
  """The report of one config (module docstring); `write(report)` after every phase."""
  first_round = _script("first_round")
  from fedjax_het.algorithms import htfl_common  # noqa: PLC0415
  from fedjax_het.experiment import build_scenario  # noqa: PLC0415

  config = first_round.load_config(config_name, overrides)
  method = config.algorithm
  if method not in METHODS:
    raise SystemExit(f"htfl_loop.py: --config must be a FedProto or FD config of "
                     f"fedjax_het/configs/htfl.py (algorithm one of {METHODS}), got "
                     f"{config_name!r} with algorithm {method!r}.")
  scenario = build_scenario(config)
  sizes = [len(split.labels) for split in scenario.train]
  batch, epochs = int(config.local.batch_size), int(config.local.epochs)
  archs = list(config.models.architectures)
  if len(archs) == 1:
    archs = archs * len(sizes)
  report = {"config": config_name, "overrides": overrides, "method": method, "rounds": rounds,
            "num_clients": len(sizes), "architectures": archs,
            "width": float(config.models.width),
            "feature_dim": int(config.htfl.feature_dim), "client_train_sizes": sizes,
            "local": {"optimizer": config.local.optimizer, "lr": float(config.local.lr),
                      "batch_size": batch, "epochs": epochs},
            "lamda": float(config[method].lamda),
            "sgd_steps_per_round": epochs * sum(math.ceil(n / batch) for n in sizes),
            "client_loop": htfl_common.client_loop(config),
            "library_slot_steps_per_round": (
                slot_steps(archs, sizes, batch, epochs)
                if htfl_common.client_loop(config) == "vmap"
                else epochs * sum(math.ceil(n / batch) for n in sizes)),
            "parameters": {"library": library_parameters(config, scenario.num_classes)}}
  report["engine"] = time_library(first_round, config_name, overrides, rounds, config)
  print("[library] " + ", ".join(f"{k} {v:.2f}" for k, v in report["engine"].items()
                                 if k.endswith("_secs") and isinstance(v, float)), flush=True)
  write(report)
  if skip_torch:
    return report
  clients = client_tensors(scenario, device)
  report["parameters"]["torch"] = {
      arch: count_parameters(build_model(arch, scenario.num_classes, width=report["width"],
                                         feature_dim=report["feature_dim"]))
      for arch in dict.fromkeys(archs)}
  print(f"[parameters] library {report['parameters']['library']}, "
        f"torch {report['parameters']['torch']}", flush=True)
  report["torch"] = {}
  for variant in variants:
    folder = None
    if variant == "disk":
      folder = pathlib.Path(tempfile.mkdtemp(prefix="htfl_loop_", dir=disk_dir or None))

    def make(variant=variant, folder=folder):
      return HtFLlibLoop(method, clients, archs, num_classes=scenario.num_classes,
                         width=report["width"], feature_dim=report["feature_dim"],
                         lr=float(config.local.lr), batch_size=batch, epochs=epochs,
                         lamda=report["lamda"], device=device, variant=variant,
                         folder=folder, seed=seed)

    try:
      report["torch"][variant] = time_torch(make, rounds, device)
    finally:
      if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"[torch {variant}] " + ", ".join(
        f"{k} {v:.2f}" for k, v in report["torch"][variant].items()
        if k.endswith("_secs")), flush=True)
    write(report)
  engine = report["engine"]
  steady = engine["steady_round_per_round_secs"]
  start = engine["trace_lower_secs"] + engine["compile_secs"] + engine["first_round_secs"]
  report["steady_round_secs"] = {"library": steady, **{
      f"torch_{v}": row["steady_round_secs"] for v, row in report["torch"].items()}}
  report["library_vs_htflib_loop"] = {}
  for variant, row in report["torch"].items():
    gain = row["steady_round_secs"] - steady
    report["library_vs_htflib_loop"][variant] = {
        "steady_round": row["steady_round_secs"] / steady,
        "first_round_with_compile": row["first_round_secs"] / start,
        # rounds n from which the library's n rounds (compile included) take less time than
        # torch's n: start + (n - 1) steady <= first + (n - 1) torch steady
        "rounds_to_break_even": (1 + max(0, math.ceil((start - row["first_round_secs"])
                                                      / gain))) if gain > 0 else None}
  write(report)
  return report


def slot_steps(archs: list[str], sizes: list[int], batch: int, epochs: int) -> int:
  """Client steps the library's round computes with `htfl.client_loop` "vmap": a group (the
  clients of one architecture) runs as many vmapped steps as its largest client needs, every
  client in each (a client's steps past its data are computed and masked, `engine.local`).
  With "map" (a CPU's default) each client runs only its own steps."""
  groups = {}
  for arch, n in zip(archs, sizes):
    groups.setdefault(arch, []).append(n)
  return epochs * sum(len(ns) * math.ceil(max(ns) / batch) for ns in groups.values())


def time_library(first_round, config_name, overrides, rounds, config) -> dict:
  """first_round.py's `_measure` (in this process), and its steady figure per round."""
  # `_measure` counts its import_secs and start_to_round1_end_secs from first_round.START:
  # from this call, so that a later config of the run does not count the configs before it.
  first_round.START = time.perf_counter()
  row = first_round._measure(config_name, overrides, rounds)  # pylint: disable=protected-access
  row["steady_round_per_round_secs"] = row["steady_round_secs"] / int(config.rounds_per_call)
  return row


def _machine(device) -> dict:
  import jax  # noqa: PLC0415
  info = {"python": platform.python_version(), "platform": platform.platform(),
          "cpu_count": os.cpu_count(), "jax": jax.__version__, "jax_backend":
          jax.default_backend(), "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", "")}
  if device is not None:
    info.update(torch=torch.__version__, torch_device=str(device),
                torch_threads=torch.get_num_threads())
    if device.type == "cuda":
      info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                  cudnn=torch.backends.cudnn.version())
  return info


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", action="append", default=[],
                      help="repeatable (default: the HtFE4 CIFAR-10 FedProto and FD configs, "
                           "their _quick variants without a GPU)")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--rounds", type=int, default=3, help="steady rounds timed")
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help="comma-separated torch variants: memory, disk")
  parser.add_argument("--disk-dir", default="", help="where the disk variant's folder goes")
  parser.add_argument("--skip-torch", action="store_true", help="time the library alone")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--torch-threads", type=int, default=0,
                      help="torch's CPU threads (default 0: torch's own default, the cores)")
  parser.add_argument("--out-dir", default="",
                      help="writes <DIR>/htfl_loop__<config>__<device>.json per config")
  args = parser.parse_args(argv)
  variants = [v for v in args.variants.split(",") if v]
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    parser.error(f"--variants: unknown {unknown}; valid: {VARIANTS}")
  if args.rounds < 1:
    parser.error(f"--rounds: at least 1, got {args.rounds}")
  if not args.skip_torch:
    import_torch()
  configs = args.config or [DEFAULT_CONFIG.format(method=m) + (
      "" if torch is not None and torch.cuda.is_available() else "_quick") for m in METHODS]
  # As experiments/train.py, before JAX starts: XLA:CPU's scheduler and Triton GEMM from the
  # config (the first config's; the defaults are those of every config here).
  from fedjax_het.runtime import xla_cpu, xla_gpu  # noqa: PLC0415 (starts no JAX backend)
  first = _script("first_round").load_config(configs[0], args.set)
  scheduler = xla_cpu.set_xla_cpu_scheduler(first.get("xla_cpu_scheduler", "auto"))
  xla_gpu.set_xla_gpu_triton_gemm(first.get("xla_gpu_triton_gemm", "auto"))
  if torch is not None and torch.cuda.is_available():  # both frameworks share the GPU
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  device = (torch.device("cuda" if torch.cuda.is_available() else "cpu")
            if not args.skip_torch else None)
  on_gpu = device is not None and device.type == "cuda"
  if device is not None and args.torch_threads > 0:
    torch.set_num_threads(args.torch_threads)
  tag = device_tag(device) if device is not None else None
  reports = {}
  for name in configs:
    path = None
    if args.out_dir:
      path = pathlib.Path(args.out_dir) / f"htfl_loop__{file_stem(name, args.set)}__" \
          f"{tag or 'library_only'}.json"

    def write(report, path=path):
      if path is not None:
        report["machine"] = _machine(device)
        if report["machine"]["jax_backend"] == "cpu":
          report["machine"]["xla_cpu_scheduler"] = scheduler
        described = (torch.cuda.get_device_name(device) if on_gpu
                     else timing.cpu_description() if device is not None
                     else timing.device_description())
        timing.write_result(path, report, device=described, indent=2)

    report = measure(name, args.set, args.rounds, device, variants=variants,
                     skip_torch=args.skip_torch, disk_dir=args.disk_dir, seed=args.seed,
                     write=write)
    report["process_max_rss_gib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                     / 2.0 ** 20)
    write(report)
    reports[name] = report
    print(json.dumps({"config": name, **{k: report[k] for k in (
        "steady_round_secs", "library_vs_htflib_loop") if k in report}}, indent=2), flush=True)
  return reports


if __name__ == "__main__":
  main()

"""The authors' FCCL+ round in PyTorch, timed side by side with the library's JAX engine.

    pip install -e '.[bench]'   # torch
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/pytorch_reference.py \
        --config=digits_fcclplus_quick --rounds 3 \
        --out benchmarks/results/pytorch_reference__digits_fcclplus_quick__<device>.json

In ONE process, on the same device (cuda if torch sees one, else the CPU) and
the same models and sizes (any config name `experiments/train.py` takes, with
`--set field=value` overrides):

1. engine: the library's round built and timed exactly as
   `benchmarks/first_round.py` does (its `_measure` is imported and run):
   `Experiment(config)`, the jitted init, trace / lower / compile of
   `run_rounds`, the first (compiling) round, then the median of `--rounds`
   steady-state rounds. End to end = init + trace + lower + compile + first
   round + (num_rounds - 1) steady rounds (data building and the evaluation's
   compile are reported apart and left out, as the torch side has neither).
2. torch, two flavours of the same round (`TorchFCCLPlus`):
   * "authors": the loop of the authors' public code (WenkeHuang/FCCL,
     fccl+/models/fcclplus.py `col_update` / `_train_net`): participants one
     after another; per public batch every participant runs `net(images)` for
     the logits and a SECOND forward `net.features(images)` for the features,
     the targets are the means of the detached logits / similarity logits, then
     each participant gets a NEW `torch.optim.Adam` for that batch and takes
     one step of FCCM + omega * FISL (FCCL+ Eq. 1-6), reading both losses to
     Python with `.item()`; then each participant's local phase: `local.epochs`
     epochs of CE + FNTD (Eq. 13-14) with one Adam(local lr, weight decay) per
     round, the frozen previous-round model as teacher (train mode, as the
     code's deep copy of a train-mode net), `.item()` of both losses every step
     (the code's tqdm description); finally the models are copied to the
     teachers.
   * "tuned": the same math without per-step host syncs: one forward returns
     features and logits, the public losses of all participants are summed and
     backpropagated once (each depends only on its own participant's
     parameters, so the gradients are the same), losses stay on the device and
     are read once per round; `cudnn.benchmark` on (off for "authors", set at
     each runner's construction, so flavours timed in one process stay apart).
   Each flavour: the first round (cuDNN / allocator warm-up) timed alone, then
   the median of `--rounds` rounds; end to end = model build + first round +
   (num_rounds - 1) steady rounds.
3. `engine_vs_pytorch_speedup` = torch time / engine time, steady state and end
   to end, per flavour, with the machine, versions, torch's peak memory
   (`torch.cuda.max_memory_allocated`) and the engine's XLA memory estimate
   (`compiled.memory_analysis()`, as first_round.py reports it).

Data are random tensors of the config's shapes (private sizes per domain, the
public size and batch, the local batch, the epochs); the time of a round
depends only on the shapes. Sizes are read from the config the engine uses:
`scenario.private_sizes` over FCCL+ Table V, `scenario.public_size`,
`collaborative.batch_size` / `.epochs`, `local.batch_size` / `.epochs`,
`models.architectures` / `.width`.

Deviations from the authors' loop (all in their favour or neutral for time):
  * no DataLoader, no augmentation, no host-to-device copies: the random data
    live on the device and batches are index gathers of a fresh permutation;
  * public batches as the engine draws them: ceil(N0 / B0) full batches per
    epoch (the last one filled from the start of the permutation); local
    batches as a DataLoader with drop_last=False (a smaller last batch);
  * the EfficientNet-B0 has no dead expansion conv/BN in its first block (the
    torch code builds and never uses them, 1,088 parameters at width 1), so
    the parameter counts equal the library's;
  * FNTD takes the non-target entries of `log_softmax` instead of
    `torch.log` of the non-target `softmax` entries: equal where the code's
    form is finite, and finite where its probabilities underflow;
  * the "tuned" flavour standardises FCCM's columns with sqrt(var + 1e-6) (the
    library's epsilon); "authors" divides by `std` as the code does;
  * logging, evaluation and checkpointing of the code are not run.

References: W. Huang, M. Ye, Z. Shi, B. Du. Generalizable Heterogeneous
Federated Cross-Correlation and Instance Similarity Learning. TPAMI (FCCL+),
Eq. 1-6 (FCCM, FISL), Eq. 13-14 (FNTD, local objective), Alg. 1.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import platform
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

if torch.cuda.is_available():  # before jax creates its client: both frameworks share the GPU
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# pylint: disable=wrong-import-position
from fedjax_het.data.scenarios import SCENARIOS  # noqa: E402
from fedjax_het.runtime import xla_cpu  # noqa: E402
from fedjax_het.losses.fccl import (FCCM_EPS, FCCM_OFF_DIAGONAL_WEIGHT,  # noqa: E402
                                    FISL_TEMPERATURE)
from fedjax_het.models.efficientnet import EFFICIENTNET_B0_STAGES, SE_RATIO  # noqa: E402
from fedjax_het.models.layers import divisible_width, scale_width  # noqa: E402
from fedjax_het.models.mobilenet import LAST_CHANNELS, MOBILENET_V2_STAGES  # noqa: E402
from fedjax_het.models.resnet import RESNET_STAGE_SIZES  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import timing  # noqa: E402 (benchmarks/timing.py, beside this script; starts no JAX backend)

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAVOURS = ("authors", "tuned")
_RESNET_CHANNELS = (64, 128, 256, 512)
_RESNET_STRIDES = (1, 2, 2, 2)


def _first_round_module():
  """benchmarks/first_round.py as a module (its helpers are reused, not copied)."""
  if "first_round" in sys.modules:
    return sys.modules["first_round"]
  spec = importlib.util.spec_from_file_location("first_round", REPO / "benchmarks/first_round.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules["first_round"] = module
  spec.loader.exec_module(module)
  return module


# ----------------------------------------------------------------------------
# Backbones (layer for layer the library's fedjax_het.models, NCHW).
# ----------------------------------------------------------------------------


def _bn(channels: int) -> nn.BatchNorm2d:
  return nn.BatchNorm2d(channels)  # torch defaults: momentum 0.1, eps 1e-5, as layers.batch_norm


class _Classifier(nn.Module):
  """trunk -> global average pooling (-> dropout) -> Linear head, as `models.base.Classifier`.

  `forward(x)` returns the logits (the authors' `net(images)`), `features(x)`
  the pooled features (their `net.features(images)`, a second forward pass),
  `forward_both(x)` (features, logits) from one pass.
  """

  def __init__(self, trunk: nn.Module, feature_dim: int, num_classes: int,
               dropout_rate: float = 0.0):
    super().__init__()
    self.trunk = trunk
    self.feature_dim = feature_dim
    self.dropout = nn.Dropout(dropout_rate) if dropout_rate > 0 else nn.Identity()
    self.head = nn.Linear(feature_dim, num_classes)

  def features(self, x: torch.Tensor) -> torch.Tensor:
    return self.dropout(self.trunk(x).mean(dim=(2, 3)))

  def forward_both(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    features = self.features(x)
    return features, self.head(features)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.head(self.features(x))


class BasicBlock(nn.Module):
  """`models.resnet.BasicBlock`: conv3x3(s)+BN+ReLU, conv3x3+BN, shortcut, ReLU."""

  def __init__(self, cin: int, cout: int, stride: int):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = _bn(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = _bn(cout)
    self.shortcut = nn.Sequential()
    if stride != 1 or cin != cout:
      self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = F.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    return F.relu(y + self.shortcut(x))


def resnet(stage_sizes, num_classes: int, width: float = 1.0) -> _Classifier:
  """`models.resnet.resnet`: CIFAR ResNet, stem conv3x3 s1, stages 64/128/256/512 s 1/2/2/2."""
  stem = scale_width(64, width)
  layers = [nn.Conv2d(3, stem, 3, 1, 1, bias=False), _bn(stem), nn.ReLU()]
  cin = stem
  for blocks, channels, stride in zip(stage_sizes, _RESNET_CHANNELS, _RESNET_STRIDES):
    cout = scale_width(channels, width)
    for b in range(blocks):
      layers.append(BasicBlock(cin, cout, stride if b == 0 else 1))
      cin = cout
  return _Classifier(nn.Sequential(*layers), cin, num_classes)


class MBConv(nn.Module):
  """`models.efficientnet.MBConv`: expand (t > 1) -> depthwise -> SE -> project (+ skip)."""

  def __init__(self, cin: int, cout: int, kernel: int, stride: int, expansion: int,
               se_channels: int):
    super().__init__()
    channels = expansion * cin
    self.expand = None
    if expansion != 1:
      self.expand = nn.Sequential(nn.Conv2d(cin, channels, 1, bias=False), _bn(channels),
                                  nn.SiLU())
    self.depthwise = nn.Sequential(
        nn.Conv2d(channels, channels, kernel, stride, kernel // 2, groups=channels, bias=False),
        _bn(channels), nn.SiLU())
    self.se_reduce = nn.Conv2d(channels, se_channels, 1)
    self.se_expand = nn.Conv2d(se_channels, channels, 1)
    self.project = nn.Sequential(nn.Conv2d(channels, cout, 1, bias=False), _bn(cout))
    self.skip = stride == 1 and cin == cout

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = x if self.expand is None else self.expand(x)
    y = self.depthwise(y)
    s = F.silu(self.se_reduce(y.mean(dim=(2, 3), keepdim=True)))
    y = y * torch.sigmoid(self.se_expand(s))
    y = self.project(y)
    return y + x if self.skip else y


def efficientnet_b0(num_classes: int, width: float = 1.0,
                    dropout_rate: float = 0.2) -> _Classifier:
  """`models.efficientnet.efficientnet_b0` (CIFAR variant, no 1280 head conv)."""
  stem = divisible_width(32, width)
  layers = [nn.Conv2d(3, stem, 3, 1, 1, bias=False), _bn(stem), nn.SiLU()]
  cin = stem
  for expansion, channels, blocks, kernel, stride in EFFICIENTNET_B0_STAGES:
    cout = divisible_width(channels, width)
    for b in range(blocks):
      layers.append(MBConv(cin, cout, kernel, stride if b == 0 else 1, expansion,
                           max(1, int(cin * SE_RATIO))))
      cin = cout
  return _Classifier(nn.Sequential(*layers), cin, num_classes, dropout_rate)


class InvertedResidual(nn.Module):
  """`models.mobilenet.InvertedResidual`: expand 1x1 (always) -> dw 3x3 -> project (+ skip)."""

  def __init__(self, cin: int, cout: int, expansion: int, stride: int):
    super().__init__()
    planes = expansion * cin
    self.body = nn.Sequential(
        nn.Conv2d(cin, planes, 1, bias=False), _bn(planes), nn.ReLU(),
        nn.Conv2d(planes, planes, 3, stride, 1, groups=planes, bias=False), _bn(planes),
        nn.ReLU(),
        nn.Conv2d(planes, cout, 1, bias=False), _bn(cout))
    self.stride = stride
    self.shortcut = nn.Sequential()
    if stride == 1 and cin != cout:
      self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), _bn(cout))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = self.body(x)
    return y if self.stride != 1 else y + self.shortcut(x)


def mobilenet_v2(num_classes: int, width: float = 1.0) -> _Classifier:
  """`models.mobilenet.mobilenet_v2` (CIFAR variant, 1x1 conv to 1280 * width)."""
  stem = divisible_width(32, width)
  layers = [nn.Conv2d(3, stem, 3, 1, 1, bias=False), _bn(stem), nn.ReLU()]
  cin = stem
  for expansion, channels, blocks, stride in MOBILENET_V2_STAGES:
    cout = divisible_width(channels, width)
    for b in range(blocks):
      layers.append(InvertedResidual(cin, cout, expansion, stride if b == 0 else 1))
      cin = cout
  last = divisible_width(LAST_CHANNELS, width)
  layers += [nn.Conv2d(cin, last, 1, bias=False), _bn(last), nn.ReLU()]
  return _Classifier(nn.Sequential(*layers), last, num_classes)


def get_model(name: str, num_classes: int, *, width: float = 1.0) -> _Classifier:
  """The torch twin of `fedjax_het.models.get_model` for the FCCL+ backbones."""
  if name in RESNET_STAGE_SIZES:
    return resnet(RESNET_STAGE_SIZES[name], num_classes, width)
  if name == "efficientnet_b0":
    return efficientnet_b0(num_classes, width)
  if name == "mobilenet_v2":
    return mobilenet_v2(num_classes, width)
  raise ValueError(f"pytorch_reference.get_model: unknown model {name!r}; valid names are "
                   f"{tuple(RESNET_STAGE_SIZES) + ('efficientnet_b0', 'mobilenet_v2')}.")


def count_parameters(model: nn.Module) -> int:
  return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------
# Losses (the authors' code; equal to fedjax_het.losses, tests/test_pytorch_reference.py).
# ----------------------------------------------------------------------------


def _off_diagonal(square: torch.Tensor) -> torch.Tensor:
  n = square.shape[0]
  return square.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def fccm_loss(logits: torch.Tensor, target_logits: torch.Tensor, *,
              off_diagonal_weight: float = FCCM_OFF_DIAGONAL_WEIGHT,
              eps: float = FCCM_EPS) -> torch.Tensor:
  """FCCM, FCCL+ Eq. 1-2: sum_u (1 - M_uu)^2 + lambda sum_{u!=v} (1 + M_uv)^2.

  Columns standardised over the batch with the unbiased variance, divided by
  sqrt(var + eps) (eps=0: the code's `(z - z.mean(0)) / z.std(0)`), M = Z^T Zbar / B.
  `target_logits` is detached.
  """
  target = target_logits.detach()
  z = (logits - logits.mean(0)) / torch.sqrt(logits.var(0, unbiased=True) + eps)
  t = (target - target.mean(0)) / torch.sqrt(target.var(0, unbiased=True) + eps)
  c = z.T @ t / logits.shape[0]
  return ((torch.diagonal(c) - 1.0) ** 2).sum() + off_diagonal_weight * (
      (_off_diagonal(c) + 1.0) ** 2).sum()


def similarity_logits(features: torch.Tensor, *,
                      temperature: float = FISL_TEMPERATURE) -> torch.Tensor:
  """FCCL+ Eq. 3-4: S = H H^T / mu with H = L2-normalised features, diagonal dropped (B, B-1)."""
  h = F.normalize(features, dim=1)
  sim = h @ h.T
  b = sim.shape[0]
  return sim.flatten()[1:].view(b - 1, b + 1)[:, :-1].reshape(b, b - 1) / temperature


def _similarity_logits_authors(features: torch.Tensor, temperature: float) -> torch.Tensor:
  """The code's `_calculate_isd_sim`: the diagonal removed by a scattered boolean mask."""
  h = F.normalize(features, dim=1)
  sim = h @ h.T
  mask = torch.scatter(torch.ones_like(sim), 1,
                       torch.arange(sim.shape[0], device=sim.device).view(-1, 1), 0)
  return sim[mask.bool()].view(sim.shape[0], -1) / temperature


def fisl_loss(similarity: torch.Tensor, target_similarity: torch.Tensor) -> torch.Tensor:
  """FISL, FCCL+ Eq. 5: KL(softmax(S_bar) || softmax(S_i)) per row, batch mean."""
  return F.kl_div(F.log_softmax(similarity, dim=1),
                  F.softmax(target_similarity.detach(), dim=1), reduction="batchmean")


def fntd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, *,
              temperature: float) -> torch.Tensor:
  """FNTD, FCCL+ Eq. 13: tau^2 KL over the non-target entries of softmax(z / tau) (all C classes).

  The C-1 remaining probabilities are not renormalised (as the code); batch mean.
  """
  batch, num_classes = logits.shape
  non_target = torch.ones_like(logits, dtype=torch.bool).scatter_(1, labels.view(-1, 1), False)
  student = F.log_softmax(logits / temperature, dim=1)[non_target].view(batch, num_classes - 1)
  teacher = F.softmax(teacher_logits.detach() / temperature, dim=1)[non_target].view(
      batch, num_classes - 1)
  return temperature ** 2 * F.kl_div(student, teacher, reduction="batchmean")


# ----------------------------------------------------------------------------
# The round.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoundSizes:
  """Everything of a config that sets the shapes and hyper-parameters of a round."""
  architectures: tuple[str, ...]
  private_sizes: tuple[int, ...]
  num_classes: int
  width: float
  public_size: int
  public_batch: int
  public_epochs: int
  local_batch: int
  local_epochs: int
  public_lr: float
  local_lr: float
  weight_decay: float
  lr_decay: float
  num_rounds: int
  off_diagonal_weight: float
  fisl_weight: float
  fisl_temperature: float
  fntd_temperature: float
  average_parameters: bool


def sizes_from_config(config) -> RoundSizes:
  """The `RoundSizes` of an FCCL+ config (as `Experiment` reads it)."""
  if config.algorithm != "fcclplus":
    raise ValueError(f"pytorch_reference: only FCCL+ configs, got algorithm "
                     f"{config.algorithm!r}.")
  name = config.scenario.name
  if name not in SCENARIOS:
    raise ValueError(f"pytorch_reference: scenario must be one of {tuple(SCENARIOS)}, got "
                     f"{name!r}.")
  spec = SCENARIOS[name]
  domains = tuple(config.scenario.domains) or spec.domains
  sizes = {**spec.private_sizes, **dict(config.scenario.private_sizes)}
  archs = tuple(config.models.architectures)
  if len(archs) == 1:
    archs = archs * len(domains)
  if len(archs) != len(domains):
    raise ValueError(f"pytorch_reference: {len(archs)} architectures for {len(domains)} "
                     f"domains {domains}.")
  public = int(config.scenario.public_size)
  cfg, col, loc = config.fcclplus, config.collaborative, config.local
  return RoundSizes(
      architectures=archs, private_sizes=tuple(int(sizes[d]) for d in domains),
      num_classes=spec.num_classes, width=float(config.models.width), public_size=public,
      public_batch=min(int(col.batch_size), max(public, 2)), public_epochs=int(col.epochs),
      local_batch=int(loc.batch_size), local_epochs=int(loc.epochs), public_lr=float(col.lr),
      local_lr=float(loc.lr), weight_decay=float(loc.weight_decay),
      lr_decay=float(loc.lr_decay), num_rounds=int(config.num_rounds),
      off_diagonal_weight=float(cfg.off_diagonal_weight), fisl_weight=float(cfg.fisl_weight),
      fisl_temperature=float(cfg.fisl_temperature),
      fntd_temperature=float(cfg.fntd_temperature),
      average_parameters=bool(cfg.average_parameters))


def _sync(device: torch.device) -> None:
  if device.type == "cuda":
    torch.cuda.synchronize(device)


class TorchFCCLPlus:
  """FCCL+ (Alg. 1) on random data of the config's shapes, as the authors' code runs it.

  Args:
    sizes: `RoundSizes`.
    device: torch device.
    flavour: "authors" (the code's loop, `.item()` every step, two forwards
      per public batch) or "tuned" (one forward, no per-step syncs); see the
      module docstring.
    seed: seeds the models and the random data.
  """

  def __init__(self, sizes: RoundSizes, device: torch.device, flavour: str = "authors",
               seed: int = 0):
    if flavour not in FLAVOURS:
      raise ValueError(f"TorchFCCLPlus: flavour must be one of {FLAVOURS}, got {flavour!r}.")
    self.sizes, self.device, self.flavour = sizes, device, flavour
    torch.manual_seed(seed)
    self.nets = [get_model(a, sizes.num_classes, width=sizes.width).to(device).train()
                 for a in sizes.architectures]
    if sizes.average_parameters:  # the code's `ini`: every participant starts from net 0
      for net in self.nets[1:]:
        net.load_state_dict(self.nets[0].state_dict())
    self.prev_nets = [copy.deepcopy(net) for net in self.nets]  # theta^{e-1}: train mode
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    self.private = [
        (torch.randn(n, 3, 32, 32, generator=gen).to(device),
         torch.randint(0, sizes.num_classes, (n,), generator=gen).to(device))
        for n in sizes.private_sizes]
    self.public = torch.randn(sizes.public_size, 3, 32, 32, generator=gen).to(device)
    self.round_index = 0
    # cuDNN's algorithm search is process-wide: set it for this flavour either way, so a
    # tuned loop timed first leaves the authors' loop after it as the authors wrote it.
    torch.backends.cudnn.benchmark = flavour == "tuned"

  def _lr(self, base: float) -> float:
    """The code's linear decay: round r uses lr0 (1 - decay max(r - 1, 0) / E)."""
    s = self.sizes
    return base * (1.0 - s.lr_decay * max(self.round_index - 1, 0) / s.num_rounds)

  def _public_batches(self) -> list[torch.Tensor]:
    """ceil(N0 / B0) full index batches per epoch, as `engine.batching.public_batches`."""
    s = self.sizes
    per_epoch = math.ceil(s.public_size / s.public_batch)
    out = []
    for _ in range(s.public_epochs):
      perm = torch.randperm(s.public_size, device=self.device)
      perm = perm.repeat(math.ceil(per_epoch * s.public_batch / s.public_size))
      out += list(perm[:per_epoch * s.public_batch].view(per_epoch, s.public_batch))
    return out

  def _collaborative_authors(self, lr: float) -> dict[str, float]:
    s = self.sizes
    fccm_sum = fisl_sum = 0.0
    steps = 0
    for rows in self._public_batches():
      images = self.public[rows]
      logits, logits_targets, sims, sims_targets = [], [], [], []
      for net in self.nets:
        net.train()
        z = net(images)
        logits_targets.append(z.clone().detach())
        logits.append(z)
        sim = _similarity_logits_authors(net.features(images), s.fisl_temperature)
        sims_targets.append(sim.clone().detach())
        sims.append(sim)
      for i, net in enumerate(self.nets):
        optimizer = torch.optim.Adam(net.parameters(), lr=lr)  # NEW per batch (the code)
        z_bar = torch.mean(torch.stack(logits_targets), 0)
        fccm = fccm_loss(logits[i], z_bar, off_diagonal_weight=s.off_diagonal_weight, eps=0.0)
        s_bar = torch.mean(torch.stack(sims_targets), 0)
        fisl = s.fisl_weight * fisl_loss(sims[i], s_bar)
        optimizer.zero_grad()
        fccm_sum += fccm.item()
        fisl_sum += fisl.item()
        (fccm + fisl).backward()
        optimizer.step()
        steps += 1
    return {"fccm": fccm_sum / max(steps, 1), "fisl": fisl_sum / max(steps, 1)}

  def _collaborative_tuned(self, lr: float) -> dict[str, torch.Tensor]:
    s = self.sizes
    total_fccm = torch.zeros((), device=self.device)
    total_fisl = torch.zeros((), device=self.device)
    steps = 0
    for rows in self._public_batches():
      images = self.public[rows]
      outs = [net.forward_both(images) for net in self.nets]
      logits = [z for _, z in outs]
      sims = [similarity_logits(h, temperature=s.fisl_temperature) for h, _ in outs]
      z_bar = torch.stack([z.detach() for z in logits]).mean(0)
      s_bar = torch.stack([m.detach() for m in sims]).mean(0)
      fccm = torch.stack([fccm_loss(z, z_bar, off_diagonal_weight=s.off_diagonal_weight)
                          for z in logits])
      fisl = s.fisl_weight * torch.stack([fisl_loss(m, s_bar) for m in sims])
      optimizers = [torch.optim.Adam(net.parameters(), lr=lr) for net in self.nets]
      (fccm.sum() + fisl.sum()).backward()
      for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
      total_fccm += fccm.detach().mean()
      total_fisl += fisl.detach().mean()
      steps += 1
    return {"fccm": total_fccm / max(steps, 1), "fisl": total_fisl / max(steps, 1)}

  def _local(self, index: int, lr: float) -> dict:
    """The code's `_train_net`: CE + FNTD against the frozen previous-round model."""
    s = self.sizes
    net, teacher = self.nets[index], self.prev_nets[index]
    images, labels = self.private[index]
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=s.weight_decay)
    authors = self.flavour == "authors"
    ce_sum = fntd_sum = 0.0 if authors else torch.zeros((), device=self.device)
    steps = 0
    for _ in range(s.local_epochs):
      perm = torch.randperm(images.shape[0], device=self.device)
      for rows in perm.split(s.local_batch):
        x, y = images[rows], labels[rows]
        z = net(x)
        with torch.no_grad():
          zt = teacher(x)
        fntd = fntd_loss(z, zt, y, temperature=s.fntd_temperature)
        ce = F.cross_entropy(z, y)
        optimizer.zero_grad()
        (ce + fntd).backward()
        if authors:  # the tqdm description of the code reads both every step
          ce_sum += ce.item()
          fntd_sum += fntd.item()
        else:
          ce_sum = ce_sum + ce.detach()
          fntd_sum = fntd_sum + fntd.detach()
        optimizer.step()
        steps += 1
    return {"ce": ce_sum / max(steps, 1), "fntd": fntd_sum / max(steps, 1)}

  def _average(self) -> None:
    """The homogeneous variant's `aggregate_nets`: uniform average of every entry."""
    states = [net.state_dict() for net in self.nets]
    mean = {k: (torch.stack([st[k].float() for st in states]).mean(0).to(states[0][k].dtype))
            for k in states[0]}
    for net in self.nets:
      net.load_state_dict(mean)

  def run_round(self) -> dict[str, float]:
    """One communication round; returns the round's mean losses as floats."""
    s = self.sizes
    col_lr, loc_lr = self._lr(s.public_lr), self._lr(s.local_lr)
    if s.public_size > 0 and s.public_epochs > 0:
      if self.flavour == "authors":
        metrics = self._collaborative_authors(col_lr)
      else:
        metrics = self._collaborative_tuned(col_lr)
    else:
      metrics = {}
    if s.average_parameters:
      self._average()
    local_metrics = [self._local(i, loc_lr) for i in range(len(self.nets))]
    for net, prev in zip(self.nets, self.prev_nets):  # the code's copy_nets2_prevnets
      prev.load_state_dict(net.state_dict())
    self.round_index += 1
    out = {k: float(v) for k, v in metrics.items()}
    for key in ("ce", "fntd"):
      out[key] = float(sum(float(m[key]) for m in local_metrics) / len(local_metrics))
    _sync(self.device)
    return out


def time_torch(sizes: RoundSizes, device: torch.device, flavour: str, rounds: int,
               seed: int = 0) -> dict:
  """Build time, first round, median of `rounds` further rounds and end to end of one flavour."""
  if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats(device)
  tick = time.perf_counter()
  runner = TorchFCCLPlus(sizes, device, flavour, seed)
  _sync(device)
  row = {"build_secs": time.perf_counter() - tick}
  tick = time.perf_counter()
  row["first_round_losses"] = runner.run_round()
  row["first_round_secs"] = time.perf_counter() - tick
  print(f"[torch {flavour}] round 1: {row['first_round_secs']:.2f} s", flush=True)
  times = []
  for r in range(rounds):
    tick = time.perf_counter()
    row["last_round_losses"] = runner.run_round()
    times.append(time.perf_counter() - tick)
    print(f"[torch {flavour}] round {r + 2}: {times[-1]:.2f} s", flush=True)
  row["steady_round_secs"] = statistics.median(times) if times else row["first_round_secs"]
  row["steady_round_all"] = times
  row["end_to_end_secs"] = (row["build_secs"] + row["first_round_secs"]
                            + (sizes.num_rounds - 1) * row["steady_round_secs"])
  row["end_to_end_measured_rounds"] = 1 + len(times)
  if device.type == "cuda":
    row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2.0 ** 30
  return row


# ----------------------------------------------------------------------------
# The side-by-side runner.
# ----------------------------------------------------------------------------


def load_config(name: str, overrides: list[str]):
  """first_round.py's `load_config`, every `field=value` override set."""
  return _first_round_module().load_config(name, overrides)


def time_engine(config_name: str, overrides: list[str], rounds: int, config) -> dict:
  """first_round.py's `_measure` (in this process, cold unless JAX_COMPILATION_CACHE_DIR is set),
  plus the end-to-end figure."""
  first_round = _first_round_module()
  row = first_round._measure(config_name, overrides, rounds)  # pylint: disable=protected-access
  per_call = int(config.rounds_per_call)
  calls = int(config.num_rounds) // per_call
  row["rounds_per_call"] = per_call
  row["steady_round_per_round_secs"] = row["steady_round_secs"] / per_call
  row["end_to_end_secs"] = (row["init_secs"] + row["trace_lower_secs"]
                            + row["compile_secs"] + row["first_round_secs"]
                            + (calls - 1) * row["steady_round_secs"])
  from fedjax_het.runtime.resources import resolve_conv_impl  # noqa: PLC0415
  row["conv_impl"] = resolve_conv_impl(config.models.conv_impl)
  return row


def _machine(device: torch.device) -> dict:
  import jax  # noqa: PLC0415 (already imported by fedjax_het, after the allocator setting)
  info = {"python": platform.python_version(), "platform": platform.platform(),
          "cpu_count": os.cpu_count(), "torch": torch.__version__, "jax": jax.__version__,
          "torch_device": str(device), "torch_threads": torch.get_num_threads(),
          "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", ""),
          "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")}
  if device.type == "cuda":
    info["gpu"] = torch.cuda.get_device_name(device)
    info["cuda"] = torch.version.cuda
    info["cudnn"] = torch.backends.cudnn.version()
  return info


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="digits_fcclplus_quick")
  parser.add_argument("--set", action="append", default=[], help="field=value override")
  parser.add_argument("--rounds", type=int, default=3, help="steady-state rounds timed")
  parser.add_argument("--flavours", default=",".join(FLAVOURS), help="comma-separated")
  parser.add_argument("--skip-engine", action="store_true")
  parser.add_argument("--skip-torch", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--xla-cpu-scheduler", default="auto", choices=xla_cpu.SCHEDULERS,
                      help="XLA:CPU's scheduler for the engine, as config.xla_cpu_scheduler "
                           "(auto: memory, what experiments/train.py uses)")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  scheduler = xla_cpu.set_xla_cpu_scheduler(args.xla_cpu_scheduler)  # before JAX computes
  flavours = [f for f in args.flavours.split(",") if f]
  unknown = sorted(set(flavours) - set(FLAVOURS))
  if unknown:
    parser.error(f"--flavours: unknown {unknown}; valid: {FLAVOURS}")
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  if device.type == "cpu":
    torch.set_num_threads(os.cpu_count() or 1)
  config = load_config(args.config, args.set)
  sizes = sizes_from_config(config)
  report = {"config": args.config, "overrides": args.set, "rounds": args.rounds,
            "num_rounds": sizes.num_rounds, "sizes": dataclasses.asdict(sizes),
            "machine": _machine(device), "data": "random tensors of the config's shapes"}

  described = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else timing.cpu_description())

  def write():
    if args.out:
      timing.write_result(args.out, report, device=described, indent=2)

  if not args.skip_engine:
    report["engine"] = time_engine(args.config, args.set, args.rounds, config)
    report["machine"]["jax_backend"] = report["engine"]["backend"]
    if report["engine"]["backend"] == "cpu":
      report["machine"]["xla_cpu_scheduler"] = scheduler
    print("[engine] " + ", ".join(f"{k} {v:.2f}" for k, v in report["engine"].items()
                                  if k.endswith("_secs")), flush=True)
    write()
  if not args.skip_torch:
    report["torch"] = {}
    for flavour in flavours:
      report["torch"][flavour] = time_torch(sizes, device, flavour, args.rounds, args.seed)
      print(f"[torch {flavour}] " + ", ".join(
          f"{k} {v:.2f}" for k, v in report["torch"][flavour].items() if k.endswith("_secs")),
          flush=True)
      write()
  if "engine" in report and "torch" in report:
    engine = report["engine"]
    report["engine_vs_pytorch_speedup"] = {
        flavour: {"steady_state": row["steady_round_secs"] / engine["steady_round_per_round_secs"],
                  "end_to_end": row["end_to_end_secs"] / engine["end_to_end_secs"]}
        for flavour, row in report["torch"].items()}
  report["process_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2.0 ** 20
  write()
  print(json.dumps({k: report[k] for k in ("engine_vs_pytorch_speedup",) if k in report},
                   indent=2))
  return report


if __name__ == "__main__":
  main()

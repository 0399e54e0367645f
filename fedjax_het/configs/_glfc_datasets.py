"""The Tiny-ImageNet and ImageNet-Subset configs of GLFC Tables 2 and 3, from cifar100.py's.

`glfc_dataset_config(dataset, arg)` builds every method of cifar100.py (the rows of GLFC
Table 1: fedavg_cil, icarl_fl, glfc and its ablations, the baselines) on another dataset:
cifar100.py's config of the same method (its learning rate, memory, schedule and GLFC
settings), with the dataset, its stream and its image side replaced. tinyimagenet.py and
imagenet_subset.py (the config files) call it.
"""

from __future__ import annotations


import ml_collections


from fedjax_het.configs import cifar100 as _CIFAR100
#: The methods (the rows of GLFC Tables 1-3): cifar100.py's.
METHODS = _CIFAR100.METHODS
#: Per dataset: (config-name prefix, scenario.dataset, paper-scale tasks, quick image side,
#: quick models.stem).
DATASETS = {"tinyimagenet": ("tinyimagenet", "tiny_imagenet", 20, 64, "cifar"),
            "imagenet_subset": ("imagenet_subset", "imagenet_subset", 10, 64, "imagenet")}


def variants() -> tuple[str, ...]:
  """<method> and <method>_quick for every method."""
  return tuple(name for method in METHODS for name in (method, f"{method}_quick"))


def glfc_dataset_config(dataset: str, arg: str) -> ml_collections.ConfigDict:
  """`dataset`: a key of DATASETS; `arg`: one of `variants()`."""
  prefix, name, tasks, quick_side, quick_stem = DATASETS[dataset]
  if arg not in variants():
    raise ValueError(f"{prefix} config: expected one of {variants()} (<method> or "
                     f"<method>_quick), got {arg!r}.")
  quick = arg.endswith("_quick")
  c = _CIFAR100.get_config(arg)  # the method's settings; cifar100's T = 10 or quick stream
  c.name = f"{prefix}_{arg}"
  c.scenario.dataset = name
  c.scenario.class_order = "seeded"  # iCaRL's order is CIFAR-100's (module docstrings)
  if quick:
    # cifar100's quick stream (20 classes in 4 tasks, 6 + 2 clients, 3 per round) on the
    # synthetic stand-in when the data is absent, at the quick image side, through the paper's
    # ResNet-18 at 1/8 width (simple_cnn needs 32 px), with a smaller pool and fewer epochs.
    c.scenario.image_size = quick_side
    c.scenario.train_size = 20 * 40     # 40 training images per class
    c.scenario.test_size = 20 * 10      # 10 test images per class
    c.models.architectures = ("glfc_resnet18",)
    c.models.width = 0.125
    c.models.stem = quick_stem
    c.local.epochs = 2
    c.local.batch_size = 32
    c.eval.batch_size = 100
  else:
    c.scenario.num_tasks = tasks
    c.scenario.image_size = 0  # the dataset's side: Tiny-ImageNet 64, ImageNet-Subset 224
  return c

"""Tiny-ImageNet federated class-incremental learning: GLFC Table 3 (CVPR 2022).

Commands (from the repository root):

  python experiments/train.py --config=fedjax_het/configs/tinyimagenet.py:glfc_quick
  python experiments/train.py --config=fedjax_het/configs/tinyimagenet.py:glfc
  python experiments/reproduce.py --table=glfc_table3 --scale=quick   # every row, 3 seeds
  python experiments/reproduce.py --table=glfc_table3 --scale=paper   # GLFC Table 3 setting

(--config=tinyimagenet_<variant> is the same config by its short name.)

Variant names: <method> and <method>_quick, method in fedavg_cil, icarl_fl, glfc,
glfc_no_cgc, glfc_no_crd, ssil_fl, bic_fl, podnet_fl, dde_icarl_fl, geodl_icarl_fl (the rows of
GLFC Table 3; Ours-w/oPRS is glfc with --config.glfc.old_model=previous_task_global). Every
variant is fedjax_het/configs/cifar100.py's config of the same method (learning rate,
exemplar memory of 2000 images per client, schedule, GLFC's losses and proxy server: see that
module's docstring) with the dataset replaced.

Protocol of GLFC Table 3 (Sec. 5.1, the caption of Table 3): Tiny-ImageNet's 200 classes in
T = 20 incremental tasks of 10 classes (scenario.num_tasks = 20), 30 clients at the start and
10 more per task, 10 sampled per round, each client drawing 60% of its task's classes, 20
local epochs, 10 rounds per task (cifar100.py's), ResNet-18, SGD lr 2.0 for the sigmoid-BCE
methods. The paper prints the first 10 tasks (10 ... 100 classes seen) and their mean (Avg.);
the rest is in its supplementary material.

Data (docs/data.md): `tinyimagenet.npz` of the bundle (scenario.source = "real", written by
python -m fedjax_het.data.download --data_dir DIR tinyimagenet): the official 500 training
images per class and the 50 labelled validation images per class as the test set, at the
released 64x64 (scenario.image_size = 0, the dataset's side; 32 reads them 2x2-averaged).
--config.scenario.source=folder:/path/to/tiny-imagenet reads train/ and val/ class folders
instead. Normalisation: the pool's own per-channel mean and std.

Model: glfc_resnet18 with the CIFAR stem (conv3x3 stride 1, no max-pool; models.stem =
"auto" picks it below 128 px): at 64 px the last stage works on 8x8 maps. The ImageNet stem
(--config.models.stem=imagenet) would leave 2x2 maps; fedjax_het/models/resnet.py gives the
choice for every side.

Class order: "seeded" (a seeded random permutation of the 200 classes): iCaRL's fixed order
exists for CIFAR-100 only (fedjax_het/data/incremental.py).

Quick variants: cifar100.py's quick stream (20 classes in 4 tasks, 6 clients + 2 per task, 3
per round, 5 rounds per task) with 40 training and 10 test images per class, at 64x64, through
glfc_resnet18 at width 1/8 (CIFAR stem), 2 local epochs of batch 32. Without tinyimagenet.npz
they run on the synthetic (domain, digit) stand-in resized to 64x64 (logged loudly, recorded
in metadata.json and results.md); such numbers say nothing about Tiny-ImageNet.
"""

from __future__ import annotations


import ml_collections


from fedjax_het.configs import _glfc_datasets as _SHARED
METHODS = _SHARED.METHODS
VARIANTS = _SHARED.variants()


def get_config(arg: str = "glfc") -> ml_collections.ConfigDict:
  """`arg`: one of `VARIANTS` (module docstring)."""
  return _SHARED.glfc_dataset_config("tinyimagenet", arg)

"""ImageNet-Subset federated class-incremental learning: GLFC Table 2 (CVPR 2022).

Commands (from the repository root):

  python experiments/train.py --config=fedjax_het/configs/imagenet_subset.py:glfc_quick
  python experiments/train.py --config=fedjax_het/configs/imagenet_subset.py:glfc
  python experiments/reproduce.py --table=glfc_table2 --scale=quick   # every row, 3 seeds
  python experiments/reproduce.py --table=glfc_table2 --scale=paper   # GLFC Table 2 setting

(--config=imagenet_subset_<variant> is the same config by its short name.)

Variant names: <method> and <method>_quick, method in fedavg_cil, icarl_fl, glfc,
glfc_no_cgc, glfc_no_crd, ssil_fl, bic_fl, podnet_fl, dde_icarl_fl, geodl_icarl_fl (the rows of
GLFC Table 2; Ours-w/oPRS is glfc with --config.glfc.old_model=previous_task_global). Every
variant is fedjax_het/configs/cifar100.py's config of the same method (learning rate,
exemplar memory of 2000 images per client, schedule, GLFC's losses and proxy server: see that
module's docstring) with the dataset replaced.

Protocol of GLFC Table 2 (Sec. 5.1, the caption of Table 2): ImageNet-Subset's 100 classes in
T = 10 incremental tasks of 10 classes, 30 clients at the start and 10 more per task, 10
sampled per round, each client drawing 60% of its task's classes, 20 local epochs, 10 rounds
per task (cifar100.py's), ResNet-18, SGD lr 2.0 for the sigmoid-BCE methods; the accuracy on
all classes seen after each task (10 ... 100) and their mean (Avg.).

Data (docs/data.md): ImageNet-Subset is not downloadable here; scenario.source = "real" reads
the image folders <data_dir>/imagenet_subset/train/ and .../val/ (one sub-folder per class,
100 classes; the data directory is --config.scenario.data_dir or $FEDJAX_HET_DATA_DIR), and
--config.scenario.source=folder:/path reads them from another root. Images are read at
scenario.image_size = 0, the dataset's 224 px (the side ImageNet-Subset class-incremental work
trains at): the shorter side scaled to 224 (BILINEAR), the central square kept.
--config.scenario.image_size=N reads them at N px (any side in [8, 512]). The pool is held in
memory: 224 x 224 x 3 bytes per image (about 19.6 GB for 1300 images of 100 classes), so a
smaller side (e.g. 112 or 64) fits smaller machines. Normalisation: the pool's own mean and std.

Model: glfc_resnet18 with the ImageNet stem (conv7x7 stride 2 and a 3x3 max-pool, torchvision's
ResNet-18; models.stem = "auto" picks it from 128 px on): at 224 px the last stage works on
7x7 maps. fedjax_het/models/resnet.py gives the choice for every side.

Class order: "seeded" (a seeded random permutation of the 100 folder classes, sorted by name):
iCaRL's fixed order exists for CIFAR-100 only (fedjax_het/data/incremental.py).

Quick variants: cifar100.py's quick stream (20 classes in 4 tasks, 6 clients + 2 per task, 3
per round, 5 rounds per task) with 40 training and 10 test images per class, read at 64x64,
through glfc_resnet18 at width 1/8 with the ImageNet stem (the paper-scale stem; 2x2 maps at
the last stage), 2 local epochs of batch 32. Without the image folders they run on the
synthetic (domain, digit) stand-in resized to 64x64 (logged loudly, recorded in metadata.json
and results.md); such numbers say nothing about ImageNet.
"""

from __future__ import annotations


import ml_collections


from fedjax_het.configs import _glfc_datasets as _SHARED
METHODS = _SHARED.METHODS
VARIANTS = _SHARED.variants()


def get_config(arg: str = "glfc") -> ml_collections.ConfigDict:
  """`arg`: one of `VARIANTS` (module docstring)."""
  return _SHARED.glfc_dataset_config("imagenet_subset", arg)

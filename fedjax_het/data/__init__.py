"""Data layer: sources, scenarios, partitioners and augmentation (numpy in, arrays out).

Sources (a run reads what is on disk and downloads nothing):
  * The `.npz` bundle (`npz`): MNIST, USPS, SVHN and SYN (digits.npz),
    Office31, Office-Caltech, Office-Home, CIFAR-10, CIFAR-100,
    Fashion-MNIST, Tiny-ImageNet (64x64, `load_tinyimagenet`) and the
    5000-image public sets, read from `data_dir` or $FEDJAX_HET_DATA_DIR
    (`resolve_data_dir`), validated. `python -m fedjax_het.data.download
    <name>` (`download`, run once by the user, not imported here) fetches
    each dataset from its publisher, checks it and writes its bundle files;
    `--list` shows what exists and what is present (docs/data.md).
  * TensorFlow Datasets (`tfds_source`, optional extra, imported lazily):
    mnist, svhn_cropped, cifar10, cifar100, fashion_mnist, ... via
    `tfds.data_source` (no TensorFlow needed once prepared).
  * Image folders (`folder`, Pillow): SYN digits, Office-Home, Caltech, ...
  * Synthetic (`synthetic`, NumPy only, cached in $FEDJAX_HET_CACHE_DIR or
    ~/.cache/fedjax_het): four digit domains mirroring MNIST / USPS / SVHN /
    SYN, and a natural-image-like public set; the opt-in fallback's warning
    names the download command that gives the real data.

Scenarios (`scenarios.build_scenario`): Digits, Office-Caltech, Office31,
Office-Home with FCCL+ Table V private sizes, explicit per-domain sources,
an opt-in, logged and recorded synthetic fallback, and for Office a choice of
test protocol (`OFFICE_TESTS`: held-out images, or the whole domain as the
FCCL+ code evaluates). `stack_clients` pads clients of unequal size into
(K, N_max, ...) arrays with a mask.

Partitioners (`partition`): IID, Dirichlet label skew, pathological shards,
binary class split, permuted pixels, GLFC class-incremental task streams.

Partitioned scenarios (`partitioned.build_partitioned_scenario`): one whole
dataset (mnist, cifar10, usps, cifar100, svhn, fashion_mnist) split over many
clients for FedAvg-style experiments: "iid", "dirichlet" (Hsu et al. 2019),
"shards" (McMahan et al. 2017), "class_split", "class_split_own", "permuted"
(one pixel permutation, and so one domain, per client) or "permuted_classes"
(the FedFusion code's: permuted pixels and the classes dealt to the clients in
turn); with the same opt-in, logged and recorded synthetic fallback as
`build_scenario`.

Augmentation (`augment`, pure JAX): random crop, resized crop, flip, colour
jitter, greyscale, rotation, FCCL+ weak/strong pipelines, normalisation.

Images are uint8 (N, 32, 32, 3) RGB and labels int32 (N,) everywhere outside
`augment` (and `load_tinyimagenet` at resolution 64). Errors: `DataError`
(invalid data; names the file and what was expected) and its subclass
`DataUnavailableError` (missing; says how to provide it).
"""

from fedjax_het.data._base import (CACHE_DIR_ENV, DATA_DIR_ENV, DataError, DataUnavailableError,
                                   Split, StackedClients, cache_dir, resolve_data_dir,
                                   stack_clients)
from fedjax_het.data.augment import (CIFAR100_MEAN, CIFAR100_STD, IMAGENET_MEAN, IMAGENET_STD,
                                     color_jitter, normalize, random_crop, random_flip,
                                     random_grayscale, random_resized_crop, random_rotation,
                                     strong_augment, weak_augment)
from fedjax_het.data.folder import load_image_folder
from fedjax_het.data.npz import (BUNDLE, TINYIMAGENET_RESOLUTIONS, LabelledImages, TinyImageNet,
                                 available_bundle_files, index_split, load_cifar10,
                                 load_cifar100_glfc, load_fashion_mnist, load_npz_digits,
                                 load_office31, load_office_caltech, load_office_domains,
                                 load_public, load_tinyimagenet)
from fedjax_het.data.partition import (Task, binary_class_split, class_groups,
                                       class_incremental_tasks, client_permutation,
                                       dirichlet_partition, iid_partition, label_histogram,
                                       make_permutations, permuted_pixels, shard_partition)
from fedjax_het.data.partitioned import (DATASET_STATS, PARTITION_DATASETS, PARTITIONS,
                                         PERMUTED_PARTITIONS, PERMUTED_TEST_MODES,
                                         build_partitioned_scenario, partition_indices)
from fedjax_het.data.scenarios import (OFFICE_TESTS, SCENARIOS, Scenario, build_scenario,
                                       load_dataset, stratified_subsample)
from fedjax_het.data.synthetic import (DEFAULT_SYNTHETIC_TEST_SIZE, DEFAULT_SYNTHETIC_TRAIN_SIZES,
                                       DIGIT_DOMAINS, SYNTHETIC_VERSION, synthetic_digits,
                                       synthetic_digits_benchmark, synthetic_public)
from fedjax_het.data.tfds_source import TFDS_NAMES, load_tfds

__all__ = [
    "BUNDLE", "CACHE_DIR_ENV", "CIFAR100_MEAN", "CIFAR100_STD", "DATASET_STATS", "DATA_DIR_ENV",
    "DEFAULT_SYNTHETIC_TEST_SIZE", "DEFAULT_SYNTHETIC_TRAIN_SIZES", "DIGIT_DOMAINS",
    "IMAGENET_MEAN", "IMAGENET_STD", "OFFICE_TESTS", "PARTITIONS", "PARTITION_DATASETS",
    "PERMUTED_PARTITIONS", "PERMUTED_TEST_MODES",
    "SCENARIOS", "SYNTHETIC_VERSION", "TFDS_NAMES", "TINYIMAGENET_RESOLUTIONS", "DataError",
    "DataUnavailableError", "LabelledImages", "Scenario", "Split", "StackedClients", "Task",
    "TinyImageNet", "available_bundle_files", "binary_class_split",
    "build_partitioned_scenario", "build_scenario", "cache_dir", "class_groups",
    "class_incremental_tasks", "client_permutation", "color_jitter", "dirichlet_partition",
    "iid_partition", "index_split", "label_histogram", "load_cifar10", "load_cifar100_glfc",
    "load_dataset", "load_fashion_mnist", "load_image_folder", "load_npz_digits",
    "load_office31", "load_office_caltech", "load_office_domains", "load_public", "load_tfds",
    "load_tinyimagenet", "make_permutations", "normalize", "partition_indices",
    "permuted_pixels",
    "random_crop", "random_flip", "random_grayscale", "random_resized_crop", "random_rotation",
    "resolve_data_dir", "shard_partition", "stack_clients", "stratified_subsample",
    "strong_augment", "synthetic_digits", "synthetic_digits_benchmark", "synthetic_public",
    "weak_augment",
]

"""Real datasets and their partitions: Fashion-MNIST, scikit-learn digits, a site's own IDX/npz/image folder
(and ``import_images``/``write_npz``, which turn a site's image folder or CSV into its ``.npz``).

Front door::

    from capc_common.data import Dataset, load_dataset, partition
    train = load_dataset("fashion-mnist", split="train")
    shards = partition(train.labels, shards=200, scheme="iid", seed=0)
"""

from capc_common.data.catalog import DATASET_NAMES, FASHION_MNIST_CLASSES, load_dataset
from capc_common.data.dataset import Dataset
from capc_common.data.files import load_image_folder, load_npz
from capc_common.data.idx import load_idx, read_idx
from capc_common.data.importer import import_images, write_npz
from capc_common.data.partition import (
    HOLDOUT_FRACTION,
    PARTITION_SCHEMES,
    holdout_fraction,
    holdout_part,
    partition,
    site_part,
    site_parts,
)

__all__ = [
    "DATASET_NAMES",
    "FASHION_MNIST_CLASSES",
    "HOLDOUT_FRACTION",
    "PARTITION_SCHEMES",
    "Dataset",
    "holdout_fraction",
    "holdout_part",
    "import_images",
    "load_dataset",
    "load_idx",
    "load_image_folder",
    "load_npz",
    "partition",
    "read_idx",
    "site_part",
    "site_parts",
    "write_npz",
]

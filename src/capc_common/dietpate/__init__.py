"""Central DIET-PATE: the whole pipeline on one machine, the reference the federation must reproduce.

Front door::

    from capc_common.dietpate import load_config, run
    report = run(load_config("configs/fashion-mnist-diet-pate.yaml"), cache_dir=".cache/features")

``capc dietpate run --config FILE`` wraps :func:`run`. ``method: pate-scratch`` in the config runs the
"PATE without public data" baseline through the same stages.
"""

from capc_common.dietpate.accounting import make_budget
from capc_common.dietpate.cache import FeatureCache
from capc_common.dietpate.config import RunConfig, load_config
from capc_common.dietpate.pipeline import Prepared, next_batch, prepare
from capc_common.dietpate.stages import run

__all__ = [
    "FeatureCache",
    "Prepared",
    "RunConfig",
    "load_config",
    "make_budget",
    "next_batch",
    "prepare",
    "run",
]

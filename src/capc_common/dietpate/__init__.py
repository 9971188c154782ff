"""Central DIET-PATE: the whole pipeline on one machine, the reference the federation must reproduce.

Front door::

    from capc_common.dietpate import load_config, run
    report = run(load_config("configs/fashion-mnist-diet-pate.yaml"), cache_dir=".cache/features")

``capc dietpate run --config FILE`` wraps :func:`run`. ``method: pate-scratch`` in the config runs the
"PATE without public data" baseline through the same stages.

Names load on first use (PEP 562): a module that needs only the feature cache (the benchmarks' data
loading, which then reads cached features) does not import torch through the pipeline (1.3 s a process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capc_common._lazy import lazy_getattr

if TYPE_CHECKING:
    from capc_common.dietpate.accounting import make_budget
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.dietpate.config import RunConfig, load_config
    from capc_common.dietpate.pipeline import Prepared, next_batch, prepare
    from capc_common.dietpate.stages import run

_HOME = {
    "make_budget": "accounting",
    "FeatureCache": "cache",
    "RunConfig": "config",
    "load_config": "config",
    "Prepared": "pipeline",
    "next_batch": "pipeline",
    "prepare": "pipeline",
    "run": "stages",
}

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


__getattr__ = lazy_getattr(__name__, _HOME, globals())

"""The data every method of ``benchmarks/mechanisms.py`` sees: the parties' per-example features and the
evaluation set, the parties' shards, the pooled raw images (the end-to-end CNN) and the synthetic query
streams (Private-kNN's queries, DPPL-Public's candidate pool, Prom-PATE's queries).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _baselines import as_tensor_images

from capc_common.data import partition
from capc_common.dietpate.cache import FeatureCache
from capc_common.mechanisms import normalise
from capc_common.mechanisms.central import PartyData, per_example_features
from methods.common import HYPER, log


def load_features(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_x, train_y, eval_x, eval_y)``: per-example features, L2-normalised."""
    if args.dataset == "digits":
        from capc_common.data import load_dataset

        train, test = load_dataset("digits", split="train"), load_dataset("digits", split="test")
        tx = train.images.reshape(len(train.labels), -1)[: args.train_limit].astype(np.float32)
        ty = train.labels[: args.train_limit].astype(np.int64)
        ex, ey = test.images.reshape(len(test.labels), -1).astype(np.float32), test.labels.astype(np.int64)
    else:
        from capc_common.learn.featurizers import BackboneFeaturizer
        from capc_common.models import default_backbone, load_backbone

        fz = BackboneFeaturizer(load_backbone(default_backbone(28, 28, 1)))
        cache = FeatureCache(args.cache_dir)
        tx, ty = per_example_features(
            fz, dataset=args.dataset, split="train", limit=args.train_limit, cache=cache, log=log
        )
        ex, ey = per_example_features(
            fz, dataset=args.dataset, split="test", limit=args.test_limit, cache=cache, log=log
        )
    if args.evaluate_on == "validation":
        cut = len(ty) - args.validation
        tx, ty, ex, ey = tx[:cut], ty[:cut], tx[cut:], ty[cut:]
    return normalise(tx), ty, normalise(ex), ey


def parties_of(x: np.ndarray, y: np.ndarray, *, scheme: str, parties: int, seed: int) -> list[PartyData]:
    """The parties' disjoint shards (public, seeded assignment)."""
    extra = {"imbalance_ratio": 10.0} if scheme == "imbalanced" else {}
    shards = partition(y, shards=parties, scheme=scheme, seed=seed, **extra)
    return [PartyData(f"party-{i}", x[s], y[s], index=np.asarray(s)) for i, s in enumerate(shards)]


def pooled_images(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The raw images behind :func:`load_features`' rows, same order and split: ``(train images, labels,
    evaluation images, labels)`` as tensors for the end-to-end CNN."""
    import torch

    from capc_common.data import load_dataset

    train, test = load_dataset(args.dataset, split="train"), load_dataset(args.dataset, split="test")
    tx, ty = train.images[: args.train_limit], train.labels[: args.train_limit]
    ex, ey = test.images[: args.test_limit], test.labels[: args.test_limit]
    if args.evaluate_on == "validation":
        cut = len(ty) - args.validation
        tx, ty, ex, ey = tx[:cut], ty[:cut], tx[cut:], ty[cut:]
    as_labels = lambda v: torch.from_numpy(np.array(v, dtype=np.int64))  # noqa: E731  (a writable copy)
    return as_tensor_images(tx), as_labels(ty), as_tensor_images(ex), as_labels(ey)


def query_images(args: argparse.Namespace, h: dict[str, Any]) -> np.ndarray:
    """The synthetic query stream of a method (uint8, the dataset's image size)."""
    from capc_common.synth import generate

    side = 8 if args.dataset == "digits" else 28
    return generate(h["generator"], seed=1, start=0, count=h["queries"], height=side, width=side, channels=1)


def query_features(args: argparse.Namespace, group: str = "knn") -> np.ndarray:
    """Features of a method's synthetic image stream (per example, like the parties'), cached; raw pixels
    for the digits proxy."""
    h = HYPER[group]
    if args.dataset == "digits":
        return normalise(query_images(args, h).reshape(h["queries"], -1).astype(np.float32))
    from capc_common.learn.featurizers import BackboneFeaturizer
    from capc_common.models import default_backbone, load_backbone

    fz = BackboneFeaturizer(load_backbone(default_backbone(28, 28, 1)))
    key = {
        "kind": "per-example-queries",
        "map": fz.sha256,
        "generator": h["generator"],
        "count": h["queries"],
    }
    cache = FeatureCache(args.cache_dir)
    return normalise(
        cache.get_or_compute(key, lambda: fz.extract(query_images(args, h), bn_batch=64, mode="running"))
    )

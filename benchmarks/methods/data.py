"""The data every method of ``benchmarks/mechanisms.py`` sees: the parties' per-example features and the
evaluation set, the parties' records, the pooled raw images (the end-to-end CNN) and the synthetic query
streams (Private-kNN's queries, DPPL-Public's candidate pool, Prom-PATE's queries).

**One neighbouring relation.** The parties are split as the services split sites, by a keyed hash of each
record's own content (:func:`capc_common.data.site_parts`; ``imbalanced``: class-dependent hash thresholds,
so the skew is a public function of a record's label and hash), and a party's records are dealt to its
teachers (Prom-PATE, CaPC) by keyed content hash too. Adding or removing one record changes one party's
records by that record and one of its teachers, so every row's ε is for :data:`NEIGHBOURING` (add/remove one
record), whatever the method's own analysis assumes. The dataset itself is the first ``--train-limit``
training images (a development run with ``--evaluate-on validation`` cuts its hold-out by position).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _baselines import as_tensor_images

from capc_common.data import site_parts
from capc_common.data.partition import NEIGHBOURING as RELATIONS
from capc_common.dietpate.cache import FeatureCache
from capc_common.mechanisms import normalise
from capc_common.mechanisms.central import PartyData, per_example_features
from methods.common import HYPER, log

#: How the parties are split (recorded in the run's setting: rows of another split are never merged).
SPLIT = "keyed-hash"
#: The neighbouring relation of every row (stated in the table and the JSON).
NEIGHBOURING = (
    f"{RELATIONS['hash']} (parties and each party's teachers split by keyed content hash, "
    "capc_common.data.site_parts)"
)
#: ``--partitions``: the class skew of each split (None: uniform; r: each party's most and least frequent
#: classes differ about r×).
IMBALANCE = {"iid": None, "imbalanced": 10.0}


def load_features(
    args: argparse.Namespace,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_x, train_y, train_images, eval_x, eval_y)``: per-example features, L2-normalised, and the
    training records' images (their content places them in parties and teachers)."""
    from capc_common.data import load_dataset

    images = load_dataset(args.dataset, split="train").images[: args.train_limit]
    if args.dataset == "digits":
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
        images = images[:cut]
    return normalise(tx), ty, images, normalise(ex), ey


def parties_of(
    x: np.ndarray, y: np.ndarray, images: np.ndarray, *, scheme: str, parties: int, seed: int
) -> list[PartyData]:
    """The parties' disjoint records, each placed by a keyed hash of its own content (key: ``seed``), with
    the class skew of ``scheme`` (:data:`IMBALANCE`)."""
    shards = site_parts(images, y, parts=parties, seed=seed, imbalance_ratio=IMBALANCE[scheme])
    return [PartyData(f"party-{i}", x[s], y[s], images=images[s]) for i, s in enumerate(shards)]


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

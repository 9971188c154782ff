"""Prom-PATE (:mod:`capc_common.learn.prompts`, :mod:`capc_common.mechanisms.prompate`): prompted teachers
on every party's shards vote on dead-leaves queries, Confident-GNMax answers them within the budget, the
library's student learns the answers."""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from capc_common.dietpate.cache import FeatureCache
from capc_common.mechanisms.central import PartyData
from methods.common import DELTA, HYPER, Method, accuracy, log
from methods.data import query_images


def prompate_data(args: argparse.Namespace) -> dict[str, Any]:
    """What Prom-PATE needs besides the parties: the query images, and the student's features of the queries
    and of the evaluation images.

    The student is the library's student as ``capc dietpate run`` uses it: a head on the shared backbone
    with BatchNorm *current statistics* (chunks of 64), the regime the teachers vote in. This choice was
    made after a first test-set run with the other methods' running-statistics features, not on
    validation; docs/mechanisms.md reports both runs (neither is useful: 10–26 %).
    """
    from capc_common.data import load_dataset
    from capc_common.models import default_backbone, extract_features, load_backbone

    h = HYPER["prompate"]
    if args.evaluate_on == "validation":
        train = load_dataset(args.dataset, split="train").images[: args.train_limit]
        evaluation = train[len(train) - args.validation :]
    else:
        evaluation = load_dataset(args.dataset, split="test").images[: args.test_limit]
    side = evaluation.shape[1]
    backbone = load_backbone(default_backbone(side, side, 1))
    queries = query_images(args, h)
    return {
        "queries": (extract_features(backbone, queries, bn_batch=64), queries),
        "evaluation": extract_features(backbone, evaluation, bn_batch=64),
        "cache": FeatureCache(args.cache_dir),
    }


def prom_pate(
    parties: list[PartyData],
    ex: np.ndarray,
    ey: np.ndarray,
    *,
    epsilon: float,
    seed: int,
    queries: tuple[np.ndarray, np.ndarray],
    evaluation: np.ndarray,
    cache: FeatureCache,
) -> dict[str, Any]:
    """Prompted teachers on every party's shards, Confident-GNMax within the budget, the library's student.

    Each party deals its records to its ``teachers_per_party`` teachers by keyed content hash (key: ``seed``,
    as a teacher party's ``capc teacher train`` deals its shards) and each teacher trains on the first
    ``shard`` records of its part: one record more or less changes one teacher. The teachers' votes are a
    deterministic function of the shards, the recipe and the queries: they are cached (``--cache-dir``) and
    answered afresh (new noise) at every ε.
    """
    import hashlib

    from capc_common.data import partition
    from capc_common.dietpate.cache import digest_indices
    from capc_common.learn.prompts import PromptRecipe, train_prompted_teachers
    from capc_common.mechanisms import ConfidentGNMax
    from capc_common.mechanisms.prompate import release_and_learn
    from capc_common.models import default_backbone, load_backbone

    h = HYPER["prompate"]
    k, size = h["teachers_per_party"], h["shard"]
    shards: list[np.ndarray] = []
    first = 0
    for p in parties:
        parts = partition(p.labels, shards=k, scheme="hash", seed=seed, images=p.images)
        short = min(len(part) for part in parts)
        if short < size:
            raise SystemExit(
                f"{p.name}'s {k} hash parts hold as few as {short} records, fewer than "
                f"prompate.shard={size}; lower prompate.shard or prompate.teachers_per_party"
            )
        shards += [first + part[:size] for part in parts]
        first += len(p.labels)
    images = np.concatenate([p.images for p in parties])
    labels = np.concatenate([p.labels for p in parties])
    query_features, query_pixels = queries
    side = images.shape[1]
    backbone = load_backbone(default_backbone(side, side, 1))
    recipe = PromptRecipe(kind=h["kind"], width=h["width"], steps=h["steps"], prompt_lr=h["prompt_lr"])
    n = len(shards)
    timing = {"per_teacher": math.nan, "votes": math.nan}

    def votes() -> np.ndarray:
        t0 = time.perf_counter()
        teachers = train_prompted_teachers(backbone, images, labels, shards, classes=10, recipe=recipe)
        timing["per_teacher"] = (time.perf_counter() - t0) / n
        t1 = time.perf_counter()
        hist = teachers.histograms(query_pixels)
        timing["votes"] = time.perf_counter() - t1
        log(f"prom-pate: {n} teachers, {timing['per_teacher']:.2f} s each, votes {timing['votes']:.0f} s")
        return hist

    key = {
        "kind": "prompate-votes",
        "map": backbone.sha256,
        "data": hashlib.sha256(images[np.concatenate(shards)].tobytes() + labels.tobytes()).hexdigest(),
        "shards": digest_indices(np.concatenate([*shards, [n]])),
        "recipe": recipe.describe(),
        "queries": {"generator": h["generator"], "count": h["queries"]},
    }
    hist = cache.get_or_compute(key, votes)
    mechanism = ConfidentGNMax(
        classes=10, teachers=n, threshold=h["threshold"] * n, sigma1=h["sigma1"] * n, sigma2=h["sigma2"] * n
    )
    result = release_and_learn(
        hist, student_features=query_features, mechanism=mechanism, epsilon=epsilon, delta=DELTA, seed=seed
    )
    a = result.answers
    return {
        "accuracy": 0.0 if result.student is None else accuracy(result.student.predict(evaluation), ey),
        "epsilon": a.epsilon,
        "released": a.answered,
        "noise": f"T={mechanism.threshold:g} σ1={mechanism.sigma1:g} σ2={mechanism.sigma2:g}, {n} teachers "
        f"({timing['per_teacher']:.2f} s each, votes {timing['votes']:.0f} s; nan: cached) {a.queries} asked",
    }


PROM_PATE = Method("prom-pate", prom_pate, ("prompate",), prompate_data)

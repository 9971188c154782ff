"""Train the student on the federation's labels and publish it with its model card.

The student regenerates every query it asked (from the batch plan: nothing but public specs), computes
features with the shared backbone in current-statistics mode over the same ``bn_batch`` chunks the teachers
used, and trains the head on the answered ones (unanswered ones may serve as pseudo-labels: post-processing,
no privacy cost). The model card carries the privacy guarantee (the guardian's filter limit) and, beside it,
the realised spend computed from the store's record of asked and answered queries with the same
data-independent accounting the guardian's ledger charges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from capc_common.data import load_dataset
from capc_common.errors import InputError
from capc_common.federation import batch_plan, load_shared_backbone
from capc_common.learn.student import accuracy, save_student
from capc_common.models import extract_features
from capc_common.models.cache import FeatureCache
from capc_common.privacy.claims import CURRENT_STATISTICS
from capc_services.student.accounting import noise_label, privacy_of
from capc_services.student.scheduler import Progress
from capc_services.student.settings import StudentSettings
from capc_services.student.store import LabelStore
from capc_services.student.training import TrainingStopped, fit_streamed

_log = logging.getLogger(__name__)
_BLOCK_CHUNKS = 2  # bn_batch chunks extracted between two looks at the stop request


def pick_device(preference: str) -> str:
    """``cuda`` when asked for or when ``auto`` finds a GPU, else ``cpu``.

    Raises:
        InputError: ``cuda`` was asked for but torch sees no GPU.
    """
    import torch

    available = torch.cuda.is_available()
    if preference == "cuda" and not available:
        raise InputError("train.device is cuda but torch sees no GPU; use device: auto or cpu")
    return "cuda" if preference in ("cuda", "auto") and available else "cpu"


def _features(
    backbone: Any,
    images: np.ndarray,
    *,
    bn_batch: int,
    stop: threading.Event | None,
    cache: FeatureCache | None = None,
) -> np.ndarray:
    """Features of ``images``, a few whole bn_batch chunks at a time with a look at ``stop`` in between.

    The last block takes the remainder, so the BatchNorm chunks are exactly those of one pass over all the
    images (the teachers' chunks): the features are the same, and a shutdown waits for one block at most.
    With a shared ``cache`` the chunks the teachers featurised are read, not computed again.

    Raises:
        TrainingStopped: ``stop`` was set.
    """
    extract = extract_features if cache is None else cache.extract
    block = _BLOCK_CHUNKS * bn_batch
    starts = list(range(0, len(images) - block + 1, block)) if len(images) >= block else [0]
    bounds = [*starts[1:], len(images)]
    out = []
    for start, stop_at in zip(starts, bounds, strict=True):
        if stop is not None and stop.is_set():
            raise TrainingStopped("student training was stopped; it runs again at the next start")
        out.append(extract(backbone, images[start:stop_at], bn_batch=bn_batch, mode="current"))
    return out[0] if len(out) == 1 else np.concatenate(out)


def publish_student(
    settings: StudentSettings,
    *,
    store: LabelStore,
    progress: Progress,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Train, evaluate (if configured) and write ``student.safetensors`` + ``model_card.json``.

    Features are computed a batch at a time and the fit is chunked (:mod:`.training`), so memory stays
    bounded however many queries were labelled; ``stop`` interrupts between batches.

    Returns:
        What was published (paths, counts, the guarantee ε and the realised ε spent, accuracy) for
        ``/api/v1/progress`` and the "student published" log line.

    Raises:
        InputError: no answered query to learn from.
        TrainingStopped: ``stop`` was set (nothing is published; it runs again at the next start).
    """
    config = settings.federation_config
    start = time.perf_counter()
    device = pick_device(settings.train.device)
    backbone = load_shared_backbone(config)
    if device != "cpu":
        backbone = backbone.to(device)
    cache = None if settings.feature_cache is None else FeatureCache(settings.feature_cache)
    done = store.batches(state="done")
    indices, labels = store.all_labels()

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each labelled batch's features (the teachers' bn_batch chunks) and labels, one at a time."""
        for record in done:
            spec = batch_plan(config, first_index=record.first_index, count=record.count).spec
            lo, hi = np.searchsorted(indices, [spec.first_index, spec.first_index + spec.count])
            images = spec.images() if cache is None else cache.images(spec)
            features = _features(backbone, images, bn_batch=spec.bn_batch, stop=stop, cache=cache)
            yield features, labels[lo:hi]

    fit, chunks = fit_streamed(
        batches(),
        classes=config.classes,
        seed=config.queries.seed,
        chunk_queries=settings.train.chunk_queries,
        stop=stop,
    )
    answered = int((labels >= 0).sum())
    evaluation: dict[str, Any] = {}
    evaluate = settings.train.evaluate
    if evaluate is not None:
        test = load_dataset(evaluate.dataset, split="test")
        images, truth = test.images, test.labels
        if evaluate.limit is not None:
            images, truth = images[: evaluate.limit], truth[: evaluate.limit]
        features = _features(backbone, images, bn_batch=config.queries.bn_batch, stop=stop)
        predicted = fit.predict(features)
        evaluation = {
            "dataset": f"{evaluate.dataset}/test",
            "examples": len(truth),
            "accuracy": accuracy(predicted, truth),
            "bn_mode": "current",
            "bn_batch": config.queries.bn_batch,
        }
    parties = sorted({p for record in done for p in record.parties})
    counts = store.counts()
    card: dict[str, Any] = {
        "model": "student head on the shared backbone (DIET-CaPC)",
        "federation": config.name,
        "config_hash": config.config_hash(),
        "privacy": privacy_of(config, store),
        "mechanism": {
            **config.mechanism.model_dump(mode="json", exclude={"insecure_noise_seed"}),
            "noise": "discrete Gaussian",
            # Only the student's own part is known here; the guardian's /api/v1/budget names its source.
            "student_noise": noise_label(config),
        },
        "queries": {
            "asked": counts["queries"],
            "answered": counts["answered"],
            "batches": counts["batches_done"],
        },
        "generator": {"name": config.queries.generator, "seed": config.queries.seed},
        "backbone": {"name": config.backbone.name, "sha256": config.backbone.sha256},
        "bn": {
            "mode": "current",
            "min_batch": 16,
            "bn_batch": config.queries.bn_batch,
            "note": CURRENT_STATISTICS,
        },
        "parties": {"guardian": config.guardian, "student": config.student, "teachers": parties},
        "training": {
            "recipe": fit.recipe.describe(),
            "pseudo_labelled": fit.pseudo_labelled,
            "device": device,
            "chunks": chunks,
            "chunk_queries": settings.train.chunk_queries,
        },
        "evaluation": evaluation,
        "stopped_reason": progress.stopped_reason,
    }
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    model_path = settings.output_dir / "student.safetensors"
    card_path = save_student(model_path, fit, card=card).replace(settings.output_dir / "model_card.json")
    seconds = time.perf_counter() - start
    _log.info("student trained", extra={"seconds": round(seconds, 2), "answered": answered, "chunks": chunks})
    return {
        "model": str(model_path),
        "model_card": str(card_path),
        "epsilon": card["privacy"]["epsilon"],
        "epsilon_spent": card["privacy"]["epsilon_spent"],
        "answered": answered,
        "accuracy": evaluation.get("accuracy"),
        "device": device,
        "seconds": round(seconds, 2),
    }

"""Train the student on the federation's labels and publish it with its model card.

The student regenerates every query it asked (from the batch plan: nothing but public specs), computes
features with the shared backbone in current-statistics mode over the same ``bn_batch`` chunks the teachers
used, and trains the head on the answered ones (unanswered ones may serve as pseudo-labels: post-processing,
no privacy cost). The model card carries the privacy guarantee, computed from the store's record of asked and
answered queries with the same data-independent accounting the guardian's ledger charges.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from capc_common.data import load_dataset
from capc_common.errors import InputError
from capc_common.federation import FederationConfig, batch_plan, load_shared_backbone
from capc_common.learn.student import accuracy, save_student, train_student
from capc_common.models import extract_features
from capc_services.student.accounting import privacy_of
from capc_services.student.scheduler import Progress
from capc_services.student.settings import StudentSettings
from capc_services.student.store import LabelStore

_log = logging.getLogger(__name__)


def noise_label(config: FederationConfig) -> str:
    """How the model card and ``/api/v1/progress`` name the student's noise source, so a model labelled
    with the test-only seeded source can never pass for a private one."""
    if not config.insecure_noise:
        return "SystemNoise"
    return "SeededNoise (INSECURE: labels are reproducible and not private)"


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


def publish_student(settings: StudentSettings, *, store: LabelStore, progress: Progress) -> dict[str, Any]:
    """Train, evaluate (if configured) and write ``student.safetensors`` + ``model_card.json``.

    Returns:
        What was published (paths, counts, ε, accuracy) for ``/api/v1/progress``.

    Raises:
        InputError: no answered query to learn from.
    """
    config = settings.federation_config
    start = time.perf_counter()
    device = pick_device(settings.train.device)
    backbone = load_shared_backbone(config)
    if device != "cpu":
        backbone = backbone.to(device)
    done = store.batches(state="done")
    indices, labels = store.all_labels()
    by_index = dict(zip(indices.tolist(), labels.tolist(), strict=True))
    features, targets = [], []
    for record in done:
        spec = batch_plan(config, first_index=record.first_index, count=record.count).spec
        feats = extract_features(backbone, spec.images(), bn_batch=spec.bn_batch, mode="current")
        features.append(feats)
        targets.append([by_index[spec.first_index + i] for i in range(spec.count)])
    if not features:
        raise InputError("no batch was labelled, so there is no student to train (see stopped_reason)")
    x = np.concatenate(features)
    y = np.concatenate([np.asarray(t, dtype=np.int64) for t in targets])
    answered = y >= 0
    fit = train_student(
        x[answered], y[answered], classes=config.classes, unlabelled=x[~answered], seed=config.queries.seed
    )
    evaluation: dict[str, Any] = {}
    evaluate = settings.train.evaluate
    if evaluate is not None:
        test = load_dataset(evaluate.dataset, split="test")
        images, truth = test.images, test.labels
        if evaluate.limit is not None:
            images, truth = images[: evaluate.limit], truth[: evaluate.limit]
        test_features = extract_features(backbone, images, bn_batch=config.queries.bn_batch, mode="current")
        evaluation = {
            "dataset": f"{evaluate.dataset}/test",
            "examples": len(truth),
            "accuracy": accuracy(fit.predict(test_features), truth),
            "bn_mode": "current",
            "bn_batch": config.queries.bn_batch,
        }
    parties = sorted({p for record in done for p in record.parties})
    counts = store.counts()
    card = {
        "model": "student head on the shared backbone (DIET-CaPC)",
        "federation": config.name,
        "config_hash": config.config_hash(),
        "privacy": privacy_of(config, store),
        "mechanism": {
            "name": config.mechanism.name,
            "threshold": config.mechanism.threshold,
            "sigma1": config.mechanism.sigma1,
            "sigma2": config.mechanism.sigma2,
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
        "bn": {"mode": "current", "min_batch": 16, "bn_batch": config.queries.bn_batch},
        "parties": {"guardian": config.guardian, "student": config.student, "teachers": parties},
        "training": {"l2": fit.l2, "pseudo_labelled": fit.pseudo_labelled, "device": device},
        "evaluation": evaluation,
        "stopped_reason": progress.stopped_reason,
    }
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    model_path = settings.output_dir / "student.safetensors"
    card_path = save_student(model_path, fit, card=card).replace(settings.output_dir / "model_card.json")
    seconds = time.perf_counter() - start
    _log.info("student trained", extra={"seconds": round(seconds, 2), "answered": int(answered.sum())})
    return {
        "model": str(model_path),
        "model_card": str(card_path),
        "epsilon": card["privacy"]["epsilon"],
        "answered": int(answered.sum()),
        "accuracy": evaluation.get("accuracy"),
        "device": device,
        "seconds": round(seconds, 2),
    }

"""The expensive stages of a prepared run: features → teachers → queries → students.

DIET-PATE and the PATE-without-public-data baseline share every stage; they differ only in the featurizer
(the shared frozen backbone vs standardised raw pixels) and in the heads (linear heads vs MLPs trained from
a random initialisation).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.dietpate.cache import FeatureCache
from capc_common.dietpate.config import RunConfig
from capc_common.dietpate.pipeline import (
    Log,
    Prepared,
    QueryLog,
    ask_queries,
    curve_prefixes,
    prepare,
    quiet,
    run_noise,
    shard_digest,
    split_answered,
)
from capc_common.dietpate.report import finish_report
from capc_common.learn.featurizers import Featurizer
from capc_common.learn.heads import HeadRecipe
from capc_common.learn.student import StudentFit, accuracy, save_student, train_student
from capc_common.learn.teachers import TeacherEnsemble, fit_teachers, shard_features

__all__ = ["execute", "run"]


def _recipes(prep: Prepared) -> tuple[HeadRecipe, tuple[HeadRecipe, ...]]:
    """``(the teachers' recipe, the student's candidate recipes)`` of the run's method."""
    cfg = prep.config
    if cfg.method == "pate-scratch":
        return cfg.baseline.recipe.recipe(), tuple(r.recipe() for r in cfg.baseline.student)
    return cfg.teachers.recipe.recipe(), tuple(r.recipe() for r in cfg.student.candidates)


def _student(prep: Prepared, qlog: QueryLog, upto: int) -> StudentFit:
    s = prep.config.student
    answered, unanswered, labels = split_answered(qlog, upto)
    return train_student(
        qlog.features[answered],
        labels,
        classes=prep.classes,
        unlabelled=qlog.features[unanswered] if s.pseudo_labels else None,
        candidates=_recipes(prep)[1],
        holdout=s.holdout,
        pseudo_confidence=s.pseudo_confidence if s.pseudo_labels else None,
        pseudo_weight=s.pseudo_weight,
        seed=prep.config.seed,
    )


def run(
    config: RunConfig, *, cache_dir: str | Path | None = None, progress: bool = False, log: Log = quiet
) -> dict[str, Any]:
    """Run the whole central pipeline and write its outputs into ``config.output``.

    Args:
        config: the validated configuration.
        cache_dir: feature cache directory (``None``: compute everything).
        progress: show progress bars on stderr.
        log: receives one line per stage.

    Returns:
        The report (also written to ``report.json`` in the output directory).
    """
    prep = prepare(config, log=log)
    return execute(prep, cache=FeatureCache(cache_dir), progress=progress, log=log)


def execute(prep: Prepared, *, cache: FeatureCache, progress: bool, log: Log) -> dict[str, Any]:
    """Run every stage of a prepared run and return (and write) its report."""
    cfg = prep.config
    fz, sfz = prep.featurizer, prep.student_featurizer
    same = sfz is fz
    timings = dict(prep.timings)
    mode, bn, eval_bn = cfg.backbone.bn_mode, cfg.backbone.bn_batch, cfg.student.eval_bn_batch
    data = {"dataset": cfg.dataset.model_dump(), "seed": cfg.seed}

    def eval_features(featurizer: Featurizer, stat_mode: str) -> npt.NDArray[np.float32]:
        return cache.get_or_compute(
            {"kind": "eval", "map": featurizer.sha256, "bn_batch": eval_bn, "mode": stat_mode, **data},
            lambda: featurizer.extract(prep.evaluation.images, bn_batch=eval_bn, mode=stat_mode),
        )

    start = time.perf_counter()
    recipe = _recipes(prep)[0]
    shards = {"map": fz.sha256, "shards": shard_digest(prep), "bn_batch": bn, "mode": mode, **data}
    teachers_key = {"kind": "teachers", "recipe": recipe.describe(), **shards}
    teacher_eval = eval_features(fz, mode)
    ensemble = cache.load_teachers(teachers_key)
    timings["features"] = time.perf_counter() - start
    if ensemble is None:
        start = time.perf_counter()

        def shard_rows() -> npt.NDArray[np.float32]:
            return cache.get_or_compute(
                {"kind": "shards", **shards},
                lambda: shard_features(fz, prep.train.images, prep.shards, bn_batch=bn, mode=mode)[0],
            )

        ensemble = fit_teachers(
            fz,
            prep.train.images,
            prep.train.labels,
            prep.shards,
            classes=prep.classes,
            bn_batch=bn,
            bn_mode=mode,
            recipe=recipe,
            seed=cfg.seed,
            features=shard_rows,
        )
        timings["teachers"] = time.perf_counter() - start
        log(f"teachers: {len(prep.shards)} heads trained ({fz.name} features, {recipe.optimizer})")
        cache.store_teachers(teachers_key, ensemble)
    else:
        log("teachers: reused from the cache")
    start = time.perf_counter()
    eval_hist = ensemble.votes(teacher_eval)
    per_teacher = (ensemble.predict(teacher_eval) == prep.evaluation.labels[None, :]).mean(axis=1)
    timings["teachers"] = timings.get("teachers", 0.0) + time.perf_counter() - start
    log(f"teachers: mean accuracy {per_teacher.mean():.4f}, best {per_teacher.max():.4f}")

    start = time.perf_counter()
    qlog = _queries(prep, ensemble, cache=cache, teachers_key=teachers_key, progress=progress, log=log)
    timings["queries"] = time.perf_counter() - start

    start = time.perf_counter()
    student_eval = teacher_eval if same else eval_features(sfz, mode)
    curve: list[dict[str, Any]] = []
    fit: StudentFit | None = None
    for point in curve_prefixes(prep, qlog, log=log):
        answered = int(np.sum(qlog.labels[: point.queries] >= 0))
        if answered == 0:
            continue
        fit = _student(prep, qlog, point.queries)
        acc = accuracy(fit.predict(student_eval), prep.evaluation.labels)
        curve.append(
            {
                "epsilon_target": point.target,
                "epsilon_spent": point.epsilon_spent,
                "epsilon_data_dependent": point.epsilon_data_dependent,
                "order": point.order,
                "queries": point.queries,
                "answered": answered,
                "student_accuracy": acc,
            }
        )
        log(
            f"student at ε {point.target:g} (spent {point.epsilon_spent:.3f}, {answered} labels): "
            f"accuracy {acc:.4f}"
        )
    extra: dict[str, Any] = {}
    if fit is not None and cfg.student.eval_running:
        running = eval_features(sfz, "running")
        extra["student_accuracy_running_stats"] = accuracy(fit.predict(running), prep.evaluation.labels)
    timings["student"] = time.perf_counter() - start

    return finish_report(
        prep,
        qlog=qlog,
        curve=curve,
        per_teacher=per_teacher,
        eval_hist=eval_hist,
        timings=timings,
        extra=extra,
        save_student=None if fit is None else _saver(prep, fit, ensemble),
        noise_kind=run_noise(cfg)[1],
        details={
            "featurizer": {"name": fz.name, "sha256": fz.sha256, "bn_mode": mode, "bn_batch": bn},
            "student_selection": None
            if fit is None
            else {"recipe": fit.recipe.describe(), "pseudo_labelled": fit.pseudo_labelled, **fit.selection},
        },
    )


def _queries(
    prep: Prepared,
    ensemble: TeacherEnsemble,
    *,
    cache: FeatureCache,
    teachers_key: dict[str, Any],
    progress: bool,
    log: Log,
) -> QueryLog:
    """The query stage, reusing the cached features and votes of the stream where available."""
    cfg = prep.config
    fz, sfz = prep.featurizer, prep.student_featurizer
    mode, bn = cfg.backbone.bn_mode, cfg.backbone.bn_batch
    q = cfg.queries
    stream = {
        "kind": "queries",
        "map": sfz.sha256,
        "generator": q.generator,
        "seed": q.seed,
        "shape": list(prep.train.images.shape[1:]),
        "bn_batch": bn,
        "mode": mode,
    }
    cached = cache.load(stream)
    have = 0 if cached is None else len(cached)
    votes_key = {"kind": "votes", "teachers": teachers_key, "stream": stream}
    cached_votes = cache.load(votes_key)
    have_votes = 0 if cached_votes is None else len(cached_votes)

    def featurise(images: npt.NDArray[np.uint8], first: int) -> npt.NDArray[np.float32]:
        # Batches are multiples of bn_batch, so chunks align with the cached stream's chunks.
        count = len(images)
        if cached is not None and first + count <= have:
            return cached[first : first + count]
        return sfz.extract(images, bn_batch=bn, mode=mode)

    def vote(
        images: npt.NDArray[np.uint8], feats: npt.NDArray[np.float32], first: int
    ) -> npt.NDArray[np.int64]:
        if cached_votes is not None and first + len(images) <= have_votes:
            return cached_votes[first : first + len(images)]
        return ensemble.votes(feats if sfz is fz else fz.extract(images, bn_batch=bn, mode=mode))

    qlog = ask_queries(prep, featurise, vote, progress=progress, log=log)
    if len(qlog.features) > have:
        cache.store(stream, qlog.features)
    if len(qlog.histograms) > have_votes:
        cache.store(votes_key, qlog.histograms)
    return qlog


def _saver(prep: Prepared, fit: StudentFit, ensemble: TeacherEnsemble) -> Any:
    def save(out: Path, card: dict[str, Any]) -> list[str]:
        card["student_selection"] = {"recipe": fit.recipe.describe(), "pseudo_labelled": fit.pseudo_labelled}
        card["featurizer"] = {"name": prep.student_featurizer.name, "sha256": prep.student_featurizer.sha256}
        target = out / "student.safetensors"
        paths = [str(target), str(save_student(target, fit, card=card))]
        if prep.config.save_teachers:
            ensemble.save(out / "teachers.safetensors")
            paths.append(str(out / "teachers.safetensors"))
        return paths

    return save

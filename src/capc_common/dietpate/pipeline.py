"""The central DIET-PATE pipeline: data → shards → teachers → private query labelling → student → report.

Everything runs on one machine, but queries are processed exactly as a federation would process them: in
batches of ``queries.batch_size`` synthetic images regenerated from ``(generator, seed, first index,
count)``, featurised in chunks of exactly ``bn_batch`` with the configured BatchNorm statistics, voted on
by every teacher, aggregated into a histogram and answered by the mechanism with noise drawn in the
canonical order (:mod:`capc_common.aggregation.noise`: the guardian's source draws z1_g and z2, the student's
its part z1_s of the threshold noise). With the same seed for both sources a federation therefore releases
the same labels, query by query.

:func:`prepare` performs every check that can fail on bad input (unknown dataset or generator, backbone and
image shapes, more teachers than samples (a position-based partition), a budget that cannot pay
for one batch) before any expensive work; :func:`capc_common.dietpate.run` then executes the stages
(:mod:`capc_common.dietpate.stages`) and returns the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from capc_common.aggregation import MechanismNoise, mechanism_noise
from capc_common.dietpate.accounting import make_budget
from capc_common.dietpate.cache import digest_indices
from capc_common.dietpate.config import RunConfig
from capc_common.dietpate.report import finite
from capc_common.errors import InputError
from capc_common.learn.featurizers import BackboneFeaturizer, Featurizer, PixelFeaturizer
from capc_common.learn.teachers import short_shards
from capc_common.mechanisms import UNANSWERED

if TYPE_CHECKING:
    from capc_common.data import Dataset
    from capc_common.mechanisms import SelectionMechanism
    from capc_common.models import Backbone
    from capc_common.privacy.budget import RunBudget

__all__ = ["CurvePoint", "Prepared", "curve_prefixes", "curve_targets", "next_batch", "prepare", "run_noise"]

Log = Callable[[str], None]


def quiet(_: str) -> None:
    """Default logger: say nothing."""


@dataclass
class Prepared:
    """A validated run: data split, shards, backbones, budget — everything but the expensive work.

    Attributes:
        config: the configuration.
        train: the teachers' data (the training split minus any validation hold-out).
        evaluation: the data accuracy is reported on (test split, or the validation hold-out).
        shards: one index array into ``train`` per teacher.
        classes: number of classes.
        featurizer: the teachers' frozen map (the shared backbone, or raw pixels for the baseline).
        student_featurizer: the student's map (the same object unless the ablation asks otherwise).
        mechanism: the aggregation mechanism (its noise, output rule and accounting).
        budget: the run's privacy budget.
    """

    config: RunConfig
    train: Dataset
    evaluation: Dataset
    shards: list[npt.NDArray[np.int64]]
    classes: int
    featurizer: Featurizer
    student_featurizer: Featurizer
    mechanism: SelectionMechanism
    budget: RunBudget
    timings: dict[str, float] = field(default_factory=dict)


def _subset(data: Dataset, index: npt.NDArray[np.int64], name: str) -> Dataset:
    from capc_common.data import Dataset

    return Dataset(
        images=np.ascontiguousarray(data.images[index]),
        labels=np.ascontiguousarray(data.labels[index]),
        num_classes=data.num_classes,
        class_names=data.class_names,
        name=name,
    )


def _split_data(config: RunConfig) -> tuple[Dataset, Dataset]:
    """Load the dataset and cut it into the teachers' part and the evaluation set (seeded, public)."""
    from capc_common.data import load_dataset

    ds = config.dataset
    train = load_dataset(ds.name, split="train", root=ds.root)
    rng = np.random.default_rng([config.seed, 0x5EED])
    order = rng.permutation(len(train.labels))
    if ds.train_limit is not None:
        if ds.train_limit > len(order):
            raise InputError(
                f"dataset.train_limit {ds.train_limit} exceeds the {len(order)} training images of {ds.name}"
            )
        order = order[: ds.train_limit]
    if ds.validation >= len(order):
        raise InputError(
            f"dataset.validation {ds.validation} leaves no training images out of {len(order)}; lower it"
        )
    held, kept = np.sort(order[: ds.validation]), np.sort(order[ds.validation :])
    teachers_part = _subset(train, kept, f"{train.name} (teachers)")
    if ds.evaluate_on == "validation":
        return teachers_part, _subset(train, held, f"{train.name} (validation hold-out)")
    test = load_dataset(ds.name, split="test", root=ds.root)
    if ds.test_limit is not None and ds.test_limit < len(test.labels):
        pick = np.sort(np.random.default_rng([config.seed, 0x7E57]).permutation(len(test.labels)))
        test = _subset(test, np.sort(pick[: ds.test_limit]), f"{test.name} (subset)")
    return teachers_part, test


def _load_backbone(name: str, shape: tuple[int, int, int], sha256: str | None) -> Backbone:
    from capc_common.models import default_backbone, format_shape, load_backbone

    backbone = load_backbone(default_backbone(*shape) if name == "default" else name, sha256=sha256)
    if tuple(backbone.input_shape) != tuple(shape):
        raise InputError(
            f"backbone {name!r} takes {format_shape(backbone.input_shape)} images but the dataset has "
            f"{format_shape(shape)}; choose a backbone for {format_shape(shape)} (or 'default')"
        )
    return backbone


def prepare(config: RunConfig, *, log: Log = quiet) -> Prepared:
    """Validate a run end to end and load what it needs, before any expensive stage.

    Raises:
        InputError: unknown dataset, generator or backbone; backbone/data shape mismatch; more teachers than
            samples under a position-based partition (under ``hash`` a shard shorter than one BatchNorm chunk
            makes its teacher abstain, never the run refuse); an evaluation set smaller than the evaluation
            chunk; a budget too small for one batch.
    """
    from capc_common.data import partition
    from capc_common.synth import GENERATOR_NAMES

    start = time.perf_counter()
    q = config.queries
    if q.generator not in GENERATOR_NAMES:
        raise InputError(f"unknown generator {q.generator!r}; choose one of {', '.join(GENERATOR_NAMES)}")
    train, evaluation = _split_data(config)
    h, w, c = (int(v) for v in train.images.shape[1:])
    shape = (h, w, c)
    t = config.teachers
    if t.partition != "hash" and t.count > len(train.labels):
        raise InputError(
            f"{t.count} teachers but only {len(train.labels)} training images: every teacher needs its own "
            f"data; use at most {len(train.labels) // config.backbone.bn_batch} teachers with bn_batch "
            f"{config.backbone.bn_batch}"
        )
    shards = partition(
        train.labels,
        shards=t.count,
        scheme=t.partition,
        seed=config.seed,
        imbalance_ratio=t.imbalance_ratio,
        alpha=t.alpha,
        images=train.images if t.partition == "hash" else None,
    )
    short = short_shards(shards, bn_batch=config.backbone.bn_batch)
    if short:
        # Not refused: whether the run trains must not hinge on one example; a short shard's teacher abstains.
        log(
            f"warning: {len(short)} of {t.count} teacher shards hold fewer than one BatchNorm chunk "
            f"({config.backbone.bn_batch} images): those teachers abstain (a fixed vote); `capc federation "
            f"plan --examples {len(train.labels)} --bn-batch {config.backbone.bn_batch} --classes C "
            "--epsilon E` proposes a count whose shards all hold one chunk"
        )
    eval_chunk = config.student.eval_bn_batch
    if len(evaluation.labels) < eval_chunk:
        raise InputError(
            f"the evaluation set has {len(evaluation.labels)} images, fewer than student.eval_bn_batch "
            f"{eval_chunk}"
        )
    featurizer: Featurizer
    if config.method == "diet-pate":
        bb = config.backbone
        featurizer = BackboneFeaturizer(_load_backbone(bb.name, shape, bb.sha256))
        student_featurizer: Featurizer = (
            featurizer
            if bb.student == "same"
            else BackboneFeaturizer(_load_backbone(bb.student, shape, None))
        )
    else:
        featurizer = student_featurizer = PixelFeaturizer(shape)
    smallest_batch = config.backbone.bn_batch if q.shrink_tail else min(q.batch_size, q.max_queries)
    budget = make_budget(
        config.mechanism,
        config.budget,
        teachers=t.count,
        classes=train.num_classes,
        smallest_batch=smallest_batch,
    )
    Path(config.output).mkdir(parents=True, exist_ok=True)
    log(
        f"prepared: {len(train.labels)} training images in {t.count} shards, evaluation on "
        f"{evaluation.name} ({len(evaluation.labels)}), filter order {budget.filter.order:g}"
    )
    return Prepared(
        config=config,
        train=train,
        evaluation=evaluation,
        shards=shards,
        classes=train.num_classes,
        featurizer=featurizer,
        student_featurizer=student_featurizer,
        mechanism=config.mechanism.build(teachers=t.count, classes=train.num_classes),
        budget=budget,
        timings={"prepare": time.perf_counter() - start},
    )


def run_noise(config: RunConfig) -> tuple[MechanismNoise, str]:
    """The run's two noise sources (the guardian's and the student's, as in a federation) and their kind."""
    seed = config.mechanism.noise_seed
    noise = mechanism_noise(seed=seed)  # the guardian's and the student's sources, as in a federation
    if seed is None:
        return noise, "system CSPRNG"
    return noise, "SEEDED (reproducible, not private: research/differential tests only)"


@dataclass
class QueryLog:
    """Everything the query stage produced, in query order.

    Attributes:
        features: student features of every query asked.
        histograms: vote histograms ``(Q, c)``.
        labels: released labels ``(Q,)``, −1 where unanswered.
        batch_ends: cumulative query count after each batch.
        batch_epsilon: ε spent after each batch (the filter's odometer).
        stop_reason: why the stage stopped.
    """

    features: npt.NDArray[np.float32]
    histograms: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]
    batch_ends: list[int]
    batch_epsilon: list[float]
    stop_reason: str


def next_batch(prep: Prepared, first: int) -> int:
    """Size of the batch starting at query ``first``; 0 when the stream or the budget is exhausted.

    As the guardian does, a batch may start only if its *worst case* (every query answered) fits what
    remains of the budget after the charges actually made. A full batch is tried first; with
    ``queries.shrink_tail`` ever smaller multiples of ``bn_batch`` are tried next, so the end of the budget
    is not wasted on an all-or-nothing batch. A federation whose student applies the same rule asks the
    same batches.
    """
    return _batch_size(prep.config, prep.budget, first)


def _batch_size(config: RunConfig, budget: RunBudget, first: int) -> int:
    """:func:`next_batch` for any budget (the run's own, or a curve point's replayed filter)."""
    q, bn = config.queries, config.backbone.bn_batch
    limit = q.max_queries - q.max_queries % bn
    count = min(q.batch_size, limit - first)
    if count <= 0:
        return 0
    while not budget.fits(count) and q.shrink_tail and count > bn:
        count = max(bn, (count // 2) // bn * bn)
    return count if budget.fits(count) else 0


def ask_queries(
    prep: Prepared,
    featurise: Callable[[npt.NDArray[np.uint8], int], npt.NDArray[np.float32]],
    vote: Callable[[npt.NDArray[np.uint8], npt.NDArray[np.float32], int], npt.NDArray[np.int64]],
    *,
    progress: bool,
    log: Log = quiet,
) -> QueryLog:
    """Run the query stream batch by batch until the budget or ``max_queries`` stops it.

    Args:
        prep: the prepared run.
        featurise: ``(images, first) → features`` of the batch starting at query ``first`` (student map).
        vote: ``(images, features, first) → histograms`` of that batch.
        progress: show a progress bar on stderr.
        log: stage messages.
    """
    from capc_common.synth import generate

    cfg = prep.config
    q = cfg.queries
    shape = prep.train.images.shape[1:]
    noise, _ = run_noise(cfg)
    feats: list[npt.NDArray[np.float32]] = []
    hists: list[npt.NDArray[np.int64]] = []
    labels: list[npt.NDArray[np.int64]] = []
    ends: list[int] = []
    eps: list[float] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=q.max_queries, desc="queries", unit="q", leave=False, dynamic_ncols=True)
    first = 0
    while count := next_batch(prep, first):
        images = generate(
            q.generator,
            seed=q.seed,
            start=first,
            count=count,
            height=shape[0],
            width=shape[1],
            channels=shape[2],
        )
        f = featurise(images, first)
        hist = vote(images, f, first)
        lab = prep.mechanism.answer(hist, noise)
        prep.budget.charge(hist, lab != UNANSWERED)
        feats.append(f)
        hists.append(hist)
        labels.append(lab)
        first += count
        ends.append(first)
        eps.append(prep.budget.epsilon)
        if bar is not None:
            bar.update(count)
            bar.set_postfix(answered=prep.budget.answered, eps=f"{prep.budget.epsilon:.3f}")
    if bar is not None:
        bar.close()
    asked = ends[-1] if ends else 0
    if asked >= q.max_queries - q.max_queries % cfg.backbone.bn_batch:
        reason = f"asked queries.max_queries ({asked})"
    else:
        reason = "privacy budget: the worst case of the next batch would not fit"
    log(f"queries: {asked} asked, {prep.budget.answered} answered, ε {prep.budget.epsilon:.3f} ({reason})")
    dim = feats[0].shape[1] if feats else 0
    return QueryLog(
        features=np.concatenate(feats) if feats else np.zeros((0, dim), np.float32),
        histograms=np.concatenate(hists) if hists else np.zeros((0, prep.classes), np.int64),
        labels=np.concatenate(labels) if labels else np.zeros(0, np.int64),
        batch_ends=ends,
        batch_epsilon=eps,
        stop_reason=reason,
    )


@dataclass(frozen=True)
class CurvePoint:
    """The queries a run stopped at a smaller budget would have asked (one point of accuracy vs ε).

    Attributes:
        target: the budget ε of the replayed run: its guarantee.
        epsilon_spent: the ε its charges add up to at its own filter order (an odometer, not a guarantee).
        order: that filter's order.
        queries: how many queries (a prefix of the logged stream) it asked.
        epsilon_data_dependent: PATE-2018 data-dependent ε of that prefix (UNSANITISED), if tracked.
    """

    target: float
    epsilon_spent: float
    order: float
    queries: int
    epsilon_data_dependent: float | None


def curve_targets(config: RunConfig) -> list[float]:
    """The budgets of the accuracy-vs-ε curve, ascending: ``student.curve_epsilons`` up to the run's budget
    (default ``budget·k/curve_points``), and always the run's own budget (whose student is the report's)."""
    s, eps = config.student, config.budget.epsilon
    points = s.curve_epsilons or tuple(eps * k / s.curve_points for k in range(1, s.curve_points + 1))
    return sorted({*(p for p in points if p <= eps), eps})


def curve_prefixes(prep: Prepared, log_: QueryLog, *, log: Log = quiet) -> list[CurvePoint]:
    """For each curve budget, replay the logged batches through *that* budget's own Rényi filter.

    Each point is exactly the run the pipeline would have made with ``budget.epsilon`` set to the target:
    its own automatically planned order, the same worst-case admission and tail shrinking (a shrunk batch
    asks the first queries of the logged one, whose labels have the same distribution), stopping where
    its filter stops (or where the logged run ended). So every point's target is a guarantee on its own —
    unlike cutting the run's log wherever its running ε first exceeds a target, a data-dependent choice
    made at the wrong order. A target that cannot pay for one batch is skipped.
    """
    cfg = prep.config
    smallest = cfg.backbone.bn_batch if cfg.queries.shrink_tail else cfg.queries.batch_size
    answered = log_.labels != UNANSWERED
    points: list[CurvePoint] = []
    for target in curve_targets(cfg):
        try:
            budget = make_budget(
                cfg.mechanism,
                cfg.budget.model_copy(update={"epsilon": target}),
                teachers=cfg.teachers.count,
                classes=prep.classes,
                smallest_batch=min(smallest, cfg.queries.max_queries),
            )
        except InputError as exc:
            log(f"curve: skipping ε {target:g} ({exc})")
            continue
        first = 0
        while (count := _batch_size(cfg, budget, first)) and first + count <= len(log_.labels):
            budget.charge(log_.histograms[first : first + count], answered[first : first + count])
            first += count
        points.append(
            CurvePoint(
                target=target,
                epsilon_spent=budget.epsilon,
                order=budget.filter.order,
                queries=first,
                epsilon_data_dependent=finite(budget.epsilon_data_dependent(cfg.budget.delta)),
            )
        )
    return points


def split_answered(
    log_: QueryLog, upto: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices of answered and unanswered queries among the first ``upto``, and the answered labels."""
    labels = log_.labels[:upto]
    answered = np.flatnonzero(labels != UNANSWERED)
    return answered, np.flatnonzero(labels == UNANSWERED), labels[answered]


def shard_digest(prep: Prepared) -> str:
    """Names the teachers' data split (for cache keys): dataset, limits, validation and shard indices."""
    return digest_indices(
        np.concatenate([np.asarray(s) for s in prep.shards] + [np.array([len(prep.shards)])])
    )

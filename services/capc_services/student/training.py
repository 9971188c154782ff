"""The student's training in bounded memory: features streamed batch by batch, the fit chunked.

Holding every query's features at once grows with the run — 100,000 queries of the default backbone's
3,969 features are 1.6 GB per copy, and fitting makes several (the issue measured 6.3 GB). Here features are
computed one batch at a time into a buffer of at most ``chunk_queries`` rows; each full buffer is fitted on
its own (:func:`~capc_common.learn.student.train_student`, unchanged) and dropped. A run that fits in one
chunk — every federation the project has measured — gets exactly the fit it always got; a longer run's
student is the average of its chunks' linear heads, weighted by their answered queries (one-shot parameter
averaging: for strongly convex problems such as this L2-regularised softmax regression it matches the
fit on all the data to first order once chunks are large — Zhang, Duchi & Wainwright, "Communication-
efficient algorithms for statistical optimization", JMLR 2013). Training stops between batches when asked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from capc_common.errors import CapcError, InputError

if TYPE_CHECKING:  # torch is imported only once the student trains (a labelling student starts faster)
    from capc_common.learn.heads import HeadRecipe
    from capc_common.learn.student import StudentFit

CHUNK_QUERIES = 16384
"""Queries whose features are held at once (about 260 MB with the default backbone's 3,969 features)."""


class TrainingStopped(CapcError):
    """Training was interrupted (the process is shutting down); it runs again at the next start."""


def fit_streamed(
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    *,
    classes: int,
    seed: int,
    chunk_queries: int = CHUNK_QUERIES,
    stop: threading.Event | None = None,
) -> tuple[StudentFit, int]:
    """Fit the student on ``(features, labels)`` batches (labels −1 where a query was not answered).

    Args:
        batches: each batch's float32 ``(n, dim)`` features and ``(n,)`` labels, in query order.
        classes: number of classes.
        seed: seeds the fit (public randomness).
        chunk_queries: most queries whose features are held at once (a batch larger than that is one chunk).
        stop: when set, training stops before the next batch.

    Returns:
        The fit and the number of chunks it was made of.

    Raises:
        TrainingStopped: ``stop`` was set.
        InputError: no query was answered.
    """
    from capc_common.learn.student import train_student

    fits: list[tuple[StudentFit, int]] = []
    buffer: np.ndarray | None = None
    labels: list[np.ndarray] = []
    held = 0

    def fit_chunk() -> None:
        nonlocal held
        assert buffer is not None
        x, y = buffer[:held], np.concatenate(labels)
        answered = y >= 0
        if answered.any():  # a chunk with no answer has nothing to learn from (post-processing only)
            fit = train_student(x[answered], y[answered], classes=classes, unlabelled=x[~answered], seed=seed)
            fits.append((fit, int(answered.sum())))
        labels.clear()
        held = 0

    for features, batch_labels in batches:
        if stop is not None and stop.is_set():
            raise TrainingStopped("student training was stopped; it runs again at the next start")
        n = len(batch_labels)
        if buffer is None or held + n > len(buffer):
            if held:
                fit_chunk()
            if buffer is None or n > len(buffer):
                buffer = np.empty((max(chunk_queries, n), features.shape[1]), dtype=np.float32)
        buffer[held : held + n] = features
        labels.append(np.asarray(batch_labels, dtype=np.int64))
        held += n
    if held:
        fit_chunk()
    if not fits:
        raise InputError("no batch was labelled, so there is no student to train (see stopped_reason)")
    return (fits[0][0] if len(fits) == 1 else _average(fits)), len(fits)


def _average(fits: list[tuple[StudentFit, int]]) -> StudentFit:
    """One linear head: the chunks' parameters averaged, weighted by their answered queries."""
    import torch

    from capc_common.learn.heads import HeadEnsemble
    from capc_common.learn.student import StudentFit

    heads = [fit.head for fit, _ in fits]
    if any(head.kind != "linear" for head in heads):
        raise InputError("only linear student heads can be averaged across chunks")
    weights = torch.tensor([float(w) for _, w in fits]) / sum(w for _, w in fits)
    params = {
        name: sum(weight * head.params[name] for weight, head in zip(weights, heads, strict=True))
        for name in heads[0].params
    }
    first = fits[0][0]
    selection: dict[str, Any] = {"chunks": [fit.selection for fit, _ in fits]}
    return StudentFit(
        head=HeadEnsemble(first.head.kind, params, first.head.classes, dict(first.head.metadata)),
        recipe=_weighted_mode_recipe(fits),
        pseudo_labelled=sum(fit.pseudo_labelled for fit, _ in fits),
        selection=selection,
    )


def _weighted_mode_recipe(fits: list[tuple[StudentFit, int]]) -> HeadRecipe:
    """The recipe most of the answered queries' chunks chose (reported on the model card)."""
    votes: dict[HeadRecipe, int] = {}
    for fit, weight in fits:
        votes[fit.recipe] = votes.get(fit.recipe, 0) + weight
    return max(votes, key=lambda recipe: votes[recipe])

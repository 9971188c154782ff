"""The student's streamed, chunked training: the same fit when one chunk holds the run, bounded otherwise."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from capc_common.errors import InputError
from capc_common.learn.student import train_student
from capc_services.student.training import TrainingStopped, fit_streamed


def _batches(n_batches: int, *, size: int = 32, dim: int = 24, seed: int = 0):
    rng = np.random.default_rng(seed)  # public data for the test
    centres = rng.normal(size=(4, dim)).astype(np.float32) * 3
    out = []
    for _ in range(n_batches):
        y = rng.integers(0, 4, size)
        x = (centres[y] + rng.normal(size=(size, dim))).astype(np.float32)
        labels = np.where(rng.random(size) < 0.6, y, -1)  # 40 % not answered
        out.append((x, labels.astype(np.int64)))
    return out


def test_a_run_that_fits_one_chunk_gets_exactly_the_unchunked_fit() -> None:
    batches = _batches(6)
    fit, chunks = fit_streamed(batches, classes=4, seed=3, chunk_queries=1024)
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    whole = train_student(x[y >= 0], y[y >= 0], classes=4, unlabelled=x[y < 0], seed=3)
    assert chunks == 1
    for name, tensor in whole.head.params.items():
        assert torch.equal(fit.head.params[name], tensor)
    assert (fit.recipe, fit.pseudo_labelled) == (whole.recipe, whole.pseudo_labelled)


def test_a_longer_run_averages_its_chunks_and_still_learns() -> None:
    batches = _batches(12)
    fit, chunks = fit_streamed(batches, classes=4, seed=3, chunk_queries=96)  # 3 batches per chunk
    assert chunks == 4
    x = np.concatenate([b[0] for b in batches])
    truth = np.concatenate([b[1] for b in batches])
    answered = truth >= 0
    assert np.mean(fit.predict(x[answered]) == truth[answered]) > 0.9
    assert len(fit.selection["chunks"]) == 4


def test_training_stops_between_batches_when_asked() -> None:
    stop = threading.Event()
    seen = []

    def stream():
        for batch in _batches(5):
            seen.append(1)
            if len(seen) == 2:
                stop.set()
            yield batch

    with pytest.raises(TrainingStopped, match="stopped"):
        fit_streamed(stream(), classes=4, seed=0, stop=stop)
    assert len(seen) == 2


def test_no_answer_at_all_is_refused() -> None:
    x, _ = _batches(1)[0]
    with pytest.raises(InputError, match="no batch was labelled"):
        fit_streamed([(x, np.full(32, -1))], classes=4, seed=0)


@pytest.mark.parametrize("count", [16, 40, 87, 160])
def test_features_a_few_chunks_at_a_time_equal_one_pass(count: int) -> None:
    from capc_common.models import extract_features, load_backbone
    from capc_common.synth import generate
    from capc_services.student.publish import _features

    backbone = load_backbone("scatter-28x28x1")
    images = generate("dead_leaves", seed=1, start=0, count=count, height=28, width=28, channels=1)
    whole = extract_features(backbone, images, bn_batch=16, mode="current")
    np.testing.assert_array_equal(_features(backbone, images, bn_batch=16, stop=None), whole)

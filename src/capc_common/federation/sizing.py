"""Sizing a federation from its data: teachers per party, mechanism, batches and the answers to expect.

Under the rigorous (data-independent) accounting every answer costs ``λ/σ2²`` whatever the votes, so a
federation buys answers in proportion to ``σ2²``; vote margins grow with the number of teachers ``k``, so
noise proportional to ``k`` keeps labels equally clean while the answers grow like ``k²``. The right
number of teachers is therefore the largest the data allows: every teacher's shard should still hold one
BatchNorm chunk of ``bn_batch`` images (its statistics come from its own data; a shorter shard's teacher
abstains with a fixed vote, which adds no knowledge). Teachers are assigned by a content hash
(:func:`capc_common.data.partition`, scheme ``hash``), so shard sizes vary; the proposal keeps the chance
that any shard falls short below 0.1 %.

The mechanism is scaled as ``T = 0.6 k``, ``σ1 = 0.7 k``, ``σ2 = 0.16 k`` — the ratios chosen on a
validation split of Fashion-MNIST's training data (docs/dietpate.md, "Choosing the recipe"), which also
carried over to scikit-learn's digits without retuning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from capc_common.errors import InputError
from capc_common.privacy import plan

__all__ = [
    "DPSGD_RECIPE",
    "DPSGD_ROUNDS",
    "MECHANISM_RATIOS",
    "dpsgd_mechanism",
    "examples_for",
    "heads_for",
    "propose",
    "scaled_mechanism",
]

#: ``(T, σ1, σ2)`` per teacher, chosen on a validation split (docs/dietpate.md).
MECHANISM_RATIOS = (0.6, 0.7, 0.16)
#: The answer rate the proposal plans with (measured on synthetic queries: 0.3–0.6).
ANSWER_RATE = 0.5
#: Acceptable probability (union bound) that some teacher's shard is smaller than one BatchNorm chunk.
_SHORT_SHARD_RISK = 0.001


#: Secure-aggregation DP-SGD's gradient rounds (docs/mechanisms.md, "A learning recipe" and "More rounds under
#: the step that follows the noise": 100 beat 60 by 0.2 points at ε 3 and 0.4 at ε 1 on the validation split).
DPSGD_ROUNDS = 100
#: Its step (docs/mechanisms.md, "A step that follows the noise"): every per-example gradient clipped well
#: below the records' norm, coordinates of unit variance, heavy ball at the step that puts noise of σ 0.004 on
#: each weight per round (capped at ``lr · C = 25``). Chosen on Fashion-MNIST's validation split; it carried
#: to scikit-learn's digits, whose noise per record is 30 times larger, without retuning.
DPSGD_RECIPE: dict[str, Any] = {
    "clip": 0.1,
    "optimizer": "momentum",
    "learning_rate": 250.0,
    "step_noise": 0.004,
    "unit_variance": True,
}


def dpsgd_mechanism(
    *, epsilon: float, delta: float = 1e-5, rounds: int = DPSGD_ROUNDS
) -> tuple[dict[str, Any], float]:
    """``secagg-dpsgd``'s federation.yaml fields for a budget, and the ledger order they are planned at.

    Full batch, the recipe's step (:data:`DPSGD_RECIPE`); the noise multiplier is the smallest (rounded
    up, to 1e-4) whose releases — the statistics release and ``rounds`` gradient rounds, each the discrete
    Gaussian's ``α/(2z²)`` (Canonne, Kamath & Steinke 2020) — cost at most ``epsilon`` (improved
    conversion), at the order where they cost least.
    """
    import numpy as np

    from capc_common.mechanisms import calibrate
    from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp

    releases = rounds + 1

    def spent(z: float) -> tuple[float, float]:
        eps, order = epsilon_from_rdp(DEFAULT_ORDERS, releases * DEFAULT_ORDERS / (2 * z * z), delta=delta)
        return float(eps), float(order)

    z = math.ceil(calibrate(lambda z: spent(z)[0], target=epsilon) * 1e4) / 1e4
    fields = {
        "name": "secagg-dpsgd",
        "rounds": rounds,
        "noise_multiplier": z,
        "statistics": True,
        **DPSGD_RECIPE,
    }
    return fields, float(np.asarray(spent(z)[1]))


def scaled_mechanism(teachers: int) -> dict[str, float]:
    """Confident-GNMax parameters for ``teachers`` votes per query (:data:`MECHANISM_RATIOS`)."""
    t, s1, s2 = MECHANISM_RATIOS
    return {
        "threshold": round(t * teachers, 1),
        "sigma1": round(s1 * teachers, 2),
        "sigma2": round(s2 * teachers, 2),
    }


def _short_shard_risk(examples: int, heads: int, bn_batch: int) -> float:
    """Union bound on P(some of ``heads`` hash shards of ``examples`` holds fewer than ``bn_batch``)."""
    from scipy import special  # the binomial CDF without scipy.stats' import (seconds on a busy machine)

    return float(heads * special.bdtr(bn_batch - 1, examples, 1.0 / heads))


def heads_for(examples: int, *, bn_batch: int) -> int:
    """The most teacher heads a party with ``examples`` images can hold (0 if not even one)."""
    if examples < bn_batch:
        return 0
    heads = max(1, examples // bn_batch)
    while heads > 1 and _short_shard_risk(examples, heads, bn_batch) > _SHORT_SHARD_RISK:
        heads -= 1
    return heads


def examples_for(heads: int, *, bn_batch: int) -> int:
    """The fewest examples a party needs for ``heads`` teacher heads (:func:`heads_for`'s inverse: the
    smallest count whose ``heads`` hash shards all hold one BatchNorm chunk with probability ≥ 99.9 %)."""
    low, high = heads * bn_batch - 1, heads * bn_batch  # the risk at the mean shard size is far above 0.1 %
    while _short_shard_risk(high, heads, bn_batch) > _SHORT_SHARD_RISK:
        low, high = high, 2 * high
    while high - low > 1:  # the risk falls as the count grows: bisect for its first acceptable count
        middle = (low + high) // 2
        if _short_shard_risk(middle, heads, bn_batch) > _SHORT_SHARD_RISK:
            low = middle
        else:
            high = middle
    return high


def propose(
    examples: Sequence[int],
    *,
    classes: int,
    epsilon: float,
    delta: float = 1e-5,
    bn_batch: int = 64,
    batch_size: int = 512,
) -> dict[str, Any]:
    """A federation.yaml-ready proposal for parties holding ``examples[i]`` labelled images each.

    Args:
        examples: images per teacher party.
        classes: number of classes.
        epsilon: the federation's budget ε.
        delta: δ.
        bn_batch: BatchNorm chunk (16 at the very least; 64 is what the shipped backbones were checked with).
        batch_size: largest query batch (rounded down to a multiple of ``bn_batch``).

    Returns:
        ``{"heads": [per party], "teachers", "mechanism": {...}, "budget": {"epsilon", "delta", "order"},
        "queries": {"total", "batch_size", "bn_batch"}, "expected": {"queries", "answered"},
        "notes": [...]}``.

    Raises:
        InputError: no party, a party too small for one teacher, or a budget that buys nothing.
    """
    if not examples:
        raise InputError("need the number of examples of at least one party")
    if bn_batch < 16:
        raise InputError(f"bn_batch must be at least 16 (current statistics need it), got {bn_batch}")
    heads = [heads_for(int(n), bn_batch=bn_batch) for n in examples]
    if min(heads) == 0:
        small = [n for n, h in zip(examples, heads, strict=True) if h == 0]
        raise InputError(
            f"parties with {small} images cannot hold one teacher: each teacher needs at least one BatchNorm "
            f"chunk of {bn_batch} images; lower bn_batch (≥ 16) or leave those parties out"
        )
    teachers = sum(heads)
    mechanism = scaled_mechanism(teachers)
    budget = plan(
        teachers=teachers,
        classes=classes,
        threshold=mechanism["threshold"],
        sigma1=mechanism["sigma1"],
        sigma2=mechanism["sigma2"],
        epsilon=epsilon,
        delta=delta,
        answer_rate=ANSWER_RATE,
    )
    # At most an eighth of the expected stream per batch, so the budget's end wastes little of it.
    batch = max(bn_batch, min(batch_size, budget["queries"] // 8) // bn_batch * bn_batch)
    total = math.ceil(1.25 * budget["queries"] / batch) * batch  # headroom: the budget, not the stream, stops
    notes = []
    if teachers < 200:
        notes.append(
            f"only {teachers} teachers: under rigorous accounting answers grow with the square of the "
            "teacher count, so expect few answers and a weak student; more data per party"
            + (
                ", or a smaller bn_batch (32 was measured), buys more teachers"
                if bn_batch > 32
                else " buys more teachers"
            )
        )
    if bn_batch > 32 and sum(heads_for(int(n), bn_batch=32) for n in examples) >= 2 * teachers:
        notes.append("bn_batch 32 would more than double the teachers (and the answers by ~4×)")
    return {
        "heads": heads,
        "teachers": teachers,
        "mechanism": {"name": "confident-gnmax", **mechanism},
        "budget": {"epsilon": epsilon, "delta": delta, "order": budget["order"]},
        "queries": {"total": total, "batch_size": batch, "bn_batch": bn_batch},
        "expected": {
            "queries": budget["queries"],
            "answered": budget["answered"],
            "answer_rate": ANSWER_RATE,
        },
        "notes": notes,
    }

"""DPPL-Public as a release (the federation's form): every private record votes for its nearest candidate of a
public pool, the per-class vote counts are released with discrete Gaussian noise, and each class's
prototypes are its ``K`` candidates with the most noisy votes (report-noisy-max, top-K by post-processing).

Why a second selection besides :class:`~capc_common.mechanisms.PublicPrototypes`' exponential mechanism:
the exponential mechanism needs a sampler over the *summed* scores, which the engine could only run inside a
2PC it does not have (an exact exponential draw in a garbled circuit). Vote counts, instead, are integer sums
the engine already releases — the parties secret-share them, the guardian adds discrete Gaussian noise to
the shared total and charges the ledger, only the noisy counts are revealed
(:mod:`capc_common.mechanisms.release`) — so the federation runs it like DP prototypes. It is a
report-noisy-max variant of the DPPL-Public selection (Wahdany et al., AAAI 2025, select with the exponential
mechanism over summed similarities; here the score is nearest-candidate votes), with Gaussian noise and the
whole noisy histogram released (more than the argmax, and charged as such).

**Score.** A record ``x`` of class ``c`` votes for ``argmax_j cos(x, e_j)`` over the pool (ties: the lowest
index, so the vote is a function of ``x`` alone); class ``c``'s count of ``j`` is the number of its records
voting for ``j``. The pool is public (a generator, a seed, a count) and featurised by the shared backbone
per example; only the votes look at private data.

**Accounting.** Adding or removing one record changes one count of the ``classes × M`` histogram by one:
L2 sensitivity 1. The discrete Gaussian ``N_Z(0, σ²)`` on every count makes the release
``ρ = 1/(2σ²)``-zCDP (Canonne, Kamath & Steinke 2020, Thm. 14; Bun & Steinke 2016), RDP ``ρλ`` at order
λ; top-K selection and the prototypes are post-processing, so ``K`` costs nothing extra. **Neighbouring
relation: add/remove.** Under replace-one two counts move (sensitivity √2): ``ρ`` doubles. ``params()``
names the relation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mechanisms._records import labelled
from capc_common.mechanisms.prototypes import normalise
from capc_common.mechanisms.public_prototypes import candidate_pool
from capc_common.mechanisms.release import NoiseBlock, ReleaseMechanism
from capc_common.privacy.analysis import as_orders, rdp_zcdp
from capc_common.privacy.analysis._checks import count, positive

__all__ = ["PublicPrototypeVotes"]

#: Records scored against the pool per matrix product (bounds the ``chunk × M`` similarity block's memory).
CHUNK = 4096


class PublicPrototypeVotes(ReleaseMechanism):
    """One release of noisy nearest-candidate vote counts; each class's top ``per_class`` candidates are its
    prototypes.

    Args:
        classes: number of classes.
        candidates: ``(M, dim)`` features of the public pool (the same per-example map as the records).
        rho: zCDP of the release (``σ = 1/√(2ρ)`` on every count).
        per_class: prototypes kept per class (post-processing of the one release).
    """

    name = "dppl-public"
    accounting = (
        "one release of the vote counts, ρ = 1/(2σ²) zCDP, RDP ρλ (Canonne, Kamath & Steinke 2020, Thm. 14)"
    )

    def __init__(self, *, classes: int, candidates: npt.ArrayLike, rho: float, per_class: int = 1) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.candidates = candidate_pool(candidates)
        self.rho = positive("rho", rho)
        self.per_class = count("per_class", per_class, minimum=1, maximum=len(self.candidates))
        self.sigma = 1.0 / math.sqrt(2.0 * self.rho)
        self._blocks = (NoiseBlock(self.classes * self.pool, self.sigma, 1),)

    @property
    def dim(self) -> int:
        """Feature dimension."""
        return int(self.candidates.shape[1])

    @property
    def pool(self) -> int:
        """``M``, the number of candidates."""
        return len(self.candidates)

    def params(self) -> dict[str, Any]:
        """Public parameters of the release (the pool is named by whoever built it)."""
        return {
            "mechanism": self.name,
            "classes": self.classes,
            "candidates": self.pool,
            "rho": self.rho,
            "sigma": self.sigma,
            "per_class": self.per_class,
            "selection": "noisy nearest-candidate votes, top-K per class (discrete Gaussian)",
            "neighbouring": "add/remove",
            "noise": "discrete",
            "noise_parts": {"sigma": self.blocks()[0].part},
        }

    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``ρλ``: a sensitivity-1 integer histogram under ``N_Z(0, σ²)``."""
        return rdp_zcdp(as_orders(orders), rho=self.zcdp)

    @property
    def zcdp(self) -> float:
        """``1/(2σ²)``, recomputed from the σ drawn (equal to ``rho`` up to rounding)."""
        return 1.0 / (2.0 * self.sigma**2)

    def blocks(self) -> tuple[NoiseBlock, ...]:
        """σ on every one of the ``classes × M`` counts (Δ = 1)."""
        return self._blocks

    def max_abs_total(self, *, records: int) -> float:
        """A count holds at most every record."""
        return float(records)

    def votes(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Each record's nearest candidate by cosine (ties: the lowest index).

        Raises:
            InputError: features of the wrong width or inf/NaN.
        """
        raw = np.asarray(features, dtype=np.float64)
        if raw.ndim != 2 or raw.shape[1] != self.dim:
            raise InputError(f"features must have shape (n, {self.dim}), got {raw.shape}")
        if not np.isfinite(raw).all():
            raise InputError("features hold inf or NaN; check the feature extraction")
        x = normalise(raw)
        out = np.empty(len(x), dtype=np.int64)
        for start in range(0, len(x), CHUNK):
            out[start : start + CHUNK] = np.argmax(x[start : start + CHUNK] @ self.candidates.T, axis=1)
        return out

    def contribution(self, features: npt.ArrayLike, labels: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """A party's ``classes × M`` vote counts, flattened class by class.

        Raises:
            InputError: shapes or labels that do not fit, or inf/NaN features.
        """
        x, y = labelled(features, labels, dim=self.dim, classes=self.classes)
        cells = y * self.pool + self.votes(x)
        return np.bincount(cells, minlength=self.classes * self.pool).astype(np.int64)

    def _counts(self, total: npt.ArrayLike) -> npt.NDArray[np.int64]:
        t = np.asarray(total)
        if t.shape != (self.classes * self.pool,) or not np.issubdtype(t.dtype, np.integer):
            raise InputError(
                f"a total holds {self.classes * self.pool} integer counts, got {t.dtype} {t.shape}"
            )
        return t.reshape(self.classes, self.pool).astype(np.int64)

    def select(self, total: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``(classes, per_class)`` candidate indices: per class the most noisy votes first (ties: the lowest
        index), a post-processing of the released counts.

        Raises:
            InputError: a total of the wrong shape or type.
        """
        return np.argsort(-self._counts(total), axis=1, kind="stable")[:, : self.per_class].astype(np.int64)

    def prototypes(self, total: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``(classes, dim)`` prototypes: each class's selected candidates weighted by their noisy counts
        (clipped at 0); a class whose selected counts are all ≤ 0 gets their plain mean. Post-processing.

        Why weighted: on the validation split (docs/mechanisms.md) the count-weighted mean of the top 100
        was 2–15 points above the plain mean of the top 5–100, whose low-count picks are mostly noise.

        Raises:
            InputError: a total of the wrong shape or type.
        """
        counts = self._counts(total)
        chosen = self.select(total)
        weights = np.maximum(np.take_along_axis(counts, chosen, axis=1), 0).astype(np.float64)
        empty = weights.sum(axis=1) == 0
        weights[empty] = 1.0
        return np.einsum("ck,ckd->cd", weights, self.candidates[chosen]) / weights.sum(axis=1, keepdims=True)

    def predict(self, features: npt.ArrayLike, total: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The student: the class whose prototype is nearest by cosine.

        Raises:
            InputError: a total of the wrong shape or type, or features that do not fit.
        """
        prototypes = normalise(self.prototypes(total))
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim or not np.isfinite(x).all():
            raise InputError(f"features must be finite with shape (n, {self.dim}), got {x.shape}")
        return np.argmax(normalise(x) @ prototypes.T, axis=1).astype(np.int64)

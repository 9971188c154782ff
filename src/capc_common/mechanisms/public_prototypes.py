"""DP prototypes selected from a public candidate pool (DPPL-Public and its top-K form; Wahdany, Jagielski,
Dziedzic & Boenisch, "Beyond the Mean: Differentially Private Prototypes for Private Transfer Learning",
AAAI 2025, arXiv:2406.08039).

The paper selects, for every private class, the public examples most similar to that class's private
records, with the exponential mechanism, and uses the selected public examples' features as the class
prototypes. **There is no public data here**: the candidates are the project's synthetic images (the
generators of the DIET-PATE query stream, e.g. ``dead_leaves``) through the same frozen backbone, per
example. The pool is public (a generator and a seed); only the selection looks at private data.

**Score** (the paper's): a record ``x`` of class ``c`` gives candidate ``j`` the clipped, rescaled
similarity ``s(x, j) = (clip(1 + cos(x, e_j), d_min, d_max) − d_min) / (d_max − d_min) ∈ [0, 1]``; class
``c``'s score of ``j`` is the sum over its records. Here each ``s`` is rounded once to ``2^-bits`` (an
integer in ``[0, 2^bits]``), so scores are exact integer sums and a party's contribution is an integer
``classes × M`` matrix.

**Privacy.** Adding or removing one record changes only its own class's score vector, and every entry of it
by an amount in ``[0, Δ]``, ``Δ = 2^bits`` (the score is *monotone*). The exponential mechanism
``Pr[j] ∝ exp(η u_c(j))`` with ``η = ε/Δ`` is then ε-DP — the monotone case of McSherry & Talwar 2007 needs
no factor 2 — and ε-bounded-range (its privacy loss ranges over an interval of width ``ηΔ``), hence
``ε²/8``-zCDP (Cesar & Rogers 2021, Lemma 3.2); its RDP curve is
:func:`~capc_common.privacy.analysis.rdp_pure_dp` with ``bounded_range=True``. The classes are disjoint
record sets, so their selections compose in parallel; ``K`` prototypes per class are drawn by peeling (the
exponential mechanism ``K`` times without replacement, which releases the same law as the Gumbel top-K) and
compose adaptively: the release is ``Kε``-DP and ``Kε²/8``-zCDP. (The paper's top-K variant uses a joint
exponential mechanism over K-sets; peeling is the plainer choice with the same kind of guarantee.)

**Neighbouring relation: add/remove only.** The output depends only on the union of all parties' records
(their scores add up), so how the records are partitioned among parties does not matter. Under *replace-one*
the guarantee above does not hold: a same-label replacement moves the class's scores by amounts in
``[−Δ, Δ]`` (no longer monotone), so each pick is ``2ε``-DP and ``ε²/2``-zCDP (4× the charge); a label change
moves two classes' scores, so the classes no longer compose in parallel. ``params()`` names the relation.

The draw is exact (:func:`~capc_common.privacy.noise.exponential_mechanism_exact`): integer scores, a
rational η, no floating point in the sampler.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mechanisms._records import class_sums, labelled
from capc_common.mechanisms.prototypes import normalise
from capc_common.privacy.analysis import as_orders, rdp_pure_dp
from capc_common.privacy.analysis._checks import count, positive
from capc_common.privacy.noise import exponential_mechanism_exact

if TYPE_CHECKING:
    from capc_common.privacy import NoiseSource

__all__ = ["PublicPrototypes", "Rule", "candidate_pool"]

Rule = Literal["mean", "nearest"]


class PublicPrototypes:
    """Per class, ``per_class`` candidates of a public pool chosen by the exponential mechanism.

    Args:
        classes: number of classes.
        candidates: ``(M, dim)`` features of the public pool (the same map as the parties' records).
        epsilon: ε of one selection (one class, one prototype).
        per_class: prototypes drawn per class (peeling).
        similarity_range: ``(d_min, d_max)`` within ``[0, 2]``: the clip of ``1 + cos`` (the paper's
            ``min_score`` / ``max_score``).
        bits: fractional bits of a record's score (its sensitivity is ``2^bits``).
    """

    name: ClassVar[str] = "dppl-public"

    def __init__(
        self,
        *,
        classes: int,
        candidates: npt.ArrayLike,
        epsilon: float,
        per_class: int = 1,
        similarity_range: tuple[float, float] = (0.0, 2.0),
        bits: int = 16,
    ) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.candidates = candidate_pool(candidates)
        self.epsilon = positive("epsilon", epsilon)
        self.per_class = count("per_class", per_class, minimum=1, maximum=len(self.candidates))
        low, high = (float(v) for v in similarity_range)
        if not 0.0 <= low < high <= 2.0:
            raise InputError(f"similarity_range must satisfy 0 ≤ d_min < d_max ≤ 2, got {similarity_range}")
        self.similarity_range = (low, high)
        self.bits = count("bits", bits, minimum=0, maximum=30)
        self.sensitivity = 1 << self.bits

    @property
    def dim(self) -> int:
        """Feature dimension."""
        return int(self.candidates.shape[1])

    @property
    def eta(self) -> Fraction:
        """``η = ε/Δ``, the exact rational inverse temperature of every selection."""
        return Fraction(self.epsilon) / self.sensitivity

    def params(self) -> dict[str, Any]:
        """Public parameters of the release (the pool is named by whoever built it)."""
        return {
            "mechanism": self.name,
            "classes": self.classes,
            "candidates": len(self.candidates),
            "epsilon": self.epsilon,
            "per_class": self.per_class,
            "similarity_range": list(self.similarity_range),
            "bits": self.bits,
            "selection": "exponential (exact, monotone score)",
            "neighbouring": "add/remove",
        }

    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP of the release: ``per_class`` ε-DP, ε-bounded-range selections (parallel over classes)."""
        return self.per_class * rdp_pure_dp(as_orders(orders), epsilon=self.epsilon, bounded_range=True)

    @property
    def zcdp(self) -> float:
        """``ρ = K ε²/8`` (Cesar & Rogers 2021)."""
        return self.per_class * self.epsilon**2 / 8

    @property
    def pure_epsilon(self) -> float:
        """``Kε``: the release is pure DP."""
        return self.per_class * self.epsilon

    def contribution(self, features: npt.ArrayLike, labels: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """A party's integer ``(classes, M)`` scores: per class, its records' fixed-point similarities summed.

        Raises:
            InputError: shapes or labels that do not fit, or inf/NaN features.
        """
        x, y = labelled(features, labels, dim=self.dim, classes=self.classes)
        low, high = self.similarity_range
        similarity = np.clip(1.0 + normalise(x) @ self.candidates.T, low, high)
        scaled = np.rint((similarity - low) / (high - low) * self.sensitivity)
        # Backstop behind the input checks: whatever the floats did (NaN casts to −2^63), a record's score
        # stays in [0, Δ], the bound the accounting rests on.
        encoded = np.clip(np.nan_to_num(scaled, nan=0.0), 0, self.sensitivity).astype(np.int64)
        return class_sums(encoded, y, classes=self.classes)

    def select(self, scores: npt.ArrayLike, source: NoiseSource) -> npt.NDArray[np.int64]:
        """The private selection: ``(classes, per_class)`` candidate indices, class by class, in draw order.

        Args:
            scores: the summed ``(classes, M)`` integer scores of all parties.
            source: the selecting party's randomness (a CSPRNG; seeded only in tests).

        Raises:
            InputError: scores of the wrong shape or type.
        """
        u = np.asarray(scores)
        if u.shape != (self.classes, len(self.candidates)) or not np.issubdtype(u.dtype, np.integer):
            raise InputError(
                f"scores must be integers of shape ({self.classes}, {len(self.candidates)}), "
                f"got {u.dtype} {u.shape}"
            )
        eta = self.eta
        chosen = np.empty((self.classes, self.per_class), dtype=np.int64)
        for c in range(self.classes):
            left = np.arange(len(self.candidates))
            for k in range(self.per_class):
                pick = exponential_mechanism_exact(u[c, left], eta=eta, source=source)
                chosen[c, k] = left[pick]
                left = np.delete(left, pick)
        return chosen

    def predict(
        self, features: npt.ArrayLike, chosen: npt.ArrayLike, *, rule: Rule = "mean"
    ) -> npt.NDArray[np.int64]:
        """The student (post-processing of the selection): nearest class by cosine, a class represented by the
        mean of its selected candidates (``mean``) or by the closest one (``nearest``).

        Raises:
            InputError: ``chosen`` of the wrong shape, or an unknown rule.
        """
        picks = np.asarray(chosen, dtype=np.int64)
        if picks.shape != (self.classes, self.per_class):
            raise InputError(f"chosen must have shape ({self.classes}, {self.per_class}), got {picks.shape}")
        x = normalise(features)
        if rule == "mean":
            return np.argmax(x @ normalise(self.candidates[picks].mean(axis=1)).T, axis=1).astype(np.int64)
        if rule == "nearest":
            similarity = x @ self.candidates[picks.ravel()].T
            per_class = similarity.reshape(len(x), self.classes, self.per_class).max(axis=2)
            return np.argmax(per_class, axis=1).astype(np.int64)
        raise InputError(f"rule must be 'mean' or 'nearest', got {rule!r}")


def candidate_pool(candidates: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """A public candidate pool's features, checked and L2-normalised.

    Raises:
        InputError: not a non-empty ``(M, dim)`` matrix, or inf/NaN features (a non-finite candidate would
            score NaN).
    """
    pool = np.asarray(candidates, dtype=np.float64)
    if pool.ndim != 2 or len(pool) == 0:
        raise InputError(f"candidates must be a non-empty (M, dim) feature matrix, got shape {pool.shape}")
    if not np.isfinite(pool).all():
        bad = np.flatnonzero(~np.isfinite(pool).all(axis=1))
        raise InputError(
            f"the candidate pool holds inf or NaN features in {len(bad)} row(s) (first: row "
            f"{int(bad[0])}); a non-finite candidate would score NaN: check the pool's feature extraction"
        )
    return normalise(pool)

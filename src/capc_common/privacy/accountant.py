"""Accountants: objects that remember what a mechanism released and hand all the math to :mod:`.analysis`.

An accountant keeps only its history (how many queries were screened and answered, which histograms a
data-dependent analysis saw, how many subsampled steps ran); :meth:`Accountant.rdp` turns that history into
an RDP curve by calling the pure functions in :mod:`capc_common.privacy.analysis`, and
:meth:`Accountant.get_epsilon` converts it. Create them by name with
:func:`capc_common.privacy.registry.create_accountant`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy.analysis import (
    DEFAULT_ORDERS,
    as_orders,
    delta_from_rdp,
    epsilon_from_rdp,
    log_pass_probability,
    log_q_gnmax,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_pure_dp,
    rdp_screening_exact,
    rdp_subsampled_gaussian,
    rdp_threshold_data_dependent,
    rdp_zcdp,
)
from capc_common.privacy.analysis._checks import count, histograms, non_negative, positive

__all__ = [
    "Accountant",
    "ConfidentGNMaxAccountant",
    "DataDependentPATEAccountant",
    "PureDPAccountant",
    "SubsampledGaussianAccountant",
    "ZCDPAccountant",
]


class Accountant(ABC):
    """Composition of one kind of mechanism over a history of releases, as an RDP curve.

    Subclasses define :meth:`rdp` from their history; conversion to (ε, δ) is shared.
    """

    #: Registry name of the mechanism this accountant tracks.
    mechanism: ClassVar[str]

    @abstractmethod
    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """The RDP of everything recorded so far, at each order."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The mechanism's public parameters (JSON-serialisable), for reports and ledgers."""

    def get_epsilon(
        self, *, delta: float, orders: npt.ArrayLike = DEFAULT_ORDERS, method: str = "improved"
    ) -> tuple[float, float]:
        """``(ε, order)``: the smallest ε over ``orders`` at which the history is (ε, δ)-DP."""
        lam = as_orders(orders)
        return epsilon_from_rdp(lam, self.rdp(lam), delta=delta, method=method)

    def get_delta(
        self, *, epsilon: float, orders: npt.ArrayLike = DEFAULT_ORDERS, method: str = "improved"
    ) -> tuple[float, float]:
        """``(δ, order)``: the smallest δ over ``orders`` at which the history is (ε, δ)-DP."""
        lam = as_orders(orders)
        return delta_from_rdp(lam, self.rdp(lam), epsilon=epsilon, method=method)


class ConfidentGNMaxAccountant(Accountant):
    """Data-independent accounting of Confident-GNMax: screening for every query, GNMax for each answer.

    This is what the federation charges: the guardian never sees a histogram, so each query costs the exact
    screening supremum (:func:`~capc_common.privacy.analysis.rdp_screening_exact`) and each answered query
    adds ``λ/σ2²``. With ``noise="discrete"`` (as deployed) the threshold noise is split between the guardian
    and the student, each of whom knows its own integer part, so the supremum also runs over every known
    shift of the threshold (``known_shift=True``); ``"continuous"`` is the reference analysis of one party's
    noise at a fixed threshold.

    Args:
        teachers: votes per query (total teacher heads).
        classes: number of classes.
        threshold: T of the screening step.
        sigma1: σ1 of the screening noise.
        sigma2: σ2 of the argmax noise.
        noise: ``"discrete"`` (integer noise, as deployed) or ``"continuous"``.
        min_teachers: fewest votes a query can get, when a partial quorum may answer.
    """

    mechanism = "confident-gnmax"

    def __init__(
        self,
        *,
        teachers: int,
        classes: int,
        threshold: float,
        sigma1: float,
        sigma2: float,
        noise: str = "discrete",
        min_teachers: int | None = None,
    ) -> None:
        self.teachers = count("teachers", teachers, minimum=1)
        self.classes = count("classes", classes, minimum=2)
        self.threshold = non_negative("threshold", threshold)
        self.sigma1 = positive("sigma1", sigma1)
        self.sigma2 = positive("sigma2", sigma2)
        if noise not in ("discrete", "continuous"):
            raise InputError(f"noise must be 'discrete' or 'continuous', got {noise!r}")
        self.noise = noise
        self.min_teachers = None if min_teachers is None else count("min_teachers", min_teachers, minimum=1)
        if self.min_teachers is not None and self.min_teachers > self.teachers:
            raise InputError(f"min_teachers {self.min_teachers} exceeds teachers {self.teachers}")
        self.queries = 0
        self.answered = 0
        self._screening_cache: dict[bytes, npt.NDArray[np.float64]] = {}

    def params(self) -> dict[str, Any]:
        """The public parameters of the mechanism."""
        return {
            "mechanism": self.mechanism,
            "teachers": self.teachers,
            "classes": self.classes,
            "threshold": self.threshold,
            "sigma1": self.sigma1,
            "sigma2": self.sigma2,
            "noise": self.noise,
            "min_teachers": self.min_teachers,
        }

    def query_rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """RDP of screening one query (paid by every query), cached per order grid."""
        lam = as_orders(orders)
        key = lam.tobytes() + str(lam.shape).encode()
        if key not in self._screening_cache:
            self._screening_cache[key] = rdp_screening_exact(
                lam,
                teachers=self.teachers,
                classes=self.classes,
                threshold=self.threshold,
                sigma1=self.sigma1,
                noise=self.noise,
                min_teachers=self.min_teachers,
                known_shift=self.noise == "discrete",
            )
        return self._screening_cache[key]

    def answer_rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """RDP of one GNMax answer (paid by every answered query): ``λ/σ2²``."""
        return rdp_gnmax_data_independent(orders, sigma=self.sigma2)

    def cost(
        self, orders: npt.ArrayLike = DEFAULT_ORDERS, *, queries: int, answered: int
    ) -> npt.NDArray[np.float64]:
        """RDP of ``queries`` screened queries of which ``answered`` were answered (no history change).

        The worst case of a batch of B queries is ``cost(queries=B, answered=B)``.
        """
        q = count("queries", queries)
        a = count("answered", answered)
        if a > q:
            raise InputError(f"answered ({a}) cannot exceed queries ({q})")
        return q * self.query_rdp(orders) + a * self.answer_rdp(orders)

    def step(self, *, queries: int, answered: int) -> None:
        """Record a batch: ``queries`` screened, ``answered`` of them answered."""
        self.cost(np.array([2.0]), queries=queries, answered=answered)  # validates
        self.queries += int(queries)
        self.answered += int(answered)

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """RDP of everything recorded."""
        return self.cost(orders, queries=self.queries, answered=self.answered)


class DataDependentPATEAccountant(Accountant):
    """PATE-2018 data-dependent accounting for central research runs (histograms visible). UNSANITISED.

    Records, per query, the log pass/fail probabilities of the threshold step and — for answered queries —
    ``log q̃`` of GNMax; the RDP is the sum of the data-dependent bounds. The result depends on the private
    histograms and is not itself differentially private unless smooth sensitivity is applied; report it
    labelled "unsanitised data-dependent".

    Args:
        threshold: T (``None`` for plain GNMax without screening).
        sigma1: σ1 of the screening noise (required with a threshold).
        sigma2: σ2 of the argmax noise.
        noise: ``"continuous"`` (the paper) or ``"discrete"`` (integer noise).
    """

    mechanism = "pate-data-dependent"

    def __init__(
        self, *, threshold: float | None, sigma1: float | None, sigma2: float, noise: str = "continuous"
    ) -> None:
        if (threshold is None) != (sigma1 is None):
            raise InputError("give both threshold and sigma1 (Confident-GNMax) or neither (plain GNMax)")
        self.threshold = None if threshold is None else non_negative("threshold", threshold)
        self.sigma1 = None if sigma1 is None else positive("sigma1", sigma1)
        self.sigma2 = positive("sigma2", sigma2)
        if noise not in ("discrete", "continuous"):
            raise InputError(f"noise must be 'discrete' or 'continuous', got {noise!r}")
        self.noise = noise
        self.log_pass: list[float] = []
        self.log_fail: list[float] = []
        self.log_q: list[float] = []

    def params(self) -> dict[str, Any]:
        """The public parameters of the mechanism."""
        return {
            "mechanism": self.mechanism,
            "threshold": self.threshold,
            "sigma1": self.sigma1,
            "sigma2": self.sigma2,
            "noise": self.noise,
        }

    def step(self, votes: npt.ArrayLike, *, answered: npt.ArrayLike | None = None) -> None:
        """Record a batch of vote histograms ``(B, c)`` and which of them were answered (default: all)."""
        hist = np.atleast_2d(histograms(votes))
        mask = np.ones(hist.shape[0], dtype=bool) if answered is None else np.asarray(answered, dtype=bool)
        if mask.shape != (hist.shape[0],):
            raise InputError(f"answered must have shape ({hist.shape[0]},), got {mask.shape}")
        if self.threshold is not None and self.sigma1 is not None:
            log_pass, log_fail = log_pass_probability(
                hist, threshold=self.threshold, sigma1=self.sigma1, noise=self.noise
            )
            self.log_pass += np.ravel(log_pass).tolist()
            self.log_fail += np.ravel(log_fail).tolist()
        elif not mask.all():
            raise InputError("plain GNMax answers every query; do not pass answered")
        self.log_q += np.ravel(log_q_gnmax(hist[mask], sigma=self.sigma2, noise=self.noise)).tolist()

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """Sum of the per-query data-dependent bounds (identical queries are computed once)."""
        lam = as_orders(orders)
        total = np.zeros_like(lam)
        values, counts = np.unique(np.array(self.log_q), return_counts=True)
        for value, n in zip(values.tolist(), counts.tolist(), strict=True):
            total = total + n * rdp_gnmax_data_dependent(lam, log_q=value, sigma=self.sigma2)
        if self.sigma1 is not None:
            pairs, counts = np.unique(np.array([self.log_pass, self.log_fail]).T, axis=0, return_counts=True)
            for (lp, lf), n in zip(pairs.tolist(), counts.tolist(), strict=True):
                total = total + n * rdp_threshold_data_dependent(
                    lam, log_pass=lp, log_fail=lf, sigma1=self.sigma1
                )
        return total


class SubsampledGaussianAccountant(Accountant):
    """Steps of a Poisson-subsampled Gaussian mechanism (Private-kNN, DP-SGD-like uses).

    Args:
        sampling_rate: inclusion probability of each record per step.
        noise_multiplier: σ over the L2 sensitivity.
    """

    mechanism = "subsampled-gaussian"

    def __init__(self, *, sampling_rate: float, noise_multiplier: float) -> None:
        rdp_subsampled_gaussian(2.0, sampling_rate=sampling_rate, noise_multiplier=noise_multiplier)
        self.sampling_rate = float(sampling_rate)
        self.noise_multiplier = float(noise_multiplier)
        self.steps = 0

    def params(self) -> dict[str, Any]:
        """The public parameters of the mechanism."""
        return {
            "mechanism": self.mechanism,
            "sampling_rate": self.sampling_rate,
            "noise_multiplier": self.noise_multiplier,
        }

    def step(self, *, steps: int = 1) -> None:
        """Record ``steps`` more steps."""
        self.steps += count("steps", steps)

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """``steps`` times the one-step curve."""
        one = rdp_subsampled_gaussian(
            orders, sampling_rate=self.sampling_rate, noise_multiplier=self.noise_multiplier
        )
        return self.steps * one


class PureDPAccountant(Accountant):
    """Releases of pure ε-DP mechanisms (e.g. exponential mechanism, discrete Laplace histograms).

    Args:
        bounded_range: every recorded mechanism is ε-bounded-range (the exponential mechanism is).
    """

    mechanism = "pure-dp"

    def __init__(self, *, bounded_range: bool = False) -> None:
        self.bounded_range = bool(bounded_range)
        self.epsilons: list[float] = []

    def params(self) -> dict[str, Any]:
        """The public parameters of the mechanism."""
        return {"mechanism": self.mechanism, "bounded_range": self.bounded_range}

    def step(self, *, epsilon: float) -> None:
        """Record one ε-DP release."""
        self.epsilons.append(non_negative("epsilon", epsilon))

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """Sum of the per-release curves."""
        lam = as_orders(orders)
        values, counts = np.unique(np.array(self.epsilons), return_counts=True)
        total = np.zeros_like(lam)
        for eps, n in zip(values.tolist(), counts.tolist(), strict=True):
            total = total + n * rdp_pure_dp(lam, epsilon=eps, bounded_range=self.bounded_range)
        return total


class ZCDPAccountant(Accountant):
    """Releases of ρ-zCDP mechanisms (e.g. DP prototypes with Gaussian noise); ρ adds up."""

    mechanism = "zcdp"

    def __init__(self) -> None:
        self.rho = 0.0

    def params(self) -> dict[str, Any]:
        """The public parameters of the mechanism."""
        return {"mechanism": self.mechanism}

    def step(self, *, rho: float) -> None:
        """Record one ρ-zCDP release."""
        self.rho += non_negative("rho", rho)

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> npt.NDArray[np.float64]:
        """``ρλ`` for the total ρ."""
        return rdp_zcdp(orders, rho=self.rho)

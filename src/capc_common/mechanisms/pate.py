"""The PATE aggregation mechanisms as engine plug-ins: Confident-GNMax (the federation's default), GNMax and
LNMax — and the one definition of their plaintext selection rules.

**Plaintext rule (MUST)** — :func:`confident_rule`, which the garbled circuit must agree with: for histogram
row ``H`` and total threshold noise ``z1 = z1_g + z1_s``, ``pass = max_j H_j + z1 ≥ T`` and
``label = argmax_j (H_j + z2_j)`` with ties going to the lowest class index (:func:`noisy_argmax`); the output
is ``label`` if ``pass`` else :data:`UNANSWERED` (−1). Because ``H`` and ``z1`` are integers, ``≥ T`` is the
same test as ``≥ ceil(T)``. GNMax and LNMax answer every query with :func:`noisy_argmax` of ``H + z2``. These
are the reference semantics the federation's secure protocol reproduces bit for bit, and the mechanisms of
the central (single-machine) research mode: :meth:`~SelectionMechanism.answer` draws the noise from a
:class:`~capc_common.aggregation.MechanismNoise` (CSPRNGs, or seeded sources only ever *injected*) and applies
the rule.

Each object holds its public parameters and keeps its accounting next to it: Confident-GNMax pays the exact
data-independent screening cost per query and ``λ/σ2²`` per answer (:class:`ConfidentGNMaxAccountant`);
GNMax ``λ/σ²`` per answer (L2 sensitivity √2, Papernot et al. 2018, Prop. 8); LNMax with discrete Laplace
scale ``b`` is ``2/b``-DP per answer (one vote moved changes the histogram by 2 in L1). Noise is drawn in the
canonical order of :mod:`capc_common.aggregation.noise`, so a central run and a federation given the same
seeded sources release the same labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.aggregation.histogram import check_histograms
from capc_common.aggregation.noise import draw_confident_noise, draw_student_noise
from capc_common.errors import InputError
from capc_common.mechanisms.base import UNANSWERED, BatchNoise, Commit, Mark, SelectionMechanism
from capc_common.privacy import ConfidentGNMaxAccountant, DataDependentPATEAccountant
from capc_common.privacy.analysis import as_orders, rdp_gnmax_data_independent, rdp_pure_dp
from capc_common.privacy.analysis._checks import count, non_negative, positive

if TYPE_CHECKING:
    from capc_common.mpc import GarblerSession, MpcConfig
    from capc_common.privacy import NoiseSource

__all__ = ["ConfidentGNMax", "GNMax", "LNMax", "confident_rule", "noisy_argmax"]


def noisy_argmax(noisy_counts: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Index of each row's maximum; ties go to the lowest index (the tournament tree of the circuit).

    Args:
        noisy_counts: integer array ``(queries, classes)``.

    Returns:
        ``int64`` labels ``(queries,)``.
    """
    # np.argmax returns the first occurrence of the maximum, i.e. the lowest index on ties.
    return np.argmax(noisy_counts, axis=1).astype(np.int64)


def confident_rule(
    histograms: npt.ArrayLike,
    *,
    threshold: float,
    z1: npt.ArrayLike,
    z2: npt.ArrayLike,
) -> npt.NDArray[np.int64]:
    """Confident-GNMax's output for given histograms and given noise (no randomness here).

    Args:
        histograms: vote histograms ``(B, c)`` (checked with
            :func:`~capc_common.aggregation.check_histograms`).
        threshold: ``T`` (finite, ≥ 0); a query passes when ``max_j H_j + z1 ≥ T``.
        z1: integer threshold noise ``(B,)``, the total of both parties' parts ``z1_g + z1_s``.
        z2: integer argmax noise ``(B, c)``.

    Returns:
        ``int64`` labels ``(B,)``: ``argmax_j (H_j + z2_j)`` (lowest index on ties) where the query passes,
        :data:`UNANSWERED` elsewhere.

    Raises:
        InputError: if the histograms are not histograms, the threshold is not a finite number ≥ 0, or the
            noise is not integer or its shapes do not match the histograms.
    """
    hist = check_histograms(histograms)
    t = non_negative("threshold T", threshold)
    n1 = np.asarray(z1)
    n2 = np.asarray(z2)
    if n1.shape != (hist.shape[0],) or n2.shape != hist.shape:
        raise InputError(
            f"noise shapes z1 {n1.shape}, z2 {n2.shape} do not match histograms {hist.shape}: "
            f"expected z1 ({hist.shape[0]},) and z2 {hist.shape}"
        )
    if not (np.issubdtype(n1.dtype, np.integer) and np.issubdtype(n2.dtype, np.integer)):
        raise InputError(f"noise must be integer (discrete), got dtypes {n1.dtype} and {n2.dtype}")
    passed = hist.max(axis=1) + n1.astype(np.int64) >= t
    labels = noisy_argmax(hist + n2.astype(np.int64))
    return np.where(passed, labels, UNANSWERED).astype(np.int64)


class ConfidentGNMax(SelectionMechanism):
    """Confident-GNMax (Papernot et al. 2018): pass if ``max H + z1 ≥ T``, then ``argmax(H + z2)``.

    The threshold noise is split: the guardian draws ``z1_g`` (and ``z2``), the student ``z1_s``; each is
    ``N_Z(0, σ1²)``, so each party sees the pass bits through noise it does not know.

    Args:
        classes: number of classes.
        teachers: votes per query (total teacher heads).
        threshold: ``T``.
        sigma1: σ1 of each part of the threshold noise.
        sigma2: σ2 of the argmax noise.
        min_teachers: fewest votes a query can get when a partial quorum may answer (screening cost is
            maximised over that wider range); None when every head always votes.
    """

    name = "confident-gnmax"
    accounting = (
        "data-independent, the exact screening supremum per query (every known shift of the threshold) + "
        "λ/σ2² per answer (Papernot et al. 2018)"
    )

    def __init__(
        self,
        *,
        classes: int,
        teachers: int,
        threshold: float,
        sigma1: float,
        sigma2: float,
        min_teachers: int | None = None,
    ) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.accountant = ConfidentGNMaxAccountant(
            teachers=teachers,
            classes=classes,
            threshold=threshold,
            sigma1=sigma1,
            sigma2=sigma2,
            noise="discrete",
            min_teachers=min_teachers,
        )
        self.teachers = self.accountant.teachers
        self.threshold = self.accountant.threshold
        self.sigma1 = self.accountant.sigma1
        self.sigma2 = self.accountant.sigma2

    def params(self) -> dict[str, Any]:
        """The accountant's public parameters (what the ledger has always recorded)."""
        return self.accountant.params()

    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Exact screening supremum per query, ``λ/σ2²`` per answer."""
        lam = as_orders(orders)
        return self.accountant.query_rdp(lam), self.accountant.answer_rdp(lam)

    def data_dependent(self) -> DataDependentPATEAccountant:
        """PATE-2018 data-dependent analysis of screening and GNMax (UNSANITISED)."""
        return DataDependentPATEAccountant(
            threshold=self.threshold, sigma1=self.sigma1, sigma2=self.sigma2, noise="discrete"
        )

    def pass_probability(self, top_votes: float) -> float:
        """P(``top_votes + z1_g + z1_s ≥ T``): the screening passes a query whose top class holds
        ``top_votes`` votes. The two parts are independent ``N_Z(0, σ1²)``; their sum is taken as normal with
        variance ``2σ1²``, with a continuity correction for its integer values (a planning figure, not a
        privacy bound: within 0.006 of the exact sum's tail for σ1 ≥ 1, 0.0013 from σ1 = 2, 10⁻⁴ from 10)."""
        needed = math.ceil(self.threshold - top_votes)  # the smallest integer z1 that passes
        return 0.5 * math.erfc((needed - 0.5) / (2.0 * self.sigma1))  # the normal tail at std √2·σ1

    def guardian_noise(self, source: NoiseSource, *, batch: int) -> BatchNoise:
        """``z1_g`` then ``z2`` (:func:`~capc_common.aggregation.draw_confident_noise`)."""
        z1, z2 = draw_confident_noise(
            source, batch=batch, classes=self.classes, sigma1=self.sigma1, sigma2=self.sigma2
        )
        return BatchNoise({"z1": z1, "z2": z2})

    def student_noise(self, source: NoiseSource, *, batch: int) -> npt.NDArray[np.int64]:
        """``z1_s`` (:func:`~capc_common.aggregation.draw_student_noise`)."""
        return draw_student_noise(source, batch=batch, sigma1=self.sigma1)

    def rule(
        self,
        histograms: npt.NDArray[np.int64],
        guardian: BatchNoise,
        student: npt.NDArray[np.int64] | None,
    ) -> npt.NDArray[np.int64]:
        """:func:`confident_rule` with ``z1 = z1_g + z1_s``."""
        if student is None:
            raise InputError("Confident-GNMax needs the student's part z1_s of the threshold noise")
        z1 = guardian["z1"] + student
        return confident_rule(histograms, threshold=self.threshold, z1=z1, z2=guardian["z2"])

    def mpc_config(self, *, teachers: int) -> MpcConfig:
        """Ring holding every noisy count (all heads, ±12σ), threshold mode, the student's z1_s bound."""
        from capc_common.mpc import MpcConfig, noise_bound, ring_width

        width = ring_width(
            teachers=teachers, sigma2=self.sigma2, sigma1=self.sigma1, threshold=math.ceil(self.threshold)
        )
        return MpcConfig(
            classes=self.classes,
            width=width,
            teachers=teachers,
            mode="confident",
            student_noise=noise_bound(self.sigma1),
        )

    def garble(
        self,
        session: GarblerSession,
        *,
        batch_id: str,
        seeds: Sequence[bytes],
        shape: tuple[int, int],
        noise: BatchNoise,
        commit: Commit,
        before_decode: Mark | None = None,
    ) -> npt.NDArray[np.bool_]:
        """Garble ``pass = max(S + A) + z1 ≥ T`` and ``argmax(S + A + z2)`` for one batch."""
        return session.run_batch(
            batch_id,
            seeds=seeds,
            shape=shape,
            z1=noise["z1"],
            z2=noise["z2"],
            threshold=math.ceil(self.threshold),
            commit=commit,
            before_decode=before_decode,
        )


class _ArgmaxOfNoisyVotes(SelectionMechanism):
    """A mechanism that answers every query with ``argmax(H + z2)`` (the guardian draws ``z2``)."""

    def rule(
        self,
        histograms: npt.NDArray[np.int64],
        guardian: BatchNoise,
        student: npt.NDArray[np.int64] | None,
    ) -> npt.NDArray[np.int64]:
        """``argmax(H + z2)``, ties to the lowest index."""
        del student
        return noisy_argmax(histograms + guardian["z2"])


class GNMax(_ArgmaxOfNoisyVotes):
    """GNMax: ``argmax_j (H_j + N_Z(0, σ²))`` for every query (no screening).

    Args:
        classes: number of classes.
        sigma: σ of the discrete Gaussian argmax noise.
    """

    name = "gnmax"
    accounting = "data-independent, λ/σ² per answer, L2 sensitivity √2 (Papernot et al. 2018, Prop. 8)"

    def __init__(self, *, classes: int, sigma: float) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.sigma = positive("sigma", sigma)

    def params(self) -> dict[str, Any]:
        """Name, classes and σ."""
        return {"mechanism": self.name, "classes": self.classes, "sigma": self.sigma, "noise": "discrete"}

    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Nothing per screened query, ``λ/σ²`` per answer (every query is answered)."""
        lam = as_orders(orders)
        return np.zeros_like(lam), rdp_gnmax_data_independent(lam, sigma=self.sigma)

    def data_dependent(self) -> DataDependentPATEAccountant | None:
        """PATE-2018 data-dependent analysis of GNMax (UNSANITISED)."""
        return DataDependentPATEAccountant(threshold=None, sigma1=None, sigma2=self.sigma, noise="discrete")

    def guardian_noise(self, source: NoiseSource, *, batch: int) -> BatchNoise:
        """``z2``: ``(B, c)`` draws of ``N_Z(0, σ²)``."""
        b = count("batch", batch, minimum=1)
        z2 = np.asarray(source.discrete_gaussian(sigma=self.sigma, shape=(b, self.classes)), dtype=np.int64)
        return BatchNoise({"z2": z2})

    def mpc_config(self, *, teachers: int) -> MpcConfig:
        """Ring holding every noisy count (all heads, ±12σ), argmax-only mode."""
        from capc_common.mpc import MpcConfig, ring_width

        width = ring_width(teachers=teachers, sigma2=self.sigma)
        return MpcConfig(classes=self.classes, width=width, teachers=teachers, mode="gnmax")

    def garble(
        self,
        session: GarblerSession,
        *,
        batch_id: str,
        seeds: Sequence[bytes],
        shape: tuple[int, int],
        noise: BatchNoise,
        commit: Commit,
        before_decode: Mark | None = None,
    ) -> npt.NDArray[np.bool_]:
        """Garble ``argmax(S + A + z2)`` for one batch (every query passes)."""
        return session.run_batch(
            batch_id, seeds=seeds, shape=shape, z2=noise["z2"], commit=commit, before_decode=before_decode
        )


class LNMax(_ArgmaxOfNoisyVotes):
    """LNMax (Papernot et al. 2017): ``argmax_j (H_j + discrete Laplace(b))``, central runs only.

    Args:
        classes: number of classes.
        scale: ``b`` of ``Pr[x] ∝ exp(−|x|/b)``; each answer is ``2/b``-DP.
    """

    name = "lnmax"
    accounting = (
        "data-independent, the RDP of pure 2/b-DP per answer (Papernot et al. 2017; Bun & Steinke 2016)"
    )

    def __init__(self, *, classes: int, scale: float) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.scale = positive("scale", scale)

    def params(self) -> dict[str, Any]:
        """Name, classes and the Laplace scale."""
        return {"mechanism": self.name, "classes": self.classes, "scale": self.scale}

    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Nothing per screened query; the RDP of pure ``2/b``-DP per answer."""
        lam = as_orders(orders)
        return np.zeros_like(lam), rdp_pure_dp(lam, epsilon=2.0 / self.scale)

    def guardian_noise(self, source: NoiseSource, *, batch: int) -> BatchNoise:
        """``z2``: ``(B, c)`` discrete Laplace draws of scale ``b``."""
        b = count("batch", batch, minimum=1)
        z2 = np.asarray(source.discrete_laplace(scale=self.scale, shape=(b, self.classes)), dtype=np.int64)
        return BatchNoise({"z2": z2})

    def mpc_config(self, *, teachers: int) -> MpcConfig:
        """LNMax has no secure path.

        Raises:
            InputError: always.
        """
        raise InputError(
            f"mechanism {self.name} runs in central mode only (no secure path for {teachers} heads); "
            "a federation uses confident-gnmax or gnmax"
        )

    def garble(
        self,
        session: GarblerSession,
        *,
        batch_id: str,
        seeds: Sequence[bytes],
        shape: tuple[int, int],
        noise: BatchNoise,
        commit: Commit,
        before_decode: Mark | None = None,
    ) -> npt.NDArray[np.bool_]:
        """LNMax has no secure path.

        Raises:
            InputError: always.
        """
        raise InputError(f"mechanism {self.name} runs in central mode only (batch {batch_id})")

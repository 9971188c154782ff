"""Private-kNN (Zhu, Yu & Wang 2020) on the engine: per query, each party's Poisson-subsampled records vote
by k nearest neighbours; the summed votes go through the same secret sharing and GNMax noisy argmax.

**Contribution.** For every query a party draws a *fresh* Poisson sample of its records (each independently
with probability ``q``, from its own CSPRNG: :func:`~capc_common.mechanisms.poisson_sample`), finds the ``k``
sampled records nearest to the query in feature space (cosine on L2-normalised per-example features; fewer
than ``k`` if the sample is smaller) and casts their labels as votes. Parties' vote counts add up; the 2PC
releases ``argmax(votes + N_Z(0, σ²))`` (GNMax's circuit, every query answered).

**Accounting** (next to it). Adding or removing one record changes at most one vote of the party holding it
— it enters or leaves that party's k nearest, displacing or restoring one neighbour — so the histogram moves
by at most √2 in L2 *if the record was sampled*, and not at all otherwise. One query is therefore the
Poisson-subsampled discrete Gaussian mechanism on an integer histogram with sensitivity √2: base RDP
``α·2/(2σ²) = α/σ²`` (Canonne, Kamath & Steinke 2020), amplified by Zhu & Wang 2019's general Poisson bound
(:func:`~capc_common.privacy.analysis.rdp_poisson_subsampled`). The sampling done is exactly the sampling
accounted — fresh, independent, Poisson — unlike the public Private-kNN code, which samples with
replacement and accounts as if Poisson. One noise configuration (``sigma``) drives both the noise drawn and
the accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mechanisms.dpsgd import poisson_sample
from capc_common.mechanisms.pate import GNMax
from capc_common.mechanisms.prototypes import normalise
from capc_common.mechanisms.voters import KNNVoter, PartyResources, Voter
from capc_common.privacy.analysis import as_orders, rdp_poisson_subsampled
from capc_common.privacy.analysis._checks import count

if TYPE_CHECKING:
    from capc_common.privacy import DataDependentPATEAccountant, NoiseSource

__all__ = ["PrivateKNN"]


class PrivateKNN(GNMax):
    """GNMax over kNN votes of Poisson-subsampled private records.

    Args:
        classes: number of classes.
        sigma: σ of the discrete Gaussian argmax noise.
        neighbours: ``k``, votes each party casts per query (at most).
        sampling_rate: ``q``, every record's inclusion probability in each query's sample.
    """

    name = "private-knn"
    accounting = (
        "data-independent, the Poisson-subsampled discrete Gaussian per answer: base λ/σ² at sampling rate q "
        "(Zhu & Wang 2019, Theorem 6)"
    )
    trains_heads: ClassVar[bool] = False

    def __init__(self, *, classes: int, sigma: float, neighbours: int, sampling_rate: float) -> None:
        super().__init__(classes=classes, sigma=sigma)
        self.neighbours = count("neighbours", neighbours, minimum=1)
        if not 0 < sampling_rate <= 1:
            raise InputError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
        self.sampling_rate = float(sampling_rate)

    def params(self) -> dict[str, Any]:
        """GNMax's parameters plus ``k`` and ``q``."""
        return {
            **super().params(),
            "mechanism": self.name,
            "neighbours": self.neighbours,
            "sampling_rate": self.sampling_rate,
        }

    def costs(self, orders: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Nothing per screened query; per answered query the Poisson-subsampled ``α/σ²``."""
        lam = as_orders(orders)
        sigma = self.sigma

        def base(alpha: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return alpha / (sigma * sigma)

        return np.zeros_like(lam), rdp_poisson_subsampled(
            lam, sampling_rate=self.sampling_rate, base_rdp=base
        )

    def data_dependent(self) -> DataDependentPATEAccountant | None:
        """No data-dependent analysis: it would ignore the subsampling."""
        return None

    def voter(self, party: PartyResources) -> Voter:
        """The party's own records vote (:class:`~capc_common.mechanisms.voters.KNNVoter`), sampled from its
        own sampling source."""
        images, labels = party.records()
        return KNNVoter(self, party.backbone, images, labels, source=party.sampling())

    def votes(
        self,
        features: npt.ArrayLike,
        labels: npt.ArrayLike,
        queries: npt.ArrayLike,
        *,
        source: NoiseSource,
    ) -> npt.NDArray[np.int64]:
        """One party's vote counts ``(B, classes)`` on ``queries``: a fresh Poisson sample per query.

        Args:
            features: the party's per-example features ``(n, dim)``.
            labels: their labels ``(n,)``.
            queries: query features ``(B, dim)`` (the same map).
            source: the party's own randomness (its Poisson samples), a CSPRNG in production.

        Raises:
            InputError: shapes or labels that do not fit.
        """
        x = normalise(features)
        y = np.asarray(labels, dtype=np.int64)
        q = normalise(queries)
        if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1] or y.shape != (x.shape[0],):
            raise InputError(
                f"features {x.shape}, labels {y.shape} and queries {q.shape} do not fit (n, d), (n,), (B, d)"
            )
        if y.size and (y.min() < 0 or y.max() >= self.classes):
            raise InputError(f"labels must be class indices in [0, {self.classes})")
        hist = np.zeros((q.shape[0], self.classes), dtype=np.int64)
        similarity = q @ x.T
        for i in range(q.shape[0]):
            sample = poisson_sample(x.shape[0], rate=self.sampling_rate, source=source)
            if sample.size == 0:
                continue
            k = min(self.neighbours, sample.size)
            scores = similarity[i, sample]
            # A total order (similarity, then record order) so that adding or removing one record changes
            # the k nearest by at most that record: an unstable partition could swap tied records and move
            # several votes (L2 sensitivity √2 assumed by the accounting).
            nearest = sample[np.argsort(-scores, kind="stable")[:k]]
            hist[i] += np.bincount(y[nearest], minlength=self.classes)
        return hist

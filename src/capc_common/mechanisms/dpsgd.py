"""Secure-aggregation DP-SGD: a linear softmax head on the shared frozen backbone, trained with DP-SGD where
no one sees a party's gradients.

Every round each party draws a Poisson sample of its own records (rate ``q``, from its own CSPRNG), computes
the per-example gradients of the cross-entropy of the current head, clips each to L2 norm ``C``, sums them,
encodes the sum in fixed point and secret-shares it (:mod:`capc_common.mechanisms.release`). The guardian
adds exact discrete Gaussian noise ``N_Z(0, σ²)`` to the shared total and charges its ledger; only the noisy
sum is reconstructed, by the student, who updates the head.

**Sensitivity in the ring.** Removing one record changes its party's clipped float sum by at most ``C_eff``
in L2; the party rounds its sum once, and two roundings differ by at most 1 per coordinate, so the integer
total changes by at most ``C_eff · 2^bits + √d`` (``d`` coordinates). ``C_eff`` is chosen so that this is
below ``Δ = ⌊C · 2^bits⌋``: the integer sensitivity is exactly ``Δ`` and ``σ = z · Δ``.

**Accounting** (next to the mechanism): one round is the Poisson-subsampled discrete Gaussian,
:func:`~capc_common.privacy.analysis.rdp_subsampled_discrete_gaussian` (Zhu & Wang 2019's general bound on
the discrete Gaussian's RDP ``αΔ²/(2σ²)``); rounds compose by addition. The sampling the code does is
exactly what is accounted: independent inclusion with probability ``⌊q·2^64⌋/2^64 ≤ q`` from 64-bit CSPRNG
words.

Features must be *per-example* (BatchNorm running statistics): with current statistics a record would move
other records' features and the clipping argument would not hold.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mechanisms.release import FixedPoint, ReleaseMechanism
from capc_common.privacy.analysis import as_orders, rdp_subsampled_discrete_gaussian
from capc_common.privacy.analysis._checks import count, positive
from capc_common.privacy.noise.tables import MAX_SIGMA

if TYPE_CHECKING:
    from capc_common.privacy import NoiseSource

__all__ = ["MAX_HEAD_REACH", "SecureDPSGD", "fixed_point_for", "poisson_sample", "record_squares"]

#: Records whose statistics rows (:meth:`SecureDPSGD.statistics_contribution`) are made at once: 16 MB of
#: float64 rows for 1,024 coordinates.
_STATISTICS_ROWS = 1024

#: Largest ``‖w_c‖ + |b_c|`` over the head's rows a party computes gradients for: beyond it a unit-norm
#: record's logits could overflow to inf (and inf − inf is NaN).
MAX_HEAD_REACH = 1e300


def fixed_point_for(*, sigma_per_unit: float, coordinates: int, unit: float = 1.0) -> FixedPoint:
    """The coarsest fixed point whose rounding costs about 1/64 of the clip, within the sampler.

    A party's one rounding can move its integer sum by up to ``√d`` between neighbours, so a record is
    clipped to ``C_eff = (⌊C·2^bits⌋ − √d − 1)/2^bits ≥ C − (√d + 2)/2^bits`` while the noise is calibrated to
    ``⌊C·2^bits⌋``: the smallest ``bits ≥ 8`` with ``unit · 2^bits ≥ 64 (√d + 1)`` keeps that loss within
    ``1/64 + 2^-bits/C`` of the clip (0.984 C for the recipe's 10,250 coordinates). Fewer bits are used if
    ``σ_per_unit · unit · 2^bits`` would exceed the table sampler's range (σ ≤ 3e5). The rule used to stop at
    1/16 (a clip of 0.94 C for the recipe's 10,250 coordinates): on Fashion-MNIST's validation split that cost
    about 0.1 point at ε 1 (three runs of 8 draws: +0.09, +0.23, −0.04 for an exact clip; 0.10 with the noise
    off; ``benchmarks/dpsgd_recipe.py --variants recipe+14-bits recipe recipe+fine-encoding``,
    docs/mechanisms.md) and nothing measurable at ε 3.

    Args:
        sigma_per_unit: noise σ per unit of sensitivity (the noise multiplier).
        coordinates: ``d``, the length of the contribution.
        unit: the sensitivity in real units (the clipping norm).

    Raises:
        InputError: the noise is too large for the sampler even at 0 fractional bits.
    """
    positive("sigma_per_unit", sigma_per_unit)
    need = 64 * (math.sqrt(count("coordinates", coordinates, minimum=1)) + 1) / positive("unit", unit)
    bits = min(max(8, math.ceil(math.log2(need))), 30)
    while bits > 0 and sigma_per_unit * unit * (1 << bits) > MAX_SIGMA:
        bits -= 1
    if sigma_per_unit * unit * (1 << bits) > MAX_SIGMA:
        raise InputError(f"noise σ {sigma_per_unit * unit:g} per unit exceeds the sampler's {MAX_SIGMA:g}")
    return FixedPoint(bits)


def record_squares(features: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each record's squared L2 norm (what :meth:`SecureDPSGD.contribution` clips by), after checking that
    every feature is finite.

    Raises:
        InputError: a feature is inf or NaN (its gradient's norm, hence its clip, would be undefined).
    """
    if not np.isfinite(features).all():
        raise InputError("the features hold inf or NaN; refusing to compute a contribution")
    return np.einsum("ij,ij->i", features, features)


def poisson_sample(records: int, *, rate: float, source: NoiseSource) -> npt.NDArray[np.int64]:
    """Indices of a Poisson sample: each record independently with probability ``⌊q·2^64⌋/2^64``.

    Args:
        records: how many records the party holds.
        rate: ``q ∈ [0, 1]`` (the accounting uses ``q``, never less than the probability realised here).
        source: the party's own randomness (a CSPRNG in production).
    """
    n = count("records", records)
    if not 0 <= rate <= 1:
        raise InputError(f"sampling rate must be in [0, 1], got {rate!r}")
    threshold = np.uint64(min(int(rate * 2.0**64), 2**64 - 1))
    if rate >= 1:
        return np.arange(n, dtype=np.int64)
    return np.flatnonzero(source.uniform_words(n) < threshold).astype(np.int64)


class SecureDPSGD(ReleaseMechanism):
    """DP-SGD of a linear head over secret-shared per-round gradient sums.

    Args:
        classes: number of classes.
        dim: feature dimension (the head has ``classes × (dim + 1)`` parameters, bias included).
        clip: per-example L2 clipping norm ``C``.
        noise_multiplier: ``z = σ/Δ``.
        sampling_rate: Poisson rate ``q`` of every record in every round.
        fixed_point: the encoding (default: :func:`fixed_point_for` the contribution's length).
    """

    name = "secagg-dpsgd"
    accounting = (
        "the Poisson-subsampled discrete Gaussian per round, rounds added (Zhu & Wang 2019's general bound)"
    )

    def __init__(
        self,
        *,
        classes: int,
        dim: int,
        clip: float,
        noise_multiplier: float,
        sampling_rate: float,
        fixed_point: FixedPoint | None = None,
    ) -> None:
        self.classes = count("classes", classes, minimum=2)
        self.dim = count("dim", dim, minimum=1)
        self.clip = positive("clip", clip)
        self.noise_multiplier = positive("noise_multiplier", noise_multiplier)
        if not 0 < sampling_rate <= 1:
            raise InputError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
        self.sampling_rate = float(sampling_rate)
        self.size = self.classes * (self.dim + 1)
        self.fixed_point = fixed_point or fixed_point_for(
            sigma_per_unit=self.noise_multiplier, coordinates=self.size, unit=self.clip
        )
        self.sensitivity = math.floor(self.clip * self.fixed_point.scale)
        # Room for the party's one rounding (≤ 1 per coordinate between neighbours) and float error.
        self.clip_effective = (self.sensitivity - math.sqrt(self.size) - 1) / self.fixed_point.scale
        if self.clip_effective <= 0:
            raise InputError(
                f"clip {self.clip:g} at {self.fixed_point.bits} fractional bits leaves no room for rounding "
                f"{self.size} coordinates; raise the clip or the fixed-point bits"
            )
        self.sigma = self.noise_multiplier * self.sensitivity

    def params(self) -> dict[str, Any]:
        """Public parameters of one round."""
        return {
            "mechanism": self.name,
            "classes": self.classes,
            "dim": self.dim,
            "clip": self.clip,
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "fixed_point_bits": self.fixed_point.bits,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "noise": "discrete",
        }

    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP of one round: the Poisson-subsampled discrete Gaussian (general bound)."""
        return rdp_subsampled_discrete_gaussian(
            as_orders(orders), sampling_rate=self.sampling_rate, noise_multiplier=self.noise_multiplier
        )

    def sigmas(self) -> npt.NDArray[np.float64]:
        """The same σ on every coordinate."""
        return np.full(self.size, self.sigma)

    def max_abs_total(self, *, records: int) -> float:
        """Every record adds at most Δ (plus its party's rounding) to a coordinate."""
        return float(records) * (self.sensitivity + 1)

    def sample(self, records: int, source: NoiseSource) -> npt.NDArray[np.int64]:
        """This round's Poisson sample of a party's ``records`` (indices)."""
        return poisson_sample(records, rate=self.sampling_rate, source=source)

    def contribution(
        self,
        weights: npt.ArrayLike,
        features: npt.ArrayLike,
        labels: npt.ArrayLike,
        *,
        squares: npt.NDArray[np.float64] | None = None,
    ) -> npt.NDArray[np.int64]:
        """A party's fixed-point sum of clipped per-example gradients over the records given (its sample).

        Args:
            weights: the current head ``(classes, dim + 1)``, bias last.
            features: the sampled records' features ``(n, dim)``.
            labels: their labels ``(n,)``.
            squares: :func:`record_squares` of these very features, computed before (a full batch is the
                same records every round: :class:`~.training.DPSGDTrainer` keeps them for the immutable
                arrays it made); None computes them. Trusted as given: other norms would clip by a wrong
                norm, so only pass what :func:`record_squares` returned for these unchanged features.

        Returns:
            int64 vector of length ``classes · (dim + 1)``.

        Raises:
            InputError: shapes that do not match the head.
        """
        w = np.asarray(weights, dtype=np.float64)
        x = np.asarray(features, dtype=np.float64)  # no copy when the caller keeps float64 features
        y = np.asarray(labels, dtype=np.int64)
        if w.shape != (self.classes, self.dim + 1) or x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(
                f"head {w.shape} and features {x.shape} do not match ({self.classes}, {self.dim + 1}) and "
                f"(n, {self.dim})"
            )
        if y.shape != (x.shape[0],) or (y.size and (y.min() < 0 or y.max() >= self.classes)):
            raise InputError(f"labels must be {x.shape[0]} class indices in [0, {self.classes})")
        if squares is None:
            squares = record_squares(x)
        if squares.shape != (x.shape[0],):
            raise InputError(f"{squares.shape} squared norms for {x.shape[0]} records")
        if not np.isfinite(w).all():
            # inf − inf in the logits would make a record's clipped gradient NaN, which encodes far beyond
            # the sensitivity Δ: a party must not trust the head it is sent.
            raise InputError("the head holds inf or NaN; refusing to compute a contribution")
        with np.errstate(over="ignore"):
            reach = float((np.linalg.norm(w[:, :-1], axis=1) + np.abs(w[:, -1])).max())
        if not reach <= MAX_HEAD_REACH:
            # A finite head this large overflows the logits of unit-norm features. The check reads only the
            # (public) head, so refusing reveals nothing about the records.
            raise InputError(
                f"the head's rows reach {reach:g} (> {MAX_HEAD_REACH:g}) and would overflow the logits; "
                "refusing to compute a contribution (the student's head diverged or is not to be trusted)"
            )
        # Overflow can only come from huge features here (the head's reach is bounded); those records are
        # zeroed below, so numpy's warnings about them are expected.
        with np.errstate(over="ignore", invalid="ignore"):
            # The bias is a weight on a constant feature 1, kept apart so the features are never copied.
            logits = x @ w[:, :-1].T + w[:, -1]
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(y)), y] -= 1.0  # d loss / d logits
            # The per-example gradient is an outer product: its norm is the product of the two norms.
            norms = np.sqrt((p * p).sum(axis=1) * (squares + 1.0))
            g = p * np.minimum(1.0, self.clip_effective / np.maximum(norms, 1e-300))[:, None]
        # A record whose gradient is not finite (huge features overflowing the logits) contributes zero: a
        # per-record map, so it stays within the clip whatever the other records are. Refusing instead
        # would make the party's answer depend on one record.
        g[~np.isfinite(g).all(axis=1)] = 0.0
        # xᵀg, transposed: the same sums as gᵀx, which OpenBLAS runs ten times slower with so few rows
        # (measured: 0.62 s against 0.06 s for 20,000 records of 1,024 features, every round of every party).
        total = np.concatenate([(x.T @ g).T, g.sum(axis=0)[:, None]], axis=1)
        return self.fixed_point.encode(total).ravel()

    def statistics_contribution(self, features: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """A party's fixed-point sums of its records' features, their squares and their count, as one
        contribution of this mechanism (the recipe's statistics release, :mod:`~.training`).

        Each record adds ``(u, u², 1) · C_eff/√3``, clipped to ``C_eff`` in L2 (for ``‖u‖ ≤ 1`` the clip never
        binds: ``‖u‖² + ‖u²‖² + 1 ≤ 3``), so one record moves the contribution by at most what one clipped
        gradient does: the same sensitivity, noise and RDP as a gradient round, and the release is charged as
        one. The vector is zero-padded to the gradient's length.

        Args:
            features: the sampled records' features ``(n, dim)``, each of L2 norm at most 1 up to rounding
                (the clip bounds a record's share whatever its norm).

        Raises:
            InputError: features of another width, or holding inf or NaN.
        """
        u = np.asarray(features)
        if u.ndim != 2 or u.shape[1] != self.dim:
            raise InputError(f"features {u.shape} do not match (n, {self.dim})")
        if 2 * self.dim + 1 > self.size:
            raise InputError(f"{self.classes} classes leave no room for {2 * self.dim + 1} statistics")
        if not np.isfinite(u).all():
            raise InputError("the features hold inf or NaN; refusing to compute a contribution")
        total = np.zeros(self.size)
        # A block of records at a time: the rows (u, u², 1) of 20,000 records of 1,024 coordinates are 328 MB
        # of float64, twice over while scaled. Each block's rows are added to the running sum one after the
        # other, the order numpy's sum over the rows of the whole array takes: the same bits.
        summed: npt.NDArray[np.float64] | None = None
        for start in range(0, len(u), _STATISTICS_ROWS):
            block = np.asarray(u[start : start + _STATISTICS_ROWS], dtype=np.float64)
            rows = np.concatenate([block, block * block, np.ones((len(block), 1))], axis=1)
            rows *= self.clip_effective / math.sqrt(3)
            norms = np.linalg.norm(rows, axis=1)
            rows *= np.minimum(1.0, self.clip_effective / np.maximum(norms, 1e-300))[:, None]
            summed = rows.sum(axis=0) if summed is None else np.concatenate([summed[None], rows]).sum(axis=0)
        if summed is not None:
            total[: 2 * self.dim + 1] = summed
        return self.fixed_point.encode(total)

    def statistics(
        self, total: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
        """A revealed statistics release as ``(sum of features, sum of their squares, count)`` (noisy)."""
        values = self.fixed_point.decode(total)[: 2 * self.dim + 1] * (math.sqrt(3) / self.clip_effective)
        return values[: self.dim], values[self.dim : 2 * self.dim], float(values[-1])

    @property
    def statistics_sigma(self) -> float:
        """σ of the noise on each sum :meth:`statistics` reads back (public: it is the guardian's σ)."""
        return self.sigma / self.fixed_point.scale * (math.sqrt(3) / self.clip_effective)

    def gradient(self, total: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The revealed noisy sum decoded into the head's shape ``(classes, dim + 1)``."""
        return self.fixed_point.decode(total).reshape(self.classes, self.dim + 1)

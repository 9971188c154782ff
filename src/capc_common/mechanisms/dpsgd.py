"""Secure-aggregation DP-SGD: a linear softmax head on the shared frozen backbone, trained with DP-SGD where
no one sees a party's gradients.

Every round each party draws a Poisson sample of its own records (rate ``q``, from its own CSPRNG), computes
the per-example gradients of the cross-entropy of the current head, clips each to L2 norm ``C``, rounds each
to fixed point, sums them exactly as integers and secret-shares the sum
(:mod:`capc_common.mechanisms.release`). The guardian and the student each add one part of exact discrete
Gaussian noise to the shared total (together at least as private as ``N_Z(0, σ²)``), the guardian charges its
ledger first; only the noisy sum is reconstructed, by the student, who updates the head.

**Sensitivity in the ring, exactly.** A record's gradient is the outer product of its class factor ``g``
(the softmax's gradient, clipped) and its row ``r = (x, 1)``; it is written as ``(g‖r‖) ⊗ (r/‖r‖)``, the
first factor of norm at most ``C_eff``, the second a unit vector, and each is rounded to fixed point on its
own (``FACTOR_BITS`` and ``ROW_BITS``): the record's rounded gradient is an integer matrix of norm at most
``(C_eff + √c/2^(f+1))(1 + √(k+1)/2^(r+1))`` in units of ``2^-(f+r)``. The party sums these integers exactly
(float64 products of integers whose every partial sum stays below 2^53, chunk by chunk, added in int64), so
removing one record changes the exact sum by that record's integers alone — no floating-point error term,
however many records. The exact sum is then rounded once to ``2^-bits`` (two roundings differ by at most 1
per coordinate, ``√d`` in L2). ``C_eff`` is the largest clip for which all of this stays within
``Δ = ⌊C · 2^bits⌋`` (less ``2^-30`` for the floating point of each record's own norms), so the integer
sensitivity is exactly ``Δ`` and ``σ = z · Δ``, rounded up.

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
from capc_common.mechanisms.release import (
    NOISE_PARTS,
    FixedPoint,
    NoiseBlock,
    ReleaseMechanism,
    sigma_at_least,
)
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
#: Fractional bits of each record's unit row ``(x, 1)/‖(x, 1)‖`` in the exact sum (its rounding moves a
#: unit row of 1,025 coordinates by at most 6e-5 of its norm).
ROW_BITS = 18
#: Fractional bits of each record's class factor at a clip of 1 (more for a smaller clip, so its entries stay
#: near 2^18): every product of two factors is below about 2^36, so a float64 product over 2^17 records is
#: exact and a party's int64 sum (at most 2^24 records) cannot overflow.
FACTOR_BITS = 18
#: The effective clip is lowered by this fraction for the floating point of each record's own norms (a few
#: ulps); the sum over records is exact and needs no margin.
NORM_MARGIN = 2.0**-30
_EXACT = 2**53 - 1  # every integer up to here is a float64
_CHUNK = 512  # records per exact product at most (a chunk's unit rows: 4 MB at 1,024 features, in cache)


def fixed_point_for(*, sigma_per_unit: float, coordinates: int, unit: float = 1.0) -> FixedPoint:
    """The coarsest fixed point whose rounding costs about 1/64 of the clip, within the sampler.

    A party's one rounding of its exact sum can move it by up to ``√d`` between neighbours, so a record is
    clipped to about ``C_eff = (⌊C·2^bits⌋ − √d)/2^bits ≥ C − (√d + 1)/2^bits`` (less about 6e-5 of it for the
    rounding of each record's factors, :class:`SecureDPSGD`) while the noise is calibrated to ``⌊C·2^bits⌋``:
    the smallest ``bits ≥ 8`` with ``unit · 2^bits ≥ 64 (√d + 1)`` keeps that loss within
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
        bits = self.fixed_point.bits
        self.row_bits = ROW_BITS
        self.factor_bits = max(FACTOR_BITS - math.ceil(math.log2(self.clip)), bits - ROW_BITS, 0)
        self.clip_effective = self._effective_clip()
        if self.clip_effective <= 0:
            raise InputError(
                f"clip {self.clip:g} at {self.fixed_point.bits} fractional bits leaves no room for rounding "
                f"{self.size} coordinates; raise the clip or the fixed-point bits"
            )
        #: The largest product of a record's two rounded factors (integers): bounds every partial sum.
        self._product = (math.floor(self.clip_effective * 2**self.factor_bits) + 1) << self.row_bits
        if self._product > _EXACT:
            raise InputError(
                f"clip {self.clip:g} at {self.fixed_point.bits} fractional bits makes one record's products "
                "too large to sum exactly in float64 (2^53); lower the clip or the fixed-point bits"
            )
        self.sigma = sigma_at_least(self.noise_multiplier, self.sensitivity)
        self._blocks = (NoiseBlock(self.size, self.sigma, self.sensitivity),)

    def _effective_clip(self) -> float:
        """The largest clip whose rounded records keep the integer sensitivity within ``Δ`` (module doc).

        A gradient's two factors round to at most ``(C_eff + √c/2^(f+1))(1 + √(k+1)/2^(r+1))`` in norm; a
        statistics record (:meth:`statistics_contribution`) rounds at ``2^-(f+r)`` to at most ``C_eff +
        √(2k+1)/2^(f+r+1)``; the exact sum's rounding to ``2^-bits`` adds ``√d``.
        """
        f, r, scale = self.factor_bits, self.row_bits, self.fixed_point.scale
        room = (self.sensitivity - math.sqrt(self.size)) / scale
        gradient = room / (1 + math.sqrt(self.dim + 1) / 2 ** (r + 1)) - math.sqrt(self.classes) / 2 ** (
            f + 1
        )
        statistics = room - math.sqrt(2 * self.dim + 1) / 2 ** (f + r + 1)
        return min(gradient, statistics) * (1 - NORM_MARGIN)

    @property
    def _shift(self) -> int:
        """Bits dropped when the exact sum (units ``2^-(f+r)``) is rounded to the fixed point ``2^-bits``."""
        return self.factor_bits + self.row_bits - self.fixed_point.bits

    def _rounded(self, exact: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The exact integer sum rounded to the fixed point (half up): a function of the sum alone, so two
        sums differ afterwards by at most their difference plus 1 per coordinate."""
        shift = self._shift
        if shift == 0:
            return exact
        return (exact + (1 << (shift - 1))) >> shift

    def _check_records(self, records: int) -> None:
        """Refuse a party whose exact sum could overflow int64 (beyond :data:`MAX_RECORDS`' share)."""
        if records * self._product >= 2**62:
            raise InputError(
                f"{records} records cannot be summed exactly at {self.factor_bits + self.row_bits} "
                "fractional bits; use fewer records per party"
            )

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
            "noise_part": self.blocks()[0].part,
        }

    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP of one round: the Poisson-subsampled discrete Gaussian (general bound)."""
        return rdp_subsampled_discrete_gaussian(
            as_orders(orders), sampling_rate=self.sampling_rate, noise_multiplier=self.noise_multiplier
        )

    def coalition_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """One round against a coalition that knows one part of the noise: the Poisson-subsampled discrete
        Gaussian at the other part's σ (its multiplier rounded down: never an under-count)."""
        part = math.nextafter(self.blocks()[0].part / self.sensitivity, 0.0)
        return rdp_subsampled_discrete_gaussian(
            as_orders(orders), sampling_rate=self.sampling_rate, noise_multiplier=part
        )

    def blocks(self) -> tuple[NoiseBlock, ...]:
        """The same σ on every coordinate."""
        return self._blocks

    def sensitivities(self) -> dict[str, float]:
        """``Δ`` in integer units, and the clip ``C`` it stands for in the head's units."""
        return {"l2": float(self.sensitivity), "clip": self.clip}

    def max_abs_total(self, *, records: int) -> float:
        """Every record adds at most one product of its factors to a coordinate (about Δ), and the party's
        rounding 1."""
        return float(records) * self._product / 2**self._shift + 1

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
        self._check_records(len(x))
        # Overflow can only come from huge features here (the head's reach is bounded); those records are
        # zeroed below, so numpy's warnings about them are expected.
        with np.errstate(over="ignore", invalid="ignore"):
            # The bias is a weight on a constant feature 1, kept apart so the features are never copied.
            logits = x @ w[:, :-1].T + w[:, -1]
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(y)), y] -= 1.0  # d loss / d logits
            # The per-example gradient p ⊗ (x, 1) is (p·‖(x, 1)‖) ⊗ (x, 1)/‖(x, 1)‖; clipped, the class factor
            # is p·min(‖(x, 1)‖, C_eff/‖p‖), of norm at most C_eff.
            row_norms = np.sqrt(squares + 1.0)
            factor = np.minimum(
                row_norms, self.clip_effective / np.maximum(np.sqrt((p * p).sum(axis=1)), 1e-300)
            )
            classes = np.rint(p * (factor * 2.0**self.factor_bits)[:, None])
        # A record whose gradient is not finite (huge features overflowing the logits) contributes zero: a
        # per-record map, so it stays within the clip whatever the other records are. Refusing instead
        # would make the party's answer depend on one record.
        classes[~np.isfinite(classes).all(axis=1)] = 0.0
        return self._exact_gradient_sum(x, row_norms, classes)

    def _exact_gradient_sum(
        self, x: npt.NDArray[np.float64], row_norms: npt.NDArray[np.float64], classes: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.int64]:
        """``Σ_i classes_i ⊗ round(2^r (x_i, 1)/‖(x_i, 1)‖)`` exactly, rounded to the fixed point.

        Each chunk's product is a float64 matrix product of integers whose every partial sum stays below
        2^53, so BLAS computes it exactly in any order; the chunks add in int64. xᵀg, transposed: the same
        sums as gᵀx, which OpenBLAS runs ten times slower with so few rows (measured: 0.62 s against 0.06 s
        for 20,000 records of 1,024 features).
        """
        unit = 2.0**self.row_bits / row_norms  # (x, 1)/‖(x, 1)‖ at 2^r: every coordinate at most 2^r
        exact = np.zeros((self.classes, self.dim + 1), dtype=np.int64)
        step = max(1, min(_EXACT // self._product, _CHUNK))
        units = np.empty((min(step, len(x)), self.dim))  # one chunk's rounded unit rows, reused
        for start in range(0, len(x), step):
            rows, factors = slice(start, start + step), classes[start : start + step]
            block = units[: len(factors)]
            with np.errstate(over="ignore", invalid="ignore"):
                np.multiply(x[rows], unit[rows, None], out=block)
            np.rint(block, out=block)
            exact[:, :-1] += (block.T @ factors).T.astype(np.int64)
            exact[:, -1] += (np.rint(unit[rows]) @ factors).astype(np.int64)
        return self._rounded(exact).ravel()

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
        self._check_records(len(u))
        # A block of records at a time: the rows (u, u², 1) of 20,000 records of 1,024 coordinates are 328 MB
        # of float64, twice over while scaled. Each record is rounded to 2^-(f+r) on its own and the rounded
        # rows are summed exactly in int64, so the blocks' order cannot change a bit; the sum is rounded once.
        exact = np.zeros(self.size, dtype=np.int64)
        scale = 2.0 ** (self.factor_bits + self.row_bits)
        for start in range(0, len(u), _STATISTICS_ROWS):
            block = np.asarray(u[start : start + _STATISTICS_ROWS], dtype=np.float64)
            rows = np.concatenate([block, block * block, np.ones((len(block), 1))], axis=1)
            rows *= self.clip_effective / math.sqrt(3)
            norms = np.linalg.norm(rows, axis=1)
            rows *= np.minimum(1.0, self.clip_effective / np.maximum(norms, 1e-300))[:, None]
            exact[: rows.shape[1]] += np.rint(rows * scale).astype(np.int64).sum(axis=0)
        return self._rounded(exact)

    def statistics(
        self, total: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
        """A revealed statistics release as ``(sum of features, sum of their squares, count)`` (noisy)."""
        values = self.fixed_point.decode(total)[: 2 * self.dim + 1] * (math.sqrt(3) / self.clip_effective)
        return values[: self.dim], values[self.dim : 2 * self.dim], float(values[-1])

    @property
    def statistics_sigma(self) -> float:
        """σ of the noise on each sum :meth:`statistics` reads back (public: both parts' σ together)."""
        noise = math.sqrt(NOISE_PARTS) * self.blocks()[0].part
        return noise / self.fixed_point.scale * (math.sqrt(3) / self.clip_effective)

    def gradient(self, total: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The revealed noisy sum decoded into the head's shape ``(classes, dim + 1)``."""
        return self.fixed_point.decode(total).reshape(self.classes, self.dim + 1)

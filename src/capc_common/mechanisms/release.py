"""Release mechanisms: parties contribute integer vectors, the guardian and the student each add a part of the
discrete Gaussian noise to the secret-shared total, and only the noisy total is reconstructed (DP prototypes,
DPPL-Public's votes, secure-aggregation DP-SGD).

The engine's sharing, with a release instead of a 2PC selection (DESIGN §3):

1. each party encodes its contribution as integers (fixed point, :class:`FixedPoint`), draws a fresh 16-byte
   seed, sends the seed to the guardian and ``V_p − AES-CTR(seed) mod 2^w`` to the student
   (:func:`share_contribution`);
2. the student adds its shares and its part of the noise ``z_s`` (:func:`student_half`);
3. the guardian expands and sums the seeds, adds its part ``z_g`` and — only after the release is charged on
   its ledger — sends ``A + z_g mod 2^w`` to the student (:func:`masked_total`);
4. the student adds its half and that message and reads the result as signed integers (:func:`reveal`):
   ``Σ_p V_p + z_g + z_s``.

**Noise split.** No single party draws all of a release's noise (DESIGN §2): ``z_g`` and ``z_s`` are
independent exact discrete Gaussians ``N_Z(0, s²)`` from each party's own CSPRNG, ``s`` from
:func:`~capc_common.privacy.analysis.share_sigma` so that their sum is at least as private as the planned
``N_Z(0, σ²)`` (Kairouz, Liu & Steinke 2021): the ledger charges the plan, and the total variance is the
plan's (``2s² = σ²`` up to ``2^-40``) wherever ``σ`` is not tiny. Whoever knows one part — the guardian,
the student, either with any teacher party, which sees each round's state — still sees the other part
alone: :meth:`ReleaseMechanism.coalition_rdp` is what one release costs against such a coalition.

The ring is ``Z_{2^62}`` (no circuit runs over it, so its width costs nothing); every mechanism checks that
its largest possible noisy total fits (:meth:`ReleaseMechanism.check_capacity`).
"""

from __future__ import annotations

import itertools
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from capc_common.data.partition import NEIGHBOURING
from capc_common.errors import InputError
from capc_common.mpc.sharing import SEED_BYTES, expand_share_seed, reduce_shares
from capc_common.privacy.analysis import as_orders, rdp_zcdp, share_sigma

if TYPE_CHECKING:
    from capc_common.privacy import NoiseSource

__all__ = [
    "NOISE_PARTS",
    "RING_WIDTH",
    "FixedPoint",
    "NoiseBlock",
    "ReleaseMechanism",
    "calibrate",
    "masked_total",
    "reveal",
    "share_contribution",
    "sigma_at_least",
    "student_half",
]

RING_WIDTH = 62
#: Noise is bounded by this many σ when sizing the ring (a discrete Gaussian exceeds 12σ with probability
#: below 1e-32).
TAILS = 12.0
#: Parties that each add a part of a release's noise: the guardian and the student.
NOISE_PARTS = 2


def sigma_at_least(multiplier: float, sensitivity: int) -> float:
    """``σ = z·Δ`` rounded up: the smallest float not below the exact product (a float product may round
    down, and a σ below the plan's would under-count).

    Raises:
        InputError: a multiplier that is not a finite positive number.
    """
    if not (math.isfinite(multiplier) and multiplier > 0):
        raise InputError(f"a noise multiplier must be a finite number > 0, got {multiplier!r}")
    exact = Fraction(multiplier) * sensitivity
    sigma = float(exact)
    while Fraction(sigma) < exact:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


@dataclass(frozen=True)
class NoiseBlock:
    """A run of a release's coordinates that share one planned noise σ and one L2 sensitivity.

    Attributes:
        length: coordinates in the block.
        sigma: the planned σ (integer units): what the ledger charges the block at.
        sensitivity: the block's L2 sensitivity ``Δ`` (integer units) under add/remove of one record.
    """

    length: int
    sigma: float
    sensitivity: float

    @cached_property
    def part(self) -> float:
        """σ of each party's part (:func:`~capc_common.privacy.analysis.share_sigma`)."""
        return share_sigma(
            self.sigma, sensitivity=self.sensitivity, dimension=self.length, parties=NOISE_PARTS
        )


@dataclass(frozen=True)
class FixedPoint:
    """Reals as integers ``round(x · 2^bits)``.

    Attributes:
        bits: fractional bits; ``2^-bits / 2`` is the largest rounding error per coordinate.
    """

    bits: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.bits <= 40:
            raise InputError(f"fixed-point fractional bits must be in [0, 40], got {self.bits}")

    @property
    def scale(self) -> int:
        """``2^bits``."""
        return 1 << self.bits

    def encode(self, values: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``round(x · 2^bits)`` as int64 (float64 arithmetic; exact for |x · 2^bits| < 2^52)."""
        return np.rint(np.asarray(values, dtype=np.float64) * self.scale).astype(np.int64)

    def decode(self, values: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``v / 2^bits``."""
        return np.asarray(values, dtype=np.float64) / self.scale


def share_contribution(
    values: npt.ArrayLike, *, width: int = RING_WIDTH
) -> tuple[bytes, npt.NDArray[np.int64]]:
    """Split one party's integer vector into the guardian's seed and the student's share.

    Args:
        values: int64 vector (any sign; reduced mod 2^width).
        width: ring width in bits.

    Returns:
        ``(seed, share)``: a fresh 16-byte seed (from ``os.urandom``) and ``values − AES-CTR(seed) mod 2^w``.
        Call once per release: a seed is never reused.

    Raises:
        InputError: not a 1-D integer vector.
    """
    v = np.asarray(values)
    if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer):
        raise InputError(f"a contribution is a 1-D integer vector, got {v.dtype} {v.shape}")
    seed = os.urandom(SEED_BYTES)
    mask = expand_share_seed(seed, shape=v.shape, width=width)
    return seed, reduce_shares(v.astype(np.int64) - mask, width=width)


def masked_total(
    seeds: Sequence[bytes], *, noise: npt.NDArray[np.int64], width: int = RING_WIDTH
) -> npt.NDArray[np.int64]:
    """The guardian's message: ``Σ_p AES-CTR(seed_p) + z mod 2^w`` (send it only after charging the ledger).

    Raises:
        InputError: no seed, or a malformed one.
    """
    if not seeds:
        raise InputError("the guardian needs at least one party's seed to release a total")
    z = np.asarray(noise, dtype=np.int64)
    total = reduce_shares(z, width=width)
    for seed in seeds:
        total = reduce_shares(total + expand_share_seed(seed, shape=z.shape, width=width), width=width)
    return total


def _ring_sum(
    start: npt.NDArray[np.int64], shares: Sequence[npt.ArrayLike], *, width: int, against: str
) -> npt.NDArray[np.int64]:
    """``start + Σ shares mod 2^w``, every share of ``start``'s shape.

    Raises:
        InputError: a share of another shape (named against ``against``).
    """
    total = reduce_shares(start, width=width)
    for share in shares:
        s = np.asarray(share, dtype=np.int64)
        if s.shape != start.shape:
            raise InputError(f"share of shape {s.shape} does not match {against} {start.shape}")
        total = reduce_shares(total + s, width=width)
    return total


def student_half(
    shares: Sequence[npt.ArrayLike], *, noise: npt.NDArray[np.int64], width: int = RING_WIDTH
) -> npt.NDArray[np.int64]:
    """The student's half of a release: its parties' shares plus its part of the noise, ``Σ shares + z_s mod
    2^w`` (uniformly masked: it reveals nothing without the guardian's message).

    Raises:
        InputError: no share, or shapes that differ from the noise's.
    """
    if not shares:
        raise InputError("the student needs at least one party's share to make its half of a release")
    return _ring_sum(np.asarray(noise, dtype=np.int64), shares, width=width, against="the noise")


def reveal(
    shares: Sequence[npt.ArrayLike], masked: npt.ArrayLike, *, width: int = RING_WIDTH
) -> npt.NDArray[np.int64]:
    """The student's reconstruction: ``Σ shares + masked mod 2^w``, read as signed integers.

    Returns:
        ``Σ_p V_p + z`` as int64 (correct whenever its magnitude is below ``2^(w-1)``).

    Raises:
        InputError: no share, or shapes that differ.
    """
    if not shares:
        raise InputError("the student needs at least one party's share to reveal a total")
    m = np.asarray(masked, dtype=np.int64)
    total = _ring_sum(m, shares, width=width, against="the guardian's total")
    half = np.int64(1 << (width - 1))
    return np.where(total >= half, total - np.int64(1 << width), total).astype(np.int64)


class ReleaseMechanism(ABC):
    """A mechanism whose output is the noisy total of the parties' integer contributions.

    Attributes:
        name: registry name.
        accounting: what one release is charged, with the source (named by the model card's ``accountant``).
        neighbouring: the relation ε is for, as the selection family's cards name it: one record added or
            removed (every block's sensitivity is for it; replacing a record is two such steps).
    """

    name: ClassVar[str]
    accounting: ClassVar[str]
    neighbouring: ClassVar[str] = NEIGHBOURING["hash"]

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public parameters (JSON-serialisable), recorded with every ledger entry and report."""

    @abstractmethod
    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP at each order of one release (data-independent: the same for every release), against anyone
        who knows neither part of the noise: the plan the ledger charges."""

    @abstractmethod
    def blocks(self) -> tuple[NoiseBlock, ...]:
        """The contribution's noise blocks, in coordinate order."""

    @abstractmethod
    def max_abs_total(self, *, records: int) -> float:
        """The largest magnitude any coordinate of the noiseless total of ``records`` records can take."""

    def sigmas(self) -> npt.NDArray[np.float64]:
        """The planned σ of the noise on each coordinate (the sum of the parts is at least this private)."""
        return np.concatenate([np.full(b.length, b.sigma) for b in self.blocks()])

    def part_sigmas(self) -> npt.NDArray[np.float64]:
        """σ of each party's part of the noise on each coordinate."""
        return np.concatenate([np.full(b.length, b.part) for b in self.blocks()])

    def sensitivities(self) -> dict[str, float]:
        """Each block's L2 sensitivity in integer units, for the model card (one record added or removed)."""
        blocks = self.blocks()
        if len(blocks) == 1:
            return {"l2": blocks[0].sensitivity}
        return {f"block_{i}_l2": b.sensitivity for i, b in enumerate(blocks)}

    def coalition_zcdp(self) -> float:
        """zCDP of one release against a party that knows one part of the noise: the other part alone,
        ``Σ_blocks Δ²/(2 s²)`` (Canonne, Kamath & Steinke 2020; blocks add, Bun & Steinke 2016)."""
        return math.fsum(b.sensitivity**2 / (2 * b.part**2) for b in self.blocks())

    def coalition_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP at each order of one release against a coalition that knows one part of the noise (the
        guardian's or the student's, with any teacher party): the other part alone protects."""
        return rdp_zcdp(as_orders(orders), rho=self.coalition_zcdp())

    def noise_part(self, source: NoiseSource) -> npt.NDArray[np.int64]:
        """One party's part of the noise of one release: one ``N_Z(0, s_i²)`` per coordinate, drawn block by
        block (runs of equal σ, in coordinate order — the canonical order a seeded source reproduces). The
        guardian and the student each draw one, from their own sources."""
        sig = self.part_sigmas()
        out = np.empty(sig.shape, dtype=np.int64)
        cuts = [0, *(np.flatnonzero(np.diff(sig)) + 1).tolist(), sig.size]
        for start, stop in itertools.pairwise(cuts):
            out[start:stop] = source.discrete_gaussian(sigma=float(sig[start]), shape=(stop - start,))
        return out

    def check_capacity(self, *, records: int, width: int = RING_WIDTH) -> None:
        """Refuse a release whose noisy total could wrap around the ring.

        Raises:
            InputError: naming the bound, the ring and what to lower.
        """
        noise = NOISE_PARTS * TAILS * float(np.max(self.part_sigmas()))
        bound = self.max_abs_total(records=records) + noise
        if not bound < 2.0 ** (width - 1):
            raise InputError(
                f"{self.name}: a noisy total of {records} records may reach {bound:.3g}, beyond the signed "
                f"range of the ring Z_2^{width} (±{2.0 ** (width - 1):.3g}); lower the fixed-point bits"
            )


def calibrate(
    epsilon_of: Callable[[float], float], *, target: float, low: float = 0.2, high: float = 500.0
) -> float:
    """The smallest noise multiplier (to 0.1 %) whose ε, ``epsilon_of(z)``, stays within ``target``.

    Bisection in log space; ``epsilon_of`` must be non-increasing in ``z`` (more noise, less ε), which every
    RDP curve here is.

    Raises:
        InputError: even ``high`` does not reach the target.
    """
    if epsilon_of(high) > target:
        raise InputError(f"no noise multiplier up to {high:g} reaches ε = {target:g}; lower the steps")
    while high / low > 1.001:
        mid = math.sqrt(low * high)
        if epsilon_of(mid) > target:
            low = mid
        else:
            high = mid
    return high

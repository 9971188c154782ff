"""Release mechanisms: parties contribute integer vectors, the guardian adds discrete Gaussian noise to the
secret-shared total, and only the noisy total is reconstructed (DP prototypes, secure-aggregation DP-SGD).

The engine's sharing, with a release instead of a 2PC selection (DESIGN §3):

1. each party encodes its contribution as integers (fixed point, :class:`FixedPoint`), draws a fresh 16-byte
   seed, sends the seed to the guardian and ``V_p − AES-CTR(seed) mod 2^w`` to the student
   (:func:`share_contribution`);
2. the guardian expands and sums the seeds, adds its noise ``z`` (exact discrete Gaussian from a CSPRNG) and
   — only after the release is charged on its ledger — sends ``A + z mod 2^w`` to the student
   (:func:`masked_total`);
3. the student adds its shares and that message and reads the result as signed integers
   (:func:`reveal`): ``Σ_p V_p + z``. It never sees a party's vector or the noiseless total; the guardian
   sees only uniformly random masks.

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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mpc.sharing import SEED_BYTES, expand_share_seed, reduce_shares

if TYPE_CHECKING:
    from capc_common.privacy import NoiseSource

__all__ = [
    "RING_WIDTH",
    "FixedPoint",
    "ReleaseMechanism",
    "calibrate",
    "masked_total",
    "reveal",
    "share_contribution",
]

RING_WIDTH = 62
#: Noise is bounded by this many σ when sizing the ring (a discrete Gaussian exceeds 12σ with probability
#: below 1e-32).
TAILS = 12.0


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
    total = reduce_shares(m, width=width)
    for share in shares:
        s = np.asarray(share, dtype=np.int64)
        if s.shape != m.shape:
            raise InputError(f"share of shape {s.shape} does not match the guardian's total {m.shape}")
        total = reduce_shares(total + s, width=width)
    half = np.int64(1 << (width - 1))
    return np.where(total >= half, total - np.int64(1 << width), total).astype(np.int64)


class ReleaseMechanism(ABC):
    """A mechanism whose output is the noisy total of the parties' integer contributions.

    Attributes:
        name: registry name.
        accounting: what one release is charged, with the source (named by the model card's ``accountant``).
    """

    name: ClassVar[str]
    accounting: ClassVar[str]

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public parameters (JSON-serialisable), recorded with every ledger entry and report."""

    @abstractmethod
    def release_rdp(self, orders: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """RDP at each order of one release (data-independent: the same for every release)."""

    @abstractmethod
    def sigmas(self) -> npt.NDArray[np.float64]:
        """σ of the discrete Gaussian noise on each coordinate of the total (the contribution's length)."""

    @abstractmethod
    def max_abs_total(self, *, records: int) -> float:
        """The largest magnitude any coordinate of the noiseless total of ``records`` records can take."""

    def guardian_noise(self, source: NoiseSource) -> npt.NDArray[np.int64]:
        """The guardian's noise of one release: one ``N_Z(0, σ_i²)`` per coordinate, drawn block by block
        (runs of equal σ, in coordinate order — the canonical order a seeded source reproduces)."""
        sig = self.sigmas()
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
        bound = self.max_abs_total(records=records) + TAILS * float(np.max(self.sigmas()))
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

"""Public parameters of a 2PC session and the ring width they need."""

from __future__ import annotations

import hashlib
import math
from dataclasses import KW_ONLY, dataclass
from typing import Literal

from capc_common.errors import InputError

Mode = Literal["confident", "gnmax"]
MODES: tuple[Mode, ...] = ("confident", "gnmax")
MAX_WIDTH = 62
"""Widest ring supported: values and their sums stay exact in int64 on both sides."""
DEFAULT_TAILS = 12.0
"""Noise is assumed to lie within ±12σ (a discrete Gaussian leaves it with probability < 1e-32)."""
_LIVE_LABEL_BUDGET_BYTES = 64 << 20


def noise_bound(sigma: float, *, tails: float = DEFAULT_TAILS) -> int:
    """The largest |noise| a party enters for a discrete Gaussian N_Z(0, σ²): ⌈tails · σ⌉.

    Both the ring width and each party's refusal of out-of-range noise use this one bound, so what a party
    accepts can never wrap the ring.
    """
    if sigma < 0 or tails <= 0:
        raise InputError(f"noise_bound needs sigma ≥ 0 and tails > 0; got sigma={sigma}, tails={tails}.")
    return math.ceil(tails * sigma)


def ring_width(
    *,
    teachers: int,
    sigma2: float,
    sigma1: float | None = None,
    threshold: int | None = None,
    tails: float = DEFAULT_TAILS,
) -> int:
    """The smallest ring Z_{2^w} in which every noisy quantity of the circuit is exact as a signed integer.

    The circuit computes noisy counts V_j + z2_j with V_j ∈ [0, teachers] and (Confident-GNMax) threshold
    margins V_j + z1_g + z1_s − T, where the threshold noise is split between the guardian (z1_g) and the
    student (z1_s), each N_Z(0, σ1²). The student enters its share plus z1_s, so its z1_s also shifts every
    noisy count of the query (V_j + z2_j + z1_s: the argmax is unchanged by a shift common to all classes).
    All of these must lie in [−2^{w−1}, 2^{w−1}) for the signed comparisons to be right. Each noise is
    bounded by :func:`noise_bound` (``tails`` standard deviations), and each party refuses noise of its own
    outside its bound rather than wrap around; the margins therefore span T ∓ (teachers, 2·⌈tails·σ1⌉). A
    smaller ring means fewer AND gates (≈ 4w per class) and fewer OTs (w per class).

    Args:
        teachers: number of teachers, the largest possible vote count of a class.
        sigma2: standard deviation of the per-class argmax noise z2.
        sigma1: standard deviation of each part of the threshold noise, z1_g and z1_s (Confident-GNMax).
        threshold: the threshold T (Confident-GNMax only; the largest one the guardian will use).
        tails: how many standard deviations of noise to cover.

    Returns:
        The width w in bits.

    Raises:
        InputError: inconsistent or out-of-range arguments.
    """
    if teachers < 1 or sigma2 < 0 or tails <= 0:
        raise InputError(
            f"ring_width needs teachers ≥ 1, sigma2 ≥ 0 and tails > 0; got teachers={teachers}, "
            f"sigma2={sigma2}, tails={tails}."
        )
    if (sigma1 is None) != (threshold is None):
        raise InputError("ring_width: give both sigma1 and threshold (Confident-GNMax) or neither (GNMax).")
    noise2 = noise_bound(sigma2, tails=tails)
    lo, hi = -noise2, teachers + noise2
    if sigma1 is not None and threshold is not None:
        if sigma1 < 0:
            raise InputError(f"sigma1 must be ≥ 0, got {sigma1}.")
        noise1 = noise_bound(sigma1, tails=tails)
        lo = min(lo - noise1, -threshold - 2 * noise1)
        hi = max(hi + noise1, teachers - threshold + 2 * noise1)
    width = 2
    while not (-(1 << (width - 1)) <= lo and hi < (1 << (width - 1))):
        width += 1
    if width > MAX_WIDTH:
        raise InputError(
            f"noisy counts in [{lo}, {hi}] need {width} bits, more than the supported {MAX_WIDTH}."
        )
    return width


@dataclass(frozen=True)
class MpcConfig:
    """Parameters both parties of a session must agree on (their digest is checked in the handshake).

    Args:
        classes: number of classes c (≥ 2).
        width: ring width w in bits (see :func:`ring_width`).
        mode: ``"confident"`` (Confident-GNMax: threshold test, failed queries get no label) or ``"gnmax"``.
        teachers: the largest possible vote count of a class; the garbler uses it to refuse noise that
            would leave the ring.
        student_noise: Confident-GNMax only (None for GNMax): the largest |z1_s| the student may enter as
            its part of the threshold noise, :func:`noise_bound` of σ1. The evaluator refuses anything
            larger and the garbler keeps its own noise within what the ring leaves after it.
        chunk_queries: queries garbled per chunk (bounds memory); default from c and w.
    """

    classes: int
    width: int
    _: KW_ONLY
    teachers: int
    mode: Mode = "confident"
    student_noise: int | None = None
    chunk_queries: int | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.classes <= 1 << 16:
            raise InputError(f"MpcConfig.classes must be in [2, 65536], got {self.classes}.")
        if not 2 <= self.width <= MAX_WIDTH:
            raise InputError(
                f"MpcConfig.width must be in [2, {MAX_WIDTH}], got {self.width}; use ring_width()."
            )
        if self.mode not in MODES:
            raise InputError(f"MpcConfig.mode must be one of {MODES}, got {self.mode!r}.")
        if not 1 <= self.teachers < 1 << (self.width - 1):
            raise InputError(
                f"MpcConfig.teachers={self.teachers} does not fit a signed {self.width}-bit ring; "
                "compute the width with ring_width()."
            )
        confident = self.mode == "confident"
        if confident != (self.student_noise is not None):
            raise InputError(
                "MpcConfig.student_noise is the bound on the student's threshold noise: give it "
                f"(noise_bound(sigma1)) for Confident-GNMax and None for GNMax; got mode={self.mode!r}, "
                f"student_noise={self.student_noise!r}."
            )
        room = (1 << (self.width - 1)) - self.teachers
        if self.student_noise is not None and not 0 <= self.student_noise < room:
            raise InputError(
                f"MpcConfig.student_noise={self.student_noise} must be ≥ 0 and leave room for "
                f"{self.teachers} votes in the signed {self.width}-bit ring; compute the width with "
                "ring_width()."
            )
        if self.chunk_queries is not None and self.chunk_queries < 1:
            raise InputError(f"MpcConfig.chunk_queries must be ≥ 1, got {self.chunk_queries}.")

    @property
    def label_bits(self) -> int:
        """Bits of the argmax index, ⌈log2 c⌉."""
        return (self.classes - 1).bit_length()

    @property
    def queries_per_chunk(self) -> int:
        """Queries garbled together: large enough to amortise Python per layer, small enough to bound memory.

        About six labels per input bit are alive at once (inputs of both parties, sums, carries); the
        default keeps them under ~64 MiB and rounds down to a power of two (at most 4096: larger chunks
        gain nothing once numpy's per-call overhead is amortised).
        """
        if self.chunk_queries is not None:
            return self.chunk_queries
        per_query = 6 * self.classes * self.width * 16
        chunk = max(64, _LIVE_LABEL_BUDGET_BYTES // per_query)
        return min(4096, 1 << (chunk.bit_length() - 1))

    def digest(self) -> bytes:
        """SHA-256 of the canonical encoding: equal digests mean the parties garble the same circuit."""
        text = (
            f"capc-mpc/v2|classes={self.classes}|width={self.width}|mode={self.mode}"
            f"|teachers={self.teachers}|student_noise={self.student_noise}|chunk={self.queries_per_chunk}"
        )
        return hashlib.sha256(text.encode()).digest()

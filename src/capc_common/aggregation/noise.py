"""Who draws which Confident-GNMax noise, from which source, in which order (the canonical noise order).

The threshold noise is split between two parties that do not collude (DESIGN §2): z1 = z1_g + z1_s, each an
independent exact discrete Gaussian N_Z(0, σ1²). The guardian draws z1_g and the argmax noise z2; the student
draws z1_s and enters it into the secure computation itself. Each party therefore sees the pass bits through
noise the other drew (z1_s for the guardian, z1_g for the student), so either alone gets exactly the
screening guarantee at σ1 that the accounting charges; to anyone outside, the threshold noise has variance
2σ1² (only more private).

**Canonical noise order (MUST).** For one batch of ``B`` queries and ``c`` classes:

* the guardian's source, :func:`draw_confident_noise`::

      z1_g = guardian.discrete_gaussian(sigma=sigma1, shape=(B,))      # its part of the threshold noise
      z2   = guardian.discrete_gaussian(sigma=sigma2, shape=(B, c))    # argmax noise, every query and class

* the student's source, :func:`draw_student_noise`::

      z1_s = student.discrete_gaussian(sigma=sigma1, shape=(B,))       # its part of the threshold noise

Batches draw in the order they are computed; the two sources are separate streams, so the order *between*
the parties does not matter. ``z2`` is drawn for every query, answered or not, so the number of draws never
depends on the data. A central run (``capc dietpate run``) and a federation given the same seeded sources
(:func:`mechanism_noise` / :func:`party_noise` with the same seed) produce the same labels, query by query.

Production sources are :class:`~capc_common.privacy.SystemNoise` (a CSPRNG per party). A seeded source is
only ever injected (tests, the differential test against the federation): :func:`party_noise` derives each
party's stream from one seed with a party label, so the two streams are independent of each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.privacy import NoiseSource, SeededNoise, SystemNoise

__all__ = [
    "MechanismNoise",
    "Party",
    "draw_confident_noise",
    "draw_student_noise",
    "mechanism_noise",
    "party_noise",
    "sampling_noise",
]

Party = Literal["guardian", "student"]
PARTIES: tuple[Party, ...] = ("guardian", "student")


@dataclass(frozen=True)
class MechanismNoise:
    """The two parties' noise sources of a run: the guardian's (z1_g, z2, and all GNMax/LNMax noise) and the
    student's (z1_s).

    Attributes:
        guardian: the guardian's source.
        student: the student's source.
    """

    guardian: NoiseSource
    student: NoiseSource


def party_noise(party: Party, *, seed: str | None = None) -> NoiseSource:
    """One party's noise source: a fresh CSPRNG, or (tests only) its seeded stream.

    The guardian's seeded stream is ``SeededNoise(seed)``, the student's ``SeededNoise(seed + "\\0student")``:
    one seed configures both parties of a federation and the central runner alike, and the two streams are
    unrelated AES-CTR keys.

    Args:
        party: ``"guardian"`` or ``"student"``.
        seed: None (production: :class:`~capc_common.privacy.SystemNoise`) or the insecure test seed.

    Raises:
        InputError: unknown party or an empty seed.
    """
    if party not in PARTIES:
        raise InputError(f"noise party must be one of {PARTIES}, got {party!r}")
    if seed is None:
        return SystemNoise()
    if not isinstance(seed, str) or not seed:
        raise InputError(f"an insecure noise seed must be a non-empty string, got {type(seed).__name__}")
    return SeededNoise(seed if party == "guardian" else f"{seed}\0student")


def sampling_noise(party: str, *, seed: str | None = None) -> NoiseSource:
    """A teacher party's sampling randomness (Private-kNN's Poisson samples): a fresh CSPRNG, or (tests only)
    its seeded stream ``SeededNoise(seed + "\\0sample\\0" + party)``.

    In insecure-noise mode the samples are derived from the one federation seed and the party's name, so a
    central run that plays every party with the same names draws the same samples, query by query, and the
    federation can be compared with it exactly. Each party's stream is unrelated to the others' and to the
    guardian's and student's.

    Raises:
        InputError: an empty party name or seed.
    """
    if not party:
        raise InputError("a sampling stream needs the party's name")
    if seed is None:
        return SystemNoise()
    if not isinstance(seed, str) or not seed:
        raise InputError(f"an insecure noise seed must be a non-empty string, got {type(seed).__name__}")
    return SeededNoise(f"{seed}\0sample\0{party}")


def mechanism_noise(*, seed: str | None = None) -> MechanismNoise:
    """Both parties' sources, for a run that plays both (the central runner, tests); see party_noise."""
    return MechanismNoise(
        guardian=party_noise("guardian", seed=seed), student=party_noise("student", seed=seed)
    )


def _count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _sigma(name: str, value: float) -> float:
    real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def draw_confident_noise(
    noise: NoiseSource, *, batch: int, classes: int, sigma1: float, sigma2: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The guardian's noise of one Confident-GNMax batch, in the canonical order: ``z1_g``, then ``z2``.

    Args:
        noise: the guardian's source (a CSPRNG-backed one in production).
        batch: number of queries ``B`` in the batch.
        classes: number of classes ``c``.
        sigma1: standard-deviation parameter of each part of the threshold noise, ``N_Z(0, σ1²)``.
        sigma2: standard-deviation parameter of the argmax noise ``N_Z(0, σ2²)``.

    Returns:
        ``(z1_g, z2)`` with shapes ``(B,)`` and ``(B, c)``, ``int64``. The threshold noise of the batch is
        ``z1_g + z1_s`` with the student's :func:`draw_student_noise`.

    Raises:
        InputError: on a non-positive size or σ.
    """
    b = _count("batch", batch, 1)
    c = _count("classes", classes, 2)
    s1, s2 = _sigma("sigma1", sigma1), _sigma("sigma2", sigma2)
    z1 = np.asarray(noise.discrete_gaussian(sigma=s1, shape=(b,)), dtype=np.int64)
    z2 = np.asarray(noise.discrete_gaussian(sigma=s2, shape=(b, c)), dtype=np.int64)
    return z1, z2


def draw_student_noise(noise: NoiseSource, *, batch: int, sigma1: float) -> npt.NDArray[np.int64]:
    """The student's part ``z1_s`` of one batch's threshold noise: ``(B,)`` draws of ``N_Z(0, σ1²)``.

    The student enters it into the secure computation (``EvaluatorSession.run_batch(z1_student=...)``) and
    must neither log nor keep it: it is secret noise like the guardian's.

    Args:
        noise: the student's source (a CSPRNG-backed one in production).
        batch: number of queries ``B`` in the batch.
        sigma1: the same σ1 as the guardian's part.

    Raises:
        InputError: on a non-positive size or σ.
    """
    b = _count("batch", batch, 1)
    return np.asarray(noise.discrete_gaussian(sigma=_sigma("sigma1", sigma1), shape=(b,)), dtype=np.int64)

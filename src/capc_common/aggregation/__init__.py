"""Plaintext aggregation: vote histograms and the canonical order in which the parties draw their noise.

Build histograms with :func:`vote_histogram` (never pass label arrays to a mechanism). Confident-GNMax's
threshold noise is split between the guardian and the student: :func:`draw_confident_noise` (the guardian's
z1_g, z2) and :func:`draw_student_noise` (the student's z1_s) fix the canonical draw order,
:func:`party_noise` and :func:`mechanism_noise` each party's source (CSPRNG, or a seeded stream for tests).
The selection rules that turn histograms and noise into labels are the mechanisms'
(:mod:`capc_common.mechanisms.pate`: :func:`~capc_common.mechanisms.confident_rule`, the mechanism objects'
``answer``).
"""

from capc_common.aggregation.histogram import check_histograms, sum_histograms, vote_histogram
from capc_common.aggregation.noise import (
    MechanismNoise,
    draw_confident_noise,
    draw_student_noise,
    mechanism_noise,
    party_noise,
    sampling_noise,
)

__all__ = [
    "MechanismNoise",
    "check_histograms",
    "draw_confident_noise",
    "draw_student_noise",
    "mechanism_noise",
    "party_noise",
    "sampling_noise",
    "sum_histograms",
    "vote_histogram",
]

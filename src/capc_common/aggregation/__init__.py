"""Plaintext aggregation: vote histograms and the PATE noisy-argmax mechanisms on them.

Front door for the central research mode and the reference the federation's secure protocol must match:
build histograms with :func:`vote_histogram` (never pass label arrays to a mechanism), then answer with
:func:`confident_gnmax`, :func:`gnmax` or :func:`lnmax`. Confident-GNMax's threshold noise is split between
the guardian and the student: :func:`draw_confident_noise` (the guardian's z1_g, z2) and
:func:`draw_student_noise` (the student's z1_s) fix the canonical draw order, :func:`party_noise` and
:func:`mechanism_noise` each party's source (CSPRNG, or a seeded stream for tests), and :func:`confident_rule`
the exact output rule given the noise.
"""

from capc_common.aggregation.histogram import check_histograms, sum_histograms, vote_histogram
from capc_common.aggregation.mechanisms import (
    UNANSWERED,
    confident_gnmax,
    confident_rule,
    gnmax,
    lnmax,
    noisy_argmax,
)
from capc_common.aggregation.noise import (
    MechanismNoise,
    draw_confident_noise,
    draw_student_noise,
    mechanism_noise,
    party_noise,
    sampling_noise,
)

__all__ = [
    "UNANSWERED",
    "MechanismNoise",
    "check_histograms",
    "confident_gnmax",
    "confident_rule",
    "draw_confident_noise",
    "draw_student_noise",
    "gnmax",
    "lnmax",
    "mechanism_noise",
    "noisy_argmax",
    "party_noise",
    "sampling_noise",
    "sum_histograms",
    "vote_histogram",
]

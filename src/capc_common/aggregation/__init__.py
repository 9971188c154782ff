"""Plaintext aggregation: vote histograms and the PATE noisy-argmax mechanisms on them.

Front door for the central research mode and the reference the federation's secure protocol must match:
build histograms with :func:`vote_histogram` (never pass label arrays to a mechanism), then answer with
:func:`confident_gnmax`, :func:`gnmax` or :func:`lnmax`. :func:`draw_confident_noise` fixes the canonical
noise-draw order and :func:`confident_rule` the exact output rule given the noise.
"""

from capc_common.aggregation.histogram import check_histograms, sum_histograms, vote_histogram
from capc_common.aggregation.mechanisms import (
    UNANSWERED,
    confident_gnmax,
    confident_rule,
    draw_confident_noise,
    gnmax,
    lnmax,
    noisy_argmax,
)

__all__ = [
    "UNANSWERED",
    "check_histograms",
    "confident_gnmax",
    "confident_rule",
    "draw_confident_noise",
    "gnmax",
    "lnmax",
    "noisy_argmax",
    "sum_histograms",
    "vote_histogram",
]

"""The table sampler is 2^-90-close to the exact discrete Gaussian, not equal to it: that distance is added
to δ (issue 10, item 10), per draw."""

from __future__ import annotations

import math

import pytest

from capc_common.errors import InputError
from capc_common.privacy.analysis import delta_with_sampler_distance


def test_the_distance_argument() -> None:
    # P(S) ≤ P*(S) + Nη ≤ e^ε P*'(S) + δ + Nη ≤ e^ε P'(S) + δ + (1 + e^ε)·N·η
    assert delta_with_sampler_distance(epsilon=1.0, draws=10, distance=1e-12) == pytest.approx(
        (1 + math.e) * 10 * 1e-12, rel=1e-15
    )
    assert delta_with_sampler_distance(epsilon=800.0, draws=1, distance=2.0**-90) == math.inf
    with pytest.raises(InputError):
        delta_with_sampler_distance(epsilon=1.0, draws=-1, distance=1e-30)

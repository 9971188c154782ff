"""End to end: garbler thread against evaluator, every label compared with the plaintext definition."""

from __future__ import annotations

import numpy as np
from mpc_harness import make_inputs

from capc_common.mpc import MpcConfig, reference_noisy_argmax


def test_confident_gnmax_matches_plaintext(pair_factory) -> None:
    config = MpcConfig(10, 12, teachers=250)
    rng = np.random.default_rng(0)
    votes = rng.integers(0, 60, (300, 10))
    inputs = make_inputs(config, votes, rng.integers(-200, 200, (300, 10)), rng.integers(-300, 300, 300), 40)
    result = pair_factory(config).run_ok(inputs)
    expected = reference_noisy_argmax(votes, z2=inputs.z2, z1=inputs.z1, threshold=40)
    np.testing.assert_array_equal(result.labels, expected)
    np.testing.assert_array_equal(result.pass_bits, expected >= 0)

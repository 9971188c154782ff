"""Exact integer DP noise: discrete Gaussian and discrete Laplace, from a CSPRNG or a seeded test stream.

Front door: :class:`NoiseSource` (``discrete_gaussian``, ``discrete_laplace``, ``uniform_words``) and its two
implementations :class:`SystemNoise` (production) and :class:`SeededNoise` (tests only). The fast table
samplers live in :mod:`.tables`; the exact reference rejection samplers in :mod:`.exact`.
"""

from capc_common.privacy.noise.exact import (
    bernoulli_exp_neg,
    discrete_gaussian_exact,
    discrete_laplace_exact,
    exponential_mechanism_exact,
)
from capc_common.privacy.noise.source import InsecureNoiseWarning, NoiseSource, SeededNoise, SystemNoise
from capc_common.privacy.noise.tables import SamplerTable, discrete_gaussian_table, discrete_laplace_table

__all__ = [
    "InsecureNoiseWarning",
    "NoiseSource",
    "SamplerTable",
    "SeededNoise",
    "SystemNoise",
    "bernoulli_exp_neg",
    "discrete_gaussian_exact",
    "discrete_gaussian_table",
    "discrete_laplace_exact",
    "discrete_laplace_table",
    "exponential_mechanism_exact",
]

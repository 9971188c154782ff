"""Differential privacy for DIET-CaPC: exact integer noise, RDP accounting and the durable budget ledger.

Front door:

* noise — :class:`NoiseSource`, :class:`SystemNoise` (CSPRNG, production), :class:`SeededNoise` (tests only).
"""

from capc_common.privacy.noise import InsecureNoiseWarning, NoiseSource, SeededNoise, SystemNoise

__all__ = ["InsecureNoiseWarning", "NoiseSource", "SeededNoise", "SystemNoise"]

"""The ``--force`` reason of the federations the benchmarks start to measure the protocol, not to join one.

``capc local up`` and the guardian refuse, as a judgement, a federation the plan forecasts below the median
party alone (:func:`capc_common.federation.refusals.below_alone`, fitted to the shipped joining table). A
benchmark of start-up, throughput, memory, a WAN or crashes measures the same federation whatever the next
table forecasts for it, so it states why it runs anyway, as an operator would (the guardian logs it).
"""

from __future__ import annotations


def benchmark_force(what: str) -> str:
    """The reason a benchmark of ``what`` gives to run a federation whatever its forecast."""
    return f"a benchmark of {what}, not a federation worth joining"

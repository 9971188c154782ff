"""The ``--force`` reason of the federations the tests start to exercise the protocol, not to join one.

``capc local up`` and the guardian refuse, as a judgement, a federation the plan forecasts below the median
party alone (:func:`capc_common.federation.refusals.below_alone`, fitted to the shipped joining table). The
tests' federations are small on purpose — a few hundred or thousand images per party, so that they run in
seconds — which is what that judgement refuses; a test of the protocol's mechanics states why it runs anyway,
as an operator would, so that it keeps testing the same thing whatever the next table forecasts. The tests
of the refusals themselves (tests/services/test_refuse_before_spending.py) do not use it.
"""

from __future__ import annotations


def protocol_force(what: str) -> str:
    """The reason a test of the protocol's ``what`` gives to run a federation whatever its forecast."""
    return f"a test of the protocol's {what}, not a federation worth joining"

"""What the gRPC fuzz modules share: the statuses that mean a crash, the Hypothesis budget, boundary values,
and running a call to the status it ended with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

CRASH = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
UINT32 = st.sampled_from([0, 1, 15, 16, 17, 31, 32, 33, 2**31 - 1, 2**32 - 1])
UINT64 = st.sampled_from([0, 1, 2**32, 2**63 - 1, 2**64 - 1])
IDS = st.one_of(
    st.sampled_from(["", "open", "b", "x" * 128, "x" * 129, "\x00", "é" * 100]), st.text(max_size=300)
)
PARTIES = st.lists(
    st.sampled_from(["hospital-a", "hospital-b", "student", "guardian", "", "nobody"]), max_size=4
)
DIMENSIONS = st.sampled_from([-1, 0, 1, 10, 16, 2**31, 2**32, 2**40, 2**63 - 1, -(2**63)])
"""Array dimensions at the edges: negative, empty, and ones whose product overflows 64 bits."""


def status(call: Callable[[], Any]) -> grpc.StatusCode:
    """Run a call; the status it ended with (OK when it returned)."""
    try:
        result = call()
        if isinstance(result, Iterator):
            for _ in result:
                pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def assert_precise(code: grpc.StatusCode, what: object) -> None:
    """A deliberate status: never what an unhandled exception (INTERNAL, UNKNOWN) or a hang gives."""
    assert code not in CRASH, f"{what!r} ended with {code}"

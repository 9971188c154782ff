"""One mapping between library errors and gRPC status codes, used by every servicer and client."""

from __future__ import annotations

import grpc

from capc_common.errors import (
    BudgetExhaustedError,
    CapcError,
    InputError,
    IntegrityError,
    ProtocolError,
    UnavailableError,
)

_TO_STATUS: tuple[tuple[type[CapcError], grpc.StatusCode], ...] = (
    (BudgetExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (IntegrityError, grpc.StatusCode.DATA_LOSS),
    (ProtocolError, grpc.StatusCode.ABORTED),
)
_FROM_STATUS: dict[grpc.StatusCode, type[CapcError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: BudgetExhaustedError,
    grpc.StatusCode.INVALID_ARGUMENT: InputError,
    grpc.StatusCode.FAILED_PRECONDITION: InputError,
    grpc.StatusCode.ALREADY_EXISTS: InputError,
    grpc.StatusCode.OUT_OF_RANGE: InputError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
    grpc.StatusCode.DATA_LOSS: IntegrityError,
    grpc.StatusCode.ABORTED: ProtocolError,
    grpc.StatusCode.PERMISSION_DENIED: ProtocolError,
    grpc.StatusCode.UNAUTHENTICATED: ProtocolError,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a servicer answers ``exc`` with (INTERNAL for anything that is not a CapcError)."""
    for cls, code in _TO_STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_from_rpc(exc: grpc.RpcError, *, peer: str) -> CapcError:
    """Turn a failed call into the library error of the same kind, keeping the peer's own message.

    Args:
        exc: the error a stub raised (it is also a ``grpc.Call``).
        peer: the party that was called, named in the message.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _FROM_STATUS.get(code, CapcError)
    if code == grpc.StatusCode.UNAVAILABLE and not details:
        details = "connection failed"
    return cls(f"{peer}: {details} [{code.name}]")

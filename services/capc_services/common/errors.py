"""One mapping between library errors and gRPC status codes, used by every servicer and client.

gRPC has one code for "a resource is exhausted": a privacy budget spent, and a full disk (its documentation
names "the entire file system is out of space"). The caller must tell them apart — a spent budget ends the
run, a full volume is waited out — so a :class:`~capc_common.errors.StorageError` travels as
RESOURCE_EXHAUSTED with the trailing metadata ``capc-error: storage``.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from capc_common.errors import (
    BudgetExhaustedError,
    CapcError,
    InputError,
    IntegrityError,
    PreconditionError,
    ProtocolError,
    StorageError,
    UnavailableError,
)

KIND_KEY = "capc-error"
"""Trailing-metadata key naming the library error class where the status code alone does not."""
_KINDS: dict[str, type[CapcError]] = {"storage": StorageError}
MISSING_SEEDS_KEY = "capc-missing-seeds"
"""Trailing-metadata key of a release refused for seeds that never reached the guardian: the parties, comma
separated (party names hold no comma), whom the student leaves out when it asks again."""

_TO_STATUS: tuple[tuple[type[CapcError], grpc.StatusCode], ...] = (
    (BudgetExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StorageError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),  # before InputError, its base class
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (IntegrityError, grpc.StatusCode.DATA_LOSS),
    (ProtocolError, grpc.StatusCode.ABORTED),
)
_FROM_STATUS: dict[grpc.StatusCode, type[CapcError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: BudgetExhaustedError,
    grpc.StatusCode.INVALID_ARGUMENT: InputError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionError,
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


def abort(
    context: grpc.ServicerContext,
    exc: BaseException,
    *,
    code: grpc.StatusCode | None = None,
    metadata: Sequence[tuple[str, str]] = (),
) -> None:
    """End the call with ``exc``: its status (``code``, else :func:`status_for`), its message, and the
    trailing metadata that names its class where the code alone does not (:data:`KIND_KEY`), with
    ``metadata`` a caller acts on (read with :func:`trailing`)."""
    kind = next((name for name, cls in _KINDS.items() if isinstance(exc, cls)), None)
    sent = (*(((KIND_KEY, kind),) if kind is not None else ()), *metadata)
    if sent:
        context.set_trailing_metadata(sent)
    context.abort(code or status_for(exc), str(exc))


def trailing(exc: grpc.RpcError, key: str) -> str | None:
    """The value a failed call's trailing metadata holds under ``key``, or None."""
    sent = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return next((str(v) for k, v in sent or () if k == key), None)


def error_from_rpc(exc: grpc.RpcError, *, peer: str) -> CapcError:
    """Turn a failed call into the library error of the same kind, keeping the peer's own message.

    Args:
        exc: the error a stub raised (it is also a ``grpc.Call``).
        peer: the party that was called, named in the message.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _KINDS.get(trailing(exc, KIND_KEY) or "") or _FROM_STATUS.get(code, CapcError)
    if code == grpc.StatusCode.UNAVAILABLE and not details:
        details = "connection failed"
    return cls(f"{peer}: {details} [{code.name}]")

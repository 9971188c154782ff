"""Error types shared by every part of the library.

Each class maps to one process exit code in the CLI and one gRPC status in the services, so a caller can
tell *what kind* of failure happened without parsing messages. Messages themselves say what happened, the
(non-secret) values involved and how to fix it.
"""

from __future__ import annotations


class CapcError(Exception):
    """Base class of every error the library raises on purpose."""

    exit_code: int = 1


class InputError(CapcError, ValueError):
    """The caller supplied something unusable: a bad shape, an unknown name, a missing or corrupt file."""

    exit_code = 2


class PreconditionError(InputError):
    """The request is well formed, but the federation's own parameters forbid it: e.g. a federation that
    would spend privacy for nothing is refused before its first charge (gRPC ``FAILED_PRECONDITION``)."""


class BudgetExhaustedError(CapcError):
    """A privacy charge would cross the budget; nothing was charged."""

    exit_code = 3


class UnavailableError(CapcError):
    """A peer, service or resource needed to proceed cannot be reached."""

    exit_code = 4


class IntegrityError(CapcError):
    """Stored state failed verification (hash chain, checksum, conflicting replay)."""

    exit_code = 5


class ProtocolError(CapcError):
    """A protocol peer sent something malformed, truncated or out of order."""

    exit_code = 6


class StorageError(CapcError):
    """A volume this party writes to is full, read-only or failing; nothing was written.

    Not data loss: what was committed before is intact (``capc budget verify`` says so for a ledger), and the
    work resumes once the volume can be written again. The message names the volume and the space needed.
    """

    exit_code = 7

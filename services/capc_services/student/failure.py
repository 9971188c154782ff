"""How a student's work failed: the reason its progress reports, the exit code a one-shot job ends with."""

from __future__ import annotations

from dataclasses import dataclass

from capc_common.errors import CapcError, InputError

__all__ = ["Failure", "failure_of"]


@dataclass(frozen=True)
class Failure:
    """Why the student's work thread ended in state ``failed``.

    Attributes:
        reason: what went wrong (a CapcError's own message says what to fix; anything else is named by type).
        exit_code: the CLI's code for it (README's table), so a job runner can tell a bad file from a bug.
    """

    reason: str
    exit_code: int


def failure_of(exc: BaseException) -> Failure:
    """The failure an exception stands for: a CapcError keeps its exit code; an OSError (a full disk, an
    output directory that cannot be made) is the host's files, code 2 as for any bad file; anything else is a
    bug, code 1."""
    if isinstance(exc, CapcError):
        return Failure(str(exc), exc.exit_code)
    code = InputError.exit_code if isinstance(exc, OSError) else CapcError.exit_code
    return Failure(f"{type(exc).__name__}: {exc}", code)

"""Misuse errors of the hazmat layer."""

from __future__ import annotations

from capc_common.errors import CapcError


class AlreadyFinalized(CapcError):
    """A single-use cryptographic object (a base-OT run) was used a second time: a bug in the caller."""

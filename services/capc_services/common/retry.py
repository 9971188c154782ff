"""Waiting out a fault: capped exponential backoff with jitter, the one rule of a party's retry loops.

A party that waits for a peer or a volume to come back tries again after a wait that doubles up to a cap and
is drawn at random in its upper half, so parties that lost the same peer at the same moment do not come back
in lockstep. The jitter is not secret (it only spreads retries in time).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

__all__ = ["Backoff"]
_JITTER_STEPS = 1000


@dataclass
class Backoff:
    """Waits of at most ``cap`` seconds, the first at most ``first``, each drawn in ``[w/2, w]``.

    Args:
        first: the first wait's upper bound in seconds (again after :meth:`reset`).
        cap: the longest wait in seconds.
    """

    first: float
    cap: float
    _bound: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff needs 0 < first ≤ cap, got first={self.first}, cap={self.cap}")
        self._bound = self.first

    def next(self) -> float:
        """The next wait in seconds (and double the bound of the one after, up to ``cap``)."""
        bound = self._bound
        self._bound = min(2 * bound, self.cap)
        return bound * (0.5 + secrets.randbelow(_JITTER_STEPS + 1) / (2 * _JITTER_STEPS))

    def reset(self) -> None:
        """The fault is over: the next outage starts from ``first`` again."""
        self._bound = self.first

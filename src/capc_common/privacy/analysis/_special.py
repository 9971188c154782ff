"""The special functions the analysis needs, with ``scipy.special`` imported on first use.

Why not ``from scipy import special`` at the top of each module: that import costs about 0.15 s (its
array-API shims pull in ``numpy.f2py`` and ``numpy.testing``), a seventh of the guardian's start-up, and a
guardian needs no accounting before its first release (issue 27: ready in 1 s). Importing inside each
function is a cached import after the first call (about 0.35 µs, under 1 % of any caller's array work) and
is thread-safe under the import lock, which ``importlib.util.LazyLoader`` is not on Python 3.11.
"""

from __future__ import annotations

from typing import Any


def logsumexp(a: Any, **kwargs: Any) -> Any:
    """:func:`scipy.special.logsumexp` (same arguments)."""
    from scipy import special

    return special.logsumexp(a, **kwargs)


def log_ndtr(x: Any) -> Any:
    """:func:`scipy.special.log_ndtr`: ``log Φ(x)``, accurate far into both tails."""
    from scipy import special

    return special.log_ndtr(x)


def gammaln(x: Any) -> Any:
    """:func:`scipy.special.gammaln`: ``log |Γ(x)|``."""
    from scipy import special

    return special.gammaln(x)

"""Where DP noise comes from: a uniform 64-bit word stream and the samplers built on it.

:class:`NoiseSource` is the interface every mechanism draws through. Its only primitive is
:meth:`NoiseSource.uniform_words`; the discrete Gaussian and discrete Laplace samplers turn those words into
noise with exact inverse-CDF tables (:mod:`.tables`), and the exact rejection samplers of :mod:`.exact` read
the same words. Two sources exist:

* :class:`SystemNoise` — the production source: AES-256-CTR keyed from ``os.urandom`` (rekeyed after a
  ``fork`` so a child process never replays its parent's noise, and every 2^32 blocks).
* :class:`SeededNoise` — a deterministic AES-256-CTR stream keyed by ``SHA-256(seed)``. The same seed and the
  same sequence of calls give identical draws, which is what lets a federation's guardian reproduce a
  central run's noise in a differential test. It provides **no privacy** and warns once per process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
import weakref
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from capc_common.errors import InputError
from capc_common.privacy.noise.tables import discrete_gaussian_table, discrete_laplace_table

__all__ = ["InsecureNoiseWarning", "NoiseSource", "SeededNoise", "SystemNoise"]

_log = logging.getLogger(__name__)
_REKEY_BYTES = 16 << 32  # 2^32 AES blocks


class InsecureNoiseWarning(UserWarning):
    """A seeded (reproducible, hence non-private) noise source was created."""


def _check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError as exc:
        raise InputError(f"shape must be a tuple of non-negative integers, got {shape!r}") from exc
    if any(d < 0 for d in dims):
        raise InputError(f"shape must be a tuple of non-negative integers, got {shape!r}")
    return dims


class NoiseSource(ABC):
    """A source of uniform 64-bit words and the exact integer noise drawn from them.

    Subclasses implement :meth:`uniform_words` only. Every sampler consumes words in a fixed order, so two
    sources that produce the same words produce the same noise for the same sequence of calls.
    """

    #: Whether the words are unpredictable to everyone (a CSPRNG with a secret key).
    secure: ClassVar[bool]

    @abstractmethod
    def uniform_words(self, n: int) -> npt.NDArray[np.uint64]:
        """Return the next ``n`` independent uniform 64-bit words of the stream.

        Args:
            n: how many words (≥ 0).

        Returns:
            uint64 array of length ``n``.
        """

    def discrete_gaussian(self, *, sigma: float, shape: tuple[int, ...]) -> npt.NDArray[np.int64]:
        """Draw exact discrete Gaussian noise ``N_Z(0, σ²)``: ``Pr[x] ∝ exp(-x²/(2σ²))`` on the integers.

        Statistical distance to the exact distribution is below 2^-90 (see :mod:`.tables`). Its RDP is that
        of the continuous Gaussian (Canonne, Kamath & Steinke 2020), which is why the accountant can charge
        ``λΔ²/(2σ²)`` for it.

        Args:
            sigma: the scale parameter σ (the variance is slightly below σ²).
            shape: output shape.

        Returns:
            int64 array of ``shape``.

        Raises:
            InputError: σ is not a finite number in ``(0, 3e5]`` (``MAX_SIGMA``) or the shape is invalid.
        """
        dims = _check_shape(shape)
        return discrete_gaussian_table(sigma=sigma).sample(self, dims)

    def discrete_laplace(self, *, scale: float, shape: tuple[int, ...]) -> npt.NDArray[np.int64]:
        """Draw discrete Laplace noise ``Pr[x] ∝ exp(-|x|/b)``, ``b = scale`` (``Δ/b``-DP for sensitivity Δ).

        Args:
            scale: ``b > 0``.
            shape: output shape.

        Returns:
            int64 array of ``shape``.

        Raises:
            InputError: ``scale`` is not a finite number in ``(0, 1e4]`` or the shape is invalid.
        """
        dims = _check_shape(shape)
        return discrete_laplace_table(scale=scale).sample(self, dims)


class _AesCtrStream:
    """The AES-256-CTR keystream, read as little-endian 64-bit words; not thread-safe on its own."""

    def __init__(self, key: bytes) -> None:
        self._ctx: CipherContext = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self.consumed = 0

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        raw = self._ctx.update(bytes(8 * n))
        self.consumed += 8 * n
        return np.frombuffer(raw, dtype="<u8").astype(np.uint64, copy=False)


def _check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise InputError(f"the number of words must be a non-negative integer, got {n!r}")
    return int(n)


class SystemNoise(NoiseSource):
    """The production noise source: AES-256-CTR under a fresh key from ``os.urandom``.

    The key is replaced after every 2^32 blocks and in every forked child — by an ``os.register_at_fork``
    hook, which also gives the child a fresh lock (another thread of the parent may have held it at the
    fork), and again whenever the process id changes — so a child never repeats its parent's stream.
    Thread-safe.
    """

    secure: ClassVar[bool] = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rekey()
        _live_sources.add(self)

    def _rekey(self) -> None:
        self._pid = os.getpid()
        self._stream = _AesCtrStream(os.urandom(32))

    def uniform_words(self, n: int) -> npt.NDArray[np.uint64]:
        """Return ``n`` fresh uniform words from the CSPRNG."""
        count = _check_count(n)
        with self._lock:
            if os.getpid() != self._pid or self._stream.consumed + 8 * count > _REKEY_BYTES:
                self._rekey()
            return self._stream.words(count)


_live_sources: weakref.WeakSet[SystemNoise] = weakref.WeakSet()


def _rekey_after_fork() -> None:
    """In a forked child: a fresh lock and key for every live :class:`SystemNoise` of the parent."""
    for source in list(_live_sources):
        source._lock = threading.Lock()
        source._rekey()


os.register_at_fork(after_in_child=_rekey_after_fork)

_warned = False
_warn_lock = threading.Lock()


class SeededNoise(NoiseSource):
    """A deterministic, reproducible noise stream: AES-256-CTR keyed by ``SHA-256(seed)``. NOT private.

    Only for tests and for the differential test that checks a federation reproduces a central run
    exactly. Anyone who knows the seed knows every noise value, so labels released with it carry no
    differential-privacy guarantee; :attr:`secure` is ``False`` so a secure mode can refuse it.

    Args:
        seed: any bytes (a ``str`` is UTF-8 encoded); the same seed gives the same stream.

    Raises:
        InputError: the seed is neither bytes nor str.
    """

    secure: ClassVar[bool] = False

    def __init__(self, seed: bytes | str) -> None:
        if isinstance(seed, str):
            seed = seed.encode("utf-8")
        if not isinstance(seed, bytes | bytearray):
            raise InputError(f"SeededNoise needs a bytes (or str) seed, got {type(seed).__name__}")
        _warn_once()
        self._lock = threading.Lock()
        self._stream = _AesCtrStream(hashlib.sha256(bytes(seed)).digest())

    def uniform_words(self, n: int) -> npt.NDArray[np.uint64]:
        """Return the next ``n`` words of the seeded stream."""
        count = _check_count(n)
        with self._lock:
            return self._stream.words(count)


def _warn_once() -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    message = (
        "SeededNoise: DP noise comes from a seeded, reproducible stream; anyone with the seed can remove it, "
        "so nothing released with it is differentially private. This is fine for tests and for comparing a "
        "federation with the central reference, but use SystemNoise for any real run."
    )
    _log.warning(message)
    warnings.warn(message, InsecureNoiseWarning, stacklevel=3)

"""Fixed-key AES permutation π and AES-CTR streams over numpy label arrays.

Labels are 128-bit blocks held as ``uint64`` arrays of shape ``(n, 2)`` (little-endian words, so bit 0 of
word 0 is the label's least significant bit, the point-and-permute bit). Every pseudorandom byte and every
hash in ``capc_common.mpc`` comes from this module: AES-128 from ``cryptography`` (OpenSSL, AES-NI), never a
custom cipher.
"""

from __future__ import annotations

import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from capc_common.errors import InputError

BLOCK_BYTES = 16
KEY_BYTES = 16


_UINT64 = np.dtype(np.uint64)


def as_bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of an array (copied first only if not C-contiguous), for buffer-protocol consumers.

    ``memoryview.cast`` is several times cheaper than ``ndarray.view(np.uint8)``, which matters when it runs
    a few times per circuit layer.
    """
    return np.ascontiguousarray(array).data.cast("B")


def _check_key(key: bytes, what: str) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        got = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise InputError(
            f"{what} must be {KEY_BYTES} bytes, got {got}; draw it with os.urandom({KEY_BYTES})."
        )
    return bytes(key)


class FixedKeyAes:
    """The public random permutation π(x) = AES_k(x) with a key both parties know.

    Garbling hashes with π under a fixed key (Bellare et al. 2013; Guo–Katz–Wang–Yu 2020) so that one
    ECB call hashes a whole circuit layer: no key schedule per gate. The key is not secret; it is drawn per
    session by the garbler and sent to the evaluator so no two sessions share a permutation.

    Args:
        key: 16 bytes.
    """

    __slots__ = ("_encryptor", "_key", "_scratch")

    def __init__(self, key: bytes) -> None:
        self._key = _check_key(key, "the fixed AES key")
        self._encryptor = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
        self._scratch = np.empty((0, 2), dtype=np.uint64)

    @property
    def key(self) -> bytes:
        """The 16-byte public key of the permutation."""
        return self._key

    def permute(self, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Return π(blocks) for a ``(n, 2)`` uint64 array.

        Args:
            blocks: ``(n, 2)`` uint64 blocks (any layout; copied if not C-contiguous).
            out: optional preallocated ``(n + 1, 2)`` uint64 buffer (OpenSSL may write one spare block);
                rows ``[:n]`` receive the result. Without it an internal buffer is allocated.

        Returns:
            ``(n, 2)`` uint64 view of ``out`` (or of a fresh buffer).
        """
        n = blocks.shape[0]
        if out is None:
            out = np.empty((n + 1, 2), dtype=np.uint64)
        elif out.shape[0] < n + 1 or out.dtype != _UINT64 or not out.flags.c_contiguous:
            raise InputError(
                f"AES output buffer must be C-contiguous uint64 with ≥ {n + 1} rows, got {out.shape}."
            )
        if n:
            self._encryptor.update_into(as_bytes(blocks), as_bytes(out))
        return out[:n]


class AesCtrStream:
    """An endless AES-128-CTR keystream (nonce 0) that never rewinds.

    Used as the PRG everywhere a seed is stretched: the share expansion R_p = AES-CTR(k_p), the IKNP
    column generators G(k_j) and the garbler's label source. Reading advances the stream, so two reads never
    return the same bytes; that is what makes labels fresh per batch.

    Args:
        key: 16-byte secret seed.
    """

    __slots__ = ("_buffer", "_encryptor", "_zeros")

    def __init__(self, key: bytes) -> None:
        key = _check_key(key, "an AES-CTR seed")
        cipher = Cipher(algorithms.AES(key), modes.CTR(bytes(BLOCK_BYTES)))
        self._encryptor = cipher.encryptor()
        self._zeros = np.zeros(0, dtype=np.uint8)
        self._buffer = np.zeros(0, dtype=np.uint8)

    def read_into(self, out: np.ndarray) -> None:
        """Fill a C-contiguous array with the next ``out.nbytes`` keystream bytes."""
        if not out.flags.c_contiguous:
            raise InputError("AES-CTR output array must be C-contiguous.")
        nbytes = out.nbytes
        if nbytes == 0:
            return
        if self._zeros.size < nbytes:
            self._zeros = np.zeros(nbytes, dtype=np.uint8)
            self._buffer = np.empty(nbytes + BLOCK_BYTES, dtype=np.uint8)
        written = self._encryptor.update_into(self._zeros[:nbytes].data, self._buffer.data)
        if written != nbytes:  # CTR is a stream mode: OpenSSL returns every byte at once.
            raise RuntimeError(f"AES-CTR returned {written} of {nbytes} bytes")
        as_bytes(out)[:] = self._buffer[:nbytes].data

    def read(self, nbytes: int) -> np.ndarray:
        """Return the next ``nbytes`` keystream bytes as a uint8 array."""
        out = np.empty(nbytes, dtype=np.uint8)
        self.read_into(out)
        return out

    def blocks(self, n: int) -> np.ndarray:
        """Return the next ``n`` 128-bit blocks as a ``(n, 2)`` uint64 array."""
        out = np.empty((n + 1, 2), dtype=np.uint64)  # OpenSSL wants a spare block of output room
        if self._zeros.size < 16 * n:
            self._zeros = np.zeros(16 * n, dtype=np.uint8)
            self._buffer = np.empty(16 * n + BLOCK_BYTES, dtype=np.uint8)
        if n:
            self._encryptor.update_into(self._zeros[: 16 * n].data, as_bytes(out))
        return out[:n]


def aes_blocks_per_second(*, blocks: int = 1 << 18, min_seconds: float = 0.3) -> float:
    """Measure this machine's fixed-key AES-ECB throughput in 16-byte blocks per second.

    The garbler hashes 8 blocks and the evaluator 4 per AND gate, so this bounds what any garbling
    implementation could reach here; ``capc bench mpc`` reports it next to the AND-gate rate.

    Args:
        blocks: blocks per ECB call (one "circuit layer").
        min_seconds: keep calling until this much time has passed.

    Returns:
        Blocks per second.
    """
    import os

    pi = FixedKeyAes(os.urandom(KEY_BYTES))
    data = np.frombuffer(os.urandom(blocks * BLOCK_BYTES), dtype=np.uint64).reshape(blocks, 2)
    out = np.empty((blocks + 1, 2), dtype=np.uint64)
    pi.permute(data, out)
    calls, start = 0, time.perf_counter()
    while True:
        pi.permute(data, out)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return calls * blocks / elapsed

"""numpy ⇄ protobuf conversion: ``x_to_proto`` / ``x_from_proto`` pairs of pure functions.

Decoding is a trust boundary (bytes come from another organisation), so every ``*_from_proto`` checks
what it reads and raises :class:`~capc_common.errors.ProtocolError` naming the field and values.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from capc_common.errors import ProtocolError
from capc_common.wire.capc.v1.common_pb2 import NdArray as ProtoNdArray

# Arrays on the wire are shares (unsigned integers), vote counts, labels and uint8 images.
_DTYPES = frozenset({"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32"})


def ndarray_to_proto(array: np.ndarray) -> ProtoNdArray:
    """Encode a numpy array (any of the wire dtypes) as little-endian C-order bytes.

    Raises:
        ProtocolError: the dtype is not one the wire carries.
    """
    name = array.dtype.name
    if name not in _DTYPES:
        raise ProtocolError(f"dtype {name} cannot travel on the wire; use one of {sorted(_DTYPES)}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return ProtoNdArray(dtype=name, shape=list(array.shape), data=data)


def ndarray_from_proto(message: ProtoNdArray) -> np.ndarray:
    """Decode an :func:`ndarray_to_proto` message into a fresh, writable native-endian array.

    Raises:
        ProtocolError: unknown dtype, negative dimension, or a byte count that does not match the shape.
    """
    if message.dtype not in _DTYPES:
        raise ProtocolError(f"peer sent an array of dtype {message.dtype!r}; allowed: {sorted(_DTYPES)}")
    shape = tuple(int(d) for d in message.shape)
    if any(d < 0 for d in shape):
        raise ProtocolError(f"peer sent an array with a negative dimension: shape {shape}")
    dtype = np.dtype(message.dtype).newbyteorder("<")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(message.data) != expected:
        raise ProtocolError(
            f"peer sent {len(message.data)} bytes for a {message.dtype} array of shape {shape} "
            f"(expected {expected})"
        )
    return np.frombuffer(message.data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


@dataclass(frozen=True, eq=False)
class RawQuery:
    """Query images shipped as pixels, uint8 (N, H, W, C); only sites that allow raw queries answer them."""

    images: np.ndarray
    bn_batch: int

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RawQuery)
            and self.bn_batch == other.bn_batch
            and self.images.dtype == other.images.dtype
            and np.array_equal(self.images, other.images)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def count(self) -> int:
        """Number of queries."""
        return int(self.images.shape[0])


def digest(message_bytes: bytes) -> bytes:
    """SHA-256 of a deterministically serialized message (how a batch id is bound to its query)."""
    return hashlib.sha256(message_bytes).digest()


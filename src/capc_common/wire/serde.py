"""numpy ⇄ protobuf conversion: ``x_to_proto`` / ``x_from_proto`` pairs of pure functions.

Decoding is a trust boundary (bytes come from another organisation), so every ``*_from_proto`` checks
what it reads and raises :class:`~capc_common.errors.ProtocolError` naming the field and values.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from capc_common.errors import InputError, ProtocolError
from capc_common.wire.capc.v1.common_pb2 import NdArray as ProtoNdArray
from capc_common.wire.capc.v1.common_pb2 import QuerySpec as ProtoQuerySpec
from capc_common.wire.capc.v1.common_pb2 import RawImages as ProtoRawImages
from capc_common.wire.capc.v1.common_pb2 import SyntheticSpec as ProtoSyntheticSpec
from capc_common.wire.capc.v1.guardian_pb2 import Coalition as ProtoCoalition
from capc_common.wire.capc.v1.guardian_pb2 import ReleaseLedger as ProtoReleaseLedger

if TYPE_CHECKING:
    from capc_common.synth import SyntheticSpec

# Arrays on the wire are shares (unsigned integers), vote counts, labels and uint8 images.
_DTYPES = frozenset({"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32"})
#: Dimensions accepted from a peer: numpy 1 holds 32 (numpy 2: 64) and the protocol needs at most 4, so a
#: deeper shape is refused before ``reshape`` could raise numpy's own ValueError.
_MAX_DIMS = 32


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
        ProtocolError: unknown dtype, negative dimension, a shape larger than any array, or a byte count that
            does not match the shape.
    """
    if message.dtype not in _DTYPES:
        raise ProtocolError(f"peer sent an array of dtype {message.dtype!r}; allowed: {sorted(_DTYPES)}")
    shape = tuple(int(d) for d in message.shape)
    if any(d < 0 for d in shape):
        raise ProtocolError(f"peer sent an array with a negative dimension: shape {shape}")
    if len(shape) > _MAX_DIMS:
        raise ProtocolError(
            f"peer sent an array of {len(shape)} dimensions; at most {_MAX_DIMS} are accepted"
        )
    dtype = np.dtype(message.dtype).newbyteorder("<")
    # Exact integers, not numpy's: a product of int64 dimensions can wrap around to 0 bytes. numpy refuses a
    # shape whose non-zero dimensions span more bytes than it can address even when another dimension is 0.
    if math.prod(d for d in shape if d) * dtype.itemsize > np.iinfo(np.intp).max:
        raise ProtocolError(
            f"peer sent a {message.dtype} array of shape {shape}: at least 2^63 bytes, larger than any array"
        )
    expected = math.prod(shape) * dtype.itemsize
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


def spec_to_proto(spec: SyntheticSpec) -> ProtoSyntheticSpec:
    """Encode a synthetic query spec (the batch is described, not shipped)."""
    return ProtoSyntheticSpec(
        generator=spec.generator,
        seed=spec.seed,
        first_index=spec.first_index,
        count=spec.count,
        height=spec.height,
        width=spec.width,
        channels=spec.channels,
        bn_batch=spec.bn_batch,
    )


def spec_from_proto(message: ProtoSyntheticSpec) -> SyntheticSpec:
    """Decode and validate a synthetic query spec.

    Raises:
        ProtocolError: the spec is invalid (unknown generator, bad sizes); the message says which field.
    """
    from capc_common.synth import SyntheticSpec  # generators load only where images are made

    try:
        return SyntheticSpec(
            generator=message.generator,
            seed=message.seed,
            first_index=message.first_index,
            count=message.count,
            height=message.height,
            width=message.width,
            channels=message.channels,
            bn_batch=message.bn_batch,
        )
    except InputError as exc:
        raise ProtocolError(f"peer sent an invalid synthetic spec: {exc}") from None


def query_to_proto(query: SyntheticSpec | RawQuery) -> ProtoQuerySpec:
    """Encode a query: a synthetic spec, or raw images."""
    if isinstance(query, RawQuery):
        return ProtoQuerySpec(
            raw=ProtoRawImages(images=ndarray_to_proto(query.images), bn_batch=query.bn_batch)
        )
    return ProtoQuerySpec(synthetic=spec_to_proto(query))


def query_from_proto(message: ProtoQuerySpec) -> SyntheticSpec | RawQuery:
    """Decode a query.

    Raises:
        ProtocolError: neither kind is set, or its content is invalid.
    """
    kind = message.WhichOneof("source")
    if kind == "synthetic":
        return spec_from_proto(message.synthetic)
    if kind == "raw":
        images = ndarray_from_proto(message.raw.images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] not in (1, 3):
            raise ProtocolError(
                f"raw query images must be uint8 (N, H, W, 1|3), got {images.dtype} {images.shape}"
            )
        if not 1 <= message.raw.bn_batch <= images.shape[0]:
            raise ProtocolError(f"raw query bn_batch {message.raw.bn_batch} is not in [1, {images.shape[0]}]")
        return RawQuery(images=images, bn_batch=message.raw.bn_batch)
    raise ProtocolError("peer sent a query with neither a synthetic spec nor raw images")


#: The figures of a release plan on the guardian's ledger (:func:`release_ledger_to_proto`), in wire order.
RELEASE_LEDGER_COUNTS = ("releases_planned", "releases", "entries")
RELEASE_LEDGER_FIGURES = (
    "rdp_per_release",
    "rdp_planned",
    "rdp_spent",
    "epsilon",
    "epsilon_spent",
    "epsilon_limit",
    "delta",
    "order",
)


def release_ledger_to_proto(figures: Mapping[str, Any]) -> ProtoReleaseLedger:
    """Encode a release plan's ledger figures: the counts, the RDP and ε figures, the chain ``head`` and the
    ``coalitions`` (``{"members", "epsilon" (None: unbounded), "note"}`` each)."""
    coalitions = [
        ProtoCoalition(members=list(c["members"]), epsilon=c["epsilon"], note=c["note"])
        if c["epsilon"] is not None
        else ProtoCoalition(members=list(c["members"]), note=c["note"])
        for c in figures["coalitions"]
    ]
    message = ProtoReleaseLedger(head=str(figures["head"]), coalitions=coalitions)
    for key in RELEASE_LEDGER_COUNTS:
        setattr(message, key, int(figures[key]))
    for key in RELEASE_LEDGER_FIGURES:
        setattr(message, key, float(figures[key]))
    return message


def release_ledger_from_proto(message: ProtoReleaseLedger) -> dict[str, Any]:
    """Decode and check a release plan's ledger figures (the inverse of :func:`release_ledger_to_proto`).

    Raises:
        ProtocolError: a figure that is negative or not finite, more releases than planned, or a
            coalition with no member.
    """
    figures: dict[str, Any] = {k: int(getattr(message, k)) for k in RELEASE_LEDGER_COUNTS}
    for key in RELEASE_LEDGER_FIGURES:
        value = float(getattr(message, key))
        if not (math.isfinite(value) and value >= 0):
            raise ProtocolError(f"the guardian sent {key} = {value!r}; a ledger figure is finite and >= 0")
        figures[key] = value
    if figures["releases"] > figures["releases_planned"]:
        raise ProtocolError(
            f"the guardian reports {figures['releases']} releases of a plan of {figures['releases_planned']}"
        )
    coalitions = []
    for c in message.coalitions:
        epsilon = float(c.epsilon) if c.HasField("epsilon") else None
        if not c.members or (epsilon is not None and not (math.isfinite(epsilon) and epsilon >= 0)):
            raise ProtocolError(f"the guardian sent a malformed coalition {list(c.members)} (ε {epsilon!r})")
        coalitions.append({"members": list(c.members), "epsilon": epsilon, "note": c.note})
    return {**figures, "head": message.head, "coalitions": coalitions}

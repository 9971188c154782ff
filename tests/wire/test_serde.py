"""Round trips and refusals of the numpy ⇄ protobuf conversions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from capc_common.errors import ProtocolError
from capc_common.wire import ndarray_from_proto, ndarray_to_proto
from capc_common.wire.messages import NdArray

_dtypes = st.sampled_from(["uint8", "uint16", "uint32", "uint64", "int32", "int64", "float32"])


@given(hnp.arrays(dtype=_dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
def test_ndarray_round_trip(array: np.ndarray) -> None:
    # Execute
    decoded = ndarray_from_proto(NdArray.FromString(ndarray_to_proto(array).SerializeToString()))
    # Assert
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)
    assert decoded.flags.writeable


def test_non_contiguous_and_big_endian_arrays_encode_as_little_endian() -> None:
    array = np.arange(12, dtype=">u4").reshape(3, 4)[:, ::2]
    message = ndarray_to_proto(array)
    assert message.data == np.ascontiguousarray(array, dtype="<u4").tobytes()
    np.testing.assert_array_equal(ndarray_from_proto(message), array)


def test_refuses_wrong_byte_count() -> None:
    message = ndarray_to_proto(np.zeros((2, 3), dtype=np.uint64))
    message.data = message.data[:-1]
    with pytest.raises(ProtocolError, match=r"47 bytes for a uint64 array of shape \(2, 3\) \(expected 48\)"):
        ndarray_from_proto(message)


@pytest.mark.parametrize("dtype", ["object", "complex128", ""])
def test_refuses_unknown_dtype(dtype: str) -> None:
    with pytest.raises(ProtocolError, match="dtype"):
        ndarray_from_proto(NdArray(dtype=dtype, shape=[1], data=b"\0" * 16))


def test_refuses_more_dimensions_than_an_array_holds() -> None:
    message = ndarray_to_proto(np.zeros(1, dtype=np.uint8))
    del message.shape[:]
    message.shape.extend([1] * 65)
    with pytest.raises(ProtocolError, match="65 dimensions"):
        ndarray_from_proto(message)


def test_refuses_negative_dimension() -> None:
    with pytest.raises(ProtocolError, match="negative dimension"):
        ndarray_from_proto(NdArray(dtype="uint8", shape=[-1], data=b""))


@pytest.mark.parametrize(
    "shape", [(2**32, 2**32), (2**62, 4), (2**40, 2**40, 2**40), (0, 2**63 - 1), (0, 2**60)]
)
def test_refuses_a_shape_larger_than_any_array(shape: tuple[int, ...]) -> None:
    # Each of these once passed the byte-count check with no bytes (the int64 product wrapped to 0, or the
    # size is 0) and numpy's ValueError escaped the decoder: a servicer answered UNKNOWN.
    message = ndarray_to_proto(np.zeros(0, dtype=np.int64))
    message.ClearField("shape")
    message.shape.extend(shape)
    with pytest.raises(ProtocolError, match=r"at least 2\^63 bytes"):
        ndarray_from_proto(message)


def test_refuses_to_encode_float64() -> None:
    with pytest.raises(ProtocolError, match="float64 cannot travel"):
        ndarray_to_proto(np.zeros(2))


def test_query_round_trips_synthetic_and_raw() -> None:
    from capc_common.synth import SyntheticSpec
    from capc_common.wire import RawQuery, query_from_proto, query_to_proto
    from capc_common.wire.messages import QuerySpec

    spec = SyntheticSpec(
        "dead_leaves", seed=2**63 + 5, first_index=7, count=32, height=28, width=28, channels=1, bn_batch=16
    )
    raw = RawQuery(images=np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3), bn_batch=2)
    for query in (spec, raw):
        wire_bytes = query_to_proto(query).SerializeToString()
        assert query_from_proto(QuerySpec.FromString(wire_bytes)) == query


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda q: setattr(q.synthetic, "generator", "nope"), "invalid synthetic spec"),
        (lambda q: setattr(q.synthetic, "count", 20), "invalid synthetic spec"),
        (lambda q: q.ClearField("synthetic"), "neither a synthetic spec nor raw images"),
    ],
)
def test_invalid_queries_are_protocol_errors(mutate, match: str) -> None:
    from capc_common.synth import SyntheticSpec
    from capc_common.wire import query_from_proto, query_to_proto

    message = query_to_proto(
        SyntheticSpec("gaussian", seed=1, first_index=0, count=16, height=8, width=8, channels=1, bn_batch=16)
    )
    mutate(message)
    with pytest.raises(ProtocolError, match=match):
        query_from_proto(message)


def test_raw_images_must_be_uint8_nhwc() -> None:
    from capc_common.wire import query_from_proto
    from capc_common.wire.messages import QuerySpec, RawImages

    message = QuerySpec(raw=RawImages(images=ndarray_to_proto(np.zeros((2, 4, 4), np.uint8)), bn_batch=2))
    with pytest.raises(ProtocolError, match=r"uint8 \(N, H, W, 1\|3\)"):
        query_from_proto(message)

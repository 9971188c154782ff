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


def test_refuses_negative_dimension() -> None:
    with pytest.raises(ProtocolError, match="negative dimension"):
        ndarray_from_proto(NdArray(dtype="uint8", shape=[-1], data=b""))


def test_refuses_to_encode_float64() -> None:
    with pytest.raises(ProtocolError, match="float64 cannot travel"):
        ndarray_to_proto(np.zeros(2))

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_STATE_UNSPECIFIED: _ClassVar[BatchState]
    BATCH_STATE_OPEN: _ClassVar[BatchState]
    BATCH_STATE_SETTLED: _ClassVar[BatchState]
    BATCH_STATE_RELEASED: _ClassVar[BatchState]
    BATCH_STATE_UNKNOWN: _ClassVar[BatchState]
    BATCH_STATE_CHARGED: _ClassVar[BatchState]
BATCH_STATE_UNSPECIFIED: BatchState
BATCH_STATE_OPEN: BatchState
BATCH_STATE_SETTLED: BatchState
BATCH_STATE_RELEASED: BatchState
BATCH_STATE_UNKNOWN: BatchState
BATCH_STATE_CHARGED: BatchState

class NdArray(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SyntheticSpec(_message.Message):
    __slots__ = ("generator", "seed", "first_index", "count", "height", "width", "channels", "bn_batch")
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    BN_BATCH_FIELD_NUMBER: _ClassVar[int]
    generator: str
    seed: int
    first_index: int
    count: int
    height: int
    width: int
    channels: int
    bn_batch: int
    def __init__(self, generator: _Optional[str] = ..., seed: _Optional[int] = ..., first_index: _Optional[int] = ..., count: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., channels: _Optional[int] = ..., bn_batch: _Optional[int] = ...) -> None: ...

class RawImages(_message.Message):
    __slots__ = ("images", "bn_batch")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    BN_BATCH_FIELD_NUMBER: _ClassVar[int]
    images: NdArray
    bn_batch: int
    def __init__(self, images: _Optional[_Union[NdArray, _Mapping]] = ..., bn_batch: _Optional[int] = ...) -> None: ...

class QuerySpec(_message.Message):
    __slots__ = ("synthetic", "raw")
    SYNTHETIC_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    synthetic: SyntheticSpec
    raw: RawImages
    def __init__(self, synthetic: _Optional[_Union[SyntheticSpec, _Mapping]] = ..., raw: _Optional[_Union[RawImages, _Mapping]] = ...) -> None: ...

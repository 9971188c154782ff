from capc_common.wire.capc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitContributionRequest(_message.Message):
    __slots__ = ("release_id", "party", "seed", "length")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    party: str
    seed: bytes
    length: int
    def __init__(self, release_id: _Optional[str] = ..., party: _Optional[str] = ..., seed: _Optional[bytes] = ..., length: _Optional[int] = ...) -> None: ...

class SubmitContributionReply(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("release_id", "parties")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    parties: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, release_id: _Optional[str] = ..., parties: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("masked", "charged_rdp", "remaining_rdp")
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CHARGED_RDP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_RDP_FIELD_NUMBER: _ClassVar[int]
    masked: _common_pb2.NdArray
    charged_rdp: float
    remaining_rdp: float
    def __init__(self, masked: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ..., charged_rdp: _Optional[float] = ..., remaining_rdp: _Optional[float] = ...) -> None: ...

class OpenBatchRequest(_message.Message):
    __slots__ = ("batch_id", "count", "query_digest")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    QUERY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    count: int
    query_digest: bytes
    def __init__(self, batch_id: _Optional[str] = ..., count: _Optional[int] = ..., query_digest: _Optional[bytes] = ...) -> None: ...

class OpenBatchReply(_message.Message):
    __slots__ = ("state", "reserved_rdp", "remaining_rdp", "answered")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_RDP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_RDP_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.BatchState
    reserved_rdp: float
    remaining_rdp: float
    answered: int
    def __init__(self, state: _Optional[_Union[_common_pb2.BatchState, str]] = ..., reserved_rdp: _Optional[float] = ..., remaining_rdp: _Optional[float] = ..., answered: _Optional[int] = ...) -> None: ...

class AbortBatchRequest(_message.Message):
    __slots__ = ("batch_id", "reason")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    reason: str
    def __init__(self, batch_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BatchStatusRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    def __init__(self, batch_id: _Optional[str] = ...) -> None: ...

class BatchStatusReply(_message.Message):
    __slots__ = ("state", "answered", "detail")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.BatchState
    answered: int
    detail: str
    def __init__(self, state: _Optional[_Union[_common_pb2.BatchState, str]] = ..., answered: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class RevealRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    def __init__(self, batch_id: _Optional[str] = ...) -> None: ...

class RevealReply(_message.Message):
    __slots__ = ("computation", "count", "reveal")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REVEAL_FIELD_NUMBER: _ClassVar[int]
    computation: str
    count: int
    reveal: bytes
    def __init__(self, computation: _Optional[str] = ..., count: _Optional[int] = ..., reveal: _Optional[bytes] = ...) -> None: ...

class SubmitSharesRequest(_message.Message):
    __slots__ = ("batch_id", "attempt", "party", "seed", "shape")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    attempt: int
    party: str
    seed: bytes
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., party: _Optional[str] = ..., seed: _Optional[bytes] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class SubmitSharesReply(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class ComputeStart(_message.Message):
    __slots__ = ("batch_id", "attempt", "parties")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    attempt: int
    parties: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, batch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., parties: _Optional[_Iterable[str]] = ...) -> None: ...

class ComputeAgreed(_message.Message):
    __slots__ = ("parties", "computation")
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    parties: _containers.RepeatedScalarFieldContainer[str]
    computation: str
    def __init__(self, parties: _Optional[_Iterable[str]] = ..., computation: _Optional[str] = ...) -> None: ...

class ComputeRefused(_message.Message):
    __slots__ = ("batch_id", "state", "reason")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    state: _common_pb2.BatchState
    reason: str
    def __init__(self, batch_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.BatchState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ComputeMessage(_message.Message):
    __slots__ = ("start", "agreed", "frame", "refused")
    START_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    start: ComputeStart
    agreed: ComputeAgreed
    frame: bytes
    refused: ComputeRefused
    def __init__(self, start: _Optional[_Union[ComputeStart, _Mapping]] = ..., agreed: _Optional[_Union[ComputeAgreed, _Mapping]] = ..., frame: _Optional[bytes] = ..., refused: _Optional[_Union[ComputeRefused, _Mapping]] = ...) -> None: ...

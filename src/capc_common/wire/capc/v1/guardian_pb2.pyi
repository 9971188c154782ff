from capc_common.wire.capc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReleaseRoundState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_ROUND_STATE_UNSPECIFIED: _ClassVar[ReleaseRoundState]
    RELEASE_ROUND_STATE_OPEN: _ClassVar[ReleaseRoundState]
    RELEASE_ROUND_STATE_CHARGED: _ClassVar[ReleaseRoundState]
    RELEASE_ROUND_STATE_DEPOSITED: _ClassVar[ReleaseRoundState]
RELEASE_ROUND_STATE_UNSPECIFIED: ReleaseRoundState
RELEASE_ROUND_STATE_OPEN: ReleaseRoundState
RELEASE_ROUND_STATE_CHARGED: ReleaseRoundState
RELEASE_ROUND_STATE_DEPOSITED: ReleaseRoundState

class SubmitContributionRequest(_message.Message):
    __slots__ = ("release_id", "party", "seed", "length", "round")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    party: str
    seed: bytes
    length: int
    round: int
    def __init__(self, release_id: _Optional[str] = ..., party: _Optional[str] = ..., seed: _Optional[bytes] = ..., length: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class SubmitContributionReply(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("release_id", "parties", "round")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    parties: _containers.RepeatedScalarFieldContainer[str]
    round: int
    def __init__(self, release_id: _Optional[str] = ..., parties: _Optional[_Iterable[str]] = ..., round: _Optional[int] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("masked", "charged_rdp", "remaining_rdp", "release_id", "parties", "replayed", "ledger")
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CHARGED_RDP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_RDP_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    masked: _common_pb2.NdArray
    charged_rdp: float
    remaining_rdp: float
    release_id: str
    parties: _containers.RepeatedScalarFieldContainer[str]
    replayed: bool
    ledger: ReleaseLedger
    def __init__(self, masked: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ..., charged_rdp: _Optional[float] = ..., remaining_rdp: _Optional[float] = ..., release_id: _Optional[str] = ..., parties: _Optional[_Iterable[str]] = ..., replayed: _Optional[bool] = ..., ledger: _Optional[_Union[ReleaseLedger, _Mapping]] = ...) -> None: ...

class DepositReleaseRequest(_message.Message):
    __slots__ = ("round", "release_id", "total")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    round: int
    release_id: str
    total: _common_pb2.NdArray
    def __init__(self, round: _Optional[int] = ..., release_id: _Optional[str] = ..., total: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ...) -> None: ...

class ReleaseRecordRequest(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class ReleaseRecordReply(_message.Message):
    __slots__ = ("state", "release_id", "total", "ledger")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    state: ReleaseRoundState
    release_id: str
    total: _common_pb2.NdArray
    ledger: ReleaseLedger
    def __init__(self, state: _Optional[_Union[ReleaseRoundState, str]] = ..., release_id: _Optional[str] = ..., total: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ..., ledger: _Optional[_Union[ReleaseLedger, _Mapping]] = ...) -> None: ...

class ReleaseLedger(_message.Message):
    __slots__ = ("releases_planned", "releases", "rdp_per_release", "rdp_planned", "rdp_spent", "epsilon", "epsilon_spent", "epsilon_limit", "delta", "order", "head", "entries", "coalitions")
    RELEASES_PLANNED_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    RDP_PER_RELEASE_FIELD_NUMBER: _ClassVar[int]
    RDP_PLANNED_FIELD_NUMBER: _ClassVar[int]
    RDP_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COALITIONS_FIELD_NUMBER: _ClassVar[int]
    releases_planned: int
    releases: int
    rdp_per_release: float
    rdp_planned: float
    rdp_spent: float
    epsilon: float
    epsilon_spent: float
    epsilon_limit: float
    delta: float
    order: float
    head: str
    entries: int
    coalitions: _containers.RepeatedCompositeFieldContainer[Coalition]
    def __init__(self, releases_planned: _Optional[int] = ..., releases: _Optional[int] = ..., rdp_per_release: _Optional[float] = ..., rdp_planned: _Optional[float] = ..., rdp_spent: _Optional[float] = ..., epsilon: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., epsilon_limit: _Optional[float] = ..., delta: _Optional[float] = ..., order: _Optional[float] = ..., head: _Optional[str] = ..., entries: _Optional[int] = ..., coalitions: _Optional[_Iterable[_Union[Coalition, _Mapping]]] = ...) -> None: ...

class Coalition(_message.Message):
    __slots__ = ("members", "epsilon", "note")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedScalarFieldContainer[str]
    epsilon: float
    note: str
    def __init__(self, members: _Optional[_Iterable[str]] = ..., epsilon: _Optional[float] = ..., note: _Optional[str] = ...) -> None: ...

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

from capc_common.wire.capc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_RAW_QUERIES_NOT_ALLOWED: _ClassVar[RefusalReason]
    REFUSAL_REASON_LOCAL_BUDGET_EXHAUSTED: _ClassVar[RefusalReason]
    REFUSAL_REASON_GUARDIAN_UNAVAILABLE: _ClassVar[RefusalReason]
    REFUSAL_REASON_INVALID_QUERY: _ClassVar[RefusalReason]
    REFUSAL_REASON_INTERNAL: _ClassVar[RefusalReason]
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_RAW_QUERIES_NOT_ALLOWED: RefusalReason
REFUSAL_REASON_LOCAL_BUDGET_EXHAUSTED: RefusalReason
REFUSAL_REASON_GUARDIAN_UNAVAILABLE: RefusalReason
REFUSAL_REASON_INVALID_QUERY: RefusalReason
REFUSAL_REASON_INTERNAL: RefusalReason

class NextReleaseRequest(_message.Message):
    __slots__ = ("party",)
    PARTY_FIELD_NUMBER: _ClassVar[int]
    party: str
    def __init__(self, party: _Optional[str] = ...) -> None: ...

class ReleaseItem(_message.Message):
    __slots__ = ("release_id", "round", "state", "length", "done", "pending")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    round: int
    state: _common_pb2.NdArray
    length: int
    done: bool
    pending: bool
    def __init__(self, release_id: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ..., length: _Optional[int] = ..., done: _Optional[bool] = ..., pending: _Optional[bool] = ...) -> None: ...

class ContributionShare(_message.Message):
    __slots__ = ("release_id", "party", "share")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    party: str
    share: _common_pb2.NdArray
    def __init__(self, release_id: _Optional[str] = ..., party: _Optional[str] = ..., share: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ...) -> None: ...

class ContributionShareReply(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class TeacherHello(_message.Message):
    __slots__ = ("party", "heads", "software_version", "instance", "process")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    party: str
    heads: int
    software_version: str
    instance: str
    process: str
    def __init__(self, party: _Optional[str] = ..., heads: _Optional[int] = ..., software_version: _Optional[str] = ..., instance: _Optional[str] = ..., process: _Optional[str] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ("batch_id", "attempt", "query", "ring_width", "classes")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    RING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    attempt: int
    query: _common_pb2.QuerySpec
    ring_width: int
    classes: int
    def __init__(self, batch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., query: _Optional[_Union[_common_pb2.QuerySpec, _Mapping]] = ..., ring_width: _Optional[int] = ..., classes: _Optional[int] = ...) -> None: ...

class VoteShare(_message.Message):
    __slots__ = ("batch_id", "attempt", "share", "generation_s", "inference_s", "sharing_s")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_S_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_S_FIELD_NUMBER: _ClassVar[int]
    SHARING_S_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    attempt: int
    share: _common_pb2.NdArray
    generation_s: float
    inference_s: float
    sharing_s: float
    def __init__(self, batch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., share: _Optional[_Union[_common_pb2.NdArray, _Mapping]] = ..., generation_s: _Optional[float] = ..., inference_s: _Optional[float] = ..., sharing_s: _Optional[float] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("batch_id", "attempt", "reason", "detail")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    attempt: int
    reason: RefusalReason
    detail: str
    def __init__(self, batch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[_Union[RefusalReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class TeacherMessage(_message.Message):
    __slots__ = ("hello", "share", "refusal")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    hello: TeacherHello
    share: VoteShare
    refusal: Refusal
    def __init__(self, hello: _Optional[_Union[TeacherHello, _Mapping]] = ..., share: _Optional[_Union[VoteShare, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class StudentWelcome(_message.Message):
    __slots__ = ("student", "config_hash")
    STUDENT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    student: str
    config_hash: str
    def __init__(self, student: _Optional[str] = ..., config_hash: _Optional[str] = ...) -> None: ...

class StudentMessage(_message.Message):
    __slots__ = ("welcome", "work")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    welcome: StudentWelcome
    work: WorkItem
    def __init__(self, welcome: _Optional[_Union[StudentWelcome, _Mapping]] = ..., work: _Optional[_Union[WorkItem, _Mapping]] = ...) -> None: ...

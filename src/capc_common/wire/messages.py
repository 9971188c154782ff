"""Protobuf message classes of the ``capc.v1`` wire contract, under stable names.

Everything outside ``capc_common.wire`` imports messages from here (never from a ``*_pb2`` module), so a
regenerated or re-versioned contract changes one file.
"""

from __future__ import annotations

from capc_common.wire.capc.v1.common_pb2 import (
    BatchState,
    NdArray,
    QuerySpec,
    RawImages,
    SyntheticSpec,
)
from capc_common.wire.capc.v1.guardian_pb2 import (
    AbortBatchRequest,
    BatchStatusReply,
    BatchStatusRequest,
    ComputeAgreed,
    ComputeMessage,
    ComputeRefused,
    ComputeStart,
    OpenBatchReply,
    OpenBatchRequest,
    RevealReply,
    RevealRequest,
    SubmitSharesReply,
    SubmitSharesRequest,
)
from capc_common.wire.capc.v1.student_pb2 import (
    Refusal,
    RefusalReason,
    StudentMessage,
    StudentWelcome,
    TeacherHello,
    TeacherMessage,
    VoteShare,
    WorkItem,
)

__all__ = [
    "AbortBatchRequest",
    "BatchState",
    "BatchStatusReply",
    "BatchStatusRequest",
    "ComputeAgreed",
    "ComputeMessage",
    "ComputeRefused",
    "ComputeStart",
    "NdArray",
    "OpenBatchReply",
    "OpenBatchRequest",
    "QuerySpec",
    "RawImages",
    "Refusal",
    "RefusalReason",
    "RevealReply",
    "RevealRequest",
    "StudentMessage",
    "StudentWelcome",
    "SubmitSharesReply",
    "SubmitSharesRequest",
    "SyntheticSpec",
    "TeacherHello",
    "TeacherMessage",
    "VoteShare",
    "WorkItem",
]

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
    ReleaseReply,
    ReleaseRequest,
    RevealReply,
    RevealRequest,
    SubmitContributionReply,
    SubmitContributionRequest,
    SubmitSharesReply,
    SubmitSharesRequest,
)
from capc_common.wire.capc.v1.student_pb2 import (
    ContributionShare,
    ContributionShareReply,
    NextReleaseRequest,
    Refusal,
    RefusalReason,
    ReleaseItem,
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
    "ContributionShare",
    "ContributionShareReply",
    "NdArray",
    "NextReleaseRequest",
    "OpenBatchReply",
    "OpenBatchRequest",
    "QuerySpec",
    "RawImages",
    "Refusal",
    "RefusalReason",
    "ReleaseItem",
    "ReleaseReply",
    "ReleaseRequest",
    "RevealReply",
    "RevealRequest",
    "StudentMessage",
    "StudentWelcome",
    "SubmitContributionReply",
    "SubmitContributionRequest",
    "SubmitSharesReply",
    "SubmitSharesRequest",
    "SyntheticSpec",
    "TeacherHello",
    "TeacherMessage",
    "VoteShare",
    "WorkItem",
]

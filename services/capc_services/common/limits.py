"""How large one gRPC message on each link of a federation may be: what the protocol really sends, no more.

gRPC reads a unary call's request whole before any server code (the identity interceptor included) runs, so
a server's receive limit is also what any certified party can make it buffer before its role is checked. The
limits follow from the federation config: MPC frames are at most :data:`~capc_common.mpc.MAX_FRAME_BYTES`
(the protocol streams anything larger), a teacher's vote share is ``batch_size × classes`` int64 values, a
work item at most ``batch_size`` raw images, and every other message is a few hundred bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from capc_common.federation import FederationConfig
from capc_common.mpc import MAX_FRAME_BYTES

HEADROOM = 64 << 10
"""Added to every limit for protobuf framing, field tags and metadata (the payloads above are exact)."""


@dataclass(frozen=True)
class MessageLimits:
    """Message size limits of one federation's links, in bytes.

    Attributes:
        compute: a Compute stream message, student ⇄ guardian (one MPC frame).
        share: a teacher's message to the student (its vote share).
        work: the student's message to a teacher (a work item, raw images at most).
        control: every other message (open/abort/status/reveal, 16-byte seeds).
    """

    compute: int
    share: int
    work: int
    control: int

    @classmethod
    def of(cls, config: FederationConfig) -> MessageLimits:
        """The limits of ``config``'s protocol."""
        q = config.queries
        reveal = q.batch_size * (1 + config.classes.bit_length()) // 8 + 1  # pass bits + decoding bits
        return cls(
            compute=MAX_FRAME_BYTES + HEADROOM,
            share=q.batch_size * config.classes * 8 + HEADROOM,
            work=q.batch_size * q.height * q.width * q.channels + HEADROOM,
            control=reveal + HEADROOM,
        )

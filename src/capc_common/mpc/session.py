"""The one place a role is chosen: open the guardian's or the student's end of a session."""

from __future__ import annotations

from typing import Literal

from capc_common.errors import InputError
from capc_common.mpc.channel import Channel
from capc_common.mpc.config import MpcConfig
from capc_common.mpc.evaluator import EvaluatorSession
from capc_common.mpc.garbler import GarblerSession

Role = Literal["garbler", "evaluator"]


def open_session(role: Role, channel: Channel, config: MpcConfig) -> GarblerSession | EvaluatorSession:
    """Create the session object for ``role`` ("garbler" = privacy guardian, "evaluator" = student)."""
    if role == "garbler":
        return GarblerSession(channel, config)
    if role == "evaluator":
        return EvaluatorSession(channel, config)
    raise InputError(f"role must be 'garbler' or 'evaluator', got {role!r}.")

"""Test harness: a real garbler in a thread against a real evaluator over an in-memory channel."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capc_common.mpc import (
    Channel,
    EvaluatorSession,
    GarblerSession,
    MpcConfig,
    Reveal,
    channel_pair,
    reference_noisy_argmax,
    share_votes,
    sum_shares,
)
from capc_common.mpc.party import HEADER_BYTES, Tag


@dataclass
class BatchInputs:
    """Everything one batch needs: the parties' shares and seeds, both parties' noise, the true votes."""

    votes: np.ndarray
    seeds: list[bytes]
    share_sum: np.ndarray
    z2: np.ndarray
    z1: np.ndarray | None
    threshold: int | None
    z1_student: np.ndarray | None = None

    def expected(self) -> np.ndarray:
        """The plaintext labels (−1 where the query fails)."""
        return reference_noisy_argmax(
            self.votes, z2=self.z2, z1=self.z1, z1_student=self.z1_student, threshold=self.threshold
        )


def make_inputs(
    config: MpcConfig,
    votes: np.ndarray,
    z2: np.ndarray,
    z1: np.ndarray | None = None,
    threshold: int | None = None,
    *,
    z1_student: np.ndarray | None = None,
    parties: int = 2,
) -> BatchInputs:
    """Split ``votes`` over ``parties`` teacher parties and share each part as a teacher would.

    In Confident-GNMax (``z1`` given) the student's threshold noise defaults to zeros; tests of the split
    noise pass their own ``z1_student``.
    """
    votes = np.asarray(votes, dtype=np.int64)
    parts = [votes // parties] * (parties - 1)
    parts.append(votes - sum(parts, np.zeros_like(votes)))
    shared = [share_votes(p, width=config.width) for p in parts]
    return BatchInputs(
        votes=votes,
        seeds=[seed for seed, _ in shared],
        share_sum=sum_shares([share for _, share in shared], width=config.width),
        z2=np.asarray(z2, dtype=np.int64),
        z1=None if z1 is None else np.asarray(z1, dtype=np.int64),
        threshold=threshold,
        z1_student=(
            None
            if z1 is None
            else np.zeros(votes.shape[0], np.int64)
            if z1_student is None
            else np.asarray(z1_student, dtype=np.int64)
        ),
    )


def room(config: MpcConfig) -> tuple[int, int]:
    """Where the guardian's noise (z2, z1 − T) may lie in ``config``: the ring less the student's bound."""
    half = 1 << (config.width - 1)
    student = config.student_noise or 0
    return -half + student, half - 1 - config.teachers - student


@dataclass
class BatchResult:
    labels: np.ndarray | None
    pass_bits: np.ndarray | None
    committed: list[np.ndarray] = field(default_factory=list)
    reveals: list[Reveal] = field(default_factory=list)
    garbler_error: BaseException | None = None
    evaluator_error: BaseException | None = None


@dataclass
class SessionPair:
    """A connected garbler/evaluator pair; ``run`` drives one batch with the garbler in a thread."""

    config: MpcConfig
    garbler: GarblerSession
    evaluator: EvaluatorSession
    garbler_channel: TapChannel
    evaluator_channel: TapChannel

    def run(
        self,
        inputs: BatchInputs,
        *,
        batch_id: str = "batch",
        evaluator_batch_id: str | None = None,
        commit: Callable[[np.ndarray], None] | None = None,
        before_decode: Callable[[], None] | None = None,
        stash: Callable[[np.ndarray], None] | None = None,
        timeout: float = 60.0,
    ) -> BatchResult:
        result = BatchResult(labels=None, pass_bits=None)

        def _commit(reveal: Reveal) -> None:
            result.committed.append(reveal.pass_bits)
            result.reveals.append(reveal)
            if commit is not None:
                commit(reveal.pass_bits)

        def _garble() -> None:
            try:
                result.pass_bits = self.garbler.run_batch(
                    batch_id,
                    seeds=inputs.seeds,
                    shape=inputs.votes.shape,
                    z2=inputs.z2,
                    z1=inputs.z1,
                    threshold=inputs.threshold,
                    commit=_commit,
                    before_decode=before_decode,
                )
            except BaseException as exc:
                result.garbler_error = exc

        thread = threading.Thread(target=_garble, daemon=True)
        thread.start()
        try:
            result.labels = self.evaluator.run_batch(
                evaluator_batch_id or batch_id,
                share_sum=inputs.share_sum,
                z1_student=inputs.z1_student,
                stash=stash,
            )
        except BaseException as exc:
            result.evaluator_error = exc
        thread.join(timeout)
        assert not thread.is_alive(), "the garbler thread did not finish"
        return result

    def run_ok(self, inputs: BatchInputs, **kwargs: Any) -> BatchResult:
        result = self.run(inputs, **kwargs)
        if result.garbler_error is not None:
            raise result.garbler_error
        if result.evaluator_error is not None:
            raise result.evaluator_error
        return result


class TapChannel(Channel):
    """Wraps a real channel: records every frame received and may rewrite them (tampering tests).

    ``tamper(index, frame)`` gets the index of each received frame and returns the frame to deliver, or a
    list of frames (empty: drop it; several: inject extra ones).
    """

    def __init__(
        self,
        inner: Channel,
        tamper: Callable[[int, bytes], bytes | list[bytes]] | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.received: list[bytes] = []
        self.sent: list[bytes] = []
        self._tamper = tamper
        self._pending: list[bytes] = []
        self._count = 0

    def _send(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.inner.send(data)

    def _recv(self) -> bytes:
        while not self._pending:
            frame = bytes(self.inner.recv())
            delivered = self._tamper(self._count, frame) if self._tamper else frame
            self._count += 1
            self._pending.extend([delivered] if isinstance(delivered, bytes) else delivered)
        frame = self._pending.pop(0)
        self.received.append(frame)
        return frame

    def close(self) -> None:
        self.inner.close()


def open_pair(
    config: MpcConfig,
    *,
    garbler_config: MpcConfig | None = None,
    tap_garbler: Callable[[int, bytes], bytes | list[bytes]] | None = None,
    tap_evaluator: Callable[[int, bytes], bytes | list[bytes]] | None = None,
) -> SessionPair:
    """A fresh session pair whose two ends are :class:`TapChannel` s (recording, optionally tampering)."""
    g_end, e_end = channel_pair(timeout=20.0)
    g_tap, e_tap = TapChannel(g_end, tap_garbler), TapChannel(e_end, tap_evaluator)
    return SessionPair(
        config,
        GarblerSession(g_tap, garbler_config or config),
        EvaluatorSession(e_tap, config),
        g_tap,
        e_tap,
    )


def frames_with_tag(frames: list[bytes], tag: Tag) -> list[bytes]:
    """Payloads of the frames of one type (header stripped)."""
    return [f[HEADER_BYTES:] for f in frames if len(f) >= HEADER_BYTES and f[0] == tag]

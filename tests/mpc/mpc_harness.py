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
    channel_pair,
    share_votes,
    sum_shares,
)


@dataclass
class BatchInputs:
    """Everything one batch needs: the parties' shares and seeds, the guardian's noise, the true votes."""

    votes: np.ndarray
    seeds: list[bytes]
    share_sum: np.ndarray
    z2: np.ndarray
    z1: np.ndarray | None
    threshold: int | None


def make_inputs(
    config: MpcConfig,
    votes: np.ndarray,
    z2: np.ndarray,
    z1: np.ndarray | None = None,
    threshold: int | None = None,
    *,
    parties: int = 2,
) -> BatchInputs:
    """Split ``votes`` over ``parties`` teacher parties and share each part as a teacher would."""
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
    )


@dataclass
class BatchResult:
    labels: np.ndarray | None
    pass_bits: np.ndarray | None
    committed: list[np.ndarray] = field(default_factory=list)
    garbler_error: BaseException | None = None
    evaluator_error: BaseException | None = None


@dataclass
class SessionPair:
    """A connected garbler/evaluator pair; ``run`` drives one batch with the garbler in a thread."""

    config: MpcConfig
    garbler: GarblerSession
    evaluator: EvaluatorSession
    garbler_channel: Channel
    evaluator_channel: Channel

    def run(
        self,
        inputs: BatchInputs,
        *,
        batch_id: str = "batch",
        evaluator_batch_id: str | None = None,
        commit: Callable[[np.ndarray], None] | None = None,
        timeout: float = 60.0,
    ) -> BatchResult:
        result = BatchResult(labels=None, pass_bits=None)

        def _commit(bits: np.ndarray) -> None:
            result.committed.append(bits)
            if commit is not None:
                commit(bits)

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
                )
            except BaseException as exc:
                result.garbler_error = exc

        thread = threading.Thread(target=_garble, daemon=True)
        thread.start()
        try:
            result.labels = self.evaluator.run_batch(
                evaluator_batch_id or batch_id, share_sum=inputs.share_sum
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


def open_pair(config: MpcConfig, *, wrap: Callable[[Channel], Channel] | None = None) -> SessionPair:
    """A fresh session pair; ``wrap`` may interpose on the garbler → evaluator direction (tampering tests)."""
    g_end, e_end = channel_pair(timeout=30.0)
    e_view = wrap(e_end) if wrap is not None else e_end
    return SessionPair(config, GarblerSession(g_end, config), EvaluatorSession(e_view, config), g_end, e_view)

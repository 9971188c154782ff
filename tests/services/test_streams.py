"""The MPC library's sessions run unchanged over a real mutual-TLS gRPC bidirectional stream."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from capc_common.mpc import (
    EvaluatorSession,
    GarblerSession,
    MpcConfig,
    noise_bound,
    reference_noisy_argmax,
    ring_width,
    share_votes,
    sum_shares,
)
from capc_common.wire import rpc
from capc_services.common.runtime import start_grpc_server
from capc_services.common.streams import FrameChannel
from capc_services.tls import TlsFiles

CONFIG = MpcConfig(
    classes=10,
    width=ring_width(teachers=20, sigma2=3, sigma1=5, threshold=12),
    teachers=20,
    student_noise=noise_bound(5),
)


def _files(pki: Path, party: str) -> TlsFiles:
    return TlsFiles(ca=pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")


class _Garbler(rpc.GuardianServiceServicer):
    """Garbles the batches it is handed, one session per stream (what the guardian's servicer does)."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches = batches
        self.committed: list[np.ndarray] = []

    def Compute(self, request_iterator, context):
        channel = FrameChannel(request_iterator, peer="student")

        def run() -> None:
            session = GarblerSession(channel, CONFIG)
            for index, batch in enumerate(self.batches):
                session.run_batch(
                    f"b{index}",
                    seeds=batch["seeds"],
                    shape=batch["votes"].shape,
                    z2=batch["z2"],
                    z1=batch["z1"],
                    threshold=12,
                    commit=lambda reveal: self.committed.append(reveal.pass_bits),
                )
            channel.close()

        threading.Thread(target=run, daemon=True).start()
        yield from channel.outgoing()


def _batch(rng: np.random.Generator, queries: int) -> dict:
    votes = rng.multinomial(20, np.full(10, 0.1), size=queries).astype(np.int64)
    halves = [votes // 2, votes - votes // 2]
    shared = [share_votes(v, width=CONFIG.width) for v in halves]
    return {
        "votes": votes,
        "seeds": [s for s, _ in shared],
        "share_sum": sum_shares([s for _, s in shared], width=CONFIG.width),
        "z2": rng.integers(-6, 7, size=(queries, 10)),
        "z1": rng.integers(-10, 11, size=queries),
        "z1_student": rng.integers(-10, 11, size=queries),
    }


def test_garbled_batches_over_a_grpc_stream_match_the_plaintext_rule(pki: Path) -> None:
    # Prepare
    rng = np.random.default_rng(0)
    batches = [_batch(rng, 64), _batch(rng, 200)]
    servicer = _Garbler(batches)
    server = start_grpc_server(
        bind="127.0.0.1:0",
        tls=_files(pki, "guardian"),
        register=[lambda s: rpc.add_GuardianServiceServicer_to_server(servicer, s)],
        services=[rpc.GUARDIAN_SERVICE],
        interceptors=[],
        max_workers=4,
    )
    grpc_channel = _files(pki, "student").channel(f"127.0.0.1:{server.port}", peer="guardian")
    channel = FrameChannel(None, peer="guardian")
    call = rpc.GuardianServiceStub(grpc_channel).Compute(channel.outgoing())
    channel.attach(call)
    session = EvaluatorSession(channel, CONFIG)
    # Execute
    labels = [
        session.run_batch(f"b{i}", share_sum=b["share_sum"], z1_student=b["z1_student"])
        for i, b in enumerate(batches)
    ]
    channel.close()
    assert channel.next_message(timeout=30) is None  # the server ended the stream cleanly
    # Assert
    for got, batch, passed in zip(labels, batches, servicer.committed, strict=True):
        want = reference_noisy_argmax(
            batch["votes"], z2=batch["z2"], z1=batch["z1"], z1_student=batch["z1_student"], threshold=12
        )
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(passed, want >= 0)
    assert channel.bytes_sent > 0 and channel.bytes_received > 0
    grpc_channel.close()
    server.stop(0)

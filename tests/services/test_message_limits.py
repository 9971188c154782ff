"""Oversized messages: each link's limit is what the protocol really sends, so a certified party cannot make
the guardian buffer hundreds of megabytes before its role is even checked."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
import yaml

from capc_common.federation import FederationConfig
from capc_common.mpc import MAX_FRAME_BYTES
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.common.limits import HEADROOM, MessageLimits
from capc_services.local.provision import free_port
from capc_services.tls import TlsFiles

OVERSIZED = 200 << 20  # what a misbehaving teacher sends


def test_limits_follow_the_federation(federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())  # batches of 32, 10 classes, 28×28×1
    limits = MessageLimits.of(config)
    assert limits.compute == MAX_FRAME_BYTES + HEADROOM
    assert limits.share == 32 * 10 * 8 + HEADROOM
    assert limits.work == 32 * 28 * 28 + HEADROOM
    assert limits.control < 2 * HEADROOM


@pytest.fixture
def guardian(
    pki: Path, tmp_path: Path, token_file: Path, funded_federation: Path
) -> Iterator[tuple[str, int]]:
    """A real `capc guardian serve` process: (gRPC address, pid)."""
    grpc_port, admin_port = free_port(), free_port()
    site = tmp_path / "guardian.yaml"
    site.write_text(
        yaml.safe_dump(
            {
                "party": "guardian",
                "federation": str(funded_federation),
                "tls": {
                    "ca": str(pki / "ca.crt"),
                    "cert": str(pki / "guardian.crt"),
                    "key": str(pki / "guardian.key"),
                },
                "admin": {"bind": f"127.0.0.1:{admin_port}", "token_file": str(token_file)},
                "grpc": {"bind": f"127.0.0.1:{grpc_port}"},
                "ledger": str(tmp_path / "ledger.sqlite"),
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "capc_cli", "guardian", "serve", "--site", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{admin_port}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the guardian did not become ready"
        time.sleep(0.2)
    yield f"127.0.0.1:{grpc_port}", proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def test_an_oversized_message_from_a_teacher_is_refused_before_it_is_buffered(
    pki: Path, funded_federation: Path, guardian: tuple[str, int]
) -> None:
    address, pid = guardian
    config = FederationConfig.load(funded_federation)
    files = TlsFiles(ca=pki / "ca.crt", cert=pki / "hospital-a.crt", key=pki / "hospital-a.key")
    interceptor = FederationClientInterceptor.dialling(config, tls=files, peer="guardian")
    # This client lets itself send far more than the protocol ever does (a misbehaving teacher).
    channel = files.channel(address, peer="guardian", interceptors=(interceptor,), send=OVERSIZED + (1 << 20))
    stub = rpc.GuardianServiceStub(channel)
    process = psutil.Process(pid)
    before = process.memory_info().rss
    request = pb.SubmitSharesRequest(
        batch_id="b", attempt=1, party="hospital-a", seed=bytes(OVERSIZED), shape=[1, 10]
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.SubmitShares(request, timeout=120)
    grown = process.memory_info().rss - before
    assert grown < 32 << 20, f"the guardian's memory grew by {grown >> 20} MiB"
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    # The guardian is unharmed: a well-formed call is answered (refused on its merits).
    with pytest.raises(grpc.RpcError) as answered:
        stub.SubmitShares(
            pb.SubmitSharesRequest(
                batch_id="b", attempt=1, party="hospital-a", seed=bytes(16), shape=[1, 10]
            ),
            timeout=30,
        )
    assert answered.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # no such batch open
    print({"rss_before_mib": before >> 20, "rss_growth_mib": grown >> 20})
    channel.close()

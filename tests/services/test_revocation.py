"""Revocation by serial in federation.yaml, honoured by the real guardian and student processes.

hospital-2's earlier certificate (same CA, same name, still within its validity) is listed under
``revoked:``; both servers refuse it on every call, health included, while hospital-2's current
certificate is served, and a teacher process started with the revoked certificate refuses to run.
"""

from __future__ import annotations

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from live_parties import LiveParties

from capc_common.federation import FederationConfig
from capc_services.common.interceptors import FederationClientInterceptor
from capc_services.tls import TlsFiles


def _health(files: TlsFiles, address: str, peer: str, config: FederationConfig) -> int:
    channel = files.channel(
        address, peer=peer, interceptors=(FederationClientInterceptor.dialling(config, tls=files, peer=peer),)
    )
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
        return int(reply.status)
    finally:
        channel.close()


@pytest.mark.parametrize("server", ["guardian", "student"])
def test_guardian_and_student_refuse_the_revoked_certificate(live_parties: LiveParties, server: str) -> None:
    live = live_parties
    address = live.guardian_address if server == "guardian" else live.student_address
    certs = live.layout.certs
    current = TlsFiles(ca=certs / "ca.crt", cert=certs / "hospital-2.crt", key=certs / "hospital-2.key")
    revoked = TlsFiles(ca=certs / "ca.crt", cert=live.revoked.cert, key=live.revoked.key)
    assert _health(current, address, server, live.config) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        _health(revoked, address, server, live.config)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"serial {live.revoked.serial} of 'hospital-2' is revoked" in info.value.details()


def test_a_teacher_with_a_revoked_certificate_refuses_to_start(live_parties: LiveParties, capc) -> None:
    live = live_parties
    site = yaml.safe_load(live.layout.site("hospital-2").read_text())
    site["tls"].update(cert=str(live.revoked.cert), key=str(live.revoked.key))
    path = live.layout.sites / "hospital-2-revoked.yaml"
    path.write_text(yaml.safe_dump(site))
    proc = capc("teacher", "serve", "--site", str(path), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "is revoked in federation.yaml (key on a lost laptop)" in proc.stderr
    assert "Traceback" not in proc.stderr

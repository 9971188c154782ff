"""Preflight of the party's place in the federation: its peers over mutual TLS."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capc_common.errors import CapcError
from capc_services.common.interceptors import HASH_HEADER
from capc_services.teacher.preflight.report import Check
from capc_services.tls import TlsFiles


def peer_check(
    name: str, *, tls: TlsFiles, address: str, peer: str, config_hash: str, timeout: float = 10.0
) -> Check:
    """Dial ``peer`` at ``address`` as this party would: mTLS handshake (the server must be certified as
    ``peer`` by the federation CA and accept this party's certificate), health SERVING, same federation hash.

    The health service answers any certificate of the federation CA that is not revoked, with the server's
    federation-config hash in its reply headers.
    """
    fix_reach = (
        f"check {name}_address in the site file ({address}) and that this machine may dial it (TCP); "
        f"the server must present a certificate for {peer!r} signed by the federation CA"
    )
    try:
        channel = tls.channel(address, peer=peer)
    except CapcError as exc:
        return Check.skip(name, f"this party's TLS files are unusable ({exc})")
    start = time.perf_counter()
    try:
        reply, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
            health_pb2.HealthCheckRequest(), metadata=((HASH_HEADER, config_hash),), timeout=timeout
        )
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return Check.fail(
                name,
                f"{peer} at {address} refused this party's certificate: {details}",
                fix="request and get signed a new certificate (`capc cert request`, `capc cert sign`)",
            )
        return Check.fail(
            name,
            f"cannot reach {peer} at {address} over mutual TLS within {timeout:g} s ({code.name}: {details})",
            fix=fix_reach,
        )
    finally:
        channel.close()
    ms = round(1000 * (time.perf_counter() - start), 1)
    theirs = dict(call.initial_metadata() or ()).get(HASH_HEADER)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return Check.fail(
            name,
            f"{peer} at {address} answers but is not serving (status {reply.status})",
            fix=f"ask the {peer} operator; it reports not serving until it has started completely",
        )
    if theirs is None:
        return Check.warn(
            name,
            f"{peer} at {address} is reachable over mTLS ({ms} ms) but did not report its federation hash",
            fix=f"the {peer} runs an older capc; the first batch will tell whether the federations agree",
        )
    if theirs != config_hash:
        return Check.fail(
            name,
            f"{peer} at {address} runs federation config {theirs[:16]}…, this site has {config_hash[:16]}…; "
            "it would refuse every call",
            fix="get the current federation.yaml from the coordinator: every party must load the same file",
            theirs=theirs,
        )
    return Check.ok(
        name, f"{peer} at {address}: mTLS, serving, same federation ({config_hash[:16]}…), {ms} ms", ms=ms
    )

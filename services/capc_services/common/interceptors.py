"""Authentication and federation-config checks for every gRPC call.

Identity is the peer certificate's CN (TLS has already verified the chain against the federation CA); a
certificate ``federation.yaml`` revokes, or one that names another party, is refused before anything else;
the policy says which roles may call which method. Both directions carry the federation-config hash as
metadata, and a peer with another hash is refused: two parties that loaded different ``federation.yaml``
files must never exchange a single share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Any

import grpc
from cryptography import x509
from google.protobuf.message import DecodeError

from capc_common.errors import ProtocolError
from capc_common.federation import FederationConfig
from capc_services.tls import describe_certificate, refusal

HASH_HEADER = "capc-config-hash"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
_log = logging.getLogger(__name__)


def peer_name(context: grpc.ServicerContext) -> str:
    """The CN of the caller's (verified) client certificate, or '' when there is none."""
    names = context.auth_context().get("x509_common_name", [])
    return names[0].decode() if names else ""


def acting_party(context: grpc.ServicerContext, claimed: str, *, what: str) -> str:
    """The caller's CN, aborting with PERMISSION_DENIED when the request claims another party (a party's
    certificate speaks for that party only; an empty claim means the caller itself).

    Args:
        context: the call.
        claimed: the party the request names.
        what: what the caller tried to do, for the message (e.g. ``submit shares``).
    """
    caller = peer_name(context)
    if claimed and claimed != caller:
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"certificate CN {caller!r} may not {what} for party {claimed!r}",
        )
    return caller


def peer_certificate(context: grpc.ServicerContext) -> bytes:
    """The caller's (verified) client certificate as PEM, or b'' when there is none."""
    pems = context.auth_context().get("x509_pem_cert", [])
    return bytes(pems[0]) if pems else b""


def superseded_by_history(config: FederationConfig) -> dict[str, str]:
    """The config hashes ``federation.yaml``'s ``history`` says this federation replaced, each with the change
    that did (what a party without a ledger, the student, tells a peer still on one of them)."""
    return {
        old: f"the federation changed ({change.describe()})" for old, change in config.previous_hashes.items()
    }


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks caller identity against ``federation.yaml`` and the method's allowed roles, and the config hash.

    Args:
        config: this party's federation config.
        policy: full method name (``/capc.v1.GuardianService/OpenBatch``) → roles allowed to call it.
            Methods not listed are refused, except the standard health service, which any certificate
            from the federation CA may call.
        on_reject: called with (method, peer, reason) for metrics.
        superseded: config hashes this federation replaced by a membership change, each with why (e.g. the
            ledger entry that changed it); a peer presenting one is told so, not just "mismatch".
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        policy: Mapping[str, frozenset[str]],
        on_reject: Callable[[str, str, str], None] | None = None,
        superseded: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._hash = config.config_hash()
        self._superseded = dict(superseded or {})
        self._policy = dict(policy)
        self._on_reject = on_reject
        # A peer presents the same certificate on every call: parse and judge each one once.
        self._refusal = lru_cache(maxsize=256)(self._judge)

    def _judge(self, pem: bytes) -> str | None:
        try:
            info = describe_certificate(x509.load_pem_x509_certificate(pem))
        except ValueError as exc:
            return f"unreadable client certificate: {exc}"
        return refusal(
            self._config, common_name=info.common_name, serial=info.serial, dns_names=info.dns_names
        )

    def _reject(self, context: grpc.ServicerContext, method: str, peer: str, code: Any, msg: str) -> None:
        _log.warning("rejected call", extra={"method": method, "peer": peer, "reason": msg})
        if self._on_reject is not None:
            self._on_reject(method, peer, code.name)
        context.abort(code, msg)

    def _check(self, method: str, context: grpc.ServicerContext) -> None:
        peer = peer_name(context)
        if not peer:
            self._reject(context, method, peer, grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        refused = self._refusal(peer_certificate(context))
        if refused is not None:
            self._reject(context, method, peer, grpc.StatusCode.PERMISSION_DENIED, refused)
        if method.startswith(HEALTH_PREFIX):
            # Any certificate of the federation CA may ask; the reply names this party's config hash so a
            # party about to go live can check the federations agree (`capc teacher preflight`).
            context.send_initial_metadata(((HASH_HEADER, self._hash),))
            return
        role = self._config.role_of(peer)
        allowed = self._policy.get(method, frozenset())
        if role is None or role not in allowed:
            self._reject(
                context,
                method,
                peer,
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate CN {peer!r} (role {role or 'none'}) may not call {method}; "
                f"allowed roles: {sorted(allowed)}",
            )
        theirs = dict(context.invocation_metadata()).get(HASH_HEADER, "")
        if theirs != self._hash:
            why = self._superseded.get(theirs)
            message = (
                f"federation config hash mismatch: {peer} sent {theirs[:16] or '(none)'}, this party has "
                f"{self._hash[:16]}; every party must load the same federation.yaml"
                if why is None
                else f"{peer} sent federation config {theirs[:16]}, but {why}: install the new "
                f"federation.yaml (config {self._hash[:16]}) and restart {peer}"
            )
            self._reject(context, method, peer, grpc.StatusCode.FAILED_PRECONDITION, message)
        context.send_initial_metadata(((HASH_HEADER, self._hash),))

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        check = self._check
        parse = _lenient(handler.request_deserializer)

        def wrap(behavior: Callable[..., Any], *, streaming: bool) -> Callable[..., Any]:
            def guarded(request: Any, context: grpc.ServicerContext) -> Any:
                check(method, context)
                if streaming:
                    return behavior(_well_formed(request, method), context)
                if isinstance(request, _Malformed):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {request}")
                return behavior(request, context)

            return guarded

        serialize = handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap(handler.unary_unary, streaming=False), parse, serialize
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap(handler.unary_stream, streaming=False), parse, serialize
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap(handler.stream_unary, streaming=True), parse, serialize
            )
        return grpc.stream_stream_rpc_method_handler(
            wrap(handler.stream_stream, streaming=True), parse, serialize
        )


class _Malformed:
    """What a request that is not a valid protobuf message becomes (not gRPC's INTERNAL and a traceback)."""

    def __init__(self, error: str) -> None:
        self.error = error

    def __str__(self) -> str:
        return f"the request is not a well-formed message of this method ({self.error}); check the client"


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A request deserializer that turns undecodable bytes into :class:`_Malformed`, for a precise refusal."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Malformed(str(exc) or "undecodable protobuf")

    return parse


def _well_formed(requests: Iterator[Any], method: str) -> Iterator[Any]:
    """A stream's messages; an undecodable one ends the stream with a ProtocolError (a precise status)."""
    for request in requests:
        if isinstance(request, _Malformed):
            raise ProtocolError(f"{method}: {request}")
        yield request


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def check_peer_hash(metadata: Any, *, expected: str, peer: str) -> None:
    """Refuse a server whose advertised config hash differs (absent headers are left to the server's check).

    Raises:
        ProtocolError: the hashes differ.
    """
    theirs = dict(metadata or ()).get(HASH_HEADER)
    if theirs is not None and theirs != expected:
        raise ProtocolError(
            f"{peer} runs federation config {theirs[:16]}, this party has {expected[:16]}; "
            "every party must load the same federation.yaml"
        )


class ConfigHashClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Sends this party's federation-config hash with every call and checks the server's on unary replies."""

    def __init__(self, config_hash: str, *, peer: str) -> None:
        self._hash = config_hash
        self._peer = peer

    def _details(self, details: Any) -> _Details:
        metadata = (*tuple(details.metadata or ()), (HASH_HEADER, self._hash))
        return _Details(details, metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(self._details(details), request)
        if outcome.exception() is None:
            check_peer_hash(outcome.initial_metadata(), expected=self._hash, peer=self._peer)
        return outcome

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

"""Authentication, federation-config and admission checks for every gRPC call, on both ends.

Server side (:class:`AuthInterceptor`): identity is the peer certificate's CN (TLS has already verified the
chain against the federation CA); a certificate ``federation.yaml`` revokes, or one that names another party,
is refused before anything else, and so is a certificate of no party (a retired one included) — even for the
health service; the policy says which roles may call which method. Both directions carry the
federation-config hash and the revocation list's hash as metadata, and a peer with another one is refused:
two parties that loaded different ``federation.yaml`` files must never exchange a single share, nor run
different revocation lists unnoticed. Each peer may hold only so many calls open, and a stream must send its
first message in time (:mod:`~capc_services.common.admission`).

Client side (:class:`FederationClientInterceptor`): the same headers go out with every call, and the server's
reply must carry the same hashes and prove which certificate the server holds, which must not be revoked
(:mod:`~capc_services.tls.proof`).
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
from capc_services.common.admission import PeerCalls, StreamLimits, admit, first_message
from capc_services.tls import ServerCheck, ServerIdentity, TlsFiles, describe_certificate, refusal
from capc_services.tls.proof import NONCE_HEADER

HASH_HEADER = "capc-config-hash"
REVOCATION_HEADER = "capc-revocation-hash"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
HEALTH_WATCH = f"{HEALTH_PREFIX}Watch"
"""Not served: no party needs it (``Check`` is what probes and preflight ask), and every open watch is a
stream the server keeps, whose status updates the standard servicer sends under its own lock — which,
callback-driven, can deadlock gRPC's serving thread at shutdown, and otherwise holds a worker thread each."""
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
    """Checks caller identity against ``federation.yaml`` and the method's allowed roles, the config and
    revocation hashes, and each peer's open calls; answers the caller's nonce with this server's proof.

    Args:
        config: this party's federation config.
        policy: full method name (``/capc.v1.GuardianService/OpenBatch``) → roles allowed to call it.
            Methods not listed are refused, except the standard health service's ``Check``, which any party
            of the federation may call (never a certificate of no party); its ``Watch`` is not served.
        identity: this server's certificate and key, to prove to each client which certificate it holds.
        limits: the admission limits (calls per peer, first-message deadline).
        on_reject: called with (method, peer, reason) for metrics.
        superseded: config hashes this federation replaced by a membership change, each with why (e.g. the
            ledger entry that changed it); a peer presenting one is told so, not just "mismatch".
    """

    def __init__(
        self,
        *,
        config: FederationConfig,
        policy: Mapping[str, frozenset[str]],
        identity: ServerIdentity,
        limits: StreamLimits | None = None,
        on_reject: Callable[[str, str, str], None] | None = None,
        superseded: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._hash = config.config_hash()
        self._revocations = config.revocation_hash()
        self._superseded = dict(superseded or {})
        self._policy = dict(policy)
        self._identity = identity
        self._limits = limits or StreamLimits()
        self._calls = PeerCalls(self._limits.calls_per_peer)
        self._on_reject = on_reject
        self.serials: dict[str, set[str]] = {}
        """The certificate serials each party's calls presented (what retiring it must revoke)."""
        # A peer presents the same certificate on every call: parse and judge each one once.
        self._refusal = lru_cache(maxsize=256)(self._judge)

    def _judge(self, pem: bytes) -> tuple[str, str | None]:
        """The certificate's serial, and why it is refused (None: accepted)."""
        try:
            info = describe_certificate(x509.load_pem_x509_certificate(pem))
        except ValueError as exc:
            return "", f"unreadable client certificate: {exc}"
        reason = refusal(
            self._config, common_name=info.common_name, serial=info.serial, dns_names=info.dns_names
        )
        return info.serial, reason

    def _reject(self, context: grpc.ServicerContext, method: str, peer: str, code: Any, msg: str) -> None:
        _log.warning("rejected call", extra={"method": method, "peer": peer, "reason": msg})
        if self._on_reject is not None:
            self._on_reject(method, peer, code.name)
        context.abort(code, msg)

    def _answer(self, context: grpc.ServicerContext, peer: str, metadata: Mapping[str, Any]) -> None:
        """Send this server's hashes and, for a caller that sent a nonce, its proof."""
        nonce = metadata.get(NONCE_HEADER)
        proof = self._identity.answer(nonce, client=peer) if isinstance(nonce, bytes) else ()
        hashes = ((HASH_HEADER, self._hash), (REVOCATION_HEADER, self._revocations))
        context.send_initial_metadata((*hashes, *proof))

    def _check(self, method: str, context: grpc.ServicerContext) -> str:
        """The caller's name once every check passed (the call is aborted otherwise)."""
        peer = peer_name(context)
        if not peer:
            self._reject(context, method, peer, grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        serial, refused = self._refusal(peer_certificate(context))
        if refused is not None:
            self._reject(context, method, peer, grpc.StatusCode.PERMISSION_DENIED, refused)
        role = self._config.role_of(peer)
        if role is None:
            self._reject(
                context,
                method,
                peer,
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate CN {peer!r} (serial {serial}) is not a party of federation "
                f"{self._config.name!r} (a retired party's certificate included); it may call nothing",
            )
        self.serials.setdefault(peer, set()).add(serial)
        metadata = dict(context.invocation_metadata())
        if method == HEALTH_WATCH:
            self._reject(
                context,
                method,
                peer,
                grpc.StatusCode.UNIMPLEMENTED,
                "federation parties do not serve the health service's Watch; poll Check instead",
            )
        if method.startswith(HEALTH_PREFIX):
            # Any party may ask; the reply names this party's config hash so a party about to go live can
            # check the federations agree (`capc teacher preflight`).
            self._answer(context, peer, metadata)
            return peer
        allowed = self._policy.get(method, frozenset())
        if role not in allowed:
            self._reject(
                context,
                method,
                peer,
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate CN {peer!r} (role {role}) may not call {method}; "
                f"allowed roles: {sorted(allowed)}",
            )
        theirs = metadata.get(HASH_HEADER, "")
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
        revocations = metadata.get(REVOCATION_HEADER, "")
        if revocations != self._revocations:
            self._reject(
                context,
                method,
                peer,
                grpc.StatusCode.FAILED_PRECONDITION,
                revocation_mismatch(peer, theirs=revocations, ours=self._revocations, config=self._config),
            )
        self._answer(context, peer, metadata)
        return peer

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        check, calls, limits = self._check, self._calls, self._limits
        parse = _lenient(handler.request_deserializer)

        def wrap(behavior: Callable[..., Any], *, streaming: bool) -> Callable[..., Any]:
            def guarded(request: Any, context: grpc.ServicerContext, *callback: Any) -> Any:
                peer = check(method, context)
                admit(calls, peer, context, method=method)
                if streaming:
                    request = first_message(request, context, timeout=limits.first_message_s, method=method)
                    return behavior(_well_formed(request, method), context)
                if isinstance(request, _Malformed):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {request}")
                return behavior(request, context, *callback)

            # gRPC reads these off the handler: a callback-driven method (experimental_non_blocking, as the
            # health service's Watch is) must stay one, or every open call of it would hold a worker thread.
            for name in ("experimental_non_blocking", "experimental_thread_pool"):
                if hasattr(behavior, name):
                    setattr(guarded, name, getattr(behavior, name))
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


def revocation_mismatch(peer: str, *, theirs: str, ours: str, config: FederationConfig) -> str:
    """Why two parties with different revocation lists refuse to work together, and the fix."""
    return (
        f"{peer} runs revocation list {theirs[:16] or '(none)'}, this party {ours[:16]} "
        f"({len(config.revoked)} revoked certificates): every party must load the coordinator's current "
        "federation.yaml (its revoked: list) and restart"
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
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
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


class FederationClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Sends this party's config and revocation hashes and a fresh nonce with every call, and checks the
    server's reply: the same hashes, and proof of a certificate of ``peer`` that is not revoked
    (:class:`~capc_services.tls.ServerCheck`). A unary reply is checked before it is returned, a stream's
    before its first message is.

    Args:
        config: this party's federation config.
        peer: the party the channel dials.
        check: what to check of the server (``ServerCheck.load(tls, config=config, peer=peer)``).
    """

    def __init__(self, config: FederationConfig, *, peer: str, check: ServerCheck) -> None:
        self._config = config
        self._hash = config.config_hash()
        self._revocations = config.revocation_hash()
        self._peer = peer
        self._server = check

    @classmethod
    def dialling(cls, config: FederationConfig, *, tls: TlsFiles, peer: str) -> FederationClientInterceptor:
        """The interceptor of a channel to ``peer`` made with these TLS files (this party's identity).

        Raises:
            InputError: a TLS file is missing or unusable.
        """
        return cls(config, peer=peer, check=ServerCheck.load(tls, config=config, peer=peer))

    def _details(self, details: Any, nonce: bytes) -> _Details:
        metadata = (
            *tuple(details.metadata or ()),
            (HASH_HEADER, self._hash),
            (REVOCATION_HEADER, self._revocations),
            (NONCE_HEADER, nonce),
        )
        return _Details(details, metadata)

    def _verify(self, metadata: Any, nonce: bytes) -> None:
        received = dict(metadata or ())
        check_peer_hash(received, expected=self._hash, peer=self._peer)
        theirs = received.get(REVOCATION_HEADER, "")
        if theirs != self._revocations:
            raise ProtocolError(
                revocation_mismatch(self._peer, theirs=theirs, ours=self._revocations, config=self._config)
            )
        self._server.verify(received, nonce=nonce)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        nonce = self._server.nonce()
        outcome = continuation(self._details(details, nonce), request)
        if outcome.exception() is None:
            self._verify(outcome.initial_metadata(), nonce)
        return outcome

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        nonce = self._server.nonce()
        call = continuation(self._details(details, nonce), request_iterator)
        return _CheckedStream(call, lambda: self._verify(call.initial_metadata(), nonce))


class _CheckedStream:
    """A client stream call whose server is checked before its first message is handed out (every other
    attribute is the call's own: ``cancel``, ``initial_metadata``, ``code`` …)."""

    def __init__(self, call: Any, verify: Callable[[], None]) -> None:
        self._call = call
        self._verify: Callable[[], None] | None = verify

    def __iter__(self) -> _CheckedStream:
        return self

    def __next__(self) -> Any:
        message = next(self._call)
        if self._verify is not None:
            self._verify()
            self._verify = None
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

"""gRPC face of the student: the teachers' work streams."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from capc_common.errors import CapcError, ProtocolError
from capc_common.federation import FederationConfig
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_from_proto, rpc
from capc_services.common.interceptors import peer_name
from capc_services.student.links import Answer, IdentityInUse, RegistryClosed, TeacherLink, TeacherRegistry

_log = logging.getLogger(__name__)
POLICY = {f"/{rpc.STUDENT_SERVICE}/Work": frozenset({"teacher"})}
_REASONS = {v: k.removeprefix("REFUSAL_REASON_").lower() for k, v in pb.RefusalReason.items()}


class StudentServicer(rpc.StudentServiceServicer):
    """Implements ``capc.v1.StudentService``: registers each teacher's stream and routes its answers."""

    def __init__(self, *, config: FederationConfig, registry: TeacherRegistry) -> None:
        self._config = config
        self._registry = registry

    def _read(self, link: TeacherLink, requests: Iterator[pb.TeacherMessage]) -> None:
        try:
            for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "share":
                    share = message.share
                    try:
                        array = ndarray_from_proto(share.share)
                    except ProtocolError as exc:
                        answer = Answer(party=link.party, refusal=f"malformed share: {exc}")
                    else:
                        answer = Answer(
                            party=link.party,
                            share=array,
                            timings={
                                "generation": share.generation_s,
                                "inference": share.inference_s,
                                "sharing": share.sharing_s,
                            },
                        )
                    self._registry.deliver(
                        link, batch_id=share.batch_id, attempt=share.attempt, answer=answer
                    )
                elif kind == "refusal":
                    ref = message.refusal
                    reason = f"{_REASONS.get(ref.reason, 'unspecified')}: {ref.detail}"
                    _log.info(
                        "teacher refused",
                        extra={"teacher": link.party, "batch_id": ref.batch_id, "reason": reason},
                    )
                    self._registry.deliver(
                        link,
                        batch_id=ref.batch_id,
                        attempt=ref.attempt,
                        answer=Answer(party=link.party, refusal=reason),
                    )
                else:
                    _log.warning(
                        "unexpected message on work stream", extra={"teacher": link.party, "kind": kind}
                    )
        except grpc.RpcError:
            pass  # the stream ended (teacher gone or shutting down)
        except CapcError as exc:  # an undecodable message: the stream ends, the party reconnects
            _log.warning("work stream ended", extra={"teacher": link.party, "error": str(exc)})
        finally:
            self._registry.disconnect(link)

    def Work(
        self, request_iterator: Iterator[pb.TeacherMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.StudentMessage]:
        party = peer_name(context)
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        except CapcError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            if first.WhichOneof("kind") != "hello":
                raise ProtocolError(
                    f"{party} opened its work stream with {first.WhichOneof('kind')}, not hello"
                )
            hello = first.hello
            if hello.party != party:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"certificate CN {party!r} introduced itself as {hello.party!r}",
                )
            expected = self._config.teacher(party).heads
            if hello.heads != expected:
                raise ProtocolError(
                    f"{party} serves {hello.heads} teacher heads but federation.yaml gives it {expected}; "
                    "fix the party's heads file or the federation config"
                )
        except CapcError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        try:
            link = self._registry.connect(
                party, heads=hello.heads, instance=hello.instance, process=hello.process
            )
        except IdentityInUse as exc:
            _log.warning("second process of a party refused", extra={"teacher": party, "error": str(exc)})
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except RegistryClosed as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        context.add_callback(lambda: self._registry.disconnect(link))
        threading.Thread(
            target=self._read, args=(link, request_iterator), name=f"read-{party}", daemon=True
        ).start()
        yield pb.StudentMessage(
            welcome=pb.StudentWelcome(student=self._config.student, config_hash=self._config.config_hash())
        )
        yield from link.outgoing()


def add_to_server(servicer: Any) -> Any:
    """A registration callback for :func:`~capc_services.common.runtime.start_grpc_server` (any
    ``StudentService`` servicer: this one, or a release federation's)."""
    return lambda server: rpc.add_StudentServiceServicer_to_server(servicer, server)

"""The student's view of connected teacher parties: one work stream each, and per-batch answer collection.

A teacher party dials in and keeps a stream open; the student pushes work items down every live stream and
a :class:`Collection` gathers the answers (a vote share or a refusal) of one batch attempt. A stream that
breaks (a killed teacher) counts as "will not answer" at once, so a batch never waits out its deadline for a
party that is gone.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capc_common.wire import messages as pb

_log = logging.getLogger(__name__)
_END = object()


class IdentityInUse(Exception):
    """Another process of the same party already holds a live work stream (the message names it)."""


class RegistryClosed(Exception):
    """The student is shutting down: no new work stream is taken."""


@dataclass
class TeacherLink:
    """One connected teacher party's work stream.

    Attributes:
        instance: the random id of the process at the other end (its hello), to tell its own reconnection
            from another process of the same party.
        process: what that process says it is (pid, host, start time), for messages.
    """

    party: str
    heads: int
    instance: str = ""
    process: str = ""
    connected_at: float = field(default_factory=time.time)
    alive: bool = True
    answered: int = 0
    refused: int = 0
    _outgoing: queue.Queue[Any] = field(default_factory=queue.Queue)

    def send(self, message: pb.StudentMessage) -> None:
        """Queue a message for the teacher."""
        self._outgoing.put(message)

    def close(self) -> None:
        """End the stream from the student's side."""
        self.alive = False
        self._outgoing.put(_END)

    def outgoing(self) -> Any:
        """Messages for the gRPC response stream, until :meth:`close`."""
        while True:
            item = self._outgoing.get()
            if item is _END:
                return
            yield item


@dataclass
class Answer:
    """One party's answer to a work item: its share of the votes, or why it refused."""

    party: str
    share: np.ndarray | None = None
    refusal: str = ""
    timings: dict[str, float] = field(default_factory=dict)


class Collection:
    """Answers to one batch attempt from the parties it was sent to."""

    def __init__(self, *, batch_id: str, attempt: int, parties: tuple[str, ...]) -> None:
        self.batch_id = batch_id
        self.attempt = attempt
        self.parties = parties
        self._answers: dict[str, Answer] = {}
        self._cond = threading.Condition()
        self.closed = False

    def deliver(self, answer: Answer) -> None:
        """Record a party's answer (the first one per party counts)."""
        with self._cond:
            if answer.party in self.parties and answer.party not in self._answers:
                self._answers[answer.party] = answer
                self._cond.notify_all()

    def close(self) -> None:
        """Stop waiting (the student shuts down): :meth:`wait` returns the answers so far at once."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait(self, *, timeout: float) -> dict[str, Answer]:
        """Block until every party answered, ``timeout`` seconds passed or the collection was closed; returns
        the answers so far."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._answers) < len(self.parties) and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
            return dict(self._answers)


class TeacherRegistry:
    """Live teacher links and the collections waiting for their answers (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._links: dict[str, TeacherLink] = {}
        self._collections: dict[tuple[str, int], Collection] = {}
        self._closed = False  # close_all ran: no new stream, no new wait for answers

    def connect(self, party: str, *, heads: int, instance: str = "", process: str = "") -> TeacherLink:
        """Register a new stream for ``party``, closing an older one of the same process (a reconnection).

        One identity answers over one stream: two processes of one party would otherwise replace each
        other's stream for ever, and each would answer under its own cap.

        Raises:
            IdentityInUse: another process (another ``instance``) of ``party`` holds a live stream.
        """
        link = TeacherLink(party=party, heads=heads, instance=instance, process=process)
        with self._lock:
            if self._closed:
                raise RegistryClosed("the student is shutting down; try again later")
            old = self._links.get(party)
            if old is not None and old.alive and old.instance != instance:
                since = datetime.datetime.fromtimestamp(old.connected_at, datetime.UTC)
                raise IdentityInUse(
                    f"another process of {party} ({old.process or 'it did not say which'}) is connected "
                    f"since {since.isoformat(timespec='seconds')}; one party answers over one work stream. "
                    f"Stop one of them (this one is {process or 'unnamed'}; it backs off and takes over "
                    "once the other is gone)"
                )
            self._links[party] = link
            self._lock.notify_all()
        if old is not None:
            old.close()
        _log.info("teacher connected", extra={"teacher": party, "heads": heads})
        return link

    def disconnect(self, link: TeacherLink) -> None:
        """Forget a broken stream; batches waiting on it get a refusal at once."""
        link.close()
        with self._lock:
            if self._links.get(link.party) is not link:
                return  # an older stream of a party that has reconnected since, or already gone
            del self._links[link.party]
            waiting = [c for c in self._collections.values() if link.party in c.parties]
            self._lock.notify_all()
        for collection in waiting:
            collection.deliver(Answer(party=link.party, refusal="work stream closed (party disconnected)"))
        _log.warning("teacher disconnected", extra={"teacher": link.party})

    def live(self) -> dict[str, TeacherLink]:
        """The currently connected parties."""
        with self._lock:
            return {p: link for p, link in self._links.items() if link.alive}

    def wait_for(self, count: int, *, timeout: float, stop: threading.Event) -> bool:
        """Wait until at least ``count`` parties are connected; False on timeout or stop."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._links) < count and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                self._lock.wait(timeout=min(left, 0.5))
            return not self._closed

    def dispatch(self, item: pb.WorkItem) -> Collection:
        """Send a work item to every live party and return the collection of their answers."""
        with self._lock:
            links = [link for link in self._links.values() if link.alive]
            collection = Collection(
                batch_id=item.batch_id,
                attempt=item.attempt,
                parties=tuple(sorted(link.party for link in links)),
            )
            self._collections[(item.batch_id, item.attempt)] = collection
            if self._closed:
                collection.close()  # shutting down: nothing is sent, the caller leaves the batch open
                return collection
        message = pb.StudentMessage(work=item)
        for link in links:
            link.send(message)
        return collection

    def finish(self, collection: Collection) -> None:
        """Stop routing answers to a collection."""
        with self._lock:
            self._collections.pop((collection.batch_id, collection.attempt), None)

    def deliver(self, link: TeacherLink, *, batch_id: str, attempt: int, answer: Answer) -> None:
        """Route an answer from ``link`` to its collection (late or unknown answers are dropped)."""
        if answer.share is not None:
            link.answered += 1
        else:
            link.refused += 1
        with self._lock:
            collection = self._collections.get((batch_id, attempt))
        if collection is None:
            _log.info("late answer dropped", extra={"teacher": link.party, "batch_id": batch_id})
            return
        collection.deliver(answer)

    def close_all(self) -> None:
        """End every stream and every wait for answers (shutdown): a batch being collected does not hold
        the student for its vote deadline (seconds of every shutdown, measured) for answers no stream can
        bring."""
        with self._lock:
            self._closed = True
            links = list(self._links.values())
            self._links.clear()
            collections = list(self._collections.values())
            self._lock.notify_all()
        for link in links:
            link.close()
        for collection in collections:
            collection.close()

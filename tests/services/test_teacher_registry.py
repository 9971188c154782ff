"""The student's teacher registry: dispatch, collection, and parties that disconnect mid-batch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from capc_common.wire import messages as pb
from capc_services.student.links import Answer, IdentityInUse, RegistryClosed, TeacherRegistry


def _item(batch_id: str = "b0", attempt: int = 1) -> pb.WorkItem:
    return pb.WorkItem(batch_id=batch_id, attempt=attempt, ring_width=12, classes=10)


def test_dispatch_reaches_every_live_party_and_collects_answers() -> None:
    registry = TeacherRegistry()
    a = registry.connect("hospital-a", heads=2)
    b = registry.connect("hospital-b", heads=3)
    collection = registry.dispatch(_item())
    assert collection.parties == ("hospital-a", "hospital-b")
    assert next(a.outgoing()).work.batch_id == "b0"
    assert next(b.outgoing()).work.batch_id == "b0"
    registry.deliver(a, batch_id="b0", attempt=1, answer=Answer(party="hospital-a", share=np.zeros((1, 10))))
    registry.deliver(b, batch_id="b0", attempt=1, answer=Answer(party="hospital-b", refusal="local cap"))
    answers = collection.wait(timeout=5)
    assert answers["hospital-a"].share is not None
    assert answers["hospital-b"].refusal == "local cap"
    assert (a.answered, b.refused) == (1, 1)


def test_disconnected_party_does_not_hold_up_the_batch() -> None:
    registry = TeacherRegistry()
    a = registry.connect("hospital-a", heads=2)
    registry.connect("hospital-b", heads=3)
    collection = registry.dispatch(_item())
    registry.deliver(a, batch_id="b0", attempt=1, answer=Answer(party="hospital-a", share=np.zeros((1, 10))))
    threading.Timer(0.2, lambda: registry.disconnect(registry.live()["hospital-b"])).start()
    start = time.monotonic()
    answers = collection.wait(timeout=30)
    assert time.monotonic() - start < 5
    assert "disconnected" in answers["hospital-b"].refusal
    assert sorted(registry.live()) == ["hospital-a"]


def test_shutdown_ends_a_collection_at_once_without_inventing_answers() -> None:
    """close_all (the student stopping) wakes a batch waiting for its teachers: the wait returns the answers
    so far at once, not after the vote deadline, and marks the collection closed (the scheduler then leaves
    the batch open for the next start instead of aborting it for a quorum the shutdown broke)."""
    registry = TeacherRegistry()
    a = registry.connect("hospital-a", heads=2)
    registry.connect("hospital-b", heads=3)
    collection = registry.dispatch(_item())
    registry.deliver(a, batch_id="b0", attempt=1, answer=Answer(party="hospital-a", share=np.zeros((1, 10))))
    threading.Timer(0.2, registry.close_all).start()
    started = time.monotonic()
    answers = collection.wait(timeout=30)
    assert time.monotonic() - started < 5
    assert collection.closed and set(answers) == {"hospital-a"}
    assert not registry.live()
    # After the close nothing new waits: a reconnecting party's stream ends at once, a batch dispatched
    # now is closed before anything is sent, and waiting for parties gives up.
    with pytest.raises(RegistryClosed, match="shutting down"):
        registry.connect("hospital-a", heads=2, instance="again")
    assert not registry.live()
    late = registry.dispatch(_item("b1"))
    assert late.closed and late.wait(timeout=30) == {}
    assert not registry.wait_for(1, timeout=30, stop=threading.Event())


def test_late_and_foreign_answers_are_dropped() -> None:
    registry = TeacherRegistry()
    a = registry.connect("hospital-a", heads=2)
    collection = registry.dispatch(_item(attempt=2))
    registry.deliver(a, batch_id="b0", attempt=1, answer=Answer(party="hospital-a", refusal="old attempt"))
    collection.deliver(Answer(party="stranger", refusal="x"))
    assert collection.wait(timeout=0.1) == {}
    registry.finish(collection)
    registry.deliver(a, batch_id="b0", attempt=2, answer=Answer(party="hospital-a", refusal="too late"))
    assert collection.wait(timeout=0.1) == {}


def test_reconnect_replaces_the_old_stream() -> None:
    registry = TeacherRegistry()
    old = registry.connect("hospital-a", heads=2)
    new = registry.connect("hospital-a", heads=2)
    assert not old.alive
    assert list(old.outgoing()) == []
    registry.disconnect(old)  # the old stream's reader ending must not drop the new link
    assert registry.live() == {"hospital-a": new}
    stop = threading.Event()
    assert registry.wait_for(1, timeout=0.1, stop=stop)
    assert not registry.wait_for(2, timeout=0.1, stop=stop)


def test_another_process_of_a_party_is_refused_while_its_stream_lives() -> None:
    """Issue 25.3: two processes of one party used to replace each other's stream for ever (both reconnecting
    every 0.5 s with an empty error). The same process reconnecting still replaces its stream; another one is
    refused, named, until the live one is gone."""
    registry = TeacherRegistry()
    first = registry.connect("hospital-a", heads=2, instance="aaaa", process="pid 1 on host h, started T")
    named = r"another process of hospital-a \(pid 1 on host h, started T\) is connected since 20\d\d-"
    with pytest.raises(IdentityInUse, match=named + r".*this one is pid 2"):
        registry.connect("hospital-a", heads=2, instance="bbbb", process="pid 2 on host h, started U")
    assert registry.live() == {"hospital-a": first} and first.alive
    again = registry.connect("hospital-a", heads=2, instance="aaaa", process="pid 1 on host h, started T")
    assert not first.alive and registry.live() == {"hospital-a": again}
    registry.disconnect(again)
    other = registry.connect("hospital-a", heads=2, instance="bbbb", process="pid 2 on host h, started U")
    assert registry.live() == {"hospital-a": other}

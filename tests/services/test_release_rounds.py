"""The student's side of the releases: what a teacher party polls for, and which shares it keeps."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from sites_harness import federation_dict

from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.student.releases import ReleaseRounds

LENGTH = 5


def _rounds(**quorum: float) -> ReleaseRounds:
    q = {"min_parties": 1, "vote_deadline_s": 0.2, "share_deadline_s": 1, **quorum}
    config = FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 1.0}, quorum=q))
    return ReleaseRounds(config, length=LENGTH)


def test_a_party_is_offered_each_open_release_once() -> None:
    rounds = _rounds()
    assert rounds.next_for("hospital-a", timeout=0.01).pending
    rounds.open("r0", round=0, state=np.arange(3.0))
    item = rounds.next_for("hospital-a", timeout=0.01)
    assert (item.release_id, item.round, item.length) == ("r0", 0, LENGTH)
    assert rounds.deliver(release_id="r0", party="hospital-a", share=np.zeros(LENGTH, dtype=np.int64)) == 1
    assert rounds.next_for("hospital-a", timeout=0.01).pending  # it contributed: nothing more for it
    assert rounds.next_for("hospital-b", timeout=0.01).release_id == "r0"
    rounds.finish()
    assert rounds.next_for("hospital-a", timeout=0.01).done


@pytest.mark.parametrize(
    ("release_id", "share", "match"),
    [
        ("r0", np.zeros(LENGTH + 1, dtype=np.int64), r"expected int64 \(5,\)"),
        ("r0", np.zeros(LENGTH, dtype=np.int32), r"expected int64 \(5,\)"),
        ("r0", np.full(LENGTH, -1, dtype=np.int64), r"outside \[0, 2\^62\)"),
        ("r9", np.zeros(LENGTH, dtype=np.int64), "release r9 is not open for shares"),
    ],
)
def test_malformed_or_misdirected_shares_are_refused(release_id: str, share: np.ndarray, match: str) -> None:
    rounds = _rounds()
    rounds.open("r0", round=0, state=np.zeros(0))
    with pytest.raises(InputError, match=match):
        rounds.deliver(release_id=release_id, party="hospital-a", share=share)
    assert rounds.next_for("hospital-a", timeout=0.01).release_id == "r0"  # nothing was kept


def test_collect_waits_for_everyone_or_a_quorum_after_the_deadline() -> None:
    rounds = _rounds(min_parties=1, vote_deadline_s=0.3)
    rounds.open("r0", round=0, state=np.zeros(0))
    share = np.ones(LENGTH, dtype=np.int64)
    rounds.deliver(release_id="r0", party="hospital-b", share=share)
    with pytest.raises(InputError, match="already delivered"):
        rounds.deliver(release_id="r0", party="hospital-b", share=share)
    collected = rounds.collect(stop=threading.Event())  # hospital-a never came: the quorum after 0.3 s
    assert list(collected) == ["hospital-b"]
    with pytest.raises(InputError, match="not open for shares"):  # closed once collected
        rounds.deliver(release_id="r0", party="hospital-a", share=share)

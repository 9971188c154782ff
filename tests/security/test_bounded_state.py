"""The guardian's state keyed by numbers and ids its callers choose stays bounded per party: a teacher sending
seeds for ever new attempts of a batch, or for ever new release ids, replaces its own oldest and leaves the
other parties' seeds alone (tracemalloc over 2,000 of them after 2,000 more; the real guardian objects)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from doors_harness import OPTIONS, ledger_of

from capc_common.aggregation import party_noise
from capc_common.federation import FederationConfig
from capc_common.federation.releases import protocol_for
from capc_common.privacy import BudgetLedger
from capc_services.common.metrics import PartyMetrics
from capc_services.guardian.core import Guardian
from capc_services.guardian.releases import ReleaseGuardian
from capc_services.local.provision import federation_dict
from capc_services.tls import CertificateInfo

FLOOD = 2000
RETAINED_LIMIT = 64 << 10  # bytes: 2,000 seeds held would take ten times that


def _parts(tmp_path: Path, config: FederationConfig) -> tuple[BudgetLedger, PartyMetrics]:
    ledger = ledger_of(config, tmp_path / "ledger.sqlite")
    expiry = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    metrics = PartyMetrics(
        party="guardian",
        role="guardian",
        config_hash=config.config_hash(),
        certificate=CertificateInfo(common_name="guardian", not_after=expiry),
    )
    return ledger, metrics


def _retained(flood: Callable[[int], object]) -> int:
    """Bytes still allocated after ``FLOOD`` more calls of ``flood`` than a first ``FLOOD`` (which fill what
    caches beside the guardian keep, e.g. numpy's small blocks: bounded, and not the guardian's)."""
    for i in range(FLOOD):
        flood(i)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(FLOOD, 2 * FLOOD):
            flood(i)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_seeds_for_ever_new_attempts_are_bounded_per_party(tmp_path: Path) -> None:
    config = FederationConfig.from_dict(federation_dict(OPTIONS))
    ledger, metrics = _parts(tmp_path, config)
    guardian = Guardian(
        config=config, ledger=ledger, noise=party_noise("guardian", seed="s"), metrics=metrics
    )
    count = config.queries.batch_size
    guardian.open_batch(batch_id="b", count=count, digest=b"\1" * 32, actor="student")
    shape = (count, config.classes)
    honest = ("hospital-2", "hospital-3")
    for party in honest:
        guardian.submit_shares(batch_id="b", attempt=1, party=party, seed=b"\2" * 16, shape=shape)

    def flood(i: int) -> object:
        return guardian.submit_shares(
            batch_id="b", attempt=2 + i, party="hospital-1", seed=b"\3" * 16, shape=shape
        )

    retained = _retained(flood)
    assert retained < RETAINED_LIMIT, f"{FLOOD} attempts kept {retained} bytes"
    # the other parties' seeds of attempt 1 are still there: the batch is agreed over them
    agreement = guardian.agree(batch_id="b", attempt=1, parties=honest, actor="student")
    assert agreement.parties == honest
    ledger.close()


def test_seeds_for_ever_new_release_ids_are_bounded_per_party(tmp_path: Path) -> None:
    config = FederationConfig.from_dict(federation_dict(dataclasses.replace(OPTIONS, mechanism="dppl")))
    ledger, metrics = _parts(tmp_path, config)
    protocol = protocol_for(config, dim=6)
    guardian = ReleaseGuardian(
        config=config,
        ledger=ledger,
        noise=party_noise("guardian", seed="s"),
        protocol=protocol,
        metrics=metrics,
    )
    length = protocol.length
    for party in ("hospital-2", "hospital-3"):
        guardian.submit_contribution(
            release_id="r-honest", round=0, party=party, seed=b"\2" * 16, length=length
        )

    def flood(i: int) -> object:
        return guardian.submit_contribution(
            release_id=f"r{i:08d}", round=0, party="hospital-1", seed=b"\3" * 16, length=length
        )

    retained = _retained(flood)
    assert retained < RETAINED_LIMIT, f"{FLOOD} release ids kept {retained} bytes"
    # the honest parties' pending release is untouched: it is released over their seeds
    released = guardian.release(
        release_id="r-honest", round=0, parties=("hospital-2", "hospital-3"), actor="student"
    )
    assert released.masked.shape == (length,)
    ledger.close()

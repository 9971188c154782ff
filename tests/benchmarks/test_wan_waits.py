"""``benchmarks/wan.py`` waits for the federation: a wait that can no longer end well ends at once, with the
reason, instead of after its timeout (a release federation that finished its plan makes no more releases:
the benchmark used to wait ten minutes for them, its federation up, and printed no JSON)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import wan

from capc_common.federation import FederationConfig
from capc_common.federation.releases import protocol_for
from capc_common.privacy import BudgetLedger
from capc_services.local.provision import federation_dict


def test_a_wait_ends_at_once_when_the_plan_is_spent() -> None:
    started = time.monotonic()
    with pytest.raises(click.ClickException, match="finished its plan first") as raised:
        wan._wait(lambda: False, timeout=600, what="3 releases at 80 ms", ended=lambda: True)
    assert "3 releases at 80 ms" in raised.value.message
    assert time.monotonic() - started < 1.0


def test_a_condition_met_as_the_plan_ends_is_met() -> None:
    """The plan's last release may be the one waited for: ``ended`` then does not turn it into an error."""
    polls: list[int] = []

    def made() -> bool:  # the release lands between the first look and the check of the plan
        polls.append(1)
        return len(polls) > 1

    wan._wait(made, timeout=5, what="the last release", ended=lambda: True)


def test_the_release_plan_fits_its_budget(tmp_path: Path) -> None:
    """The plan pays for the releases made while each row shapes links and reads counters, at the fastest
    release (thousands of rounds, not the hundred or so the rows time): the federation must accept it, and
    the guardian must open a ledger for its budget. The full run's plan is the larger, under the same
    budget."""
    smoke, full = (wan.release_rounds(wan.SMOKE_ROWS, per_row=10), wan.release_rounds(wan.ROWS, per_row=50))
    assert len(wan.ROWS) * wan.ROW_OVERHEAD_S / wan.RELEASE_FLOOR_S <= full and smoke <= full
    config = FederationConfig.from_dict(federation_dict(wan.release_options(smoke=False, rounds=full)))
    assert protocol_for(config, dim=32).rounds == full + 1  # the statistics release, then the rounds
    b = config.budget
    BudgetLedger.create(
        tmp_path / "ledger.sqlite", epsilon_limit=b.epsilon, delta=b.delta, config={}, order=b.order
    ).close()

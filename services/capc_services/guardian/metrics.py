"""The guardian's budget on ``/metrics``, read from the ledger at each scrape (never a stale copy).

The chain head is exported too (``capc_ledger_head_info{head=…}``, and logged after each settle), so a
monitoring system keeps a trail of pinned heads: ``capc budget verify --expect-head HASH`` with any of them
fails if entries were later cut from the ledger's end, which the chain alone cannot show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from capc_common.privacy import Entry

_GAUGES = (
    ("capc_epsilon_spent", "epsilon_spent", "ε charged: settled batches plus open worst-case reservations."),
    ("capc_epsilon_settled", "epsilon_settled", "ε of settled batches only (never falls)."),
    ("capc_epsilon_reserved", "epsilon_reserved", "What open worst-case reservations add to ε."),
    ("capc_epsilon_limit", "epsilon_limit", "The federation's ε budget."),
    ("capc_budget_remaining_rdp", "remaining_rdp", "RDP left at the ledger's order."),
    ("capc_ledger_entries", "entries", "Entries in the ledger's hash chain."),
    ("capc_ledger_open_batches", "open_batches", "Batches reserved and not yet settled or released."),
    ("capc_queries_answered", "answered", "Queries answered in settled batches."),
)


def pinned_head(entry: Entry) -> dict[str, int | str]:
    """The log fields of a settle's ledger entry (``ledger_entry``, ``ledger_head``): every settle path (a
    batch's, a release's) logs them, so a log collector keeps the trail of heads to pin."""
    return {"ledger_entry": entry.seq, "ledger_head": entry.hash}


class BudgetCollector(Collector):
    """Prometheus collector over the guardian's budget summary (``Guardian.budget``).

    Args:
        budget: returns the summary; called once per scrape.
    """

    def __init__(self, budget: Callable[[], dict[str, Any]]) -> None:
        self._budget = budget

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        summary = self._budget()
        for name, key, documentation in _GAUGES:
            yield GaugeMetricFamily(name, documentation, value=float(summary[key]))
        head = InfoMetricFamily(
            "capc_ledger_head", "Hash of the ledger's newest entry (pin it: verify --expect-head)."
        )
        head.add_metric([], {"head": summary["head"]})
        yield head

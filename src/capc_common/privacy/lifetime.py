"""A hospital's lifetime budget: one Rényi filter over what every federation charges on its records.

Each federation bounds its own spend (its guardian's ledger; each party's own cap record), and each starts
at ε 0. A hospital's records are the same in all of them, so their charges on those records add up. This
account holds them under one limit the hospital sets, at one Rényi order fixed when its ledger was created
(:mod:`capc_common.privacy.analysis.composition` says why one order, and how a charge is stated at it).

**Reservations: refuse before spending.** A federation a hospital joins reserves its planned charge — the
worst case of everything it may charge under its plan and the hospital's per-federation cap — and a
federation is refused at joining when its plan does not fit beside what the others spent or reserved,
rather than stopped half-way. A charge is admitted only while the federation's own spend, plus everything
the others spent or reserved, stays within the limit. Closing a finished federation returns its unspent
reservation. Either way the charges admitted never sum above the limit: the filter's guarantee holds.

**Limits.** The limit comes from the hospital's site file; a change is recorded, and the guarantee of
everything admitted is the largest limit ever set (each charge was admitted below the limit of its time).

The account is pure state: the site ledger (a durable, locked file of the entries this module reads) folds
its entries in with :meth:`LifetimeAccount.apply` and asks :meth:`~LifetimeAccount.check_join` /
:meth:`~LifetimeAccount.check_charge` before it appends one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from capc_common.errors import BudgetExhaustedError, InputError
from capc_common.privacy.analysis import (
    delta_with_sampler_distance,
    epsilon_at_order,
    epsilon_holding,
    rdp_budget_at_order,
)
from capc_common.privacy.analysis._checks import non_negative, positive, probability

__all__ = ["NEIGHBOURING", "FederationSpend", "LifetimeAccount"]

#: The neighbouring relation every charge is stated for: datasets that differ by adding or removing one
#: example (DESIGN §4). A charge stated for replace-one would count twice under it.
NEIGHBOURING = "add/remove"


@dataclass
class FederationSpend:
    """What one federation (with every membership change it continued through) charged the hospital.

    Attributes:
        name: the federation's name.
        hashes: its config hashes (the one it joined with and those it continued from).
        planned_rdp: its planned charge at the account's order (its latest join).
        charges: each admitted charge's RDP at the account's order.
        cap_lines: how many lines of the federation's cap record these charges account for.
        closed: the hospital closed it: its unspent reservation is returned.
        sampler_tv: the total-variation distance of its released outputs from exact noise's (δ's share of
            its samplers, before the ``1 + e^ε`` factor).
    """

    name: str
    hashes: set[str]
    planned_rdp: float = 0.0
    charges: list[float] = field(default_factory=list)
    cap_lines: int = 0
    closed: bool = False
    sampler_tv: float = 0.0

    @property
    def spent_rdp(self) -> float:
        """RDP charged so far."""
        return math.fsum(self.charges)

    @property
    def reserved_rdp(self) -> float:
        """What it holds of the limit: its spend, or its plan while it is open and has not spent it."""
        return self.spent_rdp if self.closed else max(self.planned_rdp, self.spent_rdp)


@dataclass
class LifetimeAccount:
    """Every federation's charges on one hospital's records, under one limit at one order.

    Build it from the ledger's first entry (:meth:`from_header`) and fold in the rest with :meth:`apply`.

    Attributes:
        limits: every limit set, first to last (the current one is the last).
        delta: the lifetime δ.
        order: the order every charge is stated at.
        federations: the federations joined, in order.
    """

    limits: list[float]
    delta: float
    order: float
    federations: list[FederationSpend] = field(default_factory=list)

    @classmethod
    def from_header(cls, entry: Mapping[str, Any]) -> LifetimeAccount:
        """The empty account of a ledger's first entry (``kind: init``).

        Raises:
            InputError: a missing or invalid field, or a neighbouring relation other than add/remove.
        """
        if entry.get("kind") != "init":
            raise InputError(f"a site ledger starts with its init entry, not {entry.get('kind')!r}")
        if entry.get("neighbouring", NEIGHBOURING) != NEIGHBOURING:
            raise InputError(
                f"the site ledger counts charges under {entry['neighbouring']!r}; this version states every "
                f"charge for {NEIGHBOURING!r} neighbours"
            )
        epsilon, delta = positive("epsilon", entry["epsilon"]), probability("delta", entry["delta"])
        order = float(entry["order"])
        rdp_budget_at_order(epsilon=epsilon, delta=delta, order=order)  # a limit no RDP meets is refused
        return cls(limits=[epsilon], delta=delta, order=order)

    # ------------------------------------------------------------------ reading
    @property
    def limit(self) -> float:
        """The current lifetime limit ε."""
        return self.limits[-1]

    @property
    def guarantee(self) -> float:
        """The ε every admitted charge together is guaranteed within: the largest limit ever set."""
        return max(self.limits)

    @property
    def budget_rdp(self) -> float:
        """The current limit in RDP at the account's order (improved conversion).

        Raises:
            InputError: the limit cannot be met at this order.
        """
        return rdp_budget_at_order(epsilon=self.limit, delta=self.delta, order=self.order)

    @property
    def spent_rdp(self) -> float:
        """RDP charged by every federation together."""
        return math.fsum(c for f in self.federations for c in f.charges)

    @property
    def delta_sampler(self) -> float:
        """What the federations' noise samplers add to the lifetime δ at the guarantee's ε: their outputs are
        within the sum of their total-variation bounds of exact noise's
        (:func:`~capc_common.privacy.analysis.delta_with_sampler_distance`)."""
        distance = math.fsum(f.sampler_tv for f in self.federations)
        return delta_with_sampler_distance(epsilon=self.guarantee, draws=1, distance=distance)

    def reserved_rdp(self, *, besides: FederationSpend | None = None) -> float:
        """What the federations other than ``besides`` hold of the limit (spent, or reserved while open)."""
        return math.fsum(f.reserved_rdp for f in self.federations if f is not besides)

    def epsilon_of(self, rdp: float) -> float:
        """ε at the lifetime δ of an RDP total at the account's order (0 for nothing)."""
        if rdp <= 0:
            return 0.0
        return max(0.0, float(epsilon_at_order(self.order, rdp, delta=self.delta)))

    def federation(self, config_hash: str) -> FederationSpend | None:
        """The federation a config hash belongs to (None: never joined)."""
        return next((f for f in self.federations if config_hash in f.hashes), None)

    def joined(self, hashes: Collection[str]) -> FederationSpend | None:
        """The federation any of ``hashes`` belongs to (a membership change continues it)."""
        return next((f for f in self.federations if f.hashes & set(hashes)), None)

    # ------------------------------------------------------------------ checks
    def check_join(self, *, name: str, hashes: Collection[str], planned_rdp: float) -> None:
        """Refuse a federation whose planned charge does not fit beside what the others hold.

        Raises:
            BudgetExhaustedError: with the plan, what the others hold, and the limit that would fit.
        """
        plan = non_negative("planned_rdp", planned_rdp)
        own = self.joined(hashes)
        others = self.reserved_rdp(besides=own)
        need = others + max(plan, own.spent_rdp if own else 0.0)
        if need <= self.budget_rdp:
            return
        raise BudgetExhaustedError(
            f"this hospital's lifetime budget cannot take federation {name!r}: its plan may charge up to "
            f"ε {self.epsilon_of(plan):.3g} on the hospital's records (RDP {plan:.6g} at order "
            f"{self.order:g}), and {self._held(besides=own)}; the lifetime limit ε {self.limit:g} (δ "
            f"{self.delta:g}) holds RDP {self.budget_rdp:.6g}. Nothing was charged. A lifetime limit of "
            f"ε {epsilon_holding(need, delta=self.delta, order=self.order):g} would take it"
        )

    def check_charge(self, *, config_hash: str, rdp: float, what: str) -> FederationSpend:
        """Refuse a charge that would cross the limit beside what the other federations hold.

        Returns:
            The federation charged.

        Raises:
            InputError: the federation never joined (a charge comes after its join).
            BudgetExhaustedError: the charge does not fit (nothing is recorded).
        """
        cost = non_negative("rdp", rdp)
        own = self.federation(config_hash)
        if own is None:
            raise InputError(f"federation config {config_hash[:16]} never joined this site ledger")
        held = self.reserved_rdp(besides=own) + own.spent_rdp
        if held + cost <= self.budget_rdp:
            return own
        raise BudgetExhaustedError(
            f"this hospital's lifetime budget is exhausted: {what} needs RDP {cost:.6g} at order "
            f"{self.order:g}; federation {own.name!r} spent RDP {own.spent_rdp:.6g} and "
            f"{self._held(besides=own)}, of RDP {self.budget_rdp:.6g} (ε {self.limit:g}, δ {self.delta:g}). "
            "Nothing was charged"
        )

    def _held(self, *, besides: FederationSpend | None) -> str:
        others = [f for f in self.federations if f is not besides and f.reserved_rdp > 0]
        if not others:
            return "no other federation holds any of the limit"
        names = ", ".join(f"{f.name!r} RDP {f.reserved_rdp:.6g}" for f in others)
        return (
            f"{len(others)} other federation(s) hold RDP {self.reserved_rdp(besides=besides):.6g} ({names})"
        )

    # ------------------------------------------------------------------ folding entries
    def apply(self, entry: Mapping[str, Any]) -> None:
        """Fold one ledger entry in (``limit``, ``join``, ``adopt``, ``charge`` or ``close``).

        Entries were checked when written; this only reads them.

        Raises:
            KeyError, TypeError, ValueError: a malformed entry (the ledger reports it as corrupt).
        """
        kind = entry["kind"]
        if kind == "limit":
            self.limits.append(positive("epsilon", entry["epsilon"]))
        elif kind == "join":
            hashes = {str(h) for h in entry["hashes"]}
            own = self.joined(hashes)
            if own is None:
                own = FederationSpend(name=str(entry["federation"]), hashes=hashes)
                self.federations.append(own)
            own.hashes |= hashes
            own.planned_rdp = non_negative("planned_rdp", entry["planned_rdp"])
            own.sampler_tv = max(own.sampler_tv, non_negative("sampler_tv", entry.get("sampler_tv", 0.0)))
            own.closed = False
        elif kind in ("adopt", "charge"):
            spend = self.federation(str(entry["config_hash"]))
            if kind == "adopt":  # counted in at a join: the federation it continues, by any of its hashes
                hashes = {str(h) for h in entry["hashes"]}
                spend = self.joined(hashes)
                if spend is None:  # a cap record counted in before its federation joined
                    spend = FederationSpend(name=str(entry["federation"]), hashes=hashes)
                    self.federations.append(spend)
                spend.hashes |= hashes
            if spend is None:
                raise ValueError(f"a charge of config {str(entry['config_hash'])[:16]} before its join")
            spend.charges.append(non_negative("rdp", entry["rdp"]))
            spend.cap_lines = max(spend.cap_lines, int(entry["cap_lines"]))
            spend.sampler_tv = max(spend.sampler_tv, non_negative("sampler_tv", entry.get("sampler_tv", 0.0)))
        elif kind == "close":
            closed = self.joined({str(h) for h in entry["hashes"]})
            if closed is None:
                raise ValueError("a close of a federation that never joined")
            closed.closed = True
        else:
            raise ValueError(f"unknown entry kind {kind!r}")

    def to_dict(self) -> dict[str, Any]:
        """Spend per federation and in total (``capc teacher budget --format json``)."""
        spent, budget = self.spent_rdp, self.budget_rdp
        reserved = self.reserved_rdp()
        return {
            "limit": {
                "epsilon": self.limit,
                "delta": self.delta,
                "order": self.order,
                "budget_rdp": budget,
                "set": list(self.limits),
                "guarantee_epsilon": self.guarantee,
                "delta_sampler": self.delta_sampler,
                "delta_total": self.delta + self.delta_sampler,
            },
            "neighbouring": NEIGHBOURING,
            "federations": [
                {
                    "name": f.name,
                    "config_hashes": sorted(f.hashes),
                    "charges": len(f.charges),
                    "spent_rdp": f.spent_rdp,
                    "spent_epsilon": self.epsilon_of(f.spent_rdp),
                    "planned_rdp": f.planned_rdp,
                    "planned_epsilon": self.epsilon_of(f.planned_rdp),
                    "reserved_rdp": f.reserved_rdp,
                    "closed": f.closed,
                }
                for f in self.federations
            ],
            "total": {
                "spent_rdp": spent,
                "spent_epsilon": self.epsilon_of(spent),
                "reserved_rdp": reserved,
                "reserved_epsilon": self.epsilon_of(reserved),
                "remaining_rdp": budget - reserved,
            },
        }

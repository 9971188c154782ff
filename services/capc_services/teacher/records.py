"""A teacher site's two privacy records, created once and opened together: its cap record in this federation
(:class:`~capc_services.teacher.cap.LocalCap`) and, when its site file has ``lifetime:``, the hospital's
site ledger across federations (:class:`~capc_services.teacher.site_ledger.SiteLedger`)."""

from __future__ import annotations

import math

from capc_common.errors import InputError
from capc_common.federation import Exposure, FederationConfig, cap_order
from capc_common.privacy.analysis import DEFAULT_ORDERS, epsilon_holding, lifetime_order
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.settings import LifetimeSettings, TeacherSettings
from capc_services.teacher.site_ledger import SiteLedger


def create_missing_records(settings: TeacherSettings, exposure: Exposure) -> dict[str, str]:
    """Create whichever of the site's records does not exist yet (never one that does).

    A new cap record charges at :func:`~capc_common.federation.cap_order` (where the federation's plan costs
    least); a new site ledger at ``lifetime.order``, or else at the order where its limit holds the most
    federations like this one, and at ``lifetime.delta`` or this federation's δ.

    Returns:
        ``{"cap_record": path, "site_ledger": path}`` of what was created (absent: it existed or is not set).

    Raises:
        InputError: the cap or the lifetime limit cannot be met, or nothing was missing.
    """
    config = settings.federation_config
    created: dict[str, str] = {}
    order = cap_order(exposure, delta=config.budget.delta)
    if not settings.cap.record.exists():
        created["cap_record"] = str(LocalCap.init(settings.cap.record, config=config, order=order))
    life = settings.lifetime
    if life is not None and not life.ledger.exists():
        at, delta = new_ledger_order(life, config, exposure, cap_epsilon=settings.cap.epsilon)
        created["site_ledger"] = str(
            SiteLedger.init(life.ledger, epsilon=life.epsilon, delta=delta, order=at)
        )
    if not created:
        raise InputError(
            f"the cap record {settings.cap.record}"
            + ("" if life is None else f" and the site ledger {life.ledger}")
            + " already exist; they are never re-created (they hold the ε this hospital released)"
        )
    return created


def new_ledger_order(
    life: LifetimeSettings, config: FederationConfig, exposure: Exposure, *, cap_epsilon: float
) -> tuple[float, float]:
    """The order and δ a new site ledger takes when ``config``'s federation is the first it meets:
    ``lifetime.order`` and ``lifetime.delta`` if set; else the federation's δ, and the order at which the
    limit holds the most federations like this one (its plan as far as a cap of ``cap_epsilon`` admits it,
    at the order a new cap record charges at)."""
    delta = config.budget.delta if life.delta is None else life.delta
    if life.order is not None:
        return life.order, delta
    own = cap_order(exposure, delta=config.budget.delta)
    charges = exposure.admitted(epsilon=cap_epsilon, delta=config.budget.delta, order=own)
    plan = exposure.plan_curve(DEFAULT_ORDERS, charges=charges)
    return lifetime_order(plan, orders=DEFAULT_ORDERS, epsilon=life.epsilon, delta=delta), delta


def declared_cap_refusal(
    settings: TeacherSettings,
    config: FederationConfig,
    *,
    exposure: Exposure | None = None,
    order: float | None = None,
) -> str | None:
    """Why this site's cap contradicts the cap ``federation.yaml`` declares for it (None: it does not).

    The guardian refuses a federation whose declared caps cannot cover its plan before the first charge,
    measuring each declared cap as a new cap record charges it (:func:`~capc_common.federation.cap_order`);
    that check holds only if each party's cap is at least what it declared and, given ``exposure`` and the
    ``order`` its cap record charges at, covers at least as much of the plan there (a record created before
    records named their order charges at the federation's, where the same ε covers less).
    """
    declared = config.teacher(settings.party).cap
    own = settings.cap.epsilon
    if declared is None:
        return None
    if own < declared:
        return (
            f"federation.yaml declares {settings.party}'s cap as ε {declared:g} (the guardian counts on it "
            f"to cover the plan), but this site file's cap.epsilon is {own:g}; raise cap.epsilon to "
            f"{declared:g}, or ask the coordinator to declare {own:g} (teachers[].cap)"
        )
    if exposure is None or order is None:
        return None
    delta, planned = config.budget.delta, len(exposure.plan)
    new_order = cap_order(exposure, delta=delta)
    try:
        promised = exposure.admitted(epsilon=declared, delta=delta, order=new_order)
    except InputError:  # no RDP at that order meets the declaration: it promises no charge
        return None
    covers = exposure.admitted(epsilon=own, delta=delta, order=order)
    if covers >= promised:
        return None
    needed = epsilon_holding(
        math.fsum(exposure.rdp(count, order) for count in exposure.plan[:promised]), delta=delta, order=order
    )
    return (
        f"federation.yaml declares {settings.party}'s cap as ε {declared:g}, which covers {promised} of the "
        f"{planned} {exposure.kind} at the order a new cap record charges at ({new_order:g}), and the "
        f"guardian counts on it; this site's cap record charges at order {order:g} (fixed when it was "
        f"created), where cap.epsilon {own:g} covers {covers} of the {planned} {exposure.kind}: raise "
        f"cap.epsilon to {needed:g}, or ask the coordinator to lower {settings.party}'s teachers[].cap (the "
        "guardian then counts this party as stopping part-way)"
    )


def open_records(settings: TeacherSettings, config: FederationConfig, exposure: Exposure) -> LocalCap:
    """Open the cap record for charging (held by this process) and, with a site ledger, join the hospital's
    lifetime budget: the cap's charges are charged there too (:attr:`LocalCap.lifetime`).

    Raises:
        InputError: the site's cap is below the one ``federation.yaml`` declares for it, or covers less of
            the plan at its record's order (:func:`declared_cap_refusal`).
        IntegrityError: a record is missing or corrupt.
        UnavailableError: another process holds the cap record.
        BudgetExhaustedError: the federation's plan does not fit the hospital's lifetime budget.
    """
    contradiction = declared_cap_refusal(settings, config)
    if contradiction is not None:
        raise InputError(contradiction)
    cap = LocalCap(settings.cap.record, config=config, epsilon_cap=settings.cap.epsilon, exposure=exposure)
    try:
        contradiction = declared_cap_refusal(settings, config, exposure=exposure, order=cap.order)
        if contradiction is not None:
            raise InputError(contradiction)
        life = settings.lifetime
        if life is not None:
            ledger = SiteLedger(life.ledger, epsilon=life.epsilon, delta=life.delta, order=life.order)
            cap.lifetime = ledger.join(config=config, cap=cap)
    except BaseException:
        cap.close()
        raise
    return cap


def site_ledger_view(settings: TeacherSettings) -> SiteLedger | None:
    """The site ledger read-only (None: the site file sets no lifetime budget)."""
    life = settings.lifetime
    if life is None:
        return None
    return SiteLedger(life.ledger, epsilon=life.epsilon, delta=life.delta, order=life.order, writable=False)

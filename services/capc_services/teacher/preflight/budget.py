"""Preflight of what the federation may cost this hospital: its own ε cap in this federation, and its
lifetime budget across federations. Both are read, never written (a teacher may be serving beside)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capc_common.errors import CapcError, InputError
from capc_common.federation import (
    Exposure,
    FederationConfig,
    ReleaseMember,
    cap_cover,
    exposure_of,
)
from capc_common.federation.cover import why_above
from capc_common.privacy.analysis import delta_with_sampler_distance, epsilon_holding
from capc_services.teacher.preflight.report import Check
from capc_services.teacher.records import declared_cap_refusal
from capc_services.teacher.settings import TeacherSettings

if TYPE_CHECKING:
    from capc_common.models import Backbone


def site_exposure(config: FederationConfig, backbone: Backbone) -> Exposure:
    """What the federation charges this site (a release federation's protocol is built on ``backbone``)."""
    protocol = None
    if isinstance(config.mechanism, ReleaseMember):
        from capc_common.federation.releases import protocol_for

        protocol = protocol_for(config, dim=backbone.feature_dim, backbone=backbone)
    return exposure_of(config, protocol=protocol)


def cap_check(
    settings: TeacherSettings, config: FederationConfig, exposure: Exposure, *, force: str | None = None
) -> Check:
    """The local ε cap: what this party has spent, and whether it covers the rest of the federation's plan.

    Measured against the same figure ``capc local up`` gives its hospitals by default
    (:func:`~capc_common.federation.cap_cover`): the worst case of every charge of the plan that the
    federation's own limit can admit — what the cap charges for each batch the party answers. A cap that
    stops the party part-way fails (the federation would spend privacy on a plan it cannot finish with this
    hospital) unless ``force`` gives the reason it is meant to; a cap below the one ``federation.yaml``
    declares for the party fails whatever ``force`` says (its teacher refuses to start).
    """
    from capc_services.teacher.cap import LocalCap

    cap_eps = settings.cap.epsilon
    try:
        # A read-only view: this check runs beside a serving teacher, which holds the record's lock.
        cap = LocalCap(
            settings.cap.record, config=config, epsilon_cap=cap_eps, exposure=exposure, exclusive=False
        )
    except InputError as exc:
        return Check.fail(
            "local_cap",
            f"cap.epsilon {cap_eps:g}: {exc}",
            fix="raise cap.epsilon (δ is the federation's; the order is the cap record's, fixed when it was "
            "created)",
        )
    except CapcError as exc:
        return Check.fail(
            "local_cap",
            str(exc),
            fix="create the record once with `capc teacher init-cap` (a new site), restore it from backup, "
            "or give this federation its own cap.record",
        )
    contradiction = declared_cap_refusal(settings, config, exposure=exposure, order=cap.order)
    delta, federation_eps = config.budget.delta, config.budget.epsilon
    cover = cap_cover(exposure, delta=delta, order=cap.order)
    planned = len(exposure.plan)
    # What is left of the plan: its charges after as many as this record answered (spent covers those, and
    # any batch charged again); not the whole plan again on top of what was spent.
    answered = min(cap.answered, planned)
    left = planned - answered
    fits = exposure.admitted(
        epsilon=cap_eps, delta=delta, order=cap.order, spent_rdp=cap.rdp, answered=answered
    )
    rest = math.fsum(exposure.rdp(count, cap.order) for count in exposure.plan[answered:])
    needed = epsilon_holding(cap.rdp + rest, delta=delta, order=cap.order)
    what = exposure.kind
    data = {
        "epsilon_cap": cap_eps,
        "order": cap.order,
        "epsilon_spent": cap.epsilon,
        "plan_batches": cover.plan_batches,
        "admissible_batches": cover.admissible_batches,
        "epsilon_covering": cover.cap,
        "plan_epsilon_worst_case": needed,
        "batches_within_cap": fits,
        "batches_answered": answered,
        "federation_epsilon": federation_eps,
    }
    plan = (
        f"the federation's limit ε {federation_eps:g} admits at most {planned} of its {exposure.stream} "
        f"planned {what}"
        if planned < exposure.stream
        else f"the federation's {exposure.stream} planned {what} all fit its limit ε {federation_eps:g}"
    )
    worst = (
        f"the worst case of what it spent and of the {left} it has not answered costs"
        if answered
        else "their worst case costs"
    )
    head = (
        f"cap ε {cap_eps:g} at order {cap.order:g} (spent {cap.epsilon:.3g} on {cap.batches} {what}); "
        f"{plan}, and {worst} at most ε {needed:g} against this cap"
    )
    why = why_above(cover, federation_epsilon=federation_eps)
    if fits == left and contradiction is None:
        return Check.ok("local_cap", f"{head}: fits; {why}", **data)
    if fits == left:
        return Check.fail("local_cap", f"{head}: fits, but {contradiction}", fix="raise cap.epsilon", **data)
    raise_it = f"raise cap.epsilon to {needed:g} if your organisation accepts it"
    if contradiction is not None:
        force = None  # the teacher would refuse to start: nothing to accept
        raise_it += f" ({contradiction})"
    if fits == 0:
        return Check.fail(
            "local_cap",
            f"{head}: not even one more fits, so this party would refuse every one ({why})",
            fix=f"{raise_it}, or agree a smaller plan with the coordinator",
            **data,
        )
    stops = (
        f"{head}: the cap stops this party after {fits} of those {left if answered else planned} {what} "
        f"{'it has not answered ' if answered else ''}(then it refuses; the "
        "federation goes on without it if its quorum allows, having spent privacy on a plan it cannot "
        f"finish with this hospital); {why}"
    )
    if force is not None:
        return Check.warn("local_cap", f"{stops}. Accepted: {force}", fix=raise_it, forced=force, **data)
    return Check.fail(
        "local_cap",
        stops,
        fix=f'{raise_it}; to answer only part of the plan on purpose, run preflight with --force "REASON"',
        **data,
    )


def lifetime_check(settings: TeacherSettings, config: FederationConfig, exposure: Exposure) -> Check:
    """The hospital's lifetime budget: what every federation spent or reserved, and whether this one's plan
    fits what is left (the check the teacher makes when it starts, read-only here)."""
    from capc_services.teacher.cap import LocalCap
    from capc_services.teacher.site_ledger import SiteLedger

    life = settings.lifetime
    if life is None:
        return Check.ok(
            "lifetime",
            "the site file sets no lifetime budget: nothing adds this federation's charges to the hospital's "
            "others",
        )
    try:
        ledger = SiteLedger(
            life.ledger, epsilon=life.epsilon, delta=life.delta, order=life.order, writable=False
        )
        cap = LocalCap(
            settings.cap.record,
            config=config,
            epsilon_cap=settings.cap.epsilon,
            exposure=exposure,
            exclusive=False,
        )
    except CapcError as exc:
        return Check.fail(
            "lifetime",
            str(exc),
            fix="create the site ledger and cap record once with `capc teacher init-cap --site FILE`, "
            "restore them from backup, or fix lifetime: in the site file",
        )
    account, limit = ledger.account, ledger.site_limit
    try:
        plan = ledger.assess(config=config, cap=cap)
    except InputError as exc:  # lines of an earlier membership config the ledger's order cannot take
        return Check.fail(
            "lifetime",
            str(exc),
            fix="the site ledger's order is fixed when it is created, and a cap record's lines of an earlier "
            "membership config move only to a lower order: a ledger that counts them in needs "
            "lifetime.order at most the record's order, set before the ledger is created",
        )
    sampler = delta_with_sampler_distance(
        epsilon=max(limit, account.guarantee), draws=1, distance=plan.sampler_tv
    )
    data = {
        "ledger": str(life.ledger),
        "limit_epsilon": limit,
        "order": account.order,
        "federations": len(account.federations),
        "spent_epsilon": account.epsilon_of(account.spent_rdp),
        "planned_epsilon": account.epsilon_of(plan.planned_rdp),
        "others_rdp": plan.others_rdp,
        "budget_rdp": plan.budget_rdp,
        "unseen_cap_lines": plan.unseen,
        "delta_sampler": sampler,
    }
    head = (
        f"lifetime ε {limit:g} at order {account.order:g}: {len(account.federations)} federation(s) spent "
        f"ε {account.epsilon_of(account.spent_rdp):.3g} in all, the others hold RDP {plan.others_rdp:.6g}; "
        f"this federation's plan may charge up to ε {account.epsilon_of(plan.planned_rdp):.3g} (RDP "
        f"{plan.planned_rdp:.6g})"
        + (f"; {plan.unseen} line(s) of its cap record are counted in at its start" if plan.unseen else "")
    )
    if plan.fits and sampler > account.delta / 10:
        return Check.warn(
            "lifetime",
            f"{head}: fits, but at ε {limit:g} the noise samplers' share of δ would be {sampler:.2g} beside "
            f"δ {account.delta:g} (it grows as e^ε)",
            fix="lower lifetime.epsilon (with the shipped federations it is about 2e-8 at ε 35)",
            **data,
        )
    if plan.fits:
        left = plan.budget_rdp - plan.need_rdp
        return Check.ok("lifetime", f"{head}: fits (RDP {left:.6g} left after it)", **data)
    needed = epsilon_holding(plan.need_rdp, delta=account.delta, order=account.order)
    return Check.fail(
        "lifetime",
        f"{head}: it does not fit the limit's RDP {plan.budget_rdp:.6g}, so the teacher would refuse to "
        "start",
        fix=f"raise lifetime.epsilon to {needed:g} if your organisation accepts it, close a finished "
        "federation (`capc teacher budget --site FILE --close REASON`), or lower cap.epsilon (this hospital "
        "then answers only part of the plan)",
        **data,
    )

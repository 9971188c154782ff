"""Preflight of what the federation would buy: the checks the guardian runs before the first charge
(:mod:`capc_common.federation.refusals`), with this site's own number of examples.

The site's count is public by design (its heads are planned from it), so a verdict from it reveals nothing
more; which of its heads abstain once trained is not, and the verdict never reads it (docs/privacy.md,
"Refusing before spending").
"""

from __future__ import annotations

from capc_common.federation import FederationConfig
from capc_common.federation.refusals import FIELD_NAMES, SpendPlan, pre_spend_refusals
from capc_services.local.flags import flag_names, in_flag_units
from capc_services.teacher.preflight.report import Check

#: The parameters as a hospital changes them: the coordinator's federation.yaml, or the site's own data.
_SITE_NAMES = {
    **FIELD_NAMES,
    "teachers.heads": "federation.yaml's teachers[].heads (ask the coordinator; `capc federation plan "
    "--examples N` proposes one)",
    "teachers.examples": "the site's examples (more data, or a larger data.fraction in the site file)",
    "queries.bn_batch": "federation.yaml's queries.bn_batch (ask the coordinator)",
    "mechanism.threshold": "federation.yaml's mechanism.threshold (ask the coordinator)",
}


def spending_check(config: FederationConfig, *, party: str, examples: int | None) -> Check:
    """Whether the federation would spend privacy for nothing, judged with this site's ``examples`` (None:
    the count its federation.yaml entry declares, if any)."""
    own = {party: examples} if examples is not None else {}
    plan = SpendPlan.declared(config, own)
    refusals = pre_spend_refusals(plan)
    counted = plan.examples.get(party)
    if not refusals:
        basis = (
            f"{counted:,} examples for {config.teacher(party).heads} heads"
            if counted is not None
            else "no example count for this site"
        )
        return Check.ok("spending", f"the checks before spending pass ({basis})", examples=counted)
    local = flag_names(config.mechanism.name)
    return Check.fail(
        "spending",
        "; ".join(f"[{r.check}] {r.reason}" for r in refusals),
        fix="; ".join(
            f"{r.fix(_SITE_NAMES)} (in a federation made by `capc local up`: {in_flag_units(r).fix(local)})"
            for r in refusals
            if r.changes
        )
        or "no parameter change fixes it",
        examples=counted,
        refusals=[r.check for r in refusals],
        certain=any(r.certain for r in refusals),
    )

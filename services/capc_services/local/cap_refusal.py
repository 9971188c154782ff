"""``capc local up`` refuses, before creating anything, a ``--teacher-cap`` that cannot cover the federation's
plan: every simulated hospital would stop answering part-way, so the federation would spend privacy on batches
it cannot finish (``--force REASON`` runs it anyway, saying so)."""

from __future__ import annotations

from collections.abc import Callable

from capc_common.errors import InputError
from capc_common.federation import Exposure, FederationConfig, cap_cover, cap_order
from capc_common.federation.cover import why_above


def check_teacher_cap(
    config: FederationConfig,
    exposure: Exposure,
    *,
    cap: float,
    force: str | None,
    say: Callable[[str], None],
) -> None:
    """Refuse a cap that stops every hospital before the plan's end (``force``: warn with the reason instead).

    Raises:
        InputError: the cap admits fewer charges than the plan's, with the cap that covers it and the flags.
    """
    if not cap > 0:
        return  # the teacher's site file refuses it when it is read back, naming cap.epsilon
    delta = config.budget.delta
    order = cap_order(exposure, delta=delta)
    covered = exposure.admitted(epsilon=cap, delta=delta, order=order)
    planned = len(exposure.plan)
    if covered >= planned:
        return
    cover = cap_cover(exposure, delta=delta, order=order)
    what = exposure.kind
    problem = (
        f"--teacher-cap {cap:g} covers {covered} of the {planned} {what} the federation's ε "
        f"{config.budget.epsilon:g} can admit: every hospital would stop answering after {covered} of them, "
        "and the federation would spend privacy on a plan it cannot finish"
    )
    if force is not None:
        say(f"WARNING: {problem}; running anyway (--force: {force})")
        return
    raise InputError(
        f"{problem}. Set --teacher-cap {cover.cap:g} or more (or leave it out: that is the default), or pass "
        f"--force REASON to run it anyway. Why the cap is not the federation's ε: "
        f"{why_above(cover, federation_epsilon=config.budget.epsilon)}"
    )

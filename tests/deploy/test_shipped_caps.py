"""Every shipped hospital site can carry every federation it is shipped with, before anything is spent: its
cap covers the whole plan at the order a new cap record charges at, and its lifetime budget holds all of
that deployment's federations, whichever the hospital joins first. (The Kubernetes sites once capped each
hospital at ε 30 where the shipped ε 10 plan needs 91.7 at the federation's order: preflight reported the cap
stopping it after 6 of 21 batches.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capc_common.federation import Exposure, FederationConfig, cap_order, check_runnable, exposure_of
from capc_common.privacy.analysis import rdp_budget_at_order
from capc_services.teacher.records import new_ledger_order
from capc_services.teacher.settings import CapSettings, LifetimeSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE, K8S = REPO / "deploy" / "compose", REPO / "deploy" / "k8s"
#: Each deployment: its hospitals' site files and the federations they are shipped with.
DEPLOYMENTS = {
    "compose": (
        sorted((COMPOSE / "sites").glob("hospital-*.yaml")),
        sorted(COMPOSE.glob("federation-*.yaml")),
    ),
    "k8s": (
        [K8S / "base" / "sites" / "hospital-a.yaml", K8S / "overlays" / "hospital" / "site.yaml"],
        [K8S / "base" / "federation.yaml"],
    ),
}


@pytest.fixture(scope="module")
def exposures() -> dict[Path, tuple[FederationConfig, Exposure]]:
    """What each shipped federation charges a hospital (a release federation's protocol built as the parties
    build it)."""
    found = {}
    for _, federations in DEPLOYMENTS.values():
        for path in federations:
            config = FederationConfig.load(path)
            found[path] = (config, exposure_of(config, protocol=check_runnable(config, model=False).protocol))
    return found


def _site(path: Path) -> tuple[CapSettings, LifetimeSettings | None]:
    data = yaml.safe_load(path.read_text())
    life = data.get("lifetime")
    return CapSettings(**data["cap"]), None if life is None else LifetimeSettings(**life)


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_every_shipped_hospital_cap_covers_every_shipped_plan(deployment: str, exposures) -> None:
    sites, federations = DEPLOYMENTS[deployment]
    assert sites and federations
    for site in sites:
        cap, _ = _site(site)
        for path in federations:
            config, exposure = exposures[path]
            delta = config.budget.delta
            order = cap_order(exposure, delta=delta)  # what `--train-missing` / init-cap give a new record
            covered = exposure.admitted(epsilon=cap.epsilon, delta=delta, order=order)
            assert covered == len(exposure.plan), (
                f"{site.relative_to(REPO)}: cap ε {cap.epsilon:g} covers {covered} of the "
                f"{len(exposure.plan)} charges of {path.relative_to(REPO)}"
            )


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_every_shipped_hospital_lifetime_holds_its_deployment_s_federations(
    deployment: str, exposures
) -> None:
    sites, federations = DEPLOYMENTS[deployment]
    for site in sites:
        cap, life = _site(site)
        assert life is not None, f"{site.relative_to(REPO)} sets no lifetime budget"
        assert life.ledger.parent == CapSettings(**yaml.safe_load(site.read_text())["cap"]).record.parent, (
            "the site ledger lives on the hospital's state volume, beside its cap record"
        )
        for first in federations:  # the ledger's order is fixed by the federation it meets first
            config, exposure = exposures[first]
            order, delta = new_ledger_order(life, config, exposure, cap_epsilon=cap.epsilon)
            planned = 0.0
            for path in federations:
                other_config, other = exposures[path]
                other_delta = other_config.budget.delta
                planned += other.planned_rdp(
                    cap_epsilon=cap.epsilon,
                    cap_order=cap_order(other, delta=other_delta),
                    delta=other_delta,
                    order=order,
                )
            budget = rdp_budget_at_order(epsilon=life.epsilon, delta=delta, order=order)
            assert planned <= budget, (
                f"{site.relative_to(REPO)}: lifetime ε {life.epsilon:g} holds RDP {budget:.4g} at order "
                f"{order:g}; the shipped federations plan RDP {planned:.4g} together"
            )

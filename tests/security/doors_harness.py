"""The security suite's federation (the ``doors`` fixture of ``conftest.py`` starts it): a real guardian and
student (processes of a provisioned local federation, on loopback only), with the certificates an attacker
would hold.

* hospital-1's current certificate: a party in good standing (the "others" a flood must not starve);
* hospital-2's earlier certificate, revoked in ``federation.yaml`` (a key on a lost laptop), and earlier
  certificates of the guardian and the student, revoked too (stolen keys a fake server could present);
* hospital-3's certificate, retired by a membership change that revoked it, and a second hospital-3
  certificate the change did not list: a party that is no longer one;
* a metrics token on the guardian; stream deadlines short enough to watch (``grpc.first_message_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from protocol_force import protocol_force

from capc_common.federation import FederationConfig, retire_party
from capc_common.privacy import BudgetLedger
from capc_services.local.layout import Layout
from capc_services.local.processes import PartyProcess, token
from capc_services.local.provision import Endpoints, LocalOptions
from capc_services.tls import TlsFiles, certificate_info, issue_certificate

OPTIONS = LocalOptions(
    parties=3,
    teachers_per_party=2,
    dataset="fashion-mnist",
    backbone="scatter-28x28x1",
    generator="dead_leaves",
    queries=128,
    batch_size=32,
    bn_batch=32,
    threshold=3,
    sigma1=3.0,
    sigma2=2.5,
    epsilon=300.0,
    train_limit=128,
    evaluation_images=None,
    force=protocol_force("doors against hostile peers"),
)
FIRST_MESSAGE_S = 2.0
CALLS_PER_PEER = 8


@dataclass
class Doors:
    """The running guardian and student, their files, and the certificates of the suite."""

    layout: Layout
    config: FederationConfig
    endpoints: Endpoints
    processes: dict[str, PartyProcess]
    metrics_token: str

    def files(self, party: str, directory: Path | None = None) -> TlsFiles:
        """A party's TLS files (its current ones, or those in ``directory``)."""
        where = directory or self.layout.certs
        return TlsFiles(
            ca=self.layout.certs / "ca.crt", cert=where / f"{party}.crt", key=where / f"{party}.key"
        )

    def revoked(self, party: str = "hospital-2") -> TlsFiles:
        """``party``'s earlier, revoked certificate and key."""
        return self.files(party, self.layout.root / f"old-{party}")

    @property
    def retired(self) -> TlsFiles:
        return self.files("hospital-3")

    @property
    def retired_unlisted(self) -> TlsFiles:
        return self.files("hospital-3", self.layout.root / "other-hospital-3")

    def grpc(self, role: str) -> str:
        port = self.endpoints.guardian_grpc if role == "guardian" else self.endpoints.student_grpc
        return f"127.0.0.1:{port}"

    def admin(self, role: str) -> str:
        return f"http://127.0.0.1:{self.endpoints.admin[role]}"

    def token(self, role: str) -> str:
        return token(self.layout, role)

    def pid(self, role: str) -> int:
        return self.processes[role].pid


def revoke_and_retire(layout: Layout) -> FederationConfig:
    """Retire hospital-3 (revoking its certificate) and revoke hospital-2's earlier certificate."""
    config = FederationConfig.load(layout.federation)
    serial = certificate_info(layout.certs / "hospital-3.crt").serial
    retired = retire_party(config, name="hospital-3", serial=serial, reason="left the consortium")
    issue_certificate(layout.certs, "hospital-3", out_dir=layout.root / "other-hospital-3")
    data = retired.model_dump(mode="json")
    for party in ("hospital-2", "guardian", "student"):
        old = issue_certificate(layout.certs, party, out_dir=layout.root / f"old-{party}")
        data["revoked"].append({"serial": old.serial, "party": party, "reason": "key on a lost laptop"})
    new = FederationConfig.from_dict(data)
    new.save(layout.federation)
    return new


def ledger_of(config: FederationConfig, path: Path) -> BudgetLedger:
    """A new ledger for ``config``'s budget at ``path`` (what the guardian opens at its first start)."""
    return BudgetLedger.open_or_create(
        path,
        epsilon_limit=config.budget.epsilon,
        delta=config.budget.delta,
        order=config.budget.order,
        config=config.parameters(),
    )


def edit_site(layout: Layout, party: str, **changes: dict[str, object]) -> None:
    """Merge ``changes`` (section → fields) into ``party``'s site file."""
    path = layout.site(party)
    site = yaml.safe_load(path.read_text())
    for section, values in changes.items():
        site[section] = {**site.get(section, {}), **values}
    path.write_text(yaml.safe_dump(site, sort_keys=False))

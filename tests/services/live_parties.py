"""A guardian and a student running as real processes of a provisioned local federation (no teachers).

Its federation.yaml revokes an earlier certificate of hospital-2, so tests can present a revoked, a current
and a misnamed certificate to the real servers (revocation, preflight).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from protocol_force import protocol_force

from capc_common.federation import FederationConfig
from capc_services.local.layout import Layout
from capc_services.local.processes import PartyProcess, start_party, stop_processes, wait_ready
from capc_services.local.provision import Endpoints, LocalOptions, provision
from capc_services.tls import IssuedCertificate, issue_certificate

OPTIONS = LocalOptions(
    parties=2,
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
    order=10.0,  # the tests' caps and batch costs are figured at order 10
    train_limit=128,
    evaluation_images=None,
    force=protocol_force("certificates and admission"),
)


@dataclass
class LiveParties:
    """The running guardian and student, the federation's files, and hospital-2's revoked certificate."""

    layout: Layout
    config: FederationConfig
    endpoints: Endpoints
    revoked: IssuedCertificate
    processes: list[PartyProcess]

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def guardian_address(self) -> str:
        return self.endpoints.guardian_address

    @property
    def student_address(self) -> str:
        return self.endpoints.student_address

    def close(self) -> None:
        stop_processes(self.processes, grace=10)


def start(root: Path) -> LiveParties:
    """Provision a federation in ``root``, revoke an old hospital-2 certificate, start guardian, student."""
    layout, config, endpoints = provision(root, OPTIONS)
    revoked = issue_certificate(layout.certs, "hospital-2", out_dir=root / "old-hospital-2")
    data = yaml.safe_load(layout.federation.read_text())
    data["revoked"] = [{"serial": revoked.serial, "party": "hospital-2", "reason": "key on a lost laptop"}]
    layout.federation.write_text(yaml.safe_dump(data, sort_keys=False))
    config = FederationConfig.load(layout.federation)
    roles = [(config.guardian, "guardian"), (config.student, "student")]
    processes = [start_party(layout, party=p, role=r, admin_port=endpoints.admin[p]) for p, r in roles]
    try:
        wait_ready(layout, processes, timeout=120)
    except Exception:
        stop_processes(processes, grace=5)
        raise
    return LiveParties(
        layout=layout, config=config, endpoints=endpoints, revoked=revoked, processes=processes
    )

"""Shared by the guardian tests: a guardian on a real ledger behind real mutual-TLS gRPC, and its inputs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from capc_common.aggregation import party_noise
from capc_common.federation import FederationConfig, mpc_config
from capc_common.mpc import share_votes
from capc_common.privacy import BudgetLedger
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import AuthInterceptor, FederationClientInterceptor
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import GrpcServer, start_grpc_server
from capc_services.guardian.core import Guardian
from capc_services.guardian.servicer import POLICY, GuardianServicer, add_to_server
from capc_services.student.guardian_client import GuardianClient
from capc_services.tls import ServerIdentity, TlsFiles, certificate_info

SEED = "guardian-test"
GUARDIAN_TEST_FEDERATION = {
    "quorum": {"min_parties": 2, "vote_deadline_s": 5, "share_deadline_s": 0.5},
    "mechanism": {"threshold": 3, "sigma1": 2.0, "sigma2": 1.5},
    "budget": {"epsilon": 300.0, "delta": 1e-5, "order": 10},
}


def tls_files(pki: Path, party: str) -> TlsFiles:
    """The CA, certificate and key of a test party."""
    return TlsFiles(ca=pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")


def server_auth(
    pki: Path, party: str, config: FederationConfig, policy: Any, **options: Any
) -> AuthInterceptor:
    """The interceptor ``party``'s gRPC server installs, as its process builds it (its identity from pki)."""
    identity = ServerIdentity.load(tls_files(pki, party))
    return AuthInterceptor(config=config, policy=policy, identity=identity, **options)


def client_auth(pki: Path, party: str, config: FederationConfig, *, peer: str) -> FederationClientInterceptor:
    """The interceptor of ``party``'s channel to ``peer``, as a party process builds it."""
    return FederationClientInterceptor.dialling(config, tls=tls_files(pki, party), peer=peer)


class Setup:
    """A guardian (core, servicer and mTLS gRPC server) on a real ledger file, and the student's client."""

    def __init__(
        self,
        pki: Path,
        tmp_path: Path,
        config: FederationConfig,
        *,
        ledger_class: type[BudgetLedger] = BudgetLedger,
        frame_deadline_s: float = 60.0,
        bind: str = "127.0.0.1:0",
        force: str | None = None,
    ) -> None:
        self.pki, self.config = pki, config
        self.ledger = ledger_class.open_or_create(
            tmp_path / "ledger.sqlite",
            epsilon_limit=config.budget.epsilon,
            delta=config.budget.delta,
            order=config.budget.order,
            config=config.model_dump(mode="json"),
        )
        metrics = PartyMetrics(
            party="guardian",
            role="guardian",
            config_hash=config.config_hash(),
            certificate=certificate_info(pki / "guardian.crt"),
        )
        noise = party_noise("guardian", seed=SEED)
        self.guardian = Guardian(config=config, ledger=self.ledger, noise=noise, metrics=metrics, force=force)
        self.server: GrpcServer = start_grpc_server(
            bind=bind,
            tls=tls_files(pki, "guardian"),
            register=[add_to_server(GuardianServicer(self.guardian, frame_deadline_s=frame_deadline_s))],
            services=[rpc.GUARDIAN_SERVICE],
            interceptors=[server_auth(pki, "guardian", config, POLICY)],
            max_workers=8,
        )
        self.address = f"127.0.0.1:{self.server.port}"
        self.student = GuardianClient(
            config=config,
            tls=tls_files(pki, "student"),
            address=self.address,
            noise=party_noise("student", seed=SEED),
            timeout=20,
        )

    def teacher_stub(self, party: str):
        """A raw stub of the guardian's service with ``party``'s certificate."""
        interceptor = client_auth(self.pki, party, self.config, peer="guardian")
        return rpc.GuardianServiceStub(
            tls_files(self.pki, party).channel(self.address, peer="guardian", interceptors=(interceptor,))
        )

    def student_stub(self):
        """A raw stub with the student's certificate (to play a misbehaving student)."""
        return self.teacher_stub("student")

    def share(
        self, batch_id: str, votes: dict[str, np.ndarray], *, attempt: int = 1
    ) -> dict[str, np.ndarray]:
        width = mpc_config(self.config).width
        shares = {}
        for party, v in votes.items():
            seed, share = share_votes(v, width=width)
            request = pb.SubmitSharesRequest(
                batch_id=batch_id, attempt=attempt, party=party, seed=seed, shape=v.shape
            )
            self.teacher_stub(party).SubmitShares(request, timeout=20)
            shares[party] = share
        return shares

    def close(self) -> None:
        self.student.close()
        self.server.stop(0)
        self.ledger.close()


def votes(rng: np.random.Generator, heads: int, count: int) -> np.ndarray:
    """One party's vote counts: ``heads`` one-hot votes per query, mostly for class 3."""
    probabilities = np.full(10, 0.05)
    probabilities[3] = 0.55
    return rng.multinomial(heads, probabilities, size=count).astype(np.int64)


def digest(text: str) -> bytes:
    """A query digest standing for the batch's query spec."""
    return hashlib.sha256(text.encode()).digest()

"""A release federation's guardian behind real mutual-TLS gRPC on a real ledger file, and stubs with each
party's certificate (the release guardian tests and the release fuzzing share it)."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
from guardian_harness import client_auth, server_auth, tls_files
from sites_harness import federation_dict

from capc_common.aggregation import party_noise
from capc_common.federation import FederationConfig
from capc_common.federation.releases import ReleaseProtocol, protocol_for
from capc_common.mechanisms import share_contribution
from capc_common.privacy import BudgetLedger
from capc_common.privacy.analysis import rdp_budget_at_order
from capc_common.wire import messages as pb
from capc_common.wire import ndarray_to_proto, rpc
from capc_services.common.metrics import PartyMetrics
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.release_servicer import RELEASE_POLICY, ReleaseGuardianServicer
from capc_services.guardian.releases import ReleaseGuardian
from capc_services.guardian.servicer import add_to_server
from capc_services.student.release_app import RELEASE_POLICY as STUDENT_RELEASE_POLICY
from capc_services.student.release_app import ReleaseStudentServicer, release_message_bytes
from capc_services.student.releases import ReleaseRounds
from capc_services.student.servicer import add_to_server as add_student
from capc_services.tls import certificate_info

SEED = "release-guardian-test"
DIM = 6
BUDGET = {"epsilon": 4.0, "delta": 1e-5, "order": 10}
# One release costs 60 % of the budget: the first fits, a second (a restarted student's) does not.
RHO = 0.6 * rdp_budget_at_order(**BUDGET) / BUDGET["order"]
QUORUM = {"min_parties": 2, "vote_deadline_s": 5, "share_deadline_s": 0.5}


class ReleaseGuardianServer:
    """A release guardian served over mTLS on the ledger file in ``tmp_path`` (a second server on the same
    directory is a restarted guardian), and stubs with each party's certificate.

    Args:
        mechanism: federation.yaml's ``mechanism`` (default: one DP-prototypes release costing 60 % of the
            budget).
        dim: the features' dimension (the length of a contribution grows with it).
        federation: other federation.yaml fields (``teachers``, ``quorum``: by default a share deadline of
            half a second, how long the guardian waits for the seeds a release names).
    """

    def __init__(
        self,
        pki: Path,
        tmp_path: Path,
        *,
        mechanism: dict[str, object] | None = None,
        dim: int = DIM,
        **federation: object,
    ) -> None:
        self.pki = pki
        self.config = FederationConfig.from_dict(
            federation_dict(
                mechanism=mechanism or {"name": "dppl", "rho": RHO},
                budget=BUDGET,
                **{"quorum": QUORUM, **federation},
            )
        )
        self.protocol: ReleaseProtocol = protocol_for(self.config, dim=dim)
        self.ledger = BudgetLedger.open_or_create(
            tmp_path / "ledger.sqlite",
            epsilon_limit=BUDGET["epsilon"],
            delta=BUDGET["delta"],
            order=BUDGET["order"],
            config=self.config.parameters(),
        )
        metrics = PartyMetrics(
            party="guardian",
            role="guardian",
            config_hash=self.config.config_hash(),
            certificate=certificate_info(pki / "guardian.crt"),
        )
        self.core = core = ReleaseGuardian(
            config=self.config,
            ledger=self.ledger,
            noise=party_noise("guardian", seed=SEED),
            protocol=self.protocol,
            metrics=metrics,
        )
        self.server = start_grpc_server(
            bind="127.0.0.1:0",
            tls=tls_files(pki, "guardian"),
            register=[add_to_server(ReleaseGuardianServicer(core))],
            services=[rpc.GUARDIAN_SERVICE],
            interceptors=[server_auth(pki, "guardian", self.config, RELEASE_POLICY)],
            max_workers=8,
        )
        self.channels = Channels(pki, self.config, port=self.server.port, peer="guardian")

    def stub(self, party: str) -> rpc.GuardianServiceStub:
        return rpc.GuardianServiceStub(self.channels.get(party))

    def contribute(
        self, release_id: str, party: str, vector: np.ndarray, *, length: int | None = None, round: int = 0
    ):
        seed, share = share_contribution(vector)
        self.send_seed(release_id, party, seed, length=length or len(vector), round=round)
        return share

    def send_seed(
        self, release_id: str, party: str, seed: bytes, *, length: int, round: int = 0
    ) -> pb.SubmitContributionReply:
        request = pb.SubmitContributionRequest(
            release_id=release_id, party=party, seed=seed, length=length, round=round
        )
        return self.stub(party).SubmitContribution(request, timeout=10)

    def release(self, release_id: str, parties: list[str], *, round: int = 0) -> pb.ReleaseReply:
        return self.stub("student").Release(
            pb.ReleaseRequest(release_id=release_id, parties=parties, round=round), timeout=10
        )

    def deposit(self, round: int, release_id: str, total: np.ndarray) -> pb.ReleaseLedger:
        request = pb.DepositReleaseRequest(round=round, release_id=release_id, total=ndarray_to_proto(total))
        return self.stub("student").DepositRelease(request, timeout=10)

    def record(self, round: int) -> pb.ReleaseRecordReply:
        return self.stub("student").ReleaseRecord(pb.ReleaseRecordRequest(round=round), timeout=10)

    def entries(self) -> int:
        return int(self.ledger.summary()["entries"])

    def close(self) -> None:
        self.channels.close()
        self.server.stop(0)
        self.ledger.close()


class ReleaseStudentServer:
    """A release federation's student RPCs (``NextRelease``, ``SubmitContributionShare``) served over mTLS
    on the real servicer and message limit, with one release open for shares."""

    def __init__(self, pki: Path, config: FederationConfig, *, length: int) -> None:
        self.rounds = ReleaseRounds(config, length=length)
        self.rounds.open("open", round=0, state=np.zeros(DIM))
        self.server = start_grpc_server(
            bind="127.0.0.1:0",
            tls=tls_files(pki, "student"),
            register=[add_student(ReleaseStudentServicer(self.rounds))],
            services=[rpc.STUDENT_SERVICE],
            interceptors=[server_auth(pki, "student", config, STUDENT_RELEASE_POLICY)],
            max_workers=8,
            max_receive_bytes=release_message_bytes(length),
            max_send_bytes=release_message_bytes(length),
        )
        self.channels = Channels(pki, config, port=self.server.port, peer="student")

    def stub(self, party: str) -> rpc.StudentServiceStub:
        return rpc.StudentServiceStub(self.channels.get(party))

    def close(self) -> None:
        self.rounds.finish()
        self.channels.close()
        self.server.stop(0)


class Channels:
    """One mutual-TLS channel to a server per calling party's certificate, opened on first use."""

    def __init__(self, pki: Path, config: FederationConfig, *, port: int, peer: str) -> None:
        self._pki, self._address, self._peer, self._config = pki, f"127.0.0.1:{port}", peer, config
        self._open: dict[str, grpc.Channel] = {}

    def get(self, party: str) -> grpc.Channel:
        if party not in self._open:
            interceptor = client_auth(self._pki, party, self._config, peer=self._peer)
            self._open[party] = tls_files(self._pki, party).channel(
                self._address, peer=self._peer, interceptors=(interceptor,)
            )
        return self._open[party]

    def close(self) -> None:
        for channel in self._open.values():
            channel.close()

"""A membership change on a serving guardian: authorised by the admin token through its REST API, recorded on
the ledger, the guardian stops; started again under the new federation.yaml it continues the same ledger and
refuses the old config hash, naming the ledger entry where the federation changed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from guardian_harness import Setup, server_auth, tls_files
from sites_harness import funded_config, guardian_settings

from capc_cli.main import main
from capc_common.errors import IntegrityError
from capc_common.federation import FederationConfig, add_party
from capc_common.privacy import BudgetLedger
from capc_common.wire import messages as pb
from capc_common.wire import rpc
from capc_services.common.interceptors import (
    HASH_HEADER,
    REVOCATION_HEADER,
    superseded_by_history,
)
from capc_services.common.runtime import start_grpc_server
from capc_services.guardian.app import serve
from capc_services.guardian.servicer import POLICY, GuardianServicer, add_to_server
from capc_services.local.provision import free_port
from capc_services.tls import TlsFiles


class Guardian:
    """``serve`` in a thread on fixed loopback ports."""

    def __init__(self, pki: Path, tmp_path: Path, token_file: Path, federation: Path, ports: tuple[int, int]):
        grpc_port, admin_port = ports
        settings = guardian_settings(
            pki, tmp_path, token_file, federation, grpc={"bind": f"127.0.0.1:{grpc_port}"},
            admin={"bind": f"127.0.0.1:{admin_port}", "token_file": token_file},
        )  # fmt: skip
        self.url, self.address = f"http://127.0.0.1:{admin_port}", f"127.0.0.1:{grpc_port}"
        self.stop, self.errors = threading.Event(), []
        self.thread = threading.Thread(target=self._run, args=(settings,), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self._ready():
            assert not self.errors and time.monotonic() < deadline, self.errors

    def _run(self, settings: Any) -> None:
        try:
            serve(settings, stop=self.stop)
        except BaseException as exc:
            self.errors.append(exc)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            time.sleep(0.2)
            return False

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def old(tmp_path: Path) -> tuple[FederationConfig, Path]:
    config = funded_config()
    path = tmp_path / "federation.yaml"
    config.save(path)
    return config, path


@pytest.fixture
def ports() -> Iterator[tuple[int, int]]:
    yield free_port(), free_port()


def _post(url: str, body: dict[str, Any], token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/api/v1/membership", json=body, headers=headers, timeout=30)


def _submit(pki: Path, party: str, address: str, config_hash: str) -> grpc.RpcError:
    """A seed submitted under ``config_hash`` (headers set by hand: a client still on an old file)."""
    files = TlsFiles(ca=pki / "ca.crt", cert=pki / f"{party}.crt", key=pki / f"{party}.key")
    channel = files.channel(address, peer="guardian")
    request = pb.SubmitSharesRequest(batch_id="q000000000+32", attempt=1, party=party, seed=b"\0" * 16)
    headers = ((HASH_HEADER, config_hash), (REVOCATION_HEADER, funded_config().revocation_hash()))
    try:
        with pytest.raises(grpc.RpcError) as info:
            rpc.GuardianServiceStub(channel).SubmitShares(request, metadata=headers, timeout=20)
        return info.value
    finally:
        channel.close()


def test_a_guardian_continues_its_ledger_across_an_authorised_membership_change(
    pki: Path,
    tmp_path: Path,
    token_file: Path,
    old: tuple[FederationConfig, Path],
    ports: tuple[int, int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, path = old
    new = add_party(config, name="outsider", heads=2)  # the PKI holds a certificate for "outsider"
    new_path = tmp_path / "federation-new.yaml"
    new.save(new_path)
    token = token_file.read_text().strip()
    guardian = Guardian(pki, tmp_path, token_file, path, ports)
    try:
        ledger_path = tmp_path / "ledger.sqlite"
        with BudgetLedger.open(ledger_path) as ledger:  # a batch charged before the change
            ledger.reserve(
                "q000000000+32", queries=32, parties=["hospital-a", "hospital-b"],
                mechanism="confident-gnmax", params={}, worst_case_rdp=2.0, actor="student",
            )  # fmt: skip
            ledger.settle("q000000000+32", answered=5, actual_rdp=1.5, actor="guardian")
            spent = ledger.summary()["spent_rdp"]
        body = new.model_dump(mode="json")
        # Unauthorised: no token, another token. Nothing is recorded.
        for secret in (None, "not-the-admin-token-" + "z" * 20):
            reply = _post(guardian.url, body, secret)
            assert reply.status_code == 401 and reply.headers["content-type"] == "application/problem+json"
        # A change of the privacy parameters through this path is refused, naming the field.
        bigger = {**body, "budget": {**body["budget"], "epsilon": 600.0}}
        reply = _post(guardian.url, bigger, token)
        assert reply.status_code == 409, reply.text
        assert "budget.epsilon: 300.0 -> 600.0" in reply.json()["detail"]
        with BudgetLedger.open(ledger_path) as ledger:
            assert [e.kind for e in ledger.entries()] == ["reserve", "settle"]
        # The admin records the change with the CLI: one membership entry, then the guardian stops.
        with pytest.raises(SystemExit) as exit_info:
            main(["guardian", "membership", "--url", guardian.url, "--token-file", str(token_file),
                  "--federation", str(new_path)])  # fmt: skip
        out = capsys.readouterr().out
        assert exit_info.value.code in (0, None), out
        assert "ledger entry 3: added outsider" in out and "carries over" in out
        guardian.thread.join(30)
        assert not guardian.thread.is_alive() and not guardian.errors
    finally:
        guardian.close()
    with BudgetLedger.open(ledger_path) as ledger:
        (entry,) = ledger.membership_changes()
        assert entry.seq == 3 and entry.params["to"] == new.config_hash()
        assert ledger.verify().ok and ledger.check_authorisations(token) == {}
    # Started again under the old federation.yaml it refuses, saying where the federation changed.
    with pytest.raises(IntegrityError, match=r"changed at ledger entry 3 \(added outsider.*install the new"):
        serve(guardian_settings(pki, tmp_path, token_file, path), stop=threading.Event())
    # Under the new one it carries on: same ledger, budget spent carried over, the old hash refused.
    guardian = Guardian(pki, tmp_path, token_file, new_path, ports)
    try:
        budget = httpx.get(
            f"{guardian.url}/api/v1/budget", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).json()
        assert budget["spent_rdp"] == spent and budget["config_hash"] == new.config_hash()
        refused = _submit(pki, "hospital-a", guardian.address, config.config_hash())
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "the federation changed at ledger entry 3 (added outsider" in refused.details()
        assert "install the new federation.yaml" in refused.details()
        # The added party, presenting the new hash, is past the checks (the batch is simply not open).
        admitted = _submit(pki, "outsider", guardian.address, new.config_hash())
        assert admitted.code() == grpc.StatusCode.INVALID_ARGUMENT, admitted.details()
        assert "not open" in admitted.details()
        # A second change made from the old file is refused: the federation moved on.
        stale = add_party(config, name="hospital-c", heads=2).model_dump(mode="json")
        reply = _post(guardian.url, stale, token)
        assert reply.status_code == 409, reply.text
        assert f"was made from config {config.config_hash()[:16]}" in reply.json()["detail"]
    finally:
        guardian.close()


def test_a_party_without_a_ledger_names_the_change_from_its_history(pki: Path, tmp_path: Path) -> None:
    """The student has no ledger: the history its new federation.yaml carries names the change to a teacher
    still presenting the old hash (here on a guardian's service, the same interceptor)."""
    config = funded_config()
    new = add_party(config, name="outsider", heads=2)
    setup = Setup(pki, tmp_path, new)
    server = start_grpc_server(
        bind="127.0.0.1:0", tls=tls_files(pki, "guardian"),
        register=[add_to_server(GuardianServicer(setup.guardian))], services=[rpc.GUARDIAN_SERVICE],
        interceptors=[server_auth(pki, "guardian", new, POLICY, superseded=superseded_by_history(new))],
    )  # fmt: skip
    try:
        refused = _submit(pki, "hospital-a", f"127.0.0.1:{server.port}", config.config_hash())
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (
            "but the federation changed (added outsider): install the new federation.yaml"
            in refused.details()
        )
        stranger = _submit(pki, "hospital-a", f"127.0.0.1:{server.port}", "0" * 64)
        assert "federation config hash mismatch" in stranger.details()
    finally:
        server.stop(0)
        setup.close()

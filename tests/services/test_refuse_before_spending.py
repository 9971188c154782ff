"""A federation that would spend privacy for nothing is refused before its first charge, in every front end:
`capc local up` (exit 2, the reason, the flags to change, nothing written), `capc teacher preflight` (not
ready, with the fix) and the guardian (FAILED_PRECONDITION on the student's open, an untouched ledger);
`--force "REASON"` overrides a judgement. And `capc local up --parties 2` works at its defaults."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from guardian_harness import GUARDIAN_TEST_FEDERATION, Setup, digest

from capc_common.errors import PreconditionError
from capc_common.federation import FederationConfig, cap_cover, check_runnable, exposure_of
from capc_common.federation.refusals import SpendPlan, pre_spend_refusals
from capc_common.wire import messages as pb
from capc_services.local.federation import ensure_provisioned
from capc_services.local.flags import as_flags
from capc_services.local.provision import LocalOptions, federation_dict, provision, refuse_before_spending
from capc_services.teacher.preflight.spending import spending_check

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")  # the harness's

#: The federation a new user tried: 3 hospitals of about 1,000 images, 25 heads each (the defaults): about
#: 40 images per head (36 once each hospital holds its tenth out), below one BatchNorm chunk of 64 — every
#: head abstained, ε 6.07 bought a 7 % student.
USELESS = ["local", "up", "--parties", "3", "--train-limit", "1000"]


def test_local_up_refuses_the_useless_federation_before_anything_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from capc_cli.main import main

    state = tmp_path / "state"
    with pytest.raises(SystemExit) as exit_info:
        main([*USELESS, "--state-dir", str(state)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert (
        "refusing before any privacy is spent: [heads-abstain] hospital-1, hospital-2, hospital-3: 25 heads"
        " over 900 examples each" in err  # the training part: each holds out a tenth of its 1,000
    )
    assert "about 36 per head" in err and "they all abstain with probability ≥ 99.9 %" in err
    # 2,771 examples per hospital train on 2,494 after the holdout: what the heads need. Fewer heads would
    # fit the shards, but `capc local up` scales the noise to the heads, and 3 × 9 heads' noise cannot pay
    # for one batch at ε 10: that way out is not offered.
    assert "to fix it, raise --train-limit to 2,771." in err
    assert 'pass --force "REASON"' in err and "Traceback" not in err
    assert not state.exists()  # no certificate, no federation.yaml, no ledger: nothing was charged


def test_each_way_out_capc_local_up_names_gets_past_every_check() -> None:
    """What a user following the message runs: each named flag at its value provisions a federation that
    passes the checks before spending (the steps `provision` takes before it writes anything)."""
    useless = LocalOptions(parties=3, train_limit=1000, backbone="scatter-28x28x1")
    with pytest.raises(PreconditionError) as refused:
        refuse_before_spending(FederationConfig.from_dict(federation_dict(useless)), useless)
    ways = re.findall(r"(?:lower|raise) (--[a-z-]+) to ([\d,]+)", str(refused.value))
    # 900 examples each train once a tenth is held out: chunks of 16 no longer fill 25 shards; the limit
    # named is the one whose training part holds what the heads need (it gets past, below)
    assert [flag for flag, _ in ways] == ["--train-limit"]
    for flag, value in ways:
        options = replace(useless, **{flag[2:].replace("-", "_"): int(value.replace(",", ""))})
        config = FederationConfig.from_dict(federation_dict(options))
        check_runnable(config, model=False)
        refuse_before_spending(config, options)


def test_force_with_a_reason_provisions_it_and_hands_the_reason_to_the_guardian(tmp_path: Path) -> None:
    options = LocalOptions(parties=3, train_limit=1000, backbone="scatter-28x28x1", force="a dry run")
    layout, config, _ = provision(tmp_path / "state", options)
    # planned, declared, public: the training part, 1,000 less its holdout of 10 %
    assert [t.examples for t in config.teachers] == [900, 900, 900]
    guardian_site = yaml.safe_load(layout.site(config.guardian).read_text())
    assert guardian_site["force"] == "a dry run"
    # What a hospital's preflight says with its own count (the full preflight is in test_preflight.py).
    spending = spending_check(config, party="hospital-1", examples=1012)
    assert spending.status == "fail" and spending.data["refusals"] == ["heads-abstain"]
    assert not spending.data["certain"] and "hospital-1: 25 heads over 1,012 examples" in spending.detail
    assert "lower federation.yaml's teachers[].heads (ask the coordinator" in spending.fix
    # the other hospitals declare 900 each; the local flags give the --train-limit of a training part
    assert "(in a federation made by `capc local up`: lower --teachers-per-party to 9" in spending.fix
    assert "raise --train-limit to 2,771)" in spending.fix


def test_two_parties_work_at_the_defaults_of_capc_local_up(tmp_path: Path) -> None:
    """`capc local up --parties 2` failed at its defaults with "raise mechanism.sigma2 (now 8)": at order 10
    one batch of 64 cost RDP 10.17, more than the whole budget (9.08). The planned order (the one that buys
    the most queries) fits it, and the federation passes every check before spending."""
    from capc_cli.commands.local import up

    fields = LocalOptions.__dataclass_fields__
    defaults: dict[str, Any] = {p.name: p.default for p in up.params if p.name in fields}
    defaults["mechanism_params"] = None
    options = LocalOptions(**{**defaults, "parties": 2, "backbone": "scatter-28x28x1"})
    layout, config = ensure_provisioned(tmp_path / "state", options)
    assert layout.federation.exists() and config.quorum.min_parties == 1
    assert config.budget.order < 10  # planned
    assert pre_spend_refusals(SpendPlan.declared(config)) == []
    cover = cap_cover(exposure_of(config), delta=config.budget.delta)
    assert cover.admissible_batches == cover.plan_batches == 32


def test_local_up_names_flags_not_federation_yaml_fields() -> None:
    assert as_flags("mechanism.confident-gnmax.sigma1: must be > 0", mechanism="confident-gnmax") == (
        "--sigma1: must be > 0"
    )
    assert as_flags("quorum.min_parties 3 exceeds", mechanism="gnmax") == "--min-parties 3 exceeds"
    assert as_flags("lower mechanism.sampling_rate", mechanism="private-knn") == "lower --sampling-rate"
    assert as_flags("lower mechanism.sampling_rate", mechanism="secagg-dpsgd") == (
        "lower --mechanism-param sampling_rate=…"
    )
    assert as_flags("raise mechanism.rho or budget.epsilon", mechanism="dppl") == (
        "raise --mechanism-param rho=… or --epsilon"
    )


@pytest.fixture
def useless(pki: Path, tmp_path: Path, federation_dict) -> dict[str, Any]:
    """The guardian test federation (chunks of 16) with declared examples its heads cannot fill: hospital-a
    10 (fewer than a chunk: certainly abstains), hospital-b 20 over 3 heads (about 7 per head)."""
    data = federation_dict(**GUARDIAN_TEST_FEDERATION)
    data["teachers"] = [{**t, "examples": n} for t, n in zip(data["teachers"], (10, 20), strict=True)]
    return data


@pytest.fixture
def refused(pki: Path, tmp_path: Path, useless: dict[str, Any]) -> Iterator[Setup]:
    setup = Setup(pki, tmp_path, FederationConfig.from_dict(useless))
    yield setup
    setup.close()


def test_the_guardian_refuses_the_first_open_and_charges_nothing(refused: Setup) -> None:
    before = refused.ledger.entries()
    with pytest.raises(grpc.RpcError) as raw:  # the status itself, as any student sees it
        refused.student_stub().OpenBatch(
            pb.OpenBatchRequest(batch_id="b0", count=16, query_digest=digest("b0")), timeout=20
        )
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        "refusing before any privacy is spent: [heads-abstain] hospital-a: 10 examples" in raw.value.details()
    )
    assert 'force: "REASON" in the guardian\'s site file' in raw.value.details()
    with pytest.raises(PreconditionError, match="hospital-b: 3 heads over 20 examples"):
        refused.student.open_batch("b1", count=16, digest=digest("b1"))
    assert refused.ledger.entries() == before  # no reservation, no charge
    assert refused.ledger.batch("b0") is None and refused.ledger.batch("b1") is None
    assert refused.ledger.summary()["epsilon_spent"] == 0


def test_the_guardian_runs_it_when_forced_with_a_reason(
    pki: Path, tmp_path: Path, useless: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="capc_services.guardian.core"):
        forced = Setup(pki, tmp_path, FederationConfig.from_dict(useless), force="checking the deployment")
    try:
        [record] = [
            r for r in caplog.records if r.getMessage() == "pre-spend refusal overridden by the operator"
        ]
        assert record.force == "checking the deployment" and "hospital-a" in record.refusals[0]
        reply = forced.student.open_batch("b0", count=16, digest=digest("b0"))
        assert reply.reserved_rdp > 0 and forced.ledger.batch("b0").state == "reserved"
    finally:
        forced.close()
    # Certain (no party holds a chunk): a reason does not override it.
    certain = {**useless, "teachers": [{**t, "examples": 15} for t in useless["teachers"]]}
    (tmp_path / "certain").mkdir()
    never = Setup(pki, tmp_path / "certain", FederationConfig.from_dict(certain), force="please")
    try:
        with pytest.raises(PreconditionError, match="certain, so it cannot be forced"):
            never.student.open_batch("b0", count=16, digest=digest("b0"))
    finally:
        never.close()


def _guardian_site(pki: Path, root: Path, token_file: Path, federation: dict[str, Any], **extra: Any) -> Path:
    """A guardian site file (and its federation.yaml) under ``root``, as an operator writes them."""
    FederationConfig.from_dict(federation).save(root / "federation.yaml")
    site = {
        "party": "guardian",
        "federation": str(root / "federation.yaml"),
        "tls": {
            "ca": str(pki / "ca.crt"),
            "cert": str(pki / "guardian.crt"),
            "key": str(pki / "guardian.key"),
        },
        "admin": {"bind": "127.0.0.1:0", "token_file": str(token_file)},
        "grpc": {"bind": "127.0.0.1:0"},
        "ledger": str(root / "ledger.sqlite"),
        **extra,
    }
    path = root / "guardian.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def test_the_site_files_force_reaches_the_guardian_the_service_builds(
    pki: Path, tmp_path: Path, token_file: Path, useless: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """`force:` in the site file (what `capc local up --force` writes, and what `capc guardian serve --force`
    replaces) must reach the guardian the service builds, not only one constructed by hand."""
    from capc_services.guardian.app import serve
    from capc_services.guardian.settings import GuardianSettings

    site = _guardian_site(pki, tmp_path, token_file, useless, force="checking the deployment")
    stop = threading.Event()
    stop.set()  # start, then stop at once: the guardian is built, and logs what it overrode
    with caplog.at_level(logging.WARNING, logger="capc_services.guardian.core"):
        serve(GuardianSettings.load(site), stop=stop)
    [record] = [r for r in caplog.records if r.getMessage() == "pre-spend refusal overridden by the operator"]
    assert record.force == "checking the deployment" and "hospital-a" in record.refusals[0]

"""`capc local` refuses what it cannot do before touching anything."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from protocol_force import protocol_force

from capc_common.errors import InputError, PreconditionError
from capc_common.federation import FederationConfig, cap_cover, cap_order, exposure_of
from capc_common.privacy import BudgetLedger
from capc_services.local.federation import check_resume, ensure_provisioned, summary
from capc_services.local.layout import Layout
from capc_services.local.processes import PartyProcess, federation_of, write_state
from capc_services.local.provision import (
    Endpoints,
    LocalOptions,
    federation_dict,
    free_port,
    provision,
    recorded_options,
)
from capc_services.teacher.settings import TeacherSettings

#: These tests are of provisioning, not of whether their small federations are worth joining.
FORCE = protocol_force("provisioning")


def test_status_and_down_of_a_directory_without_a_federation(capc, tmp_path: Path) -> None:
    status = capc("local", "status", "--state-dir", str(tmp_path))
    assert status.returncode == 2
    assert "no local federation was started" in status.stderr
    # `down` from the wrong directory exited 0 with "processes {}" while the federation kept running
    down = capc("local", "down", "--state-dir", str(tmp_path))
    assert down.returncode == 2 and down.stdout == "", down.stdout
    assert f"no local federation was started in {tmp_path} (no state.json there)" in down.stderr
    assert "pass the --state-dir it was started with" in down.stderr
    (tmp_path / "precious.txt").write_text("keep me")
    purge = capc("local", "down", "--state-dir", str(tmp_path), "--purge")
    assert purge.returncode == 2
    assert "not deleting it" in purge.stderr
    assert (tmp_path / "precious.txt").exists()


def test_up_refuses_a_budget_that_cannot_pay_for_one_batch(capc, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = capc(
        "local",
        "up",
        "--state-dir",
        str(state),
        "--parties",
        "2",
        "--teachers-per-party",
        "2",
        "--epsilon",
        "1",
    )
    assert proc.returncode == 2
    # `capc local up` names its flags, not the federation.yaml fields they set
    assert "no batch could ever run" in proc.stderr
    assert "raise --sigma2 (now 0.64) or --epsilon" in proc.stderr
    assert "mechanism." not in proc.stderr and "budget." not in proc.stderr
    assert not state.exists()


def test_up_builds_a_private_knn_federation_from_its_options(capsys, tmp_path: Path) -> None:
    """``--mechanism private-knn`` reaches federation.yaml: its budget check names the kNN's own fields (the
    real entry point, in-process: a subprocess would add seconds of imports)."""
    from capc_cli.main import main

    state = tmp_path / "state"
    args = ["local", "up", "--state-dir", str(state), "--mechanism", "private-knn", "--neighbours", "3"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--sigma", "0.5", "--sampling-rate", "0.5", "--epsilon", "1"])
    assert exit_info.value.code == 2
    assert "raise --sigma (now 0.5) or lower --sampling-rate or --epsilon" in capsys.readouterr().err
    assert not state.exists()
    with pytest.raises(InputError, match="unknown mechanism 'knn'"):  # the library entry point checks too
        provision(tmp_path / "other", LocalOptions(mechanism="knn"))


def test_up_refuses_a_negative_teacher_cap_and_leaves_nothing(capc, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = capc("local", "up", "--state-dir", str(state), "--teacher-cap", "-1")
    assert proc.returncode == 2 and "--teacher-cap" in proc.stderr
    assert not state.exists()


def test_provisioning_that_fails_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    """Options only a site file can refuse (the cap is checked when the teacher's site is read back)."""
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    (existing / "precious.txt").write_text("keep me")
    for root in (fresh, existing):
        with pytest.raises(InputError, match=r"cap\.epsilon"):
            provision(root, LocalOptions(teacher_cap=-1.0, force=FORCE))
    assert not fresh.exists()
    assert [p.name for p in existing.iterdir()] == ["precious.txt"]
    layout, config, _ = provision(fresh, LocalOptions(force=FORCE))
    assert layout.federation.exists()
    for name in config.teacher_names:  # capc local makes the explicit init a real site makes itself
        assert (layout.party_dir(name) / "cap.jsonl").is_file()


def test_init_cap_creates_the_record_once(capc, tmp_path: Path) -> None:
    layout, config, _ = provision(tmp_path / "fed", LocalOptions(force=FORCE))
    name = config.teacher_names[0]
    record = layout.party_dir(name) / "cap.jsonl"
    record.unlink()
    created = capc("teacher", "init-cap", "--site", str(layout.site(name)), "--format", "json")
    assert created.returncode == 0, created.stderr
    assert record.is_file() and str(record) in created.stdout
    again = capc("teacher", "init-cap", "--site", str(layout.site(name)))
    assert again.returncode == 2 and "never re-created" in again.stderr


def test_provision_refuses_release_mechanisms_the_budget_cannot_pay(tmp_path: Path) -> None:
    state = tmp_path / "state"
    options = LocalOptions(
        epsilon=1.0, mechanism="dppl", mechanism_params={"rho": 100}, backbone="scatter-28x28x1"
    )
    with pytest.raises(InputError, match=r"dppl: 1 release\(s\) of RDP 1000 each .* more than the budget"):
        provision(state, options)
    assert not state.exists()
    with pytest.raises(InputError, match="unknown mechanism 'laplace'; choose one of"):
        provision(state, LocalOptions(mechanism="laplace"))


def test_another_optimizer_for_secagg_dpsgd_takes_its_own_step(tmp_path: Path) -> None:
    """``--mechanism-param optimizer=adam`` provisions with the schema's Adam step, not the heavy ball's clip,
    lr cap and step rule (the schema refuses step_noise with Adam: this used to fail); without it, the
    planner's recipe."""
    from capc_common.federation.sizing import DPSGD_RECIPE, DPSGD_ROUNDS

    raw = {"projection": None}  # no public basis to compute and pin (test_the_public_basis_is_pinned)
    options = LocalOptions(
        mechanism="secagg-dpsgd", epsilon=3.0, backbone="scatter-28x28x1", mechanism_params=raw, force=FORCE
    )
    _, planned, _ = provision(tmp_path / "planned", options)
    assert {k: getattr(planned.mechanism, k) for k in DPSGD_RECIPE} == DPSGD_RECIPE
    assert planned.mechanism.rounds == DPSGD_ROUNDS
    for i, params in enumerate(({"optimizer": "adam"}, {"optimizer": "adam", "learning_rate": 0.1})):
        _, config, _ = provision(tmp_path / str(i), replace(options, mechanism_params={**raw, **params}))
        m = config.mechanism
        assert m.optimizer == "adam" and m.step_noise is None and not m.unit_variance, m
        assert m.clip == 1.0 and m.learning_rate == params.get("learning_rate", 0.3)
        assert m.rounds == planned.mechanism.rounds
        assert m.noise_multiplier == planned.mechanism.noise_multiplier


def test_the_public_basis_is_pinned(tmp_path: Path) -> None:
    """A secure-aggregation DP-SGD federation's public basis is computed into the parties' shared feature
    cache while it is provisioned, and federation.yaml pins its digest — the one a party computing it afresh
    gets (so no party trains in other coordinates)."""
    from capc_common.federation import load_shared_backbone
    from capc_common.federation.releases import Featuriser, federation_basis
    from capc_common.mechanisms.basis import basis_digest

    small = {"projection": {"dim": 8, "images": 20}}
    options = LocalOptions(
        mechanism="secagg-dpsgd", epsilon=3.0, backbone="scatter-28x28x1", mechanism_params=small, force=FORCE
    )
    layout, config, _ = provision(tmp_path / "state", options)
    projection = config.mechanism.projection
    assert projection is not None and projection.sha256 is not None
    assert FederationConfig.load(layout.federation).mechanism.projection.sha256 == projection.sha256
    unpinned = projection.model_copy(update={"sha256": None})
    fresh = federation_basis(unpinned, featuriser=Featuriser(load_shared_backbone(config), (28, 28, 1)))
    assert basis_digest(fresh) == projection.sha256


def test_mechanism_params_are_key_value_pairs_read_as_yaml() -> None:
    import click

    from capc_cli.commands.local import _mechanism_params

    assert _mechanism_params(("rounds=40", "metric=cosine", "rho=0.5")) == {
        "rounds": 40,
        "metric": "cosine",
        "rho": 0.5,
    }
    with pytest.raises(click.BadParameter, match="is not KEY=VALUE"):
        _mechanism_params(("rho",))


def test_status_text_shows_a_release_federation_s_progress() -> None:
    from capc_cli.commands.local import _status_text

    progress = {"state": "published", "rounds": 20, "rounds_done": 20, "error": ""}
    text = _status_text({"state_dir": "/x", "parties": {}, "progress": progress})
    assert "student: published, 20 of 20 releases" in text


def test_status_text_shows_settled_and_reserved_epsilon_apart(tmp_path: Path) -> None:
    """The total alone falls when an open reservation settles below its worst case; the settled part never
    does, so `capc local status` shows both (as `capc budget show` does)."""
    from capc_cli.commands.local import _status_text
    from capc_common.privacy import BudgetLedger

    with BudgetLedger.create(tmp_path / "l.db", epsilon_limit=3.0, delta=1e-5, order=8.0, config={}) as led:
        led.reserve("b1", queries=4, parties=["p"], mechanism="m", params={}, worst_case_rdp=0.02, actor="s")
        led.settle("b1", answered=2, actual_rdp=0.01, actor="g")
        led.reserve("b2", queries=4, parties=["p"], mechanism="m", params={}, worst_case_rdp=0.02, actor="s")
        budget = dict(led.summary())
    text = _status_text({"state_dir": "/x", "parties": {}, "budget": budget})
    assert budget["epsilon_settled"] > 0 and budget["epsilon_reserved"] > 0
    assert (
        f"budget: ε spent {budget['epsilon_spent']:.4f} of 3 = settled {budget['epsilon_settled']:.4f} + "
        f"reserved {budget['epsilon_reserved']:.4f}"
    ) in text


# A small federation provisioned once, never started (the dashboard test's parameters, 8 batches).
SMALL = LocalOptions(
    parties=2,
    teachers_per_party=10,
    sigma1=12.0,
    sigma2=10.0,
    epsilon=10.0,
    order=10.0,  # the cover figures below are at order 10
    queries=256,
    batch_size=32,
    bn_batch=32,
    backbone="scatter-28x28x1",
    generator="dead_leaves",
    train_limit=640,  # about 64 examples per head: each shard holds a bn_batch of 32
    evaluation_images=None,
    force=FORCE,
)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """What `capc local up` leaves before it starts any process: provisioned, its state recorded."""
    root = tmp_path_factory.mktemp("provisioned") / "state"
    layout, _ = ensure_provisioned(root, SMALL)
    return layout


def test_up_refuses_other_options_for_an_existing_federation(
    provisioned: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    """`capc local up --epsilon 20` on a directory provisioned at ε 10 resumed at ε 10 without a word."""
    from capc_cli.main import main

    before = {p: p.read_bytes() for p in (provisioned.federation, provisioned.state, provisioned.options)}
    root = str(provisioned.root)
    with pytest.raises(SystemExit) as exit_info:
        main(["local", "up", "--state-dir", root, "--epsilon", "20", "--parties", "2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "was provisioned with --epsilon 10; this `up` asked for --epsilon 20" in err
    assert "would change the guarantee of what it released" in err
    assert "`capc local up --state-dir NEW_DIR --epsilon 20`" in err
    assert (
        f"`capc local down --state-dir {root} --purge`" in err and "--parties" not in err
    )  # 2 = as provisioned
    assert {p: p.read_bytes() for p in before} == before, "nothing may change"
    # The library: options equal to the recorded ones, or none given, resume; a default is no request.
    check_resume(provisioned, SMALL)
    check_resume(provisioned, LocalOptions(epsilon=20.0), given=set())
    with pytest.raises(
        InputError, match="--teachers-per-party 10; this `up` asked for --teachers-per-party 25"
    ):
        check_resume(provisioned, LocalOptions(), given={"teachers_per_party"})


def test_up_resumes_with_a_new_force_reason_where_the_guardian_reads_it(tmp_path: Path) -> None:
    """`capc local up --force "REASON"` on a federation provisioned with another reason (or none) was refused
    as "options other than those it was provisioned with": yet the reason binds nothing its ledger or records
    hold, and it is the way to go on with a federation a newer forecast judges below its parties alone."""
    from capc_services.guardian.settings import GuardianSettings

    root = tmp_path / "state"
    layout, config = ensure_provisioned(root, SMALL)
    site = layout.site(config.guardian)
    assert GuardianSettings.load(site).force == FORCE
    ensure_provisioned(root, replace(SMALL, force="the forecast changed; we go on"), given={"force"})
    assert GuardianSettings.load(site).force == "the forecast changed; we go on"
    assert recorded_options(layout)["force"] == "the forecast changed; we go on"
    check_resume(layout, replace(SMALL, force="yet another reason"))  # all options compared, but the reason
    before = site.read_bytes()
    with pytest.raises(InputError, match="needs a reason"):
        ensure_provisioned(root, replace(SMALL, force=" "), given={"force"})
    ensure_provisioned(root, replace(SMALL, force=None), given=set())  # not given: the recorded one stands
    assert site.read_bytes() == before


def test_up_names_the_state_dir_of_a_running_federation(tmp_path: Path) -> None:
    """ "already running … `capc local down` it first" left out the --state-dir the user had passed."""
    layout = Layout(tmp_path / "state")
    layout.root.mkdir()
    fake = subprocess.Popen(  # a live process whose command line is a local party's
        [sys.executable, "-c", "import time; time.sleep(60)", "capc_cli", "student.yaml"]
    )
    try:
        cmdline = Path(f"/proc/{fake.pid}/cmdline")
        while cmdline.exists() and b"student.yaml" not in cmdline.read_bytes():
            time.sleep(0.01)  # the command line appears once the interpreter has started
        endpoints = Endpoints(guardian_grpc=1, student_grpc=2, admin={"student": 3})
        student = PartyProcess(party="student", role="student", pid=fake.pid, admin_url="http://127.0.0.1:3")
        write_state(layout, endpoints=endpoints, processes=[student])
        with pytest.raises(
            InputError, match=re.escape(f"`capc local down --state-dir {layout.root}` it first")
        ):
            ensure_provisioned(layout.root, SMALL)
    finally:
        fake.kill()
        fake.wait()


def test_up_prints_the_ledger_path(provisioned: Layout) -> None:
    """`capc budget show --ledger guardian/ledger.db` (a guess) failed: `up` never said where it is."""
    from capc_cli.commands.local import _up_text

    result = summary(provisioned)
    ledger = provisioned.party_dir("guardian") / "ledger.sqlite"
    assert result["guardian"]["ledger"] == str(ledger)
    text = _up_text(result)
    assert f"ledger {ledger}" in text and f"capc budget show --ledger {ledger}" in text
    assert f"capc local down --state-dir {provisioned.root}" in text


def test_budget_show_of_a_missing_ledger_names_where_it_is(capc, provisioned: Layout) -> None:
    ledger = provisioned.party_dir("guardian") / "ledger.sqlite"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    BudgetLedger.create(ledger, epsilon_limit=10.0, delta=1e-5, order=10.0, config={}).close()
    try:
        for args in (("show",), ("verify",)):
            proc = capc("budget", *args, "--ledger", "guardian/ledger.db", cwd=provisioned.root.parent)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert (
                "BudgetLedger" not in proc.stderr and "no budget ledger at guardian/ledger.db" in proc.stderr
            )
            assert "STATE_DIR/parties/guardian/ledger.sqlite (`capc local up` prints the path)" in proc.stderr
        near = capc("budget", "show", "--ledger", str(ledger.with_name("ledger.db")))
        assert near.returncode == 2 and f"found here: {ledger}" in near.stderr
    finally:
        ledger.unlink()


def test_the_default_cap_covers_the_federation_as_preflight_checks_it(
    provisioned: Layout, tmp_path: Path
) -> None:
    """`local up`'s default cap was 3 × ε = 30, and preflight warned that it covers only 7 of the 8 batches
    (suggesting 32.2) beside a federation limit of 10: both now use the same cover, at the order the cap
    record charges at, and say why it is above the federation's ε."""
    from capc_services.teacher.cap import LocalCap
    from capc_services.teacher.preflight.budget import cap_check

    config = federation_of(provisioned)
    settings = TeacherSettings.load(provisioned.site("hospital-1"))
    exposure = exposure_of(config)
    cover = cap_cover(exposure, delta=config.budget.delta)
    record = LocalCap(settings.cap.record, config=config, epsilon_cap=cover.cap, exclusive=False)
    assert record.order == cover.order == cap_order(exposure, delta=config.budget.delta) < config.budget.order
    assert settings.cap.epsilon == cover.cap > SMALL.epsilon
    check = cap_check(settings, config, exposure)
    assert check.status == "ok" and ": fits; covering this federation takes a cap of" in check.detail
    assert "the federation's 8 planned batches all fit its limit ε 10" in check.detail
    assert {t.cap for t in config.teachers} == {cover.cap}  # declared in federation.yaml, as the site sets it
    short = settings.model_copy(update={"cap": settings.cap.model_copy(update={"epsilon": cover.cap - 1})})
    below = cap_check(short, config, exposure, force="the teacher would refuse to start: not accepted")
    assert below.status == "fail" and f"declares hospital-1's cap as ε {cover.cap:g}" in below.fix
    data = config.model_dump(mode="json")
    undeclared = FederationConfig.from_dict(
        {**data, "teachers": [{**t, "cap": None} for t in data["teachers"]]}
    )
    record = LocalCap.init(tmp_path / "cap.jsonl", config=undeclared, order=cover.order)
    short = short.model_copy(update={"cap": short.cap.model_copy(update={"record": record})})
    failed = cap_check(short, undeclared, exposure)
    assert failed.status == "fail" and "stops this party after 7 of those 8 batches" in failed.detail
    assert (
        f"covering this federation takes a cap of ε {cover.cap:g} (at the cap record's order "
        f"{cover.order:g}), above its limit ε 10: the cap charges every query this hospital votes on as if "
        "it were answered"
    ) in failed.detail
    assert '--force "REASON"' in failed.fix
    forced = cap_check(short, undeclared, exposure, force="we leave after the pilot")
    assert forced.status == "warn" and forced.detail.endswith("Accepted: we leave after the pilot")


def test_up_refuses_a_teacher_cap_that_cannot_cover_the_plan(tmp_path: Path) -> None:
    """A --teacher-cap below the plan's worst case stopped every hospital part-way (the shipped Kubernetes
    sites: after 6 of 21 batches) while the federation spent: refused before anything is created, naming the
    flag and the figure, unless --force says why."""
    root = tmp_path / "state"
    config = FederationConfig.from_dict(federation_dict(SMALL), source="test")
    cover = cap_cover(exposure_of(config), delta=config.budget.delta)
    with pytest.raises(PreconditionError) as refused:
        provision(root, replace(SMALL, teacher_cap=cover.cap - 1, force=None))
    message = str(refused.value)
    assert (
        f"[caps-short] hospital-1, hospital-2 declare a cap of ε {cover.cap - 1:g}, which covers 7 of the 8 "
        "batches the federation's ε 10 can admit; 0 of its 2 parties can then answer the whole plan"
        in message
    )
    assert f"to fix it, raise --teacher-cap to {cover.cap:g}" in message and '--force "REASON"' in message
    assert "cap.epsilon" not in message and not root.exists()
    layout, forced, _ = provision(root, replace(SMALL, teacher_cap=cover.cap - 1, force="a refusal demo"))
    assert {t.cap for t in forced.teachers} == {cover.cap - 1}  # declared: the guardian checks it too
    assert "a refusal demo" in layout.site(forced.guardian).read_text()


def test_down_text_lists_each_party() -> None:
    from capc_cli.commands.local import _down_text

    text = _down_text(
        {"state_dir": "/x", "processes": {"guardian": "stopped", "hospital-1": "killed"}, "purged": True}
    )
    assert text.splitlines() == [
        "federation in /x: guardian stopped, hospital-1 killed",
        "deleted /x (ledger, labels, certificates, logs)",
    ]
    assert "{" not in _down_text({"state_dir": "/x", "processes": {}, "purged": False})


def test_free_ports_come_from_below_the_ephemeral_range_and_bind() -> None:
    """A local party's port is never one the kernel hands to an outgoing connection (which took a port
    between its choice and the party's bind: "Address already in use" in the suite), and it binds."""
    import random
    import socket

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    random.seed(0)  # a test runner seeding `random` alike in every worker does not make them agree
    ports = [free_port() for _ in range(50)]
    assert all(10_000 <= port < low for port in ports) and len(set(ports)) > 40
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))

"""A hospital's site ledger across federations: real files, fsync and flock, real teacher start-up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from sites_harness import funded_config

from capc_cli.commands.teacher import _budget_text
from capc_common.errors import BudgetExhaustedError, InputError, IntegrityError
from capc_common.federation import FederationConfig, cap_order, exposure_of
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.records import create_missing_records, open_records
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.site_ledger import SiteLedger


def _federation(tmp: Path, name: str, *, order: float, epsilon: float = 10.0) -> Path:
    """A federation of two batches of 32 queries whose whole plan a cap of ε 6 covers."""
    data = funded_config(sigma1=20.0, sigma2=10.0).model_dump(mode="json")
    data.update(name=name, budget={"epsilon": epsilon, "delta": 1e-5, "order": order})
    path = tmp / f"{name}.yaml"
    FederationConfig.from_dict(data).save(path)
    return path


def _site(pki: Path, tmp: Path, federation: Path, *, cap: float, lifetime: float = 20.0, **life: Any) -> Path:
    """hospital-a's site file for one federation; every one names the same site ledger."""
    name = federation.stem
    data: dict[str, Any] = {
        "party": "hospital-a",
        "federation": str(federation),
        "tls": {
            "ca": str(pki / "ca.crt"),
            "cert": str(pki / "hospital-a.crt"),
            "key": str(pki / "hospital-a.key"),
        },
        "admin": {"bind": "127.0.0.1:0", "token_file": str(tmp / "admin.token")},
        "student_address": "127.0.0.1:1",
        "guardian_address": "127.0.0.1:1",
        "heads": str(tmp / f"{name}-heads.safetensors"),
        "cap": {"epsilon": cap, "record": str(tmp / f"{name}-cap.jsonl")},
    }
    data["lifetime"] = {"epsilon": lifetime, "ledger": str(tmp / "site-ledger.jsonl"), **life}
    path = tmp / f"{name}-site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _grown(tmp: Path) -> tuple[Path, FederationConfig, FederationConfig]:
    """Federation one (at order 10), and its config after a membership change added hospital-c."""
    path = _federation(tmp, "one", order=10.0)
    old = FederationConfig.load(path)
    data = old.model_dump(mode="json")
    data["teachers"].append({"name": "hospital-c", "heads": 2})
    grown = FederationConfig.from_dict(
        {**data, "history": [{"previous": old.config_hash(), "added": ["hospital-c"]}]}
    )
    return path, old, grown


def _entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_hospital_joining_a_second_federation_sees_the_first_in_its_lifetime_spend(
    pki: Path, tmp_path: Path, capc_json
) -> None:
    # Prepare: federation one at order 10, federation two at order 4; the site ledger sums at its own order
    one = TeacherSettings.load(_site(pki, tmp_path, _federation(tmp_path, "one", order=10.0), cap=6.0))
    two = TeacherSettings.load(_site(pki, tmp_path, _federation(tmp_path, "two", order=4.0), cap=6.0))
    exposure_one, exposure_two = exposure_of(one.federation_config), exposure_of(two.federation_config)
    created = create_missing_records(one, exposure_one)
    assert set(created) == {"cap_record", "site_ledger"}
    # Execute: federation one answers two batches, then federation two joins
    cap = open_records(one, one.federation_config, exposure_one)
    cap.charge(batch_id="q0", attempt=1, count=32)
    cap.charge(batch_id="q32", attempt=1, count=32)
    cap.close()
    assert create_missing_records(two, exposure_two) == {"cap_record": str(two.cap.record)}
    second = open_records(two, two.federation_config, exposure_two)
    second.close()
    report = capc_json("teacher", "budget", "--site", str(tmp_path / "two-site.yaml"))
    # Assert: both federations are in the ledger, each charge stated at the ledger's order from its mechanism
    order = report["limit"]["order"]
    assert order == SiteLedger(one.lifetime.ledger, epsilon=20.0, writable=False).order  # fixed at creation
    assert report["limit"]["set"] == [20.0]
    assert [f["name"] for f in report["federations"]] == ["one", "two"]
    first, joined = report["federations"]
    assert first["charges"] == 2 and first["spent_rdp"] == 2 * exposure_one.rdp(32, order)
    assert joined["charges"] == 0 and joined["planned_rdp"] == pytest.approx(
        exposure_two.planned_rdp(cap_epsilon=6.0, cap_order=second.order, delta=1e-5, order=order)
    )
    assert report["total"]["spent_rdp"] == first["spent_rdp"]
    assert report["total"]["reserved_rdp"] == pytest.approx(first["reserved_rdp"] + joined["reserved_rdp"])
    text = _budget_text(report)
    assert "one " in text and "two " in text and "total: spent ε" in text


def test_a_federation_that_does_not_fit_is_refused_at_start_before_any_charge(
    pki: Path, tmp_path: Path, token_file: Path
) -> None:
    """The real `teacher serve` entry point: exit code 3, the figures, what to change; no share leaves (it
    never dials anyone), and the ledger records nothing for it."""
    from capc_services.teacher.app import serve

    (tmp_path / "admin.token").write_text(token_file.read_text())
    (tmp_path / "admin.token").chmod(0o600)
    one = TeacherSettings.load(
        _site(pki, tmp_path, _federation(tmp_path, "one", order=10.0), cap=6.0, lifetime=8.0)
    )
    create_missing_records(one, exposure_of(one.federation_config))
    cap = open_records(one, one.federation_config, exposure_of(one.federation_config))
    cap.close()
    small = _site(pki, tmp_path, _federation(tmp_path, "two", order=4.0), cap=6.0, lifetime=8.0)
    settings = TeacherSettings.load(small)
    create_missing_records(settings, exposure_of(settings.federation_config))
    before = (tmp_path / "two-cap.jsonl").read_text()
    with pytest.raises(BudgetExhaustedError) as refused:
        serve(settings, stop=threading.Event())
    message = str(refused.value)
    assert refused.value.exit_code == 3
    assert "this hospital's lifetime budget cannot take federation 'two'" in message
    assert "1 other federation(s) hold RDP" in message and "'one' RDP" in message
    assert "A lifetime limit of ε" in message and "Raise lifetime.epsilon in the site file" in message
    assert "lower cap.epsilon to" in message and "capc teacher budget --site FILE --close" in message
    assert (tmp_path / "two-cap.jsonl").read_text() == before
    kinds = [e["kind"] for e in _entries(tmp_path / "site-ledger.jsonl")]
    assert kinds == ["init", "join"]


def test_cap_records_are_counted_in_once_and_a_crash_only_over_counts(pki: Path, tmp_path: Path) -> None:
    settings = TeacherSettings.load(
        _site(pki, tmp_path, _federation(tmp_path, "one", order=10.0), cap=60.0, lifetime=200.0, order=3.0)
    )
    config, exposure = settings.federation_config, exposure_of(settings.federation_config)
    LocalCap.init(settings.cap.record, config=config, order=cap_order(exposure, delta=1e-5))
    with LocalCap(settings.cap.record, config=config, epsilon_cap=60.0) as cap:  # before the ledger existed
        cap.charge(batch_id="q0", attempt=1, count=32)
        cap.charge(batch_id="q32", attempt=1, count=16)
    assert create_missing_records(settings, exposure) == {"site_ledger": str(settings.lifetime.ledger)}
    ledger = settings.lifetime.ledger
    with pytest.raises(InputError, match="never re-created"):
        create_missing_records(settings, exposure)
    cap = open_records(settings, config, exposure)
    adopt = _entries(ledger)[1]
    assert adopt["kind"] == "adopt" and (adopt["lines"], adopt["cap_lines"]) == (2, 2)
    assert adopt["rdp"] == exposure.rdp(32, 3.0) + exposure.rdp(16, 3.0)
    # A crash after the ledger's charge, before the cap record's line: the ledger is one charge ahead
    assert cap.lifetime is not None
    cap.lifetime.charge(batch_id="q48", attempt=1, count=16, cap_lines=3)
    cap.close()
    cap = open_records(settings, config, exposure)
    assert [e["kind"] for e in _entries(ledger)].count("adopt") == 1  # nothing counted twice
    cap.charge(batch_id="q48", attempt=2, count=16)
    cap.close()
    # A line the ledger never saw (written while the site file had no lifetime:) counts in at the next start
    with LocalCap(settings.cap.record, config=config, epsilon_cap=60.0) as bare:
        bare.charge(batch_id="q64", attempt=1, count=32)
    open_records(settings, config, exposure).close()
    entries = _entries(ledger)
    assert [e["kind"] for e in entries].count("adopt") == 2 and entries[-2]["lines"] == 1
    report = SiteLedger(ledger, epsilon=200.0, writable=False).report()
    spent = report["federations"][0]["spent_rdp"]
    counted = [32, 16, 16, 16, 32]  # the crashed q48 once too many: over, never under
    assert spent == pytest.approx(sum(exposure.rdp(c, 3.0) for c in counted), rel=1e-12)


def test_a_membership_change_carries_on_and_earlier_lines_move_only_to_lower_orders(
    pki: Path, tmp_path: Path
) -> None:
    _, old, grown = _grown(tmp_path)
    LocalCap.init(tmp_path / "one-cap.jsonl", config=old, order=10.0)
    with LocalCap(tmp_path / "one-cap.jsonl", config=old, epsilon_cap=60.0) as cap:
        cap.charge(batch_id="q0", attempt=1, count=32)
        recorded = cap.rdp
    for order, refused in ((12.0, True), (5.0, False)):
        ledger = tmp_path / f"ledger-{order:g}.jsonl"
        SiteLedger.init(ledger, epsilon=200.0, delta=1e-5, order=order)
        with LocalCap(tmp_path / "one-cap.jsonl", config=grown, epsilon_cap=60.0) as cap:
            site = SiteLedger(ledger, epsilon=200.0)
            if refused:
                with pytest.raises(InputError, match="bounds nothing at the higher order 12"):
                    site.join(config=grown, cap=cap)
                continue
            site.join(config=grown, cap=cap)
        (adopt,) = [e for e in _entries(ledger) if e["kind"] == "adopt"]
        assert adopt["rdp"] == recorded and old.config_hash() in adopt["hashes"]


def test_the_ledger_refuses_what_its_site_file_contradicts_or_a_damaged_file(tmp_path: Path) -> None:
    ledger = SiteLedger.init(tmp_path / "ledger.jsonl", epsilon=50.0, delta=1e-5, order=3.0)
    with pytest.raises(InputError, match="never re-created"):
        SiteLedger.init(ledger, epsilon=50.0, delta=1e-5, order=3.0)
    with pytest.raises(InputError, match=r"lifetime\.order 4, .* created at order 3, fixed for its life"):
        SiteLedger(ledger, epsilon=50.0, order=4.0)
    with pytest.raises(InputError, match=r"lifetime\.delta"):
        SiteLedger(ledger, epsilon=50.0, delta=1e-6)
    with pytest.raises(
        InputError, match=r"lifetime\.epsilon 2 in the site file cannot be met at the site ledger's"
    ):
        SiteLedger(ledger, epsilon=2.0)
    SiteLedger(ledger, epsilon=60.0)  # a new limit is recorded
    assert SiteLedger(ledger, epsilon=60.0, writable=False).report()["limit"]["set"] == [50.0, 60.0]
    with ledger.open("a") as handle:
        handle.write('{"kind": "charge", "config_hash": "nobody"}\n')
    with pytest.raises(IntegrityError, match="line 3 is corrupt"):
        SiteLedger(ledger, epsilon=60.0)
    with pytest.raises(IntegrityError, match=r"does not exist\. If this hospital has taken part"):
        SiteLedger(tmp_path / "lost.jsonl", epsilon=60.0)


_CHARGER = """
import sys
from capc_cli.commands.teacher import _budget_text
from capc_common.errors import BudgetExhaustedError
from capc_common.federation import FederationConfig, exposure_of
from capc_services.teacher.cap import LocalCap
from capc_services.teacher.site_ledger import SiteLedger

config = FederationConfig.load(sys.argv[1])
cap = LocalCap(sys.argv[2], config=config, epsilon_cap=1000.0)
cap.lifetime = SiteLedger(sys.argv[3], epsilon=float(sys.argv[4])).join(config=config, cap=cap)
print("joined", flush=True)
sys.stdin.readline()  # both processes charge at once
charged = 0
try:
    while True:
        cap.charge(batch_id=f"q{charged}", attempt=1, count=32)
        charged += 1
except BudgetExhaustedError:
    print(charged, flush=True)
"""


def test_two_federations_charging_at_once_never_cross_the_limit(tmp_path: Path) -> None:
    """Two teacher processes of one hospital, each in its own federation, charge the one ledger as fast as
    they can: every charge is checked and appended under the ledger's lock, so together they stop within
    the limit, each having charged beyond its own plan (re-collected batches) until the limit refused it."""
    limit = 25.0
    ledger = SiteLedger.init(tmp_path / "ledger.jsonl", epsilon=limit, delta=1e-5, order=4.0)
    procs = []
    for name in ("one", "two"):
        config = FederationConfig.load(_federation(tmp_path, name, order=10.0))
        LocalCap.init(tmp_path / f"{name}-cap.jsonl", config=config)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _CHARGER,
                    str(tmp_path / f"{name}.yaml"),
                    str(tmp_path / f"{name}-cap.jsonl"),
                    str(ledger),
                    str(limit),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        assert procs[-1].stdout is not None and procs[-1].stdout.readline() == "joined\n"
    for proc in procs:  # both at once
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    charged = [int(out.strip()) for out in outs]
    report = SiteLedger(ledger, epsilon=limit, writable=False).report()
    per_charge = exposure_of(FederationConfig.load(tmp_path / "one.yaml")).rdp(32, 4.0)
    assert [f["charges"] for f in report["federations"]] == charged and min(charged) > 2
    assert report["total"]["spent_rdp"] <= report["limit"]["budget_rdp"]
    assert report["limit"]["budget_rdp"] - report["total"]["spent_rdp"] < per_charge  # filled, not crossed


_HOLD = """
import fcntl, sys
with open(sys.argv[1] + ".lock", "a") as handle:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_charge_waits_while_another_process_holds_the_ledger(pki: Path, tmp_path: Path) -> None:
    """Check and append are one step under the ledger's lock (``LEDGER.lock``): while another process holds
    it, a charge neither reads nor writes; it goes on once the lock is released."""
    settings = TeacherSettings.load(_site(pki, tmp_path, _federation(tmp_path, "one", order=10.0), cap=6.0))
    exposure = exposure_of(settings.federation_config)
    create_missing_records(settings, exposure)
    cap = open_records(settings, settings.federation_config, exposure)
    ledger = settings.lifetime.ledger
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(ledger)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = ledger.read_text()
        charging = threading.Thread(target=cap.charge, kwargs={"batch_id": "q0", "attempt": 1, "count": 32})
        charging.start()
        charging.join(timeout=1.0)
        assert charging.is_alive() and ledger.read_text() == before
    finally:
        holder.communicate(input="\n", timeout=30)
    charging.join(timeout=30)
    assert not charging.is_alive() and _entries(ledger)[-1]["batch_id"] == "q0"
    cap.close()


def test_lines_counted_in_after_a_membership_change_are_counted_once(pki: Path, tmp_path: Path) -> None:
    """The ledger joined a federation under its first config; a line its cap record wrote while the site file
    had no ``lifetime:`` is counted in at the first start after a membership change. That count belongs to
    the federation already joined (by any of its hashes), so a second start counts nothing again."""
    _, old, grown = _grown(tmp_path)
    record = LocalCap.init(tmp_path / "one-cap.jsonl", config=old, order=10.0)
    ledger = SiteLedger.init(tmp_path / "ledger.jsonl", epsilon=200.0, delta=1e-5, order=5.0)
    with LocalCap(record, config=old, epsilon_cap=60.0) as cap:
        cap.lifetime = SiteLedger(ledger, epsilon=200.0).join(config=old, cap=cap)
        cap.charge(batch_id="q0", attempt=1, count=32)
    with LocalCap(record, config=old, epsilon_cap=60.0) as bare:  # the ledger never sees this one
        bare.charge(batch_id="q32", attempt=1, count=32)
        per_line = bare.lines[-1].rdp  # recorded at order 10: carried over to 5 as it is
    for _ in range(2):  # two starts under the new config, nothing charged in between
        with LocalCap(record, config=grown, epsilon_cap=60.0) as cap:
            SiteLedger(ledger, epsilon=200.0).join(config=grown, cap=cap)
    kinds = [e["kind"] for e in _entries(ledger)]
    assert kinds.count("adopt") == 1, kinds
    report = SiteLedger(ledger, epsilon=200.0, writable=False).report()
    assert [f["name"] for f in report["federations"]] == ["one"]
    expected = exposure_of(old).rdp(32, 5.0) + per_line
    assert report["total"]["spent_rdp"] == pytest.approx(expected, rel=1e-12)


def test_preflight_reports_earlier_lines_the_ledger_order_cannot_take(pki: Path, tmp_path: Path) -> None:
    """Lines of an earlier membership config recorded at order 10 cannot be carried to a ledger at order 12:
    the teacher refuses to join, and preflight's lifetime check fails saying why (it once raised out of
    the whole preflight, so none of the other checks was reported)."""
    from capc_services.teacher.preflight.budget import lifetime_check

    path, old, grown = _grown(tmp_path)
    LocalCap.init(tmp_path / "one-cap.jsonl", config=old, order=10.0)
    with LocalCap(tmp_path / "one-cap.jsonl", config=old, epsilon_cap=60.0) as cap:
        cap.charge(batch_id="q0", attempt=1, count=32)
    grown.save(path)
    SiteLedger.init(tmp_path / "site-ledger.jsonl", epsilon=200.0, delta=1e-5, order=12.0)
    settings = TeacherSettings.load(_site(pki, tmp_path, path, cap=60.0, lifetime=200.0))
    check = lifetime_check(settings, grown, exposure_of(grown))
    assert check.status == "fail" and "bounds nothing at the higher order 12" in check.detail
    assert "lifetime.order" in check.fix

"""`capc local add-party`, `retire-party`, `stop` and `restart`: what they refuse before touching anything,
the new hospital's data, and a restart that fails with the reason from the party's log (the whole flow runs
in tests/e2e/test_membership.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from protocol_force import protocol_force

from capc_common.data import site_part
from capc_common.data.catalog import load_dataset
from capc_common.errors import InputError
from capc_common.federation import FederationConfig
from capc_services.local.federation import ensure_provisioned, status
from capc_services.local.layout import Layout
from capc_services.local.membership import free_slice, own_data
from capc_services.local.processes import failure_reason
from capc_services.local.provision import LocalOptions

SMALL = LocalOptions(
    parties=3,
    teachers_per_party=2,
    sigma1=12.0,
    sigma2=10.0,
    epsilon=50.0,
    queries=256,
    batch_size=32,
    bn_batch=32,
    backbone="scatter-28x28x1",
    generator="dead_leaves",
    train_limit=128,
    evaluation_images=None,
    force=protocol_force("membership changes"),
)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """A local federation provisioned, never started."""
    layout, _ = ensure_provisioned(tmp_path_factory.mktemp("local") / "state", SMALL)
    return layout


def _files(layout: Layout) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(layout.root.rglob("*")) if p.is_file()}


def test_a_new_hospital_gets_as_much_data_as_its_peers_and_none_of_theirs(provisioned: Layout) -> None:
    data = free_slice(provisioned, FederationConfig.load(provisioned.federation))
    train = load_dataset("fashion-mnist", split="train")

    def picked(d: dict) -> set[int]:
        chosen = site_part(
            train.images,
            train.labels,
            part=d["shard"],
            parts=d["shards"],
            seed=d["seed"],
            fraction=d["fraction"],
        )
        return set(chosen.tolist())

    peers = [yaml.safe_load(provisioned.site(f"hospital-{i}").read_text())["data"] for i in (1, 2, 3)]
    new = picked(data)
    assert {k: data[k] for k in ("dataset", "seed")} == {"dataset": "fashion-mnist", "seed": 0}
    assert abs(len(new) - 128) < 60 and all(not new & picked(peer) for peer in peers)


def test_no_data_left_for_a_new_hospital_is_said_with_the_way_out(
    provisioned: Layout, tmp_path: Path
) -> None:
    """Hospitals provisioned without --train-limit hold the whole dataset between them."""
    layout = Layout(tmp_path)
    layout.sites.mkdir()
    for i in (1, 2, 3):
        data = {"dataset": "digits", "shard": i - 1, "shards": 3, "seed": 0, "fraction": 1.0}
        layout.site(f"hospital-{i}").write_text(yaml.safe_dump({"data": data}))
    config = FederationConfig.load(provisioned.federation)
    with pytest.raises(InputError, match=r"already hold all of digits .* give the new hospital its own data"):
        free_slice(layout, config)


def test_a_new_hospital_with_its_own_data_holds_none_of_the_others(
    provisioned: Layout, tmp_path: Path
) -> None:
    """`--dataset fashion-mnist`, the data the other sites select parts of, gave the new hospital all of it
    (every example in two hospitals' data); a file of its own is written with its absolute path (the parties
    run in the state directory)."""
    with pytest.raises(InputError, match=r"hospital-1, hospital-2, hospital-3 of .* hold examples of"):
        own_data(provisioned, "fashion-mnist")
    assert own_data(provisioned, "npz:site.npz") == {"dataset": f"npz:{Path.cwd() / 'site.npz'}"}
    site = tmp_path / "site.npz"
    layout = Layout(tmp_path / "other")
    layout.sites.mkdir(parents=True)
    layout.site("hospital-1").write_text(yaml.safe_dump({"data": {"dataset": str(site)}}))
    with pytest.raises(InputError, match=r"hospital-1 of .* already hold examples of npz:"):
        own_data(layout, f"npz:{site}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add-party", "hospital-2"], "'hospital-2' is already a party of federation 'capc-local'"),
        (["add-party", "Hospital_4"], "party name 'Hospital_4' must be a DNS label"),
        (["add-party", "hospital-4", "--min-parties", "9"], "quorum.min_parties 9 exceeds the 4 teacher"),
        (["add-party", "hospital-4", "--dataset", "fashion-mnist"], "already hold examples of fashion-mnist"),
        (["retire-party", "student"], "'student' is not a teacher party of federation 'capc-local'"),
        (["retire-party", "hospital-1", "--min-parties", "3"], "only 2 teacher parties remain"),
        (["restart", "hospital-9"], "'hospital-9' is not a party of the federation in"),
        (["stop", "hospital-9"], "'hospital-9' is not a party of the federation in"),
    ],
)
def test_refused_before_anything_changes(
    capsys: pytest.CaptureFixture[str], provisioned: Layout, args: list[str], says: str
) -> None:
    from capc_cli.main import main

    before = _files(provisioned)
    with pytest.raises(SystemExit) as exit_info:
        main(["local", *args, "--state-dir", str(provisioned.root)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and says in err, err
    assert "Traceback" not in err and _files(provisioned) == before


def test_status_lists_every_party_of_the_federation_started_or_not(provisioned: Layout) -> None:
    from capc_cli.commands.local import _status_text

    result = status(provisioned.root)
    assert list(result["parties"]) == ["guardian", "student", "hospital-1", "hospital-2", "hospital-3"]
    assert all(p["state"] == "not running" and p["pid"] is None for p in result["parties"].values())
    assert "  hospital-3   teacher  pid -        not running" in _status_text(result)


def test_a_restarted_party_that_exits_at_once_fails_with_the_reason_from_its_log(
    capc, tmp_path: Path
) -> None:
    """`capc local restart guardian` printed a pid and exited 0 for a guardian that died at once."""
    root = tmp_path / "state"
    layout, _ = ensure_provisioned(root, SMALL)
    site = yaml.safe_load(layout.site("guardian").read_text())
    site["tls"]["cert"] = "../certs/missing.crt"
    layout.site("guardian").write_text(yaml.safe_dump(site))
    proc = capc("local", "restart", "guardian", "--state-dir", str(root), "--ready-timeout", "120")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "guardian (pid " in proc.stderr and "exited during start-up: " in proc.stderr
    assert "missing.crt" in proc.stderr and f"(log: {layout.log('guardian')})" in proc.stderr
    recorded = json.loads(layout.state.read_text())["processes"]
    assert [p["party"] for p in recorded] == ["guardian"]  # status and down see the process it started


def test_the_reason_a_process_stopped_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "party.log"
    assert failure_reason(log) == f"nothing in its log {log}"
    record = {"level": "error", "msg": "guardian stopped", "error": "ledger belongs to another federation"}
    log.write_text(json.dumps({"level": "info", "msg": "starting"}) + "\n" + json.dumps(record) + "\n")
    assert failure_reason(log) == "ledger belongs to another federation"
    with log.open("a") as handle:
        handle.write("error: site file /x/guardian.yaml is invalid: tls.cert: missing\n")
    assert failure_reason(log) == "site file /x/guardian.yaml is invalid: tls.cert: missing"


def test_a_retired_hospitals_name_is_not_given_again(
    capsys: pytest.CaptureFixture[str], provisioned: Layout, tmp_path: Path
) -> None:
    """A retired hospital's site file and cap record stay (its own account of what it released): adding a
    party of that name would overwrite them, or, on failure, delete them. Files of a name no change ever added
    were left by an interrupted add-party, which was named the same way (a retired hospital's)."""
    import shutil

    from capc_cli.main import main
    from capc_common.federation import retire_party
    from capc_services.tls import certificate_info

    root = tmp_path / "copy"
    shutil.copytree(provisioned.root, root)
    layout = Layout(root)
    config = FederationConfig.load(layout.federation)
    serial = certificate_info(layout.certs / "hospital-3.crt").serial
    retire_party(config, name="hospital-3", serial=serial, min_parties=2).save(layout.federation)
    record = layout.party_dir("hospital-3") / "cap.jsonl"
    kept = record.read_text()
    layout.site("hospital-8").write_text("left by an interrupted add-party\n")
    for name, says in (
        ("hospital-3", "hospital-3 was a party of the federation in"),
        ("hospital-8", "hospital-8 has files in"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["local", "add-party", name, "--state-dir", str(root)])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_info.value.code == 2 and says in err, err
        if name == "hospital-3":
            assert "give the new hospital another name" in err
    assert "no membership change of its federation.yaml added it: an interrupted" in err
    assert f"`capc local add-party --state-dir {root} hospital-8` left them" in err
    assert record.read_text() == kept and not (root / "federation-next.yaml").exists()


def test_a_party_added_to_federation_yaml_by_hand_is_named_with_the_command_to_use(
    capsys: pytest.CaptureFixture[str], provisioned: Layout, tmp_path: Path
) -> None:
    """The manual way (a new federation.yaml copied into the state directory) left `capc local up` failing
    with "site file … hospital-4.yaml does not exist"."""
    import shutil

    from capc_cli.main import main
    from capc_common.federation import add_party

    root = tmp_path / "copy"
    shutil.copytree(provisioned.root, root)
    add_party(FederationConfig.load(root / "federation.yaml"), name="hospital-4", heads=2).save(
        root / "federation.yaml"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["local", "restart", "hospital-4", "--state-dir", str(root)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "hospital-4 has no admin port in" in err, err
    assert f"capc local add-party --state-dir {root} NAME" in err

"""`capc local` refuses what it cannot do before touching anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from capc_common.errors import InputError
from capc_services.local.provision import LocalOptions, provision


def test_status_and_down_of_a_directory_without_a_federation(capc, tmp_path: Path) -> None:
    status = capc("local", "status", "--state-dir", str(tmp_path))
    assert status.returncode == 2
    assert "no local federation was started" in status.stderr
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
    assert "no batch could ever run" in proc.stderr and "raise mechanism.sigma2" in proc.stderr
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
    assert "raise mechanism.sigma (now 0.5) or lower mechanism.sampling_rate" in capsys.readouterr().err
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
            provision(root, LocalOptions(teacher_cap=-1.0))
    assert not fresh.exists()
    assert [p.name for p in existing.iterdir()] == ["precious.txt"]
    layout, config, _ = provision(fresh, LocalOptions())
    assert layout.federation.exists()
    for name in config.teacher_names:  # capc local makes the explicit init a real site makes itself
        assert (layout.party_dir(name) / "cap.jsonl").is_file()


def test_init_cap_creates_the_record_once(capc, tmp_path: Path) -> None:
    layout, config, _ = provision(tmp_path / "fed", LocalOptions())
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

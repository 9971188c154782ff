"""`capc local` refuses what it cannot do before touching anything."""

from __future__ import annotations

from pathlib import Path


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
    assert "no batch could ever run" in proc.stderr and "raise sigma2" in proc.stderr
    assert not state.exists()

"""A release party's backbone work in a child process: the serving process gets the same features and basis
it computed itself before, the child's refusals as the same errors, a child's death by name, and nothing of
the child (no process, no features on disk) once the party stops or dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from sites_harness import federation_dict, teacher_settings

from capc_common.errors import CapcError, InputError
from capc_common.federation import FederationConfig, check_runnable
from capc_common.federation.releases import ReleaseProtocol
from capc_common.mechanisms.central import records_digest
from capc_common.models import backbone_sha256
from capc_common.synth import generate
from capc_services.teacher.featurise import Expected, featurise_apart
from capc_services.teacher.train import party_examples, record_features

RECORDS = 150


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A secure-aggregation DP-SGD federation on the shipped hybrid backbone (a small public basis, computed
    once into the site's shared cache) and a hospital's 150 labelled images."""
    tmp = tmp_path_factory.mktemp("featurise")
    mechanism = {
        "name": "secagg-dpsgd", "rounds": 2, "noise_multiplier": 2.0, "clip": 0.1,
        "projection": {"dim": 8, "images": 32, "generators": ["dead_leaves"], "seed": 7},
    }  # fmt: skip
    data = federation_dict(
        mechanism=mechanism,
        budget={"epsilon": 300.0, "delta": 1e-5, "order": 10},
        backbone={"name": "hybrid-28x28x1", "sha256": backbone_sha256("hybrid-28x28x1")},
    )
    FederationConfig.from_dict(data).save(tmp / "federation.yaml")
    images = generate("dead_leaves", seed=4, start=0, count=RECORDS, height=28, width=28, channels=1)
    np.savez(tmp / "site.npz", images=images, labels=np.arange(RECORDS) % 10)
    return tmp


def _settings(site: Path, data: Path, **fields: Any) -> Any:
    return teacher_settings(
        site, site / "federation.yaml", {"dataset": f"npz:{data}"}, torch_threads=1,
        feature_cache=site / "public", **fields,
    )  # fmt: skip


def _expected(settings: Any) -> Expected:
    """What the serving process reads at start (serve_releases)."""
    images, _, _ = party_examples(settings)
    config = settings.federation_config
    return Expected(
        config.config_hash(), records_digest(images), check_runnable(config, model=False).feature_dim
    )


def _serving(settings: Any) -> ReleaseProtocol:
    return check_runnable(settings.federation_config, model=False).release_protocol()


def _apart(settings: Any, **expected: Any) -> np.ndarray | None:
    """:func:`featurise_apart` as serve_releases runs it (``expected``: a field read otherwise at start)."""
    at_start = _expected(settings)
    return featurise_apart(
        settings,
        _serving(settings),
        expected=Expected(**{**at_start.__dict__, **expected}),
        stop=threading.Event(),
    )


def test_the_child_computes_what_the_party_computed_itself(site: Path, tmp_path: Path) -> None:
    """The features bit for bit those of the in-process featurisation, the basis the one the protocol computes
    itself; without a records cache, and with one: written there once, then read back."""
    settings = _settings(site, site / "site.npz")
    config = settings.federation_config
    itself = check_runnable(config, model=True, cache=settings.feature_cache)
    images, _, _ = party_examples(settings)
    expected = record_features(settings, itself.backbone, images)
    basis = itself.release_protocol().precomputed()["basis"]
    written = None
    for records in (None, tmp_path / "records", tmp_path / "records"):
        serving = _serving(settings)
        site_settings = settings.model_copy(update={"records_cache": records})
        features = featurise_apart(
            site_settings, serving, expected=_expected(settings), stop=threading.Event()
        )
        assert features is not None
        assert features.dtype == np.float32 and features.tobytes() == expected.tobytes()
        assert serving.precomputed()["basis"].tobytes() == basis.tobytes()
        if records is not None:
            (stored,) = records.glob("records-*.npy")
            assert np.load(stored).tobytes() == expected.tobytes()
            assert written in (None, stored.stat().st_mtime_ns)  # the second run read it, wrote nothing
            written = stored.stat().st_mtime_ns


def test_a_refusal_in_the_child_is_the_same_error_in_the_party(site: Path, tmp_path: Path) -> None:
    """What the child refuses (here: a data section naming no file) reaches the serving process as the same
    error and message, not a traceback or a bare exit status."""
    settings = _settings(site, tmp_path / "gone.npz")
    with pytest.raises(InputError) as direct:
        party_examples(settings)
    ok = _settings(site, site / "site.npz")
    with pytest.raises(InputError) as apart:
        featurise_apart(settings, _serving(ok), expected=_expected(ok), stop=threading.Event())
    assert str(apart.value) == str(direct.value)


def _edit_federation(site: Path, settings: Any) -> Any:
    data = settings.federation_config.model_dump(mode="json", exclude_none=True)
    data["mechanism"]["rounds"] += 1
    FederationConfig.from_dict(data).save(site / "edited.yaml")
    return settings.model_copy(update={"federation": site / "edited.yaml"})


def _edit_records(site: Path, settings: Any) -> Any:
    with np.load(site / "site.npz") as found:
        images, labels = found["images"].copy(), found["labels"]
    images[0, 0, 0, 0] ^= 1
    np.savez(site / "edited.npz", images=images, labels=labels)
    return _settings(site, site / "edited.npz")


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (_edit_federation, InputError, r"federation\.yaml changed while this party featurised its records"),
        (_edit_records, InputError, "the site's records changed while this party featurised them"),
        (None, CapcError, "the backbone gives float32 rows of 99"),
    ],
)
def test_what_the_child_hands_back_is_checked_against_what_the_party_read(
    site: Path, tmp_path: Path, edit: Any, error: type[CapcError], message: str
) -> None:
    """federation.yaml or the records edited between the party's start and its featurisation (the child
    reads them again): refused by name before anything is adopted; features of another width than the
    backbone's are refused too."""
    (tmp_path / "site").mkdir()
    for name in ("federation.yaml", "site.npz"):
        (tmp_path / "site" / name).write_bytes((site / name).read_bytes())
    settings = _settings(tmp_path / "site", tmp_path / "site" / "site.npz")
    settings = settings.model_copy(update={"feature_cache": site / "public"})
    at_start = _expected(settings)
    changed = settings if edit is None else edit(tmp_path / "site", settings)
    serving = _serving(settings)
    dim = {"feature_dim": 99} if edit is None else {}
    with pytest.raises(error, match=message):
        featurise_apart(
            changed, serving, expected=Expected(**{**at_start.__dict__, **dim}), stop=threading.Event()
        )


def _featurising_child(parent: int, deadline_s: float = 60) -> psutil.Process:
    """The featurising child of ``parent`` once it handles SIGTERM (its own handlers installed: it works)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children():
            try:
                featurises = child.cmdline()[1:3] == ["-m", "capc_services.teacher.featurise"]
                if featurises and _handles_sigterm(child):
                    return child
            except (psutil.Error, FileNotFoundError):  # it ended meanwhile
                continue
        time.sleep(0.02)
    raise AssertionError("the party never started its featurising process")


def _handles_sigterm(child: psutil.Process) -> bool:
    status = Path(f"/proc/{child.pid}/status").read_text()
    (caught,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def test_a_child_killed_outright_is_named_with_its_likely_cause(site: Path) -> None:
    """A child the kernel kills (SIGKILL: what its out-of-memory killer sends) is reported by the signal's
    name and the likely cause, not as a bare exit status; "see the log above" only if it wrote anything."""
    settings = _settings(site, site / "site.npz")

    def kill() -> None:
        _featurising_child(os.getpid()).kill()

    killer = threading.Thread(target=kill)
    killer.start()
    with pytest.raises(CapcError) as ended:
        _apart(settings)
    killer.join()
    assert str(ended.value).startswith(
        "the featurising process was killed by SIGKILL — most likely out of memory: raise the teacher's "
        "memory limit"
    ), ended.value
    assert "see the log above" not in str(ended.value)  # killed before it wrote anything


@pytest.mark.parametrize(
    ("returncode", "stdout", "logged", "message"),
    [
        (1, "", True, "the featurising process exited 1 without a result (see the log above)"),
        (1, "", False, "the featurising process exited 1 without a result"),
        (143, "", False, "the featurising process was stopped by SIGTERM without a result"),
        (-11, "", True, "the featurising process was killed by SIGSEGV without a result (see the log above)"),
        (0, '{"public": ["basis"], "features": null}', False, "a result this party cannot read"),
        (0, '{"public": 1, "features": null, "config": "c", "records": "r"}', False, "cannot read"),
    ],
)
def test_how_the_child_ended_is_said_precisely(
    returncode: int, stdout: str, logged: bool, message: str
) -> None:
    """An end without a result by its exit status or signal, pointing at the log only when the child wrote
    to it; a result of other keys or types refused rather than read."""
    from capc_services.teacher.featurise import _result

    with pytest.raises(CapcError) as ended:
        _result(returncode, stdout, logged=logged)
    assert str(ended.value) == message if returncode else message in str(ended.value)


def _party(site: Path, tmp_path: Path, script: str, **popen: Any) -> subprocess.Popen[Any]:
    """A party process running ``script`` on the site (with a records cache), in a process group of its own,
    its temporary files under ``tmp_path / "tmp"``."""
    settings = _settings(site, site / "site.npz", records_cache=tmp_path / "records")
    (tmp_path / "settings.json").write_text(settings.model_dump_json())
    (tmp_path / "tmp").mkdir()
    return subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "settings.json")],
        cwd=tmp_path,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
        **popen,
    )


def _nothing_left(child: psutil.Process, tmp_path: Path) -> None:
    """The featurising child ends within 10 s, leaving no temporary file and no half-written cache file."""
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert gone and not alive, "the featurising process outlived its party by 10 s"
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not list((tmp_path / "records").glob(".*.tmp"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_party_stopped_while_it_featurises_ends_quietly(site: Path, tmp_path: Path, signum: int) -> None:
    """SIGTERM or ^C to the party's process group (the terminal's, or a container's stop) while the child
    featurises: both end at once, without a traceback or an error, and leave no features on disk."""
    party = _party(site, tmp_path, STOPPED, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child = _featurising_child(party.pid)
        os.killpg(party.pid, signum)
        out, err = party.communicate(timeout=60)
        assert party.returncode == 0 and out.strip() == "stopped", (out, err)
        assert "Traceback" not in err and "Error" not in err, err
        _nothing_left(child, tmp_path)
    finally:
        if party.poll() is None:
            party.kill()


def test_a_child_that_does_not_stop_is_killed_after_the_grace(site: Path, tmp_path: Path) -> None:
    """A child that cannot act on SIGTERM (here: stopped, SIGSTOP) when the party stops: asked once, waited
    the grace (1 s here), then killed — the party ends instead of asking again for ever."""
    grace = "\nimport capc_services.teacher.featurise as f; f._STOP_GRACE_S = 1.0"
    script = STOPPED.replace("STOP = stop_event_on_signals()", "STOP = stop_event_on_signals()" + grace)
    party = _party(site, tmp_path, script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child = _featurising_child(party.pid)
        child.suspend()
        started = time.monotonic()
        party.send_signal(signal.SIGTERM)  # the party alone: the child never sees it act
        out, err = party.communicate(timeout=30)
        assert party.returncode == 0 and out.strip() == "stopped", (out, err)
        assert time.monotonic() - started < 15
        gone, alive = psutil.wait_procs([child], timeout=5)
        assert gone and not alive
    finally:
        if party.poll() is None:
            party.kill()


def test_the_child_ends_with_its_party_and_leaves_nothing_behind(site: Path, tmp_path: Path) -> None:
    """A party killed (SIGKILL: no clean-up of its own) while its child featurises: the child ends within
    seconds instead of running its work to the end, and no file of their features is left: the one the
    child writes has no name (deleted, or never named), and the records cache keeps no half-written one."""
    parent = _party(site, tmp_path, PARENT)
    try:
        child = _featurising_child(parent.pid)
        fd = child.cmdline()[3]
        target = os.readlink(f"/proc/{child.pid}/fd/{fd}")
        assert target.endswith("(deleted)") or "/#" in target, target  # no name on disk
        parent.kill()
        parent.wait()
        _nothing_left(child, tmp_path)
    finally:
        if parent.poll() is None:
            parent.kill()


#: A party that featurises its site apart (its settings file as argument).
PARENT = """
import sys, threading
from pathlib import Path
from capc_common.federation import check_runnable
from capc_common.mechanisms.central import records_digest
from capc_services.teacher.featurise import Expected, featurise_apart
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import party_examples
settings = TeacherSettings.model_validate_json(Path(sys.argv[1]).read_text())
config = settings.federation_config
runnable = check_runnable(config, model=False)
expected = Expected(config.config_hash(), records_digest(party_examples(settings)[0]), runnable.feature_dim)
STOP = threading.Event()
features = featurise_apart(settings, runnable.release_protocol(), expected=expected, stop=STOP)
print("stopped" if features is None else "featurised")
"""

#: The same party stopping on SIGTERM and SIGINT as ``capc teacher serve`` does.
STOPPED = PARENT.replace(
    "STOP = threading.Event()",
    "from capc_services.common.runtime import stop_event_on_signals\nSTOP = stop_event_on_signals()",
)

"""``docker compose up`` for real: the repository's docker-compose.yml on a real engine, plus one hospital
deployed by executing docs/operations.md's "Deploy a teacher at a hospital" commands.

One run covers: the certificate job, the guardian and the student from compose; hospital-c joining with only
its own key (made in the container), its signed certificate, the federation file and an ``.npz`` of its
data (``dataset: /data/hospital-c.npz``, a plain path); hospital-a and hospital-b from compose; hospital-a
killed after the first labelled batch while the others carry on; the budget read from the host through the
published admin port; the student published; ``docker compose down``; then the ledger and the model checked
on the host's volumes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cryptography import x509
from docker_harness import IMAGE, REPO, Engine, Project, run

from capc_common.data import load_dataset, partition
from capc_services.local.provision import free_port
from capc_services.tls.csr import fingerprint

# The first test of a session also waits for the image build (minutes from nothing, seconds when cached).
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(3600)]

# One per session (sessions in several worktrees may share the engine); letters and digits only, since
# docker-compose 1.29 strips anything else from volume names.
PROJECT = f"capctest{os.getpid()}"
OPERATIONS = REPO / "docs" / "operations.md"
SECTION = "## Deploy a teacher at a hospital (container)"
HOSPITAL = "hospital-c"
CAPC = (sys.executable, "-m", "capc_cli")
KILLED = "hospital-a"


def doc_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block in the section, in order, dedented."""
    text = OPERATIONS.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"^( *)```(\w+)\n(.*?)^\1```", section, flags=re.S | re.M)
    return [
        (lang, "\n".join(line[len(indent) :] for line in body.splitlines())) for indent, lang, body in blocks
    ]


def commands(script: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = script.replace("\\\n", " ")
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def wait_for(
    what: str, check: Callable[[], Any], *, timeout: float, project: Project, every: float = 2.0
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the compose logs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{project.logs()}")


def get(url: str, token: str, ca: Path) -> Any:
    """GET an admin route over HTTPS, the party's certificate verified against the federation's CA."""
    try:
        response = httpx.get(
            url,
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=str(ca)),
            timeout=5,
        )
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def hospital_npz(path: Path) -> int:
    """hospital-c's own data: its Fashion-MNIST shard in the compose federation (2 of 3, 3,000 images)."""
    data = load_dataset("fashion-mnist", split="train")
    rows = partition(data.labels, shards=3, scheme="iid", seed=0)[2][:3000]
    np.savez(path, images=data.images[rows], labels=data.labels[rows])
    return len(rows)


@pytest.fixture
def project(engine: Engine, image: dict[str, Any]) -> Iterator[Project]:
    env = {
        "CAPC_IMAGE": image["tag"],
        "CAPC_BASE_IMAGE": image["base"],
        "CAPC_GUARDIAN_ADMIN_PORT": str(free_port()),
        "CAPC_STUDENT_ADMIN_PORT": str(free_port()),
        # DIET-CaPC: its batches are what this run kills a teacher in the middle of
        "CAPC_MECHANISM": "confident-gnmax",
    }
    project = Project(engine, PROJECT, env)

    def clean() -> None:
        project.compose("down", "-v", "--remove-orphans", check=False)
        engine.docker("rm", "-f", f"{PROJECT}-teacher", check=False)
        engine.docker("volume", "rm", f"{PROJECT}-{HOSPITAL}", check=False)

    clean()
    yield project
    clean()


def test_compose_federation_with_a_hospital_deployed_from_the_docs(
    project: Project, engine: Engine, tmp_path: Path
) -> None:
    env = project.env
    # HTTPS (CAPC_ADMIN__TLS): the certs job's certificates carry the IP SAN 127.0.0.1
    guardian_admin = f"https://127.0.0.1:{env['CAPC_GUARDIAN_ADMIN_PORT']}/api/v1"
    student_admin = f"https://127.0.0.1:{env['CAPC_STUDENT_ADMIN_PORT']}/api/v1"
    started = time.monotonic()
    # The certificate job runs first (depends_on: completed); the student waits for a healthy guardian.
    # hospital-a and hospital-b train their heads while hospital-c is set up by hand below.
    project.compose("up", "-d", "--no-build", "guardian", "student", "hospital-a", "hospital-b")
    certs = project.volume_dir("certs")
    ca = certs / "ca.crt"
    token = (certs / "guardian.token").read_text().strip()  # one admin token per role
    student_token = (certs / "student.token").read_text().strip()

    def kill_after_the_first_batch() -> tuple[float, dict[str, Any]]:
        # Whoever answers the first batch, hospital-a goes down right after it: from then on the federation
        # needs hospital-b and hospital-c (quorum 2 of 3), so the rest of the run proves both work. Batches
        # take tenths of a second here: hospital-a and hospital-b once spent the whole budget before a poll
        # saw the first one. So the guardian's ledger is watched, and the student (which drives the stream)
        # is paused from the first settled batch until hospital-a is down (containers looked up before:
        # `docker compose ps` takes longer than a batch).
        student, killed = project.container("student"), project.container(KILLED)
        wait_for(
            "the first labelled batch",
            lambda: (get(f"{guardian_admin}/budget", token, ca) or {}).get("batches", 0) > 0,
            timeout=900,
            project=project,
            every=0.02,
        )
        first_label_s = time.monotonic() - started
        engine.docker("pause", student)
        try:
            engine.docker("kill", killed)
            return first_label_s, get(f"{guardian_admin}/parties", token, ca)["parties"]
        finally:
            engine.docker("unpause", student)

    killer = ThreadPoolExecutor(max_workers=1).submit(kill_after_the_first_batch)

    # ---- hospital-c: docs/operations.md, executed --------------------------------------------------------
    blocks = doc_blocks()
    languages = [lang for lang, _ in blocks]
    assert languages == ["bash", "bash", "yaml", "bash", "bash", "bash", "bash"], languages
    build, request, site, install, train, preflight, serve = (text for _, text in blocks)
    assert commands(build) == [
        "docker build -f deploy/Dockerfile -t diet-capc:latest ."
    ]  # the fixture's build
    host_port = free_port()
    replacements = [
        ("/srv/", f"{tmp_path}/srv/"),
        ("capc-hospital-a", f"{PROJECT}-{HOSPITAL}"),
        ("capc-teacher", f"{PROJECT}-teacher"),
        ("diet-capc:latest", IMAGE),
        ("hospital-a", HOSPITAL),
        ("student.acme.example", "student"),
        ("guardian.acme.example", "guardian"),
        ("127.0.0.1:8080", f"127.0.0.1:{host_port}"),
        # A hospital reaches the federation over its network; here, over the compose project's network.
        ("docker run ", f"docker run --network {PROJECT}_default "),
    ]

    def adapt(text: str) -> str:
        for old, new in replacements:
            text = text.replace(old, new)
        return text

    inbox = tmp_path / "inbox"  # what the hospital receives from the coordinator, and its own files
    inbox.mkdir()

    def shell(command: str, **kwargs: Any) -> Any:
        return run("bash", "-euo", "pipefail", "-c", command, cwd=inbox, **kwargs)

    for command in commands(adapt(request)):
        shell(command)
    csr = tmp_path / "srv" / "capc" / "certs" / f"{HOSPITAL}.csr"
    assert csr.is_file() and (csr.parent / f"{HOSPITAL}.key").stat().st_mode & 0o077 == 0
    # The coordinator signs the request with the compose federation's CA (the certs volume on this host).
    federation = REPO / "deploy" / "compose" / "federation-confident-gnmax.yaml"
    read_out = fingerprint(x509.load_pem_x509_csr(csr.read_bytes()))  # what the hospital reads out
    run(*CAPC, "cert", "sign", str(csr), "--ca-dir", str(certs), "--federation", str(federation),
        "--out", str(inbox / f"{HOSPITAL}.crt"), "--fingerprint", read_out)  # fmt: skip
    (inbox / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    (inbox / "federation.yaml").write_bytes(federation.read_bytes())
    (inbox / f"{HOSPITAL}.yaml").write_text(adapt(site))
    examples = hospital_npz(inbox / f"{HOSPITAL}.npz")
    for command in commands(adapt(install)):
        shell(command)
    train_command, *after_training = commands(adapt(train))  # then init-cap: the cap record, created once
    trained = shell(train_command, timeout=900)
    # the site's images less its holdout (by each image's keyed hash), trained on inside the container
    trained_on = re.search(r"^examples\s+(\d+)$", trained.stdout, re.M)
    held_out = re.search(r"^held_out\s+(\d+)$", trained.stdout, re.M)
    assert trained_on and held_out, trained.stdout
    assert int(trained_on[1]) + int(held_out[1]) == examples and 0 < int(held_out[1]) < examples // 4
    assert [c for c in after_training if " teacher init-cap " in c], after_training
    for command in after_training:
        shell(command)
    checked = shell(commands(adapt(preflight))[0], timeout=600, check=False)
    assert checked.returncode == 0, f"preflight found a failure:\n{checked.stdout}\n{checked.stderr}"
    first, curl = commands(adapt(serve))
    shell(first)
    wait_for("hospital-c's admin port", lambda: shell(curl, check=False).returncode == 0, timeout=300,
             project=project)  # fmt: skip

    status = json.loads(shell(curl).stdout)  # the docs' curl, against hospital-c's admin port on this host
    assert status["party"] == HOSPITAL, status
    first_label_s, at_kill = killer.result(timeout=900)

    progress = wait_for(
        "the published student",
        lambda: (
            (p := get(f"{student_admin}/progress", student_token, ca))
            and p["state"] in ("published", "failed")
            and p
        ),
        timeout=900,
        project=project,
    )
    assert progress["state"] == "published", progress
    assert "budget exhausted" in progress["stopped_reason"], progress["stopped_reason"]
    budget = get(f"{guardian_admin}/budget", token, ca)
    parties = get(f"{guardian_admin}/parties", token, ca)["parties"]
    # the dashboard's relay reached the student over HTTPS with the student's token
    assert get(f"{guardian_admin}/student", token, ca)["reachable"] is True
    total_s = time.monotonic() - started
    assert 0 < budget["epsilon_spent"] <= budget["epsilon_limit"], budget
    # The killed party answered nothing more (a batch in flight may still count); the others carried on,
    # hospital-c (deployed from the docs) among them.
    assert parties[KILLED]["batches"] <= at_kill[KILLED]["batches"] + 1, (at_kill, parties)
    for name in ("hospital-b", HOSPITAL):
        assert parties[name]["batches"] > at_kill.get(name, {}).get("batches", 0), (at_kill, parties)
    print(
        f"\ncompose federation: first label {first_label_s:.0f} s after `up`, published after "
        f"{total_s:.0f} s; "
        f"ε {budget['epsilon_limit']} guaranteed ({budget['epsilon_spent']:.2f} spent), "
        f"{budget['queries']} queries, "
        f"{budget['answered']} answered; student accuracy {progress['published'].get('accuracy')}"
    )

    # ---- down; the state is on the host's volumes ---------------------------------------------------------
    engine.docker("rm", "-f", f"{PROJECT}-teacher")
    project.compose("down")
    ledger = project.volume_dir("guardian-ledger") / "ledger.sqlite"
    verified = json.loads(run(*CAPC, "budget", "verify", "--ledger", str(ledger), "--format", "json").stdout)
    assert verified["ok"] is True, verified
    totals = verified["totals"]  # recomputed from the hash-chained rows on the host's volume
    assert totals["epsilon_spent"] == pytest.approx(budget["epsilon_spent"]), (totals, budget)
    assert (totals["queries"], totals["answered"]) == (budget["queries"], budget["answered"]), (
        totals,
        budget,
    )
    published = project.volume_dir("student-state") / "published"
    card = json.loads((published / "model_card.json").read_text())
    assert (published / "student.safetensors").stat().st_size > 0
    # The guarantee is the filter's limit; the realised spend is the odometer beside it.
    assert card["privacy"]["epsilon"] == budget["epsilon_limit"], card
    assert card["privacy"]["epsilon_spent"] == pytest.approx(budget["epsilon_spent"]), card
    assert shlex.split(curl)[0] == "curl"

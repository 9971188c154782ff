"""The Kubernetes manifests (deploy/k8s): the base and the hospital overlay rendered with `kubectl kustomize`
after the documented certificate commands, validated offline against the Kubernetes schemas
(`kubernetes-validate`, strict: no unknown field), and held to what the parties really run: every command
line parses with the `capc` CLI itself, every port, probe and path in a site file is one the container
serves or mounts, and every pod runs as the image's non-root user on a read-only root file system."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import click
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from capc_cli.main import cli, main
from capc_common import __version__
from capc_common.federation import FederationConfig
from capc_services.guardian.settings import GuardianSettings
from capc_services.k8s import PLACEHOLDER_REGISTRY
from capc_services.student.settings import StudentSettings
from capc_services.teacher.settings import TeacherSettings
from capc_services.tls.csr import fingerprint

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
#: The oldest Kubernetes minor still widely run, and the newest the validator ships schemas for.
VERSIONS = ("1.29.0", f"{kubernetes_validate.latest_version()}.0")
SETTINGS = {"guardian": GuardianSettings, "student": StudentSettings, "teacher": TeacherSettings}
ROLES = tuple(SETTINGS)
Docs = list[dict[str, Any]]


def _kubectl() -> str:
    """kubectl, or a skip saying why; under CI=true a missing kubectl fails (a local stand-in for the suite's
    general required-tool check)."""
    found = shutil.which("kubectl")
    if found is not None:
        return found
    reason = (
        "kubectl is not installed (Debian package kubectl): the manifests are rendered by `kubectl kustomize`"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run this test")
    pytest.skip(reason)


def _capc(*args: str) -> None:
    """Run the real `capc` entry point in-process; fail with its output unless it exits 0."""
    try:
        main(list(args))
    except SystemExit as exc:
        assert exc.code in (0, None), f"capc {' '.join(args)} exited {exc.code}"


def read_out(csr: Path) -> str:
    """A request's fingerprint, as its party reads it out to the coordinator."""
    return fingerprint(x509.load_pem_x509_csr(csr.read_bytes()))


def _render(kubectl: str, directory: Path) -> Docs:
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Docs]:
    """The base and the hospital overlay, each rendered after the commands their kustomization.yaml gives."""
    kubectl = _kubectl()
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("certs"))
    certs = root / "base" / "certs"
    _capc(
        "cert", "bootstrap", "--dir", str(certs), "--name", "capc-k8s", "--party", "guardian",
        "--party", "student", "--party", "hospital-a", *(f"--admin-token={certs}/{r}.token" for r in ROLES),
    )  # fmt: skip
    # hospital-b: its own key and request; the coordinator signs it against the federation it is part of.
    hospital = root / "overlays" / "hospital"
    shutil.copy(root / "base" / "federation.yaml", hospital / "federation.yaml")
    _capc("cert", "request", "hospital-b", "--out-dir", str(hospital / "certs"))
    csr = hospital / "certs" / "hospital-b.csr"
    _capc(
        "cert", "sign", str(csr), "--ca-dir", str(certs), "--federation", str(hospital / "federation.yaml"),
        "--out", str(hospital / "certs" / "hospital-b.crt"), "--fingerprint", read_out(csr),
    )  # fmt: skip
    shutil.copy(certs / "ca.crt", hospital / "certs" / "ca.crt")
    (hospital / "certs" / "admin.token").write_text("hospital-b-" + "t" * 40)
    return {"base": _render(kubectl, root / "base"), "hospital": _render(kubectl, hospital)}


def _of(docs: Docs, kind: str) -> Docs:
    return [d for d in docs if d["kind"] == kind]


def _named(docs: Docs, kind: str, prefix: str) -> dict[str, Any]:
    """The one ``kind`` whose (generated, hash-suffixed) name starts with ``prefix``."""
    (found,) = [d for d in _of(docs, kind) if d["metadata"]["name"].startswith(prefix)]
    return found


@pytest.mark.parametrize("which", ["base", "hospital"])
def test_every_object_is_valid_against_the_kubernetes_schemas(rendered: dict[str, Docs], which: str) -> None:
    for doc in rendered[which]:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    # Strict validation is on: an unknown field is caught (e.g. a probe's misspelt key).
    deployment = _of(rendered[which], "Deployment")[0]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {"path": "/livez"}
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGett"):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_the_base_runs_the_whole_federation_and_the_overlay_only_a_teacher(rendered: dict[str, Docs]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered["base"] if d["kind"] != "Secret")
    assert [n for k, n in kinds if k == "Deployment"] == ["capc-guardian", "capc-student", "capc-teacher"]
    assert [n for k, n in kinds if k == "Service"] == [
        "capc-guardian",
        "capc-student",
    ]  # nothing dials a teacher
    hospital = rendered["hospital"]
    assert [d["metadata"]["name"] for d in _of(hospital, "Deployment")] == ["capc-teacher"]
    assert not _of(hospital, "Service")
    namespaces = {d["metadata"].get("namespace") for d in hospital if d["kind"] != "Namespace"}
    assert namespaces == {"capc-hospital-b"}
    (policy,) = _of(hospital, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []
    pvcs = {d["metadata"]["name"] for d in _of(hospital, "PersistentVolumeClaim")}
    assert pvcs == {"capc-teacher-state", "capc-teacher-data"}


def _command(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Parse a container's arguments with the `capc` CLI itself (the image's entry point): the command path
    and its parameters; an unknown command or option, or a missing required one, fails here."""
    command: click.Command = cli
    rest, path = list(args), []
    while isinstance(command, click.Group):
        name, *rest = rest
        assert name in command.commands, f"`capc {' '.join([*path, name])}` is not a command"
        command = command.commands[name]
        path.append(name)
    context = command.make_context(f"capc {' '.join(path)}", rest)
    return path, context.params


def _deployments(rendered: dict[str, Docs]) -> Iterator[tuple[Docs, dict[str, Any]]]:
    for docs in rendered.values():
        for deployment in _of(docs, "Deployment"):
            yield docs, deployment


def _mounts(
    docs: Docs, pod: dict[str, Any], container: dict[str, Any]
) -> dict[PurePosixPath, set[str] | None]:
    """Where the container sees what: mount path -> the file names a ConfigMap or Secret (after the init
    container's copy) puts there, or None for a writable or data volume."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    copied: set[str] = set()
    for init in pod.get("initContainers", []):
        for mount in init["volumeMounts"]:
            secret = volumes[mount["name"]].get("secret")
            if secret is not None:
                copied |= set(_named(docs, "Secret", secret["secretName"])["data"])
    seen: dict[PurePosixPath, set[str] | None] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            seen[PurePosixPath(mount["mountPath"])] = set(
                _named(docs, "ConfigMap", volume["configMap"]["name"])["data"]
            )
        elif "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            seen[PurePosixPath(mount["mountPath"])] = copied
        else:
            seen[PurePosixPath(mount["mountPath"])] = None
    return seen


def _served(path: str, mounts: dict[PurePosixPath, set[str] | None]) -> bool:
    """Whether ``path`` is a file the container has (in a ConfigMap or Secret) or can write (a volume)."""
    target = PurePosixPath(path)
    for where, files in mounts.items():
        if target.is_relative_to(where):
            return files is None or (target.parent == where and target.name in files)
    return False


def _paths(site: Any) -> list[str]:
    """Every file or directory a site file names."""
    found = [site.federation, site.tls.ca, site.tls.cert, site.tls.key, site.admin.token_file]
    for field in ("ledger", "store", "output_dir", "heads"):
        if hasattr(site, field):
            found.append(getattr(site, field))
    if isinstance(site, TeacherSettings):
        found.append(site.cap.record)
        if site.lifetime is not None:  # the hospital's site ledger, on its state volume
            found.append(site.lifetime.ledger)
        assert site.data is not None
        found.append(Path(site.data.dataset))
    return [str(p) for p in found]


def test_commands_ports_probes_and_paths_are_the_parties_own(rendered: dict[str, Docs]) -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    compose_image = re.search(r"image: \$\{CAPC_IMAGE:-([^}]+)\}", (REPO / "docker-compose.yml").read_text())
    assert compose_image is not None
    checked = set()
    for docs, deployment in _deployments(rendered):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        path, params = _command(container["args"])
        role = path[0]
        assert path[1] == {"guardian": "serve", "student": "run", "teacher": "serve"}[role]
        config = _named(docs, "ConfigMap", f"capc-{role}-config")["data"]
        site_path = PurePosixPath(str(params["site"]))
        mounts = _mounts(docs, pod, container)
        assert _served(str(site_path), mounts) and site_path.name in config
        site = SETTINGS[role](**yaml.safe_load(config[site_path.name]))
        federation = FederationConfig.from_dict(yaml.safe_load(config["federation.yaml"]))
        assert federation.role_of(site.party) == role
        missing = [p for p in _paths(site) if not _served(p, mounts)]
        assert not missing, f"{deployment['metadata']['name']}: {missing} are not in the container"
        # The certificate the Secret holds is the site's party's.
        tls = _named(
            docs, "Secret", next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "tls")
        )
        cert = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
        assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == site.party
        # Ports: the admin API where the probes look, gRPC where the Service sends it.
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert (
            ports["admin"]
            == int(env["CAPC_ADMIN__BIND"].rsplit(":", 1)[1])
            == int(site.admin.bind.rsplit(":", 1)[1])
        )
        assert env["CAPC_ADMIN__ALLOW_REMOTE"] == "true" and site.admin.allow_remote
        # ... over HTTPS with the party's certificate: the admin token never crosses the cluster in cleartext
        assert env["CAPC_ADMIN__TLS"] == "true" and site.admin.tls
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin", "scheme": "HTTPS"}
        assert container["readinessProbe"]["httpGet"] == {
            "path": "/readyz",
            "port": "admin",
            "scheme": "HTTPS",
        }
        assert container["startupProbe"]["httpGet"]["path"] == "/livez"
        # One admin token per role: the pod's admin-token Secret is its role's own.
        tokens = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "admin-token")
        assert tokens.startswith(f"capc-{role}-admin-token")
        if hasattr(site, "grpc"):
            assert ports["grpc"] == int(site.grpc.bind.rsplit(":", 1)[1])
            exposed = re.search(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE)
            assert exposed is not None and str(ports["grpc"]) in exposed.group(1).split()
        # The image compose builds and runs, from the registry kustomize sets, at a release.
        name = compose_image.group(1).partition(":")[0]
        for each in [*pod["initContainers"], container]:
            assert each["image"] == f"{PLACEHOLDER_REGISTRY}/{name}:{__version__}"
        checked.add((deployment["metadata"].get("namespace", ""), role))
    assert len(checked) == 4  # guardian, student and teacher of the base; the hospital's teacher


def test_addresses_in_the_base_are_its_services(rendered: dict[str, Docs]) -> None:
    docs = rendered["base"]
    services = {
        f"{s['metadata']['name']}:{p['port']}": p["targetPort"]
        for s in _of(docs, "Service")
        for p in s["spec"]["ports"]
    }
    for role, keys in (
        ("student", ("guardian_address",)),
        ("teacher", ("guardian_address", "student_address")),
    ):
        site = yaml.safe_load(_named(docs, "ConfigMap", f"capc-{role}-config")["data"]["site.yaml"])
        for key in keys:
            assert services.get(site[key]) == "grpc", f"{role} {key} {site[key]} is no Service's gRPC port"
    guardian = yaml.safe_load(_named(docs, "ConfigMap", "capc-guardian-config")["data"]["site.yaml"])
    assert guardian["student_admin"]["url"].removeprefix("https://") in services
    # the relay reaches the student by its Service's name, which the student's admin API answers to
    student = StudentSettings(
        **yaml.safe_load(_named(docs, "ConfigMap", "capc-student-config")["data"]["site.yaml"])
    )
    assert "capc-student" in student.admin.allowed_hosts


def test_every_pod_runs_unprivileged_with_a_read_only_root(rendered: dict[str, Docs]) -> None:
    uid = re.search(r"useradd --uid (\d+)", (REPO / "deploy" / "Dockerfile").read_text())
    assert uid is not None
    for _, deployment in _deployments(rendered):
        spec = deployment["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}  # one identity, one process
        pod = spec["template"]["spec"]
        assert (
            pod["securityContext"]["runAsUser"] == int(uid.group(1))
            and pod["securityContext"]["runAsNonRoot"]
        )
        assert pod["automountServiceAccountToken"] is False
        for container in [*pod["initContainers"], *pod["containers"]]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert "memory" in container["resources"]["limits"]
        secrets = [v for v in pod["volumes"] if "secret" in v]
        assert secrets and all(
            v["secret"]["defaultMode"] == 0o440 for v in secrets
        )  # copied to 0600 at start


def test_a_command_the_cli_does_not_have_fails_the_check() -> None:
    with pytest.raises(click.UsageError, match="--sites"):
        _command(["guardian", "serve", "--sites", "/etc/capc/config/site.yaml"])
    with pytest.raises(AssertionError, match="`capc teacher run` is not a command"):
        _command(["teacher", "run"])


def test_images_are_set_by_kustomize_with_a_registry_and_a_release() -> None:
    """The manifests name the image alone; each kustomization sets its registry and release (`images:`),
    never a moving tag, so every party of a cluster runs the same code."""
    images = {m: re.findall(r"^\s*image: (\S+)", m.read_text(), re.MULTILINE) for m in K8S.rglob("*.yaml")}
    assert sum(len(found) for found in images.values()) == 5  # guardian, student, teacher, 2 init containers
    assert all(image == "diet-capc" for found in images.values() for image in found), images
    for kustomization in (
        K8S / "base" / "kustomization.yaml",
        K8S / "overlays" / "hospital" / "kustomization.yaml",
    ):
        (image,) = yaml.safe_load(kustomization.read_text())["images"]
        assert image == {
            "name": "diet-capc",
            "newName": f"{PLACEHOLDER_REGISTRY}/diet-capc",
            "newTag": __version__,
        }


def test_the_teacher_waits_for_its_data_checked_by_checksum(rendered: dict[str, Docs]) -> None:
    """Before it starts, a teacher's pod runs `capc data verify --wait` on the same site file, with the data
    volume writable there only (where `kubectl cp` lands the file), read-only for the party."""
    teachers = [d for _, d in _deployments(rendered) if d["metadata"]["name"] == "capc-teacher"]
    assert len(teachers) == 2
    for deployment in teachers:
        pod = deployment["spec"]["template"]["spec"]
        (init,) = [c for c in pod["initContainers"] if c["name"] == "data"]
        (container,) = pod["containers"]
        path, params = _command(init["args"])
        assert path == ["data", "verify"] and params["wait"] and params["timeout"] is None
        assert params["site"] == _command(container["args"])[1]["site"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "data"]
        assert volume["persistentVolumeClaim"] == {"claimName": "capc-teacher-data"}  # not read-only
        mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (init, container)}
        assert mounts["data"]["data"]["mountPath"] == mounts["capc"]["data"]["mountPath"] == "/data"
        assert not mounts["data"]["data"].get("readOnly") and mounts["capc"]["data"]["readOnly"]
        assert mounts["data"]["config"] == mounts["capc"]["config"]


# ----------------------------------------------------------------------------------- network policies
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class _Pod:
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int]


def _admitted(policies: Docs, source: _Pod, target: _Pod, port: int) -> bool:
    """Whether NetworkPolicy semantics admit a TCP connection from ``source`` to ``target``'s ``port``:
    allowed unless a policy of the target's namespace selects it for Ingress; then only if a rule of one of
    them admits both the peer (a podSelector in the policy's namespace, a namespaceSelector) and the port
    (a number, or a name of the target's container ports)."""
    selecting = [
        p for p in policies
        if p["metadata"].get("namespace", "") == target.namespace
        and "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], target.labels)
    ]  # fmt: skip
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            peer_ok = peers is None or any(
                ("podSelector" in peer or "namespaceSelector" in peer)
                and _selects(peer.get("podSelector", {}), source.labels)
                and (
                    _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source.namespace})
                    if "namespaceSelector" in peer
                    else source.namespace == target.namespace
                )
                for peer in peers
            )
            ports = rule.get("ports")
            port_ok = ports is None or any(
                p.get("protocol", "TCP") == "TCP"
                and (p["port"] == port or target.ports.get(str(p["port"])) == port)
                for p in ports
            )
            if peer_ok and port_ok:
                return True
    return False


def _pods(docs: Docs) -> dict[str, _Pod]:
    """Each Deployment's pod as a policy sees it (namespace, labels, named container ports)."""
    return {
        d["metadata"]["name"]: _Pod(
            d["metadata"].get("namespace", ""),
            d["spec"]["template"]["metadata"]["labels"],
            {p["name"]: p["containerPort"] for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]},
        )
        for d in _of(docs, "Deployment")
    }


def test_network_policies_admit_the_parties_links_and_nothing_else(rendered: dict[str, Docs]) -> None:
    docs = rendered["base"]
    policies, pods = _of(docs, "NetworkPolicy"), _pods(docs)
    targets = {  # Service host:port -> (the pod it reaches, its container port)
        f"{name}:{p['port']}": (name, pods[name].ports[p["targetPort"]])
        for name, s in ((s["metadata"]["name"], s) for s in _of(docs, "Service"))
        for p in s["spec"]["ports"]
    }
    # Every link the site files dial is admitted: teacher -> guardian, teacher -> student, student -> guardian
    # (gRPC), guardian -> the student's admin API.
    links = []
    for role in ("student", "teacher", "guardian"):
        site = yaml.safe_load(_named(docs, "ConfigMap", f"capc-{role}-config")["data"]["site.yaml"])
        dialled = [site[k] for k in ("guardian_address", "student_address") if k in site]
        if "student_admin" in site:
            dialled.append(urlsplit(site["student_admin"]["url"]).netloc)  # https since the admin plane's TLS
        links += [(f"capc-{role}", *targets[address]) for address in dialled]
    assert len(links) == 4
    for source, target, port in links:
        assert _admitted(policies, pods[source], pods[target], port), (source, target, port)
    # gRPC from nothing else: another pod of the namespace, the guardian to the student, any other namespace.
    stranger = _Pod("", {"app": "debug"}, {})
    outsider = _Pod("elsewhere", pods["capc-teacher"].labels, {})
    for target in ("capc-guardian", "capc-student"):
        grpc = pods[target].ports["grpc"]
        assert not _admitted(policies, stranger, pods[target], grpc)
        assert not _admitted(policies, outsider, pods[target], grpc)
    assert not _admitted(
        policies, pods["capc-guardian"], pods["capc-student"], pods["capc-student"].ports["grpc"]
    )
    # Admin: any pod of the namespace, none of another; a teacher listens on nothing else.
    for target, pod in pods.items():
        assert _admitted(policies, stranger, pod, pod.ports["admin"]), target
        assert not _admitted(policies, outsider, pod, pod.ports["admin"]), target
    assert not _admitted(policies, pods["capc-guardian"], pods["capc-teacher"], 50051)
    # The hospital's own cluster: nothing reaches its teacher, not even from its namespace.
    hospital = _pods(rendered["hospital"])["capc-teacher"]
    neighbour = _Pod(hospital.namespace, {"app": "debug"}, {})
    assert not _admitted(
        _of(rendered["hospital"], "NetworkPolicy"), neighbour, hospital, hospital.ports["admin"]
    )
    # The model itself: without the base's policies every one of these would be admitted.
    assert _admitted([], outsider, pods["capc-guardian"], pods["capc-guardian"].ports["admin"])


# ------------------------------------------------------------------------------------ capc k8s check
Capc = Callable[..., "subprocess.CompletedProcess[str]"]


def _check(capc: Capc, directory: Path) -> tuple[int, str]:
    """`capc k8s check DIRECTORY` as a process: its exit code and output."""
    proc = capc("k8s", "check", str(directory))
    return proc.returncode, proc.stdout + proc.stderr


def _fixes(output: str) -> list[str]:
    return re.findall(r"fix: (.*)", output)


def test_the_check_explains_what_kustomize_only_fails_on_and_its_fixes_work(
    tmp_path: Path, capc: Capc
) -> None:
    kubectl = _kubectl()
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("certs", "federation.yaml"))
    shutil.copy(K8S / "base" / "federation.yaml", root / "base" / "federation.yaml")
    base = root / "base"
    # Before the certificates: kustomize's bare error, the check's list with the command that makes them.
    raw = subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True, check=False)
    assert raw.returncode != 0 and re.search(r"certs/\w+\.token", raw.stderr)
    assert "capc cert" not in raw.stderr
    code, output = _check(capc, base)
    assert code == 2 and "3 problems" in output, output
    (bootstrap,) = re.findall(r"`(capc cert bootstrap [^`]+)`", output)
    assert (
        "--party guardian --party hospital-a --party student" in bootstrap and "--name capc-k8s" in bootstrap
    )
    assert all(f"--admin-token {base}/certs/{role}.token" in bootstrap for role in ROLES)
    assert f"images diet-capc → {PLACEHOLDER_REGISTRY}/diet-capc" in output
    assert "sites/hospital-a.yaml: data.sha256" in output and "sha256sum hospital-a.npz" in output
    # The fixes, as a person applies them: the printed command, the registry, the data file's checksum.
    _capc(*bootstrap.split()[1:])
    kustomization = base / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace(PLACEHOLDER_REGISTRY, "registry.acme.example"))
    site = base / "sites" / "hospital-a.yaml"
    site.write_text(
        site.read_text().replace(
            "{dataset: /data/hospital-a.npz}", "{dataset: /data/hospital-a.npz, sha256: " + "ab" * 32 + "}"
        )
    )
    code, output = _check(capc, base)
    assert code == 0 and output.startswith(f"ok: {base} is ready"), output
    assert _render(kubectl, base)
    # A moving tag is refused too.
    kustomization.write_text(kustomization.read_text().replace(f'"{__version__}"', "latest"))
    code, output = _check(capc, base)
    assert code == 2 and "tag latest" in output and "`capc --version`" in output


def test_the_check_of_a_hospitals_overlay_names_each_file_and_who_makes_it(
    tmp_path: Path, capc: Capc
) -> None:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("certs", "federation.yaml"))
    hospital = root / "overlays" / "hospital"
    code, output = _check(capc, hospital)
    assert code == 2, output
    fixes = dict(zip(re.findall(r"✗ (.*)", output), _fixes(output), strict=True))
    certs = hospital / "certs"
    assert "from the coordinator" in fixes[str(hospital / "federation.yaml")]
    assert f"`capc cert request hospital-b --out-dir {certs}`" in fixes[str(certs / "hospital-b.key")]
    assert "`capc cert sign`" in fixes[str(certs / "hospital-b.crt")]
    assert "from the coordinator" in fixes[str(certs / "ca.crt")]
    assert "secrets.token_urlsafe" in fixes[str(certs / "admin.token")]
    assert len(fixes) == 7  # and the images, the data checksum

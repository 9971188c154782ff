"""What a kustomization of ``deploy/k8s`` needs before ``kubectl apply -k``, each missing thing with its fix.

``kubectl kustomize`` stops at the first generator file it cannot read, with an error that names a path and
no reason ("evalsymlink failure on …/certs/guardian.token"): the certificates, keys and admin tokens are
made by commands (``capc cert bootstrap``, ``capc cert request``), ``federation.yaml`` comes from the
coordinator, and none of them is in the repository. This check walks the kustomization and every directory
it includes, and lists every generator file that is missing with the command that makes it, an ``images:``
entry that still names the example's placeholder registry or a moving tag, and a teacher's site file that
pins no ``data.sha256`` (its pod would wait for a data file it cannot check).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from capc_common.errors import InputError

__all__ = ["PLACEHOLDER_REGISTRY", "Problem", "check_kustomization"]

#: The registry the shipped kustomizations name (a reserved example domain, RFC 2606): never pullable.
PLACEHOLDER_REGISTRY = "registry.example"
_MOVING_TAGS = frozenset({"", "latest"})
_GENERATORS = ("configMapGenerator", "secretGenerator")


@dataclass(frozen=True)
class Problem:
    """One thing the kustomization lacks.

    Attributes:
        what: what is missing or wrong (a path, a setting).
        fix: the command or edit that fixes it.
    """

    what: str
    fix: str


@dataclass(frozen=True)
class _File:
    """A generator's file: the kustomization that names it, the key it becomes and where it is."""

    kustomization: Path
    key: str
    path: Path


def check_kustomization(directory: Path) -> list[Problem]:
    """Every problem of the kustomization in ``directory`` (empty: ready for ``kubectl apply -k``).

    Raises:
        InputError: ``directory`` holds no ``kustomization.yaml``, or one that is not valid YAML.
    """
    top = _read(directory)
    files: list[_File] = []
    for kustomization, document in _walk(directory, top, seen=set()):
        for generator in _GENERATORS:
            for entry in document.get(generator) or []:
                for item in entry.get("files") or []:
                    key, _, source = str(item).rpartition("=")
                    files.append(
                        _File(kustomization, key or Path(source).name, kustomization.parent / source)
                    )
    problems = _missing(directory, files)
    problems += _images(directory, top)
    problems += _sites(files)
    return problems


def _read(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise InputError(
            f"{directory} holds no kustomization.yaml (give the directory `kubectl apply -k` takes)"
        )
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise InputError(f"{path} is not a kustomization (a mapping)")
    return document


def _walk(directory: Path, document: dict[str, Any], *, seen: set[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The kustomization and every directory it includes as a resource or component, once each."""
    here = (directory / "kustomization.yaml").resolve()
    if here in seen:
        return []
    seen.add(here)
    found = [(directory / "kustomization.yaml", document)]
    for entry in [*(document.get("resources") or []), *(document.get("components") or [])]:
        included = directory / str(entry)
        if (included / "kustomization.yaml").is_file():
            found += _walk(included, _read(included), seen=seen)
    return found


def _missing(directory: Path, files: list[_File]) -> list[Problem]:
    """Each missing generator file with the command that makes it (a whole cluster's certificates: one
    problem, the one-cluster shortcut's command)."""
    absent = list({f.path: f for f in files if not f.path.is_file()}.values())
    parties = sorted({f.path.stem for f in files if f.path.suffix == ".crt" and f.path.stem != "ca"})
    keys = [f for f in absent if f.path.suffix == ".key"]
    problems = []
    if len(keys) > 1:
        certs = keys[0].path.parent
        bundle = [f for f in absent if f.path.parent == certs and f.path.suffix in (".crt", ".key", ".token")]
        tokens = sorted({f.path for f in files if f.path.suffix == ".token"}) or [certs / "admin.token"]
        flags = " ".join([*(f"--party {p}" for p in parties), *(f"--admin-token {t}" for t in tokens)])
        name = _federation_name(files) or "FEDERATION"
        problems.append(
            Problem(
                f"{certs}: {', '.join(sorted(f.path.name for f in bundle))}",
                f"run `capc cert bootstrap --dir {certs} --name {name} {flags}` (one cluster's certificates, "
                "keys and an admin token per role; across organisations each party makes its own key: "
                "docs/operations.md, Certificates)",
            )
        )
        absent = [f for f in absent if f not in bundle]
    problems += [Problem(str(f.path), _fix(f)) for f in absent]
    return problems


def _fix(f: _File) -> str:
    """How one missing file is made."""
    path, party = f.path, f.path.stem
    if path.name == "federation.yaml":
        return f"copy the federation's federation.yaml from the coordinator to {path}"
    if path.name == "ca.crt":
        return f"copy the federation's ca.crt from the coordinator to {path}"
    if path.suffix == ".key":
        return (
            f"make {party}'s key and certificate request on this machine: `capc cert request {party} "
            f"--out-dir {path.parent}`; send the .csr to the coordinator to sign"
        )
    if path.suffix == ".crt":
        request = path.with_suffix(".csr")
        sent = f"send {request} to" if request.is_file() else "have"
        return (
            f"{sent} the coordinator sign {party}'s request (`capc cert sign`); put the certificate at {path}"
        )
    if path.suffix == ".token":
        return f"python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {path}"
    return f"{f.kustomization} names {path} ({f.key}) in a generator: create it, or fix the path there"


def _federation_name(files: list[_File]) -> str | None:
    for f in files:
        if f.path.name == "federation.yaml" and f.path.is_file():
            document = yaml.safe_load(f.path.read_text()) or {}
            return str(document.get("name")) if isinstance(document, dict) and document.get("name") else None
    return None


def _images(directory: Path, document: dict[str, Any]) -> list[Problem]:
    """An ``images:`` entry that cannot be pulled as it is: the placeholder registry, or a moving tag."""
    where = directory / "kustomization.yaml"
    problems = []
    entries = document.get("images") or []
    if not entries:
        problems.append(
            Problem(
                f"{where}: images",
                "set `images: [{name: diet-capc, newName: REGISTRY/diet-capc, newTag: RELEASE}]`",
            )
        )
    for entry in entries:
        name = str(entry.get("newName") or entry.get("name", ""))
        tag = str(entry.get("newTag") or "")
        if name.split("/", 1)[0] == PLACEHOLDER_REGISTRY or "/" not in name:
            problems.append(
                Problem(
                    f"{where}: images {entry.get('name')} → {name}",
                    "push the image to a registry the cluster pulls from (`docker tag`, `docker push`) and "
                    "set newName to it, e.g. registry.acme.example/diet-capc",
                )
            )
        if tag in _MOVING_TAGS:
            problems.append(
                Problem(
                    f"{where}: images {entry.get('name')} tag {tag or '(none)'}",
                    "set newTag to the release you pushed (`capc --version`): a moving tag lets two parties "
                    "run different code",
                )
            )
    return problems


def _sites(files: list[_File]) -> list[Problem]:
    """A teacher's site file whose data file its pod cannot check (no ``data.sha256``)."""
    problems = []
    for f in files:
        if f.key != "site.yaml" or not f.path.is_file():
            continue
        site = yaml.safe_load(f.path.read_text()) or {}
        if not isinstance(site, dict) or "cap" not in site:  # only a teacher's site has a cap and data
            continue
        data = site.get("data") or {}
        if not data.get("sha256"):
            dataset = str(data.get("dataset", "/data/site.npz"))
            problems.append(
                Problem(
                    f"{f.path}: data.sha256",
                    f"add the SHA-256 of {dataset} (`sha256sum {Path(dataset).name}` where it was made): "
                    f"`data: {{dataset: {dataset}, sha256: …}}`; the teacher's pod waits until a copy with "
                    "that checksum is in its data volume",
                )
            )
    return problems

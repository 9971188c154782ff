"""``capc teacher preflight``: everything a hospital can check before its teacher goes live.

Runs every check it can and reports each (ok / warn / fail / skip) with the values it found and, for each
warning or failure, how to fix it; a check that needs an earlier one is skipped when that one failed. It
writes nothing but a PNG grid of the site's images (and the cap record's directory) and sends nothing
private: the peers only see an mTLS handshake and a health check, as from the running party.
"""

from __future__ import annotations

from pathlib import Path

from capc_common.errors import CapcError, InputError
from capc_services.teacher.preflight.budget import cap_check, lifetime_check, site_exposure
from capc_services.teacher.preflight.identity import admin_token_check, certificate_checks
from capc_services.teacher.preflight.model import backbone_check, dataset_checks, heads_check
from capc_services.teacher.preflight.peers import peer_check
from capc_services.teacher.preflight.report import Check, PreflightReport
from capc_services.teacher.preflight.spending import spending_check
from capc_services.teacher.settings import TeacherSettings

__all__ = ["Check", "PreflightReport", "run_preflight"]


def run_preflight(
    site: str | Path, *, out_dir: Path | None = None, timeout: float = 10.0, force: str | None = None
) -> PreflightReport:
    """Check a teacher party's site before it goes live.

    Args:
        site: the party's site file.
        out_dir: where the dataset grid PNG goes (default: ``preflight/`` next to the heads file).
        timeout: seconds to wait for each peer.
        force: a cap that stops this party part-way is meant, for this reason (a warning, not a failure).

    Returns:
        The report (``report.ok`` is False when any check failed).
    """
    try:
        settings = TeacherSettings.load(site)
        config = settings.federation_config
    except InputError as exc:
        report = PreflightReport(site=str(site), party="")
        report.checks.append(
            Check.fail(
                "site",
                str(exc),
                fix="fix the site file (docs/operations.md shows one) and the federation.yaml it points at",
            )
        )
        return report
    report = PreflightReport(site=str(site), party=settings.party)
    checks = report.checks
    checks.append(
        Check.ok(
            "site",
            f"teacher {settings.party!r} of federation {config.name!r} (config {config.config_hash()[:16]}…, "
            f"{config.teacher(settings.party).heads} heads)",
            federation=config.name,
            config_hash=config.config_hash(),
        )
    )
    identity = certificate_checks(settings, config)
    checks.extend(identity)
    checks.append(admin_token_check(settings))
    backbone, model = backbone_check(config)
    checks.append(backbone)
    data = dataset_checks(settings, config, out_dir=out_dir or settings.heads.parent / "preflight")
    checks.extend(data)
    examples = next((c.data.get("examples") for c in data if c.name == "dataset"), None)
    checks.append(spending_check(config, party=settings.party, examples=examples))
    checks.append(
        heads_check(settings, config, model)
        if model is not None
        else Check.skip("heads", "no usable backbone")
    )
    tls_ok = all(c.status != "fail" for c in identity)
    for name, address, peer in (
        ("guardian", settings.guardian_address, config.guardian),
        ("student", settings.student_address, config.student),
    ):
        checks.append(
            peer_check(
                name,
                tls=settings.tls.files(),
                address=address,
                peer=peer,
                config_hash=config.config_hash(),
                timeout=timeout,
            )
            if tls_ok
            else Check.skip(name, "the certificate checks failed; the handshake would too")
        )
    if model is None:
        checks.append(Check.skip("local_cap", "no usable backbone"))
        checks.append(Check.skip("lifetime", "no usable backbone"))
        return report
    try:
        exposure = site_exposure(config, model)
    except CapcError as exc:
        checks.append(
            Check.fail("local_cap", str(exc), fix="fix the federation's mechanism with its coordinator")
        )
        return report
    checks.append(cap_check(settings, config, exposure, force=force))
    checks.append(lifetime_check(settings, config, exposure))
    return report

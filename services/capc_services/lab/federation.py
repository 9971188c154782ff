"""A local federation behind a link lab: the one fixture the WAN benchmark, the fault campaign and the tests
share.

It is ``capc local up`` with every party placed behind the lab's links (:class:`~capc_services.lab.links.
LinkLab`: its own network namespace where permitted, loopback otherwise) and, on request, the guardian's
ledger and the student's label store each on a volume of its own (:class:`~capc_services.lab.volumes.Volume`)
that can fill up or turn read-only. :meth:`LabFederation.close` stops the parties, then removes the
namespaces and the volumes — also when starting failed half-way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capc_services.lab.links import LinkLab
from capc_services.lab.volumes import Volume
from capc_services.local.federation import down, prepare, summary, token, up
from capc_services.local.processes import Launch, probe, read_state
from capc_services.local.provision import Endpoints, LocalOptions

__all__ = ["LabFederation"]
_ROUND_TRIPS = re.compile(r'capc_round_trips_total\{call="([^"]+)",peer="([^"]+)"\} ([0-9.e+]+)')


class LabFederation:
    """A running local federation in ``root`` whose parties talk over the lab's links.

    Args:
        root: the state directory (provisioned from ``options`` if new).
        options: the federation.
        namespaces: see :class:`LinkLab` (None: where permitted).
        volumes: bytes of a volume of its own for the guardian's ``ledger`` and the student's ``store``
            (each optional; the student's release journal lives beside its store).
        ready_timeout: seconds every party gets to be ready.
        say: progress lines.

    Raises:
        CapcError: provisioning, the lab or a party failed (whatever was made is removed again).
    """

    def __init__(
        self,
        root: Path,
        options: LocalOptions,
        *,
        namespaces: bool | None = None,
        volumes: dict[str, int] | None = None,
        ready_timeout: float = 600.0,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.root = Path(root)
        self.volumes: dict[str, Volume] = {}
        self.lab: LinkLab | None = None
        self._started = False
        try:
            self.layout, self.config = prepare(self.root, options, say=say)
            endpoints = Endpoints.from_dict(read_state(self.layout)["endpoints"])
            self.lab = LinkLab(self.config, endpoints, namespaces=namespaces)
            say(f"links: {self.lab.mode}{f' — {self.lab.note}' if self.lab.note else ''}")
            for name, size in (volumes or {}).items():
                self.volumes[name] = Volume(self.root / "volumes" / name, size=size)
            self._started = True
            self.endpoints = up(
                self.root, options, placement=self._launch, ready_timeout=ready_timeout, say=say
            )
        except BaseException:
            self.close()
            raise

    @property
    def ledger(self) -> Path:
        """The guardian's ledger file."""
        if "ledger" in self.volumes:
            return self.volumes["ledger"].path / "ledger.sqlite"
        return self.layout.party_dir(self.config.guardian) / "ledger.sqlite"

    @property
    def store(self) -> Path:
        """The student's label store file."""
        if "store" in self.volumes:
            return self.volumes["store"].path / "labels.sqlite"
        return self.layout.party_dir(self.config.student) / "labels.sqlite"

    def _launch(self, party: str, role: str) -> Launch:
        assert self.lab is not None
        launch = self.lab.launch(party, role)
        env = dict(launch.env)
        if role == "guardian" and "ledger" in self.volumes:
            env["CAPC_LEDGER"] = str(self.ledger)
        if role == "student" and "store" in self.volumes:
            env["CAPC_STORE"] = str(self.store)
        return Launch(
            wrap=launch.wrap, env=env, admin_host=launch.admin_host, admin_scheme=launch.admin_scheme
        )

    def admin(self, party: str) -> str:
        """``party``'s admin URL as this process reaches it."""
        state = summary(self.layout)
        if party == self.config.guardian:
            return str(state["guardian"]["admin"])
        if party == self.config.student:
            return str(state["student"]["admin"])
        return str(state["teachers"][party]["admin"])

    def get(self, party: str, path: str, *, timeout: float = 5.0) -> Any:
        """``GET`` one of ``party``'s admin routes with the admin token: its JSON (or text) body, or None when
        it does not answer (down, or starting)."""
        code, body = probe(
            f"{self.admin(party)}{path}",
            token=token(self.layout, party),  # its role's token
            timeout=timeout,
            ca=self.layout.certs / "ca.crt",
            party=party,
        )
        return body if code == 200 else None

    def round_trips(self, party: str) -> dict[tuple[str, str], float]:
        """``party``'s round trips: ``(peer, call) → count`` (:mod:`capc_services.common.roundtrips`)."""
        text = str(self.get(party, "/metrics") or "")
        return {(peer, call): float(n) for call, peer, n in _ROUND_TRIPS.findall(text)}

    def close(self) -> None:
        """Stop every party, then remove the lab's namespaces and the volumes."""
        if self._started:
            with contextlib.suppress(Exception):
                down(self.root)
        if self.lab is not None:
            self.lab.close()
        for volume in self.volumes.values():
            volume.close()
        self.volumes.clear()

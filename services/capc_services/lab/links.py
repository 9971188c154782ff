"""The links of a local federation, made real and made to fail: the one link model of the tests, the WAN
benchmark and the fault campaign.

Every party runs in its own network namespace (:mod:`~capc_services.lab.netns`) and reaches each peer it
dials through that link's proxy (:mod:`~capc_services.lab.proxy`): the student → guardian link, and per
teacher party its links to the student and to the guardian (a hospital dials out, as in production). So every
byte between two parties crosses two veth pairs, the kernel's TCP stacks of three namespaces and the proxy.

What shapes a link, and where it is done:

============  ====================================  =====================================
              namespaces (root)                     loopback fallback
============  ====================================  =====================================
delay/jitter  proxy (no ``netem`` in this kernel)   proxy
bandwidth     ``tc tbf`` on the party's veth        proxy, per link
partition     ``iptables`` DROP in the namespace    proxy swallows old and new connections
blackhole     proxy: half-open connections          proxy
reset, stall  proxy                                 proxy
============  ====================================  =====================================

Without the right to make namespaces (not root) the lab falls back to the parties on loopback behind the
same proxies, and says so (:attr:`LinkLab.note`); a caller that expected namespaces (CI) refuses instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capc_common.errors import UnavailableError
from capc_common.federation import FederationConfig
from capc_services.lab.netns import Namespaces, available
from capc_services.lab.proxy import ProxyProcess
from capc_services.local.processes import Launch
from capc_services.local.provision import Endpoints

__all__ = ["Link", "LinkLab"]


@dataclass(frozen=True)
class Link:
    """One party's connection to a peer it dials, through the lab's proxy."""

    name: str
    dialer: str
    target: str
    port: int  # the proxy's port the dialer connects to


class LinkLab:
    """Namespaces (or loopback) and one proxied link per dialling pair, for one local federation.

    Args:
        config: the federation (its parties).
        endpoints: the federation's ports (its gRPC servers listen on them, in their namespaces).
        namespaces: True: namespaces or an error; False: loopback; None: namespaces where permitted.
        seed: the proxies' jitter (not secret).

    Raises:
        UnavailableError: ``namespaces=True`` where they cannot be made.
    """

    def __init__(
        self, config: FederationConfig, endpoints: Endpoints, *, namespaces: bool | None = None, seed: int = 0
    ) -> None:
        self.config = config
        self.parties = [config.guardian, config.student, *config.teacher_names]
        permitted, why = available() if namespaces is not False else (False, "loopback asked for")
        if namespaces and not permitted:
            raise UnavailableError(why)
        self.net = Namespaces(self.parties) if permitted else None
        self.mode = "namespaces" if self.net is not None else "loopback"
        #: What the output says about where the links run (empty with namespaces).
        self.note = "" if self.net is not None else f"parties on loopback behind the proxies ({why})"
        self._endpoints = endpoints
        self._proxy = ProxyProcess()
        self.links: dict[str, Link] = {}
        try:
            dials = [(config.student, config.guardian, endpoints.guardian_grpc)]
            for teacher in config.teacher_names:
                dials += [(teacher, config.student, endpoints.student_grpc)]
                dials += [(teacher, config.guardian, endpoints.guardian_grpc)]
            for k, (dialer, target, port) in enumerate(dials):
                name = f"{dialer}->{target}"
                listen = f"{self._host(dialer)}:0"
                reply = self._proxy.call(
                    "link", name=name, listen=listen, target=f"{self._address(target)}:{port}", seed=seed + k
                )
                self.links[name] = Link(name=name, dialer=dialer, target=target, port=int(reply["port"]))
        except BaseException:
            self.close()
            raise
        self.rtt_ms, self.jitter_ms = 0.0, 0.0
        self.mbit: float | None = None

    def _host(self, party: str) -> str:
        """Where ``party`` reaches the proxy (the root end of its link)."""
        return self.net.host_ip(party) if self.net is not None else "127.0.0.1"

    def _address(self, party: str) -> str:
        """Where the proxy reaches ``party``."""
        return self.net.party_ip(party) if self.net is not None else "127.0.0.1"

    # ------------------------------------------------------------------ placing the parties
    def launch(self, party: str, role: str) -> Launch:
        """Where ``capc local up`` starts ``party`` (a :data:`~capc_services.local.processes.Placement`)."""
        env: dict[str, str] = {}
        for link in self.links.values():
            if link.dialer == party:
                key = (
                    "CAPC_GUARDIAN_ADDRESS" if link.target == self.config.guardian else "CAPC_STUDENT_ADDRESS"
                )
                env[key] = f"{self._host(party)}:{link.port}"
        if self.net is None:
            return Launch(env=env)
        admin = self._endpoints.admin[party]
        # off loopback, so over HTTPS (the party's certificate, checked under its name: it has no SAN for the
        # namespace's address)
        env |= {
            "CAPC_ADMIN__BIND": f"0.0.0.0:{admin}",
            "CAPC_ADMIN__ALLOW_REMOTE": "true",
            "CAPC_ADMIN__TLS": "true",
        }
        if role == "guardian":
            env["CAPC_GRPC__BIND"] = f"0.0.0.0:{self._endpoints.guardian_grpc}"
        elif role == "student":
            env["CAPC_GRPC__BIND"] = f"0.0.0.0:{self._endpoints.student_grpc}"
        # nsenter enters the network namespace only (``ip netns exec`` would also give the party a mount
        # namespace of its own, where a volume remounted here keeps the flags it had when the party started:
        # a volume made read-write again would stay read-only to it).
        wrap = ("nsenter", f"--net={self.net.path(party)}", "--")
        return Launch(wrap=wrap, env=env, admin_host=self.net.party_ip(party), admin_scheme="https")

    # ------------------------------------------------------------------ shaping every link
    def shape(self, *, rtt_ms: float, jitter_ms: float = 0.0, mbit: float | None = None) -> None:
        """Give every link a round trip of ``rtt_ms`` (± ``jitter_ms`` each way) and every party an access
        link of ``mbit`` Mbit/s each way (None: unlimited)."""
        for link in self.links:
            rate = None if self.net is not None or mbit is None else mbit * 1e6
            self._proxy.call("set", name=link, delay_ms=rtt_ms / 2, jitter_ms=jitter_ms, rate_bps=rate)
        if self.net is not None:
            for party in self.parties:
                self.net.shape(party, mbit=mbit)
        self.rtt_ms, self.jitter_ms, self.mbit = rtt_ms, jitter_ms, mbit

    # ------------------------------------------------------------------ faults of one link
    def partition(self, link: str, *, on: bool) -> None:
        """Cut (``on``) or heal one link: packets vanish both ways, no RST (``iptables`` in the dialer's
        namespace; the proxy swallows them on loopback)."""
        spec = self.links[link]
        if self.net is not None:
            self.net.block(spec.dialer, port=spec.port, on=on)
            return
        self._proxy.call("set", name=link, partitioned=on)
        if on:
            self._proxy.call("blackhole", name=link)

    def blackhole(self, link: str) -> int:
        """Make every open connection of ``link`` half-open for good (new ones pass); returns how many."""
        return int(self._proxy.call("blackhole", name=link)["connections"])

    def reset(self, link: str) -> int:
        """Reset every open connection of ``link`` mid-stream (TCP RST); returns how many."""
        return int(self._proxy.call("reset", name=link)["connections"])

    def stall(self, link: str, *, seconds: float) -> None:
        """Hold every byte on ``link`` for ``seconds`` (connections stay up)."""
        self._proxy.call("stall", name=link, seconds=seconds)

    def stats(self, link: str) -> dict[str, Any]:
        """Connections and bytes of one link as the proxy counts them."""
        return self._proxy.call("stats", name=link)

    def describe(self) -> dict[str, Any]:
        """What the lab is, for a benchmark's output."""
        return {
            "mode": self.mode,
            "note": self.note,
            "rtt_ms": self.rtt_ms,
            "jitter_ms": self.jitter_ms,
            "mbit_s": self.mbit,
            "links": sorted(self.links),
        }

    def close(self) -> None:
        """Stop the proxy and delete the namespaces (with their links, qdiscs and rules)."""
        self._proxy.close()
        if self.net is not None:
            self.net.close()

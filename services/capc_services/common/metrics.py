"""Prometheus metrics every party exposes, on a registry of its own (several parties can share a process
in tests without mixing their figures)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from capc_services.tls import CertificateInfo

STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class PartyMetrics:
    """The metrics shared by all roles: identity, certificate expiry, rejected calls and stage timings."""

    def __init__(
        self,
        *,
        party: str,
        role: str,
        config_hash: str,
        certificate: CertificateInfo,
        insecure_noise: bool = False,
    ) -> None:
        self.registry = CollectorRegistry()
        Gauge(
            "capc_insecure_noise",
            "1 when federation.yaml seeds the noise (mechanism.insecure_noise_seed): labels are NOT private.",
            registry=self.registry,
        ).set(int(insecure_noise))
        info = Gauge(
            "capc_party_info",
            "Constant 1, labelled with who this party is and the federation config it runs.",
            ["party", "role", "config_hash"],
            registry=self.registry,
        )
        info.labels(party=party, role=role, config_hash=config_hash).set(1)
        Gauge(
            "capc_certificate_expiry_timestamp_seconds",
            "Unix time at which this party's TLS certificate expires.",
            registry=self.registry,
        ).set(certificate.not_after.timestamp())
        Gauge(
            "capc_certificate_expires_in_seconds",
            "Seconds until this party's TLS certificate expires (negative: expired).",
            registry=self.registry,
        ).set_function(certificate.seconds_left)
        self.rejections = Counter(
            "capc_rpc_rejections_total",
            "gRPC calls refused by the identity/config interceptor.",
            ["method", "code"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "capc_stage_seconds",
            "Wall time of one protocol stage for one batch.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.batches = Counter(
            "capc_batches_total", "Batches by outcome.", ["outcome"], registry=self.registry
        )
        self.round_trips = Counter(
            "capc_round_trips_total",
            "Round trips this party made to a peer (calls, and turns within streams): capc_services.common."
            "roundtrips.",
            ["peer", "call"],
            registry=self.registry,
        )

    def reject(self, method: str, peer: str, code: str) -> None:
        """Count a refused call (the interceptor's callback)."""
        del peer  # peers are unbounded; keep label cardinality fixed
        self.rejections.labels(method=method, code=code).inc()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a block into ``capc_stage_seconds{stage=name}``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(stage=name).observe(time.perf_counter() - start)

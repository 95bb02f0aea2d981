"""Trino pool metrics of this part (spec trino-pools §7): the configured-pool expectation and
the ownership audit's gauge, exported by the trino worker on ``DUCKGRES_TRINO_METRICS_PORT``
from their own registry (``TRINO_REGISTRY``), never by another process's exporter.

``duckgres_trino_pool_configured{pool,workload_namespace}`` lives from process start to process
exit (safeguard 33). It is served by a custom collector registered once per process whose
series set can only grow: there is no remove or clear operation at all, so neither a term end,
an exporter (or any other internal server) restart, nor a failed configuration reload can erase
it. Only pools whose operator is enabled are marked; a read-only operator exports nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trino_pools.config import TrinoSettings

_log = logging.getLogger("duckgres.trino.metrics")

CONFIGURED_NAME = "duckgres_trino_pool_configured"

# The Trino metrics have their own registry, served only by the trino worker's exporter: the
# control worker's exporter serves the default registry, and a `configured` series there (with
# no pool telemetry beside it) would trip "configured pool without fresh telemetry" alerts.
TRINO_REGISTRY = CollectorRegistry(auto_describe=True)

UNCONFIGURED_OWNER_WAREHOUSES = Gauge(
    "duckgres_trino_unconfigured_owner_warehouses",
    "Trino-enabled warehouses whose stored owner is not a configured pool (spec 4.14).",
    registry=TRINO_REGISTRY,
)


class _ConfiguredPools(Collector):
    """Process-lifetime ``configured`` series; add-only by construction."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: frozenset[tuple[str, str]] = frozenset()

    def add(self, series: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self._series = self._series | frozenset(series)

    def series(self) -> frozenset[tuple[str, str]]:
        with self._lock:
            return self._series

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            CONFIGURED_NAME,
            "1 for every Trino pool whose operator is enabled in this process, "
            "from process start to exit.",
            labels=["pool", "workload_namespace"],
        )
        for pool, namespace in sorted(self.series()):
            family.add_metric([pool, namespace], 1)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(CONFIGURED_NAME, "", labels=["pool", "workload_namespace"])


CONFIGURED = _ConfiguredPools()
TRINO_REGISTRY.register(CONFIGURED)


def mark_configured(settings: TrinoSettings) -> None:
    """Set ``configured`` = 1 for every operator-enabled pool (public id, registry namespace)."""
    CONFIGURED.add((cell.id, cell.namespace) for cell in settings.operator_pools())


def set_unconfigured_owners(count: int) -> None:
    UNCONFIGURED_OWNER_WAREHOUSES.set(count)


class Exporter:
    """The trino worker's HTTP exporter. Stopping or restarting it never touches the registry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        with self._lock:
            return None if self._server is None else int(self._server.server_address[1])

    def start(self, port: int, addr: str = "0.0.0.0") -> int:  # noqa: S104 - scraped in-cluster
        """Listen on ``port`` (0 = an ephemeral port, for tests); returns the bound port."""
        with self._lock:
            if self._server is not None:
                return int(self._server.server_address[1])
            self._server, self._thread = start_http_server(port, addr=addr, registry=TRINO_REGISTRY)
            bound = int(self._server.server_address[1])
        _log.info("trino worker metrics exporter listening on :%d", bound)
        return bound

    def stop(self) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


EXPORTER = Exporter()

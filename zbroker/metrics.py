"""Prometheus metrics: an HTTP endpoint (``metrics.bind``, ``--metrics ADDR``) on
prometheus_client.

Nothing is counted for it on the hot paths: the broker and its services keep their counters
anyway (status, the pzq monitor, a few plain ints and :class:`zbroker.runtime.stats.Buckets`), and a
scrape reads them. prometheus_client serves HTTP on a thread of its own; the collector's
``collect`` (run on that thread) asks the event loop for a snapshot of plain data
(``Broker.metrics_snapshot``) and waits for it, so broker state is only ever read on the loop.
A loop that does not answer within SNAPSHOT_TIMEOUT makes the scrape fail (HTTP 500, so
Prometheus' ``up`` is 0): a stuck broker is not reported as a healthy one.

:func:`families` turns a snapshot into metric families: the broker's, the cluster's and
syslog's here, each service's by its own ``Service.metric_families`` (a service is a plug-in,
and its metrics are its own). It does no I/O and is what the tests and the dashboard's check
use. Names follow Prometheus' conventions: ``zbroker_`` first, base units (seconds, bytes),
``_total`` for counters, labels from bounded sets only (a queue, a reason, a role; a pipe
only for the ``metrics.pipe_series`` busiest pipes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from zbroker.runtime.stats import cumulative

from .config import parse_bind

if TYPE_CHECKING:
    from .service import Service

SNAPSHOT_TIMEOUT = 5.0  # seconds a scrape waits for the event loop


class MetricsError(Exception):
    """The endpoint cannot be served; the message is for the operator."""


def beyond_loopback(bind: str) -> bool:
    """Whether an endpoint on ``bind`` (HOST:PORT) can be reached from other hosts."""
    import ipaddress

    host = parse_bind(bind)[0]
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whatever it resolves to
        return True


# --- snapshot -> metric families (no I/O) ----------------------------------------------------
# counter, gauge, histogram and add_histogram are for the services' metric_families too


def counter(name: str, doc: str, value: float | None = None,
             labels: Iterable[str] = ()) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def gauge(name: str, doc: str, value: float | None = None,
           labels: Iterable[str] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def histogram(name: str, doc: str, labels: Iterable[str] = ()) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labels) or None)


def add_histogram(family: HistogramMetricFamily, labels: list[str],
                   snap: dict[str, Any]) -> None:
    family.add_metric(labels, cumulative(snap), sum_value=snap["sum"])


def families(snap: dict[str, Any],
             registry: Mapping[str, type[Service]] | None = None) -> list[Metric]:
    """The metric families of a snapshot (``Broker.metrics_snapshot``): the broker's, then
    each service's own (``Service.metric_families`` of the service of that name in
    ``registry``, the plug-ins installed by default), the cluster's and syslog's."""
    if registry is None:
        from .services import installed

        registry = installed()
    out: list[Metric] = []
    out += _broker(snap)
    for name, metrics in snap.get("services", {}).items():
        service = registry.get(name)
        if metrics and service is not None:
            out += service.metric_families(metrics, snap)
    if snap.get("cluster"):
        out += _cluster(snap["cluster"])
    if snap.get("syslog"):
        out += _syslog(snap["syslog"])
    return out


def _broker(snap: dict[str, Any]) -> list[Metric]:
    build = InfoMetricFamily("zbroker_build", "The broker's version and Python (always 1).",
                             value={"version": snap["version"], "python": snap["python"],
                                    "broker": snap["name"]})
    reloads = counter("zbroker_config_reloads",
                       "Config reloads (SIGHUP, zbroker reload), by result: ok or refused.",
                       labels=["result"])
    for result in ("ok", "refused"):
        reloads.add_metric([result], snap["reloads"][result])
    return [
        build,
        gauge("zbroker_start_time_seconds", "When the broker started, in Unix time.",
              snap["started"]),
        gauge("zbroker_uptime_seconds", "Seconds since the broker started.", snap["uptime"]),
        reloads,
        counter("zbroker_log_write_errors", "Log lines that could not be written.",
                 snap.get("log_write_errors", 0)),
    ]


def _cluster(c: dict[str, Any]) -> list[Metric]:
    rtt = histogram("zbroker_cluster_heartbeat_rtt_seconds",
                     "Round trips of heartbeats to peers (sent when a link is idle).")
    add_histogram(rtt, [], c["rtt"])
    return [
        gauge("zbroker_cluster_peers", "Peer brokers up (admitted and heard from).",
               c["peers"]),
        counter("zbroker_cluster_peer_losses", "Peers lost: silent, connection closed, "
                 "unreachable or said goodbye.", c["peer_losses"]),
        rtt,
        counter("zbroker_cluster_sent_bytes", "Bytes sent to peer brokers.", c["bytes_sent"]),
        counter("zbroker_cluster_received_bytes", "Bytes received from peer brokers.",
                 c["bytes_received"]),
        *_refusals(c),
    ]


def _refusals(c: dict[str, Any]) -> list[Metric]:
    """Why hosts do not link: handshakes refused (by us, or by the peer), contacts silent."""
    if "refused" not in c:
        return []
    refused = counter("zbroker_cluster_handshakes_refused",
                      "Cluster handshakes refused, by who refused: us (a peer's connection) "
                      "or the peer (our link).", labels=["by"])
    for side, label in (("ours", "us"), ("theirs", "peer")):
        refused.add_metric([label], c["refused"].get(side, 0))
    return [refused, gauge("zbroker_cluster_contacts_not_answering",
                           "Endpoints of peers (seeds, discovered, learned) where no broker "
                           "of the cluster answers now.", c.get("not_answering", 0))]


def _syslog(s: dict[str, Any]) -> list[Metric]:
    return [
        counter("zbroker_syslog_records_sent", "Log records sent to syslog.", s["sent"]),
        counter("zbroker_syslog_records_dropped", "Log records dropped (queue full, not "
                 "connected, a datagram refused).", s["dropped"]),
        counter("zbroker_syslog_reconnects", "Connections to the syslog target made again.",
                 s.get("reconnects", 0)),
        gauge("zbroker_syslog_queued_records", "Log records waiting to be sent.",
               s["queued"]),
        gauge("zbroker_syslog_connected", "1 when connected to the syslog target.",
               1 if s["connected"] else 0),
    ]


# --- the endpoint ----------------------------------------------------------------------------


class SnapshotCollector(Collector):
    """Collects :func:`families` of a snapshot taken on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        self.loop = loop
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.take()))

    def take(self) -> dict[str, Any]:
        """A snapshot made on the loop (raises TimeoutError if the loop does not answer)."""
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self.snapshot())
                except BaseException as exc:
                    future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        try:
            return future.result(SNAPSHOT_TIMEOUT)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the broker's event loop did not answer within "
                               f"{SNAPSHOT_TIMEOUT:g} s") from None


class MetricsServer:
    """The HTTP endpoint: ``/metrics`` (any path answers, as prometheus_client does)."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        from prometheus_client.process_collector import ProcessCollector

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(loop, snapshot))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, files
        self.bind: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, bind: str) -> None:
        """Listen on ``bind`` (HOST:PORT). Raises MetricsError if it cannot."""
        from prometheus_client import start_http_server

        host, port = parse_bind(bind)
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            from zbroker.runtime.port_holder import held

            raise MetricsError(f"cannot serve metrics (metrics.bind) on {bind}: "
                               f"{exc.strerror or exc}{held(f'tcp://{host}:{port}')}"
                               ) from None
        self.bind = bind

    @property
    def url(self) -> str | None:
        """Where it listens (with the port chosen for port 0), or None when stopped."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def stop(self, wait: bool = True) -> None:
        """Stop listening. ``wait``: until the server's thread has ended and the port is
        released (the thread looks every half second); else that happens in the
        background."""
        server, self._server = self._server, None
        self.bind = None
        if server is None:
            return

        def shut() -> None:
            server.shutdown()
            server.server_close()

        if wait:
            shut()
        else:
            threading.Thread(target=shut, name="metrics stop", daemon=True).start()

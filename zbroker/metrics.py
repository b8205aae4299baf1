"""Prometheus metrics: an HTTP endpoint (``metrics.bind``, ``--metrics ADDR``) on
prometheus_client.

Nothing is counted for it on the hot paths: the broker and its services keep their counters
anyway (status, the pzq monitor, a few plain ints and :class:`zbroker.stats.Buckets`), and a
scrape reads them. prometheus_client serves HTTP on a thread of its own; the collector's
``collect`` (run on that thread) asks the event loop for a snapshot of plain data
(``Broker.metrics_snapshot``) and waits for it, so broker state is only ever read on the loop.
A loop that does not answer within SNAPSHOT_TIMEOUT makes the scrape fail (HTTP 500, so
Prometheus' ``up`` is 0): a stuck broker is not reported as a healthy one.

:func:`families` turns a snapshot into metric families; it does no I/O and is what the tests
and the dashboard's check use. Names follow Prometheus' conventions: ``zbroker_`` first,
base units (seconds, bytes), ``_total`` for counters, labels from bounded sets only (a queue,
a reason, a role; a pipe only for the ``metrics.pipe_series`` busiest pipes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from zbroker.services.zpipes.server import FAILURE_KINDS

from .config import parse_bind
from .stats import cumulative

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


def _counter(name: str, doc: str, value: float | None = None,
             labels: Iterable[str] = ()) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def _gauge(name: str, doc: str, value: float | None = None,
           labels: Iterable[str] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def _histogram(name: str, doc: str, labels: Iterable[str] = ()) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labels) or None)


def _add_histogram(family: HistogramMetricFamily, labels: list[str],
                   snap: dict[str, Any]) -> None:
    family.add_metric(labels, cumulative(snap), sum_value=snap["sum"])


def families(snap: dict[str, Any]) -> list[Metric]:
    """The metric families of a snapshot (``Broker.metrics_snapshot``)."""
    out: list[Metric] = []
    out += _broker(snap)
    zpipes = snap.get("services", {}).get("zpipes")
    if zpipes:
        out += _zpipes(zpipes, snap.get("pipe_series", 0))
    pzq = snap.get("services", {}).get("pzq")
    if pzq:
        out += _pzq(pzq.get("queues", {}))
    if snap.get("cluster"):
        out += _cluster(snap["cluster"])
    if snap.get("syslog"):
        out += _syslog(snap["syslog"])
    return out


def _broker(snap: dict[str, Any]) -> list[Metric]:
    build = InfoMetricFamily("zbroker_build", "The broker's version and Python (always 1).",
                             value={"version": snap["version"], "python": snap["python"],
                                    "broker": snap["name"]})
    reloads = _counter("zbroker_config_reloads",
                       "Config reloads (SIGHUP, zbroker reload), by result: ok or refused.",
                       labels=["result"])
    for result in ("ok", "refused"):
        reloads.add_metric([result], snap["reloads"][result])
    zpipes = snap.get("services", {}).get("zpipes") or {}
    return [
        build,
        _gauge("zbroker_start_time_seconds", "When the broker started, in Unix time.",
               snap["started"]),
        _gauge("zbroker_uptime_seconds", "Seconds since the broker started.", snap["uptime"]),
        reloads,
        _gauge("zbroker_clients_connected", "ZPIPES clients the broker knows now.",
               zpipes.get("clients", 0)),
        _counter("zbroker_clients_expired", "ZPIPES clients expired: silent for "
                 "clients.timeout.", zpipes.get("clients_expired", 0)),
        _counter("zbroker_clients_disconnected", "ZPIPES clients whose connection went.",
                 zpipes.get("clients_disconnected", 0)),
        _counter("zbroker_log_write_errors", "Log lines that could not be written.",
                 snap.get("log_write_errors", 0)),
    ]


def _zpipes(z: dict[str, Any], pipe_series: int) -> list[Metric]:
    refused = _counter("zbroker_zpipes_connections_refused",
                       "Connections hung up at once, by reason: not_allowed "
                       "(services.zpipes.allow), too_many_clients (clients.max_clients).",
                       labels=["reason"])
    for reason, n in sorted(z.get("refused", {}).items()):
        refused.add_metric([reason.replace(" ", "_")], n)
    failed = _counter("zbroker_zpipes_ends_failed",
                      "READ_FAILED and WRITE_FAILED answers, by role (reader, writer) and "
                      "reason (" + ", ".join(FAILURE_KINDS) + ").", labels=["role", "reason"])
    counts = {(role, reason): n for role, reason, n in z.get("ends_failed", [])}
    for role in ("reader", "writer"):  # every series from the start: rate() needs a zero
        for reason in FAILURE_KINDS:
            failed.add_metric([role, reason], counts.get((role, reason), 0))
    out: list[Metric] = [
        _gauge("zbroker_zpipes_connections", "Open connections to the ZPIPES endpoint.",
               z.get("connections", 0)),
        refused,
        _gauge("zbroker_zpipes_pipes", "Pipes open (with at least one end).", z["pipes"]),
        _gauge("zbroker_zpipes_readers", "Reader ends of this broker's clients.", z["readers"]),
        _gauge("zbroker_zpipes_writers", "Writer ends of this broker's clients.", z["writers"]),
        _gauge("zbroker_zpipes_buffered_bytes", "Bytes buffered for this broker's readers.",
               z["buffered_bytes"]),
        _counter("zbroker_zpipes_written_bytes", "Bytes written into pipes by this broker's "
                 "clients.", z["bytes_written"]),
        _counter("zbroker_zpipes_read_bytes", "Bytes read from pipes by this broker's clients.",
                 z["bytes_read"]),
        failed,
    ]
    link = z.get("link")
    if link:
        messages = _counter("zbroker_zpipes_link_data_messages",
                            "DATA messages of pipes to and from peer brokers, by direction "
                            "(sent, received): one per chunk per broker of its readers.",
                            labels=["direction"])
        data = _counter("zbroker_zpipes_link_data_bytes",
                        "Bytes of pipe data in those DATA messages, by direction.",
                        labels=["direction"])
        for direction in ("sent", "received"):
            messages.add_metric([direction], link[f"data_{direction}"])
            data.add_metric([direction], link[f"data_bytes_{direction}"])
        out += [messages, data,
                _counter("zbroker_zpipes_link_credit_messages",
                         "CREDIT messages sent to peer brokers.", link["credit_sent"])]
    if pipe_series > 0:
        written = _counter("zbroker_zpipes_pipe_written_bytes",
                           "Bytes written into the pipe by this broker's clients, for the "
                           "metrics.pipe_series busiest pipes.", labels=["pipe"])
        read = _counter("zbroker_zpipes_pipe_read_bytes",
                        "Bytes read from the pipe by this broker's clients, for the "
                        "metrics.pipe_series busiest pipes.", labels=["pipe"])
        for name, w, r in busiest(z.get("pipe_bytes", []), pipe_series):
            written.add_metric([name], w)
            read.add_metric([name], r)
        out += [written, read]
    return out


def busiest(pipes: list[tuple[str, int, int]], n: int) -> list[tuple[str, int, int]]:
    """The ``n`` pipes that moved the most bytes (written + read), then by name."""
    return sorted(pipes, key=lambda p: (-(p[1] + p[2]), p[0]))[:n]


#: pzq counters exported as they are: (counter key, metric name, help)
_PZQ_COUNTERS = (
    ("produced", "zbroker_pzq_produced", "Messages producers sent (duplicates and refused "
                                         "ones too)."),
    ("stored", "zbroker_pzq_stored", "Messages written and fsynced."),
    ("duplicates", "zbroker_pzq_duplicates", "Messages sent again with an id already stored."),
    ("delivered", "zbroker_pzq_delivered", "Deliveries to consumers (redeliveries too)."),
    ("consumer_acks", "zbroker_pzq_acked", "Messages ACKed by consumers."),
    ("consumer_nacks", "zbroker_pzq_nacked", "Messages refused by consumers (NACK)."),
    ("redelivered", "zbroker_pzq_redelivered", "Messages delivered again (ACK timeout, a "
                                               "consumer gone, a NACK)."),
    ("expired_messages", "zbroker_pzq_ack_timeouts", "Deliveries whose ACK timeout passed."),
    ("syncs", "zbroker_pzq_fsyncs", "fdatasync calls of the queue's log."),
    ("bytes_written", "zbroker_pzq_log_written_bytes", "Bytes written to the queue's log."),
    ("replication_failed", "zbroker_pzq_replication_failures",
     "Messages ACKed with REPLICATION_FAILED: fewer than replicas peers confirmed a copy in "
     "time."),
    ("batches", "zbroker_pzq_batches", "Batches producers sent (the batch path)."),
    ("stream_retention_dropped", "zbroker_pzq_stream_retention_dropped",
     "Stream queues: messages the retention limits dropped before every reader group had "
     "committed them."),
)
#: pzq gauges: (counter key, metric name, help)
_PZQ_GAUGES = (
    ("messages", "zbroker_pzq_backlog_messages", "Messages stored and not ACKed yet."),
    ("backlog_bytes", "zbroker_pzq_backlog_bytes", "Bytes of the messages not ACKed yet."),
    ("messages_inflight", "zbroker_pzq_inflight_messages", "Messages delivered, waiting for "
                                                           "their ACK."),
    ("db_size", "zbroker_pzq_disk_bytes", "Bytes of the queue's log on disk."),
    ("consumers", "zbroker_pzq_consumers", "Consumers connected."),
    ("producers", "zbroker_pzq_producers", "Producers connected."),
)


def _pzq(queues: dict[str, dict[str, Any]]) -> list[Metric]:
    counters = [(key, _counter(name, doc, labels=["queue"])) for key, name, doc in _PZQ_COUNTERS]
    gauges = [(key, _gauge(name, doc, labels=["queue"])) for key, name, doc in _PZQ_GAUGES]
    refused = _counter("zbroker_pzq_refused", "Messages refused (a \"0\" ACK), by reason: "
                       "full, too_large, invalid, busy, store_failed.",
                       labels=["queue", "reason"])
    latency = _histogram("zbroker_pzq_producer_ack_latency_seconds",
                         "Seconds from a message's arrival to its producer ACK (stored and "
                         "fsynced; with replicas, copied too).", labels=["queue"])
    batches = _histogram("zbroker_pzq_messages_per_fsync", "Messages written by each fsync "
                         "(group commit).", labels=["queue"])
    lag = _gauge("zbroker_pzq_stream_group_lag_messages", "Stream queues: offsets between a "
                 "reader group's committed offset and the head (at most 64 groups a queue).",
                 labels=["queue", "group"])
    for queue, c in sorted(queues.items()):
        for key, value in c.items():
            if key.startswith("group.") and key.endswith(".lag"):
                lag.add_metric([queue, key[len("group."):-len(".lag")]], value)
        for key, family in (*counters, *gauges):
            family.add_metric([queue], c.get(key, 0))
        for reason, n in c.get("refusals", {}).items():
            refused.add_metric([queue, reason], n)
        if "ack_latency" in c:
            _add_histogram(latency, [queue], c["ack_latency"])
        if "sync_batches" in c:
            _add_histogram(batches, [queue], c["sync_batches"])
    return [f for _, f in counters] + [f for _, f in gauges] + [refused, latency, batches, lag]


def _cluster(c: dict[str, Any]) -> list[Metric]:
    rtt = _histogram("zbroker_cluster_heartbeat_rtt_seconds",
                     "Round trips of heartbeats to peers (sent when a link is idle).")
    _add_histogram(rtt, [], c["rtt"])
    return [
        _gauge("zbroker_cluster_peers", "Peer brokers up (admitted and heard from).",
               c["peers"]),
        _counter("zbroker_cluster_peer_losses", "Peers lost: silent, connection closed, "
                 "unreachable or said goodbye.", c["peer_losses"]),
        rtt,
        _counter("zbroker_cluster_sent_bytes", "Bytes sent to peer brokers.", c["bytes_sent"]),
        _counter("zbroker_cluster_received_bytes", "Bytes received from peer brokers.",
                 c["bytes_received"]),
    ]


def _syslog(s: dict[str, Any]) -> list[Metric]:
    return [
        _counter("zbroker_syslog_records_sent", "Log records sent to syslog.", s["sent"]),
        _counter("zbroker_syslog_records_dropped", "Log records dropped (queue full, not "
                 "connected, a datagram refused).", s["dropped"]),
        _counter("zbroker_syslog_reconnects", "Connections to the syslog target made again.",
                 s.get("reconnects", 0)),
        _gauge("zbroker_syslog_queued_records", "Log records waiting to be sent.",
               s["queued"]),
        _gauge("zbroker_syslog_connected", "1 when connected to the syslog target.",
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
            raise MetricsError(f"cannot serve metrics on {bind}: "
                               f"{exc.strerror or exc}") from None
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

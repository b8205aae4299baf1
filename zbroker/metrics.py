"""Prometheus metrics: an HTTP endpoint (``metrics.bind``, ``--metrics ADDR``) that renders
with prometheus_client.

Nothing is counted for it on the hot paths: the broker and its services keep their counters
anyway (status, the pzq monitor, a few plain ints and :class:`zbroker.runtime.stats.Buckets`), and a
scrape reads them. The endpoint is served on the broker's event loop, like its other
endpoints: a scrape takes a snapshot of plain data (``Broker.metrics_snapshot``) right there,
so broker state is only ever read on the loop, and renders it there too (plain counters, in
bounded sets of families). A stuck loop answers no scrape, so Prometheus' ``up`` is 0: a
stuck broker is not reported as a healthy one.

Its clients are not trusted to be quick, or few: it is not a thread and a descriptor per
connection for as long as the client likes (prometheus_client's own server is), which
thousands of clients that connect and say nothing turned into thousands of threads and, once
the descriptors ran out, an aborted broker. A connection has HEAD_TIMEOUT_S to send its
request head, of MAX_HEAD_BYTES at most, and ANSWER_TIMEOUT_S to take the answer. At most
MAX_CONNECTIONS are open, MAX_PER_SOURCE from one address: a budget of its own
(:class:`zbroker.zmtp.admission.ConnectionBudget`), its part of the open-file limit, as the
control socket and the cluster port have theirs (:mod:`zbroker.runtime.limits`; the config
check counts it), so that a flood of clients elsewhere does not shut the scrapes out, nor a
flood of scrapes the clients. A connection past it is hung up unread, counted
(:meth:`MetricsServer.status`), and logged at most once a second. Accepting is
:mod:`zbroker.runtime.acceptor`'s, as every listener of the broker's own: when it fails (no
descriptor to spare), it rests a while.

:func:`families` turns a snapshot into metric families: the broker's, the cluster's and
syslog's here, each service's by its own ``Service.metric_families`` (a service is a plug-in,
and its metrics are its own). It does no I/O and is what the tests and the dashboard's check
use. Names follow Prometheus' conventions: ``zbroker_`` first, base units (seconds, bytes),
``_total`` for counters, labels from bounded sets only (a queue, a reason, a role; a pipe
only for the ``services.zpipes.pipe_series`` busiest pipes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector, CollectorRegistry

from zbroker import logs
from zbroker.runtime.acceptor import ACCEPT_PAUSE_S, Acceptor
from zbroker.runtime.stats import cumulative
from zbroker.zmtp.admission import SOURCE_FULL, TOO_MANY, ConnectionBudget, Source
from zbroker.zmtp.refusals import Refusals

from .config import parse_bind

if TYPE_CHECKING:
    from .service import Service

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
                                    "broker": snap["name"], "host": snap.get("host", "")})
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
        _peer_heard(c.get("peer_list") or []),
        *_refusals(c),
    ]


def _peer_heard(peers: list[dict[str, Any]]) -> Metric:
    """Each peer, as people name it (``local@hostb (10.0.0.2)``: every host's broker may be
    named local), and how long ago it was last heard from."""
    heard = gauge("zbroker_cluster_peer_last_heard_seconds",
                  "Seconds since each peer broker was last heard from.",
                  labels=["peer", "endpoint"])
    for p in peers:
        heard.add_metric([p["label"], p["endpoint"]], p["last_heard_s"])
    return heard


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
# HTTP/1.1 on the event loop: one request per connection, answered, then closed; what a
# connection may hold is bounded (see the module's docstring)

#: seconds a connection has to send its request head (line and headers); then it is closed
HEAD_TIMEOUT_S = 5.0
#: seconds an answer has to be taken whole; then the connection is cut
ANSWER_TIMEOUT_S = 20.0
#: seconds a connection answered is left to close (what it still sends is read and dropped:
#: closing on unread bytes would reset it, and the client could lose its answer)
LINGER_S = 2.0
#: bytes a request head may have; a longer one is answered 431
MAX_HEAD_BYTES = 8192
#: metrics connections open at once, and of them from one address (the endpoint's part of
#: the open-file limit, with its listening socket: zbroker.config_checks counts it)
MAX_CONNECTIONS = 64
MAX_PER_SOURCE = 8
#: seconds accepting rests after accept failed (EMFILE, ENFILE: no descriptor to spare)
BACKLOG = 128
#: why connections were refused or dropped: the counts ``MetricsServer.status`` shows
NO_REQUEST = "no request"
BAD_REQUEST = "bad request"
ANSWER_NOT_TAKEN = "answer not taken"
REFUSAL_KINDS = (TOO_MANY, SOURCE_FULL, NO_REQUEST, BAD_REQUEST, ANSWER_NOT_TAKEN)
ACCEPT_FAILED = "accept failed"  # logged (at most once a second), not a connection's
SCRAPE_FAILED = "scrape failed"  # the same
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP method


class SnapshotCollector(Collector):
    """Collects :func:`families` of a snapshot; called on the event loop (where a scrape is
    answered), so broker state is only ever read there."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.snapshot()))


class MetricsServer:
    """The HTTP endpoint: ``/metrics`` (any path answers, as prometheus_client does), served
    on ``loop``; :meth:`start` and :meth:`stop` are called on its thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 snapshot: Callable[[], dict[str, Any]], log: Any = None) -> None:
        """``log``: where refusals go (the broker's log by default)."""
        from prometheus_client.process_collector import ProcessCollector

        self.loop = loop
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(snapshot))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, files
        self.budget = ConnectionBudget(MAX_CONNECTIONS, MAX_PER_SOURCE)
        self.refusals = Refusals(log if log is not None else logs.get_logger(),
                                 endpoint="metrics")
        self.bind: str | None = None
        self._sock: socket.socket | None = None
        self._acceptor: Acceptor | None = None
        self._served: dict[asyncio.Task[None], Source] = {}  # connections open, by source

    def start(self, bind: str) -> None:
        """Listen on ``bind`` (HOST:PORT). The socket is bound here and now, so that an
        address that cannot be had is told at once: raises MetricsError."""
        host, port = parse_bind(bind)
        try:
            self._sock = listening_socket(host, port)
        except OSError as exc:
            from zbroker.runtime.port_holder import held

            raise MetricsError(f"cannot serve metrics (metrics.bind) on {bind}: "
                               f"{exc.strerror or exc}{held(f'tcp://{host}:{port}')}"
                               ) from None
        self.bind = bind
        self._acceptor = Acceptor(self.loop, self._sock,
                                  lambda conn, peer: self._admit(conn, peer[0]), self._paused)
        self._acceptor.start()

    @property
    def url(self) -> str | None:
        """Where it listens (with the port chosen for port 0), or None when stopped."""
        if self._sock is None:
            return None
        host, port = self._sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def stop(self, wait: bool = True) -> None:
        """Stop listening (the port is let go at once) and cut the connections open.
        ``wait`` is for callers of the threaded server this was: nothing is left to wait
        for, either way."""
        sock, self._sock = self._sock, None
        self.bind = None
        if sock is None:
            return
        if self._acceptor is not None:
            self._acceptor.stop()
            self._acceptor = None
        sock.close()
        for task in self._served:
            task.cancel()

    def status(self) -> dict[str, Any]:
        """Where it listens, the connections open, and those refused or dropped by reason."""
        return {"url": self.url, "connections": len(self._served),
                "refused": {kind: self.refusals.count(kind) for kind in REFUSAL_KINDS}}

    # --- connections ---

    def _paused(self, exc: OSError) -> None:
        self.refusals.note(ACCEPT_FAILED, "metrics endpoint cannot accept connections; "
                           "it tries again", error=exc.strerror or str(exc),
                           after_s=ACCEPT_PAUSE_S)

    def _admit(self, conn: socket.socket, host: str) -> None:
        """Serve ``conn`` (from ``host``) if it has a place, else hang it up unread."""
        source: Source = ("host", host)
        why = self.budget.take(source)
        if why is not None:
            conn.close()
            self.refusals.note(why, f"metrics connection refused: {why}", source=host,
                               open=len(self._served), max_connections=MAX_CONNECTIONS,
                               max_per_source=MAX_PER_SOURCE)
            return
        task = self.loop.create_task(self._serve(conn, host))
        self._served[task] = source
        task.add_done_callback(functools.partial(self._ended, conn))

    def _ended(self, conn: socket.socket, task: asyncio.Task[None]) -> None:
        conn.close()  # (already closed unless the task was cancelled before it began)
        self.budget.give_back(self._served.pop(task))
        if not task.cancelled() and task.exception() is not None:
            self.loop.call_exception_handler({"message": "metrics connection failed",
                                              "exception": task.exception()})

    async def _serve(self, conn: socket.socket, host: str) -> None:
        """One request, its answer, and the connection closed."""
        conn.setblocking(False)
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_HEAD_BYTES)
        except OSError:
            return
        try:
            answer = await self._request(reader, host)
            if answer is not None:
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    await answer_and_linger(reader, writer, answer)
        except TimeoutError:
            self.refusals.note(ANSWER_NOT_TAKEN, "metrics connection cut: its answer was "
                               f"not taken within {ANSWER_TIMEOUT_S:g} s", source=host)
        except OSError:  # reset, broken pipe: the client went
            pass
        finally:
            writer.transport.abort()

    async def _request(self, reader: asyncio.StreamReader, host: str) -> bytes | None:
        """The answer to the request head that comes within HEAD_TIMEOUT_S; None when none
        does (the connection is then closed unanswered)."""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            self.refusals.note(NO_REQUEST, "metrics connection dropped: no request within "
                               f"{HEAD_TIMEOUT_S:g} s", level="info", source=host)
            return None
        except asyncio.IncompleteReadError:  # closed first
            return None
        except asyncio.LimitOverrunError:
            self._bad_request(host, 431)
            return plain(431, f"the request head is over {MAX_HEAD_BYTES} bytes")
        return self.answer(head, host)

    def answer(self, head: bytes, host: str = "") -> bytes:
        """The HTTP answer to a request head: the metrics to GET (HEAD: without the body),
        405 to other methods, 400 to what is not HTTP/1."""
        request = parse_head(head)
        if request is None:
            self._bad_request(host, 400)
            return plain(400, "not an HTTP/1 request")
        method, _, headers = request
        if method not in ("GET", "HEAD"):
            self._bad_request(host, 405, method=method[:20])
            return plain(405, f"{method} is not served: use GET or HEAD",
                         [("Allow", "GET, HEAD")])
        status, fields, body = self._scrape(headers)
        return http_answer(status, fields, body, with_body=method == "GET")

    def _bad_request(self, host: str, status: int, **fields: Any) -> None:
        self.refusals.note(BAD_REQUEST, "metrics request refused", level="info",
                           source=host, status=status, **fields)

    def _scrape(self, headers: Mapping[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        """(status, header fields, body) of a scrape (of any path), as prometheus_client
        makes them: in the format the client accepts (text, or OpenMetrics), gzip if
        accepted."""
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        try:
            body = encoder(self.registry)
        except Exception as exc:  # a bug: the scrape fails (Prometheus' up is 0), told
            self.refusals.note(SCRAPE_FAILED, "metrics scrape failed", level="error",
                               error=repr(exc)[:500])
            return 500, [("Content-Type", TEXT)], f"# the scrape failed: {exc!r}\n".encode()
        fields = [("Content-Type", content_type)]
        if gzip_accepted(headers.get("accept-encoding", "")):
            body = gzip.compress(body)
            fields.append(("Content-Encoding", "gzip"))
        return 200, fields, body


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on ``host`` (an address or a name: its first
    address) and ``port``. Raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def answer_and_linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            answer: bytes) -> None:
    """Write ``answer`` whole (to the kernel), end our side (FIN), then drop what the
    client still sends until it closes, LINGER_S at most."""
    writer.transport.set_write_buffer_limits(high=0)  # drain: until nothing is left
    writer.write(answer)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while await reader.read(65536):
                pass


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(method, target, {header name in lower case: value}) of a request head (up to its
    blank line), or None if it is not an HTTP/1 request."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] \
            or not parts[2].startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in filter(None, lines[1:]):
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            return None
        headers[name.lower()] = value.strip()
    return parts[0], parts[1], headers


TEXT = "text/plain; charset=utf-8"


def plain(status: int, text: str, fields: Iterable[tuple[str, str]] = ()) -> bytes:
    """An HTTP error answer that says ``text``."""
    phrase = HTTPStatus(status).phrase
    return http_answer(status, [("Content-Type", TEXT), *fields],
                       f"# HTTP {status} {phrase}: {text}\n".encode())


def http_answer(status: int, fields: Iterable[tuple[str, str]], body: bytes,
                with_body: bool = True) -> bytes:
    """The bytes of an HTTP/1.1 answer after which the connection closes."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
             *(f"{name}: {value}" for name, value in fields),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (body if with_body else b"")

"""The ZPIPES service: a ROUTER socket and a clock around the sans-I/O server core.

All protocol decisions are taken by zpipes.server.ZpipesServer; this module only moves frames
between the socket and the core, and calls the core's ``tick`` when its next deadline comes.

Each readiness event drains the socket with non-blocking receives (up to a budget, so timers
still run under load), and big frames travel without copies (``copy=False``).

Dead clients are noticed by the transport, not by the client timeout: the socket monitor reports
each connection's disconnect with its file descriptor, and the first message of a client tells
which descriptor it came from (``zmq.SRCFD``), so a disconnect names the client to detach. The
monitor is drained before a new client's first message is taken, so a descriptor reused by a new
connection is never mistaken for the old one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.service import Peer, Service, ServiceContext, ServiceError
from zpipes.server import ServerConfig, ZpipesServer

DRAIN_BUDGET = 1000  # messages taken per readiness event before giving timers a turn
ZERO_COPY_MIN = 1 << 16  # frames at least this big are sent without a copy
FRAME_OVERHEAD = 11  # WRITE header (7) and timeout (4) around a chunk
# Frames up to this many times max_chunk reach the core, which refuses a chunk over max_chunk with
# WRITE_FAILED naming the limit; larger ones make the transport drop the connection.
FRAME_LIMIT_FACTOR = 2
MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
GONE_REMEMBERED = 4096  # routing ids of disconnected clients whose late messages are dropped
# TCP keepalive, so that a client host that vanished without closing is noticed (~16 s)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 2, 3


def frame_limit(max_chunk: int) -> int:
    return FRAME_LIMIT_FACTOR * max_chunk + FRAME_OVERHEAD


def server_config(config: Any) -> ServerConfig:
    """The core's settings from the broker's config."""
    clients = config.clients
    return ServerConfig(
        capacity=config.services.zpipes.capacity,
        client_timeout=clients.timeout,
        max_chunk=config.services.zpipes.max_chunk,
        max_clients=clients.max_clients,
        max_pipelined=clients.max_pipelined,
        max_pipelined_bytes=clients.max_pipelined_bytes,
        animate=config.log.animate,
    )


class ZpipesService(Service):
    name = "zpipes"

    def __init__(self) -> None:
        self.server: ZpipesServer | None = None
        self.endpoint = ""
        self._sock: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._log: Any = None
        self._cluster: Any = None
        self._read_pending = False
        self._bound: list[str] = []
        self._monitor: zmq.Socket | None = None
        self._fd_client: dict[int, bytes] = {}  # open connection's descriptor -> its client
        self._open_fds: set[int] = set()  # descriptors of connections the monitor saw accepted
        self._gone: OrderedDict[bytes, None] = OrderedDict()  # clients whose connection closed

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        section = config.services.zpipes
        self.endpoint = section.endpoint  # the config has filled in the broker name
        self._loop, self._log, self._cluster = ctx.loop, ctx.log, ctx.cluster
        sock = ctx.zmq_context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # tell us when a client has gone
        sock.setsockopt(zmq.MAXMSGSIZE, frame_limit(section.max_chunk))
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_COUNT)
        self._monitor = sock.get_monitor_socket(MONITORED)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self._monitor.close(linger=0)
            sock.close(linger=0)
            if exc.errno == zmq.EADDRINUSE:
                raise ServiceError(
                    f"a broker named {ctx.broker_name!r} is already running on this host "
                    f"({self.endpoint} is in use)"
                ) from None
            raise ServiceError(f"cannot bind ZPIPES to {self.endpoint}: {exc}") from None
        self._sock = sock
        self._bound = [self.endpoint]
        self.server = ZpipesServer(server_config(config), ctx.log)
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._on_readable)
        self._loop.add_reader(self._monitor.getsockopt(zmq.FD), self._on_monitor)
        self._schedule()
        self._loop.call_soon(self._on_readable)  # the FD is edge-triggered: look once now
        self._loop.call_soon(self._on_monitor)
        ctx.log.info("zpipes bound", endpoint=self.endpoint,
                     capacity=section.capacity, max_chunk=section.max_chunk,
                     client_timeout=config.clients.timeout)

    async def stop(self) -> None:
        sock, server, loop = self._sock, self.server, self._loop
        if sock is None or server is None or loop is None:
            return
        loop.remove_reader(sock.getsockopt(zmq.FD))
        if self._monitor is not None:
            loop.remove_reader(self._monitor.getsockopt(zmq.FD))
            sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        if self._timer is not None:
            self._timer.cancel()
        server.shutdown(loop.time())
        self._flush()
        sock.close(linger=500)  # let the last replies go out
        self._sock = None

    def reload(self, new: Any, old: Any) -> None:
        if self.server is None or self._sock is None:
            return
        section, before = new.services.zpipes, old.services.zpipes
        if section.endpoint != before.endpoint and section.endpoint not in self._bound:
            # bind the new endpoint too; unbinding the old one would drop its clients
            try:
                self._sock.bind(section.endpoint)
            except zmq.ZMQError as exc:
                raise ServiceError(f"cannot bind ZPIPES to {section.endpoint}: {exc}") from None
            self._bound.append(section.endpoint)
            self._log.warning("zpipes bound to a new endpoint; the old one stays bound until "
                              "a restart, so that its clients are not dropped",
                              endpoints=self._bound)
        if section.max_chunk != before.max_chunk:
            self._sock.setsockopt(zmq.MAXMSGSIZE, frame_limit(section.max_chunk))
            self._log.info("zpipes max_chunk changed; it applies to connections made from now "
                           "on", max_chunk=section.max_chunk)
        self.server.reconfigure(server_config(new))

    def peer_joined(self, peer: Peer) -> None:
        if self.server is not None:
            self.server.peer_up(peer.id, self._loop.time())
            self._flush_outside()

    def peer_left(self, peer: Peer) -> None:
        if self.server is not None:
            self.server.peer_down(peer.id, self._loop.time())
            self._flush_outside()

    def peer_message(self, peer: Peer, frames: list[Any]) -> None:
        if self.server is not None:
            self.server.peer_receive(peer.id, frames, self._loop.time())
            self._flush_outside()

    def _flush_outside(self) -> None:
        """Send what the core has after an event that did not come through our socket. The
        socket's FD is edge-triggered and a send may consume the edge of messages waiting to
        be read: look for them, or they would wait for the next timer."""
        self._flush()
        self._schedule()
        if self._sock is not None and not self._read_pending \
                and self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._read_pending = True
            self._loop.call_soon(self._on_readable)

    def status(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "bound_endpoints": list(self._bound),
                **(self.server.status() if self.server else {})}

    # --- I/O ---------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        self._read_pending = False
        sock, server = self._sock, self.server
        if sock is None or server is None:
            return
        now = self._loop.time()
        clients, gone = server.clients, self._gone
        for _ in range(DRAIN_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            routing_id = frames[0].bytes
            if routing_id not in clients:
                if routing_id in gone:
                    continue  # sent before its connection closed: nobody to answer
                self._take_connection_events()  # up to now, before a descriptor is trusted
                server.receive(routing_id, [f.buffer for f in frames[1:]], now)
                self._learn_connection(routing_id, frames[0].get(zmq.SRCFD))
            else:
                server.receive(routing_id, [f.buffer for f in frames[1:]], now)
            if server.outbox:
                self._flush()
        self._flush()
        self._schedule()
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._loop.call_soon(self._on_readable)

    def _learn_connection(self, routing_id: bytes, fd: int) -> None:
        """A new client's first message came from connection ``fd``."""
        if routing_id not in self.server.clients:
            return  # refused
        if fd in self._open_fds:
            self._fd_client[fd] = routing_id
        else:  # its connection closed before we read its first message
            self._client_gone(routing_id)

    def _on_monitor(self) -> None:
        self._take_connection_events()
        self._flush_outside()

    def _take_connection_events(self) -> None:
        """Take the connection events that the socket monitor has: a closed connection's client
        is detached at once."""
        monitor, server = self._monitor, self.server
        if monitor is None or server is None:
            return
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._open_fds.add(fd)
                self._fd_client.pop(fd, None)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._open_fds.discard(fd)
                routing_id = self._fd_client.pop(fd, None)
                if routing_id is not None:
                    self._client_gone(routing_id)

    def _client_gone(self, routing_id: bytes) -> None:
        gone = self._gone
        gone[routing_id] = None
        if len(gone) > GONE_REMEMBERED:
            gone.popitem(last=False)
        self.server.disconnected(routing_id, self._loop.time())

    def _flush(self) -> None:
        sock, server = self._sock, self.server
        if sock is None:
            return
        while server.peer_outbox:
            outbox, server.peer_outbox = server.peer_outbox, []
            for peer, frames in outbox:
                self._cluster.send(peer, frames)
        while server.outbox:
            outbox, server.outbox = server.outbox, []
            for routing_id, frame in outbox:
                try:
                    sock.send(routing_id, zmq.SNDMORE | zmq.NOBLOCK)
                    sock.send(frame, zmq.NOBLOCK, copy=len(frame) < ZERO_COPY_MIN)
                except zmq.ZMQError as exc:
                    # EHOSTUNREACH: the client has gone; EAGAIN: it stopped reading replies.
                    self._log.info("reply undeliverable", error=exc.strerror)
                    server.unreachable(routing_id, self._loop.time())

    def _schedule(self) -> None:
        at = self.server.next_deadline()
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        if self.server is None or self._sock is None:
            return
        self.server.tick(self._loop.time())
        self._flush()
        self._schedule()
        if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._loop.call_soon(self._on_readable)

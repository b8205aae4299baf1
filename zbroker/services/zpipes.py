"""The ZPIPES service: a ROUTER socket and a clock around the sans-I/O server core.

All protocol decisions are taken by zpipes.server.ZpipesServer; this module only moves frames
between the socket and the core, and calls the core's ``tick`` when its next deadline comes.

Each readiness event drains the socket with non-blocking receives (up to a budget, so timers
still run under load). Frames are received without copies (``copy=False``); replies are copied
into ZeroMQ's message unless they are big. A zero-copy send has the buffer released by pyzmq's
garbage-collector thread, one wake-up of that thread (and a turn of the GIL) per message: for
a 64 KiB READ_OK that costs the broker more CPU than the copy does, for 1 MiB less.
"""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from zbroker.service import Peer, Service, ServiceContext, ServiceError
from zpipes.server import ServerConfig, ZpipesServer

DRAIN_BUDGET = 1000  # messages taken per readiness event before giving timers a turn
ZERO_COPY_MIN = 1 << 18  # replies at least this big are sent without a copy (see _flush)
FRAME_OVERHEAD = 11  # WRITE header (7) and timeout (4) around a chunk

# Plain ints: the flags of pyzmq are enum.Flag members, whose ``|`` runs Python code.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)


def server_config(config: Any) -> ServerConfig:
    """The core's settings from the broker's config."""
    clients = config.clients
    return ServerConfig(
        capacity=config.services.zpipes.capacity,
        client_timeout=clients.timeout,
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

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        section = config.services.zpipes
        self.endpoint = section.endpoint  # the config has filled in the broker name
        self._loop, self._log, self._cluster = ctx.loop, ctx.log, ctx.cluster
        sock = ctx.zmq_context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # tell us when a client has gone
        sock.setsockopt(zmq.MAXMSGSIZE, section.max_chunk + FRAME_OVERHEAD)
        sock.setsockopt(zmq.LINGER, 1000)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
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
        self._schedule()
        self._loop.call_soon(self._on_readable)  # the FD is edge-triggered: look once now
        ctx.log.info("zpipes bound", endpoint=self.endpoint,
                     capacity=section.capacity, max_chunk=section.max_chunk,
                     client_timeout=config.clients.timeout)

    async def stop(self) -> None:
        sock, server, loop = self._sock, self.server, self._loop
        if sock is None or server is None or loop is None:
            return
        loop.remove_reader(sock.getsockopt(zmq.FD))
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
            self._sock.setsockopt(zmq.MAXMSGSIZE, section.max_chunk + FRAME_OVERHEAD)
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
        recv, getsockopt, receive = sock.recv, sock.getsockopt, server.receive
        # Ask whether a message waits rather than catch zmq.Again after the last one: the
        # question is cheaper than the exception, and asked after our sends, it is also the
        # look that the edge-triggered FD needs before we sleep.
        for _ in range(DRAIN_BUDGET):
            if not getsockopt(_EVENTS) & _POLLIN:
                break
            routing_id = recv(_NOBLOCK)  # small: as bytes
            frame = recv(_NOBLOCK, copy=False)  # the body (a ROUTER always has one)
            if getsockopt(_RCVMORE):  # not ZPIPES: the core answers INVALID
                frames = [frame.buffer]
                while getsockopt(_RCVMORE):
                    frames.append(recv(_NOBLOCK, copy=False).buffer)
                receive(routing_id, frames, now)
            else:
                receive(routing_id, (frame.buffer,), now)
            if server.outbox or server.peer_outbox:
                self._flush()
        else:  # the budget is spent: let timers run, then drain on
            self._read_pending = True
            self._loop.call_soon(self._on_readable)
        self._schedule()

    def _flush(self) -> None:
        sock, server = self._sock, self.server
        if sock is None:
            return
        while server.peer_outbox:
            outbox, server.peer_outbox = server.peer_outbox, []
            for peer, frames in outbox:
                self._cluster.send(peer, frames)
        send = sock.send
        while server.outbox:
            outbox, server.outbox = server.outbox, []
            for routing_id, frame in outbox:
                try:
                    send(routing_id, _SNDMORE_NOBLOCK)
                    send(frame, _NOBLOCK, copy=len(frame) < ZERO_COPY_MIN)
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

"""The ZPIPES service: a ROUTER socket and a clock around the sans-I/O server core.

All protocol decisions are taken by zpipes.server.ZpipesServer; this module only moves frames
between the socket and the core, and calls the core's ``tick`` when its next deadline comes.

Each readiness event drains the socket with non-blocking receives (up to a budget, so timers
still run under load). Frames are received without copies (``copy=False``); replies are copied
into ZeroMQ's message unless they are big. A zero-copy send has the buffer released by pyzmq's
garbage-collector thread, one wake-up of that thread (and a turn of the GIL) per message: for
a 64 KiB READ_OK that costs the broker more CPU than the copy does, for 1 MiB less.

Dead clients are noticed by the transport, not by the client timeout: the socket monitor reports
each connection's disconnect with its file descriptor, and the first message of a client tells
which descriptor it came from (``zmq.SRCFD``), so a disconnect names the client to detach. The
monitor is drained before a new client's first message is taken, so a descriptor reused by a new
connection is never mistaken for the old one.

The same events guard the door: a connection to an ipc endpoint from a user that
``services.zpipes.allow`` does not admit (by the kernel's SO_PEERCRED), or one past
``clients.max_clients``, is hung up before any message of it is taken.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.limits import clients_problem
from zbroker.local_access import (
    PeerCredentials,
    Policy,
    default_policy,
    hang_up,
    local_address,
    peer_of,
)
from zbroker.service import PeerBroker, Service, ServiceContext, ServiceError
from zpipes.server import ServerConfig, ZpipesServer

DRAIN_BUDGET = 1000  # messages taken per readiness event before giving timers a turn
ZERO_COPY_MIN = 1 << 18  # replies at least this big are sent without a copy (see _flush)
FRAME_OVERHEAD = 11  # WRITE header (7) and timeout (4) around a chunk
# Frames up to this many times max_chunk reach the core, which refuses a chunk over max_chunk with
# WRITE_FAILED naming the limit; larger ones make the transport drop the connection.
FRAME_LIMIT_FACTOR = 2
MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
GONE_REMEMBERED = 4096  # routing ids of disconnected clients whose late messages are dropped
# TCP keepalive, so that a client host that vanished without closing is noticed (~16 s)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 2, 3


REFUSED_USERS_REMEMBERED = 1024  # uids whose refusal was logged (each is logged once)


def frame_limit(max_chunk: int) -> int:
    return FRAME_LIMIT_FACTOR * max_chunk + FRAME_OVERHEAD


def access_policy(config: Any) -> Policy:
    allow = config.services.zpipes.allow
    return default_policy(allow.users, allow.groups)


def _ipc_address(endpoint: str) -> bytes | str | None:
    """What getsockname() says for a socket accepted on an ipc endpoint."""
    transport, _, address = endpoint.partition("://")
    if transport != "ipc":
        return None
    return b"\0" + address[1:].encode() if address.startswith("@") else address

# Plain ints: the flags of pyzmq are enum.Flag members, whose ``|`` runs Python code.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _SRCFD = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.SRCFD)
# The socket methods of pyzmq's backend, called with positional arguments: the convenience
# layer's add a Python call (and keyword handling) to every frame. A received Frame says
# whether more parts follow (``more``): cheaper than asking the socket for RCVMORE.
_send, _recv, _get = zmq.backend.Socket.send, zmq.backend.Socket.recv, zmq.backend.Socket.get


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
        max_buffered=clients.max_buffered,
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
        self._policy: Policy = default_policy()
        self._max_connections = 0
        self._refused: dict[str, int] = {"not allowed": 0, "too many clients": 0}
        self._refused_users: OrderedDict[int, None] = OrderedDict()
        self._full = False  # at max_clients connections (logged once per episode)
        self._lives: dict[str, str] = {}  # peer broker's member id -> its life (PeerBroker.id)
        self._rtts: dict[str, float] = {}  # member id -> the round trip last told the core

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        section = config.services.zpipes
        self.endpoint = section.endpoint  # the config has filled in the broker name
        self._loop, self._log, self._cluster = ctx.loop, ctx.log, ctx.cluster
        problem = clients_problem(config.clients.max_clients)
        if problem:
            raise ServiceError(problem)
        self._policy = access_policy(config)
        self._max_connections = config.clients.max_clients
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
                     client_timeout=config.clients.timeout, allowed=self._policy.describe())

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
        problem = clients_problem(new.clients.max_clients)
        if problem:
            raise ServiceError(problem)
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
        self._max_connections = new.clients.max_clients
        policy = access_policy(new)
        if policy != self._policy:
            self._policy = policy
            self._refused_users.clear()
            self._log.info("zpipes access changed; it applies to connections made from now on",
                           allowed=policy.describe())

    def peer_joined(self, peer: PeerBroker) -> None:
        if self.server is not None:
            node = self._cluster.node if self._cluster is not None else None
            if node is not None:
                self.server.set_member(node.id)
            self._lives[peer.member] = peer.id
            self.server.peer_up(peer.id, self._loop.time(), member=peer.member,
                                directory=peer.directory, fanout=peer.fanout,
                                write_frames=peer.write_frames)
            self._flush_outside()

    def peer_left(self, peer: PeerBroker) -> None:
        if self._lives.get(peer.member) == peer.id:
            del self._lives[peer.member]
            self._rtts.pop(peer.member, None)
        if self.server is not None:
            self.server.peer_down(peer.id, self._loop.time())
            self._flush_outside()

    def peer_message(self, peer: PeerBroker, frames: list[Any]) -> None:
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
                "connections": len(self._open_fds), "refused": dict(self._refused),
                **(self.server.status() if self.server else {})}

    def metrics(self) -> dict[str, Any]:
        if self.server is None:
            return {}
        return {**self.server.metrics(), "connections": len(self._open_fds),
                "refused": dict(self._refused),
                "pipe_bytes": self._pipe_bytes()}

    def _pipe_bytes(self) -> list[tuple[str, int, int]]:
        """(pipe name, bytes written, bytes read) of each open pipe, by this broker's clients."""
        out = []
        for name, pipe in self.server.pipes.pipes.items():
            written = sum(w.bytes_in for w in pipe.writers.values() if not w.remote)
            read = sum(r.bytes_out for r in pipe.readers.values() if not r.remote)
            out.append((name.decode("utf-8", errors="backslashreplace"), written, read))
        return out

    # --- I/O ---------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        self._read_pending = False
        sock, server = self._sock, self.server
        if sock is None or server is None:
            return
        now = self._loop.time()
        receive, clients, gone = server.receive, server.clients, self._gone
        # The FD said there is something: take it without asking. After that, ask whether
        # a message waits rather than catch zmq.Again after the last one: the question is
        # cheaper than the exception, and asked after our sends, it is also the look that
        # the edge-triggered FD needs before we sleep.
        ask = False
        for _ in range(DRAIN_BUDGET):
            if ask and not _get(sock, _EVENTS) & _POLLIN:
                break
            ask = True
            try:
                routing_id = _recv(sock, _NOBLOCK)  # small: as bytes
            except zmq.Again:
                break
            body = _recv(sock, _NOBLOCK, False)  # the body (a ROUTER always has one)
            if body.more:  # not ZPIPES: the core answers INVALID
                frames = [body.buffer]
                frame = body
                while frame.more:
                    frame = _recv(sock, _NOBLOCK, False)
                    frames.append(frame.buffer)
            else:
                frames = (body.buffer,)
            if routing_id in clients:
                receive(routing_id, frames, now)
            elif routing_id in gone:
                continue  # sent before its connection closed: nobody to answer
            else:
                self._take_connection_events()  # up to now, before a descriptor is trusted
                fd = body.get(_SRCFD)
                if fd not in self._open_fds:  # closed meanwhile, or refused: nobody to answer
                    self._remember_gone(routing_id)
                    continue
                receive(routing_id, frames, now)
                if routing_id in clients:
                    self._fd_client[fd] = routing_id
            if server.outbox or server.peer_outbox:
                self._flush()
        else:  # the budget is spent: let timers run, then drain on
            self._read_pending = True
            self._loop.call_soon(self._on_readable)
        self._schedule()

    def _size_windows(self) -> None:
        """Tell the core each new round trip to a peer (the cluster's heartbeats measure
        them): the windows of the remote readers are sized to their links."""
        node = self._cluster.node if self._cluster is not None else None
        rtts = getattr(node, "last_rtt", None)
        if rtts:
            for member, life in self._lives.items():
                rtt = rtts.get(member)
                if rtt is not None and rtt != self._rtts.get(member):
                    self._rtts[member] = rtt
                    self.server.peer_rtt(life, rtt)

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
                self._fd_client.pop(fd, None)
                if self._admit(fd, event["endpoint"].decode(errors="replace")):
                    self._open_fds.add(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._open_fds.discard(fd)
                routing_id = self._fd_client.pop(fd, None)
                if routing_id is not None:
                    self._client_gone(routing_id)

    def _admit(self, fd: int, endpoint: str) -> bool:
        """Whether to take the connection just accepted on ``fd``; if not, hang it up. Its
        messages are never taken: only connections in ``_open_fds`` are heard."""
        expected = _ipc_address(endpoint)
        peer: PeerCredentials | None = None
        if expected is not None:
            if local_address(fd) != expected:
                return False  # the descriptor is not that connection's any more
            peer = peer_of(fd)
            if peer is None:
                return False
        if peer is not None and not self._policy.allows(peer):
            self._refuse(fd, "not allowed", peer)
            return False
        if len(self._open_fds) >= self._max_connections:
            self._refuse(fd, "too many clients", peer)
            return False
        if self._full:
            self._full = False
            self._log.info("zpipes takes connections again",
                           refused=self._refused["too many clients"])
        return True

    def _refuse(self, fd: int, why: str, peer: PeerCredentials | None) -> None:
        hang_up(fd)
        self._refused[why] += 1
        if peer is not None and why == "not allowed":
            if peer.uid not in self._refused_users:  # once per user: never a flood of lines
                self._refused_users[peer.uid] = None
                if len(self._refused_users) > REFUSED_USERS_REMEMBERED:
                    self._refused_users.popitem(last=False)
                self._log.warning("zpipes connection refused: user not allowed",
                                  peer=peer.describe(), allowed=self._policy.describe())
        elif not self._full:
            self._full = True
            self._log.warning("zpipes connection refused: too many clients; newer connections "
                              "are hung up until some go", max_clients=self._max_connections)

    def _client_gone(self, routing_id: bytes) -> None:
        self._remember_gone(routing_id)
        self.server.disconnected(routing_id, self._loop.time())

    def _remember_gone(self, routing_id: bytes) -> None:
        gone = self._gone
        gone[routing_id] = None
        if len(gone) > GONE_REMEMBERED:
            gone.popitem(last=False)

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
                    _send(sock, routing_id, _SNDMORE_NOBLOCK)
                    _send(sock, frame, _NOBLOCK, len(frame) < ZERO_COPY_MIN)
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
        self._size_windows()
        self._flush()
        self._schedule()
        if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._loop.call_soon(self._on_readable)

"""The asyncio server every ZMTP endpoint of the broker runs on.

A :class:`Server` listens on its endpoints (tcp or ipc) and keeps its connections, each a
:class:`Link` (an ``asyncio.BufferedProtocol`` around a :class:`~zbroker.zmtp.codec.Connection`).
What guards the door is here, once, for every endpoint:

- admission (:mod:`zbroker.zmtp.admission`): the process's connection budget, and on ipc who
  the peer is (SO_PEERCRED), before a byte of the connection is read;
- a handshake timeout: a connection that has not finished its ZMTP handshake in time is
  dropped, so silent connections cannot keep the places of clients;
- TCP_NODELAY and keepalive on tcp, so a peer host that vanished is noticed;
- what a connection may hold of input: the codec's limits (a message past ``max_bytes`` or
  ``max_frames`` is refused as it arrives, never held), and nothing is read from a connection
  whose replies are not taken (the endpoints pause reading it);
- refusals counted by reason and logged at a bounded rate (:mod:`zbroker.zmtp.refusals`).

What a connection's messages mean is the endpoint's: a subclass of :class:`Link` reads
(``get_buffer``/``buffer_updated``, the hot path) and hands its codec's events to
:meth:`Link.ready` (the handshake's end: a routing id) and :meth:`Link.broken` (the peer
broke the protocol); a subclass of :class:`Server` hears :meth:`Server.linked` and
:meth:`Server.unlinked`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

from zbroker.runtime.acceptor import ACCEPT_PAUSE_S, Acceptor
from zbroker.runtime.iovec import gather
from zbroker.runtime.local_access import peer_of
from zpipes.zmtp_framing import error_command, greeting

from .addresses import listen_socket, peer_name
from .admission import NOT_ALLOWED, Admission, Source
from .codec import LARGE_FRAME, Connection, Ready, RoutingIds

#: what one read from a connection may take: one buffer for all connections of a server,
#: large enough that a window of big messages comes in a few reads (each a wake-up)
READ_SIZE = 1 << 20
#: while a connection's transport holds bytes its peer has not taken, small answers wait
#: here for this long (or this many bytes), joined, and go to the transport as one piece: a
#: transport keeps an object for each piece it holds, so answers sent one at a time to a
#: peer that does not read cost tens of times their bytes (100 unread HINT askers: 1.2 GB)
HELD_WAIT_S = 0.01
HELD_MAX = 64 << 10
# TCP keepalive, so that a peer host that vanished without closing is noticed (~16 s)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 2, 3


_buffers = threading.local()


def read_buffer() -> memoryview:
    """The buffer every connection served on this thread's loop reads into (its messages are
    taken out of it before the next read): one per thread, not one per endpoint (2 000
    queues held 2 000 of them, 1 MiB each)."""
    buffer = getattr(_buffers, "scratch", None)
    if buffer is None:
        buffer = _buffers.scratch = memoryview(bytearray(READ_SIZE))
    return buffer


class Server:
    """One ZMTP endpoint's listening sockets and connections, on ``loop``.

    ``protocol``: the :class:`Link` class of its connections. ``write_high``: bytes queued in
    a connection's transport before it calls ``pause_writing``. ``unix_sndbuf``: the send
    buffer of an ipc connection, when the default (208 KiB) is too small for its replies."""

    def __init__(self, loop: asyncio.AbstractEventLoop, admission: Admission, log: Any,
                 protocol: type[Link], write_high: int = 4 << 20,
                 unix_sndbuf: int | None = None) -> None:
        self.loop = loop
        self.admission = admission
        self.log = log
        self.protocol = protocol
        self.write_high = write_high
        self.unix_sndbuf = unix_sndbuf
        self.links: dict[bytes, Any] = {}  # by routing id, once the handshake is done
        self.all: set[Any] = set()  # connections taken (handshake done or not)
        self.hung_up = 0  # connections dropped for breaking the protocol
        self.scratch = read_buffer()  # read into, taken out at once
        self._ids = RoutingIds(int.from_bytes(os.urandom(4), "big"))
        #: listening sockets accepted on, with their acceptors
        self._listeners: list[tuple[socket.socket, Acceptor]] = []
        self._taking: set[asyncio.Task[None]] = set()  # accepted, being made transports
        self._paths: list[str] = []  # ipc endpoints' files, removed at close
        self._idle = asyncio.Event()  # set when no connection is left (see close)

    @property
    def connections(self) -> int:
        return len(self.all)

    # --- listening ------------------------------------------------------------------------

    def listen(self, endpoint: str) -> socket.socket:
        """A socket bound to ``endpoint`` and listening (OSError, or EndpointError if it is
        not tcp://HOST:PORT or ipc://PATH); :meth:`serve` it."""
        sock = listen_socket(endpoint)
        address = sock.getsockname()
        if sock.family == socket.AF_UNIX and isinstance(address, str) and address:
            self._paths.append(address)  # ours now: removed at close
        return sock

    async def serve(self, sock: socket.socket) -> None:
        """Accept connections on ``sock`` (listening) until :meth:`stop_listening`, as
        :mod:`zbroker.runtime.acceptor` does: every one waiting, a round of the loop at a
        time, and a rest when the process is out of descriptors."""
        acceptor = Acceptor(self.loop, sock, self._accepted, self._accept_failed)
        self._listeners.append((sock, acceptor))
        acceptor.start()

    def _accepted(self, conn: socket.socket, address: Any) -> None:
        task = self.loop.create_task(self._take(conn))
        self._taking.add(task)  # (held: the loop keeps only a weak reference)
        task.add_done_callback(self._taking.discard)

    async def _take(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: self.protocol(self), conn)
        except OSError:
            conn.close()

    def _accept_failed(self, exc: OSError) -> None:
        self.admission.refusals.note(
            "accept failed", f"{self.admission.what} cannot accept connections: "
            f"{exc.strerror}; accepting again in {ACCEPT_PAUSE_S:g} s", level="error")

    async def start(self, endpoint: str) -> None:
        """Listen on ``endpoint`` and serve it (OSError or EndpointError if it cannot)."""
        await self.serve(self.listen(endpoint))

    def stop_listening(self) -> None:
        for sock, acceptor in self._listeners:
            acceptor.stop()
            sock.close()
        self._listeners.clear()
        for path in self._paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._paths.clear()

    @property
    def listening(self) -> bool:
        return bool(self._listeners)

    def close_now(self) -> None:
        """Stop listening and close every connection (after what it was sent is written)."""
        self.stop_listening()
        for link in list(self.all):
            link.hang_up()

    async def close_after(self, linger: float) -> None:
        """Stop listening, and close every connection once what it was sent is written (for
        at most ``linger`` seconds)."""
        self.close_now()
        if self.all:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), linger)
            except TimeoutError:
                for link in list(self.all):
                    if link.transport is not None:
                        link.transport.abort()

    # --- what the endpoints hear ------------------------------------------------------------

    def routing_id(self, asked: bytes) -> bytes:
        """The id a ROUTER gives a peer: the one it asked for when that is free (and does not
        start with a zero byte, which marks ids made here), else a new one."""
        return self._ids.pick(asked, self.links)

    def linked(self, link: Any) -> None:
        """``link`` finished its handshake: it is in ``links`` under its routing id."""

    def unlinked(self, link: Any) -> None:
        """``link``, linked before, is gone."""


class Link(asyncio.BufferedProtocol):
    """One connection of a :class:`Server`: admitted, given its socket options, greeted, and
    dropped if its handshake lags. ``codec`` makes its :class:`Connection` from the server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.conn: Connection = self.codec(server)
        self.transport: Any = None
        self.routing_id: bytes | None = None
        self.taken = False  # admitted: counted in the budget and in server.all
        self.source: Source = ("host", "")  # who it is from, for the budget's shares
        self._handshake: asyncio.TimerHandle | None = None
        self._held = bytearray()  # small pieces waiting for the transport (HELD_WAIT_S)
        self._held_timer: asyncio.TimerHandle | None = None

    def codec(self, server: Server) -> Connection:
        raise NotImplementedError

    def connection_made(self, transport: Any) -> None:
        s = self.server
        self.transport = transport
        sock = transport.get_extra_info("socket")
        ipc = sock.family == socket.AF_UNIX
        peer = None
        if ipc:
            peer = peer_of(sock.fileno())
            if peer is None:  # gone already
                transport.abort()
                return
            self.source = ("uid", peer.uid)
        else:
            address = transport.get_extra_info("peername")
            self.source = ("host", address[0] if isinstance(address, tuple) else str(address))
        why = s.admission.admit(peer, self.source)
        if why is not None:
            if why == NOT_ALLOWED and peer is not None:
                # told, in the handshake's own terms (a ZMTP ERROR after our greeting), then
                # closed: a client says "not allowed", not "Broken pipe"
                transport.write(refusal(s.admission.not_allowed_reason(peer)))
                transport.close()
            else:
                transport.abort()
            return
        self.taken = True
        s.all.add(self)
        if ipc:
            if s.unix_sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, s.unix_sndbuf)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
        transport.set_write_buffer_limits(high=s.write_high)
        transport.write(self.conn.data_to_send())
        self._handshake = s.loop.call_later(s.admission.handshake_timeout,
                                            self._handshake_expired)

    def _handshake_expired(self) -> None:
        self._handshake = None
        if self.transport is not None:
            self.server.admission.no_handshake(peer_name(self.transport))
            self.transport.abort()

    def ready(self, event: Ready) -> None:
        """The handshake is done: the connection has its routing id."""
        s = self.server
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self.routing_id = rid = s.routing_id(event.routing_id)
        s.links[rid] = self
        s.linked(self)

    def broken(self, reason: str) -> None:
        """The peer broke the protocol: counted and logged (at a bounded rate); the codec is
        closed, and the connection is hung up once its last bytes (an ERROR) are written."""
        self.server.hung_up += 1
        self.server.admission.broken(peer_name(self.transport), reason)

    def write_parts(self, parts: list[Any]) -> None:
        """Write ``parts`` (frames and their heads, in order) in one gathered write: frames
        of LARGE_FRAME bytes or more as they are (not copied), each run of smaller pieces
        joined into one. While the transport holds what its peer has not taken, small pieces
        wait a moment, joined with those that follow (see HELD_WAIT_S): what a connection
        costs is then its bytes, whatever answers it is sent and however they are sent."""
        pieces = gather(parts, LARGE_FRAME)[0]
        transport = self.transport
        if not self._held and not transport.get_write_buffer_size():
            transport.writelines(pieces)
            return
        for piece in pieces:
            if len(piece) >= LARGE_FRAME:
                self.write_held()  # (what waits goes first; it makes _held anew)
                transport.write(piece)
            else:
                self._held += piece
        if len(self._held) >= HELD_MAX:
            self.write_held()
        elif self._held and self._held_timer is None:
            self._held_timer = self.server.loop.call_later(HELD_WAIT_S, self.write_held)

    def write_held(self) -> None:
        """Give the small pieces waiting to the transport, as one."""
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        if self._held:
            held, self._held = bytes(self._held), bytearray()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(held)

    def unsent_bytes(self) -> int:
        """Bytes written to this connection that its peer has not taken yet."""
        transport = self.transport
        return len(self._held) + (transport.get_write_buffer_size() if transport is not None
                                  else 0)

    def hang_up(self) -> None:
        """Close the connection once what it was sent is written."""
        self.write_held()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        s = self.server
        self.transport = None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        self._held = bytearray()
        self.conn.release()
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        if not self.taken:
            return
        self.taken = False
        s.admission.release(self.source)
        s.all.discard(self)
        if not s.all:
            s._idle.set()
        rid = self.routing_id
        if rid is not None and s.links.get(rid) is self:
            del s.links[rid]
            s.unlinked(self)


def refusal(reason: str) -> bytes:
    """What a connection refused before its handshake is sent: our greeting, and ERROR."""
    return greeting(as_server=True) + error_command(reason)

"""The ZPIPES client endpoint: a ZeroMQ ROUTER on asyncio over ZMTP (``zbroker/pzq/zmtp.py``).

Clients are libzmq DEALER sockets (the original C client, ``zpipes.client``, ``zpipes.aio``);
they see what a libzmq ROUTER would show them. The broker speaks ZMTP itself instead of going
through libzmq for what that buys on this path:

- cost: each readiness event is one read of up to 1 MiB into one buffer, on the event loop's
  thread; libzmq would read in 8 KiB batches on its I/O thread and wake the loop through its
  mailbox, about three thread switches per message;
- the door: each connection is accepted here, so its peer's credentials (SO_PEERCRED) are read
  on its own socket, and a connection from a user not allowed, or past ``max_connections``, is
  closed before a byte of it is read;
- dead clients: a connection's end is a ``connection_lost`` naming its routing id, at once;
- limits: a message over ``max_bytes`` is refused as its frame header arrives, and the rest of
  it is skipped as it comes, never held. What is held of messages still arriving (a large
  frame's buffer is made whole as its head arrives) is :meth:`Endpoint.incoming_bytes`, and a
  large frame is taken only if ``admit_frame`` says it fits (the service's budget), else
  refused as its head arrives like one over the limit; past the budget, a message under way
  in smaller frames is refused at the read that finds it so.

Routing ids follow a ROUTER's: the one the peer asked for (ZMTP's Identity) when it is free and
does not start with a zero byte, else one made here (a zero byte and four more). The security
mechanism is NULL: a peer that asks for CURVE (no ZPIPES client does) is refused.

Sends (:meth:`Endpoint.send`) are queued per connection and written at :meth:`Endpoint.flush`,
one gathered write per connection, without copying the frames. A connection whose replies are
not taken (its transport's buffer over ``WRITE_HIGH``) is not read until they are: what it can
still be sent is the answers to requests taken before, which the ZPIPES core bounds (one
request and ``max_pipelined`` queued behind it; a READ's answer at most its size, and at most
what the pipe holds); what waits in the connections for their peers (:meth:`unsent_bytes`)
counts in the broker-wide budget, ``clients.max_buffered``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from zbroker.local_access import PeerCredentials, peer_of
from zbroker.pzq import zmtp
from zbroker.pzq.receiver import listen_socket, peer_name

#: bytes queued on a connection before it is no longer read (its replies are not taken)
WRITE_HIGH = 4 << 20
#: what one read from a connection may take; one buffer for all connections
READ_SIZE = 1 << 20
#: the send buffer of an ipc connection (Linux's default is 208 KiB)
UNIX_SNDBUF = 1 << 20
#: a frame this large that comes in several reads is read into its own buffer (no copies)
DIRECT_MIN = 128 << 10
#: seconds a connection may take to finish the ZMTP handshake (libzmq's ZMQ_HANDSHAKE_IVL
#: does the same), so that connections that say nothing cannot keep the places of clients
HANDSHAKE_TIMEOUT_S = 10.0
# TCP keepalive, so that a client host that vanished without closing is noticed (~16 s)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 2, 3

_LONG = struct.Struct(">BQ")
_SHORT_HEADS = [bytes((0, n)) for n in range(256)]  # the head of a last frame of n bytes


def frame_head(size: int) -> bytes:
    """The ZMTP head of a single-frame message of ``size`` bytes."""
    return _SHORT_HEADS[size] if size < 256 else _LONG.pack(zmtp.LONG, size)


class Endpoint:
    """Connections of ZMTP peers to a ROUTER, on ``loop``.

    ``on_message(routing_id, frames)`` is called for each message, in order;
    ``on_refused(routing_id, refused)`` for one over the limits (:class:`zmtp.Refused`, in
    its turn among the messages: the rest of it is skipped as it arrives); ``on_gone(routing_id)``
    when a connection that had a routing id ends; ``after_input()`` after each read's messages.
    ``admit(peer)`` says why a new connection is refused (None: taken), ``peer`` being its
    peer's credentials on an ipc endpoint, None on tcp."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *,
                 on_message: Callable[[bytes, list[Any]], None],
                 on_refused: Callable[[bytes, zmtp.Refused], None],
                 on_gone: Callable[[bytes], None],
                 after_input: Callable[[], None],
                 admit: Callable[[PeerCredentials | None], str | None],
                 max_bytes: int, max_frames: int, log: Any,
                 admit_frame: Callable[[int], str | None] | None = None):
        self.loop = loop
        self.on_message, self.on_refused, self.on_gone = on_message, on_refused, on_gone
        self.after_input, self.admit, self.admit_frame = after_input, admit, admit_frame
        self.incoming = 0  # bytes held of messages still arriving, all connections
        self.max_bytes, self.max_frames = max_bytes, max_frames
        self.log = log
        self.links: dict[bytes, _Link] = {}  # by routing id, once the handshake is done
        self.connections = 0  # connections taken (handshake done or not)
        self._servers: list[asyncio.AbstractServer] = []
        self._paths: list[str] = []  # ipc endpoints' files, removed at close
        self._dirty: list[_Link] = []  # connections with sends queued
        self._backed_up: set[_Link] = set()  # connections with sends not yet written out
        self._ids = zmtp.RoutingIds(int.from_bytes(os.urandom(4), "big"))
        self.scratch = memoryview(bytearray(READ_SIZE))  # read into, taken out at once
        self._all: set[_Link] = set()
        self._idle = asyncio.Event()  # set when no connection is left (see close)

    # --- listening ------------------------------------------------------------------------

    def listen(self, endpoint: str) -> socket.socket:
        """A socket bound to ``endpoint`` and listening (OSError, or ValueError if it is not
        tcp://HOST:PORT or ipc://PATH); :meth:`serve` it."""
        sock = listen_socket(endpoint)
        address = sock.getsockname()
        if sock.family == socket.AF_UNIX and isinstance(address, str) and address:
            self._paths.append(address)  # ours now: removed at close
        return sock

    async def serve(self, sock: socket.socket) -> None:
        if sock.family == socket.AF_UNIX:
            server = await self.loop.create_unix_server(lambda: _Link(self), sock=sock)
        else:
            server = await self.loop.create_server(lambda: _Link(self), sock=sock)
        self._servers.append(server)

    async def close(self, linger: float) -> None:
        """Stop listening, and close every connection once what it was sent is written (for
        at most ``linger`` seconds)."""
        for server in self._servers:
            server.close()
        self._servers.clear()
        for path in self._paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._paths.clear()
        self.flush()
        for link in list(self._all):
            link.transport.close()  # after its buffer is written
        if self._all:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), linger)
            except TimeoutError:
                for link in list(self._all):
                    link.transport.abort()

    # --- sending --------------------------------------------------------------------------

    def send(self, routing_id: bytes, frame: Any) -> bool:
        """Queue a single-frame message for ``routing_id``; False if it has no connection."""
        link = self.links.get(routing_id)
        if link is None:
            return False
        out = link.out
        if not out:
            self._dirty.append(link)
        out.append(frame_head(len(frame)))
        out.append(frame)
        return True

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for link in dirty:
            out, link.out = link.out, []
            transport = link.transport
            if transport is not None and not transport.is_closing():
                transport.writelines(out)
                if transport.get_write_buffer_size():  # its peer does not keep up
                    self._backed_up.add(link)

    def incoming_bytes(self) -> int:
        """Bytes held of messages still arriving, on all connections."""
        return self.incoming

    def unsent_bytes(self) -> int:
        """Bytes sent to connections whose peers have not taken them yet (held here, in
        the transports' buffers): what the broker holds for readers that do not read."""
        total = 0
        for link in list(self._backed_up):
            transport = link.transport
            n = transport.get_write_buffer_size() if transport is not None else 0
            if n:
                total += n
            else:
                self._backed_up.discard(link)
        return total

    def set_max_bytes(self, max_bytes: int) -> None:
        """The limit of a message, from now on, on every connection."""
        self.max_bytes = max_bytes
        for link in self._all:
            link.conn.max_bytes = max_bytes

    def hang_up(self, routing_id: bytes) -> None:
        """Close ``routing_id``'s connection once what it was sent is written."""
        link = self.links.get(routing_id)
        if link is not None and link.transport is not None:
            self.flush()
            link.transport.close()

    def routing_id(self, asked: bytes) -> bytes:
        return self._ids.pick(asked, self.links)


class _Link(asyncio.BufferedProtocol):
    """One client's connection."""

    def __init__(self, endpoint: Endpoint):
        self.e = endpoint
        self.conn = zmtp.Connection(endpoint.max_frames, endpoint.max_bytes, keep_first=16,
                                    writable=True, direct_min=DIRECT_MIN)
        self.conn.admit = endpoint.admit_frame
        self.incoming = 0  # what this connection counts in the endpoint's ``incoming``
        self.direct = False  # the last read went to the frame's own buffer
        self.handshake: asyncio.TimerHandle | None = None  # drops it if the handshake lags
        self.transport: Any = None
        self.routing_id: bytes | None = None
        self.out: list[Any] = []
        self.taken = False
        self.paused = False  # not read: its replies wait to be written

    def connection_made(self, transport: Any) -> None:
        e = self.e
        self.transport = transport
        sock = transport.get_extra_info("socket")
        peer = None
        if sock.family == socket.AF_UNIX:
            peer = peer_of(sock.fileno())
            why = "gone" if peer is None else e.admit(peer)
        else:
            why = e.admit(None)
        if why is not None:
            transport.abort()
            return
        if sock.family == socket.AF_UNIX:
            # a READ_OK of 1 MiB goes out in one write, not five (each a wake-up of its own);
            # the kernel caps it at net.core.wmem_max. TCP keeps its own sizing (autotuning)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SNDBUF)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
        self.taken = True
        e.connections += 1
        e._all.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        transport.write(self.conn.data_to_send())
        self.handshake = e.loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_expired)

    def _handshake_expired(self) -> None:
        self.handshake = None
        if self.transport is not None:
            self.e.log.info("zpipes connection dropped: no ZMTP handshake within "
                            f"{HANDSHAKE_TIMEOUT_S:g} s", peer=peer_name(self.transport))
            self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self.conn.frame_buffer()
        self.direct = direct is not None
        return self.e.scratch if direct is None else direct

    def buffer_updated(self, nbytes: int) -> None:
        e, conn = self.e, self.conn
        if self.direct:
            conn.frame_filled(nbytes)
        else:
            conn.receive_data(e.scratch[:nbytes])
        self._count_incoming()  # (before the messages are handed on: a whole one is the
        # core's to count)
        if (self.incoming and not conn.receiving_large and e.admit_frame is not None
                and (why := e.admit_frame(0)) is not None and conn.refuse_current(why)):
            # past the budget, a message under way in frames too small to have been asked
            # about (each under DIRECT_MIN) is let go too, as a large one is at its head
            self._count_incoming()
        for ev in conn.next_events():
            kind = type(ev)
            if kind is zmtp.Message:
                e.on_message(self.routing_id, ev.frames)
            elif kind is zmtp.Refused:
                e.on_refused(self.routing_id, ev)
            elif kind is zmtp.Ready:
                self.routing_id = e.routing_id(ev.routing_id)
                e.links[self.routing_id] = self
                self.handshake.cancel()
                self.handshake = None
            else:  # Closed: the peer broke the protocol
                e.log.warning("zpipes connection dropped", peer=peer_name(self.transport),
                              reason=ev.reason)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)
        if conn.closed:
            self.transport.close()
        e.after_input()

    def _count_incoming(self) -> None:
        """What this connection holds of messages still arriving, in the endpoint's count."""
        held = self.conn.buffered
        self.e.incoming += held - self.incoming
        self.incoming = held

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.paused:
            self.paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        e = self.e
        self.transport = None
        self.out = []
        if self.handshake is not None:
            self.handshake.cancel()
            self.handshake = None
        if not self.taken:
            return
        self.taken = False
        e.connections -= 1
        e.incoming -= self.incoming
        self.incoming = 0
        e._all.discard(self)
        e._backed_up.discard(self)
        if not e._all:
            e._idle.set()
        rid = self.routing_id
        if rid is not None and e.links.get(rid) is self:
            del e.links[rid]
            e.on_gone(rid)

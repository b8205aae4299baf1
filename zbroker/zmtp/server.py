"""The asyncio server every ZMTP endpoint of the broker runs on: the door, the read path and
the write path, once for every endpoint.

A :class:`Server` listens on its endpoints (tcp or ipc) and keeps its connections, each a
:class:`Link` (an ``asyncio.BufferedProtocol`` around a :class:`~zbroker.zmtp.codec.Connection`).

The door:

- admission (:mod:`zbroker.zmtp.admission`): the process's connection budget, and on ipc who
  the peer is (SO_PEERCRED), before a byte of the connection is read;
- a handshake timeout: a connection that has not finished its ZMTP handshake in time is
  dropped, so silent connections cannot keep the places of clients;
- TCP_NODELAY and keepalive on tcp, so a peer host that vanished is noticed;
- refusals counted by reason and logged at a bounded rate (:mod:`zbroker.zmtp.refusals`).

The read path (:meth:`Link.buffer_updated`, the hot path): every connection of a loop reads
into one buffer, a large frame into its own (the endpoint's :class:`~zbroker.zmtp.flow.ReadPolicy`);
reads are sized to the messages and connections take turns (:mod:`zbroker.zmtp.flow`); what
connections hold of messages still arriving is counted, in all and by source
(:attr:`Server.incoming`, the codec's limits refuse a message past ``max_bytes`` or
``max_frames`` as it arrives, never held); a connection is not read while anything holds it
(:meth:`Link.hold`: its answers not taken, its turn used, its endpoint's inbox full).

The write path: answers are queued on their connection (:meth:`Server.queue`) and leave at
:meth:`Server.flush`, one gathered write per connection, large frames not copied; while a
transport holds what its peer has not taken, small answers wait a moment and go joined
(:meth:`Link.write_parts`), so what an unread connection costs is its bytes, whatever answers
it is sent; :meth:`Server.unsent_bytes` is what all of them hold.

What a connection's messages mean is the endpoint's: a subclass of :class:`Server` hears
:meth:`Server.message` and :meth:`Server.refused` for each message in order,
:meth:`Server.police` after each read (it may refuse the message under way: a budget),
:meth:`Server.after_read`, and :meth:`Server.linked` / :meth:`Server.unlinked`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

from zbroker.runtime import shares
from zbroker.runtime.acceptor import ACCEPT_PAUSE_S, Acceptor
from zbroker.runtime.iovec import gather
from zbroker.runtime.local_access import peer_of
from zpipes.zmtp_framing import error_command, greeting

from .addresses import listen_socket, peer_name
from .admission import NOT_ALLOWED, Admission, Source
from .codec import LARGE_FRAME, Closed, Connection, Message, Ready, Refused, RoutingIds
from .flow import READ_SIZE, ReadPolicy, Rounds, read_size

#: while a connection's transport holds bytes its peer has not taken, small answers wait
#: here for this long (or this many bytes), joined, and go to the transport as one piece: a
#: transport keeps an object for each piece it holds, so answers sent one at a time to a
#: peer that does not read cost tens of times their bytes (100 unread HINT askers: 1.2 GB)
HELD_WAIT_S = 0.01
HELD_MAX = 64 << 10
#: a connection hung up waits for its peer to take what it was sent, but is cut when its peer
#: takes nothing of it for this long: a peer that does not read cannot keep a connection (its
#: place in the budget, its bytes) for ever once it is closed
CLOSE_LINGER_S = 10.0
# TCP keepalive, so that a peer host that vanished without closing is noticed (~16 s)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 2, 3

#: why a connection is not read (:meth:`Link.hold`): its answers are not taken (and its
#: endpoint does not read such), it used its turn, or its endpoint holds it (an inbox full,
#: requests waiting, too many answers waiting for it)
WRITING, TURN, INBOX, CROWDED, ANSWERS = 1, 2, 4, 8, 16

#: how an endpoint's connections are read unless it says otherwise
DEFAULT_POLICY = ReadPolicy()

_loop_state = threading.local()


def read_buffer() -> memoryview:
    """The buffer every connection served on this thread's loop reads into (its messages are
    taken out of it before the next read): one per thread, not one per endpoint (2 000
    queues held 2 000 of them, 1 MiB each)."""
    buffer = getattr(_loop_state, "scratch", None)
    if buffer is None:
        buffer = _loop_state.scratch = memoryview(bytearray(READ_SIZE))
    return buffer


def rounds_of(loop: asyncio.AbstractEventLoop) -> Rounds:
    """The turns of every connection served on ``loop`` (:class:`~zbroker.zmtp.flow.Rounds`):
    floods on many endpoints share one round."""
    if getattr(_loop_state, "loop", None) is not loop:
        _loop_state.loop, _loop_state.rounds = loop, Rounds()
    rounds: Rounds = _loop_state.rounds
    return rounds


class Server:
    """One ZMTP endpoint's listening sockets and connections, on ``loop``.

    ``protocol``: the :class:`Link` class of its connections. ``policy``: how they are read.
    ``write_high``: bytes queued in a connection's transport before it calls
    ``pause_writing``. ``unix_sndbuf``: the send buffer of an ipc connection, when the default
    (208 KiB) is too small for its replies."""

    def __init__(self, loop: asyncio.AbstractEventLoop, admission: Admission, log: Any,
                 protocol: type[Link], write_high: int = 4 << 20,
                 unix_sndbuf: int | None = None, policy: ReadPolicy = DEFAULT_POLICY) -> None:
        self.loop = loop
        self.admission = admission
        self.log = log
        self.protocol = protocol
        self.write_high = write_high
        self.unix_sndbuf = unix_sndbuf
        self.policy = policy
        self.links: dict[bytes, Any] = {}  # by routing id, once the handshake is done
        self.all: set[Any] = set()  # connections taken (handshake done or not)
        self.hung_up = 0  # connections dropped for breaking the protocol
        self.scratch = read_buffer()  # read into, taken out at once
        self.reads = self.scratch[:policy.max_read]  # ... a read at most this
        self.rounds = rounds_of(loop)
        self.incoming = 0  # bytes held of messages still arriving, all connections
        self.incoming_by_source: dict[Any, int] = {}  # the same, by source
        self._dirty: list[Link] = []  # connections with answers queued
        self._first: list[Link] = []  # of those, the ones to write first (``queue``'s first)
        self._backed_up: set[Link] = set()  # connections with answers not yet written out
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
        """Write what was queued, stop listening, and close every connection once what it
        was sent is written (for at most ``linger`` seconds)."""
        self.flush()
        self.close_now()
        if self.all:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), linger)
            except TimeoutError:
                for link in list(self.all):
                    if link.transport is not None:
                        link.transport.abort()

    # --- the write path -------------------------------------------------------------------

    def queue(self, link: Link, parts: list[Any], size: int, first: bool = False) -> None:
        """Queue ``parts`` (a message's frames with their heads, :func:`encode_parts`), of
        ``size`` bytes, for ``link``; they leave at :meth:`flush`. ``first``: its peer is idle
        until they arrive (they answer a request that waited): its connection is written
        before those only sent answers to what they just asked."""
        if not link.out:
            self._dirty.append(link)
        if first:
            self._first.append(link)
        link.out += parts
        link.queued += size

    def flush(self) -> None:
        """Write what was queued, one gathered write per connection: first the connections
        queued something ``first``, then the others, each in the order of its first queueing.
        A connection's messages go out in the order they were queued, in one write."""
        dirty, self._dirty = self._dirty, []
        if self._first:
            dirty[:0], self._first = self._first, []
        for link in dirty:
            out = link.out
            if not out:  # (written already: it was also among the first)
                continue
            link.out = []
            link.queued = 0
            transport = link.transport
            if transport is not None and not transport.is_closing():
                link.write_parts(out)
                if link.unsent_bytes():  # its peer does not keep up
                    self._backed_up.add(link)

    def unsent_bytes(self) -> int:
        """Bytes written to connections whose peers have not taken them yet (held here, in
        the transports' buffers): what the endpoint holds for peers that do not read. Small
        answers to such a peer are joined (:meth:`Link.write_parts`), so this is also about
        what they cost in memory."""
        total = 0
        for link in list(self._backed_up):
            n = link.unsent_bytes()
            if n:
                total += n
            else:
                self._backed_up.discard(link)
        return total

    def incoming_of(self, source: Any) -> int:
        """Bytes held of messages still arriving from ``source``'s connections."""
        return self.incoming_by_source.get(source, 0)

    # --- what the endpoints hear ------------------------------------------------------------

    def routing_id(self, asked: bytes) -> bytes:
        """The id a ROUTER gives a peer: the one it asked for when that is free (and does not
        start with a zero byte, which marks ids made here), else a new one."""
        return self._ids.pick(asked, self.links)

    def linked(self, link: Any) -> None:
        """``link`` finished its handshake: it is in ``links`` under its routing id."""

    def unlinked(self, link: Any) -> None:
        """``link``, linked before, is gone."""

    def message(self, link: Any, message: Message) -> None:
        """A whole message came on ``link`` (its handshake is done)."""

    def refused(self, link: Any, refused: Refused) -> None:
        """A message over the limits came on ``link``, in its turn among the messages; the
        rest of it is let go as it arrives."""

    def police(self, link: Any) -> None:
        """After each read of ``link`` (its messages handed on, what it holds of the next
        counted): refuse the message under way (:meth:`Link.refuse`) if it does not fit, or
        hold the connection (:meth:`Link.hold`)."""

    def after_read(self, link: Any, events: int) -> None:
        """A read of ``link`` is handled: ``events`` messages and refusals were handed on."""

    def writable(self, link: Any) -> None:
        """``link``'s transport takes more again (it drained below its low mark)."""


class Link(asyncio.BufferedProtocol):
    """One connection of a :class:`Server`: admitted, given its socket options, greeted,
    dropped if its handshake lags; read and written as the module says. ``codec`` makes its
    :class:`Connection` from the server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.conn: Connection = self.codec(server)
        self.transport: Any = None
        self.routing_id: bytes | None = None
        self.taken = False  # admitted: counted in the budget and in server.all
        self.source: Source = ("host", "")  # who it is from, for the budget's shares
        self.out: list[Any] = []  # answers queued (Server.queue), frames and their heads
        self.queued = 0  # their bytes
        self.full = False  # its transport is over its high mark: its peer does not read
        self.holds = 0  # why it is not read (WRITING, TURN, INBOX, CROWDED), 0 if read
        self.incoming = 0  # what it holds of messages still arriving (in server.incoming)
        #: read it this much at a time (0: as much as a read takes), sized for its messages
        self.small = server.policy.first_read
        self.direct = False  # the last read went to a large frame's own buffer
        self.turn = 0  # messages it sent since it last let the others go first
        self.events = 0  # messages and refusals handed on in the read under way
        self._handshake: asyncio.TimerHandle | None = None
        self._held = bytearray()  # small pieces waiting for the transport (HELD_WAIT_S)
        self._held_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None  # (hung up: cut if nothing is taken)

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

    # --- the read path --------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self.conn.frame_buffer()
        self.direct = direct is not None
        if direct is not None:
            return direct
        return self.server.scratch[:self.small] if self.small else self.server.reads

    def buffer_updated(self, nbytes: int) -> None:
        s, conn = self.server, self.conn
        if self.direct:
            conn.frame_filled(nbytes)
        else:
            conn.receive_data(s.scratch[:nbytes])  # (a small read's buffer is its head)
        self.events = 0
        self.count_incoming()  # (before the messages are handed on: a whole one is the
        # endpoint's to count)
        self._hand_on()
        if not conn.closed:
            s.police(self)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)
        if conn.closed:
            self.hang_up()
        else:
            events = self.events
            if s.policy.small_reads:
                self.small = read_size(nbytes, events) if not self.direct else 0
            self.turn += events
            if self.turn > s.rounds.turn_messages and not self.holds & TURN:
                if s.rounds.took_turn():
                    s.loop.call_soon(s.rounds.ended)
                self.hold(TURN)
                s.loop.call_soon(self._next_turn)
        s.after_read(self, self.events)

    def _hand_on(self) -> None:
        """Hand the codec's events to the endpoint, in order."""
        s = self.server
        events = self.conn.next_events()
        for ev in events:
            if isinstance(ev, Message):
                s.message(self, ev)
            elif isinstance(ev, Refused):
                s.refused(self, ev)
            elif isinstance(ev, Ready):
                self.ready(ev)
            elif isinstance(ev, Closed):  # the peer broke the protocol
                self.broken(ev.reason)
        self.events += len(events)

    def refuse(self, reason: str) -> bool:
        """Refuse the message under way (``reason``): what came of it is let go, the rest as
        it arrives, and its refusal is handed on now. False if none was under way."""
        if self.conn.closed or not self.conn.refuse_current(reason):
            return False
        self.count_incoming()
        self._hand_on()
        return True

    def count_incoming(self) -> None:
        """What this connection holds of messages still arriving, in the server's counts."""
        held = self.conn.buffered
        if (change := held - self.incoming):
            s = self.server
            s.incoming += change
            shares.count(s.incoming_by_source, self.source, change)
            self.incoming = held

    def hold(self, why: int) -> None:
        """Do not read this connection until :meth:`release` of ``why`` (and of every other
        reason it is held for)."""
        if not self.holds and self.transport is not None:
            self.transport.pause_reading()
        self.holds |= why

    def release(self, why: int) -> None:
        """Read this connection again, unless something else holds it."""
        if self.holds & why:
            self.holds &= ~why
            transport = self.transport
            if not self.holds and transport is not None and not transport.is_closing():
                transport.resume_reading()

    def _next_turn(self) -> None:
        """The loop went round: the others had their turn."""
        self.turn = 0
        self.release(TURN)

    # --- the write path -------------------------------------------------------------------

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

    def over(self, high: int) -> bool:
        """More than ``high`` bytes wait for this connection's peer (queued and written),
        or its transport is over its own high mark."""
        if self.full:
            return True
        if self.queued <= high:
            return False
        return self.transport is None or self.queued + self.unsent_bytes() > high

    def pause_writing(self) -> None:
        self.full = True
        if not self.server.policy.read_while_full:
            self.hold(WRITING)

    def resume_writing(self) -> None:
        self.full = False
        self.release(WRITING)
        self.server.writable(self)

    def hang_up(self) -> None:
        """Close the connection once what it was sent is written, or cut it if its peer
        takes none of that for CLOSE_LINGER_S."""
        self.write_held()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if (left := transport.get_write_buffer_size()):
                self._lingering(left)

    def _lingering(self, left: int) -> None:
        self._linger = self.server.loop.call_later(CLOSE_LINGER_S, self._linger_over, left)

    def _linger_over(self, left: int) -> None:
        self._linger = None
        transport = self.transport
        if transport is None:
            return
        now_left = transport.get_write_buffer_size()
        if now_left >= left:  # nothing taken meanwhile
            transport.abort()
        elif now_left:
            self._lingering(now_left)

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        s = self.server
        self.transport = None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        self._held = bytearray()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.out, self.queued = [], 0
        self.conn.release()
        if self.incoming:
            s.incoming -= self.incoming
            shares.count(s.incoming_by_source, self.source, -self.incoming)
            self.incoming = 0
        s._backed_up.discard(self)
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

"""The ZPIPES client endpoint: a ZeroMQ ROUTER on the broker's ZMTP server (``zbroker/zmtp/``).

Clients are libzmq DEALER sockets (the original C client, ``zpipes.client``, ``zpipes.aio``);
they see what a libzmq ROUTER would show them. The broker speaks ZMTP itself instead of going
through libzmq for what that buys on this path:

- cost: each readiness event is one read of up to 1 MiB into one buffer, on the event loop's
  thread; libzmq would read in 8 KiB batches on its I/O thread and wake the loop through its
  mailbox, about three thread switches per message;
- the door: each connection is accepted here, so its peer's credentials (SO_PEERCRED) are read
  on its own socket, and a connection from a user not allowed, or past the process's connection
  budget (``clients.max_clients``, shared by every ZMTP endpoint), is closed before a byte of
  it is read (:mod:`zbroker.zmtp.admission`, the same for every endpoint);
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

from collections.abc import Callable
from typing import Any

from zbroker import zmtp
from zbroker.runtime import shares
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.server import Link, Server
from zpipes.zmtp_framing import frame_head

#: bytes queued on a connection before it is no longer read (its replies are not taken): a
#: client that PINGs and never reads costs the broker what it takes to answer this many bytes
#: of PING_OKs (1 MiB: about 2 s of CPU here, 4 MiB: about 4 s), and a READ_OK of a large
#: chunk passes it at once without slowing a bulk stream (measured: no change at 1 MiB)
WRITE_HIGH = 1 << 20
#: the send buffer of an ipc connection (Linux's default is 208 KiB)
UNIX_SNDBUF = 1 << 20
#: a frame this large that comes in several reads is read into its own buffer (no copies)
DIRECT_MIN = 128 << 10
#: messages a connection may send before the others get their turn: past it, it is not read
#: again until the loop has gone round once (a client that sends a flood of small requests
#: cannot keep the others waiting more than this many requests' time)
TURN_MESSAGES = 512
#: ... and when many connections send floods, they share this many messages a round of the
#: loop (each at least TURN_MIN): the loop goes round often enough to greet new clients (it
#: accepts one connection a round) and to read the others. 100 PINGers each taking 512 a
#: round made a round 0.25 s: a new client waited 10 s for its greeting
ROUND_MESSAGES, TURN_MIN = 4096, 16
#: a connection that sends small messages is read in small reads, sized for about SMALL_AFTER
#: messages of the size it last sent (at least MIN_READ bytes; past SMALL_READ, as much as
#: there is), so that one read's messages are few: a read is handled whole before the others
#: get their turn (bulk data stays in large reads). One 1 MiB read of 5-byte PINGs was
#: 200 000 requests: 100 such clients kept a new one from its greeting for 10 s
SMALL_READ, SMALL_AFTER, MIN_READ = 8 << 10, 64, 256


def read_size(nbytes: int, messages: int) -> int:
    """How much to read next from a connection whose last read of ``nbytes`` held
    ``messages``: about SMALL_AFTER messages of that size (0: as much as there is)."""
    if messages <= 1:
        return 0
    size = nbytes * SMALL_AFTER // messages
    return max(size, MIN_READ) if size < SMALL_READ else 0


class Endpoint(Server):
    """Connections of ZMTP peers to a ROUTER, on ``loop``.

    ``on_message(routing_id, frames)`` is called for each message, in order;
    ``on_refused(routing_id, refused)`` for one over the limits (:class:`zmtp.Refused`, in
    its turn among the messages: the rest of it is skipped as it arrives); ``on_gone(routing_id)``
    when a connection that had a routing id ends; ``after_input()`` after each read's messages.
    ``admission``: who may connect, and how many (:class:`zbroker.zmtp.admission.Admission`)."""

    def __init__(self, loop: Any, *,
                 on_message: Callable[[bytes, list[Any]], None],
                 on_refused: Callable[[bytes, zmtp.Refused], None],
                 on_gone: Callable[[bytes], None],
                 after_input: Callable[[], None],
                 admission: Admission,
                 max_bytes: int, max_frames: int, log: Any,
                 admit_frame: Callable[[int, Any], str | None] | None = None):
        super().__init__(loop, admission, log, _Link, write_high=WRITE_HIGH,
                         unix_sndbuf=UNIX_SNDBUF)
        self.on_message, self.on_refused, self.on_gone = on_message, on_refused, on_gone
        self.after_input, self.admit_frame = after_input, admit_frame
        self.incoming = 0  # bytes held of messages still arriving, all connections
        self.incoming_by_source: dict[Any, int] = {}  # the same, by source
        self.max_bytes, self.max_frames = max_bytes, max_frames
        self._dirty: list[_Link] = []  # connections with sends queued
        self._first: list[_Link] = []  # of those, the ones to write first (``send``'s first)
        self._backed_up: set[_Link] = set()  # connections with sends not yet written out
        #: messages a connection may send in a round of the loop before it yields, and the
        #: connections that yielded in this round (see ROUND_MESSAGES)
        self.turn_messages = TURN_MESSAGES
        self._yielded = 0

    def took_turn(self) -> None:
        """A connection used its turn: it yields until the loop has gone round once. At
        the round's end, each turn is sized for the crowd of that round."""
        if not self._yielded:
            self.loop.call_soon(self._round_ended)
        self._yielded += 1

    def _round_ended(self) -> None:
        crowd, self._yielded = self._yielded, 0
        self.turn_messages = min(TURN_MESSAGES, max(TURN_MIN, ROUND_MESSAGES // crowd))

    # --- sending --------------------------------------------------------------------------

    def send(self, routing_id: bytes, frame: Any, first: bool = False) -> bool:
        """Queue a single-frame message for ``routing_id``; False if it has no connection.
        ``first``: its peer is idle until it arrives (it answers a request that waited):
        its connection is written before those that were only sent answers to what they just
        asked (a writer's WRITE_OK goes after the READ_OK its WRITE woke)."""
        link = self.links.get(routing_id)
        if link is None:
            return False
        out = link.out
        if not out:
            self._dirty.append(link)
        if first:
            self._first.append(link)
        out.append(frame_head(len(frame)))
        out.append(frame)
        return True

    def flush(self) -> None:
        """Write what was sent, one gathered write per connection: first the connections
        sent something with ``first``, then the others, each in the order of its first
        send. A connection's messages go out in the order they were sent, in one write."""
        dirty, self._dirty = self._dirty, []
        if self._first:
            dirty[:0], self._first = self._first, []
        for link in dirty:
            out = link.out
            if not out:  # (written already: it was also among the first)
                continue
            link.out = []
            transport = link.transport
            if transport is not None and not transport.is_closing():
                link.write_parts(out)
                if link.unsent_bytes():  # its peer does not keep up
                    self._backed_up.add(link)

    async def close_after(self, linger: float) -> None:
        self.flush()
        await super().close_after(linger)

    def incoming_bytes(self) -> int:
        """Bytes held of messages still arriving, on all connections."""
        return self.incoming

    def unsent_bytes(self) -> int:
        """Bytes sent to connections whose peers have not taken them yet (held here, in
        the transports' buffers): what the broker holds for readers that do not read."""
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

    def source_of(self, routing_id: bytes) -> Any:
        """Who ``routing_id``'s connection is from: ("uid", n) on ipc, ("host", address) on
        tcp; None if it has none."""
        link = self.links.get(routing_id)
        return None if link is None else link.source

    def set_max_bytes(self, max_bytes: int) -> None:
        """The limit of a message, from now on, on every connection."""
        self.max_bytes = max_bytes
        for link in self.all:
            link.conn.max_bytes = max_bytes

    def hang_up(self, routing_id: bytes) -> None:
        """Close ``routing_id``'s connection once what it was sent is written."""
        link = self.links.get(routing_id)
        if link is not None and link.transport is not None:
            self.flush()
            link.transport.close()

    def unlinked(self, link: Any) -> None:
        self.on_gone(link.routing_id)


class _Link(Link):
    """One client's connection."""

    server: Endpoint

    def __init__(self, endpoint: Endpoint):
        super().__init__(endpoint)
        self.incoming = 0  # what this connection counts in the endpoint's ``incoming``
        self.direct = False  # the last read went to the frame's own buffer
        self.out: list[Any] = []
        self.paused = False  # not read: its replies wait to be written
        self.turn = 0  # messages it sent since it last let the others go first
        #: read it this much at a time (0: as much as there is), for the size of the messages
        #: it sent last; small at first: a new client's first read is not a flood's whole
        #: backlog (1 MiB of 5-byte PINGs is 200 000 requests, handled before anyone else's)
        self.small = SMALL_READ
        self.yielding = False  # not read until the loop has gone round once

    def codec(self, server: Endpoint) -> zmtp.Connection:  # type: ignore[override]
        conn = zmtp.Connection(server.max_frames, server.max_bytes, keep_first=16,
                               writable=True, direct_min=DIRECT_MIN)
        admit = server.admit_frame
        if admit is not None:  # asked with this connection's source (known once connected)
            conn.admit = lambda size: admit(size, self.source)
        return conn

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self.conn.frame_buffer()
        self.direct = direct is not None
        if direct is not None:
            return direct
        return self.server.scratch[:self.small] if self.small else self.server.scratch

    def buffer_updated(self, nbytes: int) -> None:
        e, conn = self.server, self.conn
        if self.direct:
            conn.frame_filled(nbytes)
        else:
            conn.receive_data(e.scratch[:nbytes])  # (a small read's buffer is its head)
        self._count_incoming()  # (before the messages are handed on: a whole one is the
        # core's to count)
        if (self.incoming and not conn.receiving_large and e.admit_frame is not None
                and (why := e.admit_frame(0, self.source)) is not None
                and conn.refuse_current(why)):
            # past the budget, a message under way in frames too small to have been asked
            # about (each under DIRECT_MIN) is let go too, as a large one is at its head
            self._count_incoming()
        events = conn.next_events()
        for ev in events:
            kind = type(ev)
            if kind is zmtp.Message:
                e.on_message(self.routing_id, ev.frames)
            elif kind is zmtp.Refused:
                e.on_refused(self.routing_id, ev)
            elif kind is zmtp.Ready:
                self.ready(ev)
            else:  # Closed: the peer broke the protocol
                self.broken(ev.reason)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)
        if conn.closed:
            self.transport.close()
        else:
            self.small = read_size(nbytes, len(events)) if not self.direct else 0
            self.turn += len(events)
            if self.turn > e.turn_messages and not self.yielding:
                self.yielding = True
                e.took_turn()
                if not self.paused:
                    self.transport.pause_reading()
                e.loop.call_soon(self._next_turn)
        e.after_input()

    def _next_turn(self) -> None:
        """The loop went round: read it again (unless its replies are not taken)."""
        self.yielding = False
        self.turn = 0
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _count_incoming(self) -> None:
        """What this connection holds of messages still arriving, in the endpoint's count."""
        held = self.conn.buffered
        if (change := held - self.incoming):
            e = self.server
            e.incoming += change
            shares.count(e.incoming_by_source, self.source, change)
            self.incoming = held

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            if not self.yielding:
                self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.paused:
            self.paused = False
            if not self.yielding and not self.transport.is_closing():
                self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        e = self.server
        self.out = []
        if self.incoming:
            e.incoming -= self.incoming
            shares.count(e.incoming_by_source, self.source, -self.incoming)
            self.incoming = 0
        e._backed_up.discard(self)
        super().connection_lost(exc)

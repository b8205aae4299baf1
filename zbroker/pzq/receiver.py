"""A queue's receive endpoint: a ZeroMQ ROUTER for producers, on the broker's ZMTP server
(:mod:`zbroker.zmtp.server`, which guards the door of every endpoint alike).

Producers (DEALER sockets of any libzmq from 3.2 on) connect as they would to a libzmq ROUTER
and see the same thing: each message's answer comes back on its connection. What differs is
what a producer cannot do: make the queue hold a message past its limits before refusing it
(libzmq would hold all of a multipart message first), or make all unfinished messages together
pass ``max_held`` bytes: the message that would is refused (its producer may send it again
later), and a connection whose finished messages wait is not read until they are taken.

Received messages wait in :attr:`Receiver.inbox` as ``(routing id, frames, refusal)``:
``refusal`` is None, or the reason a message was refused, its frames then just ``[first
frame]`` (cut to ``keep_first`` bytes). Answers go out with :meth:`Receiver.send` (or, in
order, :meth:`Receiver.answer`) and leave together at :meth:`Receiver.flush`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from zbroker import zmtp
from zbroker.runtime import shares
from zbroker.runtime.local_access import default_policy
from zbroker.zmtp.addresses import EndpointError
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.refusals import Refusals
from zbroker.zmtp.server import Link, Server

__all__ = ["FULL", "GONE", "SENT", "EndpointError", "Receiver"]

SENT, FULL, GONE = "sent", "full", "gone"
WRITE_HIGH = 4 << 20  # bytes of answers queued on a connection before send() says FULL
MAX_HELD_ANSWERS = 100_000  # answers held back for producers whose connection is full
RETRY_HELD = 0.01  # seconds before held answers are tried again
#: what a received message costs in memory besides its bytes: its tuple and list in the
#: inbox, and a bytes object for each frame (counted in ``max_held``, so that many small
#: messages cannot hold many times their size)
MESSAGE_OVERHEAD, FRAME_OVERHEAD = 120, 40
#: requests of one connection waiting in the inbox of an endpoint of requests before that
#: connection is no longer read (one asker's flood cannot make the others wait long)
MAX_WAITING_REQUESTS = 16


class Receiver(Server):
    """``connection``: the ZMTP side the connections speak (a ROUTER's by default); ``role``:
    who connects, as the log says it. Who may connect over ipc: the broker's own user, root
    and the members of its group (``local_access.default_policy``). ``read_while_full``:
    False for peers that only ask and are answered (a stream reader, a monitor): a connection
    whose answers are not taken is not read until they are, so a peer that asks and never
    reads costs at most the write buffer and one answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None], *,
                 max_frames: int, max_bytes: int, frame_cost: int, keep_first: int,
                 max_held: int, log: Any, name: str,
                 connection: type[zmtp.Connection] = zmtp.Connection, role: str = "producer",
                 read_while_full: bool = True, read_size: int | None = None):
        admission = Admission(f"pzq {role}", Refusals(log, queue=name), default_policy())
        super().__init__(loop, admission, log, _Link, write_high=WRITE_HIGH)
        self.connection = connection
        self.role = role
        self.on_input = on_input
        self.limits = (max_frames, max_bytes, frame_cost, keep_first)
        self.max_held = max_held
        self.name = name
        self.read_while_full = read_while_full
        #: what one read of a connection may take (and so what it adds to the inbox before
        #: it can be paused): small for endpoints of small requests
        self.read_buffer = self.scratch[:read_size] if read_size else self.scratch
        self.inbox: deque[tuple[bytes, list[bytes], str | None]] = deque()
        self._inbox_sizes: deque[int] = deque()  # each one's bytes, as they came
        self.inbox_bytes = 0
        self.unfinished = 0  # bytes the connections hold of messages not yet whole
        #: the same by source (a uid on ipc, a host on tcp): one may hold at most half
        self.unfinished_by_source: dict[Any, int] = {}
        self.refused_busy = 0
        self.held: deque[tuple[bytes, list[bytes]]] = deque()  # answers (answer())
        self.dropped_answers = 0
        self._retry: asyncio.TimerHandle | None = None
        self._paused: set[_Link] = set()
        self._dirty: set[_Link] = set()

    def counters(self) -> dict[str, int]:
        return {"producers": len(self.links),
                "receiving_bytes": self.unfinished + self.inbox_bytes,
                "refused_busy": self.refused_busy, "producers_hung_up": self.hung_up}

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self.close_now()

    def received(self, item: tuple[bytes, list[bytes], str | None], size: int) -> None:
        """A message (or a refusal) for the inbox, and its bytes."""
        self.inbox.append(item)
        self._inbox_sizes.append(size)
        self.inbox_bytes += size

    def take(self, n: int) -> list[tuple[bytes, list[bytes], str | None]]:
        """Up to ``n`` received messages, oldest first."""
        inbox, sizes = self.inbox, self._inbox_sizes
        if n >= len(inbox):  # all of it (the usual case), in one go
            out = list(inbox)
            inbox.clear()
            self.inbox_bytes -= sum(sizes)
            sizes.clear()
        else:
            out = []
            for _ in range(n):
                out.append(inbox.popleft())
                self.inbox_bytes -= sizes.popleft()
        if not self.read_while_full:
            self._taken_from(out)
        if self._paused and self.unfinished + self.inbox_bytes <= self.max_held // 2:
            paused, self._paused = self._paused, set()
            for link in paused:
                link.resume()
        return out

    def _taken_from(self, taken: list[tuple[bytes, list[bytes], str | None]]) -> None:
        """Requests were taken: a connection with none left waiting is read again."""
        links = self.links
        for rid, _, _ in taken:
            link = links.get(rid)
            if link is not None:
                link.waiting -= 1
                if link.crowded and link.waiting <= 0:
                    link.crowded = False
                    link.resume()

    def send(self, routing_id: bytes, frames: list[bytes]) -> str:
        link = self.links.get(routing_id)
        if link is None:
            return GONE
        if link.full:
            return FULL
        link.pending += zmtp.encode_parts(frames)[0]
        self._dirty.add(link)
        return SENT

    def answer(self, routing_id: bytes, frames: list[bytes]) -> None:
        """Send ``frames`` at :meth:`flush`, after the answers before it. A producer that does
        not read its answers makes its connection fill up: the answers wait (at most
        MAX_HELD_ANSWERS, the oldest are dropped) and are tried again soon."""
        self.held.append((routing_id, frames))

    def flush(self) -> None:
        held = self.held
        while held:
            if self.send(*held[0]) == FULL:
                break
            held.popleft()  # sent, or GONE: the producer will send again when back
        dirty, self._dirty = self._dirty, set()
        for link in dirty:
            link.write_pending()
        if held:
            while len(held) > MAX_HELD_ANSWERS:
                held.popleft()
                self.dropped_answers += 1
            if self._retry is None and self.listening:
                self._retry = self.loop.call_later(RETRY_HELD, self._retry_held)

    def _retry_held(self) -> None:
        self._retry = None
        self.flush()

    def writable(self, link: _Link) -> None:
        """``link`` takes more again (its write buffer drained below the low mark)."""


class _Link(Link):
    """One peer's connection."""

    server: Receiver

    def __init__(self, receiver: Receiver):
        super().__init__(receiver)
        self.pending: list[bytes] = []
        self.queued = 0  # bytes in pending (kept by the senders that need it)
        self.full = False
        self.held = 0  # this connection's part of receiver.unfinished
        self.paused = False
        #: an endpoint of requests: its requests in the inbox; past MAX_WAITING_REQUESTS it
        #: is ``crowded``, and not read until they are all taken (each asker gets its turn)
        self.waiting = 0
        self.crowded = False

    def codec(self, server: Receiver) -> zmtp.Connection:  # type: ignore[override]
        return server.connection(*server.limits)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        conn, r = self.conn, self.server
        conn.receive_data(r.read_buffer[:nbytes])
        got = self._take_events()
        self._count_held()
        # what is still arriving counts against its source's share (half) first, then the total
        if r.unfinished_by_source.get(self.source, 0) > r.max_held // 2:
            got |= self._refuse_busy(f"this host's or user's messages being received hold "
                                     f"more than half of {r.max_held} bytes")
        if r.unfinished + r.inbox_bytes > r.max_held and not conn.closed:
            refused = self._refuse_busy(f"more than {r.max_held} bytes of messages are being "
                                        f"received")
            got |= refused
            if not refused and r.inbox_bytes and not self.paused:
                self.paused = True
                self.transport.pause_reading()
                r._paused.add(self)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)
        if conn.closed:
            self.hang_up()
        if got and not r.read_while_full and self.waiting > MAX_WAITING_REQUESTS \
                and not self.paused and not conn.closed:
            self.crowded = self.paused = True
            self.transport.pause_reading()
        if got:
            r.on_input()

    def _refuse_busy(self, why: str) -> bool:
        """Refuse the message under way ("Server busy: WHY; send it again later"); True if
        there was one (its refusal is then in the inbox)."""
        conn = self.conn
        if conn.closed or not conn.refuse_current(f"Server busy: {why}; send it again later"):
            return False
        self.server.refused_busy += 1
        self._take_events()
        self._count_held()
        return True

    def _count_held(self) -> None:
        """What this connection holds of a message not yet whole, in the receiver's counts."""
        change = self.conn.buffered - self.held
        if change:
            r = self.server
            r.unfinished += change
            self.held += change
            shares.count(r.unfinished_by_source, self.source, change)

    def _take_events(self) -> bool:
        r, got = self.server, False
        for ev in self.conn.next_events():
            if type(ev) is zmtp.Message:  # (Receiver.received, inline: one for each message)
                r.inbox.append((self.routing_id, ev.frames, None))
                # what it takes in memory: its bytes, and the objects that hold them
                size = ev.size + MESSAGE_OVERHEAD + FRAME_OVERHEAD * len(ev.frames)
                r._inbox_sizes.append(size)
                r.inbox_bytes += size
                self.waiting += 1
                got = True
            elif type(ev) is zmtp.Refused:
                r.received((self.routing_id, [ev.first], ev.reason), len(ev.first))
                self.waiting += 1
                got = True
            elif type(ev) is zmtp.Ready:
                self.ready(ev)
            else:  # Closed
                self.broken(ev.reason)
        return got

    def resume(self) -> None:
        """The inbox has room again: read this connection again (unless it is full and its
        endpoint does not read full connections)."""
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            if not self._held_back():
                self.transport.resume_reading()

    def _held_back(self) -> bool:
        """Not read because its answers are not taken."""
        return self.full and not self.server.read_while_full

    def write_pending(self) -> None:
        if self.pending and self.transport is not None and not self.transport.is_closing():
            self.write_parts(self.pending)
        self.pending.clear()
        self.queued = 0

    def pause_writing(self) -> None:
        self.full = True
        if self._held_back() and not self.paused:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        held_back = self._held_back()
        self.full = False
        if held_back and not self.paused and not self.transport.is_closing():
            self.transport.resume_reading()
        self.server.writable(self)

    def connection_lost(self, exc: Exception | None) -> None:
        r = self.server
        if self.held:
            r.unfinished -= self.held
            shares.count(r.unfinished_by_source, self.source, -self.held)
            self.held = 0
        r._paused.discard(self)
        r._dirty.discard(self)
        super().connection_lost(exc)

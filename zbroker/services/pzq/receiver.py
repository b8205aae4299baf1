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
frame]`` (cut to ``keep_first`` bytes). Answers go out, in order, with
:meth:`Receiver.answer` (the endpoints of consumers and requests: their own ``send``) and
leave together at :meth:`Receiver.flush`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from zbroker import zmtp
from zbroker.runtime.local_access import default_policy
from zbroker.zmtp.addresses import EndpointError
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.flow import READ_SIZE, ReadPolicy
from zbroker.zmtp.refusals import Refusals
from zbroker.zmtp.server import ANSWERS, CROWDED, INBOX, Link, Server

__all__ = ["FULL", "GONE", "SENT", "EndpointError", "Receiver"]

SENT, FULL, GONE = "sent", "full", "gone"
WRITE_HIGH = 4 << 20  # bytes of answers queued on a connection before send() says FULL
#: what a producer's answers that wait for its connection (it does not read them) may cost,
#: bytes and the objects holding them, before its connection is no longer read: its ACKs are
#: never dropped, and it cannot make the broker hold more of them than this
MAX_WAITING_ANSWERS = 256 << 10
ANSWER_OVERHEAD = 150  # an answer's tuple, list and frame objects, in bytes
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
    reads costs at most the write buffer and one answer. ``read_size``: what one read takes
    at most (small for endpoints of small requests)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None], *,
                 max_frames: int, max_bytes: int, frame_cost: int, keep_first: int,
                 max_held: int, log: Any, name: str,
                 connection: type[zmtp.Connection] = zmtp.Connection, role: str = "producer",
                 read_while_full: bool = True, read_size: int | None = None):
        admission = Admission(f"pzq {role}", Refusals(log, queue=name), default_policy())
        policy = ReadPolicy(read_while_full=read_while_full, max_read=read_size or READ_SIZE)
        super().__init__(loop, admission, log, _Link, write_high=WRITE_HIGH, policy=policy)
        self.connection = connection
        self.role = role
        self.on_input = on_input
        self.limits = (max_frames, max_bytes, frame_cost, keep_first)
        self.max_held = max_held
        self.name = name
        self.inbox: deque[tuple[bytes, list[bytes], str | None]] = deque()
        self._inbox_sizes: deque[int] = deque()  # each one's bytes, as they came
        self.inbox_bytes = 0
        self.refused_busy = 0
        self.dropped_answers = 0  # (none: a producer whose answers wait is not read)
        self._paused: set[_Link] = set()  # held while the inbox is full

    def counters(self) -> dict[str, int]:
        return {"producers": len(self.links),
                "receiving_bytes": self.incoming + self.inbox_bytes,
                "refused_busy": self.refused_busy, "producers_hung_up": self.hung_up}

    def close(self) -> None:
        self.close_now()

    # --- what the transport hands on --------------------------------------------------------

    def message(self, link: _Link, message: zmtp.Message) -> None:
        frames = message.frames
        self.inbox.append((link.routing_id, frames, None))  # type: ignore[arg-type]
        # what it takes in memory: its bytes, and the objects that hold them
        size = message.size + MESSAGE_OVERHEAD + FRAME_OVERHEAD * len(frames)
        self._inbox_sizes.append(size)
        self.inbox_bytes += size
        link.waiting += 1

    def refused(self, link: _Link, refused: zmtp.Refused) -> None:
        self.received((link.routing_id, [refused.first], refused.reason),  # type: ignore[arg-type]
                      len(refused.first))
        link.waiting += 1

    def police(self, link: _Link) -> None:
        # what is still arriving counts against its source's share (half) first, then the total
        if self.incoming_by_source.get(link.source, 0) > self.max_held // 2:
            self._refuse_busy(link, f"this host's or user's messages being received hold "
                                    f"more than half of {self.max_held} bytes")
        if self.incoming + self.inbox_bytes > self.max_held and not link.conn.closed:
            refused = self._refuse_busy(link, f"more than {self.max_held} bytes of messages "
                                              f"are being received")
            if not refused and self.inbox_bytes and not link.holds & INBOX:
                link.hold(INBOX)
                self._paused.add(link)

    def _refuse_busy(self, link: _Link, why: str) -> bool:
        """Refuse the message under way ("Server busy: WHY; send it again later"); True if
        there was one (its refusal is then in the inbox)."""
        if not link.refuse(f"Server busy: {why}; send it again later"):
            return False
        self.refused_busy += 1
        return True

    def after_read(self, link: _Link, events: int) -> None:
        if not events:
            return
        if (not self.policy.read_while_full and link.waiting > MAX_WAITING_REQUESTS
                and not link.holds & (INBOX | CROWDED) and not link.conn.closed):
            link.hold(CROWDED)
        self.on_input()

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
        if not self.policy.read_while_full:
            self._taken_from(out)
        if self._paused and self.incoming + self.inbox_bytes <= self.max_held // 2:
            paused, self._paused = self._paused, set()
            for link in paused:
                link.release(INBOX)
        return out

    def _taken_from(self, taken: list[tuple[bytes, list[bytes], str | None]]) -> None:
        """Requests were taken: a connection with none left waiting is read again."""
        links = self.links
        for rid, _, _ in taken:
            link = links.get(rid)
            if link is not None:
                link.waiting -= 1
                if link.waiting <= 0:
                    link.release(CROWDED)

    # --- answers --------------------------------------------------------------------------

    def put(self, link: _Link, frames: Sequence[bytes]) -> None:
        """Queue ``frames`` for ``link``'s peer, to leave at :meth:`flush`."""
        parts, size = zmtp.encode_parts(frames)
        self.queue(link, parts, size)

    def answer(self, routing_id: bytes, frames: list[bytes]) -> None:
        """Send ``frames`` at :meth:`flush`, after the answers before it on its connection.
        A producer that does not read its answers makes its connection fill up: its answers
        then wait here, each producer's apart (the others' go on), and past
        MAX_WAITING_ANSWERS of them its connection is not read until they have gone."""
        link = self.links.get(routing_id)
        if link is None:
            return  # gone: the producer sends again when back
        if not link.full and not link.answers:
            self.put(link, frames)
            return
        cost = ANSWER_OVERHEAD + sum(map(len, frames))
        link.answers.append((frames, cost))
        link.answers_cost += cost
        if link.answers_cost > MAX_WAITING_ANSWERS and not link.holds & ANSWERS:
            link.hold(ANSWERS)

    def writable(self, link: _Link) -> None:
        """``link``'s connection takes more: the answers that waited for it go, and it is
        read again. (Only here: a connection has answers waiting only while it is full, so
        a flush need not look at the connections of producers that read none.)"""
        answers = link.answers
        if not answers:
            return
        while answers and not link.full:
            frames, cost = answers.popleft()
            link.answers_cost -= cost
            self.put(link, frames)
        if link.holds & ANSWERS and link.answers_cost <= MAX_WAITING_ANSWERS // 2:
            link.release(ANSWERS)
        self.flush()


class _Link(Link):
    """One peer's connection."""

    server: Receiver

    def __init__(self, receiver: Receiver):
        super().__init__(receiver)
        #: an endpoint of requests: its requests in the inbox; past MAX_WAITING_REQUESTS it
        #: is held (CROWDED), and not read until they are all taken (each asker gets its turn)
        self.waiting = 0
        #: answers waiting for the connection to take more (Receiver.answer), their cost
        self.answers: deque[tuple[list[bytes], int]] = deque()
        self.answers_cost = 0

    def codec(self, server: Receiver) -> zmtp.Connection:  # type: ignore[override]
        return server.connection(*server.limits)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._paused.discard(self)
        self.answers.clear()
        self.answers_cost = 0
        super().connection_lost(exc)

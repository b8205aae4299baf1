"""A queue's endpoints besides the receive endpoint, served on asyncio over zmtp.py (as the
receive endpoint is, receiver.py), not by libzmq sockets:

    send     a bound DEALER (SendEndpoint): consumers (DEALER or ROUTER sockets) connect and
             get messages pushed, one connection after the other, skipping a full one
    credit   a bound ROUTER (RouterEndpoint): consumers say READY with a window; deliveries
             go to the one the dispatcher chose, by its routing id
    monitor  a bound ROUTER (RouterEndpoint): MONITOR requests of REQ sockets
    stream   a bound ROUTER (RouterEndpoint): the requests of stream readers

Why not libzmq: a peer could make a libzmq socket hold a multipart message of any size before
it could be looked at (here a message past the endpoint's limits is refused as its frames
arrive, and let go of), and each message sent through libzmq costs a wake-up of its I/O
thread; here what goes to one connection in one round leaves in one write.

What these peers send (ACKs, READY, requests) is small: a message past ``max_bytes`` or
``max_frames`` is refused (its user counts it, nothing of it is held). A connection is full
while more than ``high`` bytes wait to be written to it (in our buffer and the transport's):
it gets nothing more until they are written; :attr:`on_writable` is called when a full
connection drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from zbroker import zmtp
from zbroker.zmtp.addresses import EndpointError

from .receiver import FULL, GONE, SENT, Receiver, _Link
from .settings import QueueError
from .sockets import make_ipc_dir

#: bytes waiting to be written to one consumer's connection before it counts as full
HIGH_WATER = 4 << 20
MAX_ACK_FRAMES = 16  # [key][status]; READY [window][bytes]; ACK [id][packed keys]
#: a consumer's message: an ACK of a batch of MAX_BATCH keys is about 4 MiB
MAX_CONSUMER_MESSAGE = 8 << 20
MAX_HELD = 64 << 20  # messages read and not yet taken, all connections of an endpoint
#: the same for an endpoint of requests (a stream's, a monitor's): each a few words
MAX_HELD_REQUESTS = 4 << 20
#: what one read of such an endpoint takes: about a hundred requests (a larger one takes
#: several reads), so that one asker's flood is few requests ahead of the others
REQUEST_READ = 4 << 10
#: a monitor or stream request: its envelope (up to its empty delimiter) and a few words
MAX_REQUEST_FRAMES = 64
MAX_REQUEST = 64 << 10



class _Endpoint(Receiver):
    """What these endpoints share: small input, large output, full connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None],
                 on_writable: Callable[[], None], *, log: Any, name: str,
                 connection: type[zmtp.Connection], high: int = HIGH_WATER,
                 role: str = "consumer", max_frames: int = MAX_ACK_FRAMES,
                 max_bytes: int = MAX_CONSUMER_MESSAGE, read_while_full: bool = True):
        super().__init__(loop, on_input, max_frames=max_frames, max_bytes=max_bytes,
                         frame_cost=0, keep_first=256,
                         max_held=MAX_HELD if read_while_full else MAX_HELD_REQUESTS, log=log,
                         name=name, connection=connection, role=role,
                         read_while_full=read_while_full,
                         read_size=None if read_while_full else REQUEST_READ)
        self.on_writable = on_writable
        self.high = high

    def writable(self, link: _Link) -> None:
        self.on_writable()


class SendEndpoint(_Endpoint):
    """The send endpoint: a bound DEALER. ``on_consumers(n)`` when the number of consumers
    connected (their handshake done) changes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None],
                 on_writable: Callable[[], None], on_consumers: Callable[[int], None], *,
                 log: Any, name: str, high: int = HIGH_WATER):
        super().__init__(loop, on_input, on_writable, log=log, name=name,
                         connection=zmtp.DealerConnection, high=high)
        self.on_consumers = on_consumers
        self.ring: list[_Link] = []  # connected consumers, in the order they take turns
        self._turn = 0

    @property
    def connected(self) -> int:
        return len(self.ring)

    def linked(self, link: _Link) -> None:
        self.ring.append(link)
        self.on_consumers(len(self.ring))

    def unlinked(self, link: _Link) -> None:
        self.ring.remove(link)
        self.on_consumers(len(self.ring))

    def send_any(self, frames: Sequence[bytes]) -> bool:
        """Send ``frames`` (at :meth:`flush`) to the next connection that is not full, as a
        libzmq DEALER does; False if every one is full (or none is there)."""
        ring = self.ring
        n = len(ring)
        turn = self._turn
        for _ in range(n):
            if turn >= n:
                turn = 0
            link = ring[turn]
            turn += 1
            if not link.over(self.high):
                self._turn = turn
                self.put(link, frames)
                return True
        self._turn = turn
        return False


class RouterEndpoint(_Endpoint):
    """A bound ROUTER: what goes out goes to one peer by its routing id (credit consumers,
    monitor requesters, stream readers: ``role``, as the log names them). ``on_gone(routing
    id)`` when a peer's connection closes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None],
                 on_writable: Callable[[], None] | None = None, *, log: Any, name: str,
                 role: str = "consumer", max_frames: int = MAX_ACK_FRAMES,
                 max_bytes: int = MAX_CONSUMER_MESSAGE, high: int = HIGH_WATER,
                 on_gone: Callable[[bytes], None] | None = None,
                 read_while_full: bool = True):
        super().__init__(loop, on_input, on_writable or _nothing, log=log, name=name,
                         connection=zmtp.Connection, high=high, role=role,
                         max_frames=max_frames, max_bytes=max_bytes,
                         read_while_full=read_while_full)
        self.on_gone = on_gone

    def unlinked(self, link: _Link) -> None:
        if self.on_gone is not None:
            self.on_gone(link.routing_id)

    def room(self, routing_id: bytes) -> str:
        """Whether ``routing_id`` can be sent something now: SENT (it can), FULL or GONE."""
        link = self.links.get(routing_id)
        if link is None:
            return GONE
        return FULL if link.over(self.high) else SENT

    def send(self, routing_id: bytes, frames: list[bytes]) -> str:
        """Send ``frames`` to ``routing_id`` at :meth:`flush`: SENT, FULL or GONE."""
        link = self.links.get(routing_id)
        if link is None:
            return GONE
        if link.over(self.high):
            return FULL
        self.put(link, frames)
        return SENT


def _nothing() -> None:
    pass


class Drain:
    """Takes what an endpoint received at the next turn of the loop (one turn for all the
    reads meanwhile), ``budget`` messages a turn: ``handle(routing id, frames, refusal)``
    each, then ``after()``."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 handle: Callable[[bytes, list[bytes], str | None], None],
                 after: Callable[[], None] | None, budget: int):
        self.loop, self.handle, self.after, self.budget = loop, handle, after, budget
        self.endpoint: Receiver | None = None
        self._scheduled = False

    def __call__(self) -> None:
        """What the endpoint calls when something came (its ``on_input``)."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._take)

    def _take(self) -> None:
        self._scheduled = False
        endpoint = self.endpoint
        if endpoint is None:
            return
        handle = self.handle
        for rid, frames, refused in endpoint.take(self.budget):
            handle(rid, frames, refused)
        if self.after is not None:
            self.after()
        if endpoint.inbox:
            self()


async def bind(endpoint: Receiver, address: str, role: str, name: str) -> None:
    """Bind ``endpoint`` to ``address`` (QueueError if it cannot)."""
    make_ipc_dir(address)
    try:
        await endpoint.start(address)
    except (OSError, EndpointError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        from zbroker.runtime.port_holder import held

        raise QueueError(f"queue {name!r}: cannot bind its {role} socket "
                         f"(services.pzq.queues.{name}.{role}_endpoint) to {address}: "
                         f"{why}{held(address)}") from None

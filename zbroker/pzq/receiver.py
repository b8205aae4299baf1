"""A queue's receive endpoint: a ZeroMQ ROUTER for producers, on asyncio over zmtp.py.

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
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from zbroker import zmtp

SENT, FULL, GONE = "sent", "full", "gone"
WRITE_HIGH = 4 << 20  # bytes of answers queued on a connection before send() says FULL
MAX_HELD_ANSWERS = 100_000  # answers held back for producers whose connection is full
RETRY_HELD = 0.01  # seconds before held answers are tried again
#: what one read from a connection may take: large enough that a window of big messages
#: comes in a few reads (each read is a wake-up); one buffer for all connections
READ_SIZE = 1 << 20


class EndpointError(ValueError):
    pass


def listen_socket(endpoint: str) -> socket.socket:
    """A non-blocking socket bound to ``endpoint`` and listening (OSError, or EndpointError
    if it is not tcp://HOST:PORT or ipc://PATH). An ipc socket file that a process which
    ended left behind is removed first; one that is still served is not (the bind fails):
    asyncio's own bind would take the file of a live server."""
    kind, address = listen_address(endpoint)
    if kind == "tcp":
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if not address.startswith("\0"):
            _remove_stale(address)
    try:
        sock.bind(address)
        sock.listen(256)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _remove_stale(path: str) -> None:
    """Remove the socket file a process that ended left at ``path`` (libzmq does the same
    before it binds); one that is still served stays, and the bind fails."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        try:
            os.unlink(path)
        except OSError:
            pass
    except OSError:
        pass
    finally:
        probe.close()


def peer_name(transport: Any) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "local")


def listen_address(endpoint: str) -> tuple[str, Any]:
    """``("tcp", (host, port))`` or ``("ipc", path)`` of a ZeroMQ endpoint to bind, as libzmq
    reads it: ``tcp://*:PORT`` is every IPv4 address, ``ipc://@NAME`` an abstract socket."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise EndpointError(f"{endpoint!r}: a receive endpoint is tcp://HOST:PORT or ipc://PATH")
    if scheme == "ipc":
        if not rest:
            raise EndpointError(f"{endpoint!r}: no path")
        return "ipc", "\0" + rest[1:] if rest.startswith("@") else rest
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise EndpointError(f"{endpoint!r}: tcp://HOST:PORT expected")
    if port in ("*", "!"):
        port = "0"
    if not port.isdigit() or int(port) > 65535:
        raise EndpointError(f"{endpoint!r}: {port!r} is not a port")
    host = "0.0.0.0" if host == "*" else host.strip("[]")
    return "tcp", (host, int(port))


class Receiver:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_input: Callable[[], None], *,
                 max_frames: int, max_bytes: int, frame_cost: int, keep_first: int,
                 max_held: int, log: Any, name: str,
                 connection: type[zmtp.Connection] = zmtp.Connection, role: str = "producer"):
        """``connection``: the ZMTP side the connections speak (a ROUTER's by default);
        ``role``: who connects, as the log says it."""
        self.loop = loop
        self.connection = connection
        self.role = role
        self.on_input = on_input
        self.limits = (max_frames, max_bytes, frame_cost, keep_first)
        self.max_held = max_held
        self.log = log
        self.name = name
        self.inbox: deque[tuple[bytes, list[bytes], str | None]] = deque()
        self._inbox_sizes: deque[int] = deque()  # each one's bytes, as they came
        self.inbox_bytes = 0
        self.unfinished = 0  # bytes the connections hold of messages not yet whole
        self.refused_busy = 0
        self.hung_up = 0
        self.held: deque[tuple[bytes, list[bytes]]] = deque()  # answers (answer())
        self.dropped_answers = 0
        self._retry: asyncio.TimerHandle | None = None
        self._links: dict[bytes, _Link] = {}
        self._paused: set[_Link] = set()
        self._dirty: set[_Link] = set()
        self._ids = zmtp.RoutingIds(int.from_bytes(os.urandom(4), "big"))
        self._server: asyncio.AbstractServer | None = None
        self.scratch = memoryview(bytearray(READ_SIZE))  # read into, taken out at once

    def counters(self) -> dict[str, int]:
        return {"producers": len(self._links),
                "receiving_bytes": self.unfinished + self.inbox_bytes,
                "refused_busy": self.refused_busy, "producers_hung_up": self.hung_up}

    async def start(self, endpoint: str) -> None:
        """Bind (OSError or EndpointError if it cannot)."""
        sock = listen_socket(endpoint)
        if sock.family == socket.AF_UNIX:
            self._server = await self.loop.create_unix_server(lambda: _Link(self), sock=sock)
        else:
            self._server = await self.loop.create_server(lambda: _Link(self), sock=sock)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self._links.values()):
            link.hang_up()

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
        if self._paused and self.unfinished + self.inbox_bytes <= self.max_held // 2:
            paused, self._paused = self._paused, set()
            for link in paused:
                link.resume()
        return out

    def send(self, routing_id: bytes, frames: list[bytes]) -> str:
        link = self._links.get(routing_id)
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
            if self._retry is None and self._server is not None:
                self._retry = self.loop.call_later(RETRY_HELD, self._retry_held)

    def _retry_held(self) -> None:
        self._retry = None
        self.flush()

    def linked(self, link: _Link) -> None:
        """``link`` finished its handshake: it is in ``_links`` under its routing id."""

    def unlinked(self, link: _Link) -> None:
        """``link``, linked before, is gone."""

    def writable(self, link: _Link) -> None:
        """``link`` takes more again (its write buffer drained below the low mark)."""

    def routing_id(self, asked: bytes) -> bytes:
        """The id a ROUTER gives a peer: the one it asked for when that is free (and does not
        start with a zero byte, which marks ids made here), else a new one."""
        return self._ids.pick(asked, self._links)


class _Link(asyncio.BufferedProtocol):
    """One producer's connection."""

    def __init__(self, receiver: Receiver):
        self.r = receiver
        self.conn = receiver.connection(*receiver.limits)
        self.transport: asyncio.Transport | None = None
        self.routing_id: bytes | None = None
        self.pending: list[bytes] = []
        self.queued = 0  # bytes in pending (kept by the senders that need it)
        self.full = False
        self.held = 0  # this connection's part of receiver.unfinished
        self.paused = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        transport.write(self.conn.data_to_send())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.r.scratch

    def buffer_updated(self, nbytes: int) -> None:
        conn, r = self.conn, self.r
        conn.receive_data(r.scratch[:nbytes])
        got = self._take_events()
        r.unfinished += conn.buffered - self.held
        self.held = conn.buffered
        if r.unfinished + r.inbox_bytes > r.max_held and not conn.closed:
            if conn.refuse_current(
                    f"Server busy: more than {r.max_held} bytes of messages are being "
                    f"received; send it again later"):
                r.refused_busy += 1
                got |= self._take_events()
                r.unfinished += conn.buffered - self.held
                self.held = conn.buffered
            elif r.inbox_bytes and not self.paused:
                self.paused = True
                self.transport.pause_reading()
                r._paused.add(self)
        out = conn.data_to_send()
        if out:
            self.transport.write(out)
        if conn.closed:
            self.hang_up()
        if got:
            r.on_input()

    def _take_events(self) -> bool:
        r, got = self.r, False
        for ev in self.conn.next_events():
            if type(ev) is zmtp.Message:  # (Receiver.received, inline: one for each message)
                r.inbox.append((self.routing_id, ev.frames, None))
                r._inbox_sizes.append(ev.size)
                r.inbox_bytes += ev.size
                got = True
            elif type(ev) is zmtp.Refused:
                r.received((self.routing_id, [ev.first], ev.reason), len(ev.first))
                got = True
            elif type(ev) is zmtp.Ready:
                self.routing_id = r.routing_id(ev.routing_id)
                r._links[self.routing_id] = self
                r.linked(self)
            else:  # Closed
                r.hung_up += 1
                self.r.log.warning(f"pzq {r.role} connection refused", queue=r.name,
                                   peer=peer_name(self.transport), reason=ev.reason)
        return got

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            self.transport.resume_reading()

    def write_pending(self) -> None:
        if self.pending and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(self.pending)  # one writev (large frames not copied)
        self.pending.clear()
        self.queued = 0

    def pause_writing(self) -> None:
        self.full = True

    def resume_writing(self) -> None:
        self.full = False
        self.r.writable(self)

    def hang_up(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        r = self.r
        if self.routing_id is not None and r._links.get(self.routing_id) is self:
            del r._links[self.routing_id]
            r.unlinked(self)
        r.unfinished -= self.held
        self.held = 0
        r._paused.discard(self)
        r._dirty.discard(self)
        self.transport = None

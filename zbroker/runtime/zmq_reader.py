"""Reading a ZeroMQ socket on an asyncio loop: the one way the broker does it.

A ZeroMQ socket's FD is not the socket's data: it is an edge-triggered signal that the socket's
events *may* have changed, and any send or receive on the socket may consume that edge. So a
reader must (1) drain every message that is there when the FD fires, (2) look at
``zmq.EVENTS`` again before it stops — a message that came while it drained raises no new
edge — and (3) look once right after it starts, since messages may be waiting already. It also
gives the loop a turn after a budget of messages, so that timers run under a flood.

    reader = SocketReader(loop, sock, handle, after=flush)
    reader.start()      # handle([frame, ...]) for each message; flush() after each drain
    reader.recheck()    # after sending on the socket from outside handle()
    reader.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import zmq

DRAIN_BUDGET = 1000  # messages taken per turn of the loop
# pyzmq's backend method, called with int flags: several times cheaper per frame than the
# convenience layer's recv_multipart (which converts flag enums and checks its arguments)
_recv = zmq.backend.Socket.recv
_get = zmq.backend.Socket.get
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def _receive(sock: zmq.Socket, copy: bool = True) -> list[Any]:
    """One multipart message without blocking (zmq.Again if there is none): bytes, or the
    zmq.Frame objects with ``copy=False``."""
    frame = _recv(sock, _NOBLOCK, False)
    frames = [frame]
    while frame.more:
        frame = _recv(sock, 0, False)
        frames.append(frame)
    return [f.bytes for f in frames] if copy else frames


class SocketReader:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: zmq.Socket,
                 handle: Callable[[Any], None], *,
                 after: Callable[[], None] | None = None, budget: int = DRAIN_BUDGET,
                 copy: bool = True, receive: Callable[[zmq.Socket], Any] | None = None):
        """``handle`` gets each multipart message (bytes, or zmq.Frame with ``copy=False``);
        ``after`` runs once after each drain (to schedule what the messages caused; if it
        sends on this socket, it calls :meth:`recheck` after).
        ``receive(sock)``: one message in a form of the caller's (zmq.Again if none), for a
        hot path that wants its frames as they are."""
        self.loop = loop
        self.sock = sock
        self.handle = handle
        self.after = after
        self.budget = budget
        self.receive = receive or (lambda s: _receive(s, copy))
        self._fd: int | None = None
        self._scheduled = False

    def start(self) -> None:
        self._fd = self.sock.getsockopt(zmq.FD)
        self.loop.add_reader(self._fd, self.drain)
        self._schedule()  # messages may be waiting already: the edge has gone by

    def stop(self) -> None:
        if self._fd is not None:
            self.loop.remove_reader(self._fd)
            self._fd = None

    @property
    def running(self) -> bool:
        return self._fd is not None

    def recheck(self) -> None:
        """Sending on the socket may have taken the edge of a message that came: look again."""
        if self._fd is not None and not self._scheduled and _get(self.sock, _EVENTS) & _POLLIN:
            self._schedule()

    def drain(self) -> None:
        """Take what the socket has. The FD fired: the first message is taken without asking;
        after each one, whether another waits is asked (cheaper than the zmq.Again of a
        receive that finds none, and asked after handle() has sent, it is also the look again
        that the edge-triggered FD needs)."""
        self._scheduled = False
        if self._fd is None:
            return
        sock, handle, receive = self.sock, self.handle, self.receive
        asked = False
        for _ in range(self.budget):
            if asked and not _get(sock, _EVENTS) & _POLLIN:
                break
            asked = True
            try:
                message = receive(sock)
            except zmq.ZMQError:  # Again: nothing there (or the socket is closing)
                asked = False
                break
            handle(message)
            if self._fd is None:  # handle() stopped the reader
                return
        else:  # the budget is spent: timers get a turn, then on
            asked = False
            self._schedule()
        if self.after is not None:
            self.after()
            if self._fd is None:
                return
        if not asked:
            self.recheck()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.drain)

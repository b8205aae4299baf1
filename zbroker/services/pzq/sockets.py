"""The ZeroMQ sockets of a queue (the DEALERs to its static peers: its endpoints are served
over its own ZMTP code, receiver.py and endpoints.py), each with its reader
(zbroker.runtime.zmq_reader), and frames moved on them without blocking, at the least cost per
frame."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from zbroker.runtime.zmq_reader import DRAIN_BUDGET, SocketReader

# The socket methods of pyzmq's backend, called with int flags: 3-4x cheaper per frame than
# the convenience layer's (which converts flag enums and checks arguments on every call).
send = zmq.backend.Socket.send
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
ZERO_COPY_MIN = 1 << 16  # frames this large are sent and received without a copy
PEER_HWM = 100_000  # messages queued to a static peer queue


def make_ipc_dir(endpoint: str) -> None:
    """The directory of an ipc:// endpoint's path (not of an abstract one: ipc://@NAME)."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        Path(endpoint[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)


class Sockets:
    """The ZeroMQ sockets of one queue (``name``): made, connected, read, closed."""

    def __init__(self, ctx: zmq.Context, loop: asyncio.AbstractEventLoop, name: str):
        self.ctx, self.loop, self.name = ctx, loop, name
        self.socks: list[zmq.Socket] = []
        self.readers: list[SocketReader] = []

    def connect_peer(self, endpoint: str) -> zmq.Socket:
        """A DEALER to a static peer queue's receive endpoint (our copies go there)."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 500)
        sock.setsockopt(zmq.SNDHWM, PEER_HWM)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.connect(endpoint)
        self.socks.append(sock)
        return sock

    def read(self, sock: zmq.Socket, handle: Callable[[list[Any]], None],
             after: Callable[[], None] | None, budget: int = DRAIN_BUDGET) -> SocketReader:
        """A reader of ``sock`` (started by :meth:`start`): ``handle`` each message,
        ``after`` each drain."""
        self.readers.append(SocketReader(self.loop, sock, handle, after=after, budget=budget))
        return self.readers[-1]

    def start(self) -> None:
        for reader in self.readers:
            reader.start()

    def stop(self) -> None:
        for reader in self.readers:
            reader.stop()

    def close(self) -> None:
        self.stop()
        for sock in reversed(self.socks):
            sock.close()
        self.socks.clear()
        self.readers.clear()


class StaticPeers:
    """The DEALERs to a queue's static peer queues (their receive endpoints): replication
    messages (peering.py) go to every one, their answers come back to a handler."""

    def __init__(self) -> None:
        self.socks: list[zmq.Socket] = []
        self._readers: list[SocketReader] = []

    def connect(self, sockets: Sockets, endpoints: Sequence[str],
                answer: Callable[[list[Any]], None], after: Callable[[], None]) -> None:
        """Connect to ``endpoints``; ``answer`` each message from them, ``after`` each
        drain."""
        for endpoint in endpoints:
            self.socks.append(sockets.connect_peer(endpoint))
            self._readers.append(sockets.read(self.socks[-1], answer, after))

    def send(self, frames: list[bytes]) -> None:
        """To every peer; one that cannot take it now goes without (a copy then times out:
        REPLICATION_FAILED)."""
        for sock in self.socks:
            try:
                send_frames(sock, frames)
            except zmq.ZMQError:
                pass
        for reader in self._readers:
            reader.recheck()

    def clear(self) -> None:
        """Forget the sockets (Sockets.close closes them)."""
        self.socks.clear()
        self._readers.clear()


def send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send a multipart message without blocking (zmq.Again if it cannot go now)."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        if i < last:
            send(sock, f, MORE_NOBLOCK, True)
        else:
            send(sock, f, NOBLOCK, len(f) < ZERO_COPY_MIN)

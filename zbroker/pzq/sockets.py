"""Moving frames on ZeroMQ sockets without blocking, at the least cost per frame."""

from __future__ import annotations

import zmq

DRAIN_BUDGET = 1000
# The socket methods of pyzmq's backend, called with int flags: 3-4x cheaper per frame than
# the convenience layer's (which converts flag enums and checks arguments on every call).
send = zmq.backend.Socket.send
recv = zmq.backend.Socket.recv
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
ZERO_COPY_MIN = 1 << 16  # frames this large are sent and received without a copy


def send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send a multipart message without blocking (zmq.Again if it cannot go now)."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        if i < last:
            send(sock, f, MORE_NOBLOCK, True)
        else:
            send(sock, f, NOBLOCK, len(f) < ZERO_COPY_MIN)


def recv_frames(sock: zmq.Socket) -> list[bytes]:
    """Receive a multipart message without blocking (zmq.Again if there is none). A Frame's
    ``more`` is cheaper than asking the socket for RCVMORE after each part."""
    frame = recv(sock, NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = recv(sock, 0, False)
        # a big body stays in ZeroMQ's buffer (no copy): held, written, delivered from there
        frames.append(frame.buffer if len(frame) >= ZERO_COPY_MIN else frame.bytes)
    return frames


def receive_some(sock: zmq.Socket, budget: int = DRAIN_BUDGET) -> tuple[list[list[bytes]], bool]:
    """Up to ``budget`` waiting messages, without blocking, and whether more may wait (the
    budget was used up: look again soon, the socket's FD will not say so)."""
    messages = []
    for _ in range(budget):
        try:
            messages.append(recv_frames(sock))
        except zmq.Again:
            return messages, False
    return messages, True

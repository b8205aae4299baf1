"""ZeroMQ sockets of a queue: made, bound or connected as a queue wants them, and frames
moved on them without blocking, at the least cost per frame."""

from __future__ import annotations

from pathlib import Path

import zmq

# The socket methods of pyzmq's backend, called with int flags: 3-4x cheaper per frame than
# the convenience layer's (which converts flag enums and checks arguments on every call).
send = zmq.backend.Socket.send
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
ZERO_COPY_MIN = 1 << 16  # frames this large are sent and received without a copy
#: frames up to max_message_size + this get an answer on the sockets libzmq reads; larger
#: ones are dropped with their connection
MAXMSG_SLACK = 1 << 20
PEER_HWM = 100_000  # messages queued to a static peer queue


def make_ipc_dir(endpoint: str) -> None:
    """The directory of an ipc:// endpoint's path (not of an abstract one: ipc://@NAME)."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        Path(endpoint[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)


def bind(ctx: zmq.Context, kind: int, endpoint: str, max_message_size: int,
         hwm: int | None = None) -> zmq.Socket:
    """A socket of ``kind`` bound to ``endpoint`` (zmq.ZMQError if it cannot: closed)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_size + MAXMSG_SLACK)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)
    make_ipc_dir(endpoint)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


def connect_peer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A DEALER to a static peer queue's receive endpoint (our copies go there)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.SNDHWM, PEER_HWM)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    sock.connect(endpoint)
    return sock


def send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send a multipart message without blocking (zmq.Again if it cannot go now)."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        if i < last:
            send(sock, f, MORE_NOBLOCK, True)
        else:
            send(sock, f, NOBLOCK, len(f) < ZERO_COPY_MIN)

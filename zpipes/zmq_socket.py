"""The asyncio client's DEALER socket to the broker, through libzmq, and its connection monitor.

(The sync client speaks ZMTP on a plain socket itself: :mod:`zpipes.zmtp`.) The asyncio channel
passes callables that unwrap its already completed futures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import zmq

from zpipes import protocol as p
from zpipes.errors import BrokerUnavailable

CLOSE_LINGER_MS = 200  # how long a closed socket may still try to deliver its last message
RECONNECT_IVL_MS = 100  # the channels never use a second connection: see open_socket


def open_socket(context: zmq.Context[Any], address: str) -> tuple[Any, Any]:
    """A DEALER socket connected to ``address`` and the monitor socket that reports its
    disconnect: (socket, monitor). Raises BrokerUnavailable.

    Reconnecting stays on, although a channel never uses a second connection: with it off,
    ZeroMQ throws away the replies that arrived but were not read yet when the connection
    closes (such as the broker's last words, "broker stopping"). A broker that comes back has
    forgotten our pipe end and would leave our requests unanswered for ever, so the monitor
    reports the disconnect, and the channel then takes what arrived before it and is dead."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, CLOSE_LINGER_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    try:
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise BrokerUnavailable(f"cannot watch the connection to the broker: {exc}") from None
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        monitor.close(linger=0)
        sock.close(linger=0)
        raise BrokerUnavailable(f"cannot connect to broker at {address!r}: {exc}") from None
    return sock, monitor


def is_ping_ok(frame: zmq.Frame) -> bool:
    buf = frame.buffer
    return len(buf) == 3 and buf[2] == p.MessageId.PING_OK and buf[0] == 0xAA


def take_replies(
    recv: Callable[[], zmq.Frame], keep: Callable[[zmq.Frame], Any], limit: int | None
) -> int:
    """Receive the replies that arrived, without waiting (``recv`` raises zmq.Again when
    there is none), at most ``limit`` (None: all); ``keep`` each one but PING_OKs. Returns how
    many frames were received, PING_OKs included."""
    got = 0
    while limit is None or got < limit:
        try:
            frame = recv()
        except zmq.Again:
            break
        got += 1
        if not is_ping_ok(frame):
            keep(frame)
    return got


def is_disconnect(event: list[bytes]) -> bool:
    """True if ``event`` (a message of a socket monitor) reports a dropped connection."""
    return len(event[0]) >= 2 and bool(
        int.from_bytes(event[0][:2], sys.byteorder) & zmq.EVENT_DISCONNECTED
    )


def saw_disconnect(recv_event: Callable[[], list[bytes]]) -> bool:
    """Read every pending monitor event (``recv_event`` raises zmq.Again when there is none);
    True if one of them reports a dropped connection."""
    dropped = False
    while True:
        try:
            event = recv_event()
        except zmq.Again:
            return dropped
        if is_disconnect(event):
            dropped = True


def close_socket(sock: Any, monitor: Any, at_once: bool) -> None:
    """Close the monitor and the socket: ``at_once`` (a dead channel, an aborted writer) with
    no linger, dropping whatever is still queued; else with the linger that lets a last
    message (a CLOSE) go out."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(linger=0)
    sock.close(linger=0 if at_once else CLOSE_LINGER_MS)



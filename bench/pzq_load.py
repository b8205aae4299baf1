"""What the pzq benchmarks share: free loopback ports and a producer that keeps a window of
messages unACKed and times each ACK. Clocks are ``time.monotonic`` (one clock for every
process on the machine, so a consumer's times compare with the producer's)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

REPLICATION_FAILED = b"REPLICATION_FAILED"


def free_port() -> int:
    """A loopback port free now, below the ephemeral range (a port bound to 0 could be taken
    meanwhile by an outgoing connection)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    for _ in range(200):
        port = random.randrange(20000, max(21000, high))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port")


def ack_arrived(s: zmq.Socket) -> list[bytes]:
    """An original-wire consumer's turn: take every delivery waiting on ``s`` (a DEALER on
    the queue's send endpoint) and ACK each; returns their keys."""
    keys = []
    while True:
        try:
            frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return keys
        key = frames[0].bytes
        s.send_multipart([key, b"1"])
        keys.append(key)


@dataclass
class Produced:
    t0: float  # the first send
    t_end: float  # the last ACK
    lat: list[float] = field(default_factory=list)  # seconds from send to ACK, each message
    #: (sent, ACKed) of each message, on the clock the producer was given
    stamps: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0  # "0" ACKs
    repl_failed: int = 0  # "1" ACKs with REPLICATION_FAILED


def produce_windowed(endpoint: str, n: int, size: int, window: int, tag: bytes = b"",
                     start: float = 0.0, ack_wait: float = 30.0,
                     clock: Callable[[], float] = time.monotonic) -> Produced:
    """Send ``n`` messages of ``size`` bytes keeping at most ``window`` unACKed (from
    wall-clock time ``start`` on); raise RuntimeError if no ACK comes for ``ack_wait`` s.
    Each message's send and ACK are stamped on ``clock`` (the wall clock: to compare with
    another process's stamps)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.connect(endpoint)
    body = b"x" * size
    copy = size < 65536
    sent_at: dict[bytes, float] = {}
    while time.time() < start:
        time.sleep(0.001)
    out = Produced(time.monotonic(), 0.0)
    i = 0
    try:
        while i < n or sent_at:
            while i < n and len(sent_at) < window:
                mid = b"%s%d" % (tag, i)
                sent_at[mid] = clock()
                s.send_multipart([mid, b"", body], copy=copy)
                i += 1
            if not s.poll(int(ack_wait * 1000)):
                raise RuntimeError(f"producer: no ACK for {ack_wait:g} s "
                                   f"({len(sent_at)} outstanding)")
            now = clock()
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                t = sent_at.pop(frames[0], None)
                if t is not None:
                    out.lat.append(now - t)
                    out.stamps.append((t, now))
                    out.failed += frames[1] != b"1"
                    out.repl_failed += frames[3:4] == [REPLICATION_FAILED]
        out.t_end = time.monotonic()
        return out
    finally:
        s.close(linger=0)
        ctx.term()

"""Turn-taking in the transport's read path (zbroker/zmtp/flow.py, zbroker/zmtp/server.py),
for every endpoint alike: a producer flooding one queue's receive endpoint with small messages
cannot make a producer of another queue on the same loop wait behind a large part of its
backlog. Two pzq receive endpoints (their own read policy) over ipc, on a loop
in a thread of its own; the flood and the probe are raw ZMTP connections, and the probe is
sent from the loop's thread, so that what is counted is what the loop did between.

Before the read path was one, the pzq endpoints read 1 MiB at a time with no turns: the probe
waited behind up to one such read of the flood (about 70 000 messages of 10 bytes)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator

import pytest
import structlog
from helpers import wait_for

from zbroker.services.pzq.receiver import Receiver
from zbroker.zmtp.flow import ROUND_MESSAGES, TURN_MESSAGES, Rounds, read_size
from zpipes.zmtp_framing import frame_head, greeting, ready_command

FLOOD_MESSAGES = 2_000_000
PROBES = 20
#: what the probe may wait behind: a few reads of the flood (each about SMALL_AFTER of its
#: messages), far less than a turn
BOUND = TURN_MESSAGES


class _Seen:
    """Counts the flood's messages as the endpoint hands them on, and for each probe
    message, how many of the flood's were handed on between its sending and its arrival."""

    def __init__(self) -> None:
        self.flood = 0
        self.sent_at = 0  # the flood's count when the probe was sent
        self.waits: list[int] = []
        self.arrived = threading.Event()


def _receiver(loop: asyncio.AbstractEventLoop, name: str, seen: _Seen) -> Receiver:
    holder: list[Receiver] = []

    def on_input() -> None:
        for rid, _frames, _refused in holder[0].take(1 << 30):
            if rid == b"flood":
                seen.flood += 1
            elif rid == b"probe":
                seen.waits.append(seen.flood - seen.sent_at)
                seen.arrived.set()

    r = Receiver(loop, on_input, max_frames=4, max_bytes=1 << 16, frame_cost=0, keep_first=64,
                 max_held=64 << 20, log=structlog.get_logger(), name=name)
    holder.append(r)
    return r


def _dealer(path: str, identity: bytes) -> socket.socket:
    """A raw ZMTP 3.0 DEALER connected to ``path`` (an abstract ipc name), its handshake
    done: what it sends is in the endpoint's socket at once, with no I/O thread between."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + path[len("ipc://@"):])
    sock.sendall(greeting() + ready_command(b"DEALER", identity))
    got = b""
    while len(got) < 64 or b"READY" not in got:  # its greeting, then its READY
        chunk = sock.recv(4096)
        assert chunk, "the endpoint closed the connection in the handshake"
        got += chunk
    return sock


@pytest.fixture
def two_queues() -> Iterator[tuple[asyncio.AbstractEventLoop, str, str, _Seen]]:
    loop = asyncio.new_event_loop()
    seen = _Seen()
    a, b = _receiver(loop, "a", seen), _receiver(loop, "b", seen)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ends = [f"ipc://@/zmtp-turns-{os.getpid()}-{q}" for q in "ab"]
    for r, end in zip((a, b), ends, strict=True):
        asyncio.run_coroutine_threadsafe(r.start(end), loop).result(10)
    yield loop, ends[0], ends[1], seen
    for r in (a, b):
        loop.call_soon_threadsafe(r.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_a_flood_on_one_queue_does_not_hold_back_a_producer_of_another(two_queues):
    loop, flood_end, probe_end, seen = two_queues
    flood, probe = _dealer(flood_end, b"flood"), _dealer(probe_end, b"probe")
    message = frame_head(10) + b"0123456789"
    sender = threading.Thread(target=flood.sendall, args=(message * FLOOD_MESSAGES,))
    sender.start()  # as fast as the endpoint reads

    def send_probe() -> None:  # on the loop's thread: the count and the send at one moment
        seen.sent_at = seen.flood
        probe.send(frame_head(5) + b"probe")

    try:
        for _ in range(PROBES):
            wait_for(lambda: seen.flood >= 1000, 10, "the flood being read", interval=0.001)
            seen.arrived.clear()
            loop.call_soon_threadsafe(send_probe)
            assert seen.arrived.wait(10), "the probe's message never came"
        assert seen.flood < FLOOD_MESSAGES, "the flood ended before the probes: nothing measured"
        assert max(seen.waits) <= BOUND, \
            f"the probe waited behind {max(seen.waits)} of the flood's messages ({seen.waits})"
    finally:
        flood.close()  # (the sender's sendall ends with an error)
        sender.join(10)
        probe.close()


def test_reads_are_sized_for_the_messages_and_turns_for_the_crowd():
    assert read_size(1 << 20, 1) == 0  # one large message: as much as there is
    assert read_size(2 * 64, 64) == 256  # tiny ones: the smallest read
    assert read_size(100 * 100, 100) == 6400  # about 64 of them
    rounds = Rounds()
    assert rounds.turn_messages == TURN_MESSAGES
    assert rounds.took_turn() and not rounds.took_turn()  # the round's first, then not
    rounds.ended()
    assert rounds.turn_messages == TURN_MESSAGES  # two share a round: each its whole turn
    for _ in range(100):
        rounds.took_turn()
    rounds.ended()
    assert rounds.turn_messages == ROUND_MESSAGES // 100

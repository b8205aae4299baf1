"""What a ZMTP connection writes (zbroker/zmtp/server.py's ``Link.write_parts``), on a real
Unix socket whose peer reads late: small pieces wait to be joined while the transport holds
a backlog, large ones go as they are, and the bytes arrive whole and in order."""

from __future__ import annotations

import asyncio
import os
import random
import socket

import pytest

from zbroker.zmtp import server as zmtp_server
from zbroker.zmtp.codec import LARGE_FRAME
from zbroker.zmtp.server import DEFAULT_POLICY, HELD_WAIT_S, Link


class _Server:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.policy = DEFAULT_POLICY


class _Link(Link):
    """A Link with no codec and no admission: only its writing is under test."""

    def codec(self, server):  # type: ignore[override]
        return None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def get_buffer(self, sizehint: int):
        return bytearray(1)

    def buffer_updated(self, nbytes: int) -> None:
        pass


@pytest.mark.asyncio
async def test_mixed_pieces_to_a_peer_that_reads_late_arrive_whole_and_in_order():
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    link = _Link(_Server(loop))
    await loop.connect_accepted_socket(lambda: link, ours)
    rng = random.Random(3)
    # the peer reads nothing yet: the kernel's buffer fills, then the transport's
    link.write_parts([os.urandom(4 << 20)])
    parts_all: list[bytes] = []
    for _ in range(200):  # writes of small and large pieces mixed, as answers are
        parts = [os.urandom(rng.choice((5, 300, LARGE_FRAME + 1, 3 * LARGE_FRAME)))
                 for _ in range(rng.randint(1, 6))]
        parts_all += parts
        link.write_parts(parts)
        assert link.unsent_bytes() > 0
    await asyncio.sleep(HELD_WAIT_S * 3)  # what waited is given to the transport
    theirs.setblocking(False)
    received = bytearray()
    total = (4 << 20) + sum(map(len, parts_all))
    deadline = loop.time() + 10
    while len(received) < total:
        assert loop.time() < deadline, f"{total - len(received)} bytes never came"
        try:
            chunk = theirs.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.01)
            continue
        assert chunk, "the connection ended early"
        received += chunk
    assert bytes(received[4 << 20:]) == b"".join(parts_all)
    link.transport.close()
    theirs.close()


@pytest.mark.asyncio
async def test_a_connection_hung_up_is_cut_once_its_peer_takes_nothing_not_while_it_reads(
        monkeypatch):
    monkeypatch.setattr(zmtp_server, "CLOSE_LINGER_S", 0.2)
    loop = asyncio.get_running_loop()
    # a peer that reads nothing: its connection, closed, does not stay for ever
    ours, theirs = socket.socketpair()
    link = _Link(_Server(loop))
    await loop.connect_accepted_socket(lambda: link, ours)
    link.write_parts([os.urandom(4 << 20)])
    link.hang_up()
    deadline = loop.time() + 5
    while link.transport is not None:
        assert loop.time() < deadline, "a peer that reads nothing kept its connection"
        await asyncio.sleep(0.05)
    theirs.close()
    # a peer that reads, slowly: everything it was sent, then the end
    ours, theirs = socket.socketpair()
    link = _Link(_Server(loop))
    await loop.connect_accepted_socket(lambda: link, ours)
    data = os.urandom(4 << 20)
    link.write_parts([data])
    link.hang_up()
    theirs.setblocking(False)
    received = bytearray()
    deadline = loop.time() + 20
    while True:
        assert loop.time() < deadline, f"{len(data) - len(received)} bytes never came"
        try:
            chunk = theirs.recv(128 << 10)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            break
        received += chunk or b""
        await asyncio.sleep(0.05)  # (a few reads in each CLOSE_LINGER_S)
    assert bytes(received) == data
    theirs.close()

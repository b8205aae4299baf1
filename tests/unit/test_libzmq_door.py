"""A libzmq listener kept inside a connection budget (zbroker/zmtp/libzmq_door.py), with real
libzmq sockets and real TCP and Unix connections in this process."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
import structlog
import zmq
from helpers import wait_for_async

from zbroker.zmtp.admission import SOURCE_FULL, TOO_MANY, Admission, ConnectionBudget
from zbroker.zmtp.libzmq_door import LibzmqDoor
from zbroker.zmtp.refusals import Refusals


def ended(conn: socket.socket) -> bool:
    """Whether the other side ended ``conn`` (what it sent before is read and dropped)."""
    conn.setblocking(False)
    try:
        while True:
            if conn.recv(4096) == b"":
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def settle(predicate, timeout: float = 5.0) -> None:
    await wait_for_async(predicate, timeout, "the door", interval=0.02)


class Listener:
    def __init__(self, endpoint: str, limit: int, untrusted_limit: int | None,
                 share: int = 4) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.admission = Admission("test", Refusals(structlog.get_logger()),
                                   budget=ConnectionBudget(limit=limit))
        self.door = LibzmqDoor(asyncio.get_running_loop(), self.admission,
                               untrusted_limit=untrusted_limit, untrusted_share=share)
        self.door.prepare(self.sock)
        self.sock.bind(endpoint)
        self.door.watch(self.sock, f"inproc://door-{id(self)}")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    def close(self) -> None:
        self.door.stop()
        self.sock.close(linger=0)
        self.ctx.term()


def connect(port: int, source: str) -> socket.socket:
    conn = socket.socket()
    conn.bind((source, 0))
    conn.connect(("127.0.0.1", port))
    return conn


@pytest.mark.asyncio
async def test_strangers_share_a_small_pool_and_a_trusted_host_leaves_it():
    door = Listener("tcp://127.0.0.1:*", limit=50, untrusted_limit=6, share=4)
    conns = []
    try:
        conns = [connect(door.port, "127.0.0.2") for _ in range(6)]
        await settle(lambda: door.admission.refusals.count(SOURCE_FULL) == 2)
        assert door.door.status()["untrusted"] == 4
        await settle(lambda: [ended(c) for c in conns] == [False] * 4 + [True] * 2)
        # the pool: 6 strangers' connections in all
        more = [connect(door.port, "127.0.0.3") for _ in range(3)]
        conns += more
        await settle(lambda: door.admission.refusals.count(TOO_MANY) == 1)
        assert (door.door.status()["connections"], door.door.status()["untrusted"]) == (6, 6)
        # a host that turns out to be a peer's leaves the pool: its next ones are taken
        door.door.trust(("host", "127.0.0.2"))
        assert door.door.status()["untrusted"] == 2
        trusted = [connect(door.port, "127.0.0.2") for _ in range(10)]
        conns += trusted
        await settle(lambda: door.door.status()["connections"] == 16)
        await asyncio.sleep(0.1)  # a window in which a refusal would end some (none may)
        assert not any(ended(c) for c in trusted)
        # what ends gives its place back
        for c in trusted:
            c.close()
        await settle(lambda: door.door.status()["connections"] == 6)
        assert door.admission.budget.open == 6
    finally:
        for c in conns:
            c.close()
        door.close()


@pytest.mark.asyncio
async def test_the_budget_bounds_every_source_and_a_full_one_takes_again_once_some_go():
    door = Listener("tcp://127.0.0.1:*", limit=8, untrusted_limit=None)
    conns = []
    try:
        conns = [connect(door.port, f"127.0.0.{2 + i % 4}") for i in range(12)]
        await settle(lambda: door.admission.refusals.count(TOO_MANY) == 4)
        assert door.admission.budget.open == 8
        await settle(lambda: sum(ended(c) for c in conns) == 4)
        for c in conns[:8]:
            c.close()
        await settle(lambda: door.admission.budget.open == 0)
        fresh = connect(door.port, "127.0.0.9")
        conns.append(fresh)
        await settle(lambda: door.admission.budget.open == 1)
        assert not ended(fresh)
    finally:
        for c in conns:
            c.close()
        door.close()


@pytest.mark.asyncio
async def test_an_ipc_listener_counts_connections_by_user(tmp_path):
    path = tmp_path / "ctl"
    door = Listener(f"ipc://{path}", limit=100, untrusted_limit=None)
    door.admission.budget.set_limit(100, per_source=3)
    conns = []
    try:
        for _ in range(5):
            c = socket.socket(socket.AF_UNIX)
            c.connect(str(path))
            conns.append(c)
        await settle(lambda: door.admission.refusals.count(SOURCE_FULL) == 2)
        assert door.admission.budget.by_source == {("uid", os.getuid()): 3}
    finally:
        for c in conns:
            c.close()
        door.close()

"""The pzq service's cluster channel in one process: two pzq services with real queues
(real sockets on 127.0.0.1, real disk), whose cluster ports hand each message to the other
service on the next turn of the loop, in order, as the cluster node does. Hostile frames from
a peer are answered by a warning, never an exception, and the channel keeps working."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
import zmq
import zmq.asyncio
from helpers import free_port, wait_for_async

from zbroker.config import parse_config
from zbroker.service import ClusterPort, PeerBroker, ServiceContext
from zbroker.services.pzq.core.peering import BATCH_BYTES, copies, encode, parse_copies
from zbroker.services.pzq.service import PzqService

NODE = "0" * 32


class LinkedPort(ClusterPort):
    """A cluster port whose peer is one other service on the same loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__("pzq")
        self.loop = loop
        self.me: PeerBroker | None = None
        self.other: Any = None  # (the peer as the other side knows it, its service)
        self.up = True
        self.sent: list[list[bytes]] = []

    def send(self, peer: str, frames: list[Any]) -> bool:
        if not self.up or self.other is None:
            return False
        self.sent.append([bytes(f) for f in frames])
        _, service = self.other
        self.loop.call_soon(service.peer_message, self.me,
                            [memoryview(bytes(f)) for f in frames])
        return True


def test_copy_batches_round_trip_and_split():
    items = [(b"k%d" % i, [b"a" * i, b"b"]) for i in range(1, 600)]
    batches = [encode(m) for m in copies(b"jobs", NODE, items)]
    assert len(batches) == 3  # 256 messages at most in one
    got = []
    for frames in batches:
        assert frames[:3] == [b"COPY", b"jobs", NODE.encode()]
        got += parse_copies(frames[3:])
    assert got == items
    big = [(b"k", [b"x" * (BATCH_BYTES + 1)]), (b"k2", [b"y"])]
    assert len(list(copies(b"q", NODE, big))) == 2  # a big one goes alone
    assert list(copies(b"q", NODE, [])) == []


def test_parse_copies_refuses_what_does_not_add_up():
    for frames in ([b"k"], [b"k", b"1"], [b"k", b"2", b"b"], [b"k", b"0", b"b"],
                   [b"k", b"x", b"b"], [b"k", b"1234567", b"b"], [b"k", b"", b"b"],
                   [b"k", b"1", b"b", b"k2"]):
        assert parse_copies(frames) is None, frames
    assert parse_copies([]) == []


async def start(tmp_path, name: str, port: LinkedPort, **queue: Any) -> PzqService:
    config = parse_config({
        "cluster": {"enabled": True, "discovery": False, "insecure": True},
        "services": {"pzq": {"enabled": True, "queues": {"jobs": {
            "receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "monitor_endpoint": None,
            "data_dir": str(tmp_path / name), **queue}}}}})
    service = PzqService()
    ctx = ServiceContext(broker_name=name, zmq_context=zmq.Context.instance(),
                         loop=asyncio.get_running_loop(),
                         log=structlog.get_logger().bind(service="pzq"),
                         run_dir=tmp_path / f"run-{name}", cluster=port)
    await service.start(ctx, config)
    return service


@pytest.fixture
async def pair(tmp_path):
    loop = asyncio.get_running_loop()
    pa, pb = LinkedPort(loop), LinkedPort(loop)
    # (the copies are confirmed at once; a loaded machine must not make them late)
    a = await start(tmp_path, "a", pa, replicas=1, replication_timeout=5)
    b = await start(tmp_path, "b", pb)
    peer_a, peer_b = PeerBroker("a-life", "a", "tcp://a"), PeerBroker("b-life", "b", "tcp://b")
    pa.me, pb.me = peer_a, peer_b
    pa.other, pb.other = (peer_a, b), (peer_b, a)
    a.peer_joined(peer_b)
    b.peer_joined(peer_a)
    # each has the other's QUEUES (a's went first: handed over in order, on the loop)
    await wait_for_async(lambda: a.queues["jobs"].replication.placement.holders == ["b-life"],
                         10, "a to take b as the holder of its copies")
    yield a, b, pa, pb, peer_a, peer_b
    await a.stop()
    await b.stop()


async def settle(rounds: int = 50) -> None:
    """A window of ``rounds`` turns of 10 ms in which what must not happen would."""
    for _ in range(rounds):
        await asyncio.sleep(0.01)


async def produce(service: PzqService, n: int, prefix: bytes = b"id") -> list[list[bytes]]:
    q = service.queues["jobs"]
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(q.settings.receive_endpoint)
    try:
        for i in range(n):
            await sock.send_multipart([prefix + b"%d" % i, b"", b"body%d" % i])
        return [await asyncio.wait_for(sock.recv_multipart(), 5) for _ in range(n)]
    finally:
        sock.close(linger=0)


async def test_copies_are_confirmed_and_the_ack_waits_for_them(pair):
    a, b, pa, pb, peer_a, peer_b = pair
    qa, qb = a.queues["jobs"], b.queues["jobs"]
    assert qa.replication.placement.holders == ["b-life"]
    acks = await produce(a, 5)
    assert all(ack == [ack[0], b"1", b""] for ack in acks), acks  # no REPLICATION_FAILED
    assert qb.counters()["replicas_held"] == 5
    confirmed = [key for f in pb.sent if f[0] == b"CONFIRM" for key in f[3:]]
    assert sorted(confirmed) == sorted(m.key for m in qa.core.messages.values())


async def test_hostile_frames_from_a_peer_change_nothing(pair, capsys):
    a, b, pa, pb, peer_a, peer_b = pair
    qb = b.queues["jobs"]
    await produce(a, 3)
    before = qb.counters()
    garbage: list[list[bytes]] = [
        [], [b""], [b"QUEUES"], [b"QUEUES", b"{not json"], [b"QUEUES", b"[" * 100_000],
        [b"QUEUES", b'{"jobs": 7}'], [b"QUEUES", b'{"jobs": "not-a-node"}'],
        [b"QUEUES", b"\xff\xfe"], [b"COPY"], [b"COPY", b"jobs"], [b"COPY", b"jobs", b"xx"],
        [b"COPY", b"jobs", b"bad node", b"k", b"1", b"body"],
        [b"COPY", b"nope", NODE.encode(), b"k", b"1", b"body"],
        [b"COPY", b"jobs", NODE.encode(), b"k"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"x", b"b"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"2", b"b"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"0", b"b"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"99999999999999999999", b"b"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"-1", b"b"],
        [b"COPY", b"jobs", NODE.encode(), b"k", b"1", b"b", b"k2"],
        [b"DELETE", b"jobs"], [b"DELETE", b"jobs", b"bad node", b"k"],
        [b"CONFIRM", b"jobs", b"1"], [b"TAKEN", b"jobs"],
        [b"TAKEN", b"jobs", b"\xff" * 40, b"k"], [b"RELEASE", b"jobs", b"x"],
        [b"RELEASE", b"jobs"], [b"WHAT", b"jobs", b"x"], [b"\x00" * 70_000, b"\xff" * 3],
    ]
    for frames in garbage:
        b.peer_message(peer_a, [memoryview(f) for f in frames])
        a.peer_message(peer_b, [memoryview(f) for f in frames])
    await settle(10)
    after = qb.counters()
    assert after["replicas_held"] == before["replicas_held"] == 3
    assert after["replica_origins"] == before["replica_origins"]
    # well-formed but for nothing known: ignored quietly
    for frames in ([b"CONFIRM", b"jobs", b"1", b"unknown-key"],
                   [b"DELETE", b"jobs", NODE.encode(), b"unknown-key"]):
        b.peer_message(peer_a, [memoryview(f) for f in frames])
        a.peer_message(peer_b, [memoryview(f) for f in frames])
    await settle(5)
    assert a.queues["jobs"].replication.placement.holders == ["b-life"]
    acks = await produce(a, 2, b"later")  # the channel still works
    assert all(ack == [ack[0], b"1", b""] for ack in acks), acks
    assert qb.counters()["replicas_held"] == 5


async def test_taken_keys_are_dropped_only_for_this_node(pair):
    a, b, pa, pb, peer_a, peer_b = pair
    qa = a.queues["jobs"]
    await produce(a, 4)
    keys = [m.key for m in qa.core.messages.values()]
    a.peer_message(peer_b, [memoryview(f) for f in [b"TAKEN", b"jobs", NODE.encode(),
                                                       *keys]])
    await settle(5)
    assert len(qa.core.messages) == 4  # another node's list: not ours
    a.peer_message(peer_b, [memoryview(f) for f in [b"TAKEN", b"jobs", qa.node_id.encode(),
                                                       keys[0], keys[1], b"gone"]])
    await wait_for_async(  # taken back here, and their copies deleted on b
        lambda: len(qa.core.messages) == 2
        and b.queues["jobs"].counters()["replicas_held"] == 2, 5, "two messages taken back")
    assert len(qa.core.messages) == 2 and qa.core.counters["taken_back"] == 2
    assert b.queues["jobs"].counters()["replicas_held"] == 2  # their copies deleted too


async def test_a_lost_holder_makes_new_messages_fail_replication_at_once(pair):
    a, b, pa, pb, peer_a, peer_b = pair
    qa = a.queues["jobs"]
    a.peer_ended(peer_b, alive=False)
    assert qa.replication.placement.holders == [] and qa.core.replica_targets == 0
    acks = await produce(a, 2)
    assert all(ack[1:] == [b"1", b"", b"REPLICATION_FAILED"] for ack in acks), acks

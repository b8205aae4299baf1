"""The cluster node on real sockets, in this process: what services see of a peer's life."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import structlog
import zmq

from zbroker.cluster.membership import Hello
from zbroker.cluster.node import ClusterNode
from zbroker.config import ClusterConfig


async def test_sends_after_a_refused_one_in_the_same_turn_return_false_not_raise():
    """A send refused (nothing connected at the peer's endpoint) ends the peer's life at
    once; the services hear of it on the next turn. Their further sends in the same turn
    were a KeyError, raised into whatever was sending: a client's connection was dropped."""
    ctx = zmq.Context()
    loop = asyncio.get_running_loop()
    left = []
    config = ClusterConfig(enabled=True, bind="tcp://127.0.0.1:0", discovery=False,
                           insecure=True)
    node = ClusterNode(config, "local", ctx, loop, structlog.get_logger(),
                       on_join=lambda peer: None,
                       on_leave=lambda peer, why: left.append((peer.id, why)),
                       on_message=lambda peer, service, frames: None)
    await node.start()
    # a port nobody listens on, kept ours (bound, not listening) for the whole test
    nobody = socket.socket()
    try:
        nobody.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{nobody.getsockname()[1]}"
        # (a broker of before: its messages are not numbered, so none are held)
        peer_hello = Hello("p" * 32, "other", "default", endpoint, nonce="n",
                           echo=node.membership.nonce(endpoint), session="s", numbered=False)
        node.membership.add_contact(endpoint, loop.time())
        change = node.membership.hello(peer_hello, loop.time(), sender=peer_hello.id)
        node._apply(change)
        life = change.joined[0].life
        assert node.send(life, "zpipes", [b"DATA"]) is False  # refused: the life ends
        assert node.send(life, "zpipes", [b"DATA"]) is False  # in the same turn
        assert left == []
        await asyncio.sleep(0.05)
        assert [why for _, why in left] == \
            ["unreachable (its send queue is full or its link is down)"]
        assert node.send(life, "zpipes", [b"DATA"]) is False
    finally:
        nobody.close()
        await node.stop()
        ctx.destroy(linger=0)


class Node:
    """A cluster node on 127.0.0.1 in this process, with what its services saw."""

    def __init__(self, ctx, name, peers=()):
        self.joined, self.left, self.messages = [], [], []
        config = ClusterConfig(enabled=True, bind="tcp://127.0.0.1:0", discovery=False,
                               insecure=True, peers=tuple(peers), peer_timeout=2.0)
        self.node = ClusterNode(config, name, ctx, asyncio.get_running_loop(),
                                structlog.get_logger(), on_join=self.joined.append,
                                on_leave=lambda peer, why: self.left.append(why),
                                on_message=lambda peer, service, frames:
                                self.messages.append([bytes(f) for f in frames]))


@contextlib.asynccontextmanager
async def two_nodes(b_max_message=None):
    """Nodes a and b on 127.0.0.1, a with b as its seed (not waited for to meet)."""
    ctx = zmq.Context()
    b = Node(ctx, "b")
    if b_max_message is not None:
        b.node.max_message = b_max_message
    await b.node.start()
    a = Node(ctx, "a", peers=[b.node.endpoint])
    await a.node.start()
    try:
        yield a, b
    finally:
        await a.node.stop()
        await b.node.stop()
        ctx.destroy(linger=0)


async def until(condition, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_a_message_lost_on_the_way_ends_the_life_on_both_sides():
    """Two nodes on real sockets: a message that never left (its number skipped, as a reset
    connection would lose it) is noticed by the next one; the receiver ends its life of the
    sender and says why, and the sender ends its own."""
    async with two_nodes() as (a, b):
        await until(lambda: a.joined and b.joined)
        life = a.joined[0].id
        assert a.node.send(life, "svc", [b"one"])
        await until(lambda: b.messages == [[b"one"]])
        a.node.membership.peers[b.node.id].numbering.next_tag()  # lost with a reset
        assert a.node.send(life, "svc", [b"three"])
        await until(lambda: a.left and b.left)
        assert b.messages == [[b"one"]]  # not taken: it came after a hole
        assert b.left == ["1 of its messages were lost on the way (#2 came, #1 expected)"]
        assert a.left == ["it ended its life of us: 1 of its messages were lost on the way "
                          "(#2 came, #1 expected)"]
        await until(lambda: len(a.joined) == 2 and len(b.joined) == 2)  # both start afresh
        assert a.node.send(a.joined[1].id, "svc", [b"again"])
        await until(lambda: b.messages[-1:] == [[b"again"]])


async def test_the_last_message_lost_is_noticed_by_the_next_heartbeat():
    async with two_nodes() as (a, b):
        await until(lambda: a.joined and b.joined)
        assert a.node.send(a.joined[0].id, "svc", [b"one"])
        a.node.membership.peers[b.node.id].numbering.next_tag()  # lost; nothing comes after
        await until(lambda: b.left, timeout=3.0)  # a PING within peer_timeout / 3
        assert b.left == ["the last 1 of its messages were lost on the way (2 sent, 1 came)"]
        await until(lambda: a.left)
        assert b.messages == [[b"one"]]


async def test_a_message_over_the_limit_is_refused_as_its_head_arrives():
    """Anything that reaches the peer socket (an insecure cluster's) could have had the broker
    hold a message of any size, streamed in (1 GB took 950 MiB): a message that claims more
    than the limit drops its connection as its head arrives; a peer is still heard."""
    import socket

    from zbroker import zmtp

    loop = asyncio.get_running_loop()
    async with two_nodes(b_max_message=1 << 20) as (a, b):
        host, port = b.node.endpoint.removeprefix("tcp://").rsplit(":", 1)
        raw = socket.create_connection((host, int(port)))
        raw.setblocking(False)
        await loop.sock_sendall(raw, zmtp.SIGNATURE + bytes((3, 0)) + b"NULL".ljust(20, b"\0")
                                + bytes(32) + zmtp.ready_command(b"DEALER"))
        await loop.sock_sendall(raw, bytes([zmtp.LONG]) + (2 << 20).to_bytes(8, "big")
                                + b"x" * 1000)

        async def closed() -> bool:
            while True:
                data = await loop.sock_recv(raw, 65536)  # its greeting and READY, then EOF
                if not data:
                    return True

        assert await asyncio.wait_for(closed(), 5)
        raw.close()
        await until(lambda: a.joined and b.joined)
        assert a.node.send(a.joined[0].id, "svc", [b"y" * (512 << 10)])
        await until(lambda: len(b.messages) == 1)
        b.node.set_max_message(4 << 20)  # (a reload raised a limit: new links take it)
        assert b.node._router.getsockopt(zmq.MAXMSGSIZE) == 4 << 20


async def test_messages_sent_while_the_link_is_made_again_are_held_and_go_in_order():
    """A link made again (a reset connection) refuses sends until it is connected: what is
    sent meanwhile is held and goes, in order, once it is; the life goes on (what a reset
    took is noticed by the numbers, not by a refused send)."""
    async with two_nodes() as (a, b):
        await until(lambda: a.joined and b.joined)
        life = a.joined[0].id
        b.node._router.unbind(b.node.endpoint)  # (for a moment: nobody listens there)
        a.node._close_link(b.node.endpoint)  # made again at the next send
        assert all(a.node.send(life, "svc", [b"%d" % i]) for i in range(3))
        await asyncio.sleep(0.2)
        assert len(a.node._held[b.node.id].messages) == 3  # refused by the new link: held
        b.node._router.bind(b.node.endpoint)
        await until(lambda: len(b.messages) == 3)
        assert b.messages == [[b"0"], [b"1"], [b"2"]] and not a.node._held
        assert a.left == [] and b.left == []


async def test_a_link_that_stays_down_while_messages_are_held_loses_the_peer():
    async with two_nodes() as (a, b):
        await until(lambda: a.joined and b.joined)
        life = a.joined[0].id
        b.node._reader.stop()  # b's process is gone without a word
        b.node._router.close(linger=0)
        b.node._router = None
        a.node._close_link(b.node.endpoint)
        assert a.node.send(life, "svc", [b"held"])
        await until(lambda: a.left, timeout=3.0)
        assert not a.node._held and a.node.send(life, "svc", [b"late"]) is False


def test_what_is_held_for_a_peer_is_bounded_in_messages_and_bytes():
    from zbroker.cluster.node import HOLD_BYTES, HOLD_MESSAGES, _Held

    held = _Held(0.0)
    big = [b"SVCN", b"t" * 16, b"svc", b"x" * (HOLD_BYTES // 2)]
    assert held.add(big) and held.add(big) and not held.add([b"SVCN"])
    assert len(held.messages) == 2 and held.size == 2 * sum(map(len, big))
    small = _Held(0.0)
    assert all(small.add([b"m"]) for _ in range(HOLD_MESSAGES)) and not small.add([b"m"])


async def test_a_stranger_routing_id_is_logged_escaped():
    """A message on the cluster port from a connection that is not a peer is logged with
    its sender's routing id, which any stranger chooses: a NUL byte in it went into the log
    line as it was."""
    ctx = zmq.Context()
    loop = asyncio.get_running_loop()
    config = ClusterConfig(enabled=True, bind="tcp://127.0.0.1:0", discovery=False,
                           insecure=True)
    node = ClusterNode(config, "local", ctx, loop, structlog.get_logger(),
                       on_join=lambda peer: None, on_leave=lambda peer, why: None,
                       on_message=lambda peer, service, frames: None)
    await node.start()
    stranger = ctx.socket(zmq.DEALER)
    stranger.setsockopt(zmq.ROUTING_ID, b"\x00evil\x1b[2J")
    stranger.setsockopt(zmq.LINGER, 0)
    try:
        with structlog.testing.capture_logs() as seen:
            stranger.connect(node.endpoint)
            stranger.send_multipart([b"MEMBERS", b"[]"])
            stranger.send_multipart([b"NONSENSE", b"x"])
            for _ in range(100):
                if sum(e["event"] in ("gossip refused", "invalid cluster message")
                       for e in seen) == 2:
                    break
                await asyncio.sleep(0.02)
        lines = [e for e in seen if e["event"] in ("gossip refused", "invalid cluster message")]
        assert len(lines) == 2, seen
        for e in lines:
            assert e["sender"] == "\\x00evil\\x1b[2J" and e["sender"].isprintable(), e
    finally:
        stranger.close()
        await node.stop()
        ctx.term()

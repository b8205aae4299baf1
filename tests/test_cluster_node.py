"""The cluster node on real sockets, in this process: what services see of a peer's life."""

from __future__ import annotations

import asyncio

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
    try:
        with zmq.Context().socket(zmq.ROUTER) as nobody:  # a port nobody listens on
            port = nobody.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        peer_hello = Hello("p" * 32, "other", "default", endpoint, nonce="n",
                           echo=node.membership.nonce(endpoint), session="s")
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
        await node.stop()
        ctx.destroy(linger=0)

"""The ZPIPES server core as the core tests drive it: what it asks of the I/O (its actions)
sorted into the replies to clients, ``outbox`` ((routing id, frame) pairs), and the messages
to peer brokers, ``peer_outbox`` ((peer, frames) pairs), in order, for the tests to take."""

from __future__ import annotations

from typing import Any

from zbroker.services.zpipes.actions import Reply, SendPeer
from zbroker.services.zpipes.server import ZpipesServer


class Core(ZpipesServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replies: list[tuple[bytes, Any]] = []
        self._to_peers: list[tuple[str, list[Any]]] = []

    def _sort(self) -> None:
        for action in self.take_output():
            if type(action) is Reply:
                self._replies.append((action.routing_id, action.frame))
            else:
                assert type(action) is SendPeer, action
                self._to_peers.append((action.peer, action.frames))

    @property
    def outbox(self) -> list[tuple[bytes, Any]]:
        self._sort()
        return self._replies

    @outbox.setter
    def outbox(self, replies: list[tuple[bytes, Any]]) -> None:
        self._replies = replies

    @property
    def peer_outbox(self) -> list[tuple[str, list[Any]]]:
        self._sort()
        return self._to_peers

    @peer_outbox.setter
    def peer_outbox(self, messages: list[tuple[str, list[Any]]]) -> None:
        self._to_peers = messages

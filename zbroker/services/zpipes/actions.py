"""What the ZPIPES server core asks of the I/O around it. No I/O.

The core (server.py and the parts it is made of) never touches a socket. Each call on it
records the messages it implies as typed actions, in order; the service takes them with
``ZpipesServer.take_output()`` and carries them out in that order:

    Reply     one frame to a client, by its routing id, on the client endpoint; ``wakes``:
              it answers a request that was waiting for its pipe (a READ for data, a WRITE
              for room), so its client is idle until it arrives: the I/O writes it first
    SendPeer  one peer message (peering.py, encoded) to a peer broker's life, on the
              cluster's channel
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Reply:
    routing_id: bytes
    frame: bytes | memoryview
    wakes: bool = False


@dataclass(slots=True)
class SendPeer:
    peer: str  # the life of the peer broker (the cluster's PeerBroker.id)
    frames: list[bytes | memoryview]

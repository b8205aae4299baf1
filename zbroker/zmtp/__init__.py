"""ZMTP, ZeroMQ's wire protocol, as the broker serves it: one transport for every endpoint.

    codec.py       one connection's bytes in, events out; no I/O (ZMTP 2.0, 3.0, 3.1)
    addresses.py   ZeroMQ endpoint strings (tcp://HOST:PORT, ipc://PATH) as listening sockets
    admission.py   who may connect, how many in all (the process's connection budget)
    refusals.py    refusals counted by reason, and logged at a bounded rate
    flow.py        how a connection is read: read sizes and turns (no I/O)
    server.py      the asyncio server every ZMTP endpoint of the broker runs on: admission,
                   handshake timeout, keepalive, routing ids, the connection's life, and the
                   read and write paths (budgets counted, turns taken, answers joined)

The broker's ZPIPES endpoint and every pzq endpoint (receive, send, credit, stream, monitor)
are a :class:`server.Server` with its own message handling and read policy; what guards the
door, reads and writes is the same for all of them.
"""

from zpipes.zmtp_framing import COMMAND, LONG, MORE, SIGNATURE, command

from .codec import (
    LARGE_FRAME,
    Closed,
    Connection,
    DealerConnection,
    Event,
    Message,
    Ready,
    Refused,
    RoutingIds,
    encode_message,
    encode_parts,
    ready_command,
)

__all__ = [
    "COMMAND", "LARGE_FRAME", "LONG", "MORE", "SIGNATURE", "Closed", "Connection",
    "DealerConnection", "Event", "Message", "Ready", "Refused", "RoutingIds", "command",
    "encode_message", "encode_parts", "ready_command",
]

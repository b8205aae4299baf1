"""The cluster's messages between brokers, as the core reads and writes them. No I/O.

Every message is ``[kind, ...]`` (node.py's docstring says what each means):

    HELLO  json(Hello)             PING [?t | !t [count]]      BYE [why]
    MEMBERS json(members)          SVC service, frames...      SVCN tag, service, frames...
"""

from __future__ import annotations

import struct
from typing import Protocol

KIND_HELLO, KIND_PING, KIND_BYE, KIND_SVC = b"HELLO", b"PING", b"BYE", b"SVC"
KIND_MEMBERS, KIND_SVCN = b"MEMBERS", b"SVCN"
MAX_WHY = 200  # characters of a BYE's reason logged
#: a PING's payload: "?" + the sender's clock asks for an echo, "!" + the same is the echo
PING_CLOCK = struct.Struct("<d")
ASK, ECHO = b"?", b"!"


class Frame(Protocol):
    """A frame as the core reads it: a zmq.Frame, or bytes in a test's wrapper."""

    @property
    def bytes(self) -> bytes: ...

    @property
    def buffer(self) -> memoryview: ...

    def __len__(self) -> int: ...


def printable(text: str) -> str:
    """A routing id (any bytes a stranger chose) as a log line can carry it: control and
    other unprintable characters as \\xNN escapes."""
    return text if text.isprintable() else "".join(
        c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def wildcard_host(endpoint: str) -> str:
    """tcp://0.0.0.0:5670 -> tcp://*:5670 (peers then use the address our HELLO came from)."""
    transport, _, address = endpoint.partition("://")
    host, _, port = address.rpartition(":")
    if transport == "tcp" and host in ("0.0.0.0", "*", "[::]", "::"):
        return f"tcp://*:{port}"
    return endpoint

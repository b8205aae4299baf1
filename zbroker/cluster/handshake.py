"""What libzmq's monitors say of a failed handshake, as the cluster core reads it: the events
that are a refusal, whether libzmq said why, and the likely cause (troubles.py's words).

Only the libzmq layer (node.py) reads monitor events; the core (core/) is given the cause and
whether it is sure, never a libzmq number.
"""

from __future__ import annotations

import zmq

from . import troubles

#: the monitor events of a failed handshake, and how the debug log names each
HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed: another security mechanism "
                                         "(a key on one side only?)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake failed: our key was refused",
}


def sure(event: int) -> bool:
    """Whether libzmq said why a handshake failed: else the other side only closed the
    connection (a peer that cannot read our key's HELLO does that, and so may a side that saw
    the mismatch first), and the cause is a guess."""
    return event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def cause(event: int, value: int, keyed: bool, side: str) -> str:
    """The likely reason of a failed handshake: libzmq's monitor ``event`` and its ``value``
    (the protocol error code, or errno), whether this broker has a key (``keyed``), and on
    which ``side`` of the link (OURS: at our peer socket; THEIRS: on our link to a peer)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return troubles.PEER_NO_KEY if keyed else troubles.NO_KEY_HERE
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return troubles.ANOTHER_KEY
        return f"handshake failed (protocol error {value:#x})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return troubles.KEY_REFUSED if side == troubles.THEIRS else troubles.NOT_OUR_KEY
    # no detail: on our link, a peer that cannot read our key's HELLO closes the connection;
    # a keyed peer closes that of a broker without a key (when it sees the mismatch first)
    if side == troubles.THEIRS:
        return troubles.ANOTHER_KEY if keyed else troubles.NO_KEY_HERE
    return troubles.CLOSED

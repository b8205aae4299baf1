"""What the cluster core asks of the libzmq layer around it, in order. No I/O.

    Send        frames to the link at an endpoint (made first, by Connect); a send whose
                outcome the core needs (``report``) is reported back at once, before any
                other event, with NodeCore.sent
    SendHeld    what is held for a peer, in order, as far as its link takes it; reported with
                NodeCore.held_sent
    Connect     make our link to an endpoint (a DEALER); ``watch``: follow what it does
                (connected, closed, handshake failed) and report it with NodeCore.link_event
    Watch       follow an existing link from now on (a peer joined there)
    Disconnect  close everything our link to an endpoint opened (``linger``: ms to let what
                was sent go; ``soon``: on the next turn, not from inside the link's own event)
    Joined, Left, Deliver   what the services see: a peer's life began, ended, or brought
                a service message (Left says ``why``, and whether the peer was running as it
                ended: ``alive``)
    Trust       a host that is a peer's: out of the strangers' pool at our socket's door
    Wake        call NodeCore.tick at this time (the earliest asked for wins)
    LookUpClosed    in ``after`` seconds, read which connections to our socket were closed
                here and give them to NodeCore.attribute
    Log         a line for the operator (its Clock and Then fields: times of day)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zbroker.service import PeerBroker

from .held import Held

#: what a Send's outcome is reported for (``Send.report``)
NOT_REPORTED, HELLO_SENT, HELLO_RETRY, PEER_SENT, SERVICE_SENT = 0, 1, 2, 3, 4


@dataclass(slots=True)
class Send:
    endpoint: str
    frames: list[Any]
    #: NOT_REPORTED; HELLO_SENT (the contact at ``endpoint`` was said HELLO), HELLO_RETRY
    #: (the same, and a link that stays unconnected is made anew); PEER_SENT (to peer
    #: ``peer``: a heartbeat's clock restarts); SERVICE_SENT (a service's message: only in
    #: what NodeCore.send returns, reported with NodeCore.service_sent)
    report: int = NOT_REPORTED
    peer: str = ""
    #: send only if the link is connected (else it is refused, and reported as such)
    if_writable: bool = False


@dataclass(slots=True)
class SendHeld:
    """Send what is held for peer ``peer`` (``held.send``, message by message, until the link
    refuses one), then report with NodeCore.held_sent whether all went."""

    endpoint: str
    held: Held
    peer: str


@dataclass(slots=True)
class Connect:
    endpoint: str
    watch: bool = False


@dataclass(slots=True)
class Watch:
    endpoint: str


@dataclass(slots=True)
class Disconnect:
    endpoint: str
    linger: int = 0
    soon: bool = False


@dataclass(slots=True)
class Joined:
    life: PeerBroker


@dataclass(slots=True)
class Left:
    life: PeerBroker
    why: str
    #: the peer was running when the life ended: it ended the life itself (its HELLO starts
    #: afresh with us: it had lost us; its BYE says why), or we did, on a message of it out of
    #: order. Not a loss of the peer: what it serves, it goes on serving
    alive: bool = False


@dataclass(slots=True)
class Deliver:
    life: PeerBroker
    service: str
    frames: list[Any]


@dataclass(slots=True)
class Trust:
    address: str


@dataclass(slots=True)
class Wake:
    at: float


@dataclass(slots=True)
class LookUpClosed:
    after: float


class Clock(float):
    """A wall-clock time (seconds since the epoch) in a Log's fields: written as the log's
    reader reads it, a local time of day."""


class Then(float):
    """A time of the core's own clock (the ``now`` its calls are given) in a Log's fields:
    written as a Clock, the wall clock's time of day it was then."""


@dataclass(slots=True)
class Log:
    level: str  # "debug", "info" or "warning"
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = (Send | SendHeld | Connect | Watch | Disconnect | Joined | Left | Deliver | Trust | Wake
          | LookUpClosed | Log)

"""The ZPIPES client endpoint: a ZeroMQ ROUTER on the broker's ZMTP server (``zbroker/zmtp/``).

Clients are libzmq DEALER sockets (the original C client, ``zpipes.client``, ``zpipes.aio``);
they see what a libzmq ROUTER would show them. The broker speaks ZMTP itself instead of going
through libzmq for what that buys on this path:

- cost: each readiness event is one read of up to 1 MiB into one buffer, on the event loop's
  thread; libzmq would read in 8 KiB batches on its I/O thread and wake the loop through its
  mailbox, about three thread switches per message;
- the door: each connection is accepted here, so its peer's credentials (SO_PEERCRED) are read
  on its own socket, and a connection from a user not allowed, or past the process's connection
  budget (``clients.max_clients``, shared by every ZMTP endpoint), is closed before a byte of
  it is read (:mod:`zbroker.zmtp.admission`, the same for every endpoint);
- dead clients: a connection's end is a ``connection_lost`` naming its routing id, at once;
- limits: a message over ``max_bytes`` is refused as its frame header arrives, and the rest of
  it is skipped as it comes, never held. What is held of messages still arriving (a large
  frame's buffer is made whole as its head arrives) is :meth:`Endpoint.incoming_bytes`, and a
  large frame is taken only if ``admit_frame`` says it fits (the service's budget), else
  refused as its head arrives like one over the limit; past the budget, a message under way
  in smaller frames is refused at the read that finds it so.

Routing ids follow a ROUTER's: the one the peer asked for (ZMTP's Identity) when it is free and
does not start with a zero byte, else one made here (a zero byte and four more). The security
mechanism is NULL: a peer that asks for CURVE (no ZPIPES client does) is refused.

Sends (:meth:`Endpoint.send`) are queued per connection and written at :meth:`Endpoint.flush`,
one gathered write per connection, without copying the frames (the transport's write path,
:mod:`zbroker.zmtp.server`, as is the read path with its turns and read sizes). A connection
whose replies are not taken (its transport's buffer over ``WRITE_HIGH``) is not read until
they are: what it can still be sent is the answers to requests taken before, which the ZPIPES
core bounds (one request and ``max_pipelined`` queued behind it; a READ's answer at most its
size, and at most what the pipe holds); what waits in the connections for their peers
(:meth:`unsent_bytes`) counts in the broker-wide budget, ``services.zpipes.max_buffered``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zbroker import zmtp
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.flow import ReadPolicy
from zbroker.zmtp.server import Link, Server
from zpipes.zmtp_framing import frame_head

#: bytes queued on a connection before it is no longer read (its replies are not taken): a
#: client that PINGs and never reads costs the broker what it takes to answer this many bytes
#: of PING_OKs (1 MiB: about 2 s of CPU here, 4 MiB: about 4 s), and a READ_OK of a large
#: chunk passes it at once without slowing a bulk stream (measured: no change at 1 MiB)
WRITE_HIGH = 1 << 20
#: the send buffer of an ipc connection (Linux's default is 208 KiB)
UNIX_SNDBUF = 1 << 20
#: a frame this large that comes in several reads is read into its own buffer (no copies)
DIRECT_MIN = 128 << 10
#: how a client's connection is read: not while its replies are not taken, a large WRITE's
#: chunk into its own buffer, reads sized to the requests (zbroker/zmtp/flow.py)
POLICY = ReadPolicy(read_while_full=False, direct_min=DIRECT_MIN)


class Endpoint(Server):
    """Connections of ZMTP peers to a ROUTER, on ``loop``.

    ``on_message(routing_id, frames)`` is called for each message, in order;
    ``on_refused(routing_id, refused)`` for one over the limits (:class:`zmtp.Refused`, in
    its turn among the messages: the rest of it is skipped as it arrives); ``on_gone(routing_id)``
    when a connection that had a routing id ends; ``after_input()`` after each read's messages.
    ``admission``: who may connect, and how many (:class:`zbroker.zmtp.admission.Admission`).
    ``admit_frame(size, source)``: why a frame of ``size`` bytes from ``source`` cannot be
    held (the service's budget), or None; asked with 0 after each read while a message is
    under way in small frames."""

    def __init__(self, loop: Any, *,
                 on_message: Callable[[bytes, list[Any]], None],
                 on_refused: Callable[[bytes, zmtp.Refused], None],
                 on_gone: Callable[[bytes], None],
                 after_input: Callable[[], None],
                 admission: Admission,
                 max_bytes: int, max_frames: int, log: Any,
                 admit_frame: Callable[[int, Any], str | None] | None = None):
        super().__init__(loop, admission, log, _Link, write_high=WRITE_HIGH,
                         unix_sndbuf=UNIX_SNDBUF, policy=POLICY)
        self.on_message, self.on_refused, self.on_gone = on_message, on_refused, on_gone
        self.after_input, self.admit_frame = after_input, admit_frame
        self.max_bytes, self.max_frames = max_bytes, max_frames

    # --- what the transport hands on --------------------------------------------------------

    def message(self, link: Link, message: zmtp.Message) -> None:
        self.on_message(link.routing_id, message.frames)  # type: ignore[arg-type]

    def refused(self, link: Link, refused: zmtp.Refused) -> None:
        self.on_refused(link.routing_id, refused)  # type: ignore[arg-type]

    def police(self, link: Link) -> None:
        # past the budget, a message under way in frames too small to have been asked about
        # (each under DIRECT_MIN) is let go too, as a large one is at its head
        admit = self.admit_frame
        if (link.incoming and not link.conn.receiving_large and admit is not None
                and (why := admit(0, link.source)) is not None):
            link.refuse(why)

    def after_read(self, link: Link, events: int) -> None:
        self.after_input()

    def unlinked(self, link: Any) -> None:
        self.on_gone(link.routing_id)

    # --- sending --------------------------------------------------------------------------

    def send(self, routing_id: bytes, frame: Any, first: bool = False) -> bool:
        """Queue a single-frame message for ``routing_id``; False if it has no connection.
        ``first``: its peer is idle until it arrives (it answers a request that waited):
        its connection is written before those that were only sent answers to what they just
        asked (a writer's WRITE_OK goes after the READ_OK its WRITE woke)."""
        link = self.links.get(routing_id)
        if link is None:
            return False
        self.queue(link, [frame_head(len(frame)), frame], len(frame), first)
        return True

    def incoming_bytes(self) -> int:
        """Bytes held of messages still arriving, on all connections."""
        return self.incoming

    def source_of(self, routing_id: bytes) -> Any:
        """Who ``routing_id``'s connection is from: ("uid", n) on ipc, ("host", address) on
        tcp; None if it has none."""
        link = self.links.get(routing_id)
        return None if link is None else link.source

    def set_max_bytes(self, max_bytes: int) -> None:
        """The limit of a message, from now on, on every connection."""
        self.max_bytes = max_bytes
        for link in self.all:
            link.conn.max_bytes = max_bytes

    def hang_up(self, routing_id: bytes) -> None:
        """Close ``routing_id``'s connection once what it was sent is written."""
        link = self.links.get(routing_id)
        if link is not None and link.transport is not None:
            self.flush()
            link.hang_up()


class _Link(Link):
    """One client's connection."""

    server: Endpoint

    def codec(self, server: Endpoint) -> zmtp.Connection:  # type: ignore[override]
        conn = zmtp.Connection(server.max_frames, server.max_bytes, keep_first=16,
                               writable=True, direct_min=server.policy.direct_min)
        admit = server.admit_frame
        if admit is not None:  # asked with this connection's source (known once connected)
            conn.admit = lambda size: admit(size, self.source)
        return conn

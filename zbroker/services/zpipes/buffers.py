"""The clients' buffers: what the broker holds of its clients' bytes, against the broker-wide
budget (``services.zpipes.max_buffered``) and each source's share of it
(``services.zpipes.max_buffered_per_source``). No I/O.

Four things count: the WRITE data of requests waiting or queued here (``held``, by source),
what the pipe table buffers for readers, and what the I/O layer holds, which it is asked for
through :class:`Outside` (the client endpoint is one): answers written to clients that have
not taken them, and messages still arriving (by source too). A WRITE is checked when it
arrives; a large one as its head arrives (the endpoint asks :meth:`Buffers.problem` before it
makes the frame's buffer)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from zbroker.runtime import shares

from .failures import Failure
from .pipes import PipeTable


class Outside(Protocol):
    """What the I/O layer holds of the clients' bytes, and who a client is."""

    def unsent_bytes(self) -> int:
        """Bytes answered to clients that have not taken them yet."""

    def incoming_bytes(self) -> int:
        """Bytes of messages still arriving from clients."""

    def incoming_of(self, source: Hashable) -> int:
        """The same, from ``source``'s connections."""

    def source_of(self, routing_id: bytes) -> Hashable:
        """Who a client's connection is from (a uid, a host): its writes count in its share."""


class NoOutside:
    """Nothing outside (a core without I/O, in tests)."""

    def unsent_bytes(self) -> int:
        return 0

    def incoming_bytes(self) -> int:
        return 0

    def incoming_of(self, source: Hashable) -> int:
        return 0

    def source_of(self, routing_id: bytes) -> Hashable:
        return None


class Buffers:
    """``max_buffered`` bytes for all clients, ``per_source`` for the clients of one source."""

    def __init__(self, pipes: PipeTable, max_buffered: int, per_source: int) -> None:
        self.pipes = pipes
        self.max_buffered, self.per_source = max_buffered, per_source
        self.held = 0  # bytes of WRITE data in requests waiting or queued, all clients
        self.held_by_source: dict[Hashable, int] = {}  # the same, by client source
        self.outside: Outside = NoOutside()

    def count(self, source: Hashable, change: int) -> None:
        """What ``source``'s clients' requests hold changed by ``change`` bytes."""
        self.held += change
        shares.count(self.held_by_source, source, change)

    def problem(self, size: int, source: Hashable = None) -> str | None:
        """Why ``size`` more bytes of a client of ``source`` cannot be held: the broker-wide
        budget, or its source's share of it; or None."""
        if self.over(size):
            return self.full_reason()
        return self.share_problem(source, size)

    def over(self, size: int) -> bool:
        outside = self.outside
        return (self.held + self.pipes.buffered + outside.unsent_bytes()
                + outside.incoming_bytes() + size > self.max_buffered)

    def share_problem(self, source: Hashable, size: int) -> str | None:
        """Why ``source`` cannot hold ``size`` more bytes (what its clients' WRITEs hold,
        waiting, queued or still arriving, past its share), or None."""
        share = self.per_source
        if self.held_by_source.get(source, 0) + self.outside.incoming_of(source) + size > share:
            return Failure(f"this user's or host's share of the broker's buffers is full "
                           f"(services.zpipes.max_buffered_per_source, {share} bytes)",
                           "buffers_full")
        return None

    def full_reason(self) -> str:
        return Failure(f"the broker's buffers for all clients are full "
                       f"(services.zpipes.max_buffered, {self.max_buffered} bytes)",
                       "buffers_full")

"""How a connection is read: how much at a time, and when it lets the others go first.

One loop thread serves every connection of every endpoint, and a read is handled whole before
the loop turns to anyone else; so what one connection may send in one read, and in one round
of the loop, is what every other one may have to wait. The rules, the same for every endpoint
(:mod:`zbroker.zmtp.server` applies them; an endpoint's :class:`ReadPolicy` sets its sizes):

- **Small reads for small messages.** A connection whose last read held many small messages
  is read next in a read sized for about ``SMALL_AFTER`` of them (at least ``MIN_READ``
  bytes); one whose messages are large is read as much as there is. A new connection's first
  read is ``SMALL_READ``: a new client's backlog is not taken whole (1 MiB of 5-byte PINGs is
  200 000 requests, handled before anyone else's).
- **Turns.** A connection that sent more than its turn's messages is not read again until the
  loop has gone round once. When many do so, they share ``ROUND_MESSAGES`` messages a round
  (each at least ``TURN_MIN``): the loop goes round often enough to greet new clients and to
  read the others (100 PINGers each taking 512 a round made a round 0.25 s: a new client
  waited 10 s for its greeting). The share is counted over every endpoint of the loop
  (:class:`Rounds`, one per loop), so that a flood spread over many endpoints is one crowd.

Nothing here does I/O: :class:`Rounds` is told when a connection used its turn and when the
round it did so in ended.
"""

from __future__ import annotations

import dataclasses

#: what one read from a connection may take at most: one buffer for all connections of a
#: loop, large enough that a window of big messages comes in a few reads (each a wake-up)
READ_SIZE = 1 << 20
#: a connection with small messages is read in reads sized for about SMALL_AFTER of them (at
#: least MIN_READ bytes; past SMALL_READ, as much as there is); SMALL_READ is a first read's
SMALL_READ, SMALL_AFTER, MIN_READ = 8 << 10, 64, 256
#: messages a connection may send before the others get their turn (when few others want it)
TURN_MESSAGES = 512
#: what floods share a round of the loop, each at least TURN_MIN (see the module's text)
ROUND_MESSAGES, TURN_MIN = 4096, 16


@dataclasses.dataclass(frozen=True)
class ReadPolicy:
    """How an endpoint's connections are read.

    ``read_while_full``: read a connection whose answers its peer does not take (its
    transport over its high mark) — True where answers are small and few for what is read (a
    producer's ACKs), False where a peer that asks and never reads would make the broker
    answer for ever (ZPIPES requests, a stream's or a monitor's). ``direct_min``: a frame this
    large that arrives in several reads is read into a buffer of its own, not copied (0:
    never). ``max_read``: the most one read takes. ``small_reads``: size reads to the
    messages (see the module's text)."""

    read_while_full: bool = False
    direct_min: int = 0
    max_read: int = READ_SIZE
    small_reads: bool = True

    @property
    def first_read(self) -> int:
        """What a new connection's first read takes (0: ``max_read``)."""
        return min(SMALL_READ, self.max_read) if self.small_reads else 0


def read_size(nbytes: int, messages: int) -> int:
    """How much to read next from a connection whose last read of ``nbytes`` held
    ``messages``: about SMALL_AFTER messages of that size (0: as much as there is)."""
    if messages <= 1:
        return 0
    size = nbytes * SMALL_AFTER // messages
    return max(size, MIN_READ) if size < SMALL_READ else 0


class Rounds:
    """The turns of the connections of one loop. :attr:`turn_messages` is what a connection
    may send before it yields; :meth:`took_turn` says one did (it yields until the round
    ends), and the round's end (:meth:`ended`, at the loop's next turn) sizes the turns of
    the next one for the crowd that yielded in this one."""

    def __init__(self) -> None:
        self.turn_messages = TURN_MESSAGES
        self.crowd = 0  # connections that yielded in this round

    def took_turn(self) -> bool:
        """A connection used its turn; True if it is the round's first (then call
        :meth:`ended` when the loop has gone round)."""
        self.crowd += 1
        return self.crowd == 1

    def ended(self) -> None:
        crowd, self.crowd = self.crowd, 0
        self.turn_messages = min(TURN_MESSAGES, max(TURN_MIN, ROUND_MESSAGES // crowd))

"""Service messages between brokers are numbered within a life: a gap is a loss. No I/O.

A peer's messages travel on one ZeroMQ connection, in order; but when that connection is reset
and made again, what was queued on it or in flight is gone, silently, and what is sent next
arrives on the new one. A service that is not told would take a stream with a hole in it for
a whole one. So between brokers whose HELLO says ``"numbered": true`` each service message
carries a *tag*: its number in the life (from 0) and the sender's session with the receiver
(the one its admitting HELLO named, membership.py), and each heartbeat PING the count of
messages sent in the life so far, under the same session. The receiver takes a message only
if it is the next one of the session it admitted; anything else (a message missing before
it, one of another session: a new life of the sender whose HELLO did not get here) ends the
life at once, on both sides (the receiver says BYE), and the services fail what was in flight
in it instead of going on with a hole. A PING that counts more messages than arrived says the
last ones were lost (nothing came after them to show the gap): the same.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_NUMBER = struct.Struct(">Q")
MAX_SESSION = 64  # bytes of a session in a tag


def session_bytes(session: str) -> bytes:
    """A session as it is in a tag."""
    return session.encode("ascii", "replace")[:MAX_SESSION]


@dataclass(slots=True)
class Numbering:
    """The numbers of one life of a peer, both ways."""

    ours: bytes  # our session with the peer (the one it admitted us with), as in a tag
    theirs: bytes  # its session with us (the one we admitted it with)
    sent: int = 0  # messages sent in this life
    received: int = 0  # messages taken in this life

    def next_tag(self) -> bytes:
        """The tag of the next message sent (counted as sent)."""
        tag = _NUMBER.pack(self.sent) + self.ours
        self.sent += 1
        return tag

    def count_tag(self) -> bytes:
        """What a PING says: the messages sent so far, and our session."""
        return _NUMBER.pack(self.sent) + self.ours

    def take(self, tag: bytes) -> str | None:
        """A message's tag: None if it is the next one (it is counted), else why not."""
        problem = self._check(tag, "message")
        if problem is None:
            self.received += 1
        return problem

    def check_count(self, tag: bytes) -> str | None:
        """A PING's count: None if every message it counts has arrived, else why not."""
        return self._check(tag, "count")

    def _check(self, tag: bytes, what: str) -> str | None:
        if len(tag) < _NUMBER.size:
            return f"invalid {what} tag"
        if tag[_NUMBER.size:] != self.theirs:
            return "a message of another session with us came (its new start did not get here)"
        number = _NUMBER.unpack_from(tag)[0]
        if number == self.received:
            return None
        if what == "count" and number > self.received:
            return (f"the last {number - self.received} of its messages were lost on the way "
                    f"({number} sent, {self.received} came)")
        if number > self.received:
            return (f"{number - self.received} of its messages were lost on the way "
                    f"(#{number} came, #{self.received} expected)")
        return f"its messages came out of order (#{number} came, #{self.received} expected)"

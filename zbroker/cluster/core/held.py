"""What waits for a numbered peer whose link is made again (a reset connection). No I/O.

A numbered peer's messages refused while its link is made again are held, in order, for at
most HOLD_SECONDS and HOLD_MESSAGES (and HOLD_BYTES), then the peer counts as unreachable;
what the reset took is noticed by the numbers (numbering.py), not by a refused send.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

HOLD_SECONDS = 1.0
HOLD_MESSAGES = 10_000
HOLD_BYTES = 64 << 20
HOLD_RETRY = 0.01  # seconds between tries to send what is held


@dataclasses.dataclass
class Held:
    """A peer's messages refused while its link was made again, in order."""

    since: float
    messages: collections.deque[list[Any]] = dataclasses.field(
        default_factory=collections.deque)
    size: int = 0  # their bytes

    def add(self, message: list[Any]) -> bool:
        """Hold ``message`` after the others; False if that is past the bounds."""
        if len(self.messages) >= HOLD_MESSAGES or self.size >= HOLD_BYTES:
            return False
        self.messages.append(message)
        self.size += sum(map(len, message))
        return True

    def send(self, send: Callable[[list[Any]], bool]) -> bool:
        """Hand the held messages, oldest first, to ``send`` until it refuses one; True if
        none is left."""
        messages = self.messages
        while messages and send(messages[0]):
            self.size -= sum(map(len, messages.popleft()))
        return not messages

"""Accepting on a listening socket from an asyncio loop: the one way the broker's own
listeners do it (the ZMTP endpoints, the metrics endpoint).

Every connection waiting is taken, up to ``ACCEPTS_PER_TURN`` a round of the loop (uvloop's
own server takes one a round: beside a flood, the hundredth waiting client was greeted a
hundred rounds later). When accepting fails for want of a resource (out of descriptors), it
rests ``ACCEPT_PAUSE_S``: the connections wait in the backlog meanwhile, and the loop does not
spin on a socket that stays readable.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from typing import Any

ACCEPTS_PER_TURN = 64  # connections taken before the loop has a turn
ACCEPT_PAUSE_S = 1.0  # seconds accepting rests after it failed for want of a resource
#: failures of one connection only (it went before it was taken): the next is taken
_ONE_GONE = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}


class Acceptor:
    """Accepts on ``sock`` (listening; made non-blocking here) from :meth:`start` to
    :meth:`stop`: ``take(conn, address)`` for each connection (non-blocking), and
    ``paused(exc)`` each time accepting rests after ``exc``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 take: Callable[[socket.socket, Any], None],
                 paused: Callable[[OSError], None]) -> None:
        self.loop, self.sock, self.take, self.paused = loop, sock, take, paused
        self._resume: asyncio.TimerHandle | None = None
        self._reading = False

    def start(self) -> None:
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._accept)
        self._reading = True

    def stop(self) -> None:
        """Accept no more (the socket stays open: its owner closes it)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _ONE_GONE:
                    continue
                self._rest(exc)
                return
            conn.setblocking(False)
            self.take(conn, address)

    def _rest(self, exc: OSError) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self._reading = False
        self._resume = self.loop.call_later(ACCEPT_PAUSE_S, self._again)
        self.paused(exc)

    def _again(self) -> None:
        self._resume = None
        self.start()

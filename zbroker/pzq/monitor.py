"""The monitor endpoint of a queue: MONITOR requests (REQ, wire.py) answered with its
counters (counters.py), as the original pzq does."""

from __future__ import annotations

from collections.abc import Callable

import zmq

from . import wire
from .sockets import Sockets

MONITOR_BUDGET = 100  # requests answered per turn of the loop


class Monitor:
    def __init__(self, sockets: Sockets, endpoint: str,
                 counters: Callable[[], dict[str, int]]):
        """A ROUTER bound to ``endpoint`` (read with the queue's other sockets); each
        request is answered with what ``counters()`` says then."""
        self.counters = counters
        self.sock = sockets.bind(zmq.ROUTER, endpoint, "monitor")
        sockets.read(self.sock, self._on_request, None, MONITOR_BUDGET)

    def _on_request(self, frames: list[bytes]) -> None:
        envelope = wire.split_monitor_request(frames[1:])
        if envelope is not None:
            try:
                self.sock.send_multipart(
                    [frames[0], *envelope, wire.monitor_text(self.counters())], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # that requester's connection is full or gone: it asks again

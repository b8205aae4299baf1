"""The monitor endpoint of a queue: MONITOR requests (REQ, wire.py) answered with its
counters (counters.py), as the original pzq does. A ROUTER served over the queue's ZMTP codec
(endpoints.py): a request past 64 frames or 64 KiB is let go of as it arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pzq import wire

from .endpoints import MAX_REQUEST, MAX_REQUEST_FRAMES, Drain, RouterEndpoint, bind

MONITOR_BUDGET = 100  # requests answered per turn of the loop


class Monitor:
    def __init__(self, loop: asyncio.AbstractEventLoop, counters: Callable[[], dict[str, int]],
                 log: Any, name: str):
        """Each request is answered with what ``counters()`` says then; bound by
        :meth:`start`."""
        self.counters, self.name = counters, name
        drain = Drain(loop, self._on_request, self._sent, MONITOR_BUDGET)
        self.endpoint = drain.endpoint = RouterEndpoint(
            loop, drain, log=log, name=name, role="monitor", max_frames=MAX_REQUEST_FRAMES,
            max_bytes=MAX_REQUEST, read_while_full=False)

    async def start(self, address: str) -> None:
        await bind(self.endpoint, address, "monitor", self.name)

    def close(self) -> None:
        self.endpoint.close()

    def _on_request(self, rid: bytes, frames: list[bytes], refused: str | None) -> None:
        envelope = wire.split_monitor_request(frames) if refused is None else None
        if envelope is not None:
            # that requester's connection is full or gone: dropped, it asks again
            self.endpoint.send(rid, [*envelope, wire.monitor_text(self.counters())])

    def _sent(self) -> None:
        self.endpoint.flush()

"""The stream endpoint of a stream queue: the readers' requests (HEAD, RANGE, COMMIT) go to
the stream core (stream.py), its answers go back, and the groups' offsets it asks to keep are
written to their file off the loop, then reported to it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import zmq

from . import stream
from .counters import Dropped
from .settings import QueueSettings
from .sockets import Sockets, send_frames

STREAM_BUDGET = 100  # requests served per turn of the loop (a RANGE answer can be large)


class StreamEndpoint:
    def __init__(self, core: stream.StreamCore, settings: QueueSettings, sockets: Sockets,
                 flush: Callable[[], None], log: Any, dropped: Dropped):
        """``flush``: carry out what the core asks, after each drain and each offsets
        write."""
        self.core, self.loop, self.log, self.dropped = core, sockets.loop, log, dropped
        self.flush, self.data_dir, self.name = flush, settings.data_dir, settings.name
        self.running = True  # False once the queue stops: late offsets writes are ignored
        self.sock = sockets.bind(zmq.ROUTER, settings.stream_endpoint, "stream")
        self._reader = sockets.read(self.sock, core.serve, flush, STREAM_BUDGET)

    def reply(self, frames: list[bytes]) -> None:
        """A StreamReply."""
        try:
            send_frames(self.sock, frames)
        except zmq.ZMQError:  # that reader's connection is full or gone: it asks again
            self.dropped.stream_replies += 1
        self._reader.recheck()

    def write_committed(self, offsets: stream.Offsets) -> None:
        """A WriteCommitted: the file is written in an executor, then reported."""
        future = self.loop.run_in_executor(None, stream.save_offsets, self.data_dir, offsets)
        future.add_done_callback(functools.partial(self._written, offsets))

    def _written(self, value: stream.Offsets, future: asyncio.Future[None]) -> None:
        if not self.running or future.cancelled():
            return  # stopping: the offsets file holds it; the log is cleaned at the next start
        error = None
        if (exc := future.exception()) is not None:
            error = f"commit failed: {getattr(exc, 'strerror', None) or exc}"
            self.log.warning("pzq stream commit failed", queue=self.name,
                             groups=value.groups, error=error)
        self.core.committed_written(value, error)
        self.flush()

    def next_wakeup(self) -> float | None:
        """When (the loop's clock) retention must look again, or None."""
        if (due_us := self.core.next_deadline()) is None:
            return None
        return self.loop.time() + max(0.0, (due_us - time.time_ns() / 1000) / 1e6)

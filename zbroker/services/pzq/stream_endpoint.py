"""The stream endpoint of a stream queue: the readers' requests (HEAD, RANGE, COMMIT) go to
the stream core (stream.py), its answers go back, and the groups' offsets it asks to keep are
written to their file off the loop, then reported to it. A ROUTER served over the queue's ZMTP
codec (endpoints.py): a request past 64 frames or 64 KiB is let go of as it arrives, and
counted as a stream error."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from zbroker.services.pzq.core import stream
from zbroker.services.pzq.core.counters import Dropped

from .endpoints import MAX_REQUEST, MAX_REQUEST_FRAMES, Drain, RouterEndpoint, bind
from .offsets_file import save_offsets
from .receiver import SENT
from .settings import QueueSettings

STREAM_BUDGET = 100  # requests served per turn of the loop (a RANGE answer can be large)


class StreamEndpoint:
    def __init__(self, core: stream.StreamCore, settings: QueueSettings,
                 loop: asyncio.AbstractEventLoop, flush: Callable[[], None], log: Any,
                 dropped: Dropped):
        """``flush``: carry out what the core asks, after each drain and each offsets
        write. Bound by :meth:`start`."""
        self.core, self.loop, self.log, self.dropped = core, loop, log, dropped
        self.flush, self.data_dir, self.name = flush, settings.data_dir, settings.name
        self.address = settings.stream_endpoint
        self.running = True  # False once the queue stops: late offsets writes are ignored
        drain = Drain(loop, self._on_request, flush, STREAM_BUDGET)
        self.endpoint = drain.endpoint = RouterEndpoint(
            loop, drain, log=log, name=settings.name, role="stream reader",
            max_frames=MAX_REQUEST_FRAMES, max_bytes=MAX_REQUEST, read_while_full=False)

    async def start(self) -> None:
        await bind(self.endpoint, self.address, "stream", self.name)

    def close(self) -> None:
        self.endpoint.close()

    def _on_request(self, rid: bytes, frames: list[bytes], refused: str | None) -> None:
        if refused is None:
            # a reader that does not take its answers (its connection full, or gone) is not
            # answered a question: the answer would be dropped after it was made
            core, unanswered = self.core, self.core.unanswered
            core.serve([rid, *frames], self.endpoint.room(rid) is SENT)
            self.dropped.stream_replies += core.unanswered - unanswered
        else:  # too large to be a request: nothing to answer to
            self.core.requests += 1
            self.core.errors += 1

    def reply(self, frames: list[bytes]) -> None:
        """A StreamReply (routing id first); sent at the flush that carries it out."""
        if self.endpoint.send(frames[0], frames[1:]) is not SENT:
            self.dropped.stream_replies += 1  # that reader's connection is full or gone
        self.endpoint.flush()

    def write_committed(self, offsets: stream.Offsets) -> None:
        """A WriteCommitted: the file is written in an executor, then reported."""
        future = self.loop.run_in_executor(None, save_offsets, self.data_dir, offsets)
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

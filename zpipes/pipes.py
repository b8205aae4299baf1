"""The pipe table: named pipes, their reader and writer ends, buffering and flow control.

No I/O and no clocks: every operation answers at once, and tells which *other* ends may now
get a different answer (``woken``), so that the caller can retry their pending requests.

Semantics (see docs/zpipes-semantics.md):

* A pipe exists while at least one end is attached; when the last end detaches the pipe and
  everything buffered in it are gone.
* A writer's stream starts with its first accepted chunk. Its *audience* is fixed then: the
  readers attached at that moment. Each of them gets every later chunk of that writer, whole and
  in order; a reader that attaches later never sees any of that writer's data (all or none).
* A write waits while the pipe has no reader (before the stream started) or while any reader
  of its audience holds ``capacity`` bytes or more. Once every reader of the audience has
  gone, the writer is broken: writes fail with "no readers".
* A reader gets end-of-stream when its buffer is empty, no writer is attached, and a writer was
  attached at some time while it was (a reader that opened first waits for a writer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

DEFAULT_CAPACITY = 1 << 20

Chunk = bytes | memoryview


class WriteResult(Enum):
    ACCEPTED = "accepted"
    WAIT = "wait"  # no reader yet, or a reader's buffer is full
    NO_READERS = "no readers"  # the audience has gone: like EPIPE


class ReadEnd(Enum):
    """Answers of :meth:`PipeTable.read` that are not data."""

    WAIT = "wait"
    END = "end"


@dataclass(eq=False)
class Reader:
    end: int
    pipe: Pipe
    chunks: deque[memoryview] = field(default_factory=deque)
    queued: int = 0  # bytes buffered for this reader
    saw_writer: bool = False
    bytes_in: int = 0  # bytes ever queued for this reader
    bytes_out: int = 0  # bytes ever read


@dataclass(eq=False)
class Writer:
    end: int
    pipe: Pipe
    started: bool = False
    audience: set[int] = field(default_factory=set)
    bytes_in: int = 0


@dataclass(eq=False)
class Pipe:
    name: bytes
    readers: dict[int, Reader] = field(default_factory=dict)
    writers: dict[int, Writer] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)  # ends whose last attempt had to wait

    def wake_all(self) -> set[int]:
        woken, self.waiting = self.waiting, set()
        return woken


class PipeTable:
    """All pipes of one broker. Ends are identified by ids the caller chooses (unique for the
    life of the table, never reused, so that a late event of a closed end cannot act on a new
    one)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.pipes: dict[bytes, Pipe] = {}
        self._readers: dict[int, Reader] = {}
        self._writers: dict[int, Writer] = {}

    # --- attach and detach -------------------------------------------------------------------

    def attach_reader(self, name: bytes, end: int) -> set[int]:
        self._check_new(end)
        pipe = self.pipes.setdefault(name, Pipe(name))
        reader = Reader(end, pipe, saw_writer=bool(pipe.writers))
        pipe.readers[end] = reader
        self._readers[end] = reader
        return pipe.wake_all()  # writers waiting for a first reader

    def attach_writer(self, name: bytes, end: int) -> set[int]:
        self._check_new(end)
        pipe = self.pipes.setdefault(name, Pipe(name))
        writer = Writer(end, pipe)
        pipe.writers[end] = writer
        self._writers[end] = writer
        for reader in pipe.readers.values():
            reader.saw_writer = True
        return set()

    def detach(self, end: int) -> set[int]:
        """Remove an end (reader or writer); what it had buffered is discarded."""
        if end in self._readers:
            reader = self._readers.pop(end)
            pipe = reader.pipe
            del pipe.readers[end]
            for writer in pipe.writers.values():
                writer.audience.discard(end)
        elif end in self._writers:
            pipe = self._writers.pop(end).pipe
            del pipe.writers[end]
        else:
            return set()
        pipe.waiting.discard(end)
        woken = pipe.wake_all()
        if not pipe.readers and not pipe.writers:
            del self.pipes[pipe.name]
        return woken

    # --- data --------------------------------------------------------------------------------

    def write(self, end: int, chunk: Chunk) -> tuple[WriteResult, set[int]]:
        """Offer one chunk. ACCEPTED queues it for every reader of the writer's audience."""
        writer = self._writers[end]
        pipe = writer.pipe
        if writer.started:
            if not writer.audience:
                return WriteResult.NO_READERS, set()
            audience = [pipe.readers[r] for r in writer.audience]
        else:
            audience = list(pipe.readers.values())
            if not audience:
                pipe.waiting.add(end)
                return WriteResult.WAIT, set()
        if any(reader.queued >= self.capacity for reader in audience):
            pipe.waiting.add(end)
            return WriteResult.WAIT, set()
        if not writer.started:
            writer.started = True
            writer.audience = {reader.end for reader in audience}
        view = memoryview(chunk)
        size = len(view)
        writer.bytes_in += size
        if size:
            for reader in audience:
                reader.chunks.append(view)
                reader.queued += size
                reader.bytes_in += size
        return WriteResult.ACCEPTED, pipe.wake_all()

    def read(self, end: int, size: int) -> tuple[list[memoryview] | ReadEnd, set[int]]:
        """Take up to ``size`` bytes (at least one) as a list of slices, or say END or WAIT."""
        reader = self._readers[end]
        pipe = reader.pipe
        if not reader.chunks:
            if reader.saw_writer and not pipe.writers:
                return ReadEnd.END, set()
            pipe.waiting.add(end)
            return ReadEnd.WAIT, set()
        taken: list[memoryview] = []
        want = size
        chunks = reader.chunks
        while want and chunks:
            head = chunks[0]
            if len(head) <= want:
                taken.append(chunks.popleft())
                want -= len(head)
            else:
                taken.append(head[:want])
                chunks[0] = head[want:]
                want = 0
        got = size - want
        was_full = reader.queued >= self.capacity
        reader.queued -= got
        reader.bytes_out += got
        woken = pipe.wake_all() if was_full and reader.queued < self.capacity else set()
        return taken, woken

    # --- questions ---------------------------------------------------------------------------

    def pipe_of(self, end: int) -> Pipe | None:
        owner = self._readers.get(end) or self._writers.get(end)
        return owner.pipe if owner else None

    def reader(self, end: int) -> Reader:
        return self._readers[end]

    def writer(self, end: int) -> Writer:
        return self._writers[end]

    def buffered_bytes(self) -> int:
        """Bytes held for all readers (a chunk fanned out to N readers counts N times)."""
        return sum(reader.queued for reader in self._readers.values())

    def _check_new(self, end: int) -> None:
        if end in self._readers or end in self._writers:
            raise ValueError(f"end {end} is already attached")

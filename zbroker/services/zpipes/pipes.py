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
* A reader gets end-of-stream when its buffer is empty, no writer is attached, and a writer
  closed while it was attached (a reader that opened first waits for a writer).
* A writer that ends in any other way than a close (``detach(end, failure)``: expired,
  disconnected, its broker lost, its stream broken by an over-size chunk) after its stream
  started breaks that stream: each reader of its audience gets the data it was sent, then fails
  with "writer lost: <why>" (``failure``), and takes no data from other writers from then on.
  A lost writer that had not started breaks nothing: it never was part of a stream. (But the
  pipe's only writer refused before its first byte fails the readers attached then: they
  would wait for ever for the stream it could not begin.)

Ends on other brokers of the cluster stand in the table as *remote* ends (proxies), so the
rules above hold cluster-wide:

* A remote reader is fed through ``outgoing``: each chunk accepted for it is handed to the caller
  to send, and counts against its capacity until the reader's broker gives ``credit`` back.
  A chunk is handed over once, with every remote reader it is for (the caller sends it once
  to each of their brokers); each of them still has a capacity and credit of its own, so the
  slowest bounds what is in flight to all. A remote reader's *window* (``set_window``: sized
  by the caller to its link) may let more than ``capacity`` be in flight to it: it bounds what
  its broker holds for it, however slowly it reads.
* A remote writer's chunks arrive through ``deliver``; the first one to a reader says that the
  reader is in its audience. What local readers take of remote data is returned as ``credits``.
* When a remote end's broker is lost (``detach(end, PEER_LOST)``), the ends whose stream it was
  part of break: a writer that was writing to it fails, a reader it was writing to fails after
  the data it got (its stream may be missing data); ``failure`` says why.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from zpipes.protocol import MAX_STRING

from .failures import PEER_LOST, WRITER_LOST, writer_lost

__all__ = ["DEFAULT_CAPACITY", "PEER_LOST", "WRITER_LOST", "PipeTable", "ReadEnd",
           "WriteResult", "pipe_name_problem", "shown"]

DEFAULT_CAPACITY = 1 << 20

Chunk = bytes | memoryview


class WriteResult(Enum):
    ACCEPTED = "accepted"
    WAIT = "wait"  # no reader yet, or a reader's buffer is full
    NO_READERS = "no readers"  # the audience has gone: like EPIPE
    FAILED = "failed"  # the stream broke (see the writer's ``failure``)


class ReadEnd(Enum):
    """Answers of :meth:`PipeTable.read` that are not data."""

    WAIT = "wait"
    END = "end"
    FAILED = "failed"  # the stream broke (see the reader's ``failure``)




def pipe_name_problem(name: bytes) -> str | None:
    """Why ``name`` cannot name a pipe, or None if it can (1..255 bytes of UTF-8)."""
    if not name:
        return "pipe name is empty"
    if len(name) > MAX_STRING:
        return "pipe name is longer than 255 bytes"
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return "pipe name is not valid UTF-8"
    return None


def shown(name: bytes | None) -> str | None:
    """A pipe name as logs show it."""
    return None if name is None else name.decode("utf-8", errors="backslashreplace")


@dataclass(eq=False)
class Reader:
    end: int
    pipe: Pipe
    remote: bool = False
    chunks: deque[memoryview] = field(default_factory=deque)
    origins: deque[int | None] = field(default_factory=deque)  # remote writer of each chunk
    queued: int = 0  # bytes buffered for this reader (remote: sent and not yet credited)
    window: int = 0  # (remote) bytes that may be in flight to it, if more than the capacity
    saw_close: bool = False  # a writer closed while this reader was attached
    failure: str | None = None  # its stream broke: it fails once it has read what it holds
    bytes_in: int = 0  # bytes ever queued for this reader
    bytes_out: int = 0  # bytes ever read


@dataclass(eq=False)
class Writer:
    end: int
    pipe: Pipe
    remote: bool = False
    started: bool = False
    audience: set[int] = field(default_factory=set)
    failure: str | None = None
    bytes_in: int = 0


@dataclass(eq=False)
class Pipe:
    name: bytes
    readers: dict[int, Reader] = field(default_factory=dict)
    writers: dict[int, Writer] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)  # ends whose last attempt had to wait
    held: int = 0  # while > 0, no local writer's stream starts (the caller's ``hold``)

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
        # chunks for remote readers: (writer end, first chunk of the stream?, chunk, the
        # remote readers it is for)
        self.outgoing: list[tuple[int, bool, memoryview, list[int]]] = []
        # bytes of remote writers' chunks taken by local readers: (writer end, reader end) -> n
        self.credits: dict[tuple[int, int], int] = {}
        #: bytes held for local readers (a chunk fanned out to N readers counts N times)
        self.buffered = 0

    # --- attach and detach -------------------------------------------------------------------

    def has_local_end(self, end: int, name: bytes) -> bool:
        """Whether ``end`` is an end of this broker's (not a remote one) on pipe ``name``."""
        owner = self._readers.get(end) or self._writers.get(end)
        return owner is not None and not owner.remote and owner.pipe.name == name

    def attach_reader(self, name: bytes, end: int, remote: bool = False) -> set[int]:
        self._check_new(end)
        pipe = self.pipes.setdefault(name, Pipe(name))
        reader = Reader(end, pipe, remote=remote)
        pipe.readers[end] = reader
        self._readers[end] = reader
        return pipe.wake_all()  # writers waiting for a first reader

    def attach_writer(self, name: bytes, end: int, remote: bool = False) -> set[int]:
        self._check_new(end)
        pipe = self.pipes.setdefault(name, Pipe(name))
        writer = Writer(end, pipe, remote=remote)
        pipe.writers[end] = writer
        self._writers[end] = writer
        return set()

    def detach(self, end: int, failure: str | None = None) -> set[int]:
        """Remove an end (reader or writer); what it had buffered is discarded. ``failure``:
        why the end was lost, None when it closed. A writer lost, or closed after its stream
        broke, breaks the stream of each reader of its audience; a remote reader lost with its
        broker breaks the stream of each writer that was writing to it."""
        if end in self._readers:
            reader = self._readers.pop(end)
            pipe = reader.pipe
            del pipe.readers[end]
            if not reader.remote:
                self.buffered -= reader.queued
            for writer in pipe.writers.values():
                if end in writer.audience:
                    writer.audience.discard(end)
                    if failure is not None and reader.remote and writer.failure is None:
                        writer.failure = failure
        elif end in self._writers:
            writer = self._writers.pop(end)
            pipe = writer.pipe
            del pipe.writers[end]
            failure = failure or writer.failure
            if failure is None:
                for reader in pipe.readers.values():
                    reader.saw_close = True
            else:
                self._break_audience(writer, failure)
        else:
            return set()
        pipe.waiting.discard(end)
        woken = pipe.wake_all()
        if not pipe.readers and not pipe.writers:
            del self.pipes[pipe.name]
        return woken

    def break_writer(self, end: int, failure: str) -> set[int]:
        """The writer's stream is broken (e.g. it sent a chunk over the limit): its writes fail
        with ``failure`` from now on and its readers fail once they have read what it sent."""
        writer = self._writers[end]
        if writer.failure is None:
            writer.failure = failure
        if not writer.started and len(writer.pipe.writers) == 1:
            # the pipe's only writer, refused before its first byte: its readers are told
            # (they would wait for a writer for ever), as if its stream had begun
            writer.audience = {r.end for r in writer.pipe.readers.values()
                               if r.failure is None}
        self._break_audience(writer, failure)
        return writer.pipe.wake_all()

    def _break_audience(self, writer: Writer, failure: str) -> None:
        pipe = writer.pipe
        audience, writer.audience = writer.audience, set()
        for reader_end in audience:
            reader = pipe.readers.get(reader_end)
            if reader is not None and reader.failure is None:
                reader.failure = writer_lost(failure)
                for other in pipe.writers.values():  # it takes nothing more from anyone
                    other.audience.discard(reader_end)

    # --- data --------------------------------------------------------------------------------

    def write(self, end: int, chunk: Chunk) -> tuple[WriteResult, set[int]]:
        """Offer one chunk. ACCEPTED queues it for every reader of the writer's audience."""
        writer = self._writers[end]
        pipe = writer.pipe
        if writer.failure is not None:
            return WriteResult.FAILED, set()
        if pipe.held and not writer.started:
            pipe.waiting.add(end)
            return WriteResult.WAIT, set()
        if writer.started:
            if not writer.audience:
                return WriteResult.NO_READERS, set()
            audience = [pipe.readers[r] for r in writer.audience]
        else:
            audience = [r for r in pipe.readers.values() if r.failure is None]
            if not audience:
                pipe.waiting.add(end)
                return WriteResult.WAIT, set()
        capacity = self.capacity
        if any(reader.queued >= capacity and reader.queued >= reader.window
               for reader in audience):
            pipe.waiting.add(end)
            return WriteResult.WAIT, set()
        first = not writer.started
        if first:
            writer.started = True
            writer.audience = {reader.end for reader in audience}
        view = memoryview(chunk)
        size = len(view)
        writer.bytes_in += size
        remote: list[int] = []
        for reader in audience:
            if reader.remote:
                remote.append(reader.end)
            elif size:
                reader.chunks.append(view)
                reader.origins.append(None)
                self.buffered += size
            reader.queued += size
            reader.bytes_in += size
        if remote and (size or first):  # the first chunk goes out even when empty: it starts
            self.outgoing.append((end, first, view, remote))  # the stream
        return WriteResult.ACCEPTED, pipe.wake_all()

    def read(self, end: int, size: int) -> tuple[list[memoryview] | ReadEnd, set[int]]:
        """Take up to ``size`` bytes (at least one) as a list of slices, or say END, WAIT or,
        once what it holds is read, FAILED."""
        reader = self._readers[end]
        pipe = reader.pipe
        if not reader.chunks:
            if reader.failure is not None:
                return ReadEnd.FAILED, set()
            if reader.saw_close and not pipe.writers:
                return ReadEnd.END, set()
            pipe.waiting.add(end)
            return ReadEnd.WAIT, set()
        taken: list[memoryview] = []
        want = size
        chunks, origins = reader.chunks, reader.origins
        while want and chunks:
            head = chunks[0]
            if len(head) <= want:
                piece = chunks.popleft()
                origin = origins.popleft()
            else:
                piece = head[:want]
                chunks[0] = head[want:]
                origin = origins[0]
            taken.append(piece)
            want -= len(piece)
            if origin is not None:
                key = (origin, end)
                self.credits[key] = self.credits.get(key, 0) + len(piece)
        got = size - want
        was_full = reader.queued >= self.capacity
        reader.queued -= got
        reader.bytes_out += got
        self.buffered -= got
        woken = pipe.wake_all() if was_full and reader.queued < self.capacity else set()
        return taken, woken

    def set_capacity(self, capacity: int) -> set[int]:
        """A new capacity per reader. Every waiting end is woken: a writer that waited for
        room may have it now (the wake-ups on reads only fire when a reader drops below the
        capacity, which a raised capacity skips)."""
        self.capacity = capacity
        woken: set[int] = set()
        for pipe in self.pipes.values():
            woken |= pipe.wake_all()
        return woken

    def saw_close(self, reader_ends: list[int]) -> set[int]:
        """A remote writer that was attached to these local readers closed, and both its
        attachment and its close are learned only now: for them only, as ``detach`` of a
        writer that closed."""
        woken: set[int] = set()
        for end in reader_ends:
            reader = self._readers.get(end)
            if reader is not None and not reader.remote:
                reader.saw_close = True
                woken |= reader.pipe.wake_all()
        return woken

    def hold(self, name: bytes) -> None:
        """No local writer of the pipe (it has an end) starts its stream until ``release``:
        the caller is still learning which readers elsewhere are attached."""
        self.pipes[name].held += 1

    def release(self, name: bytes) -> set[int]:
        pipe = self.pipes.get(name)
        if pipe is None or not pipe.held:
            return set()
        pipe.held -= 1
        return set() if pipe.held else pipe.wake_all()

    # --- remote ends ---------------------------------------------------------------------------

    def deliver(self, writer_end: int, reader_end: int, first: bool, chunk: Chunk) -> set[int]:
        """A chunk of a remote writer for a local reader. Chunks for ends that are gone, or for
        a reader that is not in the writer's audience (or whose stream broke), are dropped; a
        dropped chunk for a reader still here is credited back at once, so that the writer's
        broker does not wait for room that will never be made."""
        writer = self._writers.get(writer_end)
        reader = self._readers.get(reader_end)
        if (writer is None or reader is None or not writer.remote or reader.remote
                or reader.pipe is not writer.pipe):
            return set()
        view = memoryview(chunk)
        if first and reader.failure is None:
            writer.started = True
            writer.audience.add(reader_end)
        elif reader_end not in writer.audience:
            if len(view):
                key = (writer_end, reader_end)
                self.credits[key] = self.credits.get(key, 0) + len(view)
            return set()
        if len(view):
            reader.chunks.append(view)
            reader.origins.append(writer_end)
            reader.queued += len(view)
            self.buffered += len(view)
            reader.bytes_in += len(view)
            writer.bytes_in += len(view)
        return reader.pipe.wake_all()

    def credit(self, reader_end: int, size: int) -> set[int]:
        """A remote reader's broker says the reader took ``size`` more bytes."""
        reader = self._readers.get(reader_end)
        if reader is None or not reader.remote:
            return set()
        limit = max(self.capacity, reader.window)
        was_full = reader.queued >= limit
        reader.queued = max(0, reader.queued - size)
        reader.bytes_out += size
        return reader.pipe.wake_all() if was_full and reader.queued < limit else set()

    def set_window(self, reader_end: int, window: int) -> set[int]:
        """How many bytes may be in flight to a remote reader (at least the capacity, whatever
        this says): what its link needs to carry a stream at full speed."""
        reader = self._readers.get(reader_end)
        if reader is None or not reader.remote or reader.window == window:
            return set()
        grew = window > reader.window
        reader.window = window
        return reader.pipe.wake_all() if grew else set()

    def take_outgoing(self) -> list[tuple[int, bool, memoryview, list[int]]]:
        out, self.outgoing = self.outgoing, []
        return out

    def take_credits(self) -> dict[tuple[int, int], int]:
        out, self.credits = self.credits, {}
        return out

    # --- questions ---------------------------------------------------------------------------

    def failure(self, end: int) -> str | None:
        owner = self._readers.get(end) or self._writers.get(end)
        return owner.failure if owner else None

    def local_ends(self) -> list[tuple[str, bytes, int]]:
        """(role, pipe name, end) of every local end, for a peer that joins."""
        ends = [("reader", r.pipe.name, e) for e, r in self._readers.items() if not r.remote]
        ends += [("writer", w.pipe.name, e) for e, w in self._writers.items() if not w.remote]
        return ends

    def pipe_of(self, end: int) -> Pipe | None:
        owner = self._readers.get(end) or self._writers.get(end)
        return owner.pipe if owner else None

    def reader(self, end: int) -> Reader:
        return self._readers[end]

    def writer(self, end: int) -> Writer:
        return self._writers[end]

    def buffered_bytes(self) -> int:
        """Bytes held for local readers, counted afresh (``buffered`` keeps it as it goes)."""
        return sum(r.queued for r in self._readers.values() if not r.remote)

    def _check_new(self, end: int) -> None:
        if end in self._readers or end in self._writers:
            raise ValueError(f"end {end} is already attached")

"""The pzq store: an append-only segmented log with group commit, written by the process's
writer threads (writers.py).

The event loop calls :meth:`Store.append` and :meth:`Store.ack`; they only queue records in
memory. A writer thread, in the store's turn, takes what has queued, writes it to the current
segment with one ``write`` and (unless ``sync: none``) one ``fdatasync``, then reports a
:class:`BatchResult` through the ``notify`` callable (which the caller makes thread-safe).
Producer ACKs go out on that report, so the event loop never waits for the disk. When to
write and what to take (the sync modes, the window, batches of at most ``max_batch_bytes``,
the backoff after a failed write) is the group-commit policy's (group_commit.py): each turn
asks it, and says when the next is due.

Write avoidance: a message ACKed by its consumer while its record is still queued (not yet
taken by the writer) is never written, nor is its ACK record; its batch still completes, so
its producer still gets its ACK. ``avoided_messages`` / ``avoided_bytes`` count this.

Write errors (disk full, read-only, no permission): the batch fails (its producers are
answered "0", its ACK records are queued again) and the writer waits before the next write
(the policy's backoff, doubling while writes keep failing); it logs "store write
failing" once with the error and "store writable again" with the number of failed writes when
one succeeds. While failing it writes on in the segment it has (cut back to its last good
record after each failure) and creates no new segment file. Segments whose messages are all
ACKed are still deleted meanwhile (that frees space even before the ACK records are written:
a deleted MESSAGE record needs no ACK record), the current one too while writes fail: the
next write then starts a new segment file.

Retention: a segment is deleted once it and every older segment hold no unACKed message
(ACK records always come after the message they ACK, so dropping the oldest segments never
brings back an ACKed message). The writer starts a new segment when the current one passes
``segment_size``, and after each start. Compaction: when a few old unACKed messages hold more
than twice the backlog on disk, the live messages of the oldest segment are written again at
the head (same seq; recovery keeps one copy), and the segment goes once they are written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

from zbroker.runtime.iovec import gather
from zbroker.runtime.stats import BATCH_BOUNDS, Buckets
from zbroker.services.pzq.core import records
from zbroker.services.pzq.core.actions import Append, BatchResult
from zbroker.services.pzq.core.group_commit import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_SYNC,
    DEFAULT_SYNC_WINDOW,
    GroupCommit,
)
from zbroker.services.pzq.writers import DONE, Writers
from zbroker.services.pzq.writers import shared as shared_writers

DEFAULT_SEGMENT_SIZE = 64 << 20  # a Store's default, and so a queue's (zbroker.services.pzq.config)
SUFFIX = ".seg"
GATHER_MIN = 4096  # parts this large are written from where they are, not copied
IOV_MAX = 1024
STOP_TIMEOUT = 10.0


def _open_lock_file(directory: Path) -> int:
    """Create ``directory`` if need be and open its lock file. An OSError says which path
    failed and why, in its strerror (which callers print): "/etc/passwd is not a
    directory", "cannot create /proc/lock: No such file or directory"."""
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{directory} exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot create the directory {directory}: "
                                   f"{exc.strerror}") from None
    lock = directory / "lock"
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        why = exc.strerror
        if exc.errno == errno.ENOENT:  # the directory is there: a file system like /proc
            why = "the directory's file system does not let files be created there"
        raise type(exc)(exc.errno, f"cannot create {lock}: {why}") from None


class StoreInUse(OSError):
    """Another process has the store open."""


@dataclass(slots=True)
class _Entry:
    seq: int  # the first of ``count`` seqs (a producer's batch: one BATCH record)
    batch: int
    parts: list[bytes] | None  # the payload; None: a MESSAGE record not encoded yet
    size: int
    at: float
    alive: bool = True
    avoided: bool = False  # ACKed before it was written: never written (not a move)
    count: int = 1
    #: seqs of a BATCH record ACKed while it waited: ACK records follow it in its write
    acked: list[int] | None = None
    #: a MESSAGE record's (key, msg id, frames), encoded by the writer if it writes it (most
    #: are ACKed first: write avoidance, and then never encoded)
    message: tuple[bytes, bytes, Sequence[bytes]] | None = None

    def seqs(self) -> range:
        return range(self.seq, self.seq + self.count)

    def payload(self) -> list[bytes]:
        """The record's payload, as parts (a MESSAGE record: encoded now)."""
        if self.parts is not None:
            return self.parts
        return records.message_parts(self.seq, *self.message)


def _message_entry(seq: int, key: bytes, msg_id: bytes, frames: Sequence[bytes]) -> _Entry:
    """A MESSAGE record to queue, not encoded yet (the writer encodes it if it writes it)."""
    size = records.message_size(key, msg_id, frames) + records.HEADER.size
    return _Entry(seq, 0, None, size, 0.0, message=(key, msg_id, frames))


def _batch_runs(entries: list[_Entry | None]) -> list[tuple[_Entry, int, int]] | None:
    """(entry, start, end) for each run of ``entries`` that is one waiting BATCH record, if
    every entry is one and each record's run is in one piece (a batch consumer's ACK of
    what it was sent, in order); else None."""
    ids = list(map(id, entries))
    runs = []
    start = 0
    while start < len(entries):
        entry = entries[start]
        if entry is None or entry.count == 1:
            return None
        end = start + ids.count(ids[start])
        if ids[start:end].count(ids[start]) != end - start:
            return None
        runs.append((entry, start, end))
        start = end
    return runs


@dataclass
class Recovered:
    """What :meth:`Store.open` found on disk."""

    messages: list[records.MessageRecord] = field(default_factory=list)  # unACKed, by seq
    next_seq: int = 0
    segments: int = 0
    truncated_bytes: int = 0
    acked: int = 0


def _writev_all(fd: int, buffers: list[bytes]) -> None:
    """Write every buffer, in order, with as few writev calls as the kernel allows."""
    i = 0
    while i < len(buffers):
        chunk = buffers[i:i + IOV_MAX]
        n = os.writev(fd, chunk)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        for b in chunk:
            if n >= len(b):
                n -= len(b)
                i += 1
            else:  # a short write: go on from inside this buffer
                buffers[i] = memoryview(b)[n:]
                break


def segment_name(number: int) -> str:
    return f"{number:016d}{SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    out = []
    for p in directory.iterdir():
        if p.name.endswith(SUFFIX) and p.name[:-len(SUFFIX)].isdigit():
            out.append(int(p.name[:-len(SUFFIX)]))
    return sorted(out)


class Store:
    def __init__(self, directory: str | os.PathLike[str], *, sync: str = DEFAULT_SYNC,
                 sync_window: float = DEFAULT_SYNC_WINDOW,
                 segment_size: int = DEFAULT_SEGMENT_SIZE,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, log: Any = None,
                 clock: Callable[[], float] = time.monotonic):
        policy = GroupCommit(sync, sync_window, max_batch_bytes)  # checks the settings
        self.directory = Path(directory)
        #: the time the group-commit policy is given (seconds; a test's clock can be moved
        #: by hand: give the store writer threads of the same clock, Writers(clock=...))
        self._clock = clock
        self.sync = sync
        self.segment_size = segment_size
        self.log = log
        # shared with the writer thread, under _cond
        self._cond = threading.Condition()
        self._policy = policy  # when the writer writes, and what it takes
        self._pending: list[_Entry] = []
        self._pending_by_seq: dict[int, _Entry] = {}
        self._pending_acks: list[int] = []
        self._pending_bytes = 0
        self._delete_below = -1
        self._delete_current = -1  # good_writes the loop had seen when it let the current go
        self._stopping = False
        # writer thread only
        self._fd = -1
        self._segment = -1
        self._segment_size_now = 0
        self._next_segment = 0
        self._dir_fd = -1
        self._lock_fd = -1
        self._dirty = False  # a failed write may have left part of a record at the end
        self._good_writes = 0
        self.failing = 0  # failed writes since the last good one (written by the writer)
        # event loop side
        self._live: dict[int, int] = {}  # seq -> segment holding its record
        self._seg_live: dict[int, int] = {}  # segment -> number of live messages in it
        self._seg_bytes: dict[int, int] = {}
        self._acked_writing: set[int] = set()
        self._moving: set[int] = set()
        self._compacting: int | None = None
        self._writer_segment = -1
        self._seen_good = 0  # good_writes of the last result taken
        self._deleted_below = -1
        self._writers: Writers | None = None  # whose threads write it, once started
        self._stopped = threading.Event()  # its last turn is over
        self._notify: Callable[[BatchResult], None] | None = None
        # counters (loop side, except those the writer adds; ints are updated atomically)
        self.syncs = 0
        #: messages written by each fdatasync (the writer observes, metrics read a snapshot)
        self.sync_batches = Buckets(BATCH_BOUNDS)
        self.bytes_written = 0
        self.records_written = 0
        self.avoided_messages = 0
        self.avoided_bytes = 0
        self.failed_batches = 0
        self.deleted_segments = 0
        self.moved_messages = 0
        self.last_error: str | None = None

    # --- opening --------------------------------------------------------------------------

    def open(self) -> Recovered:
        """Read the log: every unACKed message, in seq order. Truncates a torn or corrupt
        tail of any segment. Blocking: run it before start (or in an executor)."""
        self._lock_fd = _open_lock_file(self.directory)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreInUse(f"{self.directory} is in use by another process") from None
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        found = Recovered()
        messages: dict[int, tuple[records.MessageRecord, int]] = {}
        acked: set[int] = set()
        max_seq = -1
        segments = list_segments(self.directory)
        for number in segments:
            path = self.directory / segment_name(number)
            data = path.read_bytes()
            good = 0
            for end, record in records.scan(data):
                good = end
                if isinstance(record, records.MessageRecord):
                    max_seq = max(max_seq, record.seq)
                    if record.seq not in acked:
                        messages[record.seq] = (record, number)
                else:
                    for seq in record.seqs:
                        acked.add(seq)
                        if messages.pop(seq, None) is not None:
                            found.acked += 1
            if good < len(data):
                found.truncated_bytes += len(data) - good
                if self.log is not None:
                    self.log.warning("pzq log: torn or corrupt tail truncated",
                                     segment=str(path), offset=good,
                                     dropped_bytes=len(data) - good)
                with open(path, "r+b") as f:
                    f.truncate(good)
                    f.flush()
                    os.fsync(f.fileno())
            self._seg_bytes[number] = good
            self._seg_live.setdefault(number, 0)
        for seq in sorted(messages):
            record, number = messages[seq]
            found.messages.append(record)
            self._live[seq] = number
            self._seg_live[number] += 1
        found.next_seq = max_seq + 1
        found.segments = len(segments)
        self._next_segment = (segments[-1] + 1) if segments else 0
        return found

    def start(self, notify: Callable[[BatchResult], None],
              writers: Writers | None = None) -> None:
        """Start writing, in turns on ``writers`` (the process's writer threads by default:
        writers.py); ``notify(result)`` is called from a writer thread after each write."""
        if self._dir_fd < 0:
            raise RuntimeError("open() the store first")
        self._notify = notify
        self._writers = writers or shared_writers()
        self._writers.add(self)
        self._collect()

    def close(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Write what is queued, stop writing; True if that was done within ``timeout``."""
        with self._cond:
            self._stopping = True
            self._wake()
        stopped = True
        if self._writers is not None:
            stopped = self._stopped.wait(timeout)
        if stopped:
            self._close_segment()
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the lock
                self._lock_fd = -1
        return stopped

    def _wake(self) -> None:
        """There is work for the writer (called with ``_cond`` held)."""
        if self._writers is not None:
            self._writers.wake(self)

    # --- the event loop's side -------------------------------------------------------------

    def append(self, seq: int, key: bytes, msg_id: bytes, frames: Sequence[bytes]) -> int:
        """Queue a message record; returns the number of the batch that will hold it."""
        return self._queue([_message_entry(seq, key, msg_id, frames)])

    def append_many(self, appends: Sequence[Append]) -> None:
        """:meth:`append` for each of ``appends`` (Append actions for this log), in order,
        under one lock."""
        self._queue([_message_entry(a.seq, a.key, a.msg_id, a.frames) for a in appends])

    def append_batch(self, first_seq: int, count: int, key_base: bytes, packed: bytes) -> int:
        """Queue a producer's batch as one BATCH record (records.py): ``count`` messages
        with the seqs from ``first_seq`` on, ``packed`` as it came (wire.pack)."""
        parts = records.batch_parts(first_seq, key_base, packed)
        size = sum(map(len, parts)) + records.HEADER.size
        return self._queue([_Entry(first_seq, 0, parts, size, 0.0, count=count)])

    def _queue(self, entries: list[_Entry]) -> int:
        """Queue ``entries`` in order, under one lock (their batch and time are set here);
        returns the last one's batch."""
        now = self._clock()
        record, by_seq = self._policy.record, self._pending_by_seq
        with self._cond:
            wake = False
            for entry in entries:
                entry.batch, woke = record(entry.size, now)
                entry.at = now
                wake = wake or woke
                if entry.count == 1:
                    by_seq[entry.seq] = entry
                else:
                    entry.acked = []
                    by_seq.update(dict.fromkeys(entry.seqs(), entry))
                self._pending_bytes += entry.size
            if wake:
                self._wake()
            self._pending.extend(entries)
        return entries[-1].batch

    def ack(self, seq: int) -> range | None:
        """The consumer is done with message ``seq``: make that durable (or, if its record
        is still queued, drop the record: write avoidance). Returns the seqs of the record
        so dropped, which will never be written (a batch record: once all of it is ACKed),
        or None."""
        dropped = self.ack_many((seq,))
        return dropped[0] if dropped else None

    def ack_many(self, seqs: Iterable[int]) -> list[range]:
        """:meth:`ack` for each of ``seqs``, under one taking of the lock: the seqs of the
        records so dropped (never to be written)."""
        live, moving, pending = self._live, self._moving, self._pending_by_seq
        dropped: list[range] = []
        settle: list[tuple[int, _Entry | None]] = []  # ACK records: their segments' counts
        batches: dict[int, tuple[_Entry, int]] = {}  # id -> a BATCH record waiting, and
        # how many of its seqs were ACKed before
        count = 0
        avoiding = False
        now = self._clock()
        seqs = list(seqs)
        with self._cond:
            acks = self._pending_acks  # (the writer takes this list and leaves a new one:
            # read it under the lock, or an ACK may go to a list already written)
            entries = list(map(pending.pop, seqs, repeat(None)))
            runs = _batch_runs(entries)
            if runs:  # a batch consumer's ACK of waiting BATCH records
                for entry, start, end in runs:
                    before = len(entry.acked)
                    entry.acked.extend(seqs[start:end])
                    if (batch := self._acked_in_batch(entry, before)) is not None:
                        dropped.append(batch)
                if self._policy.ack(now, True, len(seqs)):
                    self._wake()
                return dropped
            for seq, entry in zip(seqs, entries, strict=True):
                count += 1
                moved = seq in live or seq in moving  # on disk already, being moved
                if entry is not None and not moved:
                    avoiding = True
                if entry is not None and entry.count > 1:
                    if id(entry) not in batches:
                        batches[id(entry)] = (entry, len(entry.acked))
                    entry.acked.append(seq)
                    continue
                if entry is not None:
                    entry.alive = False
                    self._pending_bytes -= entry.size
                    if not moved:
                        entry.avoided = True
                        self.avoided_messages += 1
                        self.avoided_bytes += entry.size
                        dropped.append(range(seq, seq + 1))
                        continue
                acks.append(seq)
                settle.append((seq, entry))
            for entry, before in batches.values():
                if (batch := self._acked_in_batch(entry, before)) is not None:
                    dropped.append(batch)
            if count and self._policy.ack(now, avoiding, count):
                self._wake()
        for seq, entry in settle:  # (the event loop's own bookkeeping: no lock needed)
            segment = live.pop(seq, None)
            if segment is not None:
                self._seg_live[segment] -= 1
            if entry is not None:  # a move not yet taken by the writer: dropped
                moving.discard(seq)
            elif segment is None or seq in moving:
                self._acked_writing.add(seq)  # being written now: placed by complete()
        return dropped

    def _acked_in_batch(self, entry: _Entry, before: int) -> range | None:
        """(Under the lock.) Seqs of a BATCH record not yet taken by the writer were ACKed
        (``entry.acked`` past ``before``): an ACK record follows the batch in its write,
        unless every message of it is ACKed: then none of it is written (write
        avoidance), and its seqs are returned."""
        if len(entry.acked) < entry.count:
            self._acked_writing.update(entry.acked[before:])  # written with their batch:
            return None  # placed by complete()
        entry.alive = False
        entry.avoided = True
        self._pending_bytes -= entry.size
        self.avoided_messages += entry.count
        self.avoided_bytes += entry.size
        self._acked_writing.difference_update(entry.acked[:before])
        return entry.seqs()

    def move(self, seq: int, key: bytes, msg_id: bytes, frames: Sequence[bytes]) -> None:
        """Write live message ``seq`` again at the head of the log (compaction), so that the
        old segment holding it can go."""
        self._moving.add(seq)
        self.append(seq, key, msg_id, frames)
        self.moved_messages += 1

    def to_compact(self, backlog_bytes: int) -> list[int]:
        """The live messages of the oldest segment, when the log has grown past twice the
        backlog (plus two segments) because old segments are held by a few unACKed messages:
        the caller moves them (:meth:`move`), then that segment is deleted."""
        if self._compacting is not None or len(self._seg_live) < 3:
            return []
        if self.disk_bytes <= 2 * backlog_bytes + 2 * self.segment_size:
            return []
        oldest = min(self._seg_live)
        if oldest == self._writer_segment:
            return []
        self._compacting = oldest
        return sorted(seq for seq, segment in self._live.items() if segment == oldest)

    def complete(self, result: BatchResult) -> None:
        """Bookkeeping after a write (called on the event loop with each result)."""
        self._seen_good = max(self._seen_good, result.good_writes)
        if result.error is not None:
            self.failed_batches += 1
            self.last_error = result.error
            for seq in result.failed:
                self._acked_writing.discard(seq)
                self._moving.discard(seq)
            self._compacting = None
            if result.failed_acks:  # ACKs must not be lost: queue them again
                with self._cond:
                    self._pending_acks.extend(result.failed_acks)
                    self._policy.ack(self._clock())
                    self._wake()
            self._collect()  # segments with nothing unACKed left can go: it frees space
            return
        self.last_error = None
        segment = result.segment
        if segment >= 0:
            self._writer_segment = segment
            self._seg_bytes[segment] = result.segment_bytes
            self._seg_live.setdefault(segment, 0)
        for seq in result.placed:
            self._moving.discard(seq)
            if seq in self._acked_writing:
                self._acked_writing.discard(seq)
                continue
            old = self._live.get(seq)
            if old is not None:  # moved: it leaves its old segment
                self._seg_live[old] -= 1
            self._live[seq] = segment
            self._seg_live[segment] += 1
        self._collect()
        if self._compacting is not None and self._compacting not in self._seg_live:
            self._compacting = None  # that segment is gone

    def _collect(self) -> None:
        """Ask the writer to delete the oldest segments that hold no live message."""
        below = -1
        current = False
        for segment in sorted(self._seg_live):
            if self._seg_live[segment] > 0:
                break
            if segment == self._writer_segment:
                # while writes fail, the current segment can go too (it frees the space the
                # ACK records cannot be written to); the writer checks that no good write
                # came since the results seen here
                if not self.failing or self._seg_bytes.get(segment, 0) == 0:
                    break
                current = True
            below = segment + 1
        if below > self._deleted_below:
            self._deleted_below = below
            for segment in [s for s in self._seg_live if s < below]:
                del self._seg_live[segment]
                self._seg_bytes.pop(segment, None)
            with self._cond:
                self._delete_below = below
                self._delete_current = self._seen_good if current else -1
                self._wake()

    @property
    def disk_bytes(self) -> int:
        return sum(self._seg_bytes.values())

    def counters(self) -> dict[str, int]:
        return {
            "syncs": self.syncs,
            "bytes_written": self.bytes_written,
            "records_written": self.records_written,
            "avoided_messages": self.avoided_messages,
            "avoided_bytes": self.avoided_bytes,
            "failed_writes": self.failed_batches,
            "write_failing": 1 if self.failing else 0,
            "segments": len(self._seg_live),
            "deleted_segments": self.deleted_segments,
            "moved_messages": self.moved_messages,
        }

    # --- the writer thread -----------------------------------------------------------------

    def turn(self) -> float | None:
        """One turn of the writer (writers.py runs it): write and sync what the group-commit
        policy says is due, delete what the loop let go. Returns when the next turn is due:
        seconds (0: at once), None (when woken), or DONE once stopped."""
        policy, cond = self._policy, self._cond
        with cond:
            wait = policy.wait(self._pending, self._pending_bytes, self._clock(),
                               self._stopping)
            if not (wait == 0.0 or (wait is None and (self._stopping
                                                      or self._delete_below > 0))):
                return wait
            n = policy.take(self._pending)
            taken, self._pending = self._pending[:n], self._pending[n:]
            for e in taken:
                if e.count > 1:
                    by_seq = self._pending_by_seq
                    if len(e.acked) < e.count:  # (all ACKed: all gone from it already)
                        for seq in e.seqs():
                            if by_seq.get(seq) is e:
                                del by_seq[seq]
                    if e.alive:
                        self._pending_bytes -= e.size
                elif self._pending_by_seq.get(e.seq) is e:
                    del self._pending_by_seq[e.seq]
                    self._pending_bytes -= e.size
            acks, self._pending_acks = self._pending_acks, []
            delete_below, self._delete_below = self._delete_below, -1
            delete_current, self._delete_current = self._delete_current, -1
            stopping = self._stopping
            done = stopping and not self._pending and not self._pending_acks
        failed = False
        if taken or acks:
            result = self._write(taken, acks)
            failed = result.error is not None
            self._note(result.error)
            with cond:
                policy.written(not failed, self._clock())
            if self._notify is not None:
                try:
                    self._notify(result)
                except Exception:  # the loop is gone (shutting down)
                    pass
        if delete_below > 0:
            self._delete(delete_below, delete_current)
        if done or (failed and stopping):
            self._stopped.set()  # stopping on a failing disk: what could not be written is lost
            return DONE
        return 0.0  # (the policy is asked again at once: more may be due)

    def _note(self, error: str | None) -> None:
        """Keep the failing state: log its start (once) and its end."""
        if error is None:
            if self.failing and self.log is not None:
                self.log.info("pzq store writable again", directory=str(self.directory),
                              failures=self.failing)
            self.failing = 0
            return
        if not self.failing and self.log is not None:
            self.log.warning("pzq store write failing", directory=str(self.directory),
                             error=error)
        self.failing += 1

    def _write(self, taken: list[_Entry], acks: list[int]) -> BatchResult:
        batches = tuple(sorted({e.batch for e in taken}))
        parts: list[bytes] = []
        placed = []
        avoided = []
        batch_acks: list[int] = []
        records_in = 0
        for e in taken:
            if e.alive:
                records_in += 1
            if e.count > 1:
                if e.alive:
                    parts.extend(records.frame_record(e.payload()))
                    placed.extend(e.seqs())
                    batch_acks.extend(e.acked)  # after the batch they ACK
                elif e.avoided:
                    avoided.extend(e.seqs())
            elif e.alive:
                parts.extend(records.frame_record(e.payload()))
                placed.append(e.seq)
            elif e.avoided:
                avoided.append(e.seq)
        if batch_acks:
            acks = acks + batch_acks
        if acks:
            parts.extend(records.frame_record([records.ack_payload(acks)]))
        if not parts:
            return BatchResult(batches, self._segment, segment_bytes=self._segment_size_now,
                               acked=tuple(avoided), good_writes=self._good_writes)
        buffers, size = gather(parts, GATHER_MIN)
        try:
            if self._dirty:
                self._cut_tail()
            if self._fd < 0 or (self._segment_size_now > 0 and not self.failing
                                and self._segment_size_now + size > self.segment_size):
                self._open_segment()  # while writes fail: no new file, the one we have
            _writev_all(self._fd, buffers)
            if self.sync != "none":
                os.fdatasync(self._fd)
                self.syncs += 1
                self.sync_batches.observe(len(placed))
        except OSError as exc:
            reason = f"store failed: {exc.strerror or exc}"
            self._dirty = self._fd >= 0
            if self._dirty:
                try:
                    self._cut_tail()
                except OSError:
                    pass  # cut before the next write to this segment
            return BatchResult(batches, self._segment, failed=tuple(placed),
                               failed_acks=tuple(acks), error=reason, acked=tuple(avoided),
                               good_writes=self._good_writes)
        self._segment_size_now += size
        self.bytes_written += size
        self.records_written += records_in + (1 if acks else 0)
        self._good_writes += 1
        return BatchResult(batches, self._segment, placed=tuple(placed),
                           segment_bytes=self._segment_size_now,
                           acked=tuple(avoided) + tuple(acks), good_writes=self._good_writes)

    def _open_segment(self) -> None:
        self._close_segment()
        number = self._next_segment
        self._next_segment += 1
        path = self.directory / segment_name(number)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._segment = number
        self._segment_size_now = os.fstat(self._fd).st_size
        if self.sync != "none":
            os.fsync(self._dir_fd)  # the new file's name must survive a crash too

    def _cut_tail(self) -> None:
        """After a failed write: cut the segment back to its last good record (a half record
        never sits before good ones). Raises OSError if it cannot (tried again next time)."""
        if os.fstat(self._fd).st_size != self._segment_size_now:
            os.ftruncate(self._fd, self._segment_size_now)
        self._dirty = False

    def _close_segment(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def _delete(self, below: int, current_seen: int = -1) -> None:
        """Delete the segments below ``below``; the current one only while writes fail and
        if the loop had seen every good write (``current_seen``: nothing it does not know
        of can have been written to it)."""
        removed = 0
        for number in list_segments(self.directory):
            if number >= below:
                break
            if number == self._segment:
                if not (self.failing and current_seen == self._good_writes):
                    break
                self._close_segment()  # the next write starts a new segment
                self._segment, self._segment_size_now, self._dirty = -1, 0, False
            try:
                os.unlink(self.directory / segment_name(number))
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                if self.log is not None:
                    self.log.warning("pzq log: cannot delete segment", segment=number,
                                     error=exc.strerror)
                break
        if removed:
            self.deleted_segments += removed
            if self.sync != "none":
                try:
                    os.fsync(self._dir_fd)
                except OSError:
                    pass

"""Stream mode: a queue read by offset, ACKed by COMMIT (for stream processors such as Spark).

A stream queue (``mode: stream``) pushes nothing to consumers. Its messages keep the seq the
log gave them as their *offset* (stable across restarts), and a reader asks, on the queue's
stream endpoint (wire.py has the frames):

    HEAD                 the offset just past the last durable message, and the committed one
    RANGE start end      the durable messages with offsets in [start, end), in order (capped;
                         the answer says where to go on); the same range gives the same
                         messages until it is committed, also after a restart of the queue
    COMMIT end           every message below ``end`` is done: they are dropped, for good

The committed offset is kept in ``<data_dir>/stream-offsets`` (written, fsynced and renamed
before the COMMIT is answered); the messages below it are then ACKed in the log like consumer
ACKs, so their segments go. After a crash, messages below the committed offset found in the
log (their ACK records not yet written) are dropped at start. Offsets never go back: the next
seq is past the committed offset even when every segment holding older seqs is gone.

:class:`StreamCore` decides (no I/O). Called with :meth:`~StreamCore.serve` and
:meth:`~StreamCore.committed_written` it records its replies and the offsets file writes as
actions (actions.py: StreamReply, WriteCommitted) that the server takes with ``take_output``
and carries out; :meth:`~StreamCore.request`, :meth:`~StreamCore.to_write` and
:meth:`~StreamCore.written` are the same decisions, returned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import wire
from .actions import StreamReply, WriteCommitted
from .queue import QueueCore
from .records import MessageRecord

OFFSETS_FILE = "stream-offsets"


def load_committed(data_dir: Path) -> int | None:
    """The committed offset kept in ``data_dir``; None if none was ever committed."""
    try:
        data = json.loads((data_dir / OFFSETS_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OSError(f"unreadable {OFFSETS_FILE}: {exc}") from None
    committed = data.get("committed") if isinstance(data, dict) else None
    if not isinstance(committed, int) or committed < 0:
        raise OSError(f"unreadable {OFFSETS_FILE}: no committed offset in it")
    return committed


def save_committed(data_dir: Path, committed: int) -> None:
    """Write the committed offset durably (temporary file, fsync, rename, fsync of the
    directory). Blocking: run it in an executor."""
    path = data_dir / OFFSETS_FILE
    tmp = path.with_name(OFFSETS_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps({"committed": committed}).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def recover(core: QueueCore, messages: list[MessageRecord], next_seq: int,
            committed: int | None, *, stream: bool, hold: bool = False
            ) -> tuple[StreamCore | None, list[int]]:
    """Give ``core`` what the log holds, less what was committed before a crash (the offsets
    file says ``committed``; its ACKs are not in the log yet). Returns the stream core of a
    stream queue, and the seqs to ACK in the log now."""
    stale = []
    if committed is not None:
        stale = [m.seq for m in messages if m.seq < committed]
        messages = [m for m in messages if m.seq >= committed]
    core.recover(messages, max(next_seq, committed or 0), hold=hold)
    if not stream:
        return None, stale
    if committed is None:
        committed = messages[0].seq if messages else core.next_seq
    return StreamCore(core, committed), stale


class StreamCore:
    """The stream requests of one queue. ``committed`` is the durable committed offset."""

    def __init__(self, core: QueueCore, committed: int):
        self.core = core
        self.committed = committed
        self._writing: int | None = None  # the offset being written to the offsets file
        self._waiting: list[tuple[list[bytes], int]] = []  # COMMITs: (envelope, end)
        self.out: list[Any] = []  # StreamReply, WriteCommitted (take_output)
        self.requests = 0
        self.errors = 0
        self.commits = 0  # offsets file writes

    def serve(self, frames: list[bytes]) -> None:
        """:meth:`request`, its reply recorded (StreamReply)."""
        reply = self.request(frames)
        if reply is not None:
            self.out.append(StreamReply(reply))

    def committed_written(self, value: int, error: str | None) -> None:
        """:meth:`written`, its replies recorded (StreamReply)."""
        self.out.extend(StreamReply(reply) for reply in self.written(value, error))

    def take_output(self) -> list[Any]:
        """The actions recorded since the last call, in order; then the write of the offset
        the COMMITs that came wait for, if no write is under way (WriteCommitted: report it
        with :meth:`committed_written`)."""
        value = self.to_write()
        if value is not None:
            self.out.append(WriteCommitted(value))
        out, self.out = self.out, []
        return out

    def request(self, frames: list[bytes]) -> list[bytes] | None:
        """A request as received (routing id first); the reply to send now, or None when it
        is a COMMIT that waits for the offsets file (see :meth:`to_write`)."""
        self.requests += 1
        envelope, body = wire.split_stream_request(frames[1:])
        envelope.insert(0, frames[0])
        req = wire.decode_stream_request(body)
        if isinstance(req, wire.WireError):
            self.errors += 1
            return wire.stream_error(envelope, req.reason)
        core = self.core
        if req.command == wire.HEAD:
            return wire.stream_ok(envelope, core.head, self.committed)
        if req.command == wire.RANGE:
            nxt, messages = core.range(req.start, req.end, self.committed, req.max_bytes,
                                       req.max_messages)
            out = wire.stream_ok(envelope, core.head, self.committed, nxt, len(messages))
            for m in messages:
                out.extend(wire.range_entry(m.seq, m.key, m.frames))
            return out
        end = min(req.end, core.head)  # nothing past the durable messages
        if end <= self.committed:
            return wire.stream_ok(envelope, core.head, self.committed)  # done before: no-op
        self._waiting.append((envelope, end))
        return None

    def to_write(self) -> int | None:
        """The committed offset to write to the offsets file now, if a COMMIT waits for it
        and no write is under way; the caller then reports with :meth:`written`."""
        if self._writing is not None or not self._waiting:
            return None
        self._writing = max(end for _, end in self._waiting)
        return self._writing

    def written(self, value: int, error: str | None) -> list[list[bytes]]:
        """The offsets file holds ``value`` now (or could not be written: ``error``): drop
        the messages below it; the replies to the COMMITs it answers."""
        self._writing = None
        replies = []
        if error is not None:
            keep = []
            for envelope, end in self._waiting:
                if end <= value:
                    self.errors += 1
                    replies.append(wire.stream_error(envelope, error))
                else:
                    keep.append((envelope, end))
            self._waiting = keep
            return replies
        self.commits += 1
        if value > self.committed:
            self.committed = value
            self.core.commit_below(value)
        keep = []
        for envelope, end in self._waiting:
            if end <= self.committed:
                replies.append(wire.stream_ok(envelope, self.core.head, self.committed))
            else:
                keep.append((envelope, end))
        self._waiting = keep
        return replies

    def counters(self) -> dict[str, int]:
        return {"stream_head": self.core.head, "stream_committed": self.committed,
                "stream_requests": self.requests, "stream_errors": self.errors,
                "stream_commits": self.commits}

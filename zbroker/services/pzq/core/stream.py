"""Stream mode: a queue read by offset, ACKed by COMMIT (for stream processors such as Spark).

A stream queue (``mode: stream``) pushes nothing to consumers. Its messages keep the seq the
log gave them as their *offset* (stable across restarts), and readers ask, on the queue's
stream endpoint (wire.py has the frames):

    HEAD                 the offset just past the last durable message, and the committed one
    RANGE start end      the durable messages with offsets in [start, end), in order (capped;
                         the answer says where to go on); the same range gives the same
                         messages until it is committed, also after a restart of the queue
                         (RANGE ... BATCH: the same messages packed, for our own readers)
    COMMIT end           every message below ``end`` is done (for the reader's group)

Readers are in groups (``[GROUP][name]`` before a request; none: the ``default`` group), each
with its own committed offset. A group is made by its first request, at the oldest offset
the queue holds, and goes with DELETE; a new queue has none, and keeps its messages for the
first. A message is dropped once every group has committed
past it (the *floor*), or sooner by the retention limits (``retention_bytes``,
``retention_seconds``): then the groups that had not read it are moved past it and told, in
the answers to their requests, which offsets they lost, until their next COMMIT.

The groups' committed offsets (and what retention took from them) are kept in
``<data_dir>/stream-offsets`` (written, fsynced and renamed before a COMMIT, a new group or
a DELETE is answered); the messages below the floor are then ACKed in the log like consumer
ACKs, so their segments go. After a crash, messages below the floor found in the log (their
ACK records not yet written) are dropped at start. Offsets never go back: the next seq is past
every committed offset even when every segment holding older seqs is gone.

:class:`StreamCore` decides (no I/O). Called with :meth:`~StreamCore.serve` and
:meth:`~StreamCore.committed_written` it records its replies and the offsets file writes as
actions (actions.py: StreamReply, WriteCommitted) that the server takes with ``take_output``
and carries out; :meth:`~StreamCore.request`, :meth:`~StreamCore.to_write` and
:meth:`~StreamCore.written` are the same decisions, returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pzq import wire
from zbroker.services.pzq.core.actions import Log, StreamReply, WriteCommitted
from zbroker.services.pzq.core.messages import Message
from zbroker.services.pzq.core.queue import QueueCore
from zbroker.services.pzq.core.records import MessageRecord

DEFAULT_GROUP = wire.DEFAULT_GROUP
MAX_GROUPS = 64  # reader groups of one queue
#: requests that may wait for the offsets file at once; past it a request is refused as busy
#: (a slow or failing disk must not let readers make the queue hold any number of them)
MAX_WAITING = 10_000
#: the requests that only ask: not answered to a reader that takes no answers
QUESTIONS = frozenset((wire.HEAD, wire.RANGE, wire.GROUPS))
BUSY = f"busy: {MAX_WAITING} requests wait for the offsets file; ask again"


@dataclass
class Offsets:
    """What the offsets file keeps: each group's committed offset, the offsets retention took
    from each group since its last COMMIT, and the offset below which retention dropped all."""

    groups: dict[str, int]
    lost: dict[str, tuple[int, int]] = field(default_factory=dict)
    retained: int = 0

    def copy(self) -> Offsets:
        return Offsets(dict(self.groups), dict(self.lost), self.retained)

    def floor(self) -> int | None:
        """Every message below it is done for every group (None: no group, no retention)."""
        if not self.groups:
            return self.retained or None
        return max(min(self.groups.values()), self.retained)


def _offset(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not an offset: {value!r}")
    return value


def decode_offsets(data: Any) -> Offsets:
    """The offsets of the file's JSON value (ValueError if it is not one); reads the file of
    an older version too (one committed offset: the default group's)."""
    try:
        if not isinstance(data, dict):
            raise ValueError("not an object")
        if "groups" not in data:
            return Offsets({DEFAULT_GROUP: _offset(data.get("committed"))})
        groups = {str(g): _offset(v) for g, v in data["groups"].items()}
        lost = {str(g): (_offset(v[0]), _offset(v[1])) for g, v in data.get("lost", {}).items()}
        return Offsets(groups, lost, _offset(data.get("retained", 0)))
    except (TypeError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError(str(exc)) from None


def encode_offsets(offsets: Offsets) -> dict[str, Any]:
    """The offsets as the file's JSON value. ``committed`` is the default group's (or the
    floor), as an older version reads it."""
    floor = offsets.floor() or 0
    return {"committed": offsets.groups.get(DEFAULT_GROUP, floor), "groups": offsets.groups,
            "lost": {g: list(r) for g, r in offsets.lost.items()},
            "retained": offsets.retained}


def recover(core: QueueCore, messages: list[MessageRecord], next_seq: int,
            offsets: Offsets | None, *, stream: bool, hold: bool = False,
            retention: Retention | None = None) -> tuple[StreamCore | None, list[int]]:
    """Give ``core`` what the log holds, less what is below the floor of the offsets file
    (committed or dropped before a crash; its ACKs are not in the log yet). Returns the
    stream core of a stream queue, and the seqs to ACK in the log now."""
    stale = []
    floor = offsets.floor() if offsets is not None else None
    if floor is not None:
        stale = [m.seq for m in messages if m.seq < floor]
        messages = [m for m in messages if m.seq >= floor]
    top = max([next_seq, *(offsets.groups.values() if offsets else ()), floor or 0])
    core.recover(messages, top, hold=hold)
    if not stream:
        return None, stale
    # a new queue has no group yet: its messages wait for the first (the default group's
    # reader, or a named one), which starts at the oldest
    return StreamCore(core, offsets or Offsets({}), retention), stale


@dataclass(frozen=True)
class Retention:
    """Limits that drop the oldest messages of a stream even when a group has not committed
    them: its messages' bytes (their cost, as max_backlog counts) and their age."""

    bytes: int | None = None
    seconds: float | None = None


class StreamCore:
    """The stream requests of one queue. ``offsets`` are those of the offsets file."""

    def __init__(self, core: QueueCore, offsets: Offsets, retention: Retention | None = None):
        self.core = core
        self.offsets = offsets  # durable: as the file holds them
        self.retention = retention or Retention()
        self._pending: Offsets | None = None  # changes the next write makes durable
        self._writing: Offsets | None = None  # the write under way
        self._written = 0  # writes done
        #: requests answered after a write: (envelope, request, the write that answers them,
        #: whether they are served again then)
        self._waiting: list[tuple[list[bytes], wire.StreamRequest, int, bool]] = []
        self._retain_to = 0  # the highest drop asked of retention
        self.out: list[Any] = []  # StreamReply, WriteCommitted, Log (take_output)
        self.requests = 0
        self.errors = 0
        self.unanswered = 0  # questions of readers that took no answers (not answered)
        self.commits = 0  # offsets file writes
        self.retention_dropped = 0  # messages dropped by the retention limits
        self._floor = offsets.floor()

    @property
    def committed(self) -> int:
        """The default group's committed offset (or the oldest offset, when it has none)."""
        committed = self.offsets.groups.get(DEFAULT_GROUP)
        return committed if committed is not None else self.floor()

    def floor(self) -> int:
        """The oldest offset the queue keeps: where a new group starts."""
        floor = self.offsets.floor()
        if floor is not None:
            return floor
        return next(iter(self.core.messages), self.core.head)

    # --- the server's calls ----------------------------------------------------------------

    def serve(self, frames: list[bytes], answerable: bool = True) -> None:
        """:meth:`request`, its reply recorded (StreamReply)."""
        reply = self.request(frames, answerable)
        if reply is not None:
            self.out.append(StreamReply(reply))

    def committed_written(self, value: Offsets, error: str | None) -> None:
        """:meth:`written`, its replies recorded (StreamReply)."""
        self.out.extend(StreamReply(reply) for reply in self.written(value, error))

    def take_output(self) -> list[Any]:
        """The actions recorded since the last call, in order; then the write of the offsets
        the requests that came wait for, if no write is under way (WriteCommitted: report
        it with :meth:`committed_written`)."""
        value = self.to_write()
        if value is not None:
            self.out.append(WriteCommitted(value))
        out, self.out = self.out, []
        return out

    # --- requests --------------------------------------------------------------------------

    def request(self, frames: list[bytes], answerable: bool = True
                ) -> Sequence[bytes | list[bytes]] | None:
        """A request as received (routing id first); the reply to send now, or None when it
        waits for the offsets file (see :meth:`to_write`). Not ``answerable``: its reader
        takes no answers now (they would be dropped), so a question (HEAD, RANGE, GROUPS) is
        not answered at all (counted in ``unanswered``); a change (COMMIT, DELETE) is made."""
        self.requests += 1
        envelope, body = wire.split_stream_request(frames[1:])
        envelope.insert(0, frames[0])
        req = wire.decode_stream_request(body)
        if isinstance(req, wire.WireError):
            self.errors += 1
            return wire.stream_error(envelope, req.reason)
        if not answerable and req.command in QUESTIONS:
            self.unanswered += 1  # a RANGE's answer can be megabytes read from disk
            return None
        return self._answer(envelope, req)

    def _answer(self, envelope: list[bytes], req: wire.StreamRequest,
                written: bool = False) -> Sequence[bytes | list[bytes]] | None:
        """``written``: the write this request waited for is done."""
        core, offsets = self.core, self.offsets
        if req.command == wire.GROUPS:
            out = wire.stream_ok(envelope, core.head, len(offsets.groups))
            for name, at in sorted(offsets.groups.items()):
                out += [name.encode(), b"%d" % at]
            return out
        group = req.group or DEFAULT_GROUP
        if req.command == wire.DELETE:
            if written:
                return wire.stream_ok(envelope)
            if group not in self._latest().groups:
                return self._error(envelope, f"no group {group!r} on this queue")
            if self._busy():
                return self._error(envelope, BUSY)
            change = self._change()
            del change.groups[group]
            change.lost.pop(group, None)
            self._wait(envelope, req)
            return None
        committed = offsets.groups.get(group)
        if committed is None:  # a new group: made durable before it is answered
            latest = self._latest()
            if req.command == wire.COMMIT and req.group is not None \
                    and group not in latest.groups:
                return self._error(envelope, f"no group {group!r} on this queue: a group is "
                                             "made by its first HEAD or RANGE")
            if self._busy():
                return self._error(envelope, BUSY)
            if group not in latest.groups:
                if len(latest.groups) >= MAX_GROUPS:
                    return self._error(envelope, f"too many groups: at most {MAX_GROUPS} "
                                                 "(DELETE one)")
                self._change().groups[group] = self.floor()
            self._wait(envelope, req, again=True)
            return None
        lost = offsets.lost.get(group, (0, 0)) if req.group is not None else ()
        if req.command == wire.HEAD:
            return wire.stream_ok(envelope, core.head, committed, *lost)
        if req.command == wire.RANGE:
            nxt, messages = core.range(req.start, req.end, committed, req.max_bytes,
                                       req.max_messages)
            if req.batch and messages:
                return self._range_batch(envelope, committed, nxt, messages, lost)
            out = wire.stream_ok(envelope, core.head, committed, nxt, len(messages), *lost)
            for m in messages:
                out.extend(wire.range_entry(m.seq, m.key, m.frames))
            return out
        if req.group is not None and req.end > core.head and not written:
            return self._error(envelope, f"COMMIT end {req.end} is past the head {core.head}")
        end = min(req.end, core.head)  # (the default group's: at most the head, as before)
        if written or (end <= committed and group not in offsets.lost):
            return wire.stream_ok(envelope, core.head, committed, *lost)  # a no-op: as before
        if self._busy():
            return self._error(envelope, BUSY)
        change = self._change()
        change.groups[group] = max(change.groups.get(group, committed), end)
        change.lost.pop(group, None)  # told: it goes on from here
        self._wait(envelope, req)
        return None

    def _range_batch(self, envelope: list[bytes], committed: int, nxt: int,
                     messages: list[Message], lost: tuple[int, ...]
                     ) -> list[bytes | list[bytes]]:
        """A RANGE ... BATCH answer: the messages packed, up to the first one of several
        body frames, which comes alone and as a plain RANGE answers it (as a batch
        consumer's delivery does)."""
        head = self.core.head
        frame_counts = list(map(len, (m.frames for m in messages)))
        if frame_counts[0] != 1:
            m = messages[0]
            return [*wire.stream_ok(envelope, head, committed, m.seq + 1, 1, *lost),
                    *wire.range_entry(m.seq, m.key, m.frames)]
        if frame_counts.count(1) != len(frame_counts):
            cut = next(i for i, n in enumerate(frame_counts) if n != 1)
            nxt, messages = messages[cut].seq, messages[:cut]
        return [*wire.stream_ok(envelope, head, committed, nxt, len(messages), *lost),
                *wire.range_batch([m.seq for m in messages], [m.key for m in messages],
                                  [m.frames[0] for m in messages])]

    def _error(self, envelope: list[bytes], reason: str) -> list[bytes]:
        self.errors += 1
        return wire.stream_error(envelope, reason)

    def _busy(self) -> bool:
        """So many requests wait for the offsets file that one more is refused, unchanged."""
        return len(self._waiting) >= MAX_WAITING

    def _latest(self) -> Offsets:
        """The offsets as they will be once every write asked for is done."""
        return self._pending or self._writing or self.offsets

    def _change(self) -> Offsets:
        """The offsets the next write makes durable, to be changed."""
        if self._pending is None:
            self._pending = (self._writing or self.offsets).copy()
        return self._pending

    def _wait(self, envelope: list[bytes], req: wire.StreamRequest, again: bool = False
              ) -> None:
        """Answer ``req`` once the write of the pending changes is done (``again``: serve it
        then as if it came then; else it is done by the write)."""
        self._waiting.append((envelope, req, self._written + (2 if self._writing else 1),
                              again))

    # --- the offsets file ------------------------------------------------------------------

    def to_write(self) -> Offsets | None:
        """The offsets to write to the offsets file now, if a change waits for it and no
        write is under way; the caller then reports with :meth:`written`."""
        if self._writing is not None or self._pending is None:
            return None
        self._writing, self._pending = self._pending, None
        return self._writing

    def written(self, value: Offsets, error: str | None
                ) -> list[Sequence[bytes | list[bytes]]]:
        """The offsets file holds ``value`` now (or could not be written: ``error``): drop
        the messages below the floor; the replies to the requests it answers."""
        self._writing = None
        replies: list[Sequence[bytes | list[bytes]]] = []
        if error is not None:  # nothing changed: what waited for it fails, and what was
            self._pending = None  # to follow it (built on it) is asked again by its reader
            self._retain_to = 0
            for envelope, *_ in self._waiting:
                replies.append(self._error(envelope, error))
            self._waiting = []
            return replies
        self._written += 1
        self.commits += 1
        self.offsets = value
        floor = value.floor()
        if floor is not None and (self._floor is None or floor > self._floor):
            self._floor = floor
            self.core.commit_below(floor)
        waiting, self._waiting = self._waiting, []
        for envelope, req, gen, again in waiting:
            if gen <= self._written:
                reply = self._answer(envelope, req, written=not again)
                if reply is not None:
                    replies.append(reply)
            else:
                self._waiting.append((envelope, req, gen, again))
        return replies

    # --- retention -------------------------------------------------------------------------

    def enforce_retention(self, now_us: int) -> None:
        """Drop the oldest messages past the retention limits, whoever has not read them:
        the groups behind are moved past them (and told, lost offsets); written first."""
        limit_bytes, limit_seconds = self.retention.bytes, self.retention.seconds
        if (limit_bytes is None and limit_seconds is None) or self._retaining():
            return
        core = self.core
        excess = core.backlog_bytes - limit_bytes if limit_bytes is not None else 0
        too_old = now_us - int(limit_seconds * 1e6) if limit_seconds is not None else 0
        drop_to = None
        for seq, m in core.messages.items():
            if excess > 0 or (too_old and int(wire.key_time(m.key)) < too_old):
                excess -= m.size
                drop_to = seq + 1
                continue
            break
        if drop_to is None or drop_to <= self._retain_to:
            return
        self._retain_to = drop_to
        change = self._change()
        change.retained = max(change.retained, drop_to)
        behind = []
        for group, committed in change.groups.items():
            if committed < drop_to:
                since = change.lost.get(group, (committed, 0))[0]
                change.lost[group] = (since, drop_to)
                change.groups[group] = drop_to
                behind.append(group)
        dropped = sum(1 for seq in core.messages if seq < drop_to)
        self.retention_dropped += dropped
        if behind:
            self.out.append(Log("warning", "pzq stream retention dropped unread messages",
                                {"groups": behind, "below": drop_to,
                                 "messages": dropped}))

    def _retaining(self) -> bool:
        """A drop by retention waits for its write."""
        return self._retain_to > self.offsets.retained

    def next_deadline(self) -> float | None:
        """The µs since the epoch at which the oldest message passes retention_seconds."""
        if self.retention.seconds is None or not self.core.messages or self._retaining():
            return None
        first = next(iter(self.core.messages.values()))
        return int(wire.key_time(first.key)) + self.retention.seconds * 1e6

    def counters(self) -> dict[str, int]:
        head = self.core.head
        out = {"stream_head": head, "stream_committed": self.committed,
               "stream_requests": self.requests, "stream_errors": self.errors,
               "stream_commits": self.commits, "stream_groups": len(self.offsets.groups),
               "stream_retention_dropped": self.retention_dropped}
        for group, committed in sorted(self.offsets.groups.items()):
            out[f"group.{group}.committed"] = committed
            out[f"group.{group}.lag"] = max(0, head - committed)
        return out

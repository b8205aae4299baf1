"""The protocol logic of a ZPIPES pipe end, on the client side: no I/O, no clock, no pyzmq.

:class:`ReaderProtocol` and :class:`WriterProtocol` turn what a pipe end wants into request
frames and the broker's replies into their state: which requests are outstanding, what each
reply means, the reader's stream buffer (chunks and the markers that follow them: :data:`EOF`
or an error), the writer's first error. The sync client (:mod:`zpipes.client`) and the asyncio
client (:mod:`zpipes.aio`) do the I/O around them and differ only in how they wait; the tests
drive them without sockets.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Iterable
from enum import Enum

from zpipes import protocol as p
from zpipes.errors import BrokenPipe, PipeFailed, ProtocolError, ZpipesError

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_READ_SIZE = 1 << 20  # bytes asked for by one READ
DEFAULT_READ_AHEAD = 4  # READs kept outstanding by a reader
DEFAULT_CHUNK_SIZE = 1 << 20  # largest chunk sent by one WRITE
DEFAULT_WINDOW = 4  # WRITEs a writer may have unacknowledged

# The broker's limits on pipelining (per client): stay well below them.
MAX_OUTSTANDING = 32
MAX_WINDOW_BYTES = 8 << 20

WRITE_HEADROOM = 7  # signature, id, chunk length: in front of a WRITE's data
WRITE_TAILROOM = 4  # timeout: after a WRITE's data

_CLOSE = p.encode(p.Close())
_WRITE_HEAD = struct.Struct(">2sBI")  # signature, WRITE, chunk length
_NO_TIMEOUT = bytes(4)  # a WRITE's wire timeout: 0, wait for ever
# *_FAILED reasons after which the broker holds no pipe end for us any more: a CLOSE would only
# go to a broker that is gone (or get INVALID), so none is sent.
DETACHING_REASONS = frozenset({"broker stopping", "client expired: silent for too long"})
_NEWLINE = re.compile(b"\n")


def fresh(error: BaseException) -> BaseException:
    """A stored error, ready to be raised again without piling up tracebacks."""
    return error.with_traceback(None)


# --- the end-of-stream marker -------------------------------------------------------------


class _Eof:
    """End-of-stream marker in a reader's stream."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EOF"


EOF = _Eof()


def check_pipe_name(name: str | bytes) -> bytes:
    """A pipe name as the wire carries it: 1 to 255 bytes of UTF-8. Raises ValueError."""
    if isinstance(name, str):
        raw = name.encode("utf-8")
    elif isinstance(name, bytes | bytearray | memoryview):
        raw = bytes(name)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"pipe name {raw!r} is not valid UTF-8") from None
    else:
        raise TypeError(f"pipe name must be str or bytes, not {type(name).__name__}")
    if not 1 <= len(raw) <= p.MAX_STRING:
        raise ValueError(f"pipe name must be 1 to {p.MAX_STRING} bytes of UTF-8, not {len(raw)}")
    return raw


class Phase(Enum):
    NEW = "new"
    OPENING = "opening"  # INPUT/OUTPUT sent
    OPEN = "open"
    CLOSING = "closing"  # CLOSE sent; every reply but CLOSE_OK/CLOSE_FAILED is discarded
    CLOSED = "closed"
    FAILED = "failed"  # the open was refused
    BROKEN = "broken"  # the broker answered INVALID or garbage: it detached our pipe end


class _EndProtocol:
    """What readers and writers share: opening, closing, and the replies that mean the same
    for both."""

    _open_ok: type
    _open_failed: type
    _role: str

    def __init__(self, name: str | bytes) -> None:
        self.name = check_pipe_name(name)
        self.phase = Phase.NEW
        self.error: ZpipesError | None = None  # why the end is unusable (open refused, broken)
        self.close_error: ZpipesError | None = None  # CLOSE_FAILED
        # The broker dropped our end by itself ("broker stopping", expiry) or the connection to
        # it is lost: there is nothing left to close.
        self.detached = False

    @property
    def label(self) -> str:
        return self.name.decode("utf-8")

    # --- commands ---

    def open_command(self) -> bytes:
        if self.phase is not Phase.NEW:
            raise RuntimeError("the pipe end was opened already")
        self.phase = Phase.OPENING
        return self._open_frame()

    def _open_frame(self) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def needs_close(self) -> bool:
        """True while the broker holds a pipe end for us that a CLOSE should release."""
        return self.phase in (Phase.OPENING, Phase.OPEN) and not self.detached

    def close_command(self) -> bytes:
        self.phase = Phase.CLOSING
        return _CLOSE

    # --- replies ---

    def receive_frame(self, frame: Any) -> None:
        """Take one frame from the broker."""
        reply = p.decode_reply([frame])
        if isinstance(reply, p.DecodeError):
            self.receive_garbage(reply.reason)
        else:
            self.receive(reply)

    def receive_garbage(self, reason: str) -> None:
        if self.phase in (Phase.OPENING, Phase.OPEN):
            self._break(ProtocolError(f"pipe {self.label!r}: bad reply from broker: {reason}"))

    def receive(self, reply: p.Reply) -> None:
        kind = type(reply)
        if kind is p.PingOk:
            return
        phase = self.phase
        if phase is Phase.OPEN:
            self._receive_open(reply)
        elif phase is Phase.CLOSING:
            if kind is p.CloseOk or kind is p.Invalid:
                # INVALID: the broker no longer knew us (it expired us or restarted); the end
                # is gone either way.
                self.phase = Phase.CLOSED
            elif kind is p.CloseFailed:
                self.phase = Phase.CLOSED
                self.close_error = PipeFailed(
                    f"close of pipe {self.label!r} failed: {reply.reason}", reply.reason
                )
            else:
                self._discard(reply)
        elif phase is Phase.OPENING:
            if kind is self._open_ok:
                self.phase = Phase.OPEN
            elif kind is self._open_failed:
                self.phase = Phase.FAILED
                self.error = PipeFailed(
                    f"cannot open pipe {self.label!r} for {self._role}: {reply.reason}",
                    reply.reason,
                )
            else:
                self._unexpected(reply)
        # NEW, CLOSED, FAILED, BROKEN: late replies mean nothing any more

    def _receive_open(self, reply: p.Reply) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _discard(self, reply: p.Reply) -> None:
        """A reply to a request that a CLOSE cancelled."""

    def _unexpected(self, reply: p.Reply) -> None:
        if type(reply) is p.Invalid:
            self._break(ProtocolError(
                f"pipe {self.label!r}: the broker rejected a command as invalid and dropped "
                "the pipe end"
            ))
        else:
            self._break(ProtocolError(
                f"pipe {self.label!r}: unexpected {reply.id.name} from broker while "
                f"{self.phase.value} for {self._role}"
            ))

    def _break(self, error: ZpipesError) -> None:
        self.phase = Phase.BROKEN
        if self.error is None:
            self.error = error

    def _note_reason(self, reason: str) -> None:
        if reason in DETACHING_REASONS:
            self.detached = True

    def connection_lost(self, error: ZpipesError) -> None:
        """The connection to the broker is gone (the caller has fed every reply that arrived
        before): no outstanding request will be answered, and the end is gone with it. The
        first error wins, so a reply such as "broker stopping" that came first stays the
        reason."""
        self.detached = True
        if self.phase is Phase.OPENING:
            self.phase = Phase.FAILED
            if self.error is None:
                self.error = error
        elif self.phase is Phase.CLOSING:
            self.phase = Phase.CLOSED


class ReaderProtocol(_EndProtocol):
    """The reading end: outstanding READs and the stream buffer.

    The stream is a sequence of data chunks (memoryviews, consumed by slicing: no copies) and
    markers: :data:`EOF` (READ_END) or an exception (READ_FAILED, INVALID). Data before the
    first marker is *ready* (``ready`` bytes in ``_chunks``); the first marker and everything
    after it wait in ``_later``. Consuming an EOF marker makes the data after it ready (a new
    writer may start a new stream, as with a named pipe); an error marker is never consumed.

    The broker answers READs in order, and keeps answering READ_END while no writer is
    attached. So the READs that were still outstanding when an EOF was consumed may bring more
    READ_ENDs of that same end: until data arrives, those collapse into the consumed EOF. Only
    a READ_END that answers a READ sent after the consumption, or that follows new data, is a
    new end of stream.
    """

    _open_ok = p.InputOk
    _open_failed = p.InputFailed
    _role = "reading"

    def __init__(
        self,
        name: str | bytes,
        read_size: int = DEFAULT_READ_SIZE,
        read_ahead: int = DEFAULT_READ_AHEAD,
        buffer_limit: int | None = None,
    ) -> None:
        super().__init__(name)
        if not 1 <= read_size <= p.MAX_NUMBER4:
            raise ValueError(f"read_size must be 1 to {p.MAX_NUMBER4}, not {read_size}")
        if not 1 <= read_ahead <= MAX_OUTSTANDING:
            raise ValueError(f"read_ahead must be 1 to {MAX_OUTSTANDING}, not {read_ahead}")
        self.read_size = read_size
        self.read_ahead = read_ahead
        self.buffer_limit = read_size * read_ahead if buffer_limit is None else buffer_limit
        self.read_frame = p.encode(p.Read(read_size, 0))
        self.outstanding = 0  # READs sent and not answered
        # The oldest outstanding READs whose READ_END (before any new data) repeats the EOF
        # that was consumed: those sent before it was consumed.
        self._stale_reads = 0
        self.ready = 0  # bytes in _chunks
        self._chunks: deque[memoryview] = deque()
        self._later: deque[memoryview | _Eof | ZpipesError] = deque()

    def _open_frame(self) -> bytes:
        return p.encode(p.Input(self.name))

    # --- requests ---

    def reads_wanted(self, blocking: bool = False) -> int:
        """How many READs to send now. ``blocking``: the caller is about to wait for data, so
        the buffer limit does not apply (it needs more than is ready)."""
        if self.phase is not Phase.OPEN or self._later:
            return 0
        if not blocking and self.ready >= self.buffer_limit:
            return 0
        return max(0, self.read_ahead - self.outstanding)

    def reads_sent(self, count: int) -> None:
        self.outstanding += count

    # --- replies ---

    def _receive_open(self, reply: p.Reply) -> None:
        kind = type(reply)
        if kind is p.ReadOk:
            self._answered()
            chunk = reply.chunk
            if type(chunk) is not memoryview:
                chunk = memoryview(chunk)
            if len(chunk):
                self._stale_reads = 0  # a new stream has started: its end will be a new end
                if self._later:
                    self._later.append(chunk)
                else:
                    self._chunks.append(chunk)
                    self.ready += len(chunk)
        elif kind is p.ReadEnd:
            if self._answered():
                return  # the end that was consumed already, once more
            later = self._later
            if not (later and later[-1] is EOF):  # one EOF stands for several in a row
                later.append(EOF)
        elif kind is p.ReadTimeout:
            self._answered()  # we never ask the broker for timeouts; ask again
        elif kind is p.ReadFailed:
            self._answered()
            self._note_reason(reply.reason)
            self._add_error(PipeFailed(
                f"read from pipe {self.label!r} failed: {reply.reason}", reply.reason
            ))
        else:
            self._unexpected(reply)

    def _answered(self) -> bool:
        """One READ was answered (the oldest); True if it was sent before the last consumed
        EOF and no data came since."""
        if self.outstanding > 0:
            self.outstanding -= 1
        if self._stale_reads > 0:
            self._stale_reads -= 1
            return True
        return False

    def _add_error(self, error: ZpipesError) -> None:
        if not any(isinstance(item, ZpipesError) for item in self._later):
            self._later.append(error)

    def _break(self, error: ZpipesError) -> None:
        super()._break(error)
        self.outstanding = self._stale_reads = 0
        self._add_error(error)

    def connection_lost(self, error: ZpipesError) -> None:
        super().connection_lost(error)
        self.outstanding = self._stale_reads = 0
        if self.phase is Phase.OPEN:
            self._add_error(error)

    def _discard(self, reply: p.Reply) -> None:
        if type(reply) in (p.ReadOk, p.ReadEnd, p.ReadTimeout, p.ReadFailed):
            self._answered()

    # --- the stream ---

    @property
    def final(self) -> bool:
        """No more data can join the ready data: a marker follows it."""
        return bool(self._later)

    @property
    def marker(self) -> _Eof | ZpipesError | None:
        """The marker that follows the ready data, if one arrived."""
        return self._later[0] if self._later else None  # type: ignore[return-value]

    def take(self, size: int) -> list[memoryview]:
        """Consume up to ``size`` ready bytes, as slices of the received chunks."""
        parts: list[memoryview] = []
        chunks = self._chunks
        want = size
        while want > 0 and chunks:
            head = chunks[0]
            if len(head) <= want:
                parts.append(chunks.popleft())
                want -= len(head)
            else:
                parts.append(head[:want])
                chunks[0] = head[want:]
                want = 0
        self.ready -= size - want
        return parts

    def take_view(self, size: int = -1) -> memoryview:
        """Consume up to ``size`` ready bytes (all of the first chunk if ``size`` < 0) from the
        first ready chunk only: no copy at all. Empty if nothing is ready."""
        chunks = self._chunks
        if not chunks:
            return memoryview(b"")
        head = chunks[0]
        if size < 0 or len(head) <= size:
            chunks.popleft()
        else:
            chunks[0] = head[size:]
            head = head[:size]
        self.ready -= len(head)
        return head

    def peek_view(self) -> memoryview:
        return self._chunks[0] if self._chunks else memoryview(b"")

    def unread(self, parts: Iterable[memoryview]) -> None:
        """Put data back in front of the ready data (for a caller that took too much)."""
        parts = [part for part in parts if len(part)]
        self._chunks.extendleft(reversed(parts))
        self.ready += sum(len(part) for part in parts)

    def find_newline(self, start: int = 0, stop: int | None = None) -> int:
        """Offset in the ready data of the first newline in ``[start, stop)``, or -1."""
        stop = self.ready if stop is None else min(stop, self.ready)
        pos = 0
        for chunk in self._chunks:
            if pos >= stop:
                break
            end = pos + len(chunk)
            if end > start:
                match = _NEWLINE.search(chunk, max(0, start - pos), min(len(chunk), stop - pos))
                if match:
                    return pos + match.start()
            pos = end
        return -1

    def consume_eof(self) -> None:
        """Step over the EOF marker that follows the (now empty) ready data."""
        if self._chunks or not self._later or self._later[0] is not EOF:
            raise RuntimeError("no EOF marker to consume")
        later = self._later
        later.popleft()
        while later and not (later[0] is EOF or isinstance(later[0], ZpipesError)):
            chunk = later.popleft()
            self._chunks.append(chunk)  # type: ignore[arg-type]
            self.ready += len(chunk)  # type: ignore[arg-type]
        # Until new data comes, a READ_END to a READ sent before now repeats this end.
        self._stale_reads = 0 if self._chunks or later else self.outstanding


class WriterProtocol(_EndProtocol):
    """The writing end: outstanding WRITEs and the first error, which is sticky."""

    _open_ok = p.OutputOk
    _open_failed = p.OutputFailed
    _role = "writing"

    def __init__(
        self,
        name: str | bytes,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        super().__init__(name)
        if not 1 <= chunk_size <= MAX_WINDOW_BYTES:
            raise ValueError(f"chunk_size must be 1 to {MAX_WINDOW_BYTES}, not {chunk_size}")
        if not 1 <= window <= MAX_OUTSTANDING:
            raise ValueError(f"window must be 1 to {MAX_OUTSTANDING}, not {window}")
        if window * chunk_size > MAX_WINDOW_BYTES:
            raise ValueError(
                f"window * chunk_size must be at most {MAX_WINDOW_BYTES} bytes (broker limit)"
            )
        self.chunk_size = chunk_size
        self.window = window
        self.outstanding = 0  # WRITEs sent and not answered
        self.outstanding_bytes = 0
        self._sizes: deque[int] = deque()
        self.bytes_sent = 0
        self.bytes_acked = 0

    def _open_frame(self) -> bytes:
        return p.encode(p.Output(self.name))

    @property
    def window_full(self) -> bool:
        return self.outstanding >= self.window

    def check(self) -> None:
        """Raise the error that makes this end unusable, if there is one."""
        if self.error is not None:
            raise fresh(self.error)

    # --- requests ---

    def write_frame(self, chunk: bytes | memoryview) -> bytes:
        """A WRITE of ``chunk`` (wire timeout 0) as one frame, copying the chunk once."""
        head = _WRITE_HEAD.pack(p.SIGNATURE, p.MessageId.WRITE, len(chunk))
        return b"".join((head, chunk, _NO_TIMEOUT))

    def fill_write_frame(self, buf: memoryview, length: int) -> memoryview:
        """A WRITE frame built in place: ``buf`` holds ``length`` bytes of data after
        :data:`WRITE_HEADROOM` free bytes, and has :data:`WRITE_TAILROOM` free bytes after
        them. Writes the header and trailer around the data; returns the frame (a view)."""
        end = WRITE_HEADROOM + length
        header, trailer = p.encode_write_parts(buf[WRITE_HEADROOM:end], 0)
        buf[:WRITE_HEADROOM] = header
        buf[end : end + WRITE_TAILROOM] = trailer
        return buf[: end + WRITE_TAILROOM]

    def write_sent(self, size: int) -> None:
        self.outstanding += 1
        self.outstanding_bytes += size
        self.bytes_sent += size
        self._sizes.append(size)

    # --- replies ---

    def _receive_open(self, reply: p.Reply) -> None:
        kind = type(reply)
        if kind is p.WriteOk:
            self._answered()
        elif kind is p.WriteFailed:
            self._answered()
            reason = reply.reason
            self._note_reason(reason)
            message = f"write to pipe {self.label!r} failed: {reason}"
            if "no readers" in reason:
                self._set_error(BrokenPipe(message, reason))
            else:
                self._set_error(PipeFailed(message, reason))
        elif kind is p.WriteTimeout:
            # We send every WRITE with wire timeout 0, so this cannot happen with a correct
            # broker; if it does, a chunk is missing from the stream: fail loudly.
            self._answered(acked=False)
            self._set_error(PipeFailed(
                f"write to pipe {self.label!r} failed: the broker timed out a write", "timeout"
            ))
        else:
            self._unexpected(reply)

    def _answered(self, acked: bool = True) -> None:
        if self._sizes:
            size = self._sizes.popleft()
            self.outstanding -= 1
            self.outstanding_bytes -= size
            if acked:
                self.bytes_acked += size

    def _set_error(self, error: ZpipesError) -> None:
        if self.error is None:
            self.error = error

    def _break(self, error: ZpipesError) -> None:
        super()._break(error)
        self.outstanding = self.outstanding_bytes = 0
        self._sizes.clear()

    def connection_lost(self, error: ZpipesError) -> None:
        super().connection_lost(error)
        self.outstanding = self.outstanding_bytes = 0
        self._sizes.clear()
        self._set_error(error)

    def _discard(self, reply: p.Reply) -> None:
        if type(reply) in (p.WriteOk, p.WriteFailed, p.WriteTimeout):
            self._answered(acked=type(reply) is p.WriteOk)

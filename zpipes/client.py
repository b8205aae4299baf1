"""The ZPIPES client: named pipes served by a broker, as Python file objects.

    with zpipes.open("events", "w") as pipe:      # a PipeWriter
        pipe.write(b"hello\\n")
    with zpipes.open("events", "r") as pipe:      # a PipeReader
        for line in pipe:
            ...

Streams, not chunks: a reader's ``read(n)`` returns exactly ``n`` bytes unless the stream ended
(then fewer, then ``b""``), however the writer cut its data. Nothing is ever dropped: a partly
consumed chunk keeps its rest for the next call, and a timeout leaves everything in flight in
flight. End of stream (``b""``), a timeout (:class:`~zpipes.errors.PipeTimeout`, a
``TimeoutError``) and a failure (:class:`~zpipes.errors.ZpipesError`) never look alike.

Ending a stream: a writer's ``close()`` ends it (once the broker took all of it), its
``abort()`` cuts it (no CLOSE: the connection goes, and the broker fails the readers with
"writer lost: ..." after the data it took). A reader gets end of stream only when every writer
of its stream closed. A ``with`` block closes the end, or aborts it when an exception leaves
the block; an end the program dropped is closed, and so are the ends left open at exit,
unless an uncaught exception ends the program: they are aborted then.

Layout:

* :class:`~zpipes.client_protocol.ReaderProtocol` and
  :class:`~zpipes.client_protocol.WriterProtocol` (in :mod:`zpipes.client_protocol`, shared
  with the asyncio client) hold the protocol logic of one pipe end: which requests are
  outstanding, what each reply means, the reader's stream buffer. They do no I/O and read no
  clock, so they are tested without sockets. This module still exports them.
* :class:`_Channel` does the I/O: one connection to the broker, ZMTP as a DEALER on a plain
  socket (:mod:`zpipes.zmtp`: no libzmq I/O thread to hand each message to), shared under a
  lock with a heartbeat thread that pings the broker while the program does not call the
  library (and takes replies so that they never pile up). It notices a lost connection (a
  broker that stopped, died or restarted) at once, after taking the replies that came before
  it, and a silent (hung) broker after ``broker_timeout``.
* :class:`PipeReader` and :class:`PipeWriter` are the file objects that tie the two together.

What this client shares with the asyncio client (:mod:`zpipes.aio`) lives in
``zpipes._common``: the heartbeat rules, the socket setup and its disconnect monitor, and what
a pipe end returns once its waiting is done.

Throughput: a reader keeps ``read_ahead`` READs of ``read_size`` bytes outstanding, sent with
wire timeout 0 (timeouts are kept by the client, so that a timeout never loses a request that
the broker may still answer), and receives large chunks into buffers of their own. The READs
that replace answered ones are sent as the next call starts (while others are outstanding),
so that data reaches the program before the wake-ups a READ causes. A writer sends chunks of up to
``chunk_size`` bytes with up to ``window`` WRITEs unacknowledged; ``write`` returns once the
data is sent, and ``flush``/``close`` wait until the broker took all of it.
"""

from __future__ import annotations

import atexit
import io
import math
import os
import select
import socket
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterable
from time import monotonic

from zpipes import trust, zmtp, zmtp_framing
from zpipes._common import (
    PING,
    EndBase,
    Liveness,
    ReaderResults,
    WriterCounters,
    check_options,
    check_timeout,
    connection_lost,
    not_taking,
)
from zpipes.client_protocol import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_SIZE,
    DEFAULT_WINDOW,
    EOF,
    WRITE_HEADROOM,
    WRITE_TAILROOM,
    Phase,
    ReaderProtocol,
    WriterProtocol,
    check_pipe_name,
    fresh,
)
from zpipes.errors import (
    BrokerUnavailable,
    ProtocolError,
    ZpipesError,
)

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

BROKER_ENV = "ZPIPES_BROKER"  # names the default broker, if set (read once, at import)
DEFAULT_BROKER = os.environ.get(BROKER_ENV) or "local"
DEFAULT_PING_INTERVAL = 1.0  # seconds: ping the broker when we sent nothing for this long
DEFAULT_BROKER_TIMEOUT = 5.0  # seconds: a broker silent for this long while we wait is gone
CLOSE_SEND_BOUND = 0.5  # seconds: the longest a CLOSE may wait for room in the queue to the broker

ZERO_COPY_MIN = 64 << 10  # (the asyncio client's) below this, copying is cheaper than zero-copy

PING_OK = b"\xaa\xa0\x14"  # (the heartbeat's answers are taken by the channel)


def endpoint(broker: str) -> str:
    """The ZeroMQ endpoint of a broker: ``ipc://@/zpipes/<broker>``."""
    return f"ipc://@/zpipes/{broker}"


def check_broker_name(broker: str) -> str:
    if not isinstance(broker, str):
        raise TypeError(f"broker name must be str, not {type(broker).__name__}")
    if not broker or "\0" in broker or len(broker.encode("utf-8")) > 90:
        raise ValueError(f"invalid broker name {broker!r}")
    return broker


# ============================================================================================
# I/O
# ============================================================================================


def _probe_address(address: str) -> tuple[int, Any] | None:
    """(family, address) of a plain socket that reaches a ZeroMQ endpoint, if we know one."""
    transport, _, rest = address.partition("://")
    if transport == "ipc":
        return socket.AF_UNIX, "\0" + rest[1:] if rest.startswith("@") else rest
    if transport == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        if host in ("", "*", "0.0.0.0"):
            host = "127.0.0.1"
        try:
            return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
        except ValueError:
            return None
    return None


def _connect(broker: str, address: str | None, timeout: float) -> socket.socket:
    """A plain socket connected to the broker's endpoint (by default the Linux abstract socket
    of ``ipc://@/zpipes/<broker>``). Fails fast when nothing listens there, and, on a local
    socket, when the process listening there is run by a user we do not trust (see
    zpipes/trust.py). The message names what was given: the endpoint if one was, else the
    broker."""
    given = address is not None
    address = address or endpoint(broker)
    target = _probe_address(address)
    if target is None:
        raise BrokerUnavailable(f"cannot connect to {address!r}: a broker's endpoint is "
                                "ipc://PATH, ipc://@NAME or tcp://HOST:PORT")
    try:
        sock = zmtp.connect(target[0], target[1], min(timeout, 10.0))
    except (ConnectionRefusedError, FileNotFoundError):
        raise BrokerUnavailable(
            f"no broker is running at {address} (nothing listens there)" if given
            else f"broker {broker!r} is not running (nothing listens on {address})"
        ) from None
    except OSError as exc:
        raise BrokerUnavailable(f"cannot connect to broker at {address!r}: "
                                f"{exc.strerror or exc}") from None
    uid = trust.peer_uid(sock) if target[0] == socket.AF_UNIX else None
    problem = None if uid is None else trust.distrust(uid, broker, address)
    if problem:
        sock.close()
        raise BrokerUnavailable(problem)
    return sock


def check_broker_running(broker: str, address: str | None = None) -> None:
    """Fail fast when nothing listens on the broker's endpoint, or a user we do not trust
    runs what listens there (see :func:`_connect`), with a plain connect."""
    _connect(broker, address, 1.0).close()


class _Channel:
    """One connection to the broker, shared by the caller's thread and a heartbeat thread: ZMTP
    as a DEALER on a plain socket (:mod:`zpipes.zmtp`), so that the caller's thread writes
    and waits on the connection itself (no I/O thread to hand each message to).

    The connection is only ever used under ``_lock``. The caller's thread holds it while it
    waits for a reply, and then pings by itself; the heartbeat thread only works while the lock
    is free (the program is busy elsewhere): it pings when due and takes the replies into
    ``_inbox`` so that PING_OKs never pile up. Replies keep their order: ``_inbox`` first.

    The channel is *dead* (``dead`` holds the error, and every later send and wait raises it)
    once the connection to the broker dropped, or the broker stayed silent for
    ``broker_timeout`` while we waited. Replies that arrived before that are still delivered.
    """

    def __init__(
        self,
        broker: str,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        broker_timeout: float = DEFAULT_BROKER_TIMEOUT,
        address: str | None = None,
    ) -> None:
        self._live = Liveness(ping_interval, broker_timeout)
        self.broker = check_broker_name(broker)
        sock = _connect(broker, address, broker_timeout)  # names the endpoint if one was given
        self._address = address or endpoint(broker)
        link = zmtp.DealerLink(sock)
        try:
            link.handshake(min(broker_timeout, 10.0))
        except (OSError, zmtp.HandshakeError) as exc:
            link.close()
            why = exc if isinstance(exc, zmtp.HandshakeError) else (exc.strerror or exc)
            raise BrokerUnavailable(
                f"cannot connect to broker at {self._address!r}: {why}") from None
        self._link = link
        self._frames = link.reader.frames  # what the connection received, in order
        self._lock = threading.Lock()
        self._inbox: deque[bytes | bytearray] = deque()
        self._live.start(monotonic())
        self.dead: BrokerUnavailable | None = None
        self.closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"zpipes-heartbeat-{broker}", daemon=True
        )
        self._thread.start()

    # --- sending ---

    def send(self, frame: Any, copy: bool = True, bound: float | None = None) -> None:
        """Send one frame, whole. While the connection has no room, wait for it at most
        ``bound`` seconds (default: ``broker_timeout``, after which the broker counts as
        gone). ``copy`` is for the callers' sake only: the frame is written before this returns,
        so its buffer is free again at once."""
        with self._lock:
            self._send(frame, bound)

    def send_many(self, frame: bytes, count: int) -> None:
        with self._lock:
            self._send(frame, None, count)

    def _send(self, frame: Any, bound: float | None, count: int = 1) -> None:
        """``count``: send ``frame`` that many times (a small frame: in one write)."""
        if self.dead is not None:
            raise fresh(self.dead)
        link = self._link
        limit = self._live.send_limit(bound)
        try:
            if count == 1:
                done = link.send(frame, monotonic() + limit)
            else:
                done = link.send_framed((zmtp_framing.frame_head(len(frame)) + frame) * count,
                                        monotonic() + limit)
        except OSError:
            self._take_rest()
            raise fresh(self.dead) from None  # type: ignore[arg-type]
        if not done:
            if link.eof:
                self._lose()
                raise fresh(self.dead) from None  # type: ignore[arg-type]
            if bound is None:
                self._die()
            self._lose(not_taking(self.broker, limit))
            raise fresh(self.dead) from None  # type: ignore[arg-type]
        self._live.sent(monotonic())

    # --- receiving ---

    def recv(self, deadline: float | None) -> bytes | bytearray | None:
        """The next reply (never a PING_OK); None once ``deadline`` (monotonic) has passed.
        Pings while it waits; raises BrokerUnavailable when the connection to the broker is
        lost (once the replies that arrived before are taken) or the broker stays silent."""
        with self._lock:
            inbox = self._inbox
            if inbox:
                return inbox.popleft()
            if self.dead is not None:
                raise fresh(self.dead)
            live, link = self._live, self._link
            start = monotonic()
            while True:
                now = monotonic()
                if now >= live.ping_due():
                    self._ping(now)
                alive_until = live.alive_until(start)
                if now >= alive_until:
                    self._die()
                wake = min(alive_until, live.ping_due())
                if deadline is not None:
                    wake = min(wake, deadline)
                if link.wait(max(0, math.ceil((wake - now) * 1000))):
                    self._take(ready=True)
                    if inbox:
                        return inbox.popleft()
                    if self.dead is not None:
                        raise fresh(self.dead)
                elif deadline is not None and monotonic() >= deadline:
                    return None

    def taken(self) -> list[bytes | bytearray]:
        """The replies already taken from the connection (by the last wait), without asking
        it for more."""
        with self._lock:
            return self._empty_inbox()

    def drain(self) -> list[bytes | bytearray]:
        """Every reply that has arrived, without waiting."""
        with self._lock:
            if self.dead is None and not self.closed:
                self._take()
            return self._empty_inbox()

    def _empty_inbox(self) -> list[bytes | bytearray]:
        inbox = self._inbox
        if not inbox:
            return []
        frames = list(inbox)
        inbox.clear()
        return frames

    def _take(self, ready: bool = False) -> None:
        """Move the replies that arrived into ``_inbox``; the channel is dead once the
        connection is found closed (after the replies that came before). ``ready``: a wait
        just found something to receive."""
        link = self._link
        if (ready or link.wait(0)) and link.receive():
            frames, keep = self._frames, self._inbox.append
            while frames:
                frame = frames.popleft()
                if frame != PING_OK:
                    keep(frame)
            self._live.heard(monotonic())
        if link.eof:
            self._lose()

    def _take_rest(self) -> None:
        """Writing failed (the connection is gone): take what the broker sent before, and the
        channel is dead."""
        try:
            self._link.receive()
        except OSError:
            pass
        self._lose()

    # --- liveness ---

    def _lose(self, error: BrokerUnavailable | None = None) -> None:
        """The connection dropped (or is of no use any more: ``error`` says why). What the
        broker sent before is delivered first; nothing is sent any more."""
        if self.dead is None:
            self.dead = error or connection_lost(self.broker)
            frames, keep = self._frames, self._inbox.append
            while frames:
                frame = frames.popleft()
                if frame != PING_OK:
                    keep(frame)

    def _ping(self, now: float) -> None:
        try:
            self._link.send(PING, None)  # no room: the broker is not reading anyway
        except OSError:
            pass  # seen when the connection is read
        self._live.pinged(now)

    def _die(self) -> None:
        self.dead = self._live.silent(self.broker)
        raise self.dead

    def _heartbeat(self) -> None:
        stop = self._stop
        wait = min(self._live.ping_interval / 2, 0.5)
        while not stop.wait(wait):
            if not self._lock.acquire(blocking=False):
                continue  # the caller is using the connection (and pings by itself)
            try:
                if self.closed or self.dead is not None:
                    return
                self._take()
                if self.dead is not None:
                    return
                now = monotonic()
                if now >= self._live.ping_due():
                    self._ping(now)
            finally:
                self._lock.release()

    def send_last(self, frame: bytes) -> None:
        """Send a last frame (a CLOSE that nobody waits for) if the connection has room and
        is up; never waits (beyond finishing a frame begun), never raises."""
        with self._lock:
            if self.closed or self.dead is not None:
                return
            try:
                self._link.send(frame, None)
            except OSError:
                pass

    def close(self, at_once: bool = False) -> None:
        """Stop the heartbeat and close the connection. Every frame sent is written already;
        ``at_once`` is for the callers' sake (an aborted writer's connection goes now, as
        any does)."""
        if self.closed:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            self.closed = True
            self._link.close()


# --- the file objects --------------------------------------------------------------------

_open_ends: weakref.WeakSet[_PipeEnd] = weakref.WeakSet()
_open_texts: weakref.WeakSet[_TextPipe] = weakref.WeakSet()
def _ending_by_exception() -> bool:
    """True while an uncaught exception ends the program: the interpreter keeps it in
    ``sys.last_value`` (``sys.last_exc``) before it runs the exit handlers. Not in an
    interactive session, where that is only the last error shown at the prompt."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return False
    return getattr(sys, "last_exc", None) is not None or (
        getattr(sys, "last_value", None) is not None
    )


@atexit.register
def _close_open_ends() -> None:
    """Close what the program left open, so that no written data is left behind unsent.

    A program that exits normally (``sys.exit()`` included) closes its ends: their readers
    see the end of the stream. One that an uncaught exception (a ``KeyboardInterrupt``, too)
    ends aborts them instead, so that their readers fail rather than take a cut stream for
    a whole one. Text ends go first, so that the text they still hold is written."""
    cut = _ending_by_exception()
    ends: list[_TextPipe | _PipeEnd] = [*_open_texts, *_open_ends]
    for end in ends:
        try:
            if cut:
                end.abort()
            else:
                end.close()
        except Exception:  # nothing to report to at exit
            pass


class _PipeEnd(EndBase, io.BufferedIOBase):
    """What PipeReader and PipeWriter share: the channel, open, close, timeouts."""

    _proto: ReaderProtocol | WriterProtocol
    _channel: _Channel | None = None
    _done = True  # until opened: nothing to close

    def _open(
        self,
        broker: str,
        timeout: float | None,
        ping_interval: float,
        broker_timeout: float,
        address: str | None,
    ) -> None:
        self.broker = check_broker_name(broker)
        self.timeout = check_timeout(timeout)
        deadline = self._deadline()
        channel = _Channel(broker, ping_interval, broker_timeout, address)
        self._channel = channel
        self._done = False
        proto = self._proto
        try:
            channel.send(proto.open_command())
            while proto.phase is Phase.OPENING:
                frame = channel.recv(deadline)
                if frame is None:
                    raise self._timed_out("opening")
                proto.receive_frame(frame)
            if proto.phase is not Phase.OPEN:
                raise proto.error or ProtocolError("open failed")
        except BaseException:
            self._finish(wait=False)
            raise
        _open_ends.add(self)

    def _deadline(self) -> float | None:
        return None if self._timeout is None else monotonic() + self._timeout

    def _feed(self, frames: Iterable[Any]) -> None:
        receive = self._proto.receive_frame
        for frame in frames:
            receive(frame)

    def _lost(self, error: BrokerUnavailable) -> None:
        """The channel is dead: take the replies that arrived before (a "broker stopping" stays
        the reason), then fail what is still outstanding."""
        self._feed(self._channel.drain())  # type: ignore[union-attr]
        self._proto.connection_lost(error)

    def _finish(self, wait: bool = True) -> None:
        """Send CLOSE (if the broker holds an end for us), wait for CLOSE_OK unless ``wait``
        is false, close the socket. The wait is bounded by the broker's liveness; no CLOSE is
        sent once the broker dropped the end by itself or the connection to it is lost."""
        if self._done:
            return
        self._done = True
        _open_ends.discard(self)
        channel, proto = self._channel, self._proto
        try:
            if channel is not None and proto.needs_close:
                self._feed(channel.drain())  # did the broker drop the end ("broker stopping")?
                if channel.dead is not None:
                    proto.connection_lost(channel.dead)
            if channel is not None and proto.needs_close:
                channel.send(proto.close_command(), bound=CLOSE_SEND_BOUND)
                while wait and proto.phase is Phase.CLOSING:
                    try:
                        frame = channel.recv(None)
                    except BrokerUnavailable as exc:
                        self._lost(exc)
                        if isinstance(proto, WriterProtocol):
                            raise  # the end of the writer's stream is not confirmed
                        break
                    if frame is not None:
                        proto.receive_frame(frame)
        finally:
            if channel is not None:
                channel.close()

    def abort(self) -> None:
        """Drop the pipe end at once, without waiting for the broker; never raises.

        A writer sends no CLOSE: its socket is closed with no linger, the broker sees its
        connection go without a CLOSE, and the readers of its stream fail ("writer lost: ...")
        after the data the broker had taken; what it had not acknowledged yet may be dropped.
        So a reader never takes an aborted stream for a whole one. A reader sends a CLOSE if
        there is room for it, and does not wait for the answer."""
        try:
            self._cut()
        finally:
            super().close()

    def _cut(self) -> None:
        if self._done:
            return
        self._done = True
        _open_ends.discard(self)
        cut_channel(self._channel, self._proto)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Leaving a ``with`` block: :meth:`close` normally, :meth:`abort` when an exception
        leaves it (a writer's readers then fail instead of seeing the end of the stream)."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _check_usable(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed pipe")

    def seekable(self) -> bool:
        return False

    def __del__(self) -> None:
        """An end the program dropped without closing it is closed (a writer's readers see
        the end of the stream once the broker took everything); at exit, see
        ``_close_open_ends``."""
        if self._done or sys.is_finalizing():
            return
        try:
            self.close()
        except Exception:  # a finalizer has nobody to report to
            pass


class PipeReader(ReaderResults, _PipeEnd):
    """The reading end of a named pipe, a binary stream (``io.BufferedIOBase``).

    ``read(n)`` returns exactly ``n`` bytes, fewer only at end of stream, and ``b""`` at end of
    stream; ``read()`` reads to the end. ``read1``/``readinto1``/``readview`` return what has
    arrived (at least one byte, waiting for some). Lines: ``readline`` and iteration.
    Every call waits at most ``timeout`` seconds and then raises :class:`PipeTimeout`, with
    nothing lost. When a failure follows data, the calls that promise complete results
    (``read``, ``readinto``, ``readline``) raise at once, leaving the data; ``read1`` returns
    it first.
    """

    def __init__(
        self,
        name: str | bytes,
        broker: str = DEFAULT_BROKER,
        timeout: float | None = None,
        *,
        read_size: int = DEFAULT_READ_SIZE,
        read_ahead: int = DEFAULT_READ_AHEAD,
        buffer_limit: int | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        broker_timeout: float = DEFAULT_BROKER_TIMEOUT,
        endpoint: str | None = None,
    ) -> None:
        super().__init__()
        self._proto = ReaderProtocol(name, read_size, read_ahead, buffer_limit)
        self._open(broker, timeout, ping_interval, broker_timeout, endpoint)
        self._top_up()

    def readable(self) -> bool:
        self._check_usable()
        return True

    def _check_usable(self) -> None:
        """Every call starts here: it also sends the READs owed (see :meth:`_top_up`)."""
        super()._check_usable()
        if self._reads_owed:
            self._send_reads()

    # --- the engine ---

    _reads_owed = False  # READs to send at the start of the next call

    def _top_up(self, blocking: bool = False) -> None:
        """Keep ``read_ahead`` READs outstanding. When a call is about to return data
        (``blocking`` false) while READs are still outstanding, the new ones are owed instead,
        and sent at the start of the next call: the data reaches the program first, before the
        wake-ups a READ causes (the broker's, and the writer's it may answer), which on a busy
        machine compete with it for a CPU. With none outstanding they go at once: the stream never
        waits for the program's next call."""
        if not blocking and self._proto.outstanding:
            self._reads_owed = True
            return
        self._send_reads(blocking)

    def _send_reads(self, blocking: bool = False) -> None:
        self._reads_owed = False
        proto = self._proto
        count = proto.reads_wanted(blocking)
        if count:
            try:
                self._channel.send_many(proto.read_frame, count)  # type: ignore[union-attr]
            except BrokerUnavailable as exc:
                # The error follows the data that did arrive in the stream; raised by the
                # call that reaches it.
                self._lost(exc)
                return
            proto.reads_sent(count)

    def _fill(self, deadline: float | None) -> None:
        """Wait for at least one reply and take every reply that has arrived."""
        proto, channel = self._proto, self._channel
        assert channel is not None
        self._top_up(blocking=True)
        if proto.final:
            return  # the connection was found lost
        if proto.outstanding == 0:
            raise ProtocolError(f"pipe {proto.label!r}: nothing to wait for")  # cannot happen
        try:
            frame = channel.recv(deadline)
        except BrokerUnavailable as exc:
            self._lost(exc)
            return
        if frame is None:
            raise self._timed_out("read from")
        proto.receive_frame(frame)
        self._feed(channel.taken())  # what came with it (the wait took all that was there)
        self._top_up()

    def _pump(self) -> None:
        """Take the replies that arrived while the program was busy, without waiting."""
        self._feed(self._channel.drain())  # type: ignore[union-attr]

    def _wait_ready(self, size: int) -> None:
        """Wait until ``size`` bytes are ready or a marker follows the ready data."""
        proto = self._proto
        if proto.ready < size and not proto.final:
            self._pump()
        if proto.ready < size and not proto.final:
            deadline = self._deadline()
            while proto.ready < size and not proto.final:
                self._fill(deadline)

    # --- reading ---

    def read(self, size: int | None = -1) -> bytes:
        self._check_usable()
        if size is None or size < 0:
            return self.readall()
        if size == 0:
            return b""
        self._wait_ready(size)
        return self._take_exact(size)

    def readall(self) -> bytes:
        """Read to end of stream."""
        self._check_usable()
        proto = self._proto
        deadline = self._deadline()
        self._pump()
        while not proto.final:
            self._fill(deadline)
        return self._take_all()

    def read1(self, size: int = -1) -> bytes:
        self._check_usable()
        if size == 0:
            return b""
        self._wait_ready(1)
        return self._take_some(size)

    def readview(self, size: int = -1) -> memoryview:
        """Like :meth:`read1`, without any copy: a view of (part of) one received
        chunk, at most ``size`` bytes (``size`` < 0: the whole chunk). Empty at end of
        stream."""
        self._check_usable()
        proto = self._proto
        self._wait_ready(1)
        if not proto.ready:
            return memoryview(self._at_marker())
        view = proto.take_view(size)
        if proto.outstanding < proto.read_ahead:
            self._top_up()
        return view

    def readinto(self, buffer: Any) -> int:
        return self._readinto(buffer, whole=True)

    def readinto1(self, buffer: Any) -> int:
        return self._readinto(buffer, whole=False)

    def _readinto(self, buffer: Any, whole: bool) -> int:
        self._check_usable()
        dest = memoryview(buffer).cast("B")
        size = len(dest)
        if size == 0:
            return 0
        proto = self._proto
        self._wait_ready(size if whole else 1)
        if whole and proto.ready < size and isinstance(proto.marker, ZpipesError):
            raise fresh(proto.marker)
        if not proto.ready:
            self._at_marker()
            return 0
        pos = 0
        for part in proto.take(size):
            dest[pos : pos + len(part)] = part
            pos += len(part)
        self._top_up()
        return pos

    def peek(self, size: int = 0) -> bytes:
        """Ready bytes (at least one, waiting for some) without consuming them; b"" at end."""
        self._check_usable()
        proto = self._proto
        self._wait_ready(1)
        if not proto.ready:
            if isinstance(proto.marker, ZpipesError):
                raise fresh(proto.marker)
            return b""
        return bytes(proto.peek_view())

    def readline(self, size: int | None = -1) -> bytes:
        self._check_usable()
        limit = sys.maxsize if size is None or size < 0 else size
        if limit == 0:
            return b""
        line, scanned = self._line(limit, 0)
        if line is None:
            deadline = self._deadline()
            self._pump()
            line, scanned = self._line(limit, scanned)
            while line is None:
                self._fill(deadline)
                line, scanned = self._line(limit, scanned)
        if line:
            self._top_up()
        return line

    # --- closing ---

    def close(self) -> None:
        """Send CLOSE and wait for CLOSE_OK (unread data is dropped); close the socket."""
        if self._done:
            super().close()
            return
        try:
            self._finish()
        except ZpipesError:
            pass  # nothing can be lost by a reader that fails to close
        finally:
            super().close()


class PipeWriter(WriterCounters, _PipeEnd):
    """The writing end of a named pipe, a binary stream (``io.BufferedIOBase``).

    ``write`` sends the data in chunks of at most ``chunk_size`` bytes, with at most
    ``window`` chunks unacknowledged, and returns once it is sent (it waits only while the
    window is full). An error of an earlier write is raised by the next ``write``, ``flush``
    or ``close``. ``flush`` waits until the broker accepted everything; ``close`` flushes,
    then closes the pipe end, so that the reader sees the end of the stream. Do close (or
    use ``with``). ``abort`` cuts the stream instead: its readers fail with "writer lost",
    after the data the broker took. A ``with`` block left by an exception aborts.
    """

    def __init__(
        self,
        name: str | bytes,
        broker: str = DEFAULT_BROKER,
        timeout: float | None = None,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        window: int = DEFAULT_WINDOW,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        broker_timeout: float = DEFAULT_BROKER_TIMEOUT,
        endpoint: str | None = None,
    ) -> None:
        super().__init__()
        self._proto = WriterProtocol(name, chunk_size, window)
        self._fd_at_eof: set[int] = set()
        # Spare buffers of write_from (a WRITE is written out before send returns: its
        # buffer is free again at once).
        self._pool: list[bytearray] = []
        self._open(broker, timeout, ping_interval, broker_timeout, endpoint)

    def writable(self) -> bool:
        self._check_usable()
        return True

    # --- the engine ---

    def _pump(self) -> None:
        self._feed(self._channel.drain())  # type: ignore[union-attr]

    def _recv(self, deadline: float | None) -> bytes | bytearray | None:
        """The next reply; on a dead channel, fail the end and raise its (first) error."""
        try:
            return self._channel.recv(deadline)  # type: ignore[union-attr]
        except BrokerUnavailable as exc:
            self._lost(exc)
            self._proto.check()
            raise

    def _wait_window(self, deadline: float | None, written: int) -> None:
        """Wait until one more WRITE may be sent; raise an earlier write's error."""
        proto = self._proto
        self._pump()
        proto.check()
        while proto.window_full:
            frame = self._recv(deadline)
            if frame is None:
                raise self._timed_out("write to", written)
            self._feed([frame])
            self._pump()
            proto.check()

    def _send_chunk(self, frame: Any, size: int) -> None:
        try:
            self._channel.send(frame)  # type: ignore[union-attr]
        except BrokerUnavailable as exc:
            self._lost(exc)
            self._proto.check()
            raise
        self._proto.write_sent(size)

    # --- writing ---

    def write(self, data: Any) -> int:
        """Send ``data`` (any bytes-like object); returns its length once it is sent."""
        self._check_usable()
        view = memoryview(data).cast("B")
        total = len(view)
        proto = self._proto
        if total == 0:
            self._pump()
            proto.check()
            return 0
        deadline = self._deadline()
        step = proto.chunk_size
        pos = 0
        while pos < total:
            self._wait_window(deadline, pos)
            chunk = view[pos : pos + step]
            self._send_chunk(proto.write_frame(chunk), len(chunk))
            pos += len(chunk)
        return total

    def write_from(self, fd: int, size: int | None = None) -> int:
        """Read from file descriptor ``fd`` what is available (waiting for at least one byte,
        but never for more) up to ``size`` bytes (default: ``chunk_size``), and send it as one
        WRITE, built in place with no copy of the data. Returns the number of bytes sent;
        0 at end of file. Waits for the window before it reads."""
        self._check_usable()
        if fd in self._fd_at_eof:
            return 0
        proto = self._proto
        size = proto.chunk_size if size is None else min(size, proto.chunk_size)
        self._wait_window(self._deadline(), 0)
        need = WRITE_HEADROOM + size + WRITE_TAILROOM
        buf = self._pool.pop() if self._pool else None
        if buf is None or len(buf) < need:
            buf = bytearray(need)
        view = memoryview(buf)
        start, end = WRITE_HEADROOM, WRITE_HEADROOM + size
        got = _readv_retry(fd, view[start:end])
        if got == 0:
            self._fd_at_eof.add(fd)
            self._pool.append(buf)
            return 0
        # Take whatever else is already there, without waiting: big chunks for bulk input,
        # no delay for interactive input.
        while got < size and _readable_now(fd):
            more = _readv_retry(fd, view[start + got : end])
            if more == 0:
                self._fd_at_eof.add(fd)
                break
            got += more
        try:
            self._send_chunk(proto.fill_write_frame(view, got), got)
        finally:
            if len(self._pool) < 2:
                self._pool.append(buf)
        return got

    def flush(self) -> None:
        """Wait until the broker accepted everything written so far."""
        if self._done:
            return
        self._check_usable()
        proto, channel = self._proto, self._channel
        assert channel is not None
        self._pump()
        proto.check()
        if not proto.outstanding:
            return
        deadline = self._deadline()
        while proto.outstanding:
            frame = self._recv(deadline)
            if frame is None:
                raise self._timed_out("flush of")
            self._feed([frame])
            self._feed(channel.taken())  # (what came with it)
            proto.check()

    # --- closing ---

    def close(self) -> None:
        """Flush, then close the pipe end (the readers see the end of the stream) and wait
        for the broker's CLOSE_OK. The stream ends only once the broker took all of it: if
        the flush fails, times out or is interrupted, the end is aborted instead (see
        :meth:`abort`: the readers fail) and close raises what the flush raised."""
        if self._done:
            super().close()
            return
        try:
            try:
                self.flush()
            except BaseException:
                self._cut()
                raise
            self._finish()
            if self._proto.close_error is not None:
                raise self._proto.close_error
        finally:
            super().close()


def cut_channel(channel: Any, proto: ReaderProtocol | WriterProtocol) -> None:
    """Drop an end's channel at once (the sync and the asyncio one alike): a writer sends no
    CLOSE and closes its socket with no linger, so the broker fails its readers; a reader
    sends CLOSE if there is room."""
    if channel is None:
        return
    writer = isinstance(proto, WriterProtocol)
    try:
        if not writer and proto.needs_close:
            channel.send_last(proto.close_command())
    finally:
        channel.close(at_once=writer)


def _readv_retry(fd: int, buf: memoryview) -> int:
    while True:
        try:
            return os.readv(fd, [buf])
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([fd], [], [])


def _readable_now(fd: int) -> bool:
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)


# --- open() -------------------------------------------------------------------------------

_TEXT_OPTS = frozenset({"encoding", "errors", "newline", "line_buffering", "write_through"})


def open(
    name: str | bytes,
    mode: str = "r",
    broker: str = DEFAULT_BROKER,
    timeout: float | None = None,
    **opts: Any,
) -> PipeReader | PipeWriter | io.TextIOWrapper:
    """Open pipe ``name`` on ``broker`` for reading (mode ``"r"``/``"rb"``: a
    :class:`PipeReader`) or writing (``"w"``/``"wb"``: a :class:`PipeWriter`). Modes ``"rt"``
    and ``"wt"`` give a text stream (an ``io.TextIOWrapper`` that can also ``abort()``;
    options ``encoding`` (default UTF-8), ``errors``, ``newline``, ``line_buffering``,
    ``write_through``).

    Use the pipe end in a ``with`` block: leaving it normally closes the end (a writer's
    readers see the end of the stream), leaving it by an exception aborts it (they fail with
    "writer lost": a reader gets the end of the stream only when every writer closed).

    ``timeout`` (seconds; None waits for ever) bounds the open and every read, write and
    flush. Other options: ``ping_interval``, ``broker_timeout``, ``endpoint`` (a ZeroMQ
    endpoint to use instead of the broker's default ``ipc://@/zpipes/<broker>``); for readers
    ``read_size``, ``read_ahead``, ``buffer_limit``; for writers ``chunk_size``, ``window``.
    """
    if mode not in ("r", "rb", "rt", "w", "wb", "wt"):
        raise ValueError(f"invalid mode {mode!r}: use 'r', 'rb', 'rt', 'w', 'wb' or 'wt'")
    text = mode.endswith("t")
    check_options(mode, opts, _TEXT_OPTS if text else frozenset())
    text_opts = {key: opts.pop(key) for key in list(opts) if key in _TEXT_OPTS}
    end: PipeReader | PipeWriter
    if mode[0] == "r":
        end = PipeReader(name, broker, timeout, **opts)
    else:
        end = PipeWriter(name, broker, timeout, **opts)
    if not text:
        return end
    text_opts.setdefault("encoding", "utf-8")
    wrapper = _TextPipe(end, **text_opts)  # type: ignore[arg-type]
    _open_texts.add(wrapper)
    return wrapper


class _TextPipe(io.TextIOWrapper):
    """A text pipe end (modes ``"rt"`` and ``"wt"``): an ``io.TextIOWrapper`` that can
    :meth:`abort`, and whose ``with`` block, left by an exception, aborts the pipe end under
    it rather than closing it (``TextIOWrapper`` would flush and close: for a writer, a cut
    stream that its readers take for a whole one)."""

    def abort(self) -> None:
        """Abort the pipe end (see :meth:`PipeWriter.abort`); text not yet written is dropped."""
        self.buffer.abort()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


__all__ = [
    "DEFAULT_BROKER",
    "DEFAULT_BROKER_TIMEOUT",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_READ_SIZE",
    "DEFAULT_WINDOW",
    "EOF",
    "Phase",
    "PipeReader",
    "PipeWriter",
    "ReaderProtocol",
    "WriterProtocol",
    "check_broker_running",
    "check_pipe_name",
    "endpoint",
    "open",
]

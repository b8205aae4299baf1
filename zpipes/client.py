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
* :class:`_Channel` does the I/O: one DEALER socket to the broker, shared under a lock with a
  heartbeat thread that pings the broker while the program does not call the library (and
  drains replies so that they never pile up in the socket). It notices a lost connection (a
  broker that stopped, died or restarted) at once, after taking the replies that came before
  it, and a silent (hung) broker after ``broker_timeout``.
* :class:`PipeReader` and :class:`PipeWriter` are the file objects that tie the two together.

What this client shares with the asyncio client (:mod:`zpipes.aio`) lives in
``zpipes._common``: the heartbeat rules, the socket setup and its disconnect monitor, and what
a pipe end returns once its waiting is done.

Throughput: a reader keeps ``read_ahead`` READs of ``read_size`` bytes outstanding, sent with
wire timeout 0 (timeouts are kept by the client, so that a timeout never loses a request that
the broker may still answer), and receives without copying. A writer sends chunks of up to
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
from typing import Any

import zmq
import zmq.utils.garbage  # noqa: F401 - see _close_open_ends

from zpipes import trust
from zpipes._common import (
    CLOSE_LINGER_MS,
    PING,
    EndBase,
    Liveness,
    ReaderResults,
    WriterCounters,
    check_options,
    check_timeout,
    close_socket,
    connection_lost,
    not_taking,
    open_socket,
    saw_disconnect,
    take_replies,
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

BROKER_ENV = "ZPIPES_BROKER"  # names the default broker, if set (read once, at import)
DEFAULT_BROKER = os.environ.get(BROKER_ENV) or "local"
DEFAULT_PING_INTERVAL = 1.0  # seconds: ping the broker when we sent nothing for this long
DEFAULT_BROKER_TIMEOUT = 5.0  # seconds: a broker silent for this long while we wait is gone
CLOSE_SEND_BOUND = 0.5  # seconds: the longest a CLOSE may wait for room in the queue to the broker

ZERO_COPY_MIN = 64 << 10  # below this, copying into the frame is cheaper than zero-copy


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


def check_broker_running(broker: str, address: str | None = None) -> None:
    """Fail fast when nothing listens on the broker's endpoint (by default the Linux abstract
    socket of ``ipc://@/zpipes/<broker>``), with a plain connect; and, on a local socket, when
    the process listening there is run by a user we do not trust (see zpipes/trust.py). The
    message names what was given: the endpoint if one was, else the broker."""
    given = address is not None
    address = address or endpoint(broker)
    probe = _probe_address(address)
    if probe is None:
        return  # cannot tell: let ZeroMQ try
    sock = socket.socket(probe[0], socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(probe[1])
        uid = trust.peer_uid(sock) if probe[0] == socket.AF_UNIX else None
    except (ConnectionRefusedError, FileNotFoundError):
        raise BrokerUnavailable(
            f"no broker is running at {address} (nothing listens there)" if given
            else f"broker {broker!r} is not running (nothing listens on {address})"
        ) from None
    except OSError:
        uid = None  # cannot tell (e.g. no route, a timeout): let ZeroMQ try
    finally:
        sock.close()
    problem = None if uid is None else trust.distrust(uid, broker, address)
    if problem:
        raise BrokerUnavailable(problem)


class _Channel:
    """One DEALER socket to the broker, shared by the caller's thread and a heartbeat thread.

    The socket is only ever used under ``_lock``. The caller's thread holds it while it waits
    for a reply, and then pings by itself; the heartbeat thread only works while the lock is
    free (the program is busy elsewhere): it pings when due and drains replies into ``_inbox``
    so that PING_OKs never pile up in the socket. Replies keep their order: ``_inbox`` first.

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
        context: zmq.Context | None = None,
    ) -> None:
        self._live = Liveness(ping_interval, broker_timeout)
        self.broker = check_broker_name(broker)
        check_broker_running(broker, address)  # names the endpoint if one was given
        address = address or endpoint(broker)
        # A disconnect makes the channel take what arrived before it, then dead (see _lose).
        sock, monitor = open_socket(context or _context(), address)
        self._address = address
        self._sock = sock
        self._monitor = monitor
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)
        self._lock = threading.Lock()
        self._inbox: deque[zmq.Frame] = deque()
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
        """Send one frame. While the queue to the broker is full, wait for it at most ``bound``
        seconds (default: ``broker_timeout``, after which the broker counts as gone)."""
        with self._lock:
            self._send(frame, copy, bound)

    def send_many(self, frame: bytes, count: int) -> None:
        with self._lock:
            for _ in range(count):
                self._send(frame, True)

    def _send(self, frame: Any, copy: bool, bound: float | None = None) -> None:
        if self.dead is None:
            self._check_link()
        if self.dead is not None:
            raise fresh(self.dead)
        sock = self._sock
        try:
            sock.send(frame, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            # The queue to the broker is full: the broker has not taken anything for a while.
            limit = self._live.send_limit(bound)
            give_up = monotonic() + limit
            while not sock.poll(100, zmq.POLLOUT):
                if self._check_link():
                    raise fresh(self.dead) from None  # type: ignore[arg-type]
                if monotonic() >= give_up:
                    if bound is None:
                        self._die()
                    raise not_taking(self.broker, limit) from None
            sock.send(frame, zmq.NOBLOCK, copy=copy)
        self._live.sent(monotonic())

    # --- receiving ---

    def recv(self, deadline: float | None) -> zmq.Frame | None:
        """The next reply (never a PING_OK); None once ``deadline`` (monotonic) has passed.
        Pings while it waits; raises BrokerUnavailable when the connection to the broker is
        lost (once the replies that arrived before are taken) or the broker stays silent."""
        with self._lock:
            inbox = self._inbox
            if not inbox and self.dead is None:
                self._check_link()
            if inbox:
                return inbox.popleft()
            if self.dead is not None:
                raise fresh(self.dead)
            live = self._live
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
                if self._poller.poll(max(0, math.ceil((wake - now) * 1000))):
                    if self._check_link():
                        if inbox:
                            return inbox.popleft()
                        raise fresh(self.dead)  # type: ignore[arg-type]
                    self._drain(1)
                    if inbox:
                        return inbox.popleft()
                elif deadline is not None and monotonic() >= deadline:
                    return None

    def drain(self, limit: int = 1000) -> list[zmq.Frame]:
        """Every reply that has arrived, without waiting."""
        with self._lock:
            if self.dead is None and not self.closed and not self._check_link():
                self._drain(limit)
            frames = list(self._inbox)
            self._inbox.clear()
            return frames

    def _drain(self, limit: int | None) -> None:
        """Move the replies that arrived into ``_inbox``: at most ``limit`` (None: all)."""
        sock = self._sock
        if take_replies(lambda: sock.recv(zmq.NOBLOCK, copy=False), self._inbox.append, limit):
            self._live.heard(monotonic())

    # --- liveness ---

    def _check_link(self) -> bool:
        """True if the connection to the broker has dropped (the channel is then dead)."""
        monitor = self._monitor
        if not monitor.get(zmq.EVENTS) & zmq.POLLIN:
            return False
        dropped = saw_disconnect(lambda: monitor.recv_multipart(zmq.NOBLOCK))
        if dropped:
            self._lose()
        return dropped

    def _lose(self) -> None:
        """The connection dropped. Every reply the broker sent before is readable now (ZeroMQ
        keeps the inbound queue of a connection it will re-establish): take them all, so that
        they win over the lost connection. Then stop reconnecting: a new connection would lead
        to a broker that does not know our pipe end (a restarted one)."""
        self._drain(None)
        if self.dead is None:
            self.dead = connection_lost(self.broker)
        try:
            self._sock.disconnect(self._address)
        except zmq.ZMQError:
            pass

    def _ping(self, now: float) -> None:
        try:
            self._sock.send(PING, zmq.NOBLOCK)
        except zmq.Again:
            pass  # the queue to the broker is full; the broker is not reading anyway
        self._live.pinged(now)

    def _die(self) -> None:
        self.dead = self._live.silent(self.broker)
        raise self.dead

    def _heartbeat(self) -> None:
        stop = self._stop
        wait = min(self._live.ping_interval / 2, 0.5)
        while not stop.wait(wait):
            if not self._lock.acquire(blocking=False):
                continue  # the caller is using the socket (and pings by itself)
            try:
                if self.closed or self.dead is not None or self._check_link():
                    return
                self._drain(1000)
                now = monotonic()
                if now >= self._live.ping_due():
                    self._ping(now)
            except zmq.ZMQError:
                return
            finally:
                self._lock.release()

    def send_last(self, frame: bytes) -> None:
        """Send a last frame (a CLOSE that nobody waits for) if the queue to the broker has
        room and the connection is up; never waits, never raises. The socket's linger takes
        it out once the channel is closed."""
        with self._lock:
            if self.closed or self.dead is not None:
                return
            try:
                self._sock.send(frame, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self, at_once: bool = False) -> None:
        """Stop the heartbeat and close the socket; ``at_once``: with no linger, so that the
        connection goes away now and what is still queued for the broker is dropped."""
        if self.closed:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            self.closed = True
            close_socket(self._sock, self._monitor, at_once or self.dead is not None)


# --- the file objects --------------------------------------------------------------------

_open_ends: weakref.WeakSet[_PipeEnd] = weakref.WeakSet()
_open_texts: weakref.WeakSet[_TextPipe] = weakref.WeakSet()
_zmq_context: zmq.Context | None = None
_context_lock = threading.Lock()


def _context() -> zmq.Context:
    """The library's own ZeroMQ context (not the program's ``Context.instance()``), so that it
    can be shut down at exit without disturbing anybody."""
    global _zmq_context
    with _context_lock:
        if _zmq_context is None or _zmq_context.closed:
            _zmq_context = zmq.Context()
        return _zmq_context


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
    """Close what the program left open, so that no written data is left behind unsent; then
    end our ZeroMQ context, which waits until ZeroMQ is done with every message.

    A program that exits normally (``sys.exit()`` included) closes its ends: their readers
    see the end of the stream. One that an uncaught exception (a ``KeyboardInterrupt``, too)
    ends aborts them instead, so that their readers fail rather than take a cut stream for
    a whole one. Text ends go first, so that the text they still hold is written.

    This must run before pyzmq's own exit handler, which drops the buffers of zero-copy
    messages, whether or not ZeroMQ is still sending them: exit handlers run last-registered
    first, and importing ``zmq.utils.garbage`` above registers pyzmq's before this one."""
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
    with _context_lock:
        if _zmq_context is not None and not _zmq_context.closed:
            _zmq_context.destroy(linger=CLOSE_LINGER_MS)


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

    def _feed(self, frames: Iterable[zmq.Frame]) -> None:
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

    # --- the engine ---

    def _top_up(self, blocking: bool = False) -> None:
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
        self._feed(channel.drain())
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
        # Buffers of write_from: those of unanswered zero-copy WRITEs (None for copied ones),
        # and spare ones. A WRITE's buffer is free again once the broker answered it (it
        # cannot answer before it got the whole frame, so ZeroMQ is done with it).
        self._inflight: deque[bytearray | None] = deque()
        self._pool: list[bytearray] = []
        self._open(broker, timeout, ping_interval, broker_timeout, endpoint)

    def writable(self) -> bool:
        self._check_usable()
        return True

    # --- the engine ---

    def _pump(self) -> None:
        self._feed(self._channel.drain())  # type: ignore[union-attr]

    def _feed(self, frames: Iterable[zmq.Frame]) -> None:
        super()._feed(frames)
        inflight, outstanding = self._inflight, self._proto.outstanding
        while len(inflight) > outstanding:
            buf = inflight.popleft()
            if buf is not None and len(self._pool) < 2:
                self._pool.append(buf)

    def _recv(self, deadline: float | None) -> zmq.Frame | None:
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

    def _send_chunk(self, frame: Any, size: int, buf: bytearray | None = None) -> None:
        zero_copy = size >= ZERO_COPY_MIN
        try:
            self._channel.send(frame, copy=not zero_copy)  # type: ignore[union-attr]
        except BrokerUnavailable as exc:
            self._lost(exc)
            self._proto.check()
            raise
        self._proto.write_sent(size)
        self._inflight.append(buf if zero_copy else None)

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
        self._send_chunk(proto.fill_write_frame(view, got), got, buf)
        if got < ZERO_COPY_MIN and len(self._pool) < 2:
            self._pool.append(buf)  # ZeroMQ copied it
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
            self._feed(channel.drain())
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

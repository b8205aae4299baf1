"""The ZPIPES client for asyncio: named pipes served by a broker, as awaitable streams.

    from zpipes import aio

    async with await aio.open("events", "w") as pipe:     # an AsyncPipeWriter
        await pipe.write(b"hello\\n")
    async with await aio.open("events", "r") as pipe:     # an AsyncPipeReader
        async for line in pipe:
            ...

The same pipes, semantics and errors as :mod:`zpipes.client` (see there): ``await read(n)``
returns exactly ``n`` bytes unless the stream ended, end of stream is ``b""``, a timeout raises
:class:`~zpipes.errors.PipeTimeout` (a ``TimeoutError``) and loses nothing, a failure raises a
:class:`~zpipes.errors.ZpipesError` with the broker's reason. The protocol logic is the sync
client's own: :class:`~zpipes.client_protocol.ReaderProtocol` and
:class:`~zpipes.client_protocol.WriterProtocol`.

Layout:

* :class:`_AsyncChannel`: one ``zmq.asyncio`` DEALER socket to the broker and a task (the
  *pump*) that takes every reply as it arrives and hands it to the pipe end's protocol object,
  pings the broker when idle, and watches the connection with a socket monitor. A lost
  connection (the broker stopped, died or restarted) is noticed at once, after the replies that
  came before it; a silent (hung) broker after ``broker_timeout`` while a call waits.
* :class:`AsyncPipeReader` and :class:`AsyncPipeWriter`: the pipe ends. One call at a time per
  end: calls from several tasks take turns.

The heartbeat rules, the socket setup and what a pipe end returns once its waiting is done are
shared with the sync client (``zpipes._common``).

Cancellation (``asyncio.timeout``, ``Task.cancel``) is safe at every ``await``: commands are sent
without waiting (a send waits only while the queue to the broker is full, and then nothing was
sent yet) and the protocol state is updated right after, so a cancelled call loses nothing and
a later call picks up from there.

Ending a stream works as in the sync client: ``close()`` ends it, ``abort()`` cuts it (the
readers fail with "writer lost"), and so does an ``async with`` block left by an exception. An
end that the program dropped, or left open when its event loop shuts down, is closed without
waiting if the broker had acknowledged everything written, else cut.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Iterable
from time import monotonic
from types import TracebackType
from typing import Any

import zmq
import zmq.asyncio

from zpipes._common import (
    PING,
    EndBase,
    Liveness,
    ReaderResults,
    WriterCounters,
    check_intervals,
    check_options,
    connection_lost,
    not_taking,
)
from zpipes.client import (
    CLOSE_SEND_BOUND,
    DEFAULT_BROKER,
    DEFAULT_BROKER_TIMEOUT,
    DEFAULT_PING_INTERVAL,
    ZERO_COPY_MIN,
    check_broker_name,
    check_broker_running,
    cut_channel,
    endpoint,
)
from zpipes.client_protocol import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_SIZE,
    DEFAULT_WINDOW,
    Phase,
    ReaderProtocol,
    WriterProtocol,
    fresh,
)
from zpipes.errors import BrokerUnavailable, ProtocolError, ZpipesError
from zpipes.zmq_socket import (
    close_socket,
    open_socket,
    saw_disconnect,
    take_replies,
)

DRAIN_BATCH = 1000  # replies the pump takes in one go before it lets other tasks run

_zmq_context: zmq.asyncio.Context | None = None
_context_lock = threading.Lock()


def _context() -> zmq.asyncio.Context:
    """The library's own asyncio ZeroMQ context (not shared with the sync client, whose exit
    handler terminates its context: that would wait for asyncio sockets left open)."""
    global _zmq_context
    with _context_lock:
        if _zmq_context is None or _zmq_context.closed:
            _zmq_context = zmq.asyncio.Context()
        return _zmq_context


def _result(future: Any) -> Any:
    """The result of a non-blocking zmq.asyncio call (its future is done already)."""
    return future.result()


class _AsyncChannel:
    """One DEALER socket to the broker and the pump task that serves it.

    The pump hands every reply (never a PING_OK) to ``owner._on_frames`` as it arrives and then
    sets ``changed``; when the connection is lost it hands over what arrived before, marks the
    channel *dead* (``dead`` holds the error) and calls ``owner._on_lost``. The owner is held
    weakly, so that an end that the program dropped can be collected (and aborted).
    """

    def __init__(
        self,
        owner: _AsyncPipeEnd,
        broker: str,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        broker_timeout: float = DEFAULT_BROKER_TIMEOUT,
        address: str | None = None,
    ) -> None:
        self._live = Liveness(ping_interval, broker_timeout)
        loop = asyncio.get_running_loop()
        self.broker = check_broker_name(broker)
        check_broker_running(broker, address)  # names the endpoint if one was given
        address = address or endpoint(broker)
        # The monitor tells when the connection drops; the channel is then dead.
        sock, monitor = open_socket(_context(), address)
        self._address = address
        self._sock = sock
        self._monitor = monitor
        self._owner = weakref.ref(owner)
        self.changed = asyncio.Event()
        self._live.start(monotonic())
        self.dead: BrokerUnavailable | None = None
        self.closed = False
        self._pending: list[zmq.Frame] = []  # replies taken, not yet handed to the owner
        self._task = loop.create_task(self._pump(), name=f"zpipes-pump-{broker}")

    # --- sending ---

    async def send(self, frame: Any, copy: bool = True, bound: float | None = None) -> None:
        """Send one frame. Returns as soon as it is queued; while the queue to the broker is
        full, waits for room at most ``bound`` seconds (default: ``broker_timeout``, after
        which the broker counts as gone). A cancelled send sent nothing."""
        limit = self._live.send_limit(bound)
        give_up = monotonic() + limit
        while True:
            if self.try_send(frame, copy):
                return
            while not await self._sock.poll(100, zmq.POLLOUT):
                if self._check_link():
                    raise fresh(self.dead)  # type: ignore[arg-type]
                self._check_usable()
                if monotonic() >= give_up:
                    error = not_taking(self.broker, limit)
                    if bound is None:
                        self._fail(BrokerUnavailable(
                            f"broker {self.broker!r} not responding (not taking messages for "
                            f"{limit:g} s)"
                        ))
                    raise error

    def try_send(self, frame: Any, copy: bool = True) -> bool:
        """Send one frame if the queue to the broker has room (never waits)."""
        if self.dead is None and not self.closed:
            self._check_link()
        self._check_usable()
        try:
            _result(self._sock.send(frame, zmq.NOBLOCK, copy=copy))
        except zmq.Again:
            return False
        self._live.sent(monotonic())
        return True

    def _check_usable(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed pipe")
        if self.dead is not None:
            raise fresh(self.dead)

    # --- waiting ---

    async def wait(self) -> None:
        """Until the pump handed over something new (or the connection was lost). Raises
        the channel's error when it is dead already, or becomes dead because the broker stays
        silent for ``broker_timeout`` (measured from the later of now and its last word)."""
        start = monotonic()
        while True:
            self._check_usable()
            alive_until = self._live.alive_until(start)
            now = monotonic()
            if now >= alive_until:
                self._fail(self._live.silent(self.broker))
                raise fresh(self.dead)  # type: ignore[arg-type]
            self.changed.clear()
            try:
                async with asyncio.timeout(alive_until - now):
                    await self.changed.wait()
                return
            except TimeoutError:
                continue  # heard from the broker meanwhile (a PING_OK)? check again

    # --- the pump ---

    async def _pump(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self.closed and self.dead is None:
                self._drain(DRAIN_BATCH)
                if not self._deliver():
                    return
                if self._check_link():
                    return
                now = monotonic()
                if now >= self._live.ping_due():
                    self._ping(now)
                wait = self._live.ping_due() - monotonic()
                await poller.poll(max(1, math.ceil(wait * 1000)))
        except asyncio.CancelledError:
            if not self.closed and self.dead is None:
                # The loop is shutting down with the end still open (the program did not
                # close it): close as well as we can without waiting.
                owner = self._owner()
                if owner is not None:
                    owner._close_now()
                else:
                    self.close()
            raise
        except zmq.ZMQError as exc:
            if not self.closed:
                self._fail(BrokerUnavailable(f"connection to broker {self.broker!r} failed: {exc}"))
        except Exception as exc:  # a bug: fail the end rather than leave its calls hanging
            if not self.closed:
                self._fail(BrokerUnavailable(f"zpipes client failure: {exc!r}"))
            raise

    def _drain(self, limit: int | None) -> None:
        """Take the replies that arrived (at most ``limit``; None: all) into ``_pending``,
        without waiting."""
        sock = self._sock
        if take_replies(
            lambda: _result(sock.recv(zmq.NOBLOCK, copy=False)), self._pending.append, limit
        ):
            self._live.heard(monotonic())

    def _deliver(self) -> bool:
        """Hand the replies taken to the owner; False if the owner is gone."""
        frames, self._pending = self._pending, []
        owner = self._owner()
        if owner is None:
            self.close()
            return False
        if frames:
            owner._on_frames(frames)
            self.changed.set()
        return True

    def _check_link(self) -> bool:
        """True if the connection to the broker has dropped (the channel is then dead)."""
        if self.dead is not None:
            return True
        monitor = self._monitor
        dropped = saw_disconnect(lambda: _result(monitor.recv_multipart(zmq.NOBLOCK)))
        if dropped:
            # Every reply the broker sent before is readable now: they win over the lost
            # connection ("broker stopping" stays the reason). Then never reconnect: a new
            # connection would lead to a broker that does not know our pipe end.
            self._drain(None)
            self._fail(connection_lost(self.broker))
            try:
                self._sock.disconnect(self._address)
            except zmq.ZMQError:
                pass
        return dropped

    def _fail(self, error: BrokerUnavailable) -> None:
        """The channel is dead: deliver what arrived, then tell the owner, and wake waiters."""
        if self.dead is not None:
            return
        if not self.closed:
            try:
                self._drain(None)
            except zmq.ZMQError:
                pass
            frames, self._pending = self._pending, []
            owner = self._owner()
            if owner is not None:
                owner._on_frames(frames)
        self.dead = error
        owner = self._owner()
        if owner is not None:
            owner._on_lost(error)
        self.changed.set()
        if self._task is not asyncio.current_task():
            self._task.cancel()

    def _ping(self, now: float) -> None:
        try:
            _result(self._sock.send(PING, zmq.NOBLOCK))
        except zmq.Again:
            pass  # the queue to the broker is full; the broker is not reading anyway
        self._live.pinged(now)

    # --- closing ---

    def send_last(self, frame: bytes) -> None:
        """Send a last frame if there is room, without waiting and without a running event
        loop (a CLOSE nobody waits for); then the socket is closed (its linger delivers
        it)."""
        if self.closed or self.dead is not None:
            return
        try:
            zmq.Socket.shadow(self._sock.underlying).send(frame, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def close(self, at_once: bool = False) -> None:
        """Close the socket (no waiting) and stop the pump; ``at_once``: with no linger, so
        that the connection goes away now and what is still queued for the broker is
        dropped."""
        if self.closed:
            return
        self.closed = True
        try:
            self.changed.set()
        except RuntimeError:  # the event loop is closed
            pass
        if self._task is not None and not self._task.done():
            try:
                self._task.cancel()
            except RuntimeError:  # the event loop is closed
                pass
        close_socket(self._sock, self._monitor, at_once or self.dead is not None)


class _AsyncPipeEnd(EndBase):
    """What AsyncPipeReader and AsyncPipeWriter share: the channel, open, close, timeouts."""

    _proto: ReaderProtocol | WriterProtocol
    _channel: _AsyncChannel | None = None
    _done = True  # until opened: nothing to close
    _closed = False

    def __init__(
        self,
        broker: str,
        timeout: float | None,
        ping_interval: float,
        broker_timeout: float,
        endpoint: str | None,
    ) -> None:
        self.broker = check_broker_name(broker)
        self.timeout = timeout
        check_intervals(ping_interval, broker_timeout)
        self._channel_args = (broker, ping_interval, broker_timeout, endpoint)
        self._lock = asyncio.Lock()

    # --- opening ---

    async def _open(self) -> None:
        proto = self._proto
        channel = _AsyncChannel(self, *self._channel_args)
        self._channel = channel
        self._done = False
        try:
            try:
                async with asyncio.timeout(self._timeout) as scope:
                    await channel.send(proto.open_command())
                    while proto.phase is Phase.OPENING:
                        await self._wait_reply()
            except TimeoutError:
                if scope.expired():
                    raise self._timed_out("opening") from None
                raise
            if proto.phase is not Phase.OPEN:
                raise fresh(proto.error or ProtocolError("open failed"))
        except BaseException:
            self._close_now()
            raise

    # --- properties ---

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("I/O operation on closed pipe")

    # --- called by the channel's pump ---

    def _on_frames(self, frames: Iterable[zmq.Frame]) -> None:
        receive = self._proto.receive_frame
        for frame in frames:
            receive(frame)

    def _on_lost(self, error: BrokerUnavailable) -> None:
        """The connection is gone (every reply that arrived before was taken): fail what is
        still outstanding."""
        self._proto.connection_lost(error)

    # --- waiting ---

    async def _wait_reply(self) -> None:
        """Until the protocol state changed (a reply, or the connection was lost)."""
        try:
            await self._channel.wait()  # type: ignore[union-attr]
        except BrokerUnavailable as exc:
            self._on_lost(exc)
            self._after_lost()

    def _after_lost(self) -> None:
        """Raise what a dead channel means for this end, if it must stop here."""

    # --- closing ---

    async def _finish(self) -> None:
        """Send CLOSE (if the broker holds an end for us) and wait for CLOSE_OK, bounded by the
        broker's liveness; close the socket. No CLOSE once the broker dropped the end by itself
        or the connection to it is lost."""
        if self._done:
            return
        self._done = True
        channel, proto = self._channel, self._proto
        try:
            if channel is not None and proto.needs_close and channel.dead is not None:
                proto.connection_lost(channel.dead)
            if channel is not None and proto.needs_close:
                await channel.send(proto.close_command(), bound=CLOSE_SEND_BOUND)
                while proto.phase is Phase.CLOSING:
                    try:
                        await channel.wait()
                    except BrokerUnavailable as exc:
                        proto.connection_lost(exc)
                        if isinstance(proto, WriterProtocol):
                            raise  # the end of the writer's stream is not confirmed
                        break
        finally:
            if channel is not None:
                channel.close()

    def _cut(self) -> None:
        """Drop the end at once: a writer sends no CLOSE and closes its socket with no linger
        (the broker fails its readers); a reader sends CLOSE if there is room."""
        if self._done:
            return
        self._done = True
        cut_channel(self._channel, self._proto)

    def _close_now(self) -> None:
        """Close without waiting (an end dropped unclosed, or still open when its event loop
        shuts down): send CLOSE if there is room, so that the readers see the end of the
        stream, but only if the broker acknowledged everything written; else cut."""
        if self._done:
            return
        proto = self._proto
        if isinstance(proto, WriterProtocol) and proto.outstanding:
            self._cut()  # a CLOSE now would cancel the unacknowledged WRITEs in the broker
            return
        self._done = True
        channel = self._channel
        if channel is not None:
            if proto.needs_close:
                channel.send_last(proto.close_command())
            channel.close()

    def abort(self) -> None:
        """Drop the pipe end at once, without waiting (not even for a call in progress in
        another task); never raises.

        A writer sends no CLOSE: its socket is closed with no linger, the broker sees its
        connection go without a CLOSE, and the readers of its stream fail ("writer lost: ...")
        after the data the broker had taken; what it had not acknowledged yet may be dropped.
        A reader sends a CLOSE if there is room for it, and does not wait for the answer."""
        self._cut()
        self._closed = True

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leaving an ``async with`` block: :meth:`close` normally, :meth:`abort` when an
        exception (a cancellation too) leaves it: a writer's readers then fail instead of
        seeing the end of the stream."""
        if exc_type is not None:
            self.abort()
        else:
            await self.close()

    async def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __del__(self) -> None:
        if self._done or sys.is_finalizing():
            return
        try:
            self._close_now()
        except Exception:  # a finalizer has nobody to report to
            pass


class AsyncPipeReader(ReaderResults, _AsyncPipeEnd):
    """The reading end of a named pipe (get one with :func:`open`).

    ``await read(n)`` returns exactly ``n`` bytes, fewer only at end of stream, and ``b""`` at
    end of stream; ``await read()`` reads to the end. ``await read1(n)`` returns what has
    arrived (at least one byte, waiting for some). Lines: ``await readline()`` and
    ``async for line in reader``. Every call waits at most ``timeout`` seconds and then raises
    :class:`PipeTimeout`, with nothing lost. When a failure follows data, ``read`` and
    ``readline`` raise at once, leaving the data; ``read1`` returns it first.
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
        """An unopened reader: ``await reader.open()`` (or use :func:`open`)."""
        self._proto = ReaderProtocol(name, read_size, read_ahead, buffer_limit)
        super().__init__(broker, timeout, ping_interval, broker_timeout, endpoint)

    async def open(self) -> AsyncPipeReader:
        if self._channel is not None:
            raise RuntimeError("the pipe end was opened already")
        await self._open()
        self._top_up()
        return self

    # --- the engine ---

    def _top_up(self, blocking: bool = False) -> None:
        """Send the READs the protocol wants now, as far as the queue has room (no waiting)."""
        proto = self._proto
        count = proto.reads_wanted(blocking)
        if not count:
            return
        channel = self._channel
        assert channel is not None
        try:
            for _ in range(count):
                if not channel.try_send(proto.read_frame):
                    break
                proto.reads_sent(1)
        except BrokerUnavailable as exc:
            # The error follows the data that did arrive, raised by the call that reaches it.
            self._on_lost(exc)

    async def _fill(self) -> None:
        """Wait until the stream changed (data, a marker) or the connection was lost."""
        proto, channel = self._proto, self._channel
        assert channel is not None
        self._top_up(blocking=True)
        if proto.final:
            return  # the connection was found lost
        if proto.outstanding == 0:
            if proto.phase is not Phase.OPEN:
                raise ProtocolError(f"pipe {proto.label!r}: nothing to wait for")  # cannot happen
            # The queue to the broker is full: wait for room to send one READ.
            try:
                await channel.send(proto.read_frame)
            except BrokerUnavailable as exc:
                self._on_lost(exc)
                return
            proto.reads_sent(1)
        await self._wait_reply()
        self._top_up()

    async def _wait_ready(self, size: int) -> None:
        """Wait until ``size`` bytes are ready or a marker follows the ready data."""
        proto = self._proto
        if proto.ready >= size or proto.final:
            return
        try:
            async with asyncio.timeout(self._timeout) as scope:
                while proto.ready < size and not proto.final:
                    await self._fill()
        except TimeoutError:
            if scope.expired():
                raise self._timed_out("read from") from None
            raise

    # --- reading ---

    async def read(self, size: int | None = -1) -> bytes:
        """Exactly ``size`` bytes, fewer only at end of stream, ``b""`` at end of stream;
        without ``size`` (or < 0): everything up to end of stream."""
        self._check_usable()
        if size is None or size < 0:
            return await self.readall()
        if size == 0:
            return b""
        async with self._lock:
            self._check_usable()
            await self._wait_ready(size)
            return self._take_exact(size)

    async def readall(self) -> bytes:
        """Read to end of stream."""
        self._check_usable()
        async with self._lock:
            self._check_usable()
            proto = self._proto
            if not proto.final:
                try:
                    async with asyncio.timeout(self._timeout) as scope:
                        while not proto.final:
                            await self._fill()
                except TimeoutError:
                    if scope.expired():
                        raise self._timed_out("read from") from None
                    raise
            return self._take_all()

    async def read1(self, size: int = -1) -> bytes:
        """What has arrived, at most ``size`` bytes (at least one: waits for some);
        ``b""`` at end of stream."""
        self._check_usable()
        if size == 0:
            return b""
        async with self._lock:
            self._check_usable()
            await self._wait_ready(1)
            return self._take_some(size)

    async def readline(self, size: int | None = -1) -> bytes:
        """One line, with its newline (the last line of a stream may have none); at most
        ``size`` bytes; ``b""`` at end of stream."""
        self._check_usable()
        limit = sys.maxsize if size is None or size < 0 else size
        if limit == 0:
            return b""
        async with self._lock:
            self._check_usable()
            line, scanned = self._line(limit, 0)
            if line is None:
                try:
                    async with asyncio.timeout(self._timeout) as scope:
                        while line is None:
                            await self._fill()
                            line, scanned = self._line(limit, scanned)
                except TimeoutError:
                    if scope.expired():
                        raise self._timed_out("read from") from None
                    raise
            if line:
                self._top_up()
            return line

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        line = await self.readline()
        if not line:
            raise StopAsyncIteration
        return line

    # --- closing ---

    async def close(self) -> None:
        """Send CLOSE and wait for CLOSE_OK (unread data is dropped); close the socket."""
        if self._done:
            self._closed = True
            return
        async with self._lock:
            try:
                await self._finish()
            except ZpipesError:
                pass  # nothing can be lost by a reader that fails to close
            finally:
                self._closed = True


class AsyncPipeWriter(WriterCounters, _AsyncPipeEnd):
    """The writing end of a named pipe (get one with :func:`open`).

    ``await write(data)`` sends the data in chunks of at most ``chunk_size`` bytes, with at
    most ``window`` chunks unacknowledged, and returns once it is sent (it waits only while the
    window is full). An error of an earlier write is raised by the next ``write``, ``flush`` or
    ``close``. ``await flush()`` waits until the broker accepted everything; ``await close()``
    flushes, then closes the pipe end, so that the reader sees the end of the stream. Do close
    (or use ``async with``). ``abort()`` cuts the stream instead: its readers fail with "writer
    lost", after the data the broker took. An ``async with`` block left by an exception (a
    cancellation too) aborts, and so does a ``close`` whose flush fails or is cancelled.
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
        """An unopened writer: ``await writer.open()`` (or use :func:`open`)."""
        self._proto = WriterProtocol(name, chunk_size, window)
        super().__init__(broker, timeout, ping_interval, broker_timeout, endpoint)

    async def open(self) -> AsyncPipeWriter:
        if self._channel is not None:
            raise RuntimeError("the pipe end was opened already")
        await self._open()
        return self

    # --- the engine ---

    def _after_lost(self) -> None:
        self._proto.check()

    async def _wait_window(self) -> None:
        """Wait until one more WRITE may be sent; raise an earlier write's error."""
        proto = self._proto
        proto.check()
        while proto.window_full:
            await self._wait_reply()
            proto.check()

    async def _send_chunk(self, chunk: memoryview) -> None:
        proto, channel = self._proto, self._channel
        assert channel is not None
        size = len(chunk)
        try:
            await channel.send(proto.write_frame(chunk), copy=size < ZERO_COPY_MIN)
        except BrokerUnavailable as exc:
            self._on_lost(exc)
            proto.check()
            raise
        proto.write_sent(size)  # nothing awaited since the frame was queued

    # --- writing ---

    async def write(self, data: Any) -> int:
        """Send ``data`` (any bytes-like object); returns its length once it is sent.
        On a timeout, :attr:`PipeTimeout.written` tells how much of it was sent."""
        self._check_usable()
        view = memoryview(data).cast("B")
        total = len(view)
        async with self._lock:
            self._check_usable()
            proto = self._proto
            proto.check()
            step = proto.chunk_size
            pos = 0
            try:
                async with asyncio.timeout(self._timeout) as scope:
                    while pos < total:
                        await self._wait_window()
                        chunk = view[pos : pos + step]
                        await self._send_chunk(chunk)
                        pos += len(chunk)
            except TimeoutError:
                if scope.expired():
                    raise self._timed_out("write to", pos) from None
                raise
            return total

    async def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            await self.write(line)

    async def flush(self) -> None:
        """Wait until the broker accepted everything written so far."""
        if self._done:
            return
        self._check_usable()
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        proto = self._proto
        proto.check()
        if not proto.outstanding:
            return
        try:
            async with asyncio.timeout(self._timeout) as scope:
                while proto.outstanding:
                    await self._wait_reply()
                    proto.check()
        except TimeoutError:
            if scope.expired():
                raise self._timed_out("flush of") from None
            raise

    # --- closing ---

    async def close(self) -> None:
        """Flush, then close the pipe end (the readers see the end of the stream) and wait
        for the broker's CLOSE_OK. The stream ends only once the broker took all of it: if
        the flush fails, times out or is cancelled, the end is aborted instead (the readers
        fail) and close raises what the flush raised."""
        if self._done:
            self._closed = True
            return
        async with self._lock:
            if self._done:
                self._closed = True
                return
            try:
                try:
                    await self._flush()
                except BaseException:
                    self._cut()  # not all taken: the readers must not see an end
                    raise
                await self._finish()
                if self._proto.close_error is not None:
                    raise fresh(self._proto.close_error)
            finally:
                self._closed = True


async def open(
    name: str | bytes,
    mode: str = "r",
    broker: str = DEFAULT_BROKER,
    timeout: float | None = None,
    **opts: Any,
) -> AsyncPipeReader | AsyncPipeWriter:
    """Open pipe ``name`` on ``broker`` for reading (mode ``"r"``/``"rb"``: an
    :class:`AsyncPipeReader`) or writing (``"w"``/``"wb"``: an :class:`AsyncPipeWriter`).

    ``timeout`` (seconds; None waits for ever) bounds the open and every read, write and
    flush. Other options: ``ping_interval``, ``broker_timeout``, ``endpoint``; for readers
    ``read_size``, ``read_ahead``, ``buffer_limit``; for writers ``chunk_size``, ``window``
    (as for :func:`zpipes.open`). There is no text mode.
    """
    if mode not in ("r", "rb", "w", "wb"):
        raise ValueError(f"invalid mode {mode!r}: use 'r', 'rb', 'w' or 'wb'")
    check_options(mode, opts)
    if mode[0] == "r":
        return await AsyncPipeReader(name, broker, timeout, **opts).open()
    return await AsyncPipeWriter(name, broker, timeout, **opts).open()


__all__ = ["AsyncPipeReader", "AsyncPipeWriter", "open"]

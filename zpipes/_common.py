"""What the sync client (:mod:`zpipes.client`) and the asyncio client (:mod:`zpipes.aio`) share.

This module is private to the package: it is the contract between the two clients, which
differ only in how they wait (a lock and a heartbeat thread, or an event loop and a pump task).

* :class:`Liveness`: when to ping the broker and when a silent broker counts as gone. No I/O,
  no clock: the channel passes the time.
* :class:`EndBase`, :class:`ReaderResults` and :class:`WriterCounters`: what a pipe end, a
  reading end and a writing end of either client say and return once their waiting is done.
* The options of ``open()`` and small helpers.
"""

from __future__ import annotations

from zpipes import protocol as p
from zpipes.client_protocol import EOF, fresh
from zpipes.errors import BrokerUnavailable, PipeTimeout, ZpipesError
from zpipes.hint import with_hint

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

PING = p.encode(p.Ping())

READER_OPTS = frozenset({"read_size", "read_ahead", "buffer_limit"})
WRITER_OPTS = frozenset({"chunk_size", "window"})
COMMON_OPTS = frozenset({"ping_interval", "broker_timeout", "endpoint"})


def join_parts(parts: list[memoryview]) -> bytes:
    if len(parts) == 1:
        return bytes(parts[0])
    return b"".join(parts)


def check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    timeout = float(timeout)
    if not timeout >= 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout}")
    return timeout


def check_options(mode: str, opts: dict[str, Any], extra: frozenset[str] = frozenset()) -> None:
    """Raise TypeError for an option that a pipe end of ``mode`` (a valid mode, "r..." or
    "w...") does not take; ``extra``: further options the caller takes."""
    own = READER_OPTS if mode[0] == "r" else WRITER_OPTS
    unknown = set(opts) - own - COMMON_OPTS - extra
    if unknown:
        raise TypeError(f"unexpected option(s) for mode {mode!r}: {', '.join(sorted(unknown))}")


# --- liveness --------------------------------------------------------------------------------


def check_intervals(ping_interval: float, broker_timeout: float) -> None:
    if not ping_interval > 0:
        raise ValueError("ping_interval must be positive")
    if not broker_timeout > 0:
        raise ValueError("broker_timeout must be positive")


class Liveness:
    """The heartbeat rules of one channel: when to ping the broker, and until when a broker
    that said nothing counts as alive. The channel reports what it sent and heard, with the
    time (``monotonic()``); this class does no I/O and reads no clock."""

    def __init__(self, ping_interval: float, broker_timeout: float) -> None:
        check_intervals(ping_interval, broker_timeout)
        self.ping_interval = ping_interval
        self.broker_timeout = broker_timeout
        # While we hear nothing, probe the broker often enough to tell "slow" from "gone".
        self.probe_interval = min(ping_interval, broker_timeout / 3)
        self.last_send = self.last_recv = self.last_ping = 0.0

    def start(self, now: float) -> None:
        """The connection is made: as if we had just sent, heard and pinged."""
        self.last_send = self.last_recv = self.last_ping = now

    def sent(self, now: float) -> None:
        self.last_send = now

    def heard(self, now: float) -> None:
        self.last_recv = now

    def pinged(self, now: float) -> None:
        self.last_send = self.last_ping = now

    def ping_due(self) -> float:
        """When to ping: when we sent nothing for an interval (the broker must hear from us),
        and when we heard nothing for a while (we must hear from the broker), at most once per
        while."""
        return min(
            self.last_send + self.ping_interval,
            max(self.last_recv, self.last_ping) + self.probe_interval,
        )

    def send_limit(self, bound: float | None) -> float:
        """How long a send may wait for room in the queue to the broker: at most ``bound``
        (None: no bound of its own), never beyond ``broker_timeout``."""
        return self.broker_timeout if bound is None else min(bound, self.broker_timeout)

    def alive_until(self, start: float) -> float:
        """Until when the broker counts as alive for a wait that began at ``start``: for
        ``broker_timeout`` after the later of that and its last word."""
        return max(self.last_recv, start) + self.broker_timeout

    def silent(self, broker: str) -> BrokerUnavailable:
        """The error of a broker that stayed silent for too long."""
        return BrokerUnavailable(
            f"broker {broker!r} not responding (no answer for {self.broker_timeout:g} s)"
        )


def connection_lost(broker: str) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"lost the connection to broker {broker!r} (it stopped, died or restarted)"
    )


def not_taking(broker: str, waited: float) -> BrokerUnavailable:
    return BrokerUnavailable(f"broker {broker!r} is not taking messages (waited {waited:g} s)")


# --- pipe ends -------------------------------------------------------------------------------


class EndBase:
    """What every pipe end, sync or asyncio, says about itself. Needs ``_proto``,
    ``closed`` and (once set) ``broker``."""

    _proto: Any
    _timeout: float | None

    @property
    def name(self) -> str:
        """The pipe's name."""
        return self._proto.label

    @property
    def timeout(self) -> float | None:
        """Seconds that open, each read, each write and flush may take; None: for ever."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._timeout = check_timeout(value)

    def _timed_out(self, what: str, written: int = 0) -> PipeTimeout:
        return PipeTimeout(self._hinted(
            f"{what} pipe {self._proto.label!r} timed out after {self._timeout:g} s"), written
        )

    def _hinted(self, message: str) -> str:
        """A timeout's ``message``, with the broker's hint of what may be wrong there (e.g.
        "this broker has no peers: see zbroker status"; see zpipes/hint.py)."""
        channel = getattr(self, "_channel", None)
        return with_hint(message, getattr(channel, "_address", None))

    def __repr__(self) -> str:
        proto = getattr(self, "_proto", None)
        name = proto.label if proto is not None else "?"
        closed = self.closed  # type: ignore[attr-defined]
        state = "closed" if closed or proto is None else proto.phase.value
        return f"<{type(self).__name__} {name!r} broker={getattr(self, 'broker', '?')!r} {state}>"


class ReaderResults:
    """What a reading end returns once it waited (for data or a marker that follows the ready
    data): the same for both clients. Needs ``_proto`` (a ReaderProtocol) and ``_top_up()``,
    which sends the READs the protocol wants without waiting."""

    _proto: Any

    def _top_up(self, blocking: bool = False) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _at_marker(self) -> bytes:
        """Nothing is ready and a marker follows: b"" at EOF (consumed), else raise."""
        marker = self._proto.marker
        if marker is EOF:
            self._proto.consume_eof()
            return b""
        raise fresh(marker)

    def _take_exact(self, size: int) -> bytes:
        """For ``read(size)``: ``size`` bytes, fewer before an EOF, b"" at EOF; a failure
        that follows the ready data is raised at once, leaving the data."""
        proto = self._proto
        if proto.ready >= size:
            data = join_parts(proto.take(size))
        elif isinstance(proto.marker, ZpipesError):
            raise fresh(proto.marker)
        elif proto.ready:
            data = join_parts(proto.take(proto.ready))  # short: the stream ends after it
        else:
            return self._at_marker()
        self._top_up()
        return data

    def _take_all(self) -> bytes:
        """For ``readall()``, once a marker follows the ready data."""
        proto = self._proto
        if isinstance(proto.marker, ZpipesError):
            raise fresh(proto.marker)
        if not proto.ready:
            return self._at_marker()
        data = join_parts(proto.take(proto.ready))
        self._top_up()
        return data

    def _take_some(self, size: int | None) -> bytes:
        """For ``read1(size)``: what is ready, at most ``size`` bytes (None or < 0: all)."""
        proto = self._proto
        if not proto.ready:
            return self._at_marker()
        data = join_parts(proto.take(proto.ready if size is None or size < 0 else size))
        self._top_up()
        return data

    def _line(self, limit: int, scanned: int) -> tuple[bytes | None, int]:
        """(the next line if it is complete, else None; how far the ready data was scanned).
        b"" at end of stream (consumed); raises a failure that follows the ready data."""
        proto = self._proto
        stop = min(proto.ready, limit)
        found = proto.find_newline(scanned, stop)
        if found >= 0:
            return join_parts(proto.take(found + 1)), 0
        if proto.ready >= limit:
            return join_parts(proto.take(limit)), 0
        if proto.final:
            if isinstance(proto.marker, ZpipesError):
                raise fresh(proto.marker)
            if not proto.ready:
                return self._at_marker(), 0
            return join_parts(proto.take(proto.ready)), 0  # the last line, without a newline
        return None, stop


class WriterCounters:
    """The byte counters of a writing end. Needs ``_proto`` (a WriterProtocol)."""

    _proto: Any

    @property
    def bytes_sent(self) -> int:
        return self._proto.bytes_sent

    def _timed_out(self, what: str, written: int = 0) -> PipeTimeout:
        """A write waits only while no reader is attached or a reader's buffer is full: if
        the broker never took a byte, no reader attached in time, which is what to say."""
        if self._proto.bytes_acked == 0 and (written or self._proto.bytes_sent):
            return PipeTimeout(self._hinted(  # type: ignore[attr-defined]
                f"no reader attached to pipe {self._proto.label!r} within "
                f"{self._timeout:g} s"), written)  # type: ignore[attr-defined]
        return super()._timed_out(what, written)  # type: ignore[misc]

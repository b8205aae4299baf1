"""The broker's logging: a structlog pipeline configured once, at the edge.

    configure(level="info", format="console", file=None)   # at start, and again on SIGHUP
    log = get_logger(service="zpipes")                       # anywhere
    log.info("pipe opened", pipe="logs", client=7)

Shape of the pipeline: a few shared processors add the level and an ISO-8601 UTC timestamp;
the event dict then goes to every *sink* of the output, and each sink renders it its own way
(console line, JSON line) and writes it. A sink is any object with ``emit(level, event_dict)``
and ``close()``: the stream sink here, the syslog sink (zbroker.logs.syslog: a bounded queue and a
sender thread, never blocking), and *taps* that the broker adds for the life of the process
(the live log stream of ``zbroker logs``), which re-configuring leaves in place.

How many lines of a kind go out is bounded by one processor, the log budget (budget.py):
lines marked with a ``budget`` field (``log.info("pipe opened", budget="lines", ...)``) go out
a few times a second each (why brokers do not link: once a minute for each peer), and
repeated warnings of one source once every 10 s; the lines held back are counted in the next
that goes out, or in a line of their own (``flush_budget``, every second). A flood of bad
input (malformed frames, a refused peer reconnecting, a client opening and closing pipes)
costs a few lines, not one per message.

Re-configuring (SIGHUP) takes effect in loggers bound before it too, services' included:

* the processor list, the wrapper class and the output are the same objects for the life of
  the process, and ``configure`` changes them in place;
* level filtering is structlog's ``make_filtering_bound_logger``: its level methods are copied
  onto our wrapper class, so a disabled level is still a bare ``return None``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any, Protocol

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from zbroker.config import LOG_FORMATS, LOG_LEVELS
from zbroker.logs.budget import LogBudget
from zbroker.logs.syslog import SyslogSink

LEVEL_NUMBERS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class Sink(Protocol):
    def emit(self, level: str, event: EventDict) -> None:
        """Render and write one event. Must not raise and must not keep ``event``."""

    def close(self) -> None: ...


class StreamSink:
    """Renders each event to one line (console or JSON) and writes it to a text stream."""

    def __init__(self, stream: IO[str], format: str, *, owns_stream: bool = False):
        self.stream = stream
        self.owns_stream = owns_stream
        self.dropped = 0  # events lost to write errors
        self._lock = threading.Lock()
        if format == "json":
            self._render: Processor = _render_json
        else:
            colors = _isatty(stream) and "NO_COLOR" not in os.environ
            self._render = structlog.dev.ConsoleRenderer(
                colors=colors, exception_formatter=structlog.dev.plain_traceback)

    def emit(self, level: str, event: EventDict) -> None:
        try:
            line = self._render(None, level, event)
            with self._lock:
                self.stream.write(line + "\n")
                self.stream.flush()
        except (OSError, ValueError):  # disk full, closed pipe, closed file: never crash
            self.dropped += 1

    def close(self) -> None:
        if self.owns_stream:
            try:
                self.stream.close()
            except OSError:
                pass


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _render_json(logger: WrappedLogger, level: str, event: EventDict) -> str:
    event = structlog.processors.format_exc_info(logger, level, event)
    head = {k: event.pop(k) for k in ("timestamp", "level", "event") if k in event}
    return json.dumps({**head, **event}, default=str, ensure_ascii=False)


class _Output:
    """The one structlog "logger" of the process: hands each event to every sink."""

    def __init__(self) -> None:
        self.sinks: list[Sink] = [StreamSink(sys.stderr, "console")]
        self.syslog: SyslogSink | None = None  # also in sinks
        self.taps: list[Sink] = []  # added by add_tap, kept across configure

    def _emit(self, level: str, event: EventDict) -> None:
        for sink in self.sinks:
            sink.emit(level, dict(event))
        for sink in self.taps:
            sink.emit(level, dict(event))

    def debug(self, /, **event: Any) -> None:
        self._emit("debug", event)

    def info(self, /, **event: Any) -> None:
        self._emit("info", event)

    def warning(self, /, **event: Any) -> None:
        self._emit("warning", event)

    def error(self, /, **event: Any) -> None:
        self._emit("error", event)

    def critical(self, /, **event: Any) -> None:
        self._emit("critical", event)

    msg = info


def _event_kwargs(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """Last processor: the event dict reaches the output as keyword arguments."""
    return event


class BoundLogger(structlog.BoundLoggerBase):
    """The wrapper class of every logger; ``configure`` sets its level methods."""


_OUTPUT = _Output()
_PROCESSORS: list[Processor] = []
_configured_level = ""
_STAMP = structlog.processors.TimeStamper(fmt="iso", utc=True)


def _emit_summary(level: str, event: EventDict) -> None:
    """A line of the log budget that no logging call carries: stamped now, then output."""
    event.pop("timestamp", None)
    getattr(_OUTPUT, level, _OUTPUT.warning)(**_STAMP(None, level, event))


_BUDGET = LogBudget(emit=_emit_summary)


def _set_level(level: str) -> None:
    global _configured_level
    filtering = structlog.make_filtering_bound_logger(LEVEL_NUMBERS[level])
    for attr, value in vars(filtering).items():
        if not attr.startswith("__"):
            setattr(BoundLogger, attr, value)
    _configured_level = level


def configure(level: str = "info", format: str = "console", file: str | Path | None = None,
              *, stream: IO[str] | None = None, syslog: Any = None) -> None:
    """Set up (or re-set up) logging: ``level`` one of LOG_LEVELS, ``format`` one of LOG_FORMATS,
    to ``file`` (appended, line-buffered; reopened on every call, for log rotation), else to
    ``stream``, else to standard error.

    ``syslog``: the ``log.syslog`` config section (target, facility, format, queue), or None;
    a target of None means no syslog. An unchanged syslog sink is kept as it is (its queue,
    its connection), a changed one replaced.

    Raises OSError if the file cannot be opened, ValueError on a bad setting; nothing has
    changed then.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LOG_LEVELS)}")
    if format not in LOG_FORMATS:
        raise ValueError(f"log format {format!r}: expected one of {', '.join(LOG_FORMATS)}")
    syslog_sink = _OUTPUT.syslog
    target = getattr(syslog, "target", None)
    wanted = None if target is None else (str(target), syslog.facility, syslog.format,
                                          syslog.queue)
    if syslog_sink is not None and syslog_sink.settings != wanted:
        syslog_sink = None
    if wanted is not None and syslog_sink is None:
        syslog_sink = SyslogSink(target, facility=syslog.facility, format=syslog.format,
                                 queue=syslog.queue)
    try:
        if file is not None:
            sink = StreamSink(open(file, "a", buffering=1, encoding="utf-8"),
                              format, owns_stream=True)
        else:
            sink = StreamSink(stream if stream is not None else sys.stderr, format)
    except OSError:
        if syslog_sink is not None and syslog_sink is not _OUTPUT.syslog:
            syslog_sink.close()
        raise
    # to the old outputs: what is due, and every repeat count (the repeat rule starts afresh;
    # the budgets go on: a flood of reloads configures anew at each)
    _BUDGET.flush()
    _BUDGET.forget_repeats()
    old = _OUTPUT.sinks
    _OUTPUT.sinks = [sink] if syslog_sink is None else [sink, syslog_sink]
    _OUTPUT.syslog = syslog_sink
    for s in old:
        if s is not syslog_sink:
            s.close()
    _set_level(level)
    _PROCESSORS[:] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _BUDGET,
        _STAMP,
        _event_kwargs,
    ]
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=BoundLogger,
        logger_factory=lambda *args: _OUTPUT,
        cache_logger_on_first_use=True,
    )


def get_logger(**bind: Any) -> Any:
    """A logger with ``bind`` as context (e.g. ``service="zpipes"``)."""
    return structlog.get_logger().bind(**bind)


def flush_budget(everything: bool = False) -> int:
    """Write the counts of lines held back that are due (see budget.py): the broker calls it
    every second, and with ``everything`` when it stops. Returns how many lines it wrote."""
    return _BUDGET.flush(everything)


def current_level() -> str:
    """The level set by the last ``configure``."""
    return _configured_level


def add_tap(sink: Sink) -> None:
    """Send every event (at the configured level) to ``sink`` too, until ``remove_tap``."""
    _OUTPUT.taps.append(sink)


def remove_tap(sink: Sink) -> None:
    if sink in _OUTPUT.taps:
        _OUTPUT.taps.remove(sink)


def status() -> dict[str, Any]:
    """The outputs' counters, for the broker's status: events dropped by the stream sink,
    and the syslog sink's stats (None without syslog)."""
    dropped = sum(getattr(s, "dropped", 0) for s in _OUTPUT.sinks if isinstance(s, StreamSink))
    return {
        "level": _configured_level,
        "write_errors": dropped,
        "repeats_collapsed": _BUDGET.collapsed,
        "syslog": _OUTPUT.syslog.stats() if _OUTPUT.syslog is not None else None,
    }


def shutdown(timeout: float = 2.0) -> None:
    """At exit: give the syslog sink up to ``timeout`` seconds to send what it holds."""
    sink, _OUTPUT.syslog = _OUTPUT.syslog, None
    if sink is not None:
        _OUTPUT.sinks = [s for s in _OUTPUT.sinks if s is not sink]
        sink.close(timeout)


configure()  # a usable default (info, console, stderr) until the broker configures its own

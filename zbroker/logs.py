"""The broker's logging: a structlog pipeline configured once, at the edge.

    configure(level="info", format="console", file=None)   # at start, and again on SIGHUP
    log = get_logger(service="zpipes")                       # anywhere
    log.info("pipe opened", pipe="logs", client=7)

Shape of the pipeline: a few shared processors add the level and an ISO-8601 UTC timestamp;
the event dict then goes to every *sink* of the output, and each sink renders it its own way
(console line, JSON line) and writes it. A sink is any object with ``emit(level, event_dict)``;
syslog and the log stream socket will be further sinks beside the stream sink here.

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

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("console", "json")
_LEVEL_NUMBERS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


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

    def _emit(self, level: str, event: EventDict) -> None:
        for sink in self.sinks:
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


def _set_level(level: str) -> None:
    global _configured_level
    filtering = structlog.make_filtering_bound_logger(_LEVEL_NUMBERS[level])
    for attr, value in vars(filtering).items():
        if not attr.startswith("__"):
            setattr(BoundLogger, attr, value)
    _configured_level = level


def configure(level: str = "info", format: str = "console", file: str | Path | None = None,
              *, stream: IO[str] | None = None) -> None:
    """Set up (or re-set up) logging: ``level`` one of LEVELS, ``format`` one of FORMATS,
    to ``file`` (appended, line-buffered; reopened on every call, for log rotation), else to
    ``stream``, else to standard error.

    Raises OSError if the file cannot be opened; nothing has changed then.
    """
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    if format not in FORMATS:
        raise ValueError(f"log format {format!r}: expected one of {', '.join(FORMATS)}")
    if file is not None:
        sink = StreamSink(open(file, "a", buffering=1, encoding="utf-8"),
                          format, owns_stream=True)
    else:
        sink = StreamSink(stream if stream is not None else sys.stderr, format)
    old, _OUTPUT.sinks = _OUTPUT.sinks, [sink]
    for s in old:
        s.close()
    _set_level(level)
    _PROCESSORS[:] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
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


def current_level() -> str:
    """The level set by the last ``configure``."""
    return _configured_level


configure()  # a usable default (info, console, stderr) until the broker configures its own

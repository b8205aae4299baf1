"""Syslog streaming that can never block the broker.

The C library's ``syslog()`` blocks when the daemon is slow (the original zbroker's
"syslog system call is dangerous"). Here a log call only formats nothing and waits for
nothing: the sink snapshots the event, appends it to a bounded queue and returns. A
background thread renders each record and sends it; when the queue is full the record is
dropped and counted. The count is reported in ``stats()`` (the broker's ``status``) and in
the next record that reaches the server, as the structured-data element
``[dropped@32473 count="N"]`` (RFC 3164: `` syslog_dropped=N`` at the end of the message).

Formatting is pure (event in, bytes out)::

    format_rfc5424("info", {"event": "pipe opened", "pipe": "logs", "timestamp": ...},
                   facility="daemon", hostname="h", procid=42)
    -> b'<30>1 2026-11-22T02:20:32.123456Z h zbroker 42 pipe_opened '
       b'[zbroker@32473 pipe="logs"] pipe opened'

Transports (``parse_target``): ``udp://HOST[:PORT]`` (one datagram per record),
``tcp://HOST[:PORT]`` (RFC 6587 octet counting: ``LEN SP RECORD``), ``unix:///dev/log``
(a local datagram socket, as the C library uses). The default port is 514. A lost connection
is re-made with exponential backoff (BACKOFF_MIN to BACKOFF_MAX seconds); records wait in the
queue meanwhile, and are dropped only when it is full.

32473 is the private enterprise number reserved for examples (RFC 5612), the usual choice for
an SD-ID without a registered number of its own.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re
import select
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from zbroker.config import SYSLOG_FORMATS, Target, parse_target

FACILITIES = {
    "kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7,
    "uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11,
    **{f"local{i}": 16 + i for i in range(8)},
}
SEVERITIES = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
FORMATS = SYSLOG_FORMATS
APP_NAME = "zbroker"
SD_ID = "zbroker@32473"
DROPPED_SD_ID = "dropped@32473"

MAX_DATAGRAM = 8192  # bytes of one UDP or unix record (rsyslog's default limit is 8 KiB)
MAX_RECORD = 64 * 1024  # bytes of one TCP record
MAX_VALUE = 2048  # characters kept of one structured-data value
CONNECT_TIMEOUT = 2.0  # seconds for a TCP connect
#: bytes the kernel may hold for a TCP server (fixed: Linux would otherwise grow it to MiBs
#: that nobody counts; the queue is the buffer that is configured and reported)
TCP_SNDBUF = 256 * 1024
SEND_WAIT = 0.5  # seconds a datagram waits for room in the socket before it is dropped
STALL_TIMEOUT = 30.0  # seconds a TCP server may take no byte before the link is re-made
BACKOFF_MIN = 0.1  # seconds before the first reconnect; doubles up to BACKOFF_MAX
BACKOFF_MAX = 10.0
DRAIN_TIMEOUT = 1.0  # seconds a closed sink keeps sending what it holds


# --- targets -------------------------------------------------------------------------------


def resolve_format(format: str, target: Target) -> str:
    """``auto`` is RFC 3164 on a local socket (what /dev/log daemons parse), else RFC 5424."""
    if format == "auto":
        return "rfc3164" if target.transport == "unix" else "rfc5424"
    return format


# --- formatting (pure) ---------------------------------------------------------------------


def pri(facility: str, level: str) -> int:
    """PRI = facility * 8 + severity; an unknown level counts as notice (5)."""
    return FACILITIES[facility] * 8 + SEVERITIES.get(level, 5)


def snapshot(event: dict[str, Any]) -> dict[str, str]:
    """The event with every value as text, so that it can be kept and rendered later in
    another thread. An exception (``exc_info``) becomes its traceback under ``exception``."""
    out: dict[str, str] = {}
    for key, value in event.items():
        if key == "exc_info":
            text = _exception_text(value)
            if text:
                out["exception"] = text
            continue
        out[str(key)] = _text(value)
    return out


def _exception_text(exc_info: Any) -> str:
    import traceback

    if exc_info is True:
        import sys

        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if isinstance(exc_info, tuple) and exc_info and exc_info[0] is not None:
        return "".join(traceback.format_exception(*exc_info)).rstrip()
    return ""


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


_PRINTUSASCII = re.compile(r"[^\x21-\x7e]")
_SD_NAME_BAD = re.compile(r'[^\x21-\x7e]|[=\]"]')
_HEADER_KEYS = ("timestamp", "level", "event")


def _header_field(text: str, limit: int) -> str:
    """A header field: printable US-ASCII without spaces, at most ``limit``, "-" if empty."""
    return _PRINTUSASCII.sub("_", text)[:limit] or "-"


def _sd_name(text: str) -> str:
    return _SD_NAME_BAD.sub("_", text)[:32] or "_"


def _sd_value(text: str) -> str:
    if len(text) > MAX_VALUE:
        text = text[:MAX_VALUE] + "..."
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def _timestamp(event: dict[str, Any]) -> datetime:
    stamp = event.get("timestamp")
    if isinstance(stamp, str):
        try:
            parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            if parsed.tzinfo is not None:
                return parsed
        except ValueError:
            pass
    return datetime.now(UTC)


def format_rfc5424(level: str, event: dict[str, Any], *, facility: str = "daemon",
                   hostname: str = "-", procid: int | str | None = None,
                   app_name: str = APP_NAME, dropped: int = 0) -> bytes:
    """One RFC 5424 record (no framing): ``<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD MSG``.

    MSGID is the event name made a header token ("pipe opened" -> "pipe_opened", at most 32
    characters), MSG the event name as is; every other field of the event is a parameter of
    the ``zbroker@32473`` element (names made valid SD-NAMEs, values escaped); ``dropped`` > 0
    adds ``[dropped@32473 count="N"]``.
    """
    text = _text(event.get("event", ""))
    stamp = _timestamp(event).astimezone(UTC).isoformat(timespec="microseconds")
    stamp = stamp.replace("+00:00", "Z")
    params = "".join(f' {_sd_name(k)}="{_sd_value(_text(v))}"'
                     for k, v in event.items() if k not in _HEADER_KEYS)
    sd = f"[{SD_ID}{params}]" if params else ""
    if dropped:
        sd += f'[{DROPPED_SD_ID} count="{dropped}"]'
    header = " ".join((
        f"<{pri(facility, level)}>1", stamp, _header_field(hostname, 255),
        _header_field(app_name, 48), _header_field(str(procid or "-"), 128),
        _header_field(text, 32), sd or "-",
    ))
    return (header + (" " + text if text else "")).encode("utf-8", errors="backslashreplace")


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def format_rfc3164(level: str, event: dict[str, Any], *, facility: str = "daemon",
                   hostname: str | None = None, procid: int | str | None = None,
                   app_name: str = APP_NAME, dropped: int = 0) -> bytes:
    """One RFC 3164 (BSD) record: ``<PRI>Mmm dd hh:mm:ss HOST APP[PROCID]: MSG``, local time;
    MSG is the event name then ``key=value`` for each field. Without ``hostname`` (a local
    socket) the host is left out, as the C library does."""
    local = _timestamp(event).astimezone()
    stamp = f"{_MONTHS[local.month - 1]} {local.day:2d} {local:%H:%M:%S}"
    fields = [_text(event.get("event", ""))]
    for key, value in event.items():
        if key not in _HEADER_KEYS:
            fields.append(f"{key}={_quote(_text(value))}")
    if dropped:
        fields.append(f"syslog_dropped={dropped}")
    msg = " ".join(fields).replace("\n", "\\n")
    host = f"{_header_field(hostname, 255)} " if hostname else ""
    tag = _header_field(app_name, 32) + (f"[{procid}]" if procid is not None else "")
    return f"<{pri(facility, level)}>{stamp} {host}{tag}: {msg}".encode(
        "utf-8", errors="backslashreplace")


def _quote(text: str) -> str:
    if text and not re.search(r'[\s"=]', text):
        return text
    return json.dumps(text, ensure_ascii=False)


def frame_octet_counted(record: bytes) -> bytes:
    """RFC 6587 octet counting, for TCP: ``LEN SP RECORD``."""
    return b"%d %s" % (len(record), record)


# --- the sink ------------------------------------------------------------------------------


class SyslogSink:
    """A log sink (``emit(level, event)``) that hands records to a background sender.

    ``emit`` never blocks and never raises: it takes a snapshot of the event and appends it to
    a queue of at most ``queue`` records, or counts it as dropped when the queue is full.
    """

    def __init__(self, target: Target | str, *, facility: str = "daemon",
                 format: str = "auto", queue: int = 10_000, hostname: str | None = None,
                 procid: int | None = None):
        self.target = target if isinstance(target, Target) else parse_target(target)
        if facility not in FACILITIES:
            raise ValueError(f"syslog facility {facility!r}: expected one of "
                             f"{', '.join(FACILITIES)}")
        if format not in FORMATS:
            raise ValueError(f"syslog format {format!r}: expected one of {', '.join(FORMATS)}")
        self.facility = facility
        self.format = resolve_format(format, self.target)
        self.settings = (str(self.target), facility, format, queue)
        self.queue_size = queue
        self.hostname = hostname or socket.gethostname() or "-"
        self.procid = procid if procid is not None else os.getpid()
        self._queue: collections.deque[tuple[str, dict[str, str]]] = collections.deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # counters
        self._dropped = 0  # records lost, in total
        self._reported = 0  # of those, reported in a delivered record
        self._sent = 0
        self._connects = 0  # connections made (a datagram socket: each time it is made)
        self._sock: socket.socket | None = None
        self._connected = False
        self._last_error: str | None = None
        self._closing = False
        self._drain_until = 0.0
        self._thread = threading.Thread(target=self._run, name=f"syslog {self.target}",
                                        daemon=True)
        self._thread.start()

    # --- the broker's side ---------------------------------------------------------------

    def emit(self, level: str, event: dict[str, Any]) -> None:
        if self._closing:
            return
        try:
            record = (level, snapshot(event))
        except Exception:  # a value whose str() fails: never reach the caller
            self._count_drop()
            return
        if len(self._queue) >= self.queue_size:
            self._count_drop()
            return
        self._queue.append(record)
        self._wake.set()

    def close(self, timeout: float = 0.0) -> None:
        """Stop taking records; the sender keeps sending what it holds for at most
        DRAIN_TIMEOUT seconds, then ends. Waits up to ``timeout`` seconds for that."""
        if not self._closing:
            self._drain_until = time.monotonic() + DRAIN_TIMEOUT
            self._closing = True
            self._wake.set()
        if timeout > 0:
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        return {
            "target": str(self.target), "format": self.format, "facility": self.facility,
            "connected": self._connected, "queued": len(self._queue),
            "queue": self.queue_size, "sent": self._sent, "dropped": self._dropped,
            "reconnects": max(0, self._connects - 1), "last_error": self._last_error,
        }

    def _count_drop(self, n: int = 1) -> None:
        with self._lock:
            self._dropped += n

    # --- the sender thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = BACKOFF_MIN
        retry_at = 0.0
        try:
            while True:
                if self._closing and (not self._queue or time.monotonic() > self._drain_until):
                    break
                if self._sock is None:
                    now = time.monotonic()
                    if now < retry_at:
                        self._wait(min(retry_at - now, 1.0))
                        continue
                    try:
                        self._connect()
                        backoff = BACKOFF_MIN
                    except OSError as exc:
                        self._fail(exc)
                        retry_at = time.monotonic() + backoff
                        backoff = min(backoff * 2, BACKOFF_MAX)
                        continue
                if not self._queue:
                    self._wake.clear()
                    if not self._queue:
                        self._wait(1.0)
                    continue
                level, event = self._queue.popleft()
                unreported = self._dropped - self._reported
                data = self._render(level, event, unreported)
                try:
                    delivered = self._send(data)
                except OSError as exc:
                    self._count_drop()
                    self._fail(exc)
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                if delivered:
                    self._sent += 1
                    self._reported += unreported
                else:
                    self._count_drop()
        finally:
            with self._lock:
                self._dropped += len(self._queue)
            self._queue.clear()
            self._disconnect()

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)

    def _render(self, level: str, event: dict[str, str], dropped: int) -> bytes:
        fmt = format_rfc5424 if self.format == "rfc5424" else format_rfc3164
        host: str | None = self.hostname
        if fmt is format_rfc3164 and self.target.transport == "unix":
            host = None
        data = fmt(level, event, facility=self.facility, hostname=host,
                   procid=self.procid, dropped=dropped)
        if self.target.transport == "tcp":
            return frame_octet_counted(data[:MAX_RECORD])
        return data[:MAX_DATAGRAM]

    def _connect(self) -> None:
        t = self.target
        if t.transport == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.connect(t.path)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EPROTOTYPE:
                    raise OSError(exc.errno, f"{t.path} is not a datagram socket") from None
                raise
        else:
            kind = socket.SOCK_DGRAM if t.transport == "udp" else socket.SOCK_STREAM
            infos = socket.getaddrinfo(t.host, t.port, type=kind)
            family, kind, proto, _, address = infos[0]
            sock = socket.socket(family, kind, proto)
            if kind == socket.SOCK_STREAM:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TCP_SNDBUF)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect(address)
            except OSError:
                sock.close()
                raise
        sock.setblocking(False)
        self._sock = sock
        self._connected = True
        self._connects += 1

    def _send(self, data: bytes) -> bool:
        """Send one record; False if it was dropped (no room in time, datagram refused).
        Raises OSError when the link is lost."""
        sock = self._sock
        assert sock is not None
        if self.target.transport == "tcp":
            return self._send_stream(sock, data)
        for _ in range(2):
            try:
                sock.send(data)
                return True
            except BlockingIOError:
                select.select([], [sock], [], SEND_WAIT)
            except ConnectionRefusedError:
                if self.target.transport == "udp":  # an ICMP error of an earlier datagram
                    self._last_error = "connection refused"
                    return False
                raise
            except OSError as exc:
                if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS):
                    return False
                raise
        return False

    def _send_stream(self, sock: socket.socket, data: bytes) -> bool:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:  # the server closed (or, oddly, wrote): do not lose a record to a close
            try:
                if not sock.recv(4096):
                    raise ConnectionResetError(errno.ECONNRESET, "closed by the syslog server")
            except BlockingIOError:
                pass
        view = memoryview(data)
        last_progress = time.monotonic()
        while view:
            try:
                n = sock.send(view)
            except BlockingIOError:
                n = 0
            if n:
                view = view[n:]
                last_progress = time.monotonic()
                continue
            if time.monotonic() - last_progress > STALL_TIMEOUT:
                raise TimeoutError(errno.ETIMEDOUT, f"no progress for {STALL_TIMEOUT:g}s")
            if self._closing and time.monotonic() > self._drain_until:
                raise TimeoutError(errno.ETIMEDOUT, "closing")
            select.select([], [sock], [], SEND_WAIT)
        return True

    def _fail(self, exc: OSError) -> None:
        self._last_error = exc.strerror or str(exc)
        self._disconnect()

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._connected = False

"""The management socket: how ``zbroker status|get|set|reload|stop|logs`` talk to a broker.

One ZeroMQ ROUTER socket per broker, bound to ``<run_dir>/ctl`` (filesystem IPC; the run
directory has mode 0700, so only the broker's user can connect). Requests and replies are
one JSON frame each, behind the empty delimiter frame of a REQ socket::

    {"command": "status"}                                 -> {"ok": true, "result": {...}}
    {"command": "get", "key": "log.level"}                -> {"ok": true, "result": {...}}
    {"command": "set", "key": "log.level", "value": "debug"}
    {"command": "reload"}  {"command": "stop"}            -> {"ok": false, "error": "why"}
    {"command": "logs", "lines": 20, "follow": true, "level": "info", "pipe": "x"}

``logs`` answers with the last ``lines`` matching events the broker keeps (RECENT of them);
with ``follow`` the client (a DEALER) then receives ``{"log": event}`` for each new matching
event, ``{"dropped": n}`` when it was too slow to take n of them, and ``{"bye": reason}`` when
the broker stops. Matching is done in the broker: level at least ``level``, field ``pipe``
equal to ``pipe``. A follower sends ``{"command": "ping"}`` every PING_INTERVAL seconds and
is forgotten after FOLLOWER_TIMEOUT seconds of silence. Sending to a follower never waits:
at FOLLOWER_HWM messages queued for it, further events are dropped for it alone.

The broker only sees events at its configured ``log.level``; a follower asking for a lower
level gets nothing more (set ``log.level`` with ``zbroker set`` for that).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import json
import os
import pwd
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog
import zmq

from zbroker.runtime.limits import CONTROL_CONNECTIONS, CONTROL_PER_SOURCE
from zbroker.runtime.zmq_reader import SocketReader
from zbroker.zmtp.admission import Admission, ConnectionBudget
from zbroker.zmtp.libzmq_door import LibzmqDoor
from zbroker.zmtp.refusals import Refusals

from . import logs
from .logs import LEVEL_NUMBERS

CONTROL_SOCKET = "ctl"
RECENT = 1000  # events kept for `zbroker logs`
FOLLOWER_HWM = 1000  # messages queued for one follower before its events are dropped
FOLLOWER_TIMEOUT = 5.0  # seconds of silence before a follower is forgotten
PING_INTERVAL = 1.0  # seconds between a follower's pings
REQUEST_TIMEOUT = 5.0  # seconds a command waits for the broker's answer
MAX_REQUEST = 1 << 20  # bytes of one request
DRAIN_BUDGET = 100  # requests handled per readiness event
IPC_PATH_MAX = 107  # bytes of a unix socket path (sun_path less its NUL)


class NotRunning(Exception):
    """No broker answers on the control socket; the message is for the operator."""


class NoAccess(Exception):
    """This user may not use the control socket; the message is for the operator."""


class SocketPath:
    """``directory/name`` as an IPC address. A path too long for a unix socket is reached
    through ``/proc/self/fd/N/name``, N a descriptor of the directory held until ``close``."""

    def __init__(self, directory: Path, name: str):
        self.path = Path(directory) / name
        self._fd: int | None = None
        if len(os.fsencode(str(self.path))) <= IPC_PATH_MAX:
            self.address = str(self.path)
        else:
            self._fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
            self.address = f"/proc/self/fd/{self._fd}/{name}"

    @property
    def endpoint(self) -> str:
        return "ipc://" + self.address

    def answers(self) -> bool:
        """True if something accepts a connection there (a live broker, not a stale file)."""
        return self.probe() == "answers"

    def probe(self) -> str:
        """What a connection there meets: "answers" (a live broker), "stale" (a socket file
        nobody listens on), "missing" (no socket), or "denied" (this user may not)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(self.address)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    return "denied"
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    return "missing"
                return "stale"
            return "answers"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _ordered(level: str, event: dict[str, Any]) -> dict[str, Any]:
    """An event with timestamp, level and event first (the tap has already turned an
    exception into text); odd values become text when it is sent (``default=str``)."""
    head = {k: event[k] for k in ("timestamp", "level", "event") if k in event}
    head.setdefault("level", level)
    return {**head, **event}


@dataclass
class Follower:
    ident: bytes
    level: int
    pipe: str | None
    last_seen: float
    dropped: int = 0

    def wants(self, level: str, event: dict[str, Any]) -> bool:
        if LEVEL_NUMBERS.get(level, 20) < self.level:
            return False
        return self.pipe is None or event.get("pipe") == self.pipe


class ControlServer:
    """The broker's side: binds the control socket, answers commands on the broker's loop,
    keeps the recent events and feeds followers (a log tap, see zbroker.logs.add_tap).

    ``handlers`` maps a command to ``(request) -> result``; a handler raises CommandError
    with a message for the operator to refuse."""

    def __init__(self, run_dir: Path, zmq_context: zmq.Context,
                 loop: asyncio.AbstractEventLoop, handlers: dict[str, Callable[[dict], Any]],
                 log: Any):
        self.run_dir = Path(run_dir)
        self.zmq_context = zmq_context
        self.loop = loop
        self.handlers = dict(handlers)
        self._own: dict[str, Callable[[dict, bytes], Any]] = {
            "logs": self._logs, "ping": self._ping}
        self.log = log
        self.where: SocketPath | None = None
        self.recent: collections.deque[tuple[str, dict[str, Any]]] = collections.deque(
            maxlen=RECENT)
        self.followers: dict[bytes, Follower] = {}
        self.dropped = 0  # events followers were too slow to take, in total
        self._sock: zmq.Socket | None = None
        self._reader: SocketReader | None = None
        self._door: LibzmqDoor | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._thread = threading.get_ident()

    @property
    def path(self) -> Path:
        return self.run_dir / CONTROL_SOCKET

    def start(self) -> None:
        """Bind; raises CommandError if another live broker owns the socket."""
        where = SocketPath(self.run_dir, CONTROL_SOCKET)
        if where.answers():
            where.close()
            raise CommandError(f"another broker answers on {self.path}: two brokers cannot "
                               f"share a run directory (broker.run_dir)")
        sock = self.zmq_context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, FOLLOWER_HWM)
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST)
        sock.setsockopt(zmq.LINGER, 0)
        # its connections hold at most their part of the open-file limit, as every
        # listener's do: a local flood of them must not use up the descriptors
        # (libzmq_door.py)
        budget = ConnectionBudget(CONTROL_CONNECTIONS, CONTROL_PER_SOURCE)
        door = LibzmqDoor(self.loop, Admission("control", Refusals(self.log), budget=budget))
        door.prepare(sock)
        try:
            sock.bind(where.endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            where.close()
            raise CommandError(f"cannot bind the control socket {self.path}: {exc}") from None
        self.where, self._sock, self._door = where, sock, door
        door.watch(sock, f"inproc://zbroker.control.{id(self)}")
        self._thread = threading.get_ident()
        self._reader = SocketReader(self.loop, sock, self._on_request, budget=DRAIN_BUDGET)
        self._reader.start()
        self._timer = self.loop.call_later(PING_INTERVAL, self._expire)
        logs.add_tap(self)

    def stop(self, reason: str = "broker stopping") -> None:
        """Tell followers, close the socket, remove its file. ``release`` after the ZeroMQ
        context has ended."""
        logs.remove_tap(self)
        sock, self._sock = self._sock, None
        if sock is None:
            return
        for f in list(self.followers.values()):
            self._send(sock, f.ident, {"bye": reason})
        self.followers.clear()
        self._reader.stop()
        self._door.stop()
        if self._timer is not None:
            self._timer.cancel()
        sock.close(linger=200)  # the replies and byes already queued may still go out
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def release(self) -> None:
        if self.where is not None:
            self.where.close()
            self.where = None

    def status(self) -> dict[str, Any]:
        return {"socket": str(self.path), "followers": len(self.followers),
                "followers_dropped": self.dropped,
                **({"connections": self._door.status()} if self._door is not None else {})}

    # --- the log tap ---------------------------------------------------------------------

    def emit(self, level: str, event: dict[str, Any]) -> None:
        if "exc_info" in event:
            event = structlog.processors.format_exc_info(None, level, event)
        self.recent.append((level, event))
        if not self.followers:
            return
        if threading.get_ident() != self._thread:  # a log call from another thread
            self.loop.call_soon_threadsafe(self._publish, level, event)
        else:
            self._publish(level, event)

    def close(self) -> None:
        pass

    def _publish(self, level: str, event: dict[str, Any]) -> None:
        sock = self._sock
        if sock is None:
            return
        frame: bytes | None = None
        for f in list(self.followers.values()):
            if not f.wants(level, event):
                continue
            if f.dropped:
                if not self._send(sock, f.ident, {"dropped": f.dropped}):
                    f.dropped += 1
                    self.dropped += 1
                    continue
                f.dropped = 0
            if frame is None:
                frame = json.dumps({"log": _ordered(level, event)}, default=str).encode()
            if not self._send(sock, f.ident, frame):
                f.dropped += 1
                self.dropped += 1
        if frame is not None and self._reader is not None:
            self._reader.recheck()  # sending may have taken the edge of a request

    # --- requests ------------------------------------------------------------------------

    def _on_request(self, frames: list[bytes]) -> None:
        if self._sock is not None:
            self._handle(self._sock, frames)

    def _handle(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        ident = frames[0]
        try:
            request = json.loads(frames[-1])
            command = request["command"]
            if command not in self._own:
                handler = self.handlers[command]
        except (ValueError, KeyError, TypeError):
            known = ", ".join(sorted([*self.handlers, *self._own]))
            self._send(sock, ident, {"ok": False, "error": f"bad request; commands: {known}"})
            return
        if ident in self.followers:
            self.followers[ident].last_seen = time.monotonic()
        try:
            if command in self._own:
                result = self._own[command](request, ident)
            else:
                result = handler(request)
        except CommandError as exc:
            self._send(sock, ident, {"ok": False, "error": str(exc)})
            return
        except Exception as exc:  # a bug: answer, log, keep serving
            self.log.exception("management command failed", command=command)
            self._send(sock, ident, {"ok": False, "error": f"internal error: {exc!r}"})
            return
        if self._sock is not None:
            self._send(sock, ident, {"ok": True, "result": result})

    def _send(self, sock: zmq.Socket, ident: bytes, message: dict | bytes) -> bool:
        frame = message if isinstance(message, bytes) else json.dumps(message, default=str
                                                                        ).encode()
        try:
            sock.send_multipart([ident, b"", frame], zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError:  # EHOSTUNREACH: gone
            self.followers.pop(ident, None)
            return False

    def _logs(self, request: dict, ident: bytes) -> dict[str, Any]:
        level = request.get("level") or "debug"
        if level not in LEVEL_NUMBERS:
            raise CommandError(f"log level {level!r}: expected one of "
                               f"{', '.join(LEVEL_NUMBERS)}")
        pipe = request.get("pipe")
        lines = request.get("lines", 20)
        if not isinstance(lines, int) or lines < 0:
            raise CommandError("lines: expected an integer >= 0")
        f = Follower(ident, LEVEL_NUMBERS[level], pipe, time.monotonic())
        events = [_ordered(lv, ev) for lv, ev in self.recent if f.wants(lv, ev)]
        if request.get("follow"):
            self.followers[ident] = f
        return {"events": events[-lines:] if lines else [], "level": logs.current_level()}

    def _ping(self, request: dict, ident: bytes) -> str:
        return "pong"

    def _expire(self) -> None:
        now = time.monotonic()
        for ident, f in list(self.followers.items()):
            if now - f.last_seen > FOLLOWER_TIMEOUT:
                del self.followers[ident]
        if self._sock is not None:
            self._timer = self.loop.call_later(PING_INTERVAL, self._expire)


class CommandError(Exception):
    """A management command is refused; the message is for the operator."""


# --- the client's side ---------------------------------------------------------------------


def _connect(run_dir: Path, name: str, kind: int) -> tuple[zmq.Context, zmq.Socket, SocketPath]:
    """A socket connected to the broker's control socket. Raises NotRunning (no broker, or a
    socket left by a killed one) or NoAccess (this user may not use it), each with one line
    for the operator."""
    path = Path(run_dir) / CONTROL_SOCKET
    try:
        where = SocketPath(Path(run_dir), CONTROL_SOCKET)
    except (FileNotFoundError, NotADirectoryError):
        raise NotRunning(_elsewhere(name) or f"no broker named {name!r} is running (no run "
                         f"directory {run_dir})") from None
    except PermissionError:
        raise NoAccess(_denied(path)) from None
    found = where.probe()
    if found != "answers":
        where.close()
        if found == "denied":
            raise NoAccess(_denied(path))
        if found == "missing":
            raise NotRunning(_elsewhere(name) or f"no broker named {name!r} is running (no "
                             f"control socket {path})")
        raise NotRunning(f"no broker named {name!r} is running (nothing answers on "
                         f"{path}; it was left by a broker that was killed)")
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(where.endpoint)
    return ctx, sock, where


def _denied(path: Path) -> str:
    """The operator's line for a control socket this user may not use."""
    owner = ""
    for candidate in (path, path.parent):
        try:
            uid = candidate.stat().st_uid
        except OSError:
            continue
        try:
            owner = pwd.getpwuid(uid).pw_name
        except KeyError:
            owner = f"uid {uid}"
        break
    hint = f" (the broker runs as {owner}: run the command as that user)" if owner else ""
    return f"permission denied on {path}{hint}"


def request(run_dir: Path, name: str, message: dict[str, Any],
            timeout: float = REQUEST_TIMEOUT) -> Any:
    """Send one command to the broker ``name`` whose run directory is ``run_dir``; returns
    its result. Raises NotRunning, or CommandError with the broker's reason."""
    ctx, sock, where = _connect(run_dir, name, zmq.REQ)
    try:
        sock.send(json.dumps(message).encode())
        if not sock.poll(int(timeout * 1000)):
            raise NotRunning(f"broker {name!r} did not answer within {timeout:g}s "
                             f"on {where.path}")
        reply = json.loads(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()
        where.close()
    if not reply.get("ok"):
        raise CommandError(reply.get("error", "refused"))
    return reply.get("result")


def follow_logs(run_dir: Path, name: str, out: IO[str], *, format: str = "console",
                level: str | None = None, pipe: str | None = None, lines: int = 20,
                follow: bool = False, stop: Callable[[], bool] = lambda: False,
                notes: IO[str] | None = None) -> int:
    """Print the broker's recent events (and, with ``follow``, the new ones until the broker
    stops or ``stop()`` is true) to ``out``, and notes (events dropped, broker stopping) to
    ``notes`` (standard error by default). Returns an exit status."""
    notes = notes if notes is not None else sys.stderr
    ctx, sock, where = _connect(run_dir, name, zmq.DEALER)
    sink = logs.StreamSink(out, format)
    try:
        sock.send_multipart([b"", json.dumps({
            "command": "logs", "lines": lines, "follow": follow, "level": level, "pipe": pipe,
        }).encode()])
        if not sock.poll(int(REQUEST_TIMEOUT * 1000)):
            raise NotRunning(f"broker {name!r} did not answer within {REQUEST_TIMEOUT:g}s")
        reply = json.loads(sock.recv_multipart()[-1])
        if not reply.get("ok"):
            raise CommandError(reply.get("error", "refused"))
        for event in reply["result"]["events"]:
            sink.emit(event.get("level", "info"), event)
        broker_level = reply["result"].get("level")
        if level and broker_level in LEVEL_NUMBERS and \
                LEVEL_NUMBERS[level] < LEVEL_NUMBERS[broker_level]:
            print(f"zbroker logs: the broker logs at level {broker_level}: nothing below it "
                  f"(zbroker set log.level {level})", file=notes, flush=True)
        if not follow:
            return 0
        heard = pinged = time.monotonic()
        while not stop():
            if sock.poll(int(PING_INTERVAL * 1000 / 4)):
                message = json.loads(sock.recv_multipart()[-1])
                heard = time.monotonic()
                if "log" in message:
                    event = message["log"]
                    sink.emit(event.get("level", "info"), event)
                elif "dropped" in message:
                    print(f"zbroker logs: {message['dropped']} events dropped "
                          f"(this follower was too slow)", file=notes, flush=True)
                elif "bye" in message:
                    print(f"zbroker logs: {message['bye']}", file=notes, flush=True)
                    return 0
            now = time.monotonic()
            if now - pinged >= PING_INTERVAL:
                sock.send_multipart([b"", b'{"command": "ping"}'], zmq.NOBLOCK)
                pinged = now
            if now - heard > FOLLOWER_TIMEOUT:
                raise NotRunning(f"lost broker {name!r}: no answer for "
                                 f"{FOLLOWER_TIMEOUT:g}s")
        return 0
    except zmq.Again:
        raise NotRunning(f"broker {name!r} does not take requests") from None
    finally:
        sock.close(linger=0)
        ctx.term()
        where.close()


def _elsewhere(name: str) -> str | None:
    """When no control socket is where this user looks: a broker of that name may still
    run, as another user (its run directory is that user's). Its default ZPIPES endpoint
    (an abstract socket, seen by every user) says so, and who runs it."""
    import socket
    import struct

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(f"\0/zpipes/{name}")
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                       struct.calcsize("3i")))
    except OSError:
        return None
    finally:
        s.close()
    if uid == os.getuid():
        return None  # ours: then the run directory is the question, as said otherwise
    from zbroker.runtime.local_access import user_name

    return (f"a broker named {name!r} runs as {user_name(uid)} (pid {pid}), not as "
            f"{user_name(os.getuid())}: its control socket is in that user's run directory, "
            f"which this user does not look in; run this command as {user_name(uid)}, or "
            f"give --run-dir")


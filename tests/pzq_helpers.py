"""Running real pzq processes in tests (the standalone ``pzq`` command).

    q = start_pzq(tmp_path / "db", "--ack-timeout", "500000")
    q.receive, q.send, q.monitor     # its endpoints (free tcp ports on 127.0.0.1)
    q.stream                         # the stream endpoint (bound with "--mode", "stream")
    q.kill(); q = q.restart()        # SIGKILL, and the same queue again on the same data

Every wait has a deadline; the ``pzq`` fixture kills what still runs at teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from helpers import REPO_ROOT, endpoint_accepts, free_port, wait_for

from pzq.client import monitor
from zbroker.services.pzq.store import BatchResult

UP_TIMEOUT = 10.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class PzqProcess:
    database: Path
    args: tuple[str, ...]
    receive: str
    send: str
    monitor: str
    stream: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    preexec: Callable[[], None] | None = None
    _log: Any = field(default=None, repr=False)
    registry: list[Any] | None = field(default=None, repr=False)  # restarts are added to it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_up(self) -> PzqProcess:
        def up() -> bool:
            if not self.alive():
                raise AssertionError(f"pzq exited with {self.proc.returncode}:\n{self.log()}")
            return (endpoint_accepts(self.receive) and endpoint_accepts(self.send)
                    and (not self.stream_mode or endpoint_accepts(self.stream)))

        wait_for(up, UP_TIMEOUT, "pzq to listen")
        return self

    @property
    def stream_mode(self) -> bool:
        return "stream" in self.args and "--mode" in self.args

    def counters(self, timeout: float = 5.0) -> dict[str, int]:
        return monitor(self.monitor, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.alive():
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"pzq did not stop within {timeout}s:\n{self.log()}") from None
        finally:
            self._close()

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(5)
        self._close()

    def restart(self) -> PzqProcess:
        self.kill()
        q = spawn_pzq(self.database, *self.args, receive=self.receive, send=self.send,
                      monitor_=self.monitor, stream=self.stream, preexec=self.preexec,
                      registry=self.registry)
        return q.wait_up()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def spawn_pzq(database: Path, *args: str, receive: str | None = None, send: str | None = None,
              monitor_: str | None = None, stream: str | None = None,
              preexec: Callable[[], None] | None = None,
              registry: list[Any] | None = None) -> PzqProcess:
    database.mkdir(parents=True, exist_ok=True)
    receive = receive or f"tcp://127.0.0.1:{free_port()}"
    send = send or f"tcp://127.0.0.1:{free_port()}"
    monitor_ = monitor_ or f"ipc://{database.parent}/{database.name}.monitor"
    stream = stream or f"tcp://127.0.0.1:{free_port()}"
    log_path = database.parent / f"{database.name}.log"
    log = open(log_path, "ab")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "zbroker.services.pzq", "--database", str(database),
         "--receive-dsn", receive, "--send-dsn", send, "--monitor-dsn", monitor_,
         "--stream-dsn", stream, *args],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, preexec_fn=preexec)
    q = PzqProcess(database, tuple(args), receive, send, monitor_, stream, log_path, proc,
                   preexec, log, registry)
    if registry is not None:
        registry.append(q)
    return q


def preset_node(database: Path) -> str:
    """Give the queue of ``database`` its node id before it starts (as an operator may, to
    list it in a holder's ``--replica-sources``); returns it."""
    node = uuid.uuid4().hex
    database.mkdir(parents=True, exist_ok=True)
    (database / "node-id").write_text(node + "\n")
    return node


def vm_kb(pid: int, field_name: str = "VmRSS") -> int:
    """A memory figure of a process from /proc/PID/status, in KiB (VmRSS, VmHWM, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field_name} for {pid}")


def dealer(ctx: zmq.Context, endpoint: str, kind: int = zmq.DEALER) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def recv(sock: zmq.Socket, timeout: float = 5.0) -> list[bytes]:
    if not sock.poll(int(timeout * 1000)):
        raise AssertionError(f"nothing received within {timeout}s")
    return sock.recv_multipart()


def nothing(sock: zmq.Socket, timeout: float) -> bool:
    return not sock.poll(int(timeout * 1000))


def wait_counter(q: Any, name: str, predicate: Callable[[int], bool], timeout: float = 10.0
                 ) -> dict[str, int]:
    return wait_for(lambda: (c := q.counters()) and predicate(c[name]) and c, timeout,
                    f"counter {name}")


class FakeStore:
    """The log of a queue core, without a disk: it carries out the core's actions (appends,
    ACKs, producer replies, credit confirmations) when the test looks at them; writes
    complete when the test says (``done``)."""

    def __init__(self):
        self.core = None
        self.batch = 0
        self._appended: list[int] = []
        self._acked: list[int] = []
        self._replies: list[tuple[bytes, list[bytes]]] = []
        self._confirmations: list[tuple[Any, bytes, bytes]] = []

    def attach(self, core):
        self.core = core
        return core

    def pump(self) -> None:
        from zbroker.services.pzq.core.actions import (
            AckMany,
            Append,
            AppendBatch,
            Confirm,
            Move,
            Reply,
        )
        if self.core is None:
            return
        for a in self.core.take_output():
            if type(a) is Append:
                self._appended.append(a.seq)
            elif type(a) is AppendBatch:
                self._appended.extend(range(a.first_seq, a.first_seq + a.count))
            elif type(a) is AckMany:
                self._acked.extend(a.seqs)
            elif type(a) is Reply:
                self._replies.append((a.peer, a.frames))
            elif type(a) is Confirm:
                self._confirmations.append((a.consumer, a.key, a.status))
            elif type(a) is Move:
                raise AssertionError("nothing to compact here")

    @property
    def appended(self) -> list[int]:
        self.pump()
        return self._appended

    @property
    def acked(self) -> list[int]:
        self.pump()
        return self._acked

    @property
    def replies(self) -> list[tuple[bytes, list[bytes]]]:
        self.pump()
        return self._replies

    @property
    def confirmations(self) -> list[tuple[Any, bytes, bytes]]:
        self.pump()
        return self._confirmations

    def done(self, **kw) -> BatchResult:
        self.pump()
        r = BatchResult((self.batch,), 0, **kw)
        self.batch += 1
        return r


class RawProducer:
    """A producer that speaks ZMTP over a plain TCP socket, byte by byte as the test says:
    ``version=3`` as libzmq 4 does, ``version=2`` as libzmq 3.2 (the oldest the original pzq
    works with) does. It can send part of a message and stop there."""

    def __init__(self, endpoint: str, version: int = 3, identity: bytes = b"",
                 source: str | None = None, rcvbuf: int | None = None):
        """``source``: the local address to connect from (another loopback address is
        another host to the queue); ``rcvbuf``: its socket's receive buffer."""
        import socket
        import struct

        from zbroker import zmtp
        self._zmtp, self._struct = zmtp, struct
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        if rcvbuf is None:
            self.sock = socket.create_connection((host, int(port)), timeout=10,
                                                 source_address=(source, 0) if source else None)
        else:  # (a small receive buffer: a producer that reads slowly fills up soon)
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(10)
            if source:
                self.sock.bind((source, 0))
            self.sock.connect((host, int(port)))
        self._in = b""
        if version == 3:
            props = b""
            for name, value in ((b"Socket-Type", b"DEALER"), (b"Identity", identity)):
                props += bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
            self.sock.sendall(zmtp.SIGNATURE + bytes([3, 1]) + b"NULL".ljust(20, b"\0")
                              + b"\0" * 32 + zmtp.command(b"READY", props))
            self._read_exactly(64)
            self.read_frame()  # its READY
        else:
            self.sock.sendall(zmtp.SIGNATURE + b"\x01\x05"  # revision 1 (ZMTP 2.0), DEALER
                              + bytes([0, len(identity)]) + identity)
            assert self._read_exactly(12)[10:] == b"\x03\x06"  # major version 3, ROUTER
            assert self.read_frame() == (0, b"")  # its identity, as libzmq 3.2 expects

    def send(self, frames: list[bytes]) -> None:
        self.sock.sendall(self._zmtp.encode_message(frames))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> list[bytes]:
        frames = []
        while True:
            flags, body = self.read_frame()
            frames.append(body)
            if not flags & self._zmtp.MORE:
                return frames

    def read_frame(self) -> tuple[int, bytes]:
        flags = self._read_exactly(1)[0]
        if flags & self._zmtp.LONG:
            (n,) = self._struct.unpack(">Q", self._read_exactly(8))
        else:
            n = self._read_exactly(1)[0]
        return flags, self._read_exactly(n)

    def _read_exactly(self, n: int) -> bytes:
        while len(self._in) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the queue hung up")
            self._in += data
        out, self._in = self._in[:n], self._in[n:]
        return out

    def close(self) -> None:
        self.sock.close()

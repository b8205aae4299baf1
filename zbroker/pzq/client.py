"""Python clients of a pzq queue (the original's wire: they work with either pzq).

    with Producer("tcp://127.0.0.1:11131", window=64) as p:
        p.send(b"hello")            # blocks only while `window` messages await their ACK
        p.flush(timeout=10)         # every message ACKed (stored), or TimeoutError

    with Consumer("tcp://127.0.0.1:11132") as c:
        m = c.recv(timeout=5)       # a Message, or None after the timeout
        c.ack(m)                    # done; c.nack(m): deliver it again

The producer resends a message whose ACK has not come within ``retry_timeout`` (with the same
id, so the queue does not store it twice). A message refused with a "0" ACK is not resent: it
is in ``failed`` (id -> reason) and ``flush`` raises ProducerError.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq

from . import wire


class ProducerError(Exception):
    """Messages were refused by the queue; ``failed`` maps their ids to the reasons."""

    def __init__(self, failed: dict[bytes, str]):
        first = next(iter(failed.items()))
        super().__init__(f"{len(failed)} message(s) refused, e.g. {first[0]!r}: {first[1]}")
        self.failed = failed


@dataclass(frozen=True)
class Message:
    key: bytes
    sent_us: int
    ack_timeout_us: int
    frames: tuple[bytes, ...]

    @property
    def body(self) -> bytes:
        return b"".join(self.frames)


def _frames(body: bytes | Sequence[bytes]) -> list[bytes]:
    return [body] if isinstance(body, bytes | bytearray | memoryview) else list(body)


class Producer:
    def __init__(self, endpoint: str, *, window: int = 64, retry_timeout: float = 5.0,
                 context: zmq.Context | None = None,
                 on_ack: Callable[[bytes, bool, str], None] | None = None):
        self.window = window
        self.retry_timeout = retry_timeout
        self.on_ack = on_ack
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        self.outstanding: OrderedDict[bytes, tuple[float, list[bytes]]] = OrderedDict()
        self.acked = 0
        self.retried = 0
        self.replication_failed = 0
        self.failed: dict[bytes, str] = {}
        self._prefix = uuid.uuid4().hex[:16]
        self._n = 0

    def send(self, body: bytes | Sequence[bytes], msg_id: bytes | None = None,
             timeout: float | None = None) -> bytes:
        """Send one message (one or more body frames); returns its id. Waits (up to
        ``timeout``, then TimeoutError) while ``window`` messages are unACKed."""
        if msg_id is None:
            self._n += 1
            msg_id = f"{self._prefix}-{self._n}".encode()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.poll(0)
        while len(self.outstanding) >= self.window:
            wait = 0.1 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"{len(self.outstanding)} messages still unACKed")
            self.poll(min(wait, 0.1))
        frames = [msg_id, b"", *_frames(body)]
        self.outstanding[msg_id] = (time.monotonic(), frames)
        self.sock.send_multipart(frames, copy=len(frames[-1]) < 65536)
        return msg_id

    def poll(self, timeout: float) -> int:
        """Take the ACKs that came (waiting up to ``timeout`` for the first); resend what
        timed out. Returns the number of ACKs taken."""
        n = 0
        if self.sock.poll(int(timeout * 1000)):
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                n += self._ack(frames)
        self._retry()
        return n

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message sent is ACKed; TimeoutError, or ProducerError if some
        were refused."""
        deadline = time.monotonic() + timeout
        while self.outstanding:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.outstanding)} messages still unACKed")
            self.poll(min(left, 0.1))
        if self.failed:
            raise ProducerError(dict(self.failed))

    def _ack(self, frames: list[bytes]) -> int:
        if len(frames) < 2:
            return 0
        msg_id, status = frames[0], frames[1]
        if self.outstanding.pop(msg_id, None) is None:
            return 0  # the ACK of a resent message that was ACKed already
        text = frames[3].decode(errors="replace") if len(frames) > 3 else ""
        ok = status == wire.OK
        if ok:
            self.acked += 1
            if text == wire.REPLICATION_FAILED:
                self.replication_failed += 1
        else:
            self.failed[msg_id] = text
        if self.on_ack is not None:
            self.on_ack(msg_id, ok, text)
        return 1

    def _retry(self) -> None:
        if not self.outstanding:
            return
        now = time.monotonic()
        for msg_id, (sent, frames) in list(self.outstanding.items()):
            if now - sent < self.retry_timeout:
                break  # in send order: the rest is younger
            self.outstanding[msg_id] = (now, frames)
            self.outstanding.move_to_end(msg_id)
            self.retried += 1
            self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    def __init__(self, endpoint: str, *, context: zmq.Context | None = None,
                 rcvhwm: int | None = None):
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: wait for ever)."""
        if not self.sock.poll(None if timeout is None else int(timeout * 1000)):
            return None
        return self._decode(self.sock.recv_multipart())

    def recv_nowait(self) -> Message | None:
        try:
            return self._decode(self.sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return None

    @staticmethod
    def _decode(frames: list[bytes]) -> Message:
        if len(frames) < 4 or frames[3] != b"":
            raise ValueError(f"not a pzq delivery: {frames[:4]!r}")
        return Message(frames[0], int(frames[1]), int(frames[2]), tuple(frames[4:]))

    def ack(self, message: Message | bytes) -> None:
        key = message.key if isinstance(message, Message) else message
        self.sock.send_multipart([key, wire.OK])

    def nack(self, message: Message | bytes) -> None:
        key = message.key if isinstance(message, Message) else message
        self.sock.send_multipart([key, wire.FAILED])

    def close(self) -> None:
        self.sock.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def monitor(endpoint: str, timeout: float = 5.0, context: zmq.Context | None = None
            ) -> dict[str, int]:
    """The counters of a queue, by a MONITOR request to its monitor endpoint."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(wire.MONITOR)
        if not sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no MONITOR reply from {endpoint} within {timeout}s")
        return wire.parse_monitor_text(sock.recv_multipart()[-1])
    finally:
        sock.close()

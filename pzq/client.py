"""Python clients of a pzq queue (the original's wire: they work with either pzq).

    with Producer("tcp://127.0.0.1:11131", window=64) as p:
        p.send(b"hello")            # blocks only while `window` messages await their ACK
                                    # (or max_inflight_bytes of bodies, if given)
        p.flush(timeout=10)         # every message ACKed (stored), or TimeoutError

    with Consumer("tcp://127.0.0.1:11132") as c:
        m = c.recv(timeout=5)       # a Message, or None after the timeout
        c.ack(m)                    # done; c.nack(m): deliver it again

    with Consumer("tcp://127.0.0.1:11134", credit=8) as c:   # a queue's credit endpoint:
        ...                         # never more than 8 unACKed messages held by this consumer
        c.confirm(timeout=5)        # every ACK so far survives a crash of the queue

    with StreamConsumer("tcp://127.0.0.1:11133") as s:   # a queue in stream mode
        head, committed = s.offsets()
        for m in s.read(committed, head):   # StreamMessage(offset, key, sent_us, frames)
            ...
        s.commit(head)              # durable: those messages are gone for good

The producer resends a message whose ACK has not come within ``retry_timeout`` (with the same
id, so the queue does not store it twice). A message refused with a "0" ACK is not resent: it
is in ``failed`` (id -> reason) and ``flush`` raises ProducerError.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import zmq

from pzq import wire

ZERO_COPY_MIN = 1 << 16  # a frame this large is sent, or a batch received, without a copy

DEFAULT_BATCH_BYTES = 256 << 10  # a producer's batch goes once its bodies hold this much
DEFAULT_LINGER = 0.002  # seconds a producer's batch waits for more messages


class ProducerError(Exception):
    """Messages were refused by the queue; ``failed`` maps their ids to the reasons."""

    def __init__(self, failed: dict[bytes, str]):
        first = next(iter(failed.items()))
        super().__init__(f"{len(failed)} message(s) refused, e.g. {first[0]!r}: {first[1]}")
        self.failed = failed


class Message(NamedTuple):
    """A delivery: its key (to ACK it by), when the queue sent it and the ACK timeout it
    gave (µs), and its body frames. (A named tuple: made for every message a consumer
    takes, it costs a quarter of a frozen dataclass.)"""

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
                 on_ack: Callable[[bytes, bool, str], None] | None = None,
                 max_inflight_bytes: int | None = None, batch: int = 0,
                 batch_bytes: int = DEFAULT_BATCH_BYTES, linger: float = DEFAULT_LINGER):
        """``window``: most messages unACKed; ``max_inflight_bytes``: most bytes of bodies
        unACKed (None: no bound; a larger message still goes, alone). The ACK latency is
        about what is in flight divided by the rate the queue stores it (Little's law), so
        for big messages a byte window bounds it where a message window cannot.

        ``batch``: send up to that many messages in one batch (0: one ZeroMQ message per
        message, the original wire, which any pzq takes; batches need a queue of ours), and
        at most half the window (rounded up), so that one batch is being made while the
        last is being stored: a batch as large as the window would wait for its ACK before
        the next could start (stop and wait). A batch goes when it holds that many messages
        or ``batch_bytes`` of bodies, when the window is full, at :meth:`poll` and
        :meth:`flush`, or at the first :meth:`send` ``linger`` seconds after its first
        message (the client has no thread of its own: a last message waits for one of those
        calls). A message of several body frames goes alone, on the original wire."""
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if max_inflight_bytes is not None and max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be >= 1, got {max_inflight_bytes}")
        if not 0 <= batch <= wire.MAX_BATCH:
            raise ValueError(f"batch must be 0..{wire.MAX_BATCH}, got {batch}")
        self.batch = min(batch, (window + 1) // 2)
        self.batch_bytes = batch_bytes
        self.linger = linger
        self._batch_ids: list[bytes] = []
        self._batch_bodies: list[bytes] = []
        self._batch_size = 0
        self._batch_at = 0.0
        self.inflight = 0  # messages sent (or in the batch being made) and not ACKed
        self.window = window
        self.max_inflight_bytes = max_inflight_bytes
        self.inflight_bytes = 0
        self.retry_timeout = retry_timeout
        self.on_ack = on_ack
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        #: id (of a message, or of a batch) -> (sent at, frames, bytes of bodies, the ids
        #: of a batch's messages or None)
        self.outstanding: OrderedDict[bytes, tuple[float, list[bytes], int,
                                                   list[bytes] | None]] = OrderedDict()
        self.acked = 0
        self.retried = 0
        self.replication_failed = 0
        self.failed: dict[bytes, str] = {}
        self._prefix = uuid.uuid4().hex[:16]
        self._n = 0

    def send(self, body: bytes | Sequence[bytes], msg_id: bytes | None = None,
             timeout: float | None = None) -> bytes:
        """Send one message (one or more body frames); returns its id. Waits (up to
        ``timeout``, then TimeoutError) while ``window`` messages, or
        ``max_inflight_bytes`` of bodies with this one, are unACKed. An id over 255 bytes is
        refused here (ValueError): the queue would refuse it too, and could not name it in
        its answer."""
        if msg_id is None:
            self._n += 1
            msg_id = f"{self._prefix}-{self._n}".encode()
        elif len(msg_id) > wire.MAX_ID:
            raise ValueError(f"{wire.ID_TOO_LONG} ({len(msg_id)})")
        if type(body) is bytes:  # (the common case: no list made for it)
            body_frames: Sequence[bytes] = (body,)
            size = len(body)
        else:
            body_frames = _frames(body)
            size = sum(map(len, body_frames))
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._batch_ids:  # (while a batch is being made, ACKs are taken as it goes)
            self._take_acks(0)
        while self._full(size):
            self._send_batch()
            wait = 0.1 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"{self.inflight} messages still unACKed")
            self._take_acks(min(wait, 0.1))
        self.inflight += 1
        self.inflight_bytes += size
        if self.batch and len(body_frames) == 1:
            ids = self._batch_ids  # (after the wait above: the batch may have gone)
            if not ids:
                self._batch_at = time.monotonic()
            ids.append(msg_id)
            self._batch_bodies.append(bytes(body_frames[0]))
            self._batch_size += size
            if (len(ids) >= self.batch or self._batch_size >= self.batch_bytes
                    or time.monotonic() - self._batch_at >= self.linger):
                self._send_batch()
                self._take_acks(0)
            return msg_id
        frames = [msg_id, b"", *body_frames]
        self.outstanding[msg_id] = (time.monotonic(), frames, size, None)
        self.sock.send_multipart(frames, copy=len(frames[-1]) < ZERO_COPY_MIN)
        return msg_id

    def _send_batch(self) -> None:
        """Send the batch being made, if any."""
        ids = self._batch_ids
        if not ids:
            return
        self._n += 1
        batch_id = f"{self._prefix}-b{self._n}".encode()
        frames = [batch_id, wire.BATCH_HEADER, b"", wire.pack(ids, self._batch_bodies)]
        self.outstanding[batch_id] = (time.monotonic(), frames, self._batch_size, ids)
        self._batch_ids, self._batch_bodies, self._batch_size = [], [], 0
        self.sock.send_multipart(frames, copy=len(frames[-1]) < ZERO_COPY_MIN)

    def _full(self, size: int) -> bool:
        if self.inflight >= self.window:
            return True
        limit = self.max_inflight_bytes
        return (limit is not None and self.inflight > 0
                and self.inflight_bytes + size > limit)

    def poll(self, timeout: float) -> int:
        """Send the batch being made, take the ACKs that came (waiting up to ``timeout`` for
        the first); resend what timed out. Returns the number of messages ACKed."""
        self._send_batch()
        return self._take_acks(timeout)

    def _take_acks(self, timeout: float) -> int:
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
        self._send_batch()
        while self.outstanding:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.inflight} messages still unACKed")
            self.poll(min(left, 0.1))
        if self.failed:
            raise ProducerError(dict(self.failed))

    def _ack(self, frames: list[bytes]) -> int:
        if len(frames) < 2:
            return 0
        entry = self.outstanding.pop(frames[0], None)
        if entry is None:
            return 0  # the ACK of a resent message that was ACKed already
        self.inflight_bytes -= entry[2]
        ids = entry[3] if entry[3] is not None else [frames[0]]
        self.inflight -= len(ids)
        text = frames[3].decode(errors="replace") if len(frames) > 3 else ""
        ok = frames[1] == wire.OK
        if ok:
            self.acked += len(ids)
            if text == wire.REPLICATION_FAILED:
                self.replication_failed += len(ids)
        else:
            for msg_id in ids:
                self.failed[msg_id] = text
        if self.on_ack is not None:
            for msg_id in ids:
                self.on_ack(msg_id, ok, text)
        return len(ids)

    def _retry(self) -> None:
        if not self.outstanding:
            return
        now = time.monotonic()
        for msg_id, (sent, frames, size, ids) in list(self.outstanding.items()):
            if now - sent < self.retry_timeout:
                break  # in send order: the rest is younger
            self.outstanding[msg_id] = (now, frames, size, ids)
            self.outstanding.move_to_end(msg_id)
            self.retried += 1
            self.sock.send_multipart(frames)

    def close(self) -> None:
        """Close the socket (a batch being made is sent first; call :meth:`flush` to wait
        for its ACK)."""
        self._send_batch()
        self.sock.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


READY_EVERY = 1.0  # seconds without a message after which a credit consumer says READY again


class Consumer:
    """A consumer of a queue's send endpoint (messages pushed, as the original's clients
    get them), or, with ``credit``, of its credit endpoint: the consumer says READY with
    ``credit`` and the queue never lets it hold more unACKed messages. It says READY again
    after each second without a message, so it is known again after a queue restart.
    There the queue also confirms each ACK once a crash can no longer undo it:
    ``unconfirmed`` holds the keys still waiting, :meth:`confirm` waits for them."""

    def __init__(self, endpoint: str, *, context: zmq.Context | None = None,
                 rcvhwm: int | None = None, credit: int | None = None,
                 credit_bytes: int | None = None):
        """``credit_bytes`` (with ``credit``): take batches (a queue of ours), holding at most
        that many bytes of bodies unACKed (one message at least); :meth:`ack_many` ACKs
        many in one message."""
        if credit is not None and not 1 <= credit <= wire.MAX_WINDOW:
            raise ValueError(f"credit must be 1..{wire.MAX_WINDOW}, not {credit}")
        if credit_bytes is not None and (credit is None or credit_bytes < 1):
            raise ValueError("credit_bytes needs credit, and must be >= 1")
        self.credit_bytes = credit_bytes
        self._acks = 0
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.credit = credit
        self.unconfirmed: set[bytes] = set()
        self._early: deque[Message] = deque()  # deliveries that came while confirm() waited
        if credit is not None:  # the same id after a reconnect: the queue keeps our credit
            self.sock.setsockopt(zmq.ROUTING_ID, b"consumer-" + uuid.uuid4().hex.encode())
        self.sock.connect(endpoint)
        self._ready_at = 0.0
        self._say_ready()

    def _say_ready(self) -> None:
        if self.credit is not None:
            ready = [wire.READY, b"%d" % self.credit]
            if self.credit_bytes is not None:
                ready.append(b"%d" % self.credit_bytes)
            self.sock.send_multipart(ready)
            self._ready_at = time.monotonic()

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: wait for ever)."""
        if self.credit is None:
            if not self.sock.poll(None if timeout is None else int(timeout * 1000)):
                return None
            return self._decode(self.sock.recv_multipart())
        if self._early:
            return self._early.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            m = self._credit_recv(deadline)
            if m is not None or (deadline is not None and time.monotonic() >= deadline):
                return m

    def _credit_recv(self, deadline: float | None) -> Message | None:
        """Wait until ``deadline`` (or a READY interval) for a delivery; take confirmations
        that come meanwhile."""
        now = time.monotonic()
        if now - self._ready_at >= READY_EVERY:
            self._say_ready()
        wait = self._ready_at + READY_EVERY - now
        if deadline is not None:
            wait = min(wait, deadline - now)
        if not self.sock.poll(max(0, int(wait * 1000))):
            return None
        self._ready_at = time.monotonic()  # it knows us
        return self._take(self._recv_credit())

    def _recv_credit(self, flags: int = 0) -> list[bytes | memoryview]:
        """A message from the credit endpoint: a batch's packed frame of ZERO_COPY_MIN bytes
        or more as a view of what libzmq received (unpack copies each body out of it once,
        not the whole frame first), every other frame as bytes."""
        frames = self.sock.recv_multipart(flags, copy=False)
        if (len(frames) == 4 and len(frames[3]) >= ZERO_COPY_MIN
                and frames[0].bytes == wire.BATCH):
            return [*(f.bytes for f in frames[:3]), frames[3].buffer]
        return [f.bytes for f in frames]

    def _take(self, frames: list[bytes | memoryview]) -> Message | None:
        """A delivery (the first message of a batch; the others wait in ``_early``), or
        None for a confirmation."""
        if len(frames) == 2 and frames[1] in (wire.ACKED, wire.UNKNOWN):
            self.unconfirmed.discard(frames[0])
            return None
        if frames[0] == wire.BATCH and len(frames) == 4:
            got = wire.unpack(frames[3])
            if isinstance(got, str):
                raise ValueError(f"not a pzq batch: {got}")
            sent, timeout = int(frames[1]), int(frames[2])
            keys, bodies = got
            # (tuple.__new__ makes each Message without a Python call: half the cost)
            self._early.extend(map(tuple.__new__, repeat(Message),
                                   zip(keys, repeat(sent), repeat(timeout), zip(bodies))))
            return self._early.popleft()
        return self._decode(frames)

    def confirm(self, timeout: float) -> None:
        """Wait until the queue confirmed every ACK sent so far (credit endpoint only);
        TimeoutError if some are still unconfirmed after ``timeout`` seconds."""
        if self.credit is None:
            raise ValueError("ACKs are confirmed on a credit endpoint only (credit=N)")
        deadline = time.monotonic() + timeout
        while self.unconfirmed:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(self.unconfirmed)} ACK(s) not confirmed within "
                                   f"{timeout:g}s")
            m = self._credit_recv(deadline)
            if m is not None:
                self._early.append(m)

    def recv_nowait(self) -> Message | None:
        if self._early:
            return self._early.popleft()
        while True:
            try:
                if self.credit is None:
                    return self._decode(self.sock.recv_multipart(zmq.NOBLOCK))
                frames = self._recv_credit(zmq.NOBLOCK)
            except zmq.Again:
                return None
            m = self._take(frames)
            if m is not None:
                return m

    def recv_many(self, max_count: int, timeout: float | None = None) -> list[Message]:
        """Up to ``max_count`` messages: waits (up to ``timeout``) for the first, then
        takes what has come."""
        first = self.recv(timeout)
        if first is None:
            return []
        out = [first]
        early = self._early  # (the rest of a batch: taken in one go)
        while len(out) < max_count:
            if early:
                n = min(len(early), max_count - len(out))
                if n == len(early):
                    out.extend(early)
                    early.clear()
                else:
                    out.extend([early.popleft() for _ in range(n)])
            elif (m := self.recv_nowait()) is not None:
                out.append(m)
            else:
                break
        return out

    @staticmethod
    def _decode(frames: list[bytes]) -> Message:
        if len(frames) < 4 or frames[3] != b"":
            raise ValueError(f"not a pzq delivery: {frames[:4]!r}")
        return Message(frames[0], int(frames[1]), int(frames[2]), tuple(frames[4:]))

    def ack(self, message: Message | bytes) -> None:
        key = message.key if isinstance(message, Message) else message
        self.sock.send_multipart([key, wire.OK])
        if self.credit is not None:
            self.unconfirmed.add(key)

    def stop_taking(self) -> None:
        """Tell the queue to send this consumer nothing more (READY with a window of 0;
        credit endpoint only): what it holds stays its own until ACKed or NACKed, and a NACK
        sent after this goes to another consumer. For a consumer about to leave."""
        if self.credit is None:
            raise ValueError("stop_taking is for a credit endpoint (credit=N)")
        self.credit = 0
        self._say_ready()

    def ack_many(self, messages: Sequence[Message | bytes]) -> None:
        """ACK many messages in one ZeroMQ message (a batch consumer: ``credit_bytes``);
        confirmed as one (see :meth:`confirm`)."""
        if self.credit_bytes is None:
            raise ValueError("ack_many needs a batch consumer (credit and credit_bytes)")
        if not messages:
            return
        self._acks += 1
        ack_id = b"acks-%d" % self._acks
        keys = [m.key if isinstance(m, Message) else m for m in messages]
        self.sock.send_multipart([wire.ACK, ack_id, wire.pack(keys)])
        self.unconfirmed.add(ack_id)

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


class StreamError(Exception):
    """The queue answered a stream request with ERROR (the reason is the message)."""


class StreamMessage(NamedTuple):
    """A message of a stream queue, as RANGE gives it (fields in wire.RangeEntry's order)."""

    offset: int  # its place in the queue: stable across restarts, increasing
    key: bytes  # the key push consumers would see
    sent_us: int  # µs since the epoch when the queue received it
    frames: tuple[bytes, ...]

    @property
    def body(self) -> bytes:
        return b"".join(self.frames)


@dataclass(frozen=True)
class StreamRange:
    """One RANGE answer. Every message of [start, ``next``) is in ``messages``, or was
    committed (below ``committed``): ask again from ``next`` while it is below the end.
    ``lost``: offsets [from, to) the queue's retention limits dropped before this group
    committed them (since its last COMMIT), or None."""

    messages: tuple[StreamMessage, ...]
    next: int
    head: int
    committed: int
    lost: tuple[int, int] | None = None


class StreamConsumer:
    """Reads a stream queue by offset (``mode: stream``, its stream endpoint).

    Every request is idempotent: one that gets no answer within ``timeout`` is sent again,
    ``retries`` times, then TimeoutError. Offsets: ``head`` is just past the last durable
    message, ``committed`` the first message not yet committed; messages keep their offsets
    across restarts of the queue, and a range below ``head`` and at or above ``committed``
    gives the same messages every time it is read.
    """

    def __init__(self, endpoint: str, *, timeout: float = 5.0, retries: int = 2,
                 context: zmq.Context | None = None, group: str | None = None,
                 batch: bool = True):
        """``group``: the reader group whose committed offset this reader reads and moves
        (made by its first request; None: the ``default`` group, as readers that name none).
        ``batch``: ask for RANGE answers with the messages packed (RANGE ... BATCH, a queue
        of ours; a queue that does not know it is asked the plain way from then on)."""
        if group is not None:
            why = wire.group_name_error(group.encode())
            if why is not None:
                raise ValueError(why)
        self.group = group
        self.batch = batch
        self.lost: tuple[int, int] | None = None  # as the last answer said
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = retries
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._prefix = uuid.uuid4().hex[:8]
        self._n = 0

    def offsets(self) -> tuple[int, int]:
        """(head, committed)."""
        values, _ = self._call([wire.HEAD])
        return values[0], values[1]

    def head(self) -> int:
        """The offset just past the last durable message (what a reader may read up to)."""
        return self.offsets()[0]

    def committed(self) -> int:
        """The committed offset: every message below it is done and gone."""
        return self.offsets()[1]

    def range(self, start: int, end: int, max_bytes: int = wire.RANGE_MAX_BYTES,
              max_messages: int = wire.RANGE_MAX_MESSAGES) -> StreamRange:
        """The durable messages with offsets in [start, end), in order, at most
        ``max_messages`` and ``max_bytes`` of bodies (at least one message, if any)."""
        request = [wire.RANGE, b"%d" % start, b"%d" % end, b"%d" % max_bytes,
                   b"%d" % max_messages]
        if self.batch:
            try:
                values, entries = self._call([*request, wire.BATCH])
            except StreamError as exc:
                if not str(exc).startswith("RANGE takes"):
                    raise
                self.batch = False  # a queue from before RANGE ... BATCH
                values, entries = self._call(request)
        else:
            values, entries = self._call(request)
        return StreamRange(tuple(map(StreamMessage._make, entries)), values[2], values[0],
                           values[1], self.lost)

    def read(self, start: int, end: int, max_bytes: int = wire.RANGE_MAX_BYTES,
             max_messages: int = wire.RANGE_MAX_MESSAGES) -> Iterator[StreamMessage]:
        """Every durable message with an offset in [start, end), in order, in as many
        RANGE requests as needed. Stops at the head if ``end`` is past it. Messages below
        the committed offset are not there any more (already committed)."""
        while start < end:
            r = self.range(start, end, max_bytes, max_messages)
            yield from r.messages
            if r.next <= start:
                return  # at the head
            start = r.next

    def commit(self, end: int) -> int:
        """Every message below ``end`` is done: the queue drops them, durably, before it
        answers. Returns the committed offset (``end``, or the head if ``end`` is past it;
        a COMMIT below the committed offset changes nothing)."""
        values, _ = self._call([wire.COMMIT, b"%d" % end])
        return values[1]

    def groups(self) -> dict[str, int]:
        """Every reader group of the queue and its committed offset."""
        return self.group_offsets()[1]

    def group_offsets(self) -> tuple[int, dict[str, int]]:
        """The head and every reader group's committed offset, in one answer (so that
        ``head - committed``, a group's lag, is of one moment). Makes no group."""
        return wire.decode_groups_reply(self._request([wire.GROUPS]))

    def delete_group(self) -> None:
        """Delete this reader's group (its committed offset no longer holds messages)."""
        if self.group is None:
            raise ValueError("name the group to delete: StreamConsumer(..., group=NAME)")
        self._request([wire.GROUP, self.group.encode(), wire.DELETE])

    def _call(self, request: list[bytes]) -> tuple[list[int], list[wire.RangeEntry]]:
        grouped = self.group is not None
        if grouped:
            request = [wire.GROUP, self.group.encode(), *request]
        values, entries = wire.decode_stream_reply(self._request(request), grouped)
        if grouped:
            lost = values[-2:]
            self.lost = (lost[0], lost[1]) if lost[1] else None
            values = values[:-2]
        return values, entries

    def _request(self, request: list[bytes]) -> list[bytes]:
        """The answer (after its envelope) to ``request``, sent again if need be."""
        self._n += 1
        rid = f"{self._prefix}-{self._n}".encode()
        for _ in range(self.retries + 1):
            self.sock.send_multipart([rid, b"", *request])
            deadline = time.monotonic() + self.timeout
            while (left := deadline - time.monotonic()) > 0:
                if not self.sock.poll(int(left * 1000) + 1):
                    break
                frames = self._recv()
                if len(frames) < 2 or frames[0] != rid or frames[1] != b"":
                    continue  # the answer to an earlier try
                if frames[2:3] == [wire.STREAM_ERROR]:
                    raise StreamError(bytes(frames[3]).decode(errors="replace") if len(frames) > 3
                                      else "error")
                return frames[2:]
        raise TimeoutError(f"no answer from {self.endpoint} within "
                           f"{self.timeout * (self.retries + 1):.1f}s")

    def _recv(self) -> list[bytes | memoryview]:
        """An answer. Packed (a few frames, one of them large): a frame of ZERO_COPY_MIN bytes
        or more as a view of what libzmq received (unpack copies each body out of it once,
        not the whole frame first); plain (many small frames): as bytes, cheaper for them."""
        if not self.batch:
            return self.sock.recv_multipart()
        return [f.buffer if len(f) >= ZERO_COPY_MIN else f.bytes
                for f in self.sock.recv_multipart(copy=False)]

    def close(self) -> None:
        self.sock.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> StreamConsumer:
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

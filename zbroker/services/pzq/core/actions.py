"""What the pzq cores ask of the I/O around them, and what the log reports back. No I/O.

The cores (queue.py, replication.py) never touch a socket, a file, a thread or the clock. Each
call on a core records the work it implies as typed actions, in order; the server (or a test)
takes them with ``take_output()`` and carries them out in that order, then reports what the
log did with :class:`BatchResult` (``batch_done``). A log action names its log: ``None`` is the
queue's own, a node id the log of the copies held for that node.

    Append, Move             the log: write a message, write a live one again at the head
                             (compaction)
    AppendBatch              the log: write a producer's batch as one record
    AckMany                  the log: ACK messages, in one go (a batch consumer's ACK, or the
                             consumer ACKs that came one after the other)
    OpenLog                  open (create) the log of the copies of a new origin node
    Reply                    to a producer (or a static peer) on the receive endpoint
    Confirm                  to a consumer of the credit endpoint: its ACK is durable (ACKED)
                             or was for no message (UNKNOWN)
    SendStatic, SendCluster  replication messages (peering.py) to the static peers, to one
                             peer life of the cluster
    RememberTaken, ForgetTaken   the keys of an origin's messages delivered here while it was
                             gone (kept in a file, told to the origin when it is back)
    StreamReply              to a reader of the stream endpoint (stream.py)
    WriteCommitted           write the groups' offsets to the offsets file (stream.py), then
                             report it with ``StreamCore.written``
    Log                      a line for the operator
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BatchResult:
    """What one write of the log's writer did. ``placed``: the message seqs it wrote;
    ``error``: None, or why nothing of it was stored (then ``failed`` lists the message seqs
    that were not stored). ``batches``: the writer's batch numbers it completes."""

    batches: tuple[int, ...]
    segment: int
    placed: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    failed_acks: tuple[int, ...] = ()
    error: str | None = None
    segment_bytes: int = 0
    #: consumer ACKs that can no longer be undone by a crash: ACK records written (and
    #: synced), and messages ACKed before they were written (never written at all)
    acked: tuple[int, ...] = ()
    good_writes: int = 0  # the writer's count of good writes, this one included


@dataclass(slots=True)
class Append:
    seq: int
    key: bytes
    msg_id: bytes
    frames: Sequence[Any]
    log: str | None = None


@dataclass(slots=True)
class AppendBatch:
    """Write a producer's batch as one record: ``count`` messages, seqs from ``first_seq``,
    keys from ``key_base`` (wire.message_key), ``packed`` as wire.pack made it."""

    first_seq: int
    count: int
    key_base: bytes
    packed: bytes
    log: str | None = None


@dataclass(slots=True)
class AckMany:
    seqs: list[int]
    log: str | None = None


@dataclass(slots=True)
class Move:
    seq: int
    key: bytes
    msg_id: bytes
    frames: Sequence[Any]
    log: str | None = None


@dataclass(slots=True)
class OpenLog:
    log: str


@dataclass(slots=True)
class Reply:
    peer: bytes
    frames: list[bytes]


@dataclass(slots=True)
class Confirm:
    consumer: Hashable
    key: bytes
    status: bytes  # wire.ACKED or wire.UNKNOWN


@dataclass(slots=True)
class SendStatic:
    message: Any  # a peering.ReplicaCopy, ReplicaDelete or ReplicaPing


@dataclass(slots=True)
class SendCluster:
    life: str
    message: Any  # a peering cluster message
    recopy: bool = False  # part of a re-copy: report a failed send (peer_unreachable)


@dataclass(slots=True)
class RememberTaken:
    node_id: str
    keys: list[bytes]


@dataclass(slots=True)
class ForgetTaken:
    node_id: str


@dataclass(slots=True)
class Log:
    level: str  # "debug", "info", "warning"
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StreamReply:
    frames: Sequence[bytes | list[bytes]]  # a list: one frame's parts (wire.range_batch)


@dataclass(slots=True)
class WriteCommitted:
    offsets: Any  # a stream.Offsets: the reader groups' committed offsets, and retention's


# what the queue core tells the replication core (replication.py), never the I/O


@dataclass(slots=True)
class Replicate:
    key: bytes
    body: Sequence[Any]


@dataclass(slots=True)
class Unreplicate:
    key: bytes


@dataclass(slots=True)
class Adopted:
    token: Any
    ok: bool
    #: the queue holds this very copy (written): its origin may be told so (TAKEN). False:
    #: the queue holds the same message under another key (ours, come back, or taken over
    #: from another holder): the copy goes, and nobody is told to drop anything for it
    claim: bool = True

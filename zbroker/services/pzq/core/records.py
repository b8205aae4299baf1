"""The records of the pzq log on disk: encoding, decoding, checksums. No I/O.

A segment file is a sequence of records::

    [payload length: u32 LE][crc32 of payload: u32 LE][payload]

and a payload is a type octet and its fields (integers little-endian)::

    MESSAGE  1  seq u64, key length u16, id length u16, frame count u32,
                key, producer id, then per frame: length u32, bytes
    ACK      2  count u32, then count x seq u64      (the consumer ACKed these messages)
    BATCH    3  first seq u64, key base length u16, key base, then a producer's batch as it
                came (wire.pack: ids and bodies): its messages have the seqs from the first
                on, one body frame each, keys wire.message_key(key base, seq); one record,
                one checksum: after a crash all of the batch is there or none of it

A record whose header is cut short, whose length runs past the end, or whose checksum does not
match ends the readable part of the segment (a torn tail after a crash).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pzq import wire

try:  # ISA-L's CRC-32: the very checksum zlib computes (the log's format is the same), about
    # 4x faster on large payloads; zlib's where ISA-L has no wheel
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - platforms without an isal wheel
    from zlib import crc32

MESSAGE = 1
ACK = 2
BATCH = 3

HEADER = struct.Struct("<II")
JOIN_MAX = 4096  # a record payload this small is joined into one buffer (one checksum call)
_MSG_HEAD = struct.Struct("<BQHHI")
_U32 = struct.Struct("<I")
_ACK_HEAD = struct.Struct("<BI")
_BATCH_HEAD = struct.Struct("<BQH")


@dataclass(frozen=True, slots=True)
class MessageRecord:
    seq: int
    key: bytes
    msg_id: bytes
    frames: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AckRecord:
    seqs: tuple[int, ...]


def message_parts(seq: int, key: bytes, msg_id: bytes, frames: Sequence[bytes]) -> list[bytes]:
    """The payload of a MESSAGE record, as parts to be written one after the other."""
    parts = [_MSG_HEAD.pack(MESSAGE, seq, len(key), len(msg_id), len(frames)), key, msg_id]
    for f in frames:
        parts.append(_U32.pack(len(f)))
        parts.append(f)
    return parts


def message_size(key: bytes, msg_id: bytes, frames: Sequence[bytes]) -> int:
    """The size of :func:`message_parts`' payload, without making it."""
    return (_MSG_HEAD.size + len(key) + len(msg_id) + sum(map(len, frames))
            + _U32.size * len(frames))


def batch_parts(first_seq: int, key_base: bytes, packed: bytes) -> list[bytes]:
    """The payload of a BATCH record, as parts to be written one after the other."""
    return [_BATCH_HEAD.pack(BATCH, first_seq, len(key_base)), key_base, packed]


def ack_payload(seqs: Sequence[int]) -> bytes:
    return _ACK_HEAD.pack(ACK, len(seqs)) + struct.pack(f"<{len(seqs)}Q", *seqs)


def frame_record(parts: Sequence[bytes]) -> list[bytes]:
    """Header + payload parts: the bytes of one record (a small payload joined)."""
    size = sum(map(len, parts))
    if size <= JOIN_MAX:
        payload = b"".join(parts)
        return [HEADER.pack(size, crc32(payload)), payload]
    crc = 0
    for p in parts:
        crc = crc32(p, crc)
    return [HEADER.pack(size, crc), *parts]


def encode(parts: Sequence[bytes]) -> bytes:
    return b"".join(frame_record(parts))


def decode_payload(payload: memoryview
                   ) -> MessageRecord | AckRecord | list[MessageRecord] | None:
    """A record from its (checksummed) payload (a BATCH record: a list of MessageRecords);
    None if it does not parse."""
    try:
        kind = payload[0]
        if kind == MESSAGE:
            _, seq, klen, ilen, nframes = _MSG_HEAD.unpack_from(payload, 0)
            pos = _MSG_HEAD.size
            key = bytes(payload[pos:pos + klen])
            pos += klen
            msg_id = bytes(payload[pos:pos + ilen])
            pos += ilen
            frames = []
            for _ in range(nframes):
                (n,) = _U32.unpack_from(payload, pos)
                pos += 4
                if pos + n > len(payload):
                    return None
                frames.append(bytes(payload[pos:pos + n]))
                pos += n
            if pos != len(payload) or len(key) != klen or len(msg_id) != ilen:
                return None
            return MessageRecord(seq, key, msg_id, tuple(frames))
        if kind == ACK:
            _, count = _ACK_HEAD.unpack_from(payload, 0)
            if _ACK_HEAD.size + 8 * count != len(payload):
                return None
            return AckRecord(struct.unpack_from(f"<{count}Q", payload, _ACK_HEAD.size))
        if kind == BATCH:
            _, first, klen = _BATCH_HEAD.unpack_from(payload, 0)
            pos = _BATCH_HEAD.size
            key_base = bytes(payload[pos:pos + klen])
            got = wire.unpack(payload[pos + klen:])
            if len(key_base) != klen or isinstance(got, str):
                return None
            return [MessageRecord(seq, wire.message_key(key_base, seq), msg_id, (body,))
                    for seq, msg_id, body in zip(itertools.count(first), *got)]
    except (struct.error, IndexError):
        return None
    return None


def scan(data: bytes | memoryview) -> Iterator[tuple[int, MessageRecord | AckRecord]]:
    """(end offset, record) for each good record from the start of ``data`` (a BATCH
    record gives its messages, each with the end offset of the batch); stops at the first
    torn or corrupt one. The last end offset is the length of the good part."""
    view = memoryview(data)
    pos = 0
    end = len(view)
    while pos + HEADER.size <= end:
        size, crc = HEADER.unpack_from(view, pos)
        start = pos + HEADER.size
        if size == 0 or start + size > end:
            return
        payload = view[start:start + size]
        if crc32(payload) != crc:
            return
        record = decode_payload(payload)
        if record is None:
            return
        pos = start + size
        if isinstance(record, list):  # (narrows both branches; beside a checksum, free)
            for r in record:
                yield pos, r
        else:
            yield pos, record

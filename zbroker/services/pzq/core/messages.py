"""The unACKed messages of a pzq queue, as the queue core and its parts hold them (by seq,
in seq order), and how a stream queue's are read by offset. No I/O."""

from __future__ import annotations


class Message:
    """An unACKed message; durable once its seq is below the queue's ``head``."""

    __slots__ = ("seq", "key", "msg_id", "frames", "size")

    def __init__(self, seq: int, key: bytes, msg_id: bytes, frames: tuple[bytes, ...],
                 size: int):
        self.seq = seq
        self.key = key
        self.msg_id = msg_id
        self.frames = frames
        self.size = size


def read_range(messages: dict[int, Message], head: int, start: int, end: int, floor: int,
               max_bytes: int, max_messages: int) -> tuple[int, list[Message]]:
    """(next, messages): the durable messages (seqs below ``head``) with seqs in
    [max(start, floor), end), in order, up to ``max_messages`` and ``max_bytes`` of bodies
    (at least one message if there is one). ``next``: every message of [start, next) is in
    the answer or below ``floor`` (committed); ask again from ``next`` for the rest."""
    if end <= floor:
        return end, []
    seq = max(start, floor)
    hi = min(end, head)
    out: list[Message] = []
    size = 0
    budget = max_messages + 65_536  # offsets looked at: gaps are failed writes, rare
    while seq < hi and budget > 0:
        m = messages.get(seq)
        if m is not None:
            if out and (len(out) >= max_messages or size + m.size > max_bytes):
                break
            out.append(m)
            size += m.size
        seq += 1
        budget -= 1
    return seq, out

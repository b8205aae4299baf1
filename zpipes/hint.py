"""A broker's hint for a client whose wait timed out, e.g. "this broker has no peers: see
zbroker status", when the pipe's other end may be on a host the broker is not linked to.

An exchange of its own beside the ZPIPES protocol, which it leaves as it is: a client asks
only when a timeout is to be raised, on a connection of its own::

    HINT      0xAA 0xA0 | 22                        (no fields)
    HINT_OK   0xAA 0xA0 | 23 | string hint          ("" when the broker has nothing to say)

A broker that does not know it answers INVALID (21), or nothing: no hint. Original clients
never send it. :func:`encode_reply` and :func:`decode_reply` are the wire; :func:`ask` does
the I/O, and :func:`with_hint` adds a hint to a timeout's message. The asking blocks (the
asyncio client's loop too) for at most ``WAIT``, on the timeout path only, and a broker's
answer is kept for ``CACHE_SECONDS``.
"""

from __future__ import annotations

import time

from zpipes.protocol import MAX_STRING, SIGNATURE

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

HINT_ID, HINT_OK_ID = 22, 23
QUERY = SIGNATURE + bytes([HINT_ID])
WAIT = 0.5  # seconds a client waits for the hint at most
CACHE_SECONDS = 5.0  # a broker's hint is asked again only after this long


def encode_reply(hint: str) -> bytes:
    """HINT_OK with ``hint`` (cut to the 255 bytes a string may have)."""
    data = hint.encode("utf-8")[:MAX_STRING]
    return SIGNATURE + bytes([HINT_OK_ID, len(data)]) + data


def decode_reply(frame: bytes) -> str | None:
    """The hint in a HINT_OK frame; None for anything else (INVALID: a broker of before)."""
    if len(frame) < 4 or frame[:3] != SIGNATURE + bytes([HINT_OK_ID]) \
            or len(frame) != 4 + frame[3]:
        return None
    return frame[4:].decode("utf-8", errors="replace")


_asked: dict[str, tuple[float, str]] = {}  # address -> (when asked, hint)


def ask(address: str, wait: float = WAIT) -> str:
    """The broker's hint at ``address`` ("" if it has none, does not know HINT, or does not
    answer within ``wait`` seconds); a recent answer is reused."""
    now = time.monotonic()
    cached = _asked.get(address)
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    import zmq

    ctx: Any = zmq.Context()
    hint = ""
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(QUERY, zmq.NOBLOCK)
            if sock.poll(int(wait * 1000)):
                hint = decode_reply(sock.recv()) or ""
        except zmq.ZMQError:
            pass
        finally:
            sock.close(linger=0)
    finally:
        ctx.term()
    _asked[address] = (now, hint)
    return hint


def with_hint(message: str, address: str | None) -> str:
    """``message`` with the hint of the broker at ``address`` after it, in parentheses."""
    if not address:
        return message
    try:
        hint = ask(address)
    except Exception:  # (no sockets left, say): the timeout is what is to be told
        hint = ""
    return f"{message} ({hint})" if hint else message

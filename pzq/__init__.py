"""pzq's Python client: producers, consumers and stream readers of a pzq queue, the broker's
or the standalone ``pzq`` (the original's wire: they work with either), as a package of its
own beside ``zpipes``: nothing of the broker is imported.

    from pzq import Producer, Consumer

    with Producer("tcp://127.0.0.1:11131", window=64) as p:
        p.send(b"hello")
        p.flush(timeout=10)

``pzq.wire`` is the wire format (no I/O, no pyzmq), which the broker's queue cores take from
here; the client (``pzq.client``, which needs pyzmq) is imported on first use of one of its
names. ``zbroker.pzq.client`` is the old name of ``pzq.client`` and still works.
"""

from __future__ import annotations

import importlib
from typing import Any

_CLIENT_NAMES = ("Consumer", "Message", "Producer", "ProducerError", "StreamConsumer",
                 "StreamError", "StreamMessage", "StreamRange", "monitor")

__all__ = list(_CLIENT_NAMES)


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        return getattr(importlib.import_module("pzq.client"), name)
    raise AttributeError(f"module 'pzq' has no attribute {name!r}")

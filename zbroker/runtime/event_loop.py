"""The event loop the broker and the standalone pzq run on.

uvloop (libuv) when it is installed — it is a dependency on Linux — else asyncio's own loop.
A broker wakes up for every message a client sends when clients keep one request
outstanding (the original ZPIPES client does), so the cost of a wake-up is a large part of
its CPU per byte: uvloop's is several times smaller than the pure-Python loop's.
``ZBROKER_EVENT_LOOP=asyncio`` chooses asyncio's loop (to rule the loop out when
diagnosing); the log says which loop runs at start.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
ENV = "ZBROKER_EVENT_LOOP"


def chosen() -> str:
    """"uvloop" or "asyncio": what :func:`run` will use."""
    if os.environ.get(ENV, "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on the chosen loop (as asyncio.run does)."""
    if chosen() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)

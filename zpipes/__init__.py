"""ZPIPES: reliable named pipes served by a zbroker.

    import zpipes

    with zpipes.open("results", "w") as pipe:
        pipe.write(b"...")

    with zpipes.open("results", "r") as pipe:
        data = pipe.read()
"""

from zpipes.client import (
    DEFAULT_BROKER,
    DEFAULT_BROKER_TIMEOUT,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_PING_INTERVAL,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_SIZE,
    DEFAULT_WINDOW,
    PipeReader,
    PipeWriter,
    endpoint,
    open,
)
from zpipes.errors import (
    BrokenPipe,
    BrokerUnavailable,
    PipeFailed,
    PipeTimeout,
    ProtocolError,
    ZpipesError,
)

__all__ = [
    "DEFAULT_BROKER",
    "DEFAULT_BROKER_TIMEOUT",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_READ_SIZE",
    "DEFAULT_WINDOW",
    "BrokenPipe",
    "BrokerUnavailable",
    "PipeFailed",
    "PipeReader",
    "PipeTimeout",
    "PipeWriter",
    "ProtocolError",
    "ZpipesError",
    "endpoint",
    "open",
]

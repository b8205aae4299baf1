"""ZPIPES: reliable named pipes served by a zbroker.

    import zpipes

    with zpipes.open("results", "w") as pipe:
        pipe.write(b"...")

    with zpipes.open("results", "r") as pipe:
        data = pipe.read()

The client is imported on first use of one of its names, so that the core modules
(``zpipes.protocol``, ``zpipes.client_protocol``, and the broker's ZPIPES cores in
``zbroker.services.zpipes``) import without it. The sync client and the command speak ZMTP
themselves (``zpipes.zmtp``); only the asyncio client (``zpipes.aio``) needs pyzmq.
"""

from __future__ import annotations

import importlib

from zpipes.errors import (
    BrokenPipe,
    BrokerUnavailable,
    PipeFailed,
    PipeTimeout,
    ProtocolError,
    ZpipesError,
)

# The client imports nothing from typing at run time (its annotations are not evaluated, and
# TYPE_CHECKING is True only to type checkers): importing typing was about 3 ms of the 40 a
# zpipes command takes to start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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

#: the names above that ``zpipes.client`` defines (all but the errors, imported already)
_CLIENT_NAMES = frozenset(__all__) - set(globals())
#: the client's submodules, reachable as attributes as when the package imported the client
_SUBMODULES = frozenset({"aio", "cli", "client"})


def __getattr__(name: str) -> Any:  # PEP 562: called only for names not found
    if name in _CLIENT_NAMES:
        value = getattr(importlib.import_module("zpipes.client"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"zpipes.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)

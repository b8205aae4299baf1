"""The ZPIPES service: distributed named pipes, the broker side.

The service (service.py) and its client endpoint (endpoint.py) are the I/O; the rest is protocol
logic without I/O, which imports without pyzmq or the event loop: the clients' state machine
(machine.py), the pipe table (pipes.py), the messages between brokers (peering.py), the pipe
directory (directory.py) and the server core (server.py). The client side, and the protocol
both sides speak, are the ``zpipes`` package.

``ZpipesService`` is imported on first use, so that importing a core brings in no I/O.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import ZpipesService

__all__ = ["ZpipesService"]


def __getattr__(name: str) -> Any:
    if name == "ZpipesService":
        return importlib.import_module(".service", __name__).ZpipesService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

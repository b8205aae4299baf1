"""The ZPIPES service: distributed named pipes, the broker side.

The service (service.py) and its client endpoint (endpoint.py) are the I/O; the rest is protocol
logic without I/O, which imports without pyzmq or the event loop: the server core (server.py)
and its parts, the client engine (engine.py) running the clients' state machine (machine.py),
the links to peer brokers (links.py) and the pipe directory (directory.py), around the pipe
table (pipes.py); the messages between brokers (peering.py); and what the core asks of the
service (actions.py). The client side, and the protocol both sides speak, are the ``zpipes``
package.

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

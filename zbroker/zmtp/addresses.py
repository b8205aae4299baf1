"""ZeroMQ endpoint strings as the broker binds them: ``tcp://HOST:PORT`` and ``ipc://PATH``
(``ipc://@NAME``: a Linux abstract socket), read as libzmq reads them, made into listening
sockets for :mod:`zbroker.zmtp.server`."""

from __future__ import annotations

import os
import socket
from typing import Any


class EndpointError(ValueError):
    """An endpoint string that is not tcp://HOST:PORT or ipc://PATH."""


def listen_socket(endpoint: str) -> socket.socket:
    """A non-blocking socket bound to ``endpoint`` and listening (OSError, or EndpointError
    if it is not tcp://HOST:PORT or ipc://PATH). An ipc socket file that a process which
    ended left behind is removed first; one that is still served is not (the bind fails):
    asyncio's own bind would take the file of a live server."""
    kind, address = listen_address(endpoint)
    if kind == "tcp":
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if not address.startswith("\0"):
            _remove_stale(address)
    try:
        sock.bind(address)
        sock.listen(256)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _remove_stale(path: str) -> None:
    """Remove the socket file a process that ended left at ``path`` (libzmq does the same
    before it binds); one that is still served stays, and the bind fails."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        try:
            os.unlink(path)
        except OSError:
            pass
    except OSError:
        pass
    finally:
        probe.close()


def peer_name(transport: Any) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "local")


def listen_address(endpoint: str) -> tuple[str, Any]:
    """``("tcp", (host, port))`` or ``("ipc", path)`` of a ZeroMQ endpoint to bind, as libzmq
    reads it: ``tcp://*:PORT`` is every IPv4 address, ``ipc://@NAME`` an abstract socket."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise EndpointError(f"{endpoint!r}: an endpoint is tcp://HOST:PORT or ipc://PATH")
    if scheme == "ipc":
        if not rest:
            raise EndpointError(f"{endpoint!r}: no path")
        return "ipc", "\0" + rest[1:] if rest.startswith("@") else rest
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise EndpointError(f"{endpoint!r}: tcp://HOST:PORT expected")
    if port in ("*", "!"):
        port = "0"
    if not port.isdigit() or int(port) > 65535:
        raise EndpointError(f"{endpoint!r}: {port!r} is not a port")
    host = "0.0.0.0" if host == "*" else host.strip("[]")
    return "tcp", (host, int(port))

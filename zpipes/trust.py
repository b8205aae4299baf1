"""Which broker a client trusts with its data.

An abstract socket (``ipc://@/zpipes/<name>``) belongs to whoever bound it first: when the
broker is stopped, any local user can bind its name and receive what ``zpipes write`` sends.
So before it sends anything, a client checks who runs the process at the other end (the
kernel says, SO_PEERCRED): root, the client's own user, or the ``zbroker`` system user (the
account of the packaged service), or the users named in ``ZPIPES_BROKER_USER`` (names or uids,
separated by commas).
"""

from __future__ import annotations

import os
import pwd
import socket
import struct

SERVICE_USER = "zbroker"
ENV = "ZPIPES_BROKER_USER"
_UCRED = struct.Struct("3i")


def trusted_uids(environ: dict[str, str] | None = None) -> set[int]:
    environ = os.environ if environ is None else environ
    uids = {0, os.geteuid()}
    names = [SERVICE_USER] + [n.strip() for n in environ.get(ENV, "").split(",") if n.strip()]
    for name in names:
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return uids


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket."""
    try:
        _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    except OSError:
        return None
    return uid


def distrust(uid: int, broker: str, address: str) -> str | None:
    """Why a broker run by ``uid`` is not to be trusted, or None if it is."""
    if uid in trusted_uids():
        return None
    try:
        who = f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        who = f"uid {uid}"
    return (f"the process listening on {address} as broker {broker!r} runs as {who}, not as "
            f"root, you or the {SERVICE_USER!r} user: not sending it anything (if that is "
            f"your broker, set {ENV}={uid})")

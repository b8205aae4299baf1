"""Who may use the broker's local sockets.

A Linux abstract socket (``ipc://@/zpipes/<name>``) has no file permissions: any local user can
connect to it. The kernel tells who is at the other end of a Unix socket (SO_PEERCRED: pid, uid,
gid; SO_PEERGROUPS: the supplementary groups), so the broker checks each connection it accepts
against a policy, like a daemon whose socket is group-owned (the broker's own user, root, and
the members of the broker's group, by default).

:class:`Policy` is the decision and does no I/O; :func:`peer_of` reads a socket's credentials.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+
_UCRED = struct.Struct("3i")  # pid, uid, gid
_MAX_GROUPS = 256


@dataclass(frozen=True)
class PeerCredentials:
    """The process at the other end of a local socket, as the kernel saw it at connect time."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def describe(self) -> str:
        return f"uid {self.uid} ({user_name(self.uid)}), gid {self.gid}, pid {self.pid}"


@dataclass(frozen=True)
class Policy:
    """Allowed: root, the ``uids``, and members of the ``gids`` (by their primary or any
    supplementary group); everyone when ``anyone``."""

    uids: frozenset[int]
    gids: frozenset[int]
    anyone: bool = False

    def allows(self, peer: PeerCredentials) -> bool:
        return (self.anyone or peer.uid == 0 or peer.uid in self.uids
                or peer.gid in self.gids or not self.gids.isdisjoint(peer.groups))

    def describe(self) -> str:
        if self.anyone:
            return "anyone"
        users = ", ".join(user_name(u) for u in sorted(self.uids | {0}))
        groups = ", ".join(group_name(g) for g in sorted(self.gids))
        return f"users {users}" + (f"; members of {groups}" if groups else "")


def default_policy(users: tuple[int | str, ...] = (),
                   groups: tuple[int | str, ...] | None = None) -> Policy:
    """The broker's own user and root, the ``users``, and the members of ``groups`` (None: the
    broker's own group). ``"*"`` among the users lets anyone in."""
    anyone = "*" in users
    uids = {os.geteuid()} | {u for u in users if isinstance(u, int)}
    gids = {os.getegid()} if groups is None else {g for g in groups if isinstance(g, int)}
    return Policy(frozenset(uids), frozenset(gids), anyone)


def peer_of(fd: int) -> PeerCredentials | None:
    """The credentials of the peer of Unix socket ``fd`` (not closed or taken over), or None
    when ``fd`` is not a connected Unix socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family != socket.AF_UNIX:
            return None
        pid, uid, gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * _MAX_GROUPS)
            groups = frozenset(struct.unpack(f"{len(raw) // 4}I", raw))
        except OSError:
            groups = frozenset()
        return PeerCredentials(pid, uid, gid, groups)
    except OSError:
        return None
    finally:
        sock.detach()


def user_id(value: int | str) -> int | str:
    """A uid for a user name or number; ``"*"`` stays as it is. KeyError for unknown names."""
    if isinstance(value, int) or value == "*":
        return value
    return int(value) if value.isdigit() else pwd.getpwnam(value).pw_uid


def group_id(value: int | str) -> int:
    """A gid for a group name or number. KeyError for unknown names."""
    if isinstance(value, int):
        return value
    return int(value) if value.isdigit() else grp.getgrnam(value).gr_gid


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)

"""Who holds a TCP port that a bind found in use: for the error an operator reads ("held by
pid 4242: zbroker other --config ..."). Linux's /proc, best effort: the listening socket's
inode from /proc/net/tcp{,6}, the process from the /proc/PID/fd links this user may read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TCP_PORT = re.compile(r"^tcp://.*:(\d+)$")
LISTEN = "0A"  # the state column of /proc/net/tcp


def port_of(endpoint: str) -> int | None:
    m = _TCP_PORT.match(endpoint)
    return int(m[1]) if m else None


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    found: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found


def holder_of(endpoint: str, proc: Path = Path("/proc")) -> str | None:
    """Who listens on ``endpoint``'s TCP port: "pid N: command line", "a process this user
    may not see" or None (not a tcp endpoint, or no listener found)."""
    port = port_of(endpoint)
    if port is None:
        return None
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir(proc)):
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / pid / "fd" / fd) in wanted:
                    return f"pid {pid}: {_command(proc / pid)}"
            except OSError:
                continue
    return "a process this user may not see"


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text[:120] or "?"


def held(endpoint: str) -> str:
    """``; held by ...`` for an error message, or "" when the holder is not found."""
    who = holder_of(endpoint)
    return f"; held by {who}" if who else ""

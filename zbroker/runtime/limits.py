"""The open-file limit, which every connection, file and socket of the broker counts against.

libzmq aborts the whole process when accepting an ipc connection fails with EMFILE, so the
broker must never reach its limit: it raises its soft limit to the hard limit at start, keeps
a reserve for its own files and sockets, and takes at most ``clients.max_clients`` client
connections (more are hung up at once).
"""

from __future__ import annotations

import resource

#: descriptors kept for everything but client connections: queue segments, peer links,
#: ZeroMQ's own (two per socket), logs, the control socket, Python's imports
FD_RESERVE = 256


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_file_limit_at_start() -> int:
    """The soft open-file limit a broker starting now would have: the hard limit, as
    ``raise_open_file_limit`` raises it (the soft one if that is higher)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
    return max(soft, hard)


def clients_problem(max_clients: int, limit: int | None = None) -> str | None:
    """Why ``max_clients`` connections cannot be taken under the open-file limit, or None."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or max_clients + FD_RESERVE <= limit:
        return None
    return (f"clients.max_clients ({max_clients}) does not fit in the open-file limit "
            f"({limit}) less a reserve of {FD_RESERVE} for the broker's own files: set "
            f"clients.max_clients to at most {max(limit - FD_RESERVE, 0)}, or raise the limit "
            f"(ulimit -n, or LimitNOFILE= in the systemd unit)")

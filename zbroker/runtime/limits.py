"""The open-file limit, which every connection, file and socket of the broker counts against.

libzmq aborts the whole process when accepting an ipc connection fails with EMFILE, so the
broker must never reach its limit: it raises its soft limit to the hard limit at start, and
every listener holds at most its part of it: ``clients.max_clients`` client connections, the
control socket's, the cluster port's and the metrics endpoint's connections, what the
services' queues hold, and a reserve for the broker's own files and sockets. The parts must
fit in the limit (:func:`clients_problem`, checked by check-config and at start); a
connection past its part is hung up at once.
"""

from __future__ import annotations

import resource

#: descriptors kept for the broker's own files and sockets: logs, ZeroMQ's own (its
#: context's), Python's imports, a segment file being rolled over
FD_RESERVE = 256
#: connections each libzmq listener of the broker takes at most (zmtp/libzmq_door.py), and
#: of one source: the control socket's (local users: status, logs --follow), the cluster
#: port's (one or two from each peer's host, and a small pool of strangers')
CONTROL_CONNECTIONS, CONTROL_PER_SOURCE = 128, 64
CLUSTER_CONNECTIONS, CLUSTER_PER_SOURCE = 512, 16
#: descriptors of the links to peers a cluster holds room for (a socket, its connection
#: and its monitor each)
CLUSTER_LINKS = 3 * 64

#: what holds descriptors besides client connections: (what, how many), as told
Held = list[tuple[str, int]]


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


def clients_problem(max_clients: int, limit: int | None = None,
                    held: Held | None = None) -> str | None:
    """Why ``max_clients`` connections cannot be taken under the open-file limit beside what
    ``held`` holds (and the reserve), or None."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    parts = [*(held or []), ("a reserve for the broker's own files", FD_RESERVE)]
    others = sum(n for _, n in parts)
    if limit == resource.RLIM_INFINITY or max_clients + others <= limit:
        return None
    told = "; ".join(f"{what} {n}" for what, n in parts)
    return (f"clients.max_clients ({max_clients}) does not fit in the open-file limit "
            f"({limit}) beside the {others} descriptors the rest of the config holds ({told}): "
            f"set clients.max_clients to at most {max(limit - others, 0)}, or raise the limit "
            f"(ulimit -n, or LimitNOFILE= in the systemd unit)")

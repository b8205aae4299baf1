"""What the broker checks of a loaded config before it starts anything: every check that
needs nothing bound, opened for writing or made. The broker's start, a reload and ``zbroker
check-config`` run these same checks, so a config that check-config passes starts (unless
another process holds one of its ports or files meanwhile).

Each problem is one line that names the key(s) at fault, e.g.::

    services.pzq.queues.jobs.receive_endpoint and services.pzq.queues.events.receive_endpoint
    both use tcp://127.0.0.1:11131: give each its own

What is checked: the run directory, the log file's folder and the cluster's key file can be
used; every endpoint the broker binds (each enabled service's ``bound_endpoints``, the
control socket, ``metrics.bind``, ``cluster.bind``) is one that can be bound and meets no
other; each enabled service's own ``config_problems``; and the client connections fit in the
open-file limit beside every other part of it (each listener's, each service's
``held_descriptors``: see limits.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zbroker.management import CONTROL_SOCKET, IPC_PATH_MAX
from zbroker.runtime.limits import (
    CLUSTER_CONNECTIONS,
    CLUSTER_LINKS,
    CONTROL_CONNECTIONS,
    Held,
    clients_problem,
    open_file_limit_at_start,
)
from zbroker.zmtp.addresses import EndpointError, listen_address


def config_problems(config: Any, registry: Mapping[str, Any] | None = None) -> list[str]:
    """Every problem of ``config`` that would keep the broker from starting, found without
    binding or making anything: one line each, naming the key(s). ``registry``: the
    services (name -> Service class); None: the plug-ins installed."""
    if registry is None:
        from zbroker.services import installed

        registry = installed()
    run_dir = Path(config.broker.run_dir)
    problems = [p for p in (run_dir_problem(run_dir), log_file_problem(config.log.file)) if p]
    endpoints = [("broker.run_dir (its control socket)", f"ipc://{run_dir}/{CONTROL_SOCKET}")]
    for name, service in registry.items():
        section = getattr(config.services, name, None)
        if section is None or not getattr(section, "enabled", False):
            continue
        problems += service.config_problems(config, run_dir / name)
        served = service.bound_endpoints(config, run_dir / name)
        problems += [p for key, endpoint in served
                     if (p := served_endpoint_problem(key, endpoint, run_dir))]
        endpoints += served
    if config.metrics.bind is not None:
        endpoints.append(("metrics.bind", f"tcp://{config.metrics.bind}"))
    if config.cluster.enabled:
        endpoints.append(("cluster.bind", config.cluster.bind))
        problem = cluster_key_problem(config.cluster)
        if problem:
            problems.append(problem)
    problem = clients_problem(config.clients.max_clients, open_file_limit_at_start(),
                              held_descriptors(config, registry))
    if problem:
        problems.append(problem)
    return problems + endpoint_clashes(endpoints)


def held_descriptors(config: Any, registry: Mapping[str, Any]) -> Held:
    """What the config holds open besides client connections, by what holds it: every
    listener's part and what each enabled service holds (its queues' files and sockets)."""
    held: Held = [("the control socket's connections", CONTROL_CONNECTIONS + 1)]
    if config.cluster.enabled:
        held.append(("the cluster port's connections and peer links",
                     CLUSTER_CONNECTIONS + CLUSTER_LINKS + 1))
    if config.metrics.bind is not None:
        from zbroker.metrics import MAX_CONNECTIONS

        held.append(("the metrics endpoint's connections", MAX_CONNECTIONS + 1))
    for name, service in registry.items():
        section = getattr(config.services, name, None)
        if section is not None and getattr(section, "enabled", False):
            held += service.held_descriptors(config)
    return held


# --- paths ---------------------------------------------------------------------------------


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def directory_problem(key: str, path: Path) -> str | None:
    """Why directory ``path`` (``key``'s) can be neither used nor made, or None."""
    found = _nearest_existing(path)
    if found == path:
        if not path.is_dir():
            return f"{key}: {str(path)!r} exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{key}: {str(path)!r} is not writable"
        return None
    if not found.is_dir():
        return f"{key}: cannot create {str(path)!r}: {str(found)!r} is not a directory"
    if not os.access(found, os.W_OK | os.X_OK):
        return f"{key}: cannot create {str(path)!r}: {str(found)!r} is not writable"
    return None


def run_dir_problem(path: Path) -> str | None:
    """Why the run directory cannot be made or is not the broker's own (the checks of
    ``zbroker.broker.make_private_dir``, without making anything), or None."""
    problem = directory_problem("broker.run_dir", path)
    if problem is not None:
        return problem
    uid = os.geteuid()
    if path.exists():
        owner, parent_owner = path.stat().st_uid, path.parent.stat().st_uid
    else:  # the broker makes it, and the missing folders above it
        nearest = _nearest_existing(path)
        owner, parent_owner = uid, nearest.stat().st_uid if nearest == path.parent else uid
    if owner != uid or parent_owner not in (uid, 0):
        return (f"broker.run_dir: {str(path)!r} or its parent belongs to another user "
                f"(uid {owner if owner != uid else parent_owner}); set broker.run_dir to a "
                "directory of your own")
    return None


def log_file_problem(file: Path | None) -> str | None:
    """Why the log file cannot be opened for appending (its folder is not made), or None."""
    if file is None:
        return None
    folder = file.parent if str(file.parent) else Path(".")
    if not folder.is_dir():
        return (f"log.file: cannot open log file {str(file)!r}: there is no folder "
                f"{str(folder)!r}")
    if file.is_dir():
        return f"log.file: cannot open log file {str(file)!r}: it is a directory"
    if not os.access(file if file.exists() else folder, os.W_OK):
        return f"log.file: cannot open log file {str(file)!r}: permission denied"
    return None


def cluster_key_problem(cluster: Any) -> str | None:
    """Why the cluster's key file cannot be read (a key file named, or the default one if it
    exists: the broker makes it when it does not), or None."""
    if not cluster.key_file and cluster.insecure:
        return None
    from zbroker.cluster.security import KeyFileError, default_key_path, load_key_file

    path = Path(cluster.key_file) if cluster.key_file else default_key_path(cluster.name)
    if not cluster.key_file and not path.exists():
        return None
    try:
        load_key_file(path)
    except KeyFileError as exc:
        return f"cluster.key_file: {exc}"
    return None


# --- endpoints -----------------------------------------------------------------------------


def served_endpoint_problem(key: str, endpoint: str, run_dir: Path) -> str | None:
    """Why an endpoint a service serves (tcp or ipc, bound by the broker's ZMTP code) cannot
    be bound whatever else runs, or None. ipc folders inside the run directory are made by
    the broker."""
    try:
        kind, address = listen_address(endpoint)
    except EndpointError as exc:
        return f"{key}: {exc}"
    if kind != "ipc" or address.startswith("\0"):
        return None
    if len(os.fsencode(address)) > IPC_PATH_MAX:
        return (f"{key}: the path of {endpoint} is {len(os.fsencode(address))} bytes, more "
                f"than a unix socket takes ({IPC_PATH_MAX}); use a shorter path or an "
                "abstract socket (ipc://@NAME)")
    folder = Path(address).parent
    if not folder.is_dir() and not Path(os.path.abspath(folder)).is_relative_to(run_dir):
        return f"{key}: cannot bind {endpoint}: there is no folder {str(folder)!r}"
    return None


_ANY_IPV4 = "0.0.0.0"
_ANY = "::"


def _place(endpoint: str) -> tuple[str, str, int] | None:
    """(transport, address, port) of an endpoint to bind, as far as two of them can meet;
    None for one that meets nothing (a port the system chooses, an endpoint not read)."""
    scheme = endpoint.partition("://")[0]
    if scheme == "inproc":
        return "inproc", endpoint, 0
    try:
        kind, address = listen_address(endpoint)
    except EndpointError:
        return None
    if kind == "ipc":
        return "ipc", address if address.startswith("\0") else os.path.abspath(address), 0
    host, port = address
    if port == 0:
        return None
    return "tcp", "127.0.0.1" if host == "localhost" else host, port


def _meet(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    if a[0] != b[0] or a[2] != b[2]:
        return False
    if a[0] != "tcp" or a[1] == b[1]:
        return a[1] == b[1]
    hosts = {a[1], b[1]}
    if _ANY in hosts:
        return True  # an IPv6 wildcard takes IPv4 too (the Linux default)
    if _ANY_IPV4 in hosts:
        other = (hosts - {_ANY_IPV4}).pop()
        return ":" not in other
    return False


def endpoint_clashes(endpoints: list[tuple[str, str]]) -> list[str]:
    """A line for each two of ``endpoints`` ((key, endpoint)) that cannot both be bound."""
    # only endpoints of one transport and port can meet (ipc's and inproc's: of one
    # address): each such group is compared within (9 000 endpoints of 3 000 queues were
    # 40 million pairs, 5 s of every start)
    groups: dict[tuple[str, str | int], list[tuple[str, str, tuple[str, str, int]]]] = {}
    for key, endpoint in endpoints:
        place = _place(endpoint)
        if place is not None:
            group = (place[0], place[2] if place[0] == "tcp" else place[1])
            groups.setdefault(group, []).append((key, endpoint, place))
    problems = []
    pairs = ((a, b) for placed in groups.values() if len(placed) > 1
             for i, a in enumerate(placed) for b in placed[i + 1:])
    for (key_a, endpoint_a, a), (key_b, endpoint_b, b) in pairs:
        if not _meet(a, b):
            continue
        if endpoint_a == endpoint_b:
            problems.append(f"{key_a} and {key_b} both use {endpoint_a}: give each its own")
        else:
            problems.append(f"{key_a} ({endpoint_a}) and {key_b} ({endpoint_b}) both use "
                            f"port {a[2]}: give each its own")
    return problems

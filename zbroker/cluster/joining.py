"""Joining a cluster in two commands: the join file a member writes, and what a joining host
does with it.

A clustered broker with a key writes, at every start, its cluster's *join file* beside its
key file (``~/.config/zbroker/cluster-NAME.join`` for the default key, mode 0600): a join token
(join_token.py) with the cluster's key and this broker's cluster endpoint as the seed, and
says what to run on another host. There, ``zbroker NAME --join-file FILE`` (or ``--join -``,
the token on standard input) reads the token, installs its key as that host's key of the
cluster (mode 0600) and starts a broker that says HELLO to the seed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from .join_token import MAX_SEEDS, JoinToken, JoinTokenError, decode, encode
from .membership import endpoint_problem
from .security import KeyFileError, default_key_path, load_key_file, write_key_file

#: what a token's file or standard input may hold, at most
MAX_INPUT = 64 << 10


def join_file_path(key_file: str | Path) -> Path:
    """Where a member writes its cluster's join file: beside its key file, named after it
    (``cluster-NAME.key`` -> ``cluster-NAME.join``)."""
    key = Path(key_file)
    path = key.with_name(key.stem + ".join")
    return path if path != key else key.with_name(key.name + ".join")


def read_token(value: str | None = None, file: str | None = None,
               stdin: IO[str] | None = None) -> JoinToken:
    """The token of ``--join VALUE`` (``-``: from standard input) or ``--join-file FILE``;
    JoinTokenError saying what is wrong otherwise."""
    if file is not None:
        try:
            # opened without blocking, and refused unless a regular file: a FIFO (or a
            # device) would hold the broker's start for ever, waiting for a writer
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise JoinTokenError(f"the join file {file} is not a regular file: copy the "
                                     "join file itself to this host, or use --join -")
            with open(fd, encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_INPUT)
        except OSError as exc:
            raise JoinTokenError(f"cannot read the join file {file}: "
                                 f"{exc.strerror or exc}") from None
        where = f"the join file {file}"
    elif value == "-":  # up to the token's line (a terminal need not end the input)
        text, where = "", "standard input"
        source = stdin or sys.stdin
        while len(text) < MAX_INPUT:
            line = source.readline(MAX_INPUT)
            text += line
            if not line or line.strip() and not line.lstrip().startswith("#"):
                break
    elif value is not None:
        text, where = value, "--join"
    else:
        raise JoinTokenError("no join token given")
    # a join file may hold comments (lines starting with #) around the token
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) > 1:
        raise JoinTokenError(f"{where} holds more than one line besides comments: "
                             "expected one join token")
    try:
        return decode(lines[0] if lines else "")
    except JoinTokenError as exc:
        raise JoinTokenError(f"{where}: {exc}") from None


def install_key(token: JoinToken, key_file: str | None) -> tuple[Path, str]:
    """Make the token's key this host's key of its cluster: written to ``key_file`` (the
    config's cluster.key_file) or the default key path, mode 0600. Returns (path, what was
    done: "installed", "kept" when the file already held it, or "replaced" when the default
    file held another key, which is kept beside it as ``.old``). A file named by
    cluster.key_file that holds another key is not overwritten: KeyFileError."""
    path = Path(key_file) if key_file else default_key_path(token.cluster)
    if path.exists():
        try:
            keys = load_key_file(path)
        except KeyFileError:
            keys = None
        if keys == (token.public, token.secret):
            return path, "kept"
        if key_file:
            raise KeyFileError(f"cluster.key_file {path} holds another key than the join "
                               "token's: remove that setting (the token's key then goes to "
                               f"{default_key_path(token.cluster)}) or that file")
        old = path.with_name(path.name + ".old")
        try:
            os.replace(path, old)
        except OSError as exc:
            raise KeyFileError(f"cannot move the key file {path} aside: "
                               f"{exc.strerror or exc}") from None
        done = "replaced"
    else:
        done = "installed"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_key_file(path, token.public, token.secret)
    except OSError as exc:
        raise KeyFileError(f"cannot write the cluster key file {path}: "
                           f"{exc.strerror or exc}") from None
    return path, done


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, whole or not at all (written aside, then
    renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def join_file_text(token: JoinToken) -> str:
    return ("# zbroker join token: holds the key of cluster "
            f"{token.cluster!r}; keep it private (whoever has it can join)\n"
            f"{encode(token)}\n")


def instructions(path: Path, broker: str) -> str:
    """What to run on another host to join, with the join file at ``path``."""
    return (f"To add a host to this cluster, copy {path} to it (it holds the cluster key: "
            "keep it private), then run there:\n"
            f"    zbroker {broker} --join-file {path.name}")


def usable_seeds(endpoints: Iterable[str]) -> tuple[str, ...]:
    """The endpoints a join token can name as seeds (tcp://HOST:PORT), each once, in order,
    at most MAX_SEEDS."""
    found: dict[str, None] = {}
    for endpoint in endpoints:
        if endpoint_problem(endpoint, "tcp") is None:
            found.setdefault(endpoint)
    return tuple(found)[:MAX_SEEDS]


def seed_endpoint(advertised: str, bound: str) -> tuple[str, bool]:
    """The endpoint other hosts reach this broker's peer socket at: ``advertised``
    (cluster.advertise) if set, else ``bound`` (its socket's endpoint) with a wildcard host
    made one of this host's addresses. Returns (endpoint, whether its host is loopback: no
    other host can use it)."""
    endpoint = advertised if "*" not in advertised else bound
    transport, _, address = endpoint.partition("://")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("*", "0.0.0.0", "::", ""):
        host = host_address()
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if ":" in host:
        host = f"[{host}]"
    return f"{transport}://{host}:{port}", loopback


def host_address() -> str:
    """An address of this host other hosts can reach, loopback as a last resort: the one of
    the default route, else the first IPv4 address of an interface that is not loopback."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # (no packet is sent: it only picks a route)
        address = str(probe.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    except OSError:
        pass
    finally:
        probe.close()
    import ifaddr

    found = [ip.ip for adapter in ifaddr.get_adapters() for ip in adapter.ips
             if isinstance(ip.ip, str)]
    usable = [a for a in found if not ipaddress.ip_address(a).is_loopback
              and not ipaddress.ip_address(a).is_link_local]
    return usable[0] if usable else "127.0.0.1"
